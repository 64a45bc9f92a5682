"""Compile the GLSL shaders in this folder to the SPIR-V that vkmulti ships.

    python native/shaders/build_spirv.py          # rebuild src/vkmulti/shaders/*.spv and the manifest

The SPIR-V is committed (the GPU host has no glslc). `spirv-manifest.json`
records each source's SHA-256, the SPIR-V's SHA-256, and the glslc version and
flags used, so tests can check that the committed SPIR-V matches its source.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OUT_DIR = REPO / "src" / "vkmulti" / "shaders"
MANIFEST = HERE / "spirv-manifest.json"
SOURCES = ("sru.comp",)
FLAGS = ("-O", "--target-env=vulkan1.1")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def glslc_version(glslc: str) -> str:
    """The first line of `glslc --version` (e.g. 'shaderc v2023.2 ...')."""
    out = subprocess.run([glslc, "--version"], check=True, capture_output=True, text=True).stdout
    return out.splitlines()[0].strip()


def compile_shader(glslc: str, source: Path, output: Path) -> None:
    subprocess.run([glslc, *FLAGS, "-o", str(output), str(source)], check=True)


def build(glslc: str | None = None) -> dict:
    """Compile every source into OUT_DIR and rewrite the manifest; returns it."""
    glslc = glslc or shutil.which("glslc")
    if glslc is None:
        raise SystemExit("glslc not found (Debian: apt-get install glslc)")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    shaders = {}
    for name in SOURCES:
        out = OUT_DIR / f"{name}.spv"
        compile_shader(glslc, HERE / name, out)
        shaders[name] = {"spirv": str(out.relative_to(REPO)), "source_sha256": sha256(HERE / name),
                         "spirv_sha256": sha256(out)}
    manifest = {"glslc": glslc_version(glslc), "flags": list(FLAGS), "shaders": shaders}
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


if __name__ == "__main__":
    m = build(sys.argv[1] if len(sys.argv) > 1 else None)
    for name, s in m["shaders"].items():
        print(f"{name} -> {s['spirv']}")
