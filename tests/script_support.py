"""Test helper: a script of the source tree (a bench, an example, a tool) imported as a module."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

#: The source tree's root (the tests run from a checkout).
ROOT = Path(__file__).resolve().parent.parent


def load_script(path: Path, name: str) -> ModuleType:
    """The script at `path` (absolute, or relative to the source tree's root), run as module `name`."""
    path = path if path.is_absolute() else ROOT / path
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
