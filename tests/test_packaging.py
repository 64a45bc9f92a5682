"""The install lists match the package: every module, stub and shader of src/vkmulti is in its folder's
meson.build (written by tools/meson_lists.py), and nothing listed is missing or listed twice."""
from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "vkmulti"
if not PKG.is_dir():
    pytest.skip("needs the source tree", allow_module_level=True)

FOLDERS = [PKG, *sorted(p for p in PKG.rglob("*") if p.is_dir() and p.name != "__pycache__")]


def _shipped(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file()
                  and (p.suffix in (".py", ".pyi", ".spv") or p.name == "py.typed"))


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: str(f.relative_to(PKG)) or ".")
def test_meson_lists_every_file_once(folder):
    shipped = _shipped(folder)
    if not shipped:
        return
    build = folder / "meson.build"
    assert build.is_file(), f"{folder} has modules but no meson.build (run tools/meson_lists.py)"
    listed = re.findall(r"^\s*'([^']+)',\s*$", build.read_text(), re.M)
    assert len(listed) == len(set(listed)), f"{build}: a file listed twice"
    assert sorted(listed) == shipped, f"{build} is out of date (run tools/meson_lists.py)"
    subdirs = re.findall(r"^subdir\('([^']+)'\)", build.read_text(), re.M)
    expected = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__" and _shipped(p))
    assert sorted(subdirs) == expected, f"{build}: subdir() calls do not match the folders"
