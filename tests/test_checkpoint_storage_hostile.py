"""Hostile files and names for the checkpoint parser and FileStorage (issue 23, D-H).

Cases that could hang or exhaust memory before their fix (a FIFO, a link to
/dev/zero) run in a child process with a time limit and an address-space cap.
"""
from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
import zlib

import pytest

from vkmulti.errors import CheckpointNotFoundError, CheckpointStorageError, InvalidCheckpointError
from vkmulti.kernels.checkpoint import (CHECKPOINT_MAGIC, Checkpoint, CheckpointBuilder, FileStorage, HEADER_SIZE,
                                        MAX_CHECKPOINT_SIZE)
from vkmulti import CheckpointMetadata
from vkmulti.kernels.checkpoint.header import MAX_CHUNKS, MAX_CUSTOM_ENTRIES


def forge_empty_chunks(count: int, declared: int | None = None) -> bytes:
    """A CRC-valid file of `count` empty chunks (header claiming `declared`), written by
    hand: to_bytes() refuses more than MAX_CHUNKS."""
    meta = CheckpointMetadata("k", "t").to_bytes()
    head = struct.pack("<IIQQQ", 8, 0, 0, 0, 0)
    crc = zlib.crc32(head)
    body = struct.pack("<I", len(meta)) + meta + head * count + struct.pack("<I", crc) * count
    total = HEADER_SIZE + len(body)
    fixed = struct.pack("<QIIQIIIIQ", CHECKPOINT_MAGIC, 1, HEADER_SIZE, total,
                        count if declared is None else declared, 0, zlib.crc32(body), 3, 0)
    return fixed + struct.pack("<I12x", zlib.crc32(fixed)) + body


# ---- D: memory amplification ------------------------------------------------------


def test_many_empty_chunks_are_refused_up_front():
    """Before: 200,000 empty chunks (7.2 MB) parsed, ~36 MiB of objects and 1.4 s here
    (the issue: +139 MiB, 7.5 s). Now refused from the header's count."""
    raw = forge_empty_chunks(200_000)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidCheckpointError, match="claims 200000 chunks"):
            Checkpoint.from_bytes(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_count_the_file_cannot_hold_is_refused():
    raw = forge_empty_chunks(10, declared=4000)   # CRC-valid header, 4,000 chunks claimed in 10 chunks' bytes
    with pytest.raises(InvalidCheckpointError, match="claims 4000 chunks"):
        Checkpoint.from_bytes(raw)


def test_parsing_memory_is_bounded_by_the_file():
    """The most chunks allowed parse, with memory within a constant of the file's size."""
    raw = forge_empty_chunks(MAX_CHUNKS)
    tracemalloc.start()
    try:
        cp = Checkpoint.from_bytes(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(cp.chunks) == MAX_CHUNKS
    assert peak < 2 * len(raw) + (8 << 20)
    with pytest.raises(InvalidCheckpointError, match="at most"):
        Checkpoint(cp.metadata, cp.chunks * 2).to_bytes()   # never written past what is read


def test_too_many_custom_entries_are_refused():
    meta = CheckpointMetadata("k", "t", custom={f"k{i}": "" for i in range(MAX_CUSTOM_ENTRIES + 1)})
    with pytest.raises(InvalidCheckpointError, match="custom"):
        Checkpoint(meta).to_bytes()
    raw = bytearray(CheckpointMetadata("k", "t").to_bytes())
    struct.pack_into("<I", raw, len(raw) - 4, 1 << 30)   # a count of 2**30 entries in 0 bytes
    with pytest.raises(InvalidCheckpointError, match="custom entries"):
        CheckpointMetadata.from_bytes(bytes(raw))


# ---- E-H: FileStorage --------------------------------------------------------------


def _cp(step=1):
    return CheckpointBuilder("k", "t").step(step).device_memory("s", b"x" * 64).build()


def test_a_sparse_oversized_file_is_refused_before_reading(tmp_path):
    """E. Before: a sparse 3 GiB file was read whole (MemoryError). Now its size is checked first."""
    fs = FileStorage(tmp_path)
    with open(tmp_path / "big.rkcp", "wb") as f:
        f.truncate(3 << 30)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidCheckpointError, match="too large"):
            fs.load("big")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    with open(tmp_path / "edge.rkcp", "wb") as f:
        f.truncate(MAX_CHECKPOINT_SIZE + 1)
    with pytest.raises(InvalidCheckpointError, match="too large"):
        fs.load("edge")


CHILD = textwrap.dedent("""
    import os, resource, sys
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):   # ASan reserves terabytes of address space
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    from vkmulti.errors import CheckpointStorageError
    from vkmulti.kernels.checkpoint import FileStorage
    fs = FileStorage(sys.argv[1])
    print("LIST", fs.list(), "EXISTS", fs.exists("k"), flush=True)
    try:
        fs.load("k")
        print("LOADED")
    except CheckpointStorageError as exc:
        print("REFUSED", exc)
""")


def _child(folder):
    return subprocess.run([sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, timeout=60)


def test_a_link_to_dev_zero_is_not_followed(tmp_path):
    """E/G. Before: load() read /dev/zero until MemoryError. Now the link is refused."""
    os.symlink("/dev/zero", tmp_path / "k.rkcp")
    p = _child(tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "REFUSED" in p.stdout and "symbolic link" in p.stdout and "LIST [] EXISTS False" in p.stdout


def test_a_fifo_does_not_block_load(tmp_path):
    """F. Before: load('k') of a FIFO blocked forever (the child timed out). Now refused at once."""
    os.mkfifo(tmp_path / "k.rkcp")
    p = _child(tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "REFUSED" in p.stdout and "not a regular file" in p.stdout
    assert "LIST [] EXISTS False" in p.stdout   # list() and exists() agree with load(): not a checkpoint


def test_a_symlink_to_a_checkpoint_outside_is_not_followed(tmp_path):
    """G. Before: a link in the folder loaded a checkpoint from outside it."""
    outside = tmp_path / "outside"
    FileStorage(outside).save(_cp(7), "real")
    folder = tmp_path / "cps"
    fs = FileStorage(folder)
    fs.save(_cp(1), "mine")
    os.symlink(outside / "real.rkcp", folder / "k.rkcp")
    with pytest.raises(CheckpointStorageError, match="symbolic link"):
        fs.load("k")
    assert fs.list() == ["mine"] and not fs.exists("k")
    os.mkdir(folder / "d.rkcp")
    with pytest.raises(CheckpointStorageError, match="not a regular file"):
        fs.load("d")
    assert fs.load("mine").metadata.current_step == 1   # the storage stays usable
    fs.save(_cp(2), "k")   # a save replaces the link itself, never writes through it
    assert not os.path.islink(folder / "k.rkcp") and fs.load("k").metadata.current_step == 2
    assert FileStorage(outside).load("real").metadata.current_step == 7


@pytest.mark.parametrize("name", ["é" * 200, "語" * 100, "a" * 200])
def test_long_utf8_names_get_an_answer(tmp_path, name):
    """H. Before: exists() of 200 two-byte characters raised OSError (ENAMETOOLONG)."""
    fs = FileStorage(tmp_path)
    too_long = len((name + ".rkcp").encode()) > 255
    if too_long:
        assert fs.exists(name) is False
        with pytest.raises(ValueError, match="255 bytes"):
            fs.save(_cp(), name)
        with pytest.raises(ValueError, match="255 bytes"):
            fs.load(name)
        with pytest.raises(ValueError, match="255 bytes"):
            fs.delete(name)
    else:
        assert fs.exists(name) is False
        fs.save(_cp(3), name)
        assert fs.exists(name) and fs.load(name).metadata.current_step == 3 and fs.list() == [name]
    with pytest.raises(CheckpointNotFoundError):
        fs.load("absent")


def test_stale_temporary_files_are_cleaned_but_not_a_saving_ones(tmp_path):
    """A killed save's temporary file goes at the next save once stale; a fresh one, or
    one whose lock a save holds, stays (before: never cleaned, 56 MiB after 12 kills)."""
    fs = FileStorage(tmp_path)
    fs.save(_cp(), "a")
    old = time.time() - 3600
    stale, fresh, busy = (tmp_path / f".rkcp-{n}.tmp" for n in ("stale", "fresh", "busy"))
    for p in (stale, fresh, busy):
        p.write_bytes(b"half a checkpoint")
    os.utime(stale, (old, old))
    os.utime(busy, (old, old))
    os.symlink("/etc/hostname", tmp_path / ".rkcp-link.tmp")
    other = tmp_path / ".unrelated.tmp"
    other.write_bytes(b"x")
    os.utime(other, (old, old))
    with open(busy, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)   # as a save in progress holds it
        fs.save(_cp(2), "b")
    left = sorted(os.listdir(tmp_path))
    assert left == [".rkcp-busy.tmp", ".rkcp-fresh.tmp", ".rkcp-link.tmp", ".unrelated.tmp", "a.rkcp", "b.rkcp"]
    fs.save(_cp(3), "c")   # the lock released: now stale
    assert ".rkcp-busy.tmp" not in os.listdir(tmp_path) and os.path.exists("/etc/hostname")
    assert fs.list() == ["a", "b", "c"]


def test_a_file_that_changes_size_while_read_is_refused(tmp_path, monkeypatch):
    fs = FileStorage(tmp_path)
    fs.save(_cp(), "k")
    real = os.fstat

    def shrunk(fd):
        st = real(fd)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid,
                               st.st_size + 10, st.st_atime, st.st_mtime, st.st_ctime))
    monkeypatch.setattr(os, "fstat", shrunk)
    with pytest.raises(CheckpointStorageError, match="shrank"):
        fs.load("k")
