"""Kernel checkpoints: ringkernel's `checkpoint` format (Checkpoint, CheckpointMetadata,
DataChunk, ChunkType, CheckpointBuilder), with a CRC32 per chunk.

Layout (little-endian; the seed's, so files it writes load here and back):

  64-byte header   magic u64 0x524B434B50543031 ("RKCKPT01"), version u32 (1),
                   header size u32 (64), total size u64, chunk count u32,
                   compression u32 (0: none), checksum u32 (CRC32 of every
                   byte after the header), flags u32, created_at u64 (us since
                   the epoch), 16 reserved bytes (vkmulti: the first 4 hold
                   the CRC32 of header bytes 0-47, flags bit 1; the rest 0)
  metadata         u32 length, then: kernel_id and kernel_type (u32-length UTF-8),
                   current_step u64, grid size 3 x u32, tile size 3 x u32, HLC
                   (physical, logical, node id: 3 x u64), custom count u32 and
                   (key, value) strings
  chunks           each a 32-byte header (type u32, flags u32, uncompressed size
                   u64, compressed size u64, chunk id u64) and its data
  chunk CRCs       vkmulti's addition, present when flags bit 0 is set: one
                   CRC32 per chunk (of its header and data), in chunk order

The header CRC and the whole-file checksum say that something is wrong; the per-chunk CRCs say
which chunk, and let a reader that takes chunks one by one (a restore that
streams state to a GPU) check each before using it. Truncated, corrupted,
oversized (> 1 GiB), over-counted (more than MAX_CHUNKS chunks or
MAX_CUSTOM_ENTRIES custom entries, or more than the stated size can hold) or
unknown-version input raises InvalidCheckpointError, never loads half a
checkpoint. Parsing is one pass over the bytes, and what it builds is bounded
by the file's size plus a constant.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ...errors import InvalidCheckpointError
from .header import (CHECKPOINT_MAGIC, CHECKPOINT_VERSION, CHUNK_HEADER_SIZE, DELTA_PARENT_DIGEST_KEY,
                     FLAG_CHUNK_CRC32, FLAG_HEADER_CRC32, HEADER_SIZE, MAX_CHECKPOINT_SIZE, MAX_CHUNKS,
                     MAX_CUSTOM_ENTRIES, CheckpointHeader,
                     CheckpointMetadata, ChunkHeader, ChunkType, as_bytes, chunk_name_id, crc32)
from ..messages import HlcTimestamp
from ..._core.checks import short_repr, short_text

if TYPE_CHECKING:
    from ..._core.protocols import HostData

_U32 = (1 << 32) - 1

__all__ = ["CHECKPOINT_MAGIC", "CHECKPOINT_VERSION", "MAX_CHECKPOINT_SIZE", "FLAG_CHUNK_CRC32", "FLAG_HEADER_CRC32",
           "DELTA_PARENT_DIGEST_KEY", "ChunkType", "ChunkHeader", "CheckpointHeader", "CheckpointMetadata",
           "DataChunk", "Checkpoint", "CheckpointBuilder", "chunk_name_id", "crc32"]


def _check_checkpoints(**given: Any) -> None:
    """TypeError naming the first argument that is not a Checkpoint."""
    for label, cp in given.items():
        if not isinstance(cp, Checkpoint):
            raise TypeError(f"{label} must be a Checkpoint, got {type(cp).__name__}")


@dataclass
class DataChunk:
    """One chunk: its header and its bytes."""
    header: ChunkHeader
    data: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.header, ChunkHeader):
            raise TypeError(f"header must be a ChunkHeader, got {type(self.header).__name__}")
        self.data = as_bytes(self.data, "chunk data")

    @classmethod
    def new(cls, chunk_type: ChunkType, data: HostData) -> "DataChunk":
        """A chunk of this type holding `data`."""
        raw = as_bytes(data, "chunk data")
        return cls(ChunkHeader.new(chunk_type, len(raw)), raw)

    @classmethod
    def with_id(cls, chunk_type: ChunkType, data: HostData, chunk_id: int) -> "DataChunk":
        """A chunk of this type and id holding `data`."""
        raw = as_bytes(data, "chunk data")
        return cls(ChunkHeader.new(chunk_type, len(raw)).with_id(chunk_id), raw)

    def chunk_type(self) -> ChunkType | None:
        """The chunk's ChunkType, or None for a value the seed does not define."""
        return ChunkType.from_u32(self.header.chunk_type)

    def chunk_identity(self) -> tuple[ChunkType, int | None] | None:
        """(type, id) that names the same region across checkpoints (id only for
        DEVICE_MEMORY and CUSTOM chunks); None for an unknown type."""
        kind = self.chunk_type()
        if kind is None:
            return None
        return kind, (self.header.chunk_id if kind in (ChunkType.DEVICE_MEMORY, ChunkType.CUSTOM) else None)

    def crc32(self) -> int:
        """CRC32 of the chunk's header and data (the value in the chunk-CRC table)."""
        self._sync_sizes()
        return crc32(self.data, crc32(self.header.to_bytes()))

    def _sync_sizes(self) -> None:
        self.header.uncompressed_size = self.header.compressed_size = len(self.data)

    def __repr__(self) -> str:
        kind = self.chunk_type()
        name = kind.name if kind is not None else self.header.chunk_type
        return f"DataChunk({name}, id={self.header.chunk_id:#x}, {len(self.data)} bytes)"


@dataclass
class Checkpoint:
    """A kernel's snapshot: metadata and typed chunks (see the module docstring)."""
    metadata: CheckpointMetadata
    chunks: list[DataChunk] = field(default_factory=list)
    header: CheckpointHeader = field(default_factory=CheckpointHeader)

    def __post_init__(self) -> None:
        if not isinstance(self.metadata, CheckpointMetadata):
            raise TypeError(f"metadata must be a CheckpointMetadata, got {type(self.metadata).__name__}")
        self.chunks = list(self.chunks)
        for c in self.chunks:
            if not isinstance(c, DataChunk):
                raise TypeError(f"chunks must be DataChunks, got {type(c).__name__}")

    @classmethod
    def new(cls, metadata: CheckpointMetadata) -> "Checkpoint":
        """A checkpoint with this metadata and no chunks (the seed's Checkpoint::new)."""
        return cls(metadata)

    def add_chunk(self, chunk: DataChunk) -> None:
        """Append a chunk."""
        if not isinstance(chunk, DataChunk):
            raise TypeError(f"add_chunk takes a DataChunk, got {type(chunk).__name__}")
        self.chunks.append(chunk)

    def add_control_block(self, data: HostData) -> None:
        """Append a CONTROL_BLOCK chunk."""
        self.add_chunk(DataChunk.new(ChunkType.CONTROL_BLOCK, data))

    def add_h2k_queue(self, data: HostData) -> None:
        """Append an H2K_QUEUE chunk."""
        self.add_chunk(DataChunk.new(ChunkType.H2K_QUEUE, data))

    def add_k2h_queue(self, data: HostData) -> None:
        """Append a K2H_QUEUE chunk."""
        self.add_chunk(DataChunk.new(ChunkType.K2H_QUEUE, data))

    def add_hlc_state(self, data: HostData) -> None:
        """Append an HLC_STATE chunk."""
        self.add_chunk(DataChunk.new(ChunkType.HLC_STATE, data))

    def add_device_memory(self, name: str, data: HostData) -> None:
        """Append a DEVICE_MEMORY chunk named `name` (its id: chunk_name_id(name))."""
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        self.add_chunk(DataChunk.with_id(ChunkType.DEVICE_MEMORY, data, chunk_name_id(name)))

    def get_chunk(self, chunk_type: ChunkType) -> DataChunk | None:
        """The first chunk of this type, or None."""
        return next((c for c in self.chunks if c.chunk_type() is chunk_type), None)

    def get_chunks(self, chunk_type: ChunkType) -> list[DataChunk]:
        """Every chunk of this type, in order."""
        return [c for c in self.chunks if c.chunk_type() is chunk_type]

    def get_device_memory(self, name: str) -> DataChunk | None:
        """The DEVICE_MEMORY chunk added under `name`, or None."""
        cid = chunk_name_id(name)
        return next((c for c in self.chunks if c.chunk_type() is ChunkType.DEVICE_MEMORY
                     and c.header.chunk_id == cid), None)

    def get_custom(self, chunk_id: int) -> DataChunk | None:
        """The CUSTOM chunk with this id, or None."""
        return next((c for c in self.chunks if c.chunk_type() is ChunkType.CUSTOM and c.header.chunk_id == chunk_id),
                    None)

    def total_size(self) -> int:
        """Bytes of to_bytes(): header, metadata, chunks and the chunk-CRC table."""
        meta = len(self.metadata.to_bytes())
        return HEADER_SIZE + 4 + meta + sum(CHUNK_HEADER_SIZE + len(c.data) for c in self.chunks) + 4 * len(self.chunks)

    def _parts(self) -> tuple[CheckpointHeader, list[Any]]:
        """The header (checksum filled in) and the byte parts that follow it."""
        meta = self.metadata.to_bytes()
        total = HEADER_SIZE + 4 + len(meta) + sum(CHUNK_HEADER_SIZE + len(c.data) for c in self.chunks) \
            + 4 * len(self.chunks)
        if total > MAX_CHECKPOINT_SIZE:
            raise InvalidCheckpointError(f"Checkpoint too large: {total} bytes (max: {MAX_CHECKPOINT_SIZE}); "
                                         f"checkpoint fewer or smaller state buffers")
        if len(self.chunks) > MAX_CHUNKS:
            raise InvalidCheckpointError(f"{len(self.chunks)} chunks: a checkpoint holds at most {MAX_CHUNKS}")
        if len(self.metadata.custom) > MAX_CUSTOM_ENTRIES:
            raise InvalidCheckpointError(f"{len(self.metadata.custom)} custom metadata entries: a checkpoint holds at "
                                         f"most {MAX_CUSTOM_ENTRIES}")
        parts: list[Any] = [struct.pack("<I", len(meta)), meta]
        crcs = []
        for c in self.chunks:
            c._sync_sizes()
            head = c.header.to_bytes()
            parts += [head, c.data]
            crcs.append(crc32(c.data, crc32(head)))
        parts.append(struct.pack(f"<{len(crcs)}I", *crcs))
        checksum = 0
        for p in parts:
            checksum = crc32(p, checksum)
        header = CheckpointHeader.new(len(self.chunks), total)
        header.checksum, header.flags = checksum, FLAG_CHUNK_CRC32 | FLAG_HEADER_CRC32
        return header, parts

    def to_bytes(self) -> bytes:
        """The serialised checkpoint (the module docstring's layout); InvalidCheckpointError past 1 GiB."""
        header, parts = self._parts()
        self.header = header
        return b"".join([header.to_bytes(), *parts])

    def write_to(self, write: Callable[[bytes], object]) -> int:
        """Stream the serialised form to `write` (e.g. a file's write) without
        building it in one piece; returns the byte count."""
        header, parts = self._parts()
        self.header = header
        write(header.to_bytes())
        for p in parts:
            write(p)
        return header.total_size

    @classmethod
    def from_bytes(cls, data: HostData) -> "Checkpoint":
        """Parse and check a serialised checkpoint (InvalidCheckpointError if it is
        truncated, corrupted, too large or of an unknown version)."""
        try:
            view = memoryview(data).cast("B")  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"from_bytes takes bytes or a buffer-protocol object, got {type(data).__name__}") from None
        header = CheckpointHeader.from_bytes(view)
        header.validate()
        if header.total_size != len(view):
            what = "truncated" if len(view) < header.total_size else "followed by stray bytes"
            raise InvalidCheckpointError(f"Checkpoint {what}: the header says {header.total_size} bytes, got {len(view)}")
        actual = crc32(view[HEADER_SIZE:])
        if actual != header.checksum:
            raise InvalidCheckpointError(f"Checksum mismatch: the header says 0x{header.checksum:08x}, the data "
                                         f"hashes to 0x{actual:08x} (corrupted)")
        count = header.chunk_count
        with_crcs = bool(header.flags & FLAG_CHUNK_CRC32)
        per_chunk = CHUNK_HEADER_SIZE + (4 if with_crcs else 0)
        if count > MAX_CHUNKS or HEADER_SIZE + 4 + count * per_chunk > len(view):
            raise InvalidCheckpointError(f"the header claims {count} chunks: more than {MAX_CHUNKS} or than "
                                         f"{len(view)} bytes hold")
        end = len(view) - (4 * count if with_crcs else 0)   # the chunks end where the CRC table starts
        at = HEADER_SIZE

        def take(n: int, what: str) -> memoryview:
            nonlocal at
            if n > end - at:
                raise InvalidCheckpointError(f"{what} truncated")
            part = view[at:at + n]
            at += n
            return part
        (meta_len,) = struct.unpack("<I", take(4, "metadata length"))
        metadata = CheckpointMetadata.from_bytes(take(meta_len, "Metadata"))
        chunks = []
        for i in range(count):
            raw_head = take(CHUNK_HEADER_SIZE, f"Chunk header {i}")
            ch = ChunkHeader.from_bytes(raw_head)
            if ch.compressed_size != ch.uncompressed_size:
                raise InvalidCheckpointError(f"chunk {i}: compressed size {ch.compressed_size} != uncompressed size "
                                             f"{ch.uncompressed_size} in an uncompressed checkpoint")
            body = take(ch.compressed_size, f"Chunk {i} data")
            chunk = DataChunk(ch, body.tobytes())
            if with_crcs:
                (want,) = struct.unpack_from("<I", view, end + 4 * i)
                got = crc32(body, crc32(raw_head))
                if got != want:
                    raise InvalidCheckpointError(f"chunk {i} ({chunk!r}) fails its CRC32: 0x{got:08x}, stored "
                                                 f"0x{want:08x} (corrupted)")
            chunks.append(chunk)
        if at != end:
            raise InvalidCheckpointError(f"{end - at} stray byte(s) after the last chunk")
        return cls(metadata, chunks, header)

    # -- deltas (the seed's incremental checkpoints) --------------------------------------

    def content_digest(self) -> str:
        """CRC32 over each chunk's identity and data, as 8 hex digits (a delta's parent id)."""
        acc = 0
        for c in self.chunks:
            ident = c.chunk_identity()
            if ident is None:
                continue
            kind, cid = ident
            acc = crc32(c.data, crc32(struct.pack("<IQ4x", kind.value, cid or 0), acc))
        return f"{acc:08x}"

    @staticmethod
    def delta_from(base: "Checkpoint", new: "Checkpoint") -> "Checkpoint":
        """The chunks of `new` that differ from (or are missing in) `base`, naming base's digest."""
        _check_checkpoints(base=base, new=new)
        index = {c.chunk_identity(): c for c in base.chunks if c.chunk_identity() is not None}
        meta = CheckpointMetadata(**{**new.metadata.__dict__, "custom": dict(new.metadata.custom)})
        meta.custom[DELTA_PARENT_DIGEST_KEY] = base.content_digest()
        out = Checkpoint(meta)
        for c in new.chunks:
            ident = c.chunk_identity()
            if ident is None:
                continue
            old = index.get(ident)
            if old is None or old.data != c.data:
                out.chunks.append(c)
        return out

    @staticmethod
    def applied_with_delta(base: "Checkpoint", delta: "Checkpoint") -> "Checkpoint":
        """`base` with `delta`'s chunks replacing those of the same identity (InvalidCheckpointError
        when the delta was made against another base)."""
        _check_checkpoints(base=base, delta=delta)
        recorded = delta.metadata.custom.get(DELTA_PARENT_DIGEST_KEY)
        if recorded is not None and recorded != base.content_digest():
            raise InvalidCheckpointError(f"delta parent digest mismatch: expected {short_repr(recorded)}, got "
                                         f"{base.content_digest()}")
        by_id = {c.chunk_identity(): c for c in delta.chunks if c.chunk_identity() is not None}
        meta = CheckpointMetadata(**{**delta.metadata.__dict__, "custom": dict(delta.metadata.custom)})
        out = Checkpoint(meta)
        used = set()
        for c in base.chunks:
            ident = c.chunk_identity()
            if ident in by_id:
                out.chunks.append(by_id[ident])
                used.add(ident)
            else:
                out.chunks.append(c)
        out.chunks += [c for c in delta.chunks if c.chunk_identity() is not None and c.chunk_identity() not in used]
        return out

    def __repr__(self) -> str:
        m = self.metadata
        return (f"Checkpoint({short_text(m.kernel_id)}, {short_text(m.kernel_type, 30)}, step={m.current_step}, "
                f"{len(self.chunks)} chunks, {sum(len(c.data) for c in self.chunks)} data bytes)")


class CheckpointBuilder:
    """Builds a Checkpoint step by step; every setter returns the builder."""

    def __init__(self, kernel_id: str, kernel_type: str):
        self._metadata = CheckpointMetadata(kernel_id, kernel_type)
        self._chunks: list[DataChunk] = []

    def step(self, step: int) -> "CheckpointBuilder":
        """Set the current step."""
        self._metadata.with_step(step)
        return self

    def grid_size(self, width: int, height: int, depth: int) -> "CheckpointBuilder":
        """Set the grid size."""
        self._metadata.with_grid_size(width, height, depth)
        return self

    def tile_size(self, x: int, y: int, z: int) -> "CheckpointBuilder":
        """Set the tile size."""
        self._metadata.with_tile_size(x, y, z)
        return self

    def hlc(self, hlc: HlcTimestamp) -> "CheckpointBuilder":
        """Set the HLC timestamp."""
        self._metadata.with_hlc(hlc)
        return self

    def custom(self, key: str, value: str) -> "CheckpointBuilder":
        """Add a custom key/value."""
        self._metadata.with_custom(key, value)
        return self

    def control_block(self, data: HostData) -> "CheckpointBuilder":
        """Add a CONTROL_BLOCK chunk."""
        self._chunks.append(DataChunk.new(ChunkType.CONTROL_BLOCK, data))
        return self

    def h2k_queue(self, data: HostData) -> "CheckpointBuilder":
        """Add an H2K_QUEUE chunk."""
        self._chunks.append(DataChunk.new(ChunkType.H2K_QUEUE, data))
        return self

    def k2h_queue(self, data: HostData) -> "CheckpointBuilder":
        """Add a K2H_QUEUE chunk."""
        self._chunks.append(DataChunk.new(ChunkType.K2H_QUEUE, data))
        return self

    def hlc_state(self, data: HostData) -> "CheckpointBuilder":
        """Add an HLC_STATE chunk."""
        self._chunks.append(DataChunk.new(ChunkType.HLC_STATE, data))
        return self

    def device_memory(self, name: str, data: HostData) -> "CheckpointBuilder":
        """Add a DEVICE_MEMORY chunk named `name`."""
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        self._chunks.append(DataChunk.with_id(ChunkType.DEVICE_MEMORY, data, chunk_name_id(name)))
        return self

    def chunk(self, chunk: DataChunk) -> "CheckpointBuilder":
        """Add a chunk as it is."""
        if not isinstance(chunk, DataChunk):
            raise TypeError(f"chunk() takes a DataChunk, got {type(chunk).__name__}")
        self._chunks.append(chunk)
        return self

    def build(self) -> Checkpoint:
        """The Checkpoint (the builder may go on and build more)."""
        meta = self._metadata
        return Checkpoint(CheckpointMetadata(**{**meta.__dict__, "custom": dict(meta.custom)}), list(self._chunks))

