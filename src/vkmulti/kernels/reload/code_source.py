"""Kernel code for hot reload: ringkernel's KernelCodeFormat and KernelCodeSource,
and the seed's rules that code must meet (validate_code).

`from_ptx`, `from_wgsl` and `from_msl` keep the seed's constructors (their
code is checked by the seed's rules; a Vulkan kernel cannot run it);
`from_spirv` and `from_glsl` (compiled with glslc) make code a vkmulti kernel
runs. `hash` is a real SHA-256 of the code (the seed chained four 64-bit
std hashes, neither cryptographic nor stable between runs).
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._core.checks import U64_MAX, int_in, timeout_seconds, short_repr
from ..._core.files import read_named_file
from ..._core.shaders import SHADER_DIR
from ..._core.tools import run_tool
from ...errors import KernelValidationError, UnsupportedError
from ..engine.spec import check_entry_name
from ..engine.spirv import MAX_MODULE_BYTES, check_entry_point, reflect

if TYPE_CHECKING:
    from ..._core.protocols import HostData

__all__ = ["KernelCodeFormat", "KernelCodeSource", "validate_code"]


class KernelCodeFormat(enum.Enum):
    """What kind of code a KernelCodeSource holds. SPIRV is what Vulkan runs;
    the aliases SPIR_V and METAL_LIB spell the Rust names SpirV and MetalLib."""
    PTX = "ptx"
    CUBIN = "cubin"
    SPIRV = "spirv"
    WGSL = "wgsl"
    MSL = "msl"
    METALLIB = "metallib"
    SOURCE = "source"
    SPIR_V = "spirv"
    METAL_LIB = "metallib"

    @property
    def is_text(self) -> bool:
        return self in (KernelCodeFormat.PTX, KernelCodeFormat.WGSL, KernelCodeFormat.MSL, KernelCodeFormat.SOURCE)


def _code_bytes(code: Any) -> bytes:
    if isinstance(code, bytes):
        return code
    if isinstance(code, str):
        return code.encode()
    try:
        return memoryview(code).cast("B").tobytes()
    except TypeError:
        raise TypeError(f"code must be bytes, str or a buffer-protocol object, got {type(code).__name__}") from None


@dataclass
class KernelCodeSource:
    """One version of a kernel's code: format, bytes, entry point, metadata,
    when it was made (time.monotonic()) and its SHA-256 (`hash`, 32 bytes)."""
    format: KernelCodeFormat
    code: bytes
    entry_point: str = "main"
    version_id: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    created_at: float = field(default_factory=time.monotonic)
    hash: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.format, KernelCodeFormat):
            raise TypeError(f"format must be a KernelCodeFormat, got {short_repr(self.format)}")
        self.code = _code_bytes(self.code)
        if not isinstance(self.entry_point, str):
            raise TypeError(f"entry_point must be a str, got {type(self.entry_point).__name__}")
        int_in(self.version_id, "version_id", 0, U64_MAX)
        if not isinstance(self.metadata, dict) or any(not isinstance(k, str) or not isinstance(v, str)
                                                      for k, v in self.metadata.items()):
            raise TypeError("metadata must be a dict of str -> str")
        digest = hashlib.sha256(self.code).digest()
        if not isinstance(self.hash, (bytes, bytearray, memoryview)):   # (bytes(n) of an int n allocates n bytes)
            raise TypeError(f"hash must be bytes (or left out: it is computed), got {type(self.hash).__name__}")
        if self.hash and bytes(self.hash) != digest:
            raise ValueError("hash does not match the code's SHA-256 (leave it out: it is computed)")
        self.hash = digest

    # -- the seed's constructors -------------------------------------------------------

    @classmethod
    def new(cls, format: KernelCodeFormat, code: str | HostData, entry_point: str) -> "KernelCodeSource":
        """Code of any format (the seed's KernelCodeSource::new)."""
        return cls(format, code, entry_point)  # type: ignore[arg-type]

    @classmethod
    def from_ptx(cls, ptx: str, entry_point: str) -> "KernelCodeSource":
        """PTX text (the seed's; a Vulkan kernel cannot run it)."""
        return cls(KernelCodeFormat.PTX, _text(ptx, "ptx"), entry_point)  # type: ignore[arg-type]

    @classmethod
    def from_wgsl(cls, wgsl: str, entry_point: str) -> "KernelCodeSource":
        """WGSL text (the seed's; a Vulkan kernel cannot run it)."""
        return cls(KernelCodeFormat.WGSL, _text(wgsl, "wgsl"), entry_point)  # type: ignore[arg-type]

    @classmethod
    def from_msl(cls, msl: str, entry_point: str) -> "KernelCodeSource":
        """Metal Shading Language text (the seed's; a Vulkan kernel cannot run it)."""
        return cls(KernelCodeFormat.MSL, _text(msl, "msl"), entry_point)  # type: ignore[arg-type]

    # -- vkmulti's ---------------------------------------------------------------------

    @classmethod
    def from_spirv(cls, spirv: HostData, entry_point: str = "main") -> "KernelCodeSource":
        """SPIR-V words (bytes, little-endian) with their entry point."""
        return cls(KernelCodeFormat.SPIRV, spirv, entry_point)  # type: ignore[arg-type]

    @classmethod
    def from_spirv_file(cls, path: str | os.PathLike, entry_point: str = "main") -> "KernelCodeSource":
        """SPIR-V read from a .spv file (a regular file of at most MAX_MODULE_BYTES)."""
        return cls(KernelCodeFormat.SPIRV, read_named_file(path, MAX_MODULE_BYTES, "SPIR-V file"), entry_point)

    @classmethod
    def from_glsl(cls, source: str, entry_point: str = "main", *, include_dirs: tuple[str | os.PathLike[str], ...] = (),
                  defines: dict[str, str] | None = None, target_env: str = "vulkan1.1",
                  timeout: float | None = 60.0) -> "KernelCodeSource":
        """Compile GLSL compute source with glslc (UnsupportedError where glslc is
        not on PATH; KernelValidationError with glslc's message when it does
        not compile). vkm_kernel_abi.glsl's folder is on the include path."""
        text = _text(source, "source")
        timeout = timeout_seconds(timeout)
        if isinstance(include_dirs, (str, bytes, os.PathLike)):
            raise TypeError(f"include_dirs must be a tuple of folders, got one {type(include_dirs).__name__}")
        if defines is not None and not isinstance(defines, dict):
            raise TypeError(f"defines must be a dict {{name: value}} or None, got {type(defines).__name__}")
        glslc = shutil.which("glslc")
        if glslc is None:
            raise UnsupportedError("glslc is not on PATH, so GLSL cannot be compiled here (Debian: apt-get install "
                                   "glslc); compile to SPIR-V elsewhere and use KernelCodeSource.from_spirv",
                                   extension="glslc")
        dirs = [*map(str, include_dirs), *(str(d) for d in _abi_dirs())]
        args = [glslc, "-O", f"--target-env={target_env}", "-fshader-stage=compute"]
        if entry_point != "main":
            args.append(f"-fentry-point={entry_point}")
        for d in dirs:
            args += ["-I", d]
        for k, v in (defines or {}).items():
            args.append(f"-D{k}={v}")
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "kernel.comp", Path(tmp) / "kernel.spv"
            src.write_text(text)
            res = run_tool([*args, "-o", str(out), str(src)], timeout, "glslc")
            if res.returncode != 0:
                raise KernelValidationError(f"GLSL does not compile: {(res.stderr or res.stdout).strip()[:800]}")
            code = out.read_bytes()
        made = cls(KernelCodeFormat.SPIRV, code, entry_point)
        made.metadata["compiled_from"] = "glsl"
        made.metadata["source_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        return made

    def with_version(self, version: int) -> "KernelCodeSource":
        """A copy with `version_id` set."""
        return dataclasses.replace(self, version_id=version, metadata=dict(self.metadata), hash=b"")

    def with_metadata(self, key: str, value: str) -> "KernelCodeSource":
        """A copy with one more metadata entry."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata keys and values must be str, got {short_repr(key)}: {short_repr(value)}")
        return dataclasses.replace(self, metadata={**self.metadata, key: value}, hash=b"")

    def as_str(self) -> str | None:
        """The code as text for PTX, WGSL, MSL and SOURCE (None if it is not UTF-8); None for binary formats."""
        if not self.format.is_text:
            return None
        try:
            return self.code.decode()
        except UnicodeDecodeError:
            return None

    def size(self) -> int:
        """Bytes of code."""
        return len(self.code)

    @property
    def hash_hex(self) -> str:
        """The SHA-256 as 64 hex digits."""
        return self.hash.hex()

    def __repr__(self) -> str:
        return (f"KernelCodeSource({self.format.name}, {len(self.code)} bytes, entry={short_repr(self.entry_point, 40)}, "
                f"version={self.version_id}, sha256={self.hash.hex()[:12]}...)")


def _text(value: Any, label: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{label} must be a str, got {type(value).__name__}")
    return value


def _abi_dirs() -> list[Path]:
    """Folders that hold vkm_kernel_abi.glsl (the source tree's, or a copy beside the package)."""
    out = []
    for cand in (SHADER_DIR.parents[2] / "native" / "shaders", SHADER_DIR):
        if (cand / "vkm_kernel_abi.glsl").is_file():
            out.append(cand)
    return out


def validate_code(code: KernelCodeSource) -> None:
    """The seed's checks (KernelValidationError): code and entry point not empty;
    PTX has .version or .target, WGSL @compute or 'fn ', MSL 'kernel '; and
    SPIR-V parses (magic, version, word count, instruction stream)."""
    if not isinstance(code, KernelCodeSource):
        raise TypeError(f"code must be a KernelCodeSource, got {type(code).__name__}")
    if not code.code:
        raise KernelValidationError("Kernel code is empty")
    if not code.entry_point:
        raise KernelValidationError("Entry point is empty")
    text = code.as_str()
    fmt = code.format
    if fmt is KernelCodeFormat.PTX and text is not None and ".version" not in text and ".target" not in text:
        raise KernelValidationError("PTX code missing version/target directive")
    if fmt is KernelCodeFormat.WGSL and text is not None and "@compute" not in text and "fn " not in text:
        raise KernelValidationError("WGSL code missing compute shader or function")
    if fmt is KernelCodeFormat.MSL and text is not None and "kernel " not in text:
        raise KernelValidationError("MSL code missing kernel function")
    if fmt is KernelCodeFormat.SPIRV:
        try:
            check_entry_name(code.entry_point)
        except ValueError as exc:
            raise KernelValidationError(str(exc)) from None
        check_entry_point(reflect(code.code, "the new SPIR-V"), code.entry_point, "the new SPIR-V")
