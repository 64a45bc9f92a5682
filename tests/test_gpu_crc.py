"""The CRC32 engines of live migration (vkmulti.kernels.lifecycle.gpu_crc (its CRC algebra too),
host_crc) against zlib.crc32: the GPU shader and the host engine on the
virtual lavapipe pair, for sizes around the shader's lane, block and word
boundaries (0 bytes and non-multiples of 4 included), offsets, several
ranges in one job, and the GF(2) combine the engines rely on."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kernel_support import runtime_fixture
from vkmulti.errors import UnsupportedError
from vkmulti import Buffer
from vkmulti._core import vkapi
from vkmulti.kernels.lifecycle import crc32_combine, crc32_finish, raw_crc, shift, zero_tables
from vkmulti.kernels.lifecycle import LANES, GpuCrc
from vkmulti.kernels.lifecycle import host_crc
from vkmulti.kernels.lifecycle import HostCrc

# around word (4), lane (64 words) and block (64 * lane_words words) boundaries
SIZES = sorted({0, 1, 2, 3, 4, 5, 7, 8, 63, 255, 256, 257, 1021, 1024, 1027,
                4 * LANES * 16 - 4, 4 * LANES * 16, 4 * LANES * 16 + 3,
                4 * LANES * 256 - 1, 4 * LANES * 256, 4 * LANES * 256 + 4, 3 * 4 * LANES * 256 + 6,
                4 * LANES * 1024 - 2, 4 * LANES * 1024, 4 * LANES * 1024 + 1028,
                100_003, (1 << 20) + 1, 3 * (1 << 20) - 2})


runtime = runtime_fixture(max_kernels=8)


def _buffer(rt, device, data: bytes, pad: int = 0) -> Buffer:
    size = max(4, (len(data) + pad + 3) & ~3)
    buf = Buffer(rt.manager.slot(device), size)
    raw = np.zeros(size, np.uint8)
    raw[pad:pad + len(data)] = np.frombuffer(data, np.uint8)
    buf.upload(raw)
    return buf


def _engines(rt, device):
    """[shader engine, host engine] of `device`; the host engine only on a CPU device
    (on a real GPU it is refused: see the last test)."""
    old = rt.migration_crc
    try:
        rt.migration_crc = "shader"
        out = [rt._lifecycle.crc(device)]
        if HostCrc.suits(rt.manager.slot(device)):
            rt.migration_crc = "host"
            out.append(rt._lifecycle.crc(device))
    finally:
        rt.migration_crc = old
    assert isinstance(out[0], GpuCrc) and all(isinstance(e, HostCrc) for e in out[1:])
    return out


def _host_engine(rt, device):
    engines = _engines(rt, device)
    if len(engines) < 2:
        pytest.skip("the host CRC32 engine is for CPU devices")
    return engines[1]


def test_tables_and_combine_match_zlib():
    rng = np.random.default_rng(1)
    t = zero_tables()
    assert t.shape == (32, 4, 256) and t[0, 0, 1] == 0x77073096   # zlib's byte table
    for n in (0, 1, 3, 4, 17, 1000, 65536, 1 << 20):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        if n <= 1000:   # (raw_crc is bytewise Python)
            assert crc32_finish(raw_crc(data), n) == zlib.crc32(data)
        for cut in (0, n // 3, n):
            a, b = data[:cut], data[cut:]
            assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(data)
    # shift(x, a + b) = shift(shift(x, a), b): the tables compose
    assert shift(shift(0x12345678, 1000), 24) == shift(0x12345678, 1024)
    with pytest.raises(ValueError):
        shift(1, -1)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_combine_property(a, b):
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    assert crc32_finish(raw_crc(a), len(a)) == zlib.crc32(a)


@pytest.mark.parametrize("device", [0, 1])
def test_both_engines_match_zlib_for_many_sizes(runtime, device):
    rng = np.random.default_rng(device)
    engines = _engines(runtime, device)
    datas = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in SIZES]
    bufs = [_buffer(runtime, device, d) for d in datas]
    try:
        want = [zlib.crc32(d) for d in datas]
        shader = engines[0]
        for layout in [(False, 16), (True, 16), (False, 256), (True, 1024)]:   # both layouts, several block sizes
            shader.contiguous, shader.lane_words = layout
            assert shader.run([(b, 0, len(d)) for b, d in zip(bufs, datas)]) == want, layout
        for eng in engines:
            assert eng.run([(b, 0, len(d)) for b, d in zip(bufs, datas)]) == want, eng.kind
            for b, d, w in zip(bufs[::5], datas[::5], want[::5]):   # one range a job as well
                assert eng.run([(b, 0, len(d))]) == [w], (eng.kind, len(d))
    finally:
        for b in bufs:
            b.destroy()


@pytest.mark.parametrize("impl", ["default", "zlib"])
def test_host_engine_pieces_on_threads(runtime, monkeypatch, impl):
    """The host engine splits a range into pieces hashed on threads and combined:
    small pieces here, so every size below is several of them; with the
    crc32 in use (zlib-ng when installed) and with plain zlib."""
    monkeypatch.setattr(host_crc, "PIECE_BYTES", 4096)
    if impl == "zlib":
        monkeypatch.setattr(host_crc, "crc32", zlib.crc32)
    monkeypatch.setattr(host_crc, "_threads", lambda: 3)
    rng = np.random.default_rng(3)
    datas = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (8191, 8192, 12289, 40_000, 1 << 20)]
    bufs = [_buffer(runtime, 1, d) for d in datas]
    try:
        host = _host_engine(runtime, 1)
        assert host.run([(b, 0, len(d)) for b, d in zip(bufs, datas)]) == [zlib.crc32(d) for d in datas]
    finally:
        for b in bufs:
            b.destroy()


def test_offsets_and_repeated_ranges(runtime):
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    buf = _buffer(runtime, 0, data, pad=64)
    try:
        for eng in _engines(runtime, 0):
            ranges = [(buf, 64, len(data)), (buf, 68, 1001), (buf, 4096, 0), (buf, 64, len(data))]
            want = [zlib.crc32(data), zlib.crc32(data[4:1005]), 0, zlib.crc32(data)]
            assert eng.run(ranges) == want
            # a changed word changes the CRC (the check can fail)
            buf.upload(np.array([0xFF ^ data[100]], np.uint8), offset=64 + 100)
            assert eng.run([(buf, 64, len(data))]) != [zlib.crc32(data)]
            buf.upload(np.frombuffer(data[100:101], np.uint8), offset=64 + 100)
    finally:
        buf.destroy()


def test_bad_ranges_are_refused(runtime):
    buf = Buffer(runtime.manager.slot(0), 64)
    buf.upload(bytes(64))
    try:
        for eng in _engines(runtime, 0):
            for bad in [(buf, 2, 8), (buf, 0, 65), (buf, -4, 4), (buf, 60, 8)]:
                with pytest.raises(ValueError):
                    eng.run([bad])
            with pytest.raises(TypeError):
                eng.run([(buf, 0, 1.5)])
            with pytest.raises(TypeError):
                eng.run([(buf, 0)])
            assert eng.run([(buf, 0, 64)]) == [zlib.crc32(bytes(64))]   # still usable
        # the shader reads whole words: a size whose last word leaves the buffer is refused there
        with pytest.raises(ValueError, match="whole last word"):
            _engines(runtime, 0)[0].run([(buf, 60, 5)])
    finally:
        buf.destroy()
    for bad in ("fast", None, 1):
        with pytest.raises(ValueError, match="migration_crc"):
            runtime.migration_crc = bad
    assert runtime.migration_crc == "auto"


def test_auto_picks_the_host_engine_on_a_cpu_device_only(runtime):
    eng = runtime._lifecycle.crc(0)
    slot = runtime.manager.slot(0)
    if slot.capabilities.device_type == "cpu":
        assert isinstance(eng, HostCrc) and HostCrc.suits(slot)
    else:
        assert isinstance(eng, GpuCrc)
        with pytest.raises(UnsupportedError):
            HostCrc(runtime._context(0))


def test_a_host_job_waits_for_its_points_and_can_be_closed(runtime):
    """A host job hashes only once its timeline points are reached; one closed
    while it still waits stops at once (result() says it was cancelled)."""
    import time

    import vulkan as vk

    from vkmulti.kernels.lifecycle.host_crc import Cancelled
    from vkmulti import TimelinePoint

    host = _host_engine(runtime, 0)
    slot = runtime.manager.slot(0)
    data = bytes(range(256)) * 64
    buf = _buffer(runtime, 0, data)
    sem = slot.native.create_timeline(0)
    try:
        job = host.submit([(buf, 0, len(data))], [TimelinePoint(sem, 1, 0)])
        time.sleep(0.1)
        assert not job._future.done()           # still waiting for the point
        vk.vkSignalSemaphore(slot.device, vk.VkSemaphoreSignalInfo(   # the host reaches the point
            sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", sem), value=1))
        assert job.result(10) == [zlib.crc32(data)]
        never = host.submit([(buf, 0, len(data))], [TimelinePoint(sem, 5, 0)])
        t0 = time.monotonic()
        never.close(30)
        assert time.monotonic() - t0 < 30 / 3     # cancelled, not waited out: well inside close's timeout
        with pytest.raises(Cancelled):
            never.result(1)
        with pytest.raises(ValueError):
            host.submit([(buf, 0, 4)], [TimelinePoint(sem, 1, 1)])   # a point of another device
    finally:
        vk.vkDestroySemaphore(slot.device, vk.ffi.cast("VkSemaphore", sem), None)
        buf.destroy()


def test_a_shader_engine_s_first_jobs_allocate_nothing(runtime, monkeypatch):
    """The results buffers and command buffers of a move's first jobs on a device (two
    in flight at once) are made with the engine, not on the move's path."""
    from vkmulti.kernels.lifecycle import gpu_crc

    old = runtime.migration_crc
    runtime.migration_crc = "shader"
    try:
        eng = runtime._lifecycle.crc(0)
    finally:
        runtime.migration_crc = old
    data = bytes(range(256)) * 64
    bufs = [_buffer(runtime, 0, data), _buffer(runtime, 0, data[::-1])]
    made = []
    real = gpu_crc.MappedBuffer
    monkeypatch.setattr(gpu_crc, "MappedBuffer", lambda *a, **kw: (made.append(a), real(*a, **kw))[1])
    allocs = []
    real_alloc = vkapi.vkAllocateCommandBuffers
    monkeypatch.setattr(vkapi, "vkAllocateCommandBuffers", lambda *a: (allocs.append(a), real_alloc(*a))[1])
    try:
        jobs = [eng.submit([(b, 0, len(data))]) for b in bufs]   # both in flight
        assert [j.result(60) for j in jobs] == [[zlib.crc32(data)], [zlib.crc32(data[::-1])]]
    finally:
        for b in bufs:
            b.destroy()
    assert made == [] and allocs == []


def test_a_shader_engine_that_hashes_wrong_is_refused(runtime, monkeypatch):
    """A new engine hashes its own tables once and compares with zlib: a device whose
    shader hashes wrong (both sides of a move would agree) is refused by name."""
    from vkmulti.errors import VkmError
    from vkmulti.kernels.lifecycle import gpu_crc

    monkeypatch.setattr(gpu_crc, "crc32_finish", lambda raw, n: 0x1234)   # every GPU result off
    runtime.migration_crc = "shader"
    with pytest.raises(VkmError, match="GPU 0 hashed its own tables to 0x00001234, 0x00001234"):
        runtime._lifecycle.crc(0)
    monkeypatch.undo()
    eng = runtime._lifecycle.crc(0)   # nothing kept of the refused one: made anew, checked, used
    data = bytes(range(200))
    buf = _buffer(runtime, 0, data)
    try:
        assert eng.run([(buf, 0, len(data))]) == [zlib.crc32(data)]
    finally:
        buf.destroy()
