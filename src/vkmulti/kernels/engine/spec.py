"""KernelSpec: what a kernel is (its SPIR-V, the sizes of its state buffers and
rings, its workgroup count), checked when it is made; no device involved."""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._core.checks import positive_int, short_repr
from ..._core.files import read_named_file
from ..._core.reprs import compact_repr
from .spirv import MAX_MODULE_BYTES, SPIRV_MAGIC

__all__ = ["KernelSpec", "MAX_CAPACITY", "MAX_STATE_BUFFERS", "check_entry_name"]

MAX_CAPACITY = 1 << 16
MAX_STATE_BUFFERS = 16


def check_entry_name(name: str) -> None:
    """ValueError unless `name` can name an entry point to a driver: UTF-8 (no lone
    surrogates) without NUL (a driver reads a C string: it would see another name)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"entry_point {short_repr(name)} is not valid UTF-8 (it holds a lone surrogate); a "
                         f"driver takes entry point names as UTF-8") from None
    if "\0" in name:
        raise ValueError(f"entry_point {short_repr(name)} holds a NUL character; a driver would read the name "
                         f"only up to it")


@dataclass(frozen=True)
class KernelSpec:
    """A kernel's code and shape: SPIR-V (the ABI of native/shaders/vkm_kernel_abi.glsl),
    the byte size of each state buffer, ring capacities in messages, and the
    workgroup count of its one dispatch per step."""

    __repr__ = compact_repr

    kernel_type: str
    spirv: bytes
    state_sizes: tuple[int, ...] = (256,)
    inbox_capacity: int = 64
    outbox_capacity: int = 64
    groups: tuple[int, int, int] = (1, 1, 1)
    entry_point: str = "main"

    def __post_init__(self) -> None:
        if not isinstance(self.kernel_type, str) or not self.kernel_type:
            raise TypeError(f"kernel_type must be a non-empty str, got {short_repr(self.kernel_type)}")
        code = self.spirv
        if not isinstance(code, bytes):
            try:
                code = memoryview(code).tobytes()
            except TypeError:
                raise TypeError(f"spirv must be bytes, got {type(self.spirv).__name__}") from None
            object.__setattr__(self, "spirv", code)
        if len(code) > MAX_MODULE_BYTES:
            raise ValueError(f"spirv of {short_repr(self.kernel_type)} is {len(code)} bytes; a module takes at most "
                             f"{MAX_MODULE_BYTES}")
        if len(code) < 20 or len(code) % 4:
            raise ValueError(f"spirv of {short_repr(self.kernel_type)} is {len(code)} bytes: not a SPIR-V module "
                             f"(whole 32-bit words, a 5-word header at least)")
        magic = struct.unpack_from("<I", code)[0]
        if magic != SPIRV_MAGIC:
            raise ValueError(f"spirv of {short_repr(self.kernel_type)} starts with 0x{magic:08x}, not the SPIR-V magic "
                             f"0x{SPIRV_MAGIC:08x} (little-endian)")
        try:
            sizes = tuple(self.state_sizes)
        except TypeError:
            raise TypeError(f"state_sizes must be a sequence of ints, got {short_repr(self.state_sizes)}") from None
        if not 1 <= len(sizes) <= MAX_STATE_BUFFERS:
            raise ValueError(f"a kernel has 1 to {MAX_STATE_BUFFERS} state buffers, got {len(sizes)}")
        for i, s in enumerate(sizes):
            if positive_int(s, f"state_sizes[{i}]") % 4:
                raise ValueError(f"state_sizes[{i}] must be a multiple of 4 bytes, got {short_repr(s)}")
        object.__setattr__(self, "state_sizes", sizes)
        positive_int(self.inbox_capacity, "inbox_capacity", MAX_CAPACITY)
        positive_int(self.outbox_capacity, "outbox_capacity", MAX_CAPACITY)
        try:
            groups = tuple(self.groups)
        except TypeError:
            raise TypeError(f"groups must be 3 ints, got {short_repr(self.groups)}") from None
        if len(groups) != 3:
            raise ValueError(f"groups must be 3 ints (x, y, z), got {short_repr(self.groups)}")
        for i, g in enumerate(groups):
            positive_int(g, f"groups[{i}]")
        object.__setattr__(self, "groups", groups)
        if not isinstance(self.entry_point, str) or not self.entry_point:
            raise TypeError(f"entry_point must be a non-empty str, got {short_repr(self.entry_point)}")
        check_entry_name(self.entry_point)

    @classmethod
    def from_file(cls, kernel_type: str, path: str | Path, **fields: Any) -> "KernelSpec":
        """A spec whose SPIR-V is read from `path` (a compiled .spv: a regular file of at
        most MAX_MODULE_BYTES; ValueError for anything else, before it is read)."""
        return cls(kernel_type, read_named_file(path, MAX_MODULE_BYTES, "SPIR-V file"), **fields)

    @property
    def sha256(self) -> str:
        """SHA-256 of the SPIR-V (hex): identifies the code, e.g. for pipeline caches and hot reload."""
        return hashlib.sha256(self.spirv).hexdigest()
