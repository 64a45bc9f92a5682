"""Bounded fuzz of the checkpoint parser, the restore checks and FileStorage (issue 23).

Derandomized Hypothesis runs (a few thousand cases, well under a minute on the
CI machine): every input gives the right answer or a typed error
(InvalidCheckpointError, CheckpointStorageError, CheckpointNotFoundError, or
ValueError / TypeError for a bad name), never another exception, a hang or a
read outside the folder. Nothing here reaches the driver: the restore checks
run on the host before any launch (tests/test_checkpoint_forged.py restores).
"""
from __future__ import annotations

import os
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vkmulti.errors import CheckpointNotFoundError, CheckpointStorageError, InvalidCheckpointError
from vkmulti.kernels.checkpoint import CHECKPOINT_MAGIC, HEADER_SIZE, Checkpoint, CheckpointBuilder, FileStorage
from vkmulti.kernels.checkpoint.restorable import check_kernel_checkpoint
from vkmulti.kernels.lifecycle import INBOX_CHUNK, KernelImage, from_checkpoint, to_checkpoint

FUZZ = dict(derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _sample_image_checkpoint() -> Checkpoint:
    from vkmulti.kernels import counter_kernel
    from vkmulti.kernels.messages import ENVELOPE_BYTES, RING_HEADER_BYTES

    spec = counter_kernel(inbox_capacity=4, outbox_capacity=4)
    payload = 256
    slot = ENVELOPE_BYTES + payload
    img = KernelImage(spec, "k", 3, 0, (0, 0, 0, 0), 2, 1, payload, bytes(64 + 16 * 8),
                      bytes(RING_HEADER_BYTES + spec.inbox_capacity * slot), [bytes(n) for n in spec.state_sizes],
                      [bytes(slot)], [])
    return to_checkpoint(img)


SAMPLE = CheckpointBuilder("fuzz", "t").step(3).custom("a", "b").control_block(b"\1" * 80) \
    .device_memory("state0", b"\2" * 64).k2h_queue(b"").build().to_bytes()


def _finish(body: bytes, count: int, flags: int, total: int | None = None) -> bytes:
    """A header over `body` with its checksum and header CRC correct (what a forger writes)."""
    size = HEADER_SIZE + len(body) if total is None else total
    fixed = struct.pack("<QIIQIIIIQ", CHECKPOINT_MAGIC, 1, HEADER_SIZE, size, count, 0, zlib.crc32(body), flags, 0)
    return fixed + struct.pack("<I12x", zlib.crc32(fixed) if flags & 2 else 0) + body


@st.composite
def forged(draw):
    """CRC-valid files whose structure lies: counts, sizes, flags, metadata, tables."""
    meta = draw(st.one_of(st.binary(max_size=80),
                          st.builds(lambda n, k: struct.pack("<I", n) + k, st.integers(0, 2**32 - 1),
                                    st.binary(max_size=40))))
    meta_len = draw(st.one_of(st.just(len(meta)), st.integers(0, 2**32 - 1)))
    chunks = draw(st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 5, 6, 8, 100, 7777]), st.integers(0, 3),
                                     st.binary(max_size=48), st.integers(-4, 4)), max_size=6))
    body, crcs = struct.pack("<I", meta_len) + meta, []
    for kind, flags, data, lie in chunks:
        size = max(0, len(data) + lie)
        head = struct.pack("<IIQQQ", kind, flags, size, size if lie != 3 else size + 1, 5)
        body += head + data
        crcs.append(zlib.crc32(data, zlib.crc32(head)))
    flags = draw(st.sampled_from([0, 1, 2, 3, 3, 3, 7]))
    if flags & 1:
        body += struct.pack(f"<{len(crcs)}I", *crcs)
    count = draw(st.one_of(st.just(len(chunks)), st.integers(0, 2**32 - 1), st.integers(0, 10)))
    total = draw(st.one_of(st.none(), st.integers(0, 2**64 - 1)))
    return _finish(body, count, flags, total)


def _parse(raw: bytes) -> Checkpoint | None:
    try:
        cp = Checkpoint.from_bytes(raw)
    except InvalidCheckpointError:
        return None
    assert Checkpoint.from_bytes(cp.to_bytes()).chunks == cp.chunks   # what parses, round-trips
    return cp


@settings(max_examples=1500, **FUZZ)
@given(forged())
def test_forged_structure_parses_or_is_refused(raw):
    _parse(raw)


@settings(max_examples=800, **FUZZ)
@given(st.integers(0, len(SAMPLE) - 1), st.integers(1, 255), st.integers(0, len(SAMPLE)), st.binary(max_size=8))
def test_damaged_sample_parses_or_is_refused(at, xor, cut, extra):
    bad = bytearray(SAMPLE)
    bad[at] ^= xor
    for raw in (bytes(bad), SAMPLE[:cut], SAMPLE[:cut] + extra + SAMPLE[cut:]):
        _parse(raw)


KERNEL = _sample_image_checkpoint()


@st.composite
def kernel_forgery(draw):
    """The sample kernel checkpoint with metadata values and chunk sizes changed."""
    cp = Checkpoint.from_bytes(KERNEL.to_bytes())
    keys = sorted(cp.metadata.custom)
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(keys))
        cp.metadata.custom[key] = draw(st.one_of(
            st.text(max_size=30), st.integers(-2**70, 2**70).map(str),
            st.sampled_from(["[", "[" * 5000, "{}", "[1,2,3,4,5]", '{"groups": [1,1]}', "1e400", "NaN",
                             '{"state_sizes": [64], "inbox_capacity": 4, "outbox_capacity": 4, '
                             '"groups": [65535, 65535, 1], "entry_point": "main"}'])))
    for _ in range(draw(st.integers(0, 3))):
        c = cp.chunks[draw(st.integers(0, len(cp.chunks) - 1))]
        op = draw(st.sampled_from(["grow", "shrink", "dup", "drop"]))
        if op == "grow":
            c.data += bytes(draw(st.integers(1, 64)))
        elif op == "shrink":
            c.data = c.data[:draw(st.integers(0, max(0, len(c.data) - 1)))]
        elif op == "dup":
            cp.chunks.append(c)
        else:
            cp.chunks.remove(c)
    return Checkpoint.from_bytes(cp.to_bytes())


@settings(max_examples=1000, **FUZZ)
@given(kernel_forgery())
def test_forged_kernel_checkpoints_are_checked_on_the_host(cp):
    """check_kernel_checkpoint and from_checkpoint give an image or InvalidCheckpointError."""
    try:
        check_kernel_checkpoint(cp)
    except InvalidCheckpointError:
        with pytest.raises(InvalidCheckpointError):
            from_checkpoint(cp)
        return
    img = from_checkpoint(cp)
    assert img.inbox == cp.get_custom(INBOX_CHUNK).data and len(img.states) == len(img.spec.state_sizes)


def test_the_true_sample_passes():
    check_kernel_checkpoint(KERNEL)
    assert from_checkpoint(KERNEL).kernel_id == "k"


# ---- FileStorage ------------------------------------------------------------------

NAMES = st.one_of(st.text(max_size=12), st.text(alphabet="é語a./\\\0:", min_size=1, max_size=220),
                  st.sampled_from(["fifo", "link", "dir", "big", "zero", "ok", "..", ".hidden", "a" * 250]),
                  st.integers(), st.none())
OPS = st.sampled_from(["save", "load", "exists", "delete", "list"])


@pytest.fixture(scope="module")
def hostile_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    folder = root / "cps"
    FileStorage(root / "outside").save(CheckpointBuilder("x", "t").build(), "out")
    folder.mkdir()
    os.mkfifo(folder / "fifo.rkcp")
    os.symlink(root / "outside" / "out.rkcp", folder / "link.rkcp")
    os.symlink("/dev/zero", folder / "zero.rkcp")
    (folder / "dir.rkcp").mkdir()
    with open(folder / "big.rkcp", "wb") as f:
        f.truncate(3 << 30)
    return folder


STORED = CheckpointBuilder("s", "t").step(5).build()
NOT_FILES = {"fifo", "link", "zero", "dir"}   # never listed, never loaded
HOSTILE = NOT_FILES | {"big"}                   # big: a regular (sparse) file of 3 GiB, refused as too large


@settings(max_examples=700, **FUZZ)
@given(st.lists(st.tuples(OPS, NAMES), min_size=1, max_size=6))
def test_file_storage_answers_or_raises_typed_errors(hostile_folder, ops):
    fs = FileStorage(hostile_folder)
    for op, name in ops:
        try:
            if op == "save":
                if name in HOSTILE:
                    continue   # (keeps the hostile entries for every case)
                fs.save(STORED, name)
                assert fs.exists(name) and fs.load(name).metadata.current_step == 5
                fs.delete(name)
            elif op == "load":
                fs.load(name)
                assert name not in HOSTILE
            elif op == "exists":
                assert fs.exists(name) is (name == "big")
            elif op == "delete":
                if name not in HOSTILE:
                    fs.delete(name)
            else:
                assert fs.list() == ["big"]
        except (ValueError, TypeError, CheckpointNotFoundError, CheckpointStorageError):
            pass   # InvalidCheckpointError is a ValueError
    assert (hostile_folder / "fifo.rkcp").exists() and os.path.islink(hostile_folder / "link.rkcp")


# ---- length and count fields of a true checkpoint, resealed -----------------------


def _fields(raw: bytes) -> list[tuple[int, int]]:
    """(offset, width) of every length, count and size field of a checkpoint this module
    wrote: header total size and chunk count, metadata length, its string lengths and
    custom count, and each chunk's type and sizes."""
    out = [(16, 8), (24, 4), (36, 4), (HEADER_SIZE, 4)]
    at = HEADER_SIZE + 4
    meta_end = at + struct.unpack_from("<I", raw, HEADER_SIZE)[0]
    for _ in range(2):   # kernel id, kernel type
        out.append((at, 4))
        at += 4 + struct.unpack_from("<I", raw, at)[0]
    at += 8 + 12 + 12 + 24
    out.append((at, 4))   # custom count
    at += 4
    while at < meta_end:   # custom keys and values
        out.append((at, 4))
        at += 4 + struct.unpack_from("<I", raw, at)[0]
    for _ in range(struct.unpack_from("<I", raw, 24)[0]):
        out += [(at, 4), (at + 8, 8), (at + 16, 8), (at + 8, 16)]   # 16: both sizes, set alike
        at += 32 + struct.unpack_from("<Q", raw, at + 8)[0]
    return out


def _reseal(raw: bytearray, count: int) -> bytes:
    """Recompute the chunk-CRC table (of the `count` chunks the original had, walked with
    the sizes the bytes now state), the checksum and the header CRC, as a forger would:
    the parser then meets the lie, not a CRC mismatch."""
    table = len(raw) - 4 * count
    spans = []
    try:
        at = HEADER_SIZE + 4 + struct.unpack_from("<I", raw, HEADER_SIZE)[0]
        for _ in range(count):
            end = at + 32 + struct.unpack_from("<Q", raw, at + 8)[0]
            if end > table:
                break
            spans.append((at, end))
            at = end
    except struct.error:
        pass
    for i, (a, b) in enumerate(spans):
        struct.pack_into("<I", raw, table + 4 * i, zlib.crc32(raw[a:b]))
    struct.pack_into("<I", raw, 32, zlib.crc32(raw[HEADER_SIZE:]))
    struct.pack_into("<I", raw, 48, zlib.crc32(raw[:48]))
    return bytes(raw)


RICH = CheckpointBuilder("fuzz-kernel", "type").step(7).grid_size(2, 3, 4).custom("a", "b").custom("key", "v" * 9) \
    .control_block(b"\1" * 80).device_memory("state0", b"\2" * 64).k2h_queue(b"").h2k_queue(b"\3" * 12) \
    .build().to_bytes()
RICH_FIELDS = _fields(RICH)
RICH_CHUNKS = 4


def test_the_field_map_reads_the_rich_sample():
    assert Checkpoint.from_bytes(_reseal(bytearray(RICH), RICH_CHUNKS)).to_bytes()[64:] == RICH[64:]
    assert len(RICH_FIELDS) == 4 + 2 + 1 + 4 + 4 * RICH_CHUNKS   # header, strings, count, custom strings, chunks


@st.composite
def resealed(draw):
    """RICH with one to three length / count / size fields set to a lie, CRCs made right."""
    raw = bytearray(RICH)
    for _ in range(draw(st.integers(1, 3))):
        at, width = draw(st.sampled_from(RICH_FIELDS))
        both = width == 16
        width = 8 if both else width
        top = (1 << (8 * width)) - 1
        old = int.from_bytes(raw[at:at + width], "little")
        value = draw(st.one_of(st.sampled_from([0, 1, top, top - 1, 1 << 30, (1 << 30) + 1, 1 << 31, 4096, 4097]),
                               st.integers(max(0, old - 40), min(top, old + 40)), st.integers(0, top)))
        raw[at:at + width] = value.to_bytes(width, "little")
        if both:
            raw[at + 8:at + 16] = value.to_bytes(8, "little")
    return _reseal(raw, RICH_CHUNKS)


@pytest.fixture(scope="module")
def read_path(tmp_path_factory):
    return FileStorage(tmp_path_factory.mktemp("resealed"))


@settings(max_examples=600, **FUZZ)
@given(resealed())
def test_lying_length_fields_parse_or_are_refused_from_storage_too(read_path, raw):
    """Every lie in a length, count or size field of a CRC-valid file parses (and
    round-trips) or is InvalidCheckpointError, from bytes and from FileStorage, and the
    parse allocates no more than a few times the file."""
    import tracemalloc
    tracemalloc.start()
    try:
        cp = _parse(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(raw) + (256 << 10)
    (read_path.base_path / "cp.rkcp").write_bytes(raw)
    try:
        loaded = read_path.load("cp")
    except InvalidCheckpointError:
        assert cp is None
    else:
        assert cp is not None and loaded.chunks == cp.chunks and loaded.metadata == cp.metadata
