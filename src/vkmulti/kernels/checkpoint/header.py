"""The fixed parts of ringkernel's checkpoint format: constants, the CRC32, chunk
types, the 64-byte file header, the 32-byte chunk header and the metadata
block (their layout is described in checkpoint.py)."""
from __future__ import annotations

import enum
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..._core.checks import is_int, short_repr, short_text
from ...errors import InvalidCheckpointError
from ..messages import HlcTimestamp
from ..._core.reprs import compact_repr, short_value

if TYPE_CHECKING:
    from ..._core.protocols import BytesLike

__all__ = ["CHECKPOINT_MAGIC", "CHECKPOINT_VERSION", "MAX_CHECKPOINT_SIZE", "FLAG_CHUNK_CRC32", "FLAG_HEADER_CRC32",
           "HEADER_SIZE", "CHUNK_HEADER_SIZE", "MAX_CHUNKS", "MAX_CUSTOM_ENTRIES", "DELTA_PARENT_DIGEST_KEY",
           "ChunkType", "ChunkHeader", "CheckpointHeader", "CheckpointMetadata", "chunk_name_id", "crc32", "as_bytes"]

#: "RKCKPT01" as the seed's u64 constant (written little-endian).
CHECKPOINT_MAGIC = 0x524B434B50543031
CHECKPOINT_VERSION = 1
#: The largest checkpoint the format takes (the seed's 1 GiB).
MAX_CHECKPOINT_SIZE = 1 << 30
HEADER_SIZE = 64
CHUNK_HEADER_SIZE = 32
#: The most chunks a checkpoint may have: a parsed chunk costs a few hundred bytes of
#: objects whatever its size, so the count is bounded to keep memory bounded by the file.
MAX_CHUNKS = 4096
#: The most custom metadata entries (the same reason).
MAX_CUSTOM_ENTRIES = 4096
#: Header flag: a table of per-chunk CRC32s follows the last chunk.
FLAG_CHUNK_CRC32 = 1
#: Header flag: bytes 48-51 (reserved in the seed) hold the CRC32 of header bytes 0-47.
FLAG_HEADER_CRC32 = 2
_KNOWN_FLAGS = FLAG_CHUNK_CRC32 | FLAG_HEADER_CRC32
#: Metadata key of a delta checkpoint that names its base's content digest.
DELTA_PARENT_DIGEST_KEY = "ringkernel.delta.parent_digest"

_HEADER = struct.Struct("<QIIQIIIIQ")
_CHUNK = struct.Struct("<IIQQQ")
#: step, grid size, tile size, HLC (physical, logical, node id), custom count
_META_FIXED = struct.Struct("<Q3I3I3QI")
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


def crc32(data: Any, value: int = 0) -> int:
    """IEEE CRC32 (zlib's; the seed's table CRC gives the same values)."""
    return zlib.crc32(data, value) & _U32


def chunk_name_id(name: str) -> int:
    """A stable 64-bit id for a named device-memory chunk (FNV-1a of the UTF-8 name;
    the seed used Rust's DefaultHasher, which differs between runs)."""
    if not isinstance(name, str):
        raise TypeError(f"a device-memory chunk name must be a str, got {type(name).__name__}")
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & _U64
    return h


def _u(value: Any, label: str, top: int) -> int:
    if not is_int(value) or not 0 <= value <= top:
        raise ValueError(f"{label} must be an int in [0, {top}], got {short_repr(value)}")
    return value


def _triple(value: Any, label: str) -> tuple[int, int, int]:
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"{label} must be 3 ints, got {short_repr(value)}") from None
    if len(items) != 3:
        raise ValueError(f"{label} must be 3 ints, got {short_repr(value)}")
    return tuple(_u(v, f"{label}[{i}]", _U32) for i, v in enumerate(items))   # type: ignore[return-value]


def as_bytes(data: Any, label: str) -> bytes:
    if isinstance(data, bytes):
        return data
    try:
        return memoryview(data).cast("B").tobytes()
    except TypeError:
        raise TypeError(f"{label} must be bytes or a buffer-protocol object, got {type(data).__name__}") from None


class ChunkType(enum.Enum):
    """What a chunk holds (the seed's u32 values)."""
    CONTROL_BLOCK = 1
    H2K_QUEUE = 2
    K2H_QUEUE = 3
    HLC_STATE = 4
    DEVICE_MEMORY = 5
    K2K_ROUTING = 6
    HALO_BUFFERS = 7
    TELEMETRY = 8
    CUSTOM = 100

    @classmethod
    def from_u32(cls, value: int) -> "ChunkType | None":
        """The type with this raw value, or None."""
        try:
            return cls(value)
        except ValueError:
            return None


@dataclass
class ChunkHeader:
    """The 32-byte header of a chunk."""

    __repr__ = compact_repr
    chunk_type: int
    flags: int = 0
    uncompressed_size: int = 0
    compressed_size: int = 0
    chunk_id: int = 0

    @classmethod
    def new(cls, chunk_type: ChunkType | int, data_size: int) -> "ChunkHeader":
        """The header of a chunk of `data_size` uncompressed bytes."""
        kind = chunk_type.value if isinstance(chunk_type, ChunkType) else _u(chunk_type, "chunk_type", _U32)
        return cls(kind, 0, data_size, data_size, 0)

    def with_id(self, chunk_id: int) -> "ChunkHeader":
        """Set the chunk id (returns self)."""
        self.chunk_id = _u(chunk_id, "chunk_id", _U64)
        return self

    def to_bytes(self) -> bytes:
        """The 32 bytes."""
        return _CHUNK.pack(self.chunk_type, self.flags, self.uncompressed_size, self.compressed_size, self.chunk_id)

    @classmethod
    def from_bytes(cls, data: BytesLike) -> "ChunkHeader":
        """Parse 32 bytes (InvalidCheckpointError if fewer)."""
        if len(data) < CHUNK_HEADER_SIZE:
            raise InvalidCheckpointError(f"a chunk header is {CHUNK_HEADER_SIZE} bytes, got {len(data)}")
        return cls(*_CHUNK.unpack_from(data))


@dataclass
class CheckpointHeader:
    """The 64-byte file header."""
    magic: int = CHECKPOINT_MAGIC
    version: int = CHECKPOINT_VERSION
    header_size: int = HEADER_SIZE
    total_size: int = 0
    chunk_count: int = 0
    compression: int = 0
    checksum: int = 0
    flags: int = 0
    created_at: int = 0
    header_crc: int = 0

    @classmethod
    def new(cls, chunk_count: int, total_size: int) -> "CheckpointHeader":
        """A header for `chunk_count` chunks and `total_size` bytes, stamped now."""
        return cls(total_size=total_size, chunk_count=chunk_count, created_at=time.time_ns() // 1000)

    def __repr__(self) -> str:
        v = short_value
        crc = f"0x{self.checksum:08x}" if is_int(self.checksum) and 0 <= self.checksum <= _U64 else v(self.checksum, 24)
        return (f"CheckpointHeader(version={v(self.version, 24)}, total_size={v(self.total_size, 24)}, "
                f"chunks={v(self.chunk_count, 24)}, checksum={crc}, flags={v(self.flags, 24)})")

    def validate(self) -> None:
        """InvalidCheckpointError for a wrong magic, a newer version or a size past 1 GiB."""
        if self.magic != CHECKPOINT_MAGIC:
            raise InvalidCheckpointError(f"Invalid magic number 0x{self.magic:016x} (expected 0x{CHECKPOINT_MAGIC:016x}, "
                                         f"'RKCKPT01'): not a checkpoint")
        if self.version > CHECKPOINT_VERSION or self.version == 0:
            raise InvalidCheckpointError(f"Unsupported version: {short_repr(self.version)} (max: {CHECKPOINT_VERSION})")
        if self.header_size != HEADER_SIZE:
            raise InvalidCheckpointError(f"header size {short_repr(self.header_size)}, expected {HEADER_SIZE}")
        if self.total_size > MAX_CHECKPOINT_SIZE:
            raise InvalidCheckpointError(f"Checkpoint too large: {short_repr(self.total_size)} bytes (max: {MAX_CHECKPOINT_SIZE})")
        if self.compression != 0:
            raise InvalidCheckpointError(f"compression {short_repr(self.compression)} is not supported (only 0: none)")
        if self.flags & ~_KNOWN_FLAGS:
            raise InvalidCheckpointError(f"unknown header flags 0x{self.flags & ~_KNOWN_FLAGS:x}")

    def _fixed(self) -> bytes:
        return _HEADER.pack(self.magic, self.version, self.header_size, self.total_size, self.chunk_count,
                            self.compression, self.checksum, self.flags, self.created_at)

    def to_bytes(self) -> bytes:
        """The 64 bytes; with FLAG_HEADER_CRC32 the CRC of the first 48 follows them."""
        fixed = self._fixed()
        if self.flags & FLAG_HEADER_CRC32:
            self.header_crc = crc32(fixed)
        return fixed + struct.pack("<I12x", self.header_crc if self.flags & FLAG_HEADER_CRC32 else 0)

    @classmethod
    def from_bytes(cls, data: BytesLike) -> "CheckpointHeader":
        """Parse (not check: see validate) a header; with FLAG_HEADER_CRC32 its CRC is
        checked, and the reserved bytes after it must be zero."""
        if len(data) < HEADER_SIZE:
            raise InvalidCheckpointError(f"Checkpoint too small: {len(data)} bytes, the header alone is {HEADER_SIZE}")
        h = cls(*_HEADER.unpack_from(data))
        if h.flags & FLAG_HEADER_CRC32:
            (h.header_crc,) = struct.unpack_from("<I", data, _HEADER.size)
            got = crc32(bytes(data[:_HEADER.size]))
            if got != h.header_crc:
                raise InvalidCheckpointError(f"header CRC32 mismatch: stored 0x{h.header_crc:08x}, the header hashes "
                                             f"to 0x{got:08x} (corrupted)")
            if any(bytes(data[_HEADER.size + 4:HEADER_SIZE])):
                raise InvalidCheckpointError("reserved header bytes are not zero (corrupted)")
        return h


@dataclass
class CheckpointMetadata:
    """Who the checkpoint is of and where it stood: kernel id and type, step,
    grid and tile size, the kernel's HLC reading and custom key/values."""
    kernel_id: str = ""
    kernel_type: str = ""
    current_step: int = 0
    grid_size: tuple[int, int, int] = (0, 0, 0)
    tile_size: tuple[int, int, int] = (0, 0, 0)
    hlc_timestamp: HlcTimestamp = field(default_factory=HlcTimestamp.zero)
    custom: dict[str, str] = field(default_factory=dict)
    #: the seed's HLC node id (vkmulti's clocks have none; kept for files the seed wrote)
    hlc_node_id: int = 0

    def __repr__(self) -> str:
        return (f"CheckpointMetadata({short_text(self.kernel_id)}, {short_text(self.kernel_type, 30)}, step={self.current_step}, "
                f"grid={self.grid_size}, tile={self.tile_size}, {len(self.custom)} custom)")

    def __post_init__(self) -> None:
        for label in ("kernel_id", "kernel_type"):
            v = getattr(self, label)
            if not isinstance(v, str):
                raise TypeError(f"CheckpointMetadata.{label} must be a str, got {type(v).__name__}")
            setattr(self, label, str(v))
        _u(self.current_step, "current_step", _U64)
        self.grid_size = _triple(self.grid_size, "grid_size")
        self.tile_size = _triple(self.tile_size, "tile_size")
        if not isinstance(self.hlc_timestamp, HlcTimestamp):
            raise TypeError(f"hlc_timestamp must be an HlcTimestamp, got {type(self.hlc_timestamp).__name__}")
        if not isinstance(self.custom, dict):
            raise TypeError(f"custom must be a dict of str -> str, got {type(self.custom).__name__}")
        for k, v in self.custom.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"custom metadata keys and values must be str, got {short_repr(k)}: {short_repr(v)}")
        _u(self.hlc_node_id, "hlc_node_id", _U64)

    @classmethod
    def new(cls, kernel_id: str, kernel_type: str) -> "CheckpointMetadata":
        """Metadata of a kernel id and type, everything else zero or empty."""
        return cls(kernel_id, kernel_type)

    def with_step(self, step: int) -> "CheckpointMetadata":
        """Set the current step (returns self)."""
        self.current_step = _u(step, "step", _U64)
        return self

    def with_grid_size(self, width: int, height: int, depth: int) -> "CheckpointMetadata":
        """Set the grid size (returns self)."""
        self.grid_size = _triple((width, height, depth), "grid_size")
        return self

    def with_tile_size(self, x: int, y: int, z: int) -> "CheckpointMetadata":
        """Set the tile size (returns self)."""
        self.tile_size = _triple((x, y, z), "tile_size")
        return self

    def with_hlc(self, hlc: HlcTimestamp) -> "CheckpointMetadata":
        """Set the HLC timestamp (returns self)."""
        if not isinstance(hlc, HlcTimestamp):
            raise TypeError(f"hlc must be an HlcTimestamp, got {type(hlc).__name__}")
        self.hlc_timestamp = hlc
        return self

    def with_custom(self, key: str, value: str) -> "CheckpointMetadata":
        """Add a custom key/value (returns self)."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"custom metadata keys and values must be str, got {short_repr(key)}: {short_repr(value)}")
        self.custom[key] = value
        return self

    def to_bytes(self) -> bytes:
        """The serialised metadata (the seed's layout)."""
        out = bytearray()

        def string(s: str) -> None:
            raw = s.encode()
            out.extend(struct.pack("<I", len(raw)))
            out.extend(raw)
        string(self.kernel_id)
        string(self.kernel_type)
        out.extend(_META_FIXED.pack(self.current_step, *self.grid_size, *self.tile_size,
                               self.hlc_timestamp.physical_us, self.hlc_timestamp.logical, self.hlc_node_id,
                               len(self.custom)))
        for k, v in self.custom.items():
            string(k)
            string(v)
        return bytes(out)

    @classmethod
    def from_bytes(cls, data: BytesLike) -> "CheckpointMetadata":
        """Parse serialised metadata (InvalidCheckpointError when truncated or malformed)."""
        view = memoryview(data).cast("B")
        at = 0

        def take(n: int) -> memoryview:
            nonlocal at
            if at + n > len(view):
                raise InvalidCheckpointError("Unexpected end of metadata")
            part = view[at:at + n]
            at += n
            return part

        def string() -> str:
            (n,) = struct.unpack("<I", take(4))
            try:
                return bytes(take(n)).decode()
            except UnicodeDecodeError as exc:
                raise InvalidCheckpointError(f"metadata string is not UTF-8: {exc}") from None
        kernel_id, kernel_type = string(), string()
        step, gx, gy, gz, tx, ty, tz, phys, logical, node, count = struct.unpack(_META_FIXED.format,
                                                                                  take(_META_FIXED.size))
        if count > MAX_CUSTOM_ENTRIES or 8 * count > len(view) - at:
            raise InvalidCheckpointError(f"metadata claims {count} custom entries: more than {MAX_CUSTOM_ENTRIES} "
                                         f"or than its {len(view) - at} remaining bytes hold")
        custom = {}
        for _ in range(count):
            key = string()
            custom[key] = string()
        if at != len(view):
            raise InvalidCheckpointError(f"metadata has {len(view) - at} stray byte(s) after its last field")
        if logical > _U32:
            raise InvalidCheckpointError(f"HLC logical counter {logical} does not fit vkmulti's 32-bit counter")
        return cls(kernel_id, kernel_type, step, (gx, gy, gz), (tx, ty, tz), HlcTimestamp(phys, logical), custom,
                   node)


