"""Where the SPIR-V modules shipped with the package are found."""
from __future__ import annotations

from pathlib import Path

__all__ = ["SHADER_DIR", "shader_path"]

#: The package's folder of compiled shaders (src/vkmulti/shaders in the tree, vkmulti/shaders installed).
SHADER_DIR = Path(__file__).resolve().parent.parent / "shaders"

def shader_path(name: str) -> Path:
    """Path of a shipped SPIR-V file (e.g. 'sru.comp.spv')."""
    p = SHADER_DIR / name
    if not p.is_file():
        raise FileNotFoundError(f"shipped shader {name!r} not found in {SHADER_DIR} (broken install?)")
    return p
