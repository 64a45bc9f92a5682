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
