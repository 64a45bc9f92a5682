"""Where the SPIR-V modules shipped with the package are found, and their bytes."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

__all__ = ["SHADER_DIR", "shader_path", "shader_bytes"]

#: The package's folder of compiled shaders (src/vkmulti/shaders in the tree, vkmulti/shaders installed).
SHADER_DIR = Path(__file__).resolve().parent.parent / "shaders"

def shader_path(name: str) -> Path:
    """Path of a shipped SPIR-V file (e.g. 'sru.comp.spv')."""
    p = SHADER_DIR / name
    if not p.is_file():
        raise FileNotFoundError(f"shipped shader {name!r} not found in {SHADER_DIR} (broken install?)")
    return p


@lru_cache(maxsize=None)
def shader_bytes(name: str) -> bytes:
    """The bytes of a shipped SPIR-V file, read once per process: hot paths (a
    move's pipeline check, a CRC32 engine, a builtin pass) ask for them often,
    and a file read costs more than the lookup they feed."""
    return shader_path(name).read_bytes()
