"""The machine's pipeline cache files (engine/pipeline_cache.py): a corrupt,
truncated, huge, FIFO or symlinked file, or one from another driver or device
(another pipelineCacheUUID), is ignored with one warning, never followed nor
read unbounded; saves are atomic; a runtime saves its devices' caches at
destroy() and the next one starts from them (validation layer on)."""
from __future__ import annotations

import logging
import os

import pytest

import kernel_support
from vkmulti.kernels.engine import pipeline_cache
from vkmulti.kernels.engine.pipeline_cache import HEADER, PipelineCacheFiles, check_header, identity_of

LOGGER = "vkmulti.kernels.engine.pipeline_cache"


@pytest.fixture
def ident(manager):
    return identity_of(manager.slot(0).physical_device)


def blob(ident, extra=b"", size=None, version=1):
    vendor, device, uuid = ident
    return HEADER.pack(HEADER.size if size is None else size, version, vendor, device, uuid) + extra


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_a_checked_file_loads_and_saves_atomically(tmp_path, ident):
    files = PipelineCacheFiles(str(tmp_path))
    data = blob(ident, b"\x01" * 100)
    assert files.load(ident) is None                 # no file yet
    assert files.save(ident, data)
    assert files.load(ident) == data
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(files.path(ident))]   # no temporary left
    assert not files.save(ident, b"junk" * 10)       # never writes what it would not read back


@pytest.mark.parametrize("case", ["corrupt", "truncated", "header_length", "version", "other_device"])
def test_bad_contents_are_ignored_with_one_warning(tmp_path, ident, caplog, case):
    files = PipelineCacheFiles(str(tmp_path))
    vendor, device, uuid = ident
    content = {"corrupt": os.urandom(200),
               "truncated": blob(ident)[:HEADER.size - 4],
               "header_length": blob(ident, size=4096),
               "version": blob(ident, version=2),
               "other_device": HEADER.pack(HEADER.size, 1, vendor, device, bytes(16 - len(b"x")) + b"x")
               if uuid != bytes(15) + b"x" else HEADER.pack(HEADER.size, 1, vendor, device, bytes(16))}[case]
    with open(files.path(ident), "wb") as f:
        f.write(content)
    caplog.set_level(logging.WARNING, LOGGER)
    assert files.load(ident) is None
    assert files.load(ident) is None
    assert len(warnings_of(caplog)) == 1 and files.ignored == 2


def test_another_pipeline_cache_uuid_is_not_used(ident):
    vendor, device, uuid = ident
    other = bytes((b + 1) & 0xFF for b in uuid)
    why = check_header(HEADER.pack(HEADER.size, 1, vendor, device, other), ident)
    assert why is not None and "another driver or device" in why
    assert check_header(HEADER.pack(HEADER.size, 1, vendor ^ 1, device, uuid), ident) is not None
    assert check_header(HEADER.pack(HEADER.size, 1, vendor, device ^ 1, uuid), ident) is not None
    assert check_header(blob(ident), ident) is None


def test_a_huge_file_is_not_read(tmp_path, ident, caplog, monkeypatch):
    files = PipelineCacheFiles(str(tmp_path))
    with open(files.path(ident), "wb") as f:
        f.write(blob(ident))
        f.truncate(pipeline_cache.MAX_BYTES + 1)   # sparse: costs no disk
    reads = []
    real_read = os.read
    monkeypatch.setattr(pipeline_cache.os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    caplog.set_level(logging.WARNING, LOGGER)
    assert files.load(ident) is None
    assert reads == [] and len(warnings_of(caplog)) == 1


def test_reads_are_bounded_even_past_the_size_fstat_gave(tmp_path, ident, monkeypatch):
    files = PipelineCacheFiles(str(tmp_path), limit=4096)
    with open(files.path(ident), "wb") as f:
        f.write(blob(ident, b"\x00" * 100))
    real_read = os.read
    asked = []

    def endless(fd, n):   # a file that keeps growing while it is read
        part = real_read(fd, n) or b"\x00" * n
        asked.append(len(part))
        return part
    monkeypatch.setattr(pipeline_cache.os, "read", endless)
    assert files.load(ident) is None
    assert sum(asked) <= 4096 + 1


def test_a_fifo_is_ignored_without_blocking(tmp_path, ident, caplog):
    files = PipelineCacheFiles(str(tmp_path))
    os.mkfifo(files.path(ident))
    caplog.set_level(logging.WARNING, LOGGER)
    assert files.load(ident) is None                 # (O_NONBLOCK: the open does not wait for a writer)
    assert len(warnings_of(caplog)) == 1 and "not a regular file" in warnings_of(caplog)[0].getMessage()


def test_a_symlink_is_never_followed(tmp_path, ident, caplog):
    files = PipelineCacheFiles(str(tmp_path / "cache"))
    os.makedirs(tmp_path / "cache")
    target = tmp_path / "elsewhere.bin"
    good = blob(ident, b"\x02" * 64)
    target.write_bytes(good)
    os.symlink(target, files.path(ident))
    caplog.set_level(logging.WARNING, LOGGER)
    assert files.load(ident) is None                 # a valid cache, but behind a link: not read
    assert len(warnings_of(caplog)) == 1 and "symbolic link" in warnings_of(caplog)[0].getMessage()
    newer = blob(ident, b"\x03" * 64)
    assert files.save(ident, newer)                  # the link is replaced, its target untouched
    assert target.read_bytes() == good and not os.path.islink(files.path(ident))
    assert files.load(ident) == newer


def test_a_runtime_saves_its_caches_and_the_next_starts_from_them(manager, tmp_path, monkeypatch, caplog):
    from vkmulti.kernels import KernelRuntime

    monkeypatch.setenv("VKMULTI_CACHE_DIR", str(tmp_path))
    rt = KernelRuntime(kernel_support.make_coordinator(manager), manager)
    try:
        kernel_support.counter(rt, "k", device=0)
        rt.prebuild.wait_idle(60)
        ident = rt.kernel("k").ctx.cache_identity
    finally:
        rt.destroy()
    path = pipeline_cache.FILES.path(ident)
    saved = open(path, "rb").read()
    assert check_header(saved, ident) is None
    rt = KernelRuntime(kernel_support.make_coordinator(manager), manager)
    try:
        k = kernel_support.counter(rt, "k", device=0)
        assert k.ctx.cache_blob == saved             # the driver was given the checked blob
        rt.step()
        rt.synchronize()
    finally:
        rt.destroy()
    with open(path, "wb") as f:                      # a corrupt file: ignored, the runtime works
        f.write(b"\xff" * 64)
    caplog.set_level(logging.WARNING, LOGGER)
    rt = KernelRuntime(kernel_support.make_coordinator(manager), manager)
    try:
        k = kernel_support.counter(rt, "k", device=0)
        assert k.ctx.cache_blob is None
        rt.step()
        rt.synchronize()
    finally:
        rt.destroy()
    assert warnings_of(caplog)
    assert check_header(open(path, "rb").read(), ident) is None   # and replaced by a good one at destroy()


def test_the_switch_turns_it_off(tmp_path, ident, monkeypatch):
    files = PipelineCacheFiles(str(tmp_path))
    monkeypatch.setenv(pipeline_cache.ENV, "0")
    assert not files.save(ident, blob(ident))
    assert files.load(ident) is None and os.listdir(tmp_path) == []
