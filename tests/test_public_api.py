"""The public API does not move: every name listed in public_api.json is importable from its module.

public_api.json lists, per public module, the names it exported (its `__all__`,
or its public top-level names where it has none) before the package was laid
out one package per layer. A name may be added to a module; none may go
without being taken out of this file on purpose (and out of the docs).
"""
from __future__ import annotations

import importlib
import json
import pathlib

import pytest

API = json.loads((pathlib.Path(__file__).with_name("public_api.json")).read_text())


@pytest.mark.parametrize("module", sorted(API))
def test_every_listed_name_is_importable(module):
    mod = importlib.import_module(module)
    missing = [name for name in API[module] if not hasattr(mod, name)]
    assert not missing, f"{module} lost {missing}"


@pytest.mark.parametrize("module", ["vkmulti", "vkmulti.kernels", "vkmulti.cluster"])
def test_all_lists_every_name_and_only_real_ones(module):
    mod = importlib.import_module(module)
    assert set(API[module]) - {"__version__"} <= set(mod.__all__)
    assert all(hasattr(mod, name) for name in mod.__all__)
    assert len(mod.__all__) == len(set(mod.__all__)), f"{module}.__all__ lists a name twice"


def test_the_layer_faces_hold_what_the_top_face_exports():
    """A name of the package face is the same object in its layer's face (vkmulti.device, .memory, ...)."""
    import vkmulti
    from vkmulti import device, memory, offload, transfer
    for face in (device, memory, offload, transfer):
        for name in face.__all__:
            if name in vkmulti.__all__:
                assert getattr(face, name) is getattr(vkmulti, name), f"{face.__name__}.{name}"


def test_the_console_script_and_python_m_point_at_the_cli():
    import tomllib
    root = pathlib.Path(__file__).resolve().parents[1]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    target = scripts["vkmulti"]
    module, func = target.split(":")
    assert callable(getattr(importlib.import_module(module), func))
