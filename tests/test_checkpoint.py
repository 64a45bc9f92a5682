"""Checkpoints (issue 16): the seed's checkpoint.rs tests ported, the CRC32 per
chunk, corrupted / truncated / oversized input rejected with a typed error,
deltas, and the storage backends (atomic file writes, names that cannot leave
the folder). No GPU needed."""
from __future__ import annotations

import os
import struct
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from vkmulti import (CHECKPOINT_MAGIC, CHECKPOINT_VERSION, MAX_CHECKPOINT_SIZE, Checkpoint, CheckpointBuilder,
                     CheckpointHeader, CheckpointMetadata, CheckpointNotFoundError, CheckpointStorage, ChunkHeader,
                     ChunkType, DataChunk, FileStorage, HlcTimestamp, InvalidCheckpointError, MemoryStorage, VkmError)
from vkmulti.kernels.checkpoint import FLAG_CHUNK_CRC32, FLAG_HEADER_CRC32, crc32


# ---- the seed's tests (checkpoint.rs) ----

def test_checkpoint_header_roundtrip():
    header = CheckpointHeader.new(5, 1024)
    restored = CheckpointHeader.from_bytes(header.to_bytes())
    assert restored.magic == CHECKPOINT_MAGIC
    assert restored.version == CHECKPOINT_VERSION
    assert restored.chunk_count == 5
    assert restored.total_size == 1024
    assert len(header.to_bytes()) == 64


def test_chunk_header_roundtrip():
    header = ChunkHeader.new(ChunkType.DEVICE_MEMORY, 4096).with_id(12345)
    restored = ChunkHeader.from_bytes(header.to_bytes())
    assert restored.chunk_type == ChunkType.DEVICE_MEMORY.value
    assert restored.uncompressed_size == 4096
    assert restored.chunk_id == 12345
    assert len(header.to_bytes()) == 32


def test_metadata_roundtrip():
    metadata = (CheckpointMetadata.new("kernel_1", "fdtd_3d").with_step(1000).with_grid_size(64, 64, 64)
                .with_tile_size(8, 8, 8).with_custom("version", "1.0"))
    restored = CheckpointMetadata.from_bytes(metadata.to_bytes())
    assert restored.kernel_id == "kernel_1"
    assert restored.kernel_type == "fdtd_3d"
    assert restored.current_step == 1000
    assert restored.grid_size == (64, 64, 64)
    assert restored.tile_size == (8, 8, 8)
    assert restored.custom.get("version") == "1.0"


def test_checkpoint_roundtrip():
    checkpoint = (CheckpointBuilder("test_kernel", "test_type").step(500).grid_size(32, 32, 32)
                  .control_block(bytes([1, 2, 3, 4])).device_memory("pressure_a", bytes([5, 6, 7, 8, 9, 10])).build())
    restored = Checkpoint.from_bytes(checkpoint.to_bytes())
    assert restored.metadata.kernel_id == "test_kernel"
    assert restored.metadata.current_step == 500
    assert len(restored.chunks) == 2
    assert restored.get_chunk(ChunkType.CONTROL_BLOCK).data == bytes([1, 2, 3, 4])


def test_memory_storage():
    storage = MemoryStorage()
    checkpoint = CheckpointBuilder("mem_test", "test").step(100).build()
    storage.save(checkpoint, "test_001")
    assert storage.exists("test_001")
    loaded = storage.load("test_001")
    assert loaded.metadata.kernel_id == "mem_test"
    assert loaded.metadata.current_step == 100
    assert storage.list() == ["test_001"]
    storage.delete("test_001")
    assert not storage.exists("test_001")


def test_crc32():
    assert crc32(b"") == 0
    assert crc32(b"123456789") == 0xCBF43926


def test_checkpoint_validation():
    header = CheckpointHeader.from_bytes(bytes(64))   # wrong magic
    with pytest.raises(InvalidCheckpointError):
        header.validate()


def test_large_checkpoint():
    large = bytes(i % 256 for i in range(100_000))
    checkpoint = (CheckpointBuilder("large_kernel", "stress_test").step(999).device_memory("field_a", large)
                  .device_memory("field_b", large).build())
    restored = Checkpoint.from_bytes(checkpoint.to_bytes())
    assert len(restored.chunks) == 2
    chunks = restored.get_chunks(ChunkType.DEVICE_MEMORY)
    assert len(chunks) == 2
    assert len(chunks[0].data) == 100_000


# ---- spelling and layout ----

def test_chunk_types_have_the_seed_values():
    assert [(t.name, t.value) for t in ChunkType] == [
        ("CONTROL_BLOCK", 1), ("H2K_QUEUE", 2), ("K2H_QUEUE", 3), ("HLC_STATE", 4), ("DEVICE_MEMORY", 5),
        ("K2K_ROUTING", 6), ("HALO_BUFFERS", 7), ("TELEMETRY", 8), ("CUSTOM", 100)]
    assert ChunkType.from_u32(5) is ChunkType.DEVICE_MEMORY
    assert ChunkType.from_u32(9) is None


def test_layout_is_the_seeds_with_a_chunk_crc_table():
    cp = CheckpointBuilder("k", "t").step(7).hlc(HlcTimestamp(123, 4)).control_block(b"abcd").build()
    raw = cp.to_bytes()
    magic, version, header_size, total, count, compression, checksum, flags, created, header_crc = \
        struct.unpack_from("<QIIQIIIIQI", raw)
    assert raw[:8] == b"RKCKPT01"[::-1]   # the seed's u64 constant, little-endian
    assert (magic, version, header_size, total, count, compression) == (CHECKPOINT_MAGIC, 1, 64, len(raw), 1, 0)
    assert flags == FLAG_CHUNK_CRC32 | FLAG_HEADER_CRC32 and created > 0
    assert header_crc == zlib.crc32(raw[:48]) and raw[52:64] == bytes(12)
    assert checksum == zlib.crc32(raw[64:])
    (meta_len,) = struct.unpack_from("<I", raw, 64)
    head = raw[68 + meta_len:68 + meta_len + 32]
    assert struct.unpack("<IIQQQ", head) == (1, 0, 4, 4, 0)
    assert raw[100 + meta_len:104 + meta_len] == b"abcd"
    (table,) = struct.unpack_from("<I", raw, 104 + meta_len)
    assert table == zlib.crc32(b"abcd", zlib.crc32(head))
    assert len(raw) == cp.total_size() == 108 + meta_len
    assert Checkpoint.from_bytes(raw).metadata.hlc_timestamp == HlcTimestamp(123, 4)


def test_a_checkpoint_without_the_crc_table_loads_like_the_seeds():
    """What the seed writes (flags 0, no CRC table) loads."""
    cp = CheckpointBuilder("k", "t").device_memory("x", b"12345678").build()
    raw = bytearray(cp.to_bytes())
    raw = raw[:-4]                                   # drop the table
    struct.pack_into("<Q", raw, 16, len(raw))        # total size
    struct.pack_into("<I", raw, 36, 0)               # flags
    raw[48:64] = bytes(16)                           # reserved
    struct.pack_into("<I", raw, 32, zlib.crc32(bytes(raw[64:])))
    assert Checkpoint.from_bytes(bytes(raw)).get_device_memory("x").data == b"12345678"


# ---- damage ----

@pytest.fixture
def sample() -> bytes:
    return (CheckpointBuilder("kernel-7", "counter").step(42).grid_size(4, 1, 1).custom("a", "b")
            .control_block(bytes(range(64))).device_memory("state0", os.urandom(3000))
            .h2k_queue(b"h" * 48).build().to_bytes())


def test_every_truncation_is_rejected(sample):
    for n in list(range(0, 200)) + list(range(len(sample) - 100, len(sample))):
        with pytest.raises(InvalidCheckpointError):
            Checkpoint.from_bytes(sample[:n])


def test_every_flipped_byte_is_rejected(sample):
    """A flipped bit anywhere (header, metadata, chunk headers, data, CRC table) is caught."""
    for i in range(0, len(sample), 7):
        bad = bytearray(sample)
        bad[i] ^= 0x10
        with pytest.raises(InvalidCheckpointError):
            Checkpoint.from_bytes(bytes(bad))


def test_a_damaged_chunk_is_named_by_its_crc(sample):
    """With the whole-file checksum made to match, the per-chunk CRC still finds the damaged chunk."""
    bad = bytearray(sample)
    bad[-100] ^= 1   # inside the state chunk
    struct.pack_into("<I", bad, 32, zlib.crc32(bytes(bad[64:])))
    struct.pack_into("<I", bad, 48, zlib.crc32(bytes(bad[:48])))
    with pytest.raises(InvalidCheckpointError, match=r"chunk 1 .*CRC32"):
        Checkpoint.from_bytes(bytes(bad))


def test_stray_bytes_bad_versions_and_sizes_are_rejected(sample):
    with pytest.raises(InvalidCheckpointError, match="stray"):
        Checkpoint.from_bytes(sample + b"\0")
    def rehash(b):
        struct.pack_into("<I", b, 48, zlib.crc32(bytes(b[:48])))
        return bytes(b)
    newer = bytearray(sample)
    struct.pack_into("<I", newer, 8, CHECKPOINT_VERSION + 1)
    newer = rehash(newer)
    with pytest.raises(InvalidCheckpointError, match="Unsupported version"):
        Checkpoint.from_bytes(bytes(newer))
    huge = bytearray(sample)
    struct.pack_into("<Q", huge, 16, MAX_CHECKPOINT_SIZE + 1)
    huge = rehash(huge)
    with pytest.raises(InvalidCheckpointError, match="too large"):
        Checkpoint.from_bytes(bytes(huge))
    compressed = bytearray(sample)
    struct.pack_into("<I", compressed, 28, 1)
    compressed = rehash(compressed)
    with pytest.raises(InvalidCheckpointError, match="compression"):
        Checkpoint.from_bytes(bytes(compressed))
    assert issubclass(InvalidCheckpointError, VkmError) and issubclass(InvalidCheckpointError, ValueError)
    with pytest.raises(TypeError):
        Checkpoint.from_bytes(12)


def test_writing_past_the_cap_is_refused():
    """The 1 GiB cap holds for writing too (checked before any byte is produced)."""
    class Huge:   # stands in for 1 GiB of data without allocating it
        def __len__(self) -> int:
            return MAX_CHECKPOINT_SIZE
    cp = CheckpointBuilder("k", "t").build()
    chunk = DataChunk(ChunkHeader.new(ChunkType.CUSTOM, 0), b"")
    chunk.data = Huge()   # type: ignore[assignment]
    cp.chunks = [chunk]
    with pytest.raises(InvalidCheckpointError, match="too large"):
        cp.to_bytes()


def test_bad_arguments_are_typed():
    with pytest.raises(TypeError):
        CheckpointBuilder("k", "t").device_memory(3, b"")
    with pytest.raises(ValueError):
        CheckpointBuilder("k", "t").step(-1)
    with pytest.raises(TypeError):
        CheckpointBuilder("k", "t").control_block(object())
    with pytest.raises(ValueError):
        CheckpointMetadata("k", "t", grid_size=(1, 2))
    with pytest.raises(TypeError):
        CheckpointMetadata("k", "t", custom={"a": 1})
    with pytest.raises(TypeError):
        Checkpoint(metadata="nope")


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=20), st.text(max_size=20), st.integers(0, 2**64 - 1),
       st.lists(st.tuples(st.sampled_from(list(ChunkType)), st.binary(max_size=300)), max_size=6),
       st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4))
def test_roundtrip_property(kid, ktype, step, chunks, custom):
    b = CheckpointBuilder(kid, ktype).step(step)
    for k, v in custom.items():
        b = b.custom(k, v)
    for kind, data in chunks:
        b = b.chunk(DataChunk.new(kind, data))
    cp = b.build()
    back = Checkpoint.from_bytes(cp.to_bytes())
    assert (back.metadata.kernel_id, back.metadata.kernel_type, back.metadata.current_step) == (kid, ktype, step)
    assert back.metadata.custom == custom
    assert [(c.chunk_type(), c.data) for c in back.chunks] == [(k, d) for k, d in chunks]


def test_delta_checkpoints():
    base = CheckpointBuilder("k", "t").control_block(b"cb").device_memory("a", b"1111").device_memory("b", b"2222")\
        .build()
    new = CheckpointBuilder("k", "t").step(2).control_block(b"cb").device_memory("a", b"1111")\
        .device_memory("b", b"3333").build()
    delta = Checkpoint.delta_from(base, new)
    assert [c.data for c in delta.chunks] == [b"3333"]
    full = Checkpoint.applied_with_delta(base, delta)
    assert full.get_device_memory("b").data == b"3333" and full.get_device_memory("a").data == b"1111"
    assert full.metadata.current_step == 2
    with pytest.raises(InvalidCheckpointError, match="parent digest"):
        Checkpoint.applied_with_delta(new, delta)


# ---- storage ----

@pytest.fixture(params=["memory", "file"])
def storage(request, tmp_path):
    return MemoryStorage() if request.param == "memory" else FileStorage(tmp_path / "cps")


def test_storage_protocol(storage):
    assert isinstance(storage, CheckpointStorage)
    assert storage.list() == []
    cps = {name: CheckpointBuilder(name, "t").step(i).device_memory("s", os.urandom(100)).build()
           for i, name in enumerate(["b", "a", "migration_k-1_0_1"])}
    for name, cp in cps.items():
        storage.save(cp, name)
    assert storage.list() == sorted(cps)
    for name, cp in cps.items():
        assert storage.exists(name)
        assert storage.load(name).get_device_memory("s").data == cp.get_device_memory("s").data
    storage.save(CheckpointBuilder("b", "t").step(99).build(), "b")   # overwrite
    assert storage.load("b").metadata.current_step == 99
    storage.delete("a")
    assert not storage.exists("a")
    with pytest.raises(CheckpointNotFoundError):
        storage.load("a")
    with pytest.raises(CheckpointNotFoundError):
        storage.delete("a")
    assert isinstance(CheckpointNotFoundError("x"), (VkmError, FileNotFoundError, OSError))


@pytest.mark.parametrize("name", ["", "../evil", "a/b", "a\\b", ".hidden", "x\0y", "..", "C:x", "a" * 201])
def test_names_cannot_leave_the_folder(storage, name):
    cp = CheckpointBuilder("k", "t").build()
    with pytest.raises(ValueError):
        storage.save(cp, name)
    with pytest.raises(ValueError):
        storage.load(name)
    assert not storage.exists(name)
    with pytest.raises(TypeError):
        storage.save(cp, 5)
    with pytest.raises(TypeError):
        storage.save(b"not a checkpoint", "ok")


def test_file_writes_are_atomic(tmp_path, monkeypatch):
    """A save that dies mid-write leaves the previous checkpoint (and no temporary file)."""
    fs = FileStorage(tmp_path)
    fs.save(CheckpointBuilder("k", "t").step(1).device_memory("s", b"old" * 100).build(), "cp")

    class Boom(Exception):
        pass
    calls = []
    real = Checkpoint.write_to

    def dying(self, write):
        def half(part):
            calls.append(len(part))
            if len(calls) > 3:
                raise Boom("disk gone")
            return write(part)
        return real(self, half)
    monkeypatch.setattr(Checkpoint, "write_to", dying)
    with pytest.raises(Boom):
        fs.save(CheckpointBuilder("k", "t").step(2).device_memory("s", b"new" * 100).build(), "cp")
    monkeypatch.undo()
    assert fs.load("cp").metadata.current_step == 1
    assert sorted(os.listdir(tmp_path)) == ["cp.rkcp"]
    assert fs.list() == ["cp"]


def test_file_storage_rejects_a_corrupted_file(tmp_path):
    fs = FileStorage(tmp_path)
    fs.save(CheckpointBuilder("k", "t").device_memory("s", b"x" * 64).build(), "cp")
    path = tmp_path / "cp.rkcp"
    raw = bytearray(path.read_bytes())
    raw[-20] ^= 4
    path.write_bytes(bytes(raw))
    with pytest.raises(InvalidCheckpointError):
        fs.load("cp")
    path.write_bytes(bytes(raw[:50]))
    with pytest.raises(InvalidCheckpointError):
        fs.load("cp")


def test_file_storage_on_a_file_is_refused(tmp_path):
    f = tmp_path / "plain"
    f.write_text("x")
    with pytest.raises(ValueError):
        FileStorage(f)
    with pytest.raises(TypeError):
        FileStorage(3)


def test_storage_is_thread_safe(storage, run_threads):
    def worker(t):
        for i in range(20):
            name = f"t{t}-{i}"
            storage.save(CheckpointBuilder(name, "t").step(i).build(), name)
            assert storage.load(name).metadata.current_step == i
    assert run_threads(worker, 4) == []
    assert len(storage.list()) == 80
