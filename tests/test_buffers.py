"""InterGpuTransfer on the virtual pair (validation on): copies, broadcast, gather, asyncio, threads, bad input."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import vulkan as vk

from vkmulti import DestroyedError, Gathered, InterGpuTransfer, MultiDeviceManager
from vkmulti import Buffer, Image
from vkmulti import CrossDeviceTransfer

from conftest import REAL_GPUS

SIZES = [1, 4097, 64 << 20]


def rand(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture(params=[None, False], ids=["import", "ring"])
def xfer(request, manager):
    t = InterGpuTransfer(manager, host_import=request.param)
    yield t
    t.destroy()


@pytest.fixture
def xfer1(manager):
    """Default host path only (for tests that do not depend on it)."""
    t = InterGpuTransfer(manager)
    yield t
    t.destroy()


@pytest.mark.parametrize("n", SIZES)
def test_host_upload_then_device_copy_then_gather(xfer, manager, n):
    data = rand(n, n)
    b1 = xfer.copy_buffer_blocking(0, 1, data, timeout=60)         # host bytes -> GPU 1
    assert isinstance(b1, Buffer) and b1.slot is manager.slot(1) and b1.size == n
    if n < (1 << 20):
        np.testing.assert_array_equal(b1.download(), data)           # independent readback
    xfer.set_device_buffer(1, b1)
    b0 = xfer.copy_buffer_blocking(1, 0, timeout=60)                 # registered buffer GPU 1 -> GPU 0
    assert b0.slot is manager.slot(0)
    xfer.set_device_buffer(0, b0)
    (from0,) = xfer.gather_blocking(1, timeout=60)                   # GPU 0 -> host
    (from1,) = xfer.gather_blocking(0, timeout=60)                   # GPU 1 -> host
    assert from0.dtype == np.uint8 and from0.shape == (n,)
    np.testing.assert_array_equal(from0, data)
    np.testing.assert_array_equal(from1, data)


def test_large_copy_checked_independently(xfer1, manager):
    data = rand(64 << 20, 7)
    with Buffer(manager.slot(1), data.nbytes) as src, Buffer(manager.slot(0), data.nbytes + 8) as dst:
        src.upload(data)
        assert xfer1.copy_buffer_blocking(1, 0, src, dst_buffer=dst, dst_offset=8, timeout=60) is dst
        np.testing.assert_array_equal(dst.download(data.nbytes, 8), data)


def test_same_device_copy_and_given_destination(xfer1, manager):
    data = rand(10_000, 3)
    with Buffer(manager.slot(0), 10_000) as a, Buffer(manager.slot(0), 20_000) as b:
        a.upload(data)
        xfer1.copy_buffer_blocking(0, 0, a, dst_buffer=b, dst_offset=5000)
        np.testing.assert_array_equal(b.download(10_000, 5000), data)
        xfer1.set_device_buffer(0, a, 100)
        with pytest.raises(ValueError, match="overlap"):
            xfer1.copy_buffer_blocking(0, 0, dst_buffer=a, dst_offset=10)
        xfer1.copy_buffer_blocking(0, 0, dst_buffer=a, dst_offset=100)
        np.testing.assert_array_equal(a.download(100, 100), data[:100])


def test_raw_handles(xfer1, manager):
    data = rand(5000, 4)
    with Buffer(manager.slot(1), 8192) as src, Buffer(manager.slot(0), 5000) as dst:
        src.upload(data)
        xfer1.set_device_buffer(1, src.handle, 5000)                 # cffi VkBuffer + size
        assert xfer1.registered(1) == (src.handle_int, 5000)
        assert xfer1.copy_buffer_blocking(1, 0, dst_buffer=dst.handle_int) == dst.handle_int
        np.testing.assert_array_equal(dst.download(), data)
        np.testing.assert_array_equal(xfer1.gather_blocking(0)[0], data)


@pytest.mark.parametrize("n", [4097, 40 << 20])
def test_broadcast_host_data_reaches_every_device(xfer, manager, n):
    data = rand(n, 11)
    assert xfer.transfer_method(0, 1) in ("cuda_peer", "dmabuf", "host_shared", "staging_copy")
    bufs = xfer.broadcast_blocking(data, timeout=60)
    assert [b.slot.index for b in bufs] == list(range(manager.device_count))
    for b in bufs:
        xfer.set_device_buffer(b.slot.index, b)
    got = xfer.gather_to_device_blocking(0, timeout=60)
    whole = got.buffer.download() if n < (1 << 20) else None
    for i, b in enumerate(bufs):
        if whole is not None:
            np.testing.assert_array_equal(whole[got.offsets[i]:got.offsets[i] + n], data)
        np.testing.assert_array_equal(b.download() if n < (1 << 20) else xfer.gather_blocking(1 - i)[0], data)


@pytest.mark.parametrize("prefer_dmabuf", [True, False])
def test_broadcast_routes(manager, prefer_dmabuf):
    """Fan-out device->device, or (pairs whose path goes through host memory) straight from the host."""
    data = rand(20 << 20, 14)
    with InterGpuTransfer(manager, prefer_dmabuf=prefer_dmabuf) as t:
        if not prefer_dmabuf:   # (cuda_peer, where CUDA serves the pair, goes device to device)
            assert t.transfer_method(0, 1) in ("cuda_peer", "host_shared", "staging_copy")
        for src in (0, 1):
            bufs = t.broadcast_blocking(data, src_device=src, timeout=60)
            for b in bufs:
                t.set_device_buffer(b.slot.index, b)
            np.testing.assert_array_equal(t.gather_blocking(0)[0], data)
            np.testing.assert_array_equal(t.gather_blocking(1)[0], data)


def test_broadcast_from_a_device_buffer_into_given_buffers(xfer1, manager):
    data = rand(300_000, 12)
    with Buffer(manager.slot(1), data.nbytes) as src, Buffer(manager.slot(0), data.nbytes) as d0:
        src.upload(data)
        out = xfer1.broadcast_blocking(src, dst_buffers=[d0, None])
        assert out == [d0, src]
        np.testing.assert_array_equal(d0.download(), data)
        xfer1.set_device_buffer(1, src)
        assert xfer1.broadcast_blocking(src_device=1)[1] is src     # the registered buffer
        with pytest.raises(ValueError, match="holds the source"):
            xfer1.broadcast_blocking(src, dst_buffers=[None, d0])
        with pytest.raises(ValueError, match="belongs to GPU 1, not src_device 0"):
            xfer1.broadcast_blocking(src, src_device=0)


def test_gather_empty_entries_and_out(xfer, manager):
    assert [a.size for a in xfer.gather_blocking(0)] == [0]          # nothing registered: one empty entry
    data = rand(4000, 5).view(np.float32)                             # 1000 floats
    with Buffer(manager.slot(1), 4000) as b:
        b.upload(data)
        xfer.set_device_buffer(1, b)
        out = np.zeros(1000, dtype=np.float32)
        res = xfer.gather_blocking(0, out=[out])
        assert res[0] is out
        np.testing.assert_array_equal(out, data)
        assert xfer.gather_blocking(1)[0].size == 0                  # GPU 0 has nothing registered
        xfer.set_device_buffer(1, None)
        assert xfer.registered(1) is None
        assert xfer.gather_blocking(0)[0].size == 0


def test_gather_order_with_three_devices():
    """Ascending order, dst skipped, empty entries in place (three virtual GPUs)."""
    if REAL_GPUS:
        pytest.skip("needs a third (virtual) device")
    from vkmulti.testing import virtual_gpus

    with virtual_gpus(3):
        mgr = MultiDeviceManager.create(enabled=True)
    try:
        assert mgr.device_count == 3
        d0, d2 = rand(777, 1), rand(1234, 2)
        with InterGpuTransfer(mgr) as t:
            b0, b2 = t.copy_buffer_blocking(0, 0, d0), t.copy_buffer_blocking(2, 2, d2)
            t.set_device_buffer(0, b0)
            t.set_device_buffer(2, b2)
            a, c = t.gather_blocking(1)
            np.testing.assert_array_equal(a, d0)
            np.testing.assert_array_equal(c, d2)
            empty, c2 = t.gather_blocking(0)
            assert empty.size == 0
            np.testing.assert_array_equal(c2, d2)
            g = t.gather_to_device_blocking(1)
            assert list(g.offsets) == [0, 2] and g.offsets[0] == 0 and g.offsets[2] % 256 == 0
            assert g.offsets[2] >= 777 and g.sizes == {0: 777, 2: 1234}
            whole = g.buffer.download()
            np.testing.assert_array_equal(whole[:777], d0)
            np.testing.assert_array_equal(whole[g.offsets[2]:g.offsets[2] + 1234], d2)
            bufs = t.broadcast_blocking(d2, src_device=2)
            assert [b.slot.index for b in bufs] == [0, 1, 2]
            for b in bufs:
                np.testing.assert_array_equal(b.download(), d2)
    finally:
        mgr.destroy()


def test_gather_to_device_includes_own_buffer(xfer1, manager):
    d0, d1 = rand(1000, 8), rand(3000, 9)
    b0, b1 = xfer1.copy_buffer_blocking(0, 0, d0), xfer1.copy_buffer_blocking(1, 1, d1)
    xfer1.set_device_buffer(0, b0)
    xfer1.set_device_buffer(1, b1, 2999)
    g = xfer1.gather_to_device_blocking(0)
    assert isinstance(g, Gathered) and g.buffer.slot is manager.slot(0)
    assert g.offsets == {0: 0, 1: 1024} and g.sizes == {0: 1000, 1: 2999}
    whole = g.buffer.download()
    np.testing.assert_array_equal(whole[:1000], d0)
    np.testing.assert_array_equal(whole[1024:1024 + 2999], d1[:2999])
    with Buffer(manager.slot(1), 1024 + 2999) as target:
        buf, offsets, sizes = xfer1.gather_to_device_blocking(1, dst_buffer=target)
        assert buf is target
        np.testing.assert_array_equal(target.download(1000, 0), d0)


def test_zero_copy_reuse_views(xfer, manager):
    data = rand(100_000, 21)
    b = xfer.copy_buffer_blocking(1, 1, data)
    xfer.set_device_buffer(1, b)
    (v,) = xfer.gather_blocking(0, reuse=True)
    assert not v.flags.writeable
    np.testing.assert_array_equal(v, data)
    xfer.copy_buffer_blocking(1, 1, data[::-1].copy(), dst_buffer=b)
    (v2,) = xfer.gather_blocking(0, reuse=True)
    np.testing.assert_array_equal(v2, data[::-1])
    np.testing.assert_array_equal(v, data[::-1])                      # same memory: documented lifetime
    xfer.destroy()
    assert int(v[:10].sum()) == int(data[::-1][:10].sum())            # memory outlives the object


def test_ready_point_is_waited(xfer1, manager):
    data = rand(2 << 20, 13)
    with Buffer(manager.slot(1), data.nbytes) as src, Buffer(manager.slot(0), data.nbytes) as dst:
        src.upload(data)
        with CrossDeviceTransfer(manager.slot(1), manager.slot(0), xfer1.transfer_method(1, 0)) as x:
            ticket = x.submit(src_buffer=src, dst_buffer=dst)
            ticket.wait_submitted(30)
            xfer1.set_device_buffer(0, dst, ready=ticket.dst_ready)
            np.testing.assert_array_equal(xfer1.gather_blocking(1, timeout=30)[0], data)
            ticket.wait(30)
        with pytest.raises(ValueError, match="GPU 0, not of GPU 1"):
            xfer1.set_device_buffer(1, src, ready=ticket.dst_ready)


def test_asyncio_and_blocking_forms_agree(xfer1, manager):
    data = rand(3 << 20, 31)
    ticks = []

    async def ticker(stop):
        while not stop.is_set():
            ticks.append(1)
            await asyncio.sleep(0.001)

    async def main():
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        b1 = await xfer1.copy_buffer(0, 1, data)
        xfer1.set_device_buffer(1, b1)
        b0 = await xfer1.copy_buffer(1, 0)
        xfer1.set_device_buffer(0, b0)
        g0, g1, bc, gd = await asyncio.gather(xfer1.gather(0), xfer1.gather(1), xfer1.broadcast(data),
                                              xfer1.gather_to_device(1))
        stop.set()
        await tick
        return g0, g1, bc, gd

    g0, g1, bc, gd = asyncio.run(main())
    assert ticks                                                       # the loop kept running
    np.testing.assert_array_equal(g0[0], xfer1.gather_blocking(0)[0])
    np.testing.assert_array_equal(g1[0], xfer1.gather_blocking(1)[0])
    np.testing.assert_array_equal(g0[0], data)
    assert gd.offsets == xfer1.gather_to_device_blocking(1).offsets
    for b in bc:
        xfer1.set_device_buffer(b.slot.index, b)
    np.testing.assert_array_equal(xfer1.gather_blocking(0)[0], data)


def test_asyncio_form_racing_destroy_raises_destroyed(manager, monkeypatch):
    """A destroy() (from another thread) that lands while an asyncio call is being handed to
    the object's executor ends the call with DestroyedError, not the shut-down executor's
    RuntimeError. The destroy() is run where the call asks for its event loop."""
    import types

    import vkmulti.transfer.inter_gpu as inter_gpu

    t = InterGpuTransfer(manager)
    armed = []

    def get_running_loop():
        if armed:
            armed.clear()
            t.destroy(timeout=30)
        return asyncio.get_running_loop()
    monkeypatch.setattr(inter_gpu, "asyncio", types.SimpleNamespace(get_running_loop=get_running_loop))

    async def main():
        await t.copy_buffer(0, 1, b"x" * 64)   # the executor exists from here on
        armed.append(1)
        with pytest.raises(DestroyedError):
            await t.copy_buffer(0, 1, b"y" * 64)
    asyncio.run(main())
    assert t.destroyed


def test_concurrent_operations_from_threads(xfer1, manager, run_threads):
    shared = rand(500_000, 40)
    xfer1.set_device_buffer(0, xfer1.copy_buffer_blocking(0, 0, shared))
    results = {}

    def worker(k):
        data = rand(200_000 + 4099 * k, 100 + k)
        b1 = xfer1.copy_buffer_blocking(0, 1, data, timeout=60)
        b0 = xfer1.copy_buffer_blocking(1, 0, b1, timeout=60)
        bc = xfer1.broadcast_blocking(data, timeout=60)
        for _ in range(3):
            np.testing.assert_array_equal(xfer1.gather_blocking(1, timeout=60)[0], shared)
            np.testing.assert_array_equal(xfer1.gather_blocking(1, reuse=True, timeout=60)[0], shared)
        results[k] = (data, b0, bc)

    errors = run_threads(worker)
    assert not errors, errors
    for data, b0, bc in results.values():
        np.testing.assert_array_equal(b0.download(), data)
        for b in bc:
            np.testing.assert_array_equal(b.download(), data)


def test_out_of_range_devices_are_the_seeds_invalid_buffer(xfer1, manager):
    """oxigdal returns GpuError::InvalidBuffer for a device index out of range (set_device_buffer,
    copy_buffer's source and destination, gather's dst_device): InvalidBufferError, still an
    IndexError. Before: a plain IndexError with no seed name."""
    from vkmulti.errors import InvalidBufferError
    t = xfer1
    n = manager.device_count
    for call in (lambda: t.set_device_buffer(n, None), lambda: t.copy_buffer_blocking(n, 0, b"abcd"),
                 lambda: t.copy_buffer_blocking(0, n, b"abcd"), lambda: t.gather_blocking(n),
                 lambda: asyncio.run(t.gather(n))):
        with pytest.raises(InvalidBufferError, match=f"{n} is out of range") as info:
            call()
        assert isinstance(info.value, IndexError)


def test_bad_input(xfer1, manager):
    t = xfer1
    with Buffer(manager.slot(0), 64) as b0, Buffer(manager.slot(1), 64) as b1:
        with pytest.raises(IndexError, match="device_idx 2 is out of range"):
            t.set_device_buffer(2, b0)
        with pytest.raises(IndexError, match="-1"):
            t.gather_blocking(-1)
        with pytest.raises(TypeError, match="int device index"):
            t.gather_blocking("0")
        with pytest.raises(TypeError, match="bool"):
            t.copy_buffer_blocking(True, 0, b"x")
        with pytest.raises(ValueError, match="belongs to GPU 0"):
            t.set_device_buffer(1, b0)
        with pytest.raises(ValueError, match="too small: size_bytes 65"):
            t.set_device_buffer(0, b0, 65)
        with pytest.raises(ValueError, match="size_bytes must be a positive int, got 0"):
            t.set_device_buffer(0, b0, 0)
        with pytest.raises(ValueError, match="size_bytes is required"):
            t.set_device_buffer(0, b0.handle_int)
        with pytest.raises(TypeError, match="VkBuffer handle expected"):
            t.set_device_buffer(0, "buffer", 4)
        with pytest.raises(ValueError, match="non-null"):
            t.set_device_buffer(0, 0, 4)
        with Buffer(manager.slot(0), 64, usage=vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT) as nosrc:
            with pytest.raises(ValueError, match="TRANSFER_SRC"):
                t.set_device_buffer(0, nosrc)
            with pytest.raises(ValueError, match="TRANSFER_SRC"):
                t.copy_buffer_blocking(0, 1, nosrc)
        with Buffer(manager.slot(0), 64, usage=vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT) as nodst:
            with pytest.raises(ValueError, match="TRANSFER_DST"):
                t.copy_buffer_blocking(1, 0, b1, dst_buffer=nodst)
        img = Image(manager.slot(0), 4, 4)
        try:
            with pytest.raises(TypeError, match="Image"):
                t.set_device_buffer(0, img)
        finally:
            img.destroy()
        with pytest.raises(ValueError, match="GPU 1 has no registered buffer"):
            t.copy_buffer_blocking(1, 0)
        with pytest.raises(ValueError, match="C-contiguous"):
            t.copy_buffer_blocking(0, 1, np.zeros((8, 8), np.uint8)[:, ::2])
        with pytest.raises(ValueError, match="empty"):
            t.copy_buffer_blocking(0, 1, b"")
        with pytest.raises(TypeError, match="buffer-protocol"):
            t.copy_buffer_blocking(0, 1, [1, 2, 3])
        with pytest.raises(ValueError, match=r"too small: \[0, 65\)"):
            t.copy_buffer_blocking(0, 1, bytes(65), dst_buffer=b1)
        with pytest.raises(ValueError, match="belongs to GPU 1 .*, not GPU 0"):
            t.copy_buffer_blocking(1, 0, bytes(8), dst_buffer=b1)
        with pytest.raises(ValueError, match="dst_offset must be a non-negative int, got -1"):
            t.copy_buffer_blocking(0, 1, bytes(8), dst_buffer=b1, dst_offset=-1)
        with pytest.raises(ValueError, match="dst_offset 3 needs a dst_buffer"):
            t.copy_buffer_blocking(0, 1, bytes(8), dst_offset=3)
        with pytest.raises(ValueError, match="timeout"):
            t.copy_buffer_blocking(0, 1, bytes(8), dst_buffer=b1, timeout=-1)
        with pytest.raises(ValueError, match="dst_buffers has 1 entries"):
            t.broadcast_blocking(b"abc", dst_buffers=[None])
        with pytest.raises(ValueError, match="no device has a registered buffer"):
            t.gather_to_device_blocking(0)
        t.set_device_buffer(1, b1)
        with pytest.raises(ValueError, match="out\\[0\\] holds 63 bytes"):
            t.gather_blocking(0, out=[np.empty(63, np.uint8)])
        with pytest.raises(ValueError, match="out has 2 entries"):
            t.gather_blocking(0, out=[None, None])
        with pytest.raises(ValueError, match="read-only"):
            t.gather_blocking(0, out=[bytes(64)])
        with pytest.raises(ValueError, match="not both"):
            t.gather_blocking(0, out=[None], reuse=True)
        with Buffer(manager.slot(0), 63) as small:
            with pytest.raises(ValueError, match=r"dst_buffer is too small: \[0, 64\)"):
                t.gather_to_device_blocking(0, dst_buffer=small)
        t.set_device_buffer(0, b0)
    with pytest.raises(DestroyedError, match="registered for GPU 1 was destroyed"):
        t.gather_blocking(0)
    with pytest.raises(DestroyedError, match="registered for GPU 0 was destroyed"):
        t.copy_buffer_blocking(0, 1)
    with pytest.raises(TypeError, match="MultiDeviceManager"):
        InterGpuTransfer(object())


def test_use_after_destroy_and_teardown(manager):
    t = InterGpuTransfer(manager)
    b = t.broadcast_blocking(b"hello")
    t.destroy()
    t.destroy()                                                        # idempotent
    assert t.destroyed and all(x.handle is None for x in b)            # its buffers are freed
    for call in (lambda: t.gather_blocking(0), lambda: t.copy_buffer_blocking(0, 1, b"x"),
                 lambda: t.broadcast_blocking(b"x"), lambda: t.gather_to_device_blocking(0),
                 lambda: t.set_device_buffer(0, None), lambda: asyncio.run(t.gather(0))):
        with pytest.raises(DestroyedError, match="after destroy"):
            call()
    t2 = InterGpuTransfer(manager)
    kept = t2.detach(t2.copy_buffer_blocking(0, 1, b"keep"))
    t2.copy_buffer_blocking(0, 1, b"x" * 10_000)
    t2.gather_blocking(0, reuse=True)
    with pytest.raises(ValueError, match="not created by this"):
        t2.detach(kept)
    assert kept.handle is not None
    kept.destroy()                                                     # detached: the caller's to free
    manager.destroy()                                                  # tears t2 down first: no leaks
    assert t2.destroyed


def test_timeout_leaves_object_usable_and_destroy_clean(xfer, manager):
    """A readback waiting on a timeline value nobody has signalled yet times out; once
    signalled, the next readback works and destroy() frees everything (validation clean)."""
    import vkmulti

    slot = manager.slot(1)
    data = rand(20 << 20, 50)                                         # > one ring slot
    b = xfer.copy_buffer_blocking(1, 1, data)
    sem = slot.native.create_timeline(0)
    try:
        xfer.set_device_buffer(1, b, ready=(sem, 1))
        with pytest.raises(vkmulti.TimeoutError):
            xfer.gather_blocking(0, timeout=0.2)
        vk.vkSignalSemaphore(slot.device, vk.VkSemaphoreSignalInfo(
            sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", sem), value=1))
        np.testing.assert_array_equal(xfer.gather_blocking(0, timeout=30)[0], data)
        xfer.destroy()
    finally:
        slot.native.wait_timeline(sem, 1, 30)
        vk.vkDestroySemaphore(slot.device, vk.ffi.cast("VkSemaphore", sem), None)


def test_failed_checks_make_no_buffers(xfer1, manager):
    with Buffer(manager.slot(0), 16) as b0:
        with pytest.raises(ValueError, match=r"dst_buffers\[1\] belongs to GPU 0"):
            xfer1.broadcast_blocking(bytes(16), dst_buffers=[None, b0])
        with pytest.raises(ValueError, match="too small"):
            xfer1.broadcast_blocking(bytes(17), dst_buffers=[b0, None])
    assert xfer1._routes.owned == []
