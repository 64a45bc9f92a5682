"""Cross-device transfers on the virtual pair (and, marked gpu, on two real GPUs)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest
import vulkan as vk

import vkmulti
from vkmulti import DestroyedError, TransferMethod, UnsupportedError
from vkmulti.device.capabilities import EXT_MEMORY_HOST
from vkmulti import Buffer, Image
from vkmulti.transfer import CrossDeviceTransfer, TimelinePoint, select_transfer_method

NATIVE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "native")


METHODS = [TransferMethod.STAGING_COPY, TransferMethod.HOST_SHARED, TransferMethod.DMABUF]
F = vk.VK_FORMAT_R16G16B16A16_SFLOAT


class Assignment:
    def __init__(self, device_index):
        self.device_index = device_index


def available(manager, method, src=1, dst=0):
    from vkmulti.transfer import method_support
    a, b = manager.slot(src), manager.slot(dst)
    return method_support(method, a.capabilities, b.capabilities, a.enabled_extensions, b.enabled_extensions) is None


def roundtrip_image(manager, method, w, h, fmt=F, src=1, dst=0, exclusive=False, **kw):
    if not available(manager, method, src, dst):
        pytest.skip(f"{method} is not available between these devices")
    rng = np.random.default_rng(w * 7919 + h)
    a = Image(manager.slot(src), w, h, fmt, exclusive=exclusive)
    b = Image(manager.slot(dst), w, h, fmt, exclusive=exclusive)
    try:
        px = rng.integers(0, 256, (h, w, a.bytes_per_pixel), dtype=np.uint8)
        a.upload(px)
        with CrossDeviceTransfer(manager.slot(src), manager.slot(dst), method, **kw) as x:
            x.run(src_image=a, dst_image=b, timeout=30)
            assert x.src_done.value > 0 and x.dst_ready.value > 0
        np.testing.assert_array_equal(b.download(), px)
        np.testing.assert_array_equal(a.download(), px)   # the source is left intact
    finally:
        a.destroy()
        b.destroy()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("w, h", [(1, 1), (1023, 7), (97, 131)])
def test_image_roundtrip_odd_sizes(manager, method, w, h):
    # 16 KiB slots: 97x131 RGBA16F spans many chunks, and is no multiple of one
    roundtrip_image(manager, method, w, h, slot_size=16 << 10, slot_count=3)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("fmt", [vk.VK_FORMAT_R8_UNORM, vk.VK_FORMAT_B8G8R8A8_UNORM, vk.VK_FORMAT_R32G32B32A32_SFLOAT,
                                 vk.VK_FORMAT_R16G16_SFLOAT])
def test_image_roundtrip_formats(manager, method, fmt):
    roundtrip_image(manager, method, 61, 33, fmt, slot_size=8 << 10, slot_count=2)


@pytest.mark.parametrize("method", METHODS)
def test_image_roundtrip_other_direction(manager, method):
    roundtrip_image(manager, method, 320, 200, src=0, dst=1)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n, src_off, dst_off", [(1, 0, 0), (4097, 3, 5), ((64 << 20), 256, 0)])
def test_buffer_roundtrip(manager, method, n, src_off, dst_off):
    if not available(manager, method):
        pytest.skip(f"{method} is not available between these devices")
    rng = np.random.default_rng(n)
    data = rng.integers(0, 256, n + src_off, dtype=np.uint8)
    with Buffer(manager.slot(1), n + src_off) as s, Buffer(manager.slot(0), n + dst_off + 7) as d:
        s.upload(data)
        with CrossDeviceTransfer(manager.slot(1), manager.slot(0), method) as x:
            x.submit(src_buffer=s, dst_buffer=d, src_offset=src_off, dst_offset=dst_off, size=n).wait(60)
        np.testing.assert_array_equal(d.download(n, dst_off), data[src_off:])


def test_many_in_flight_from_threads(manager, run_threads):
    """Four threads, three methods, shared links: every byte lands where it should."""
    rng = np.random.default_rng(5)
    jobs = []
    for i in range(12):
        size = int(rng.integers(1, 300_000))
        data = rng.integers(0, 256, size, dtype=np.uint8)
        s, d = Buffer(manager.slot(1), size), Buffer(manager.slot(0), size)
        s.upload(data)
        jobs.append((METHODS[i % 3], s, d, data))
    methods = [m for m in METHODS if available(manager, m)]
    jobs = [(methods[i % len(methods)], s, d, data) for i, (_, s, d, data) in enumerate(jobs)]
    transfers = {m: CrossDeviceTransfer(manager.slot(1), manager.slot(0), m, slot_size=64 << 10, slot_count=4)
                 for m in methods}
    def worker(k):
        tickets = [transfers[m].submit(src_buffer=s, dst_buffer=d) for m, s, d, _ in jobs[k::4]]
        for t in tickets:
            t.wait(60)
    errors = run_threads(worker)
    assert not errors
    for m, s, d, data in jobs:
        np.testing.assert_array_equal(d.download(), data)
        s.destroy()
        d.destroy()
    for x in transfers.values():
        x.destroy()


def test_tickets_and_points_are_the_jobs_own_under_contention(manager, run_threads):
    """Tiny jobs from four threads, each waited at once: the worker may finish and
    free a job before its submitter returns, and the ticket and timeline points
    handed back must still be that job's (they once were read from freed memory)."""
    for m in [m for m in METHODS if available(manager, m)]:
        s, d = Buffer(manager.slot(1), 256), Buffer(manager.slot(0), 256)
        x = CrossDeviceTransfer(manager.slot(1), manager.slot(0), m)
        got: list[tuple[int, int, int]] = []
        lock = threading.Lock()

        def worker(k):
            for _ in range(60):
                t = x.submit(src_buffer=s, dst_buffer=d)
                t.wait(30)
                with lock:
                    got.append((t.ticket, t.src_done.value, t.dst_ready.value))
        try:
            assert not run_threads(worker)
            got.sort()
            tickets = [g[0] for g in got]
            assert tickets == list(range(tickets[0], tickets[0] + len(got))), m
            for key in (1, 2):   # each job reserves its values above the previous job's
                values = [g[key] for g in got]
                assert values == sorted(values) and len(set(values)) == len(values), m
        finally:
            x.destroy()
            s.destroy()
            d.destroy()


def _blocked_source(manager):
    """A source buffer gated by a host-signalled timeline semaphore on GPU 1."""
    slot = manager.slot(1)
    sem = slot.native.create_timeline(0)
    data = np.arange(100_000, dtype=np.uint8)
    s, d = Buffer(slot, data.nbytes), Buffer(manager.slot(0), data.nbytes)
    s.upload(data)

    def release():
        vk.vkSignalSemaphore(slot.device, vk.VkSemaphoreSignalInfo(
            sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", sem), value=1))

    def cleanup():
        s.destroy()
        d.destroy()
        vk.vkDestroySemaphore(slot.device, vk.ffi.cast("VkSemaphore", sem), None)
    return sem, data, s, d, release, cleanup


@pytest.mark.parametrize("method", METHODS)
def test_wait_timeout_leaves_transfer_usable(manager, method):
    if not available(manager, method):
        pytest.skip(f"{method} is not available between these devices")
    sem, data, s, d, release, cleanup = _blocked_source(manager)
    x = CrossDeviceTransfer(manager.slot(1), manager.slot(0), method)
    try:
        t = x.submit(src_buffer=s, dst_buffer=d, src_wait=(sem, 1))
        with pytest.raises(vkmulti.TimeoutError):
            t.wait(timeout=0.1)
        assert not t.done()
        release()
        t.wait(timeout=30)
        assert t.done()
        np.testing.assert_array_equal(d.download(), data)
        x.submit(src_buffer=s, dst_buffer=d).wait(30)   # still usable
    finally:
        x.destroy()
        cleanup()


@pytest.mark.allow_validation_errors   # the stuck link's objects are leaked on purpose, so the device reports them
def test_stalled_link_fails_its_jobs_and_destroys_in_bounded_time(manager):
    """A job whose copy is queued behind work that never completes (its own wait
    points all reached): once the stall timeout passes, its waiters and later
    submits get TransferError (not an endless "not yet"), and destroy() returns
    within about that timeout, leaving the GPU objects alive. (A source wait that
    has not come is a slow source, not a stall: test_link_stall.py.)"""
    from vkmulti._core import _native
    from vkmulti.transfer.cross_device import _Endpoint
    from gates import Gate, settle

    sem, data, s, d, release, cleanup = _blocked_source(manager)
    src, dst = manager.slot(1), manager.slot(0)
    link = _native.Link(src.native, src.copy_queue.lock, dst.native, dst.copy_queue.lock, _native.RING_STAGING,
                        1 << 20, 4, 0, stall_timeout=0.5)
    es, ed = _Endpoint(buffer=s.handle_int), _Endpoint(buffer=d.handle_int)
    ahead = Gate(src)
    ahead.hold(src.copy_queue)
    try:
        ticket, _, dready = link.submit(es, ed, data.nbytes)
        with pytest.raises(vkmulti.errors.LinkStalledError, match="stalled: vkWaitSemaphores") as info:
            link.wait(ticket, dready, 20)
        assert isinstance(info.value, vkmulti.TransferError) and "within 0.5 s" in str(info.value)
        with pytest.raises(vkmulti.TransferError, match="stalled"):
            link.submit(es, ed, data.nbytes)
        t0 = time.monotonic()
        link.destroy()
        assert time.monotonic() - t0 < 5
    finally:
        link.destroy()
        release()
        ahead.open()   # the leaked copies may run now; let them finish before the buffers go
        settle(src, dst)
        ahead.destroy()
        cleanup()


def test_destroy_while_other_threads_submit_and_wait(manager):
    """destroy() racing submits and waits on other threads: every call either
    works or raises DestroyedError; none runs on a freed link."""
    from vkmulti._core import _native
    from vkmulti.transfer.cross_device import _Endpoint

    sem, data, s, d, release, cleanup = _blocked_source(manager)
    src, dst = manager.slot(1), manager.slot(0)
    link = _native.Link(src.native, src.copy_queue.lock, dst.native, dst.copy_queue.lock, _native.RING_STAGING,
                        1 << 20, 4, 0)
    es, ed = _Endpoint(buffer=s.handle_int, wait_semaphore=sem, wait_value=1), _Endpoint(buffer=d.handle_int)
    ticket, _, dready = link.submit(es, ed, data.nbytes)   # held back until release()
    outcomes: list[str] = []
    stop = threading.Event()

    def waiter():
        try:
            while not stop.is_set():
                if link.poll(ticket, dready, 0.02):
                    outcomes.append("done")
                    return
        except vkmulti.DestroyedError:
            outcomes.append("destroyed")

    def submitter():
        try:
            for _ in range(2000):
                if stop.is_set():
                    break
                link.submit(_Endpoint(buffer=s.handle_int), ed, 256)
                time.sleep(0.001)
            outcomes.append("done")
        except vkmulti.DestroyedError:
            outcomes.append("destroyed")
    threads = [threading.Thread(target=f) for f in (waiter, waiter, submitter)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.1)
        killer = threading.Thread(target=link.destroy)
        killer.start()
        time.sleep(0.1)
        release()            # destroy() finishes the queued jobs, the first one included
        killer.join(30)
        assert not killer.is_alive()
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        link.destroy()
        from gates import settle
        settle(src)
        cleanup()
    assert len(outcomes) == 3 and set(outcomes) <= {"done", "destroyed"}


def test_destroy_waits_for_in_flight(manager):
    sem, data, s, d, release, cleanup = _blocked_source(manager)
    x = CrossDeviceTransfer(manager.slot(1), manager.slot(0), TransferMethod.HOST_SHARED)
    x.submit(src_buffer=s, dst_buffer=d, src_wait=(sem, 1))
    timer = threading.Timer(0.3, release)
    timer.start()
    t0 = time.monotonic()
    x.destroy()
    assert time.monotonic() - t0 >= 0.25
    np.testing.assert_array_equal(d.download(), data)
    with pytest.raises(DestroyedError):
        x.submit(src_buffer=s, dst_buffer=d)
    x.destroy()
    timer.join()
    cleanup()


def test_resource_destroy_waits_for_its_transfers(manager):
    """Destroying a buffer a queued transfer still uses waits for the transfer (bounded)
    instead of freeing memory under the worker and the GPU."""
    sem, data, s, d, release, cleanup = _blocked_source(manager)
    x = CrossDeviceTransfer(manager.slot(1), manager.slot(0), TransferMethod.HOST_SHARED)
    try:
        t = x.submit(src_buffer=s, dst_buffer=d, src_wait=(sem, 1))
        timer = threading.Timer(0.3, release)
        timer.start()
        t0 = time.monotonic()
        d.destroy()   # the transfer still has to write it
        assert time.monotonic() - t0 >= 0.25
        assert t.done()
        timer.join()
    finally:
        x.destroy()
        cleanup()


def test_dst_ready_orders_gpu_work_without_host_wait(manager):
    """An engine's submit on the destination waits on dst_ready on the GPU."""
    sem, data, s, d, release, cleanup = _blocked_source(manager)
    x = CrossDeviceTransfer(manager.slot(1), manager.slot(0), TransferMethod.STAGING_COPY)
    try:
        t = x.submit(src_buffer=s, dst_buffer=d, src_wait=(sem, 1))
        assert isinstance(t.dst_ready, TimelinePoint) and t.dst_ready.device_index == 0
        release()
        # a single-queue device: our submit must follow the transfer's submits
        t.wait_submitted(30)
        # record a readback on GPU 0 that waits for dst_ready on the GPU; no ticket.wait()
        out = Buffer(manager.slot(0), data.nbytes, host_visible=True)
        from vkmulti.device import CommandRunner
        CommandRunner.for_slot(manager.slot(0)).run(
            lambda cmd: vk.vkCmdCopyBuffer(cmd, d.handle, out.handle, 1, [vk.VkBufferCopy(0, 0, data.nbytes)]),
            waits=[(t.dst_ready.semaphore, t.dst_ready.value)])
        np.testing.assert_array_equal(out._read(data.nbytes), data)
        out.destroy()
        # src_done is reached too
        manager.slot(1).native.wait_timeline(t.src_done.semaphore, t.src_done.value, 5)
    finally:
        x.destroy()
        cleanup()


@pytest.mark.virtual
def test_select_transfer_method(manager):
    caps = manager.capabilities
    assert select_transfer_method(Assignment(0), caps) == TransferMethod.NONE
    assert select_transfer_method(Assignment(1), None) == TransferMethod.STAGING_COPY
    assert select_transfer_method(Assignment(1), caps) == TransferMethod.DMABUF       # same UUIDs on lavapipe
    assert select_transfer_method(Assignment(1), caps, prefer_dmabuf=False) == TransferMethod.HOST_SHARED
    no_host = caps.__class__(**{**caps.__dict__, "enabled_extensions": (frozenset(), frozenset())})
    assert select_transfer_method(Assignment(1), no_host, prefer_dmabuf=False) == TransferMethod.STAGING_COPY
    with pytest.raises(TypeError):
        select_transfer_method(object(), caps)


def test_forced_method_missing_extension(manager):
    """Forcing a method the pair lacks is refused when the transfer is made: the message
    names the extension, the device, that the driver has it but the VkDevice did not
    enable it, and exactly the methods the pair supports; the error carries them."""
    slot = manager.slot(1)
    saved = slot.enabled_extensions
    slot.enabled_extensions = saved - {EXT_MEMORY_HOST}
    try:
        with pytest.raises(UnsupportedError) as info:
            CrossDeviceTransfer(slot, manager.slot(0), TransferMethod.HOST_SHARED)
        text = str(info.value)
        assert "GPU 1" in text and EXT_MEMORY_HOST in text and "created without it" in text
        assert "device_requirements()" in text
        supported = vkmulti.pair_methods(slot, manager.slot(0))
        assert TransferMethod.HOST_SHARED not in supported and TransferMethod.STAGING_COPY in supported
        assert text.endswith(f"this pair supports {supported}")
        assert info.value.extension == EXT_MEMORY_HOST
        assert info.value.device == slot.name and info.value.device_index == 1
        assert "\n" not in text and len(text) < 600
        # select_transfer_method picks what works
        assert vkmulti.select_transfer_method(slot, manager.slot(0)) == supported[0]
    finally:
        slot.enabled_extensions = saved


def test_forced_method_the_driver_lacks(manager):
    """An extension the driver itself lacks reads as such (no hint to enable it)."""
    s, d = manager.slot(1), manager.slot(0)
    caps = s.capabilities
    s.capabilities = dataclasses.replace(caps, extensions=caps.extensions - {EXT_MEMORY_HOST})
    try:
        with pytest.raises(UnsupportedError, match=f"the driver of GPU 1 .* lacks {EXT_MEMORY_HOST}") as info:
            CrossDeviceTransfer(s, d, TransferMethod.HOST_SHARED)
        assert "created without it" not in str(info.value)
        assert info.value.extension == EXT_MEMORY_HOST and info.value.device_index == 1
    finally:
        s.capabilities = caps


def test_every_supported_method_is_accepted_and_suggested(manager):
    s, d = manager.slot(1), manager.slot(0)
    supported = vkmulti.pair_methods(s, d)
    assert supported == [TransferMethod.DMABUF, TransferMethod.HOST_SHARED, TransferMethod.STAGING_COPY] or \
        os.environ.get("VKMULTI_REAL_GPUS") == "1"
    for m in supported:
        CrossDeviceTransfer(s, d, m).destroy()
    assert vkmulti.select_transfer_method(s, d) == supported[0]
    assert vkmulti.select_transfer_method(s, s) == TransferMethod.NONE
    with pytest.raises(TypeError, match="two DeviceSlots"):
        vkmulti.select_transfer_method(s, manager.capabilities)


def test_bad_input(manager):
    s1, s0 = manager.slot(1), manager.slot(0)
    with pytest.raises(ValueError, match="unknown cross-device transfer method"):
        CrossDeviceTransfer(s1, s0, "teleport")
    with pytest.raises(ValueError, match="slot_size"):
        CrossDeviceTransfer(s1, s0, TransferMethod.HOST_SHARED, slot_size=0)
    x = CrossDeviceTransfer(s1, s0, TransferMethod.HOST_SHARED)
    a, b, c = Image(s1, 8, 8), Image(s0, 8, 8), Image(s0, 8, 9)
    try:
        with pytest.raises(ValueError, match="dst_image"):
            x.run(src_image=a)
        with pytest.raises(ValueError, match="size mismatch"):
            x.run(src_image=a, dst_image=c)
        with pytest.raises(ValueError, match="src_image belongs to GPU 0"):
            x.run(src_image=b, dst_image=c)
        with pytest.raises(TypeError, match="VkImage"):
            x.run(src_image="image", dst_image=b)
        with pytest.raises(ValueError, match="run_staging_copy called for method"):
            x.run_staging_copy(src_image=a, dst_image=b)
        with pytest.raises(ValueError, match="raw image handles need"):
            x.run(src_image=a.handle, dst_image=b.handle)
        with pytest.raises(TypeError, match="src_wait"):
            x.run(src_image=a, dst_image=b, src_wait=5)
        with Buffer(s1, 100) as sb, Buffer(s0, 50) as db:
            with pytest.raises(ValueError, match="dst_buffer is too small"):
                x.submit(src_buffer=sb, dst_buffer=db)
            with pytest.raises(ValueError, match="size must be a positive int"):
                x.submit(src_buffer=sb, dst_buffer=db, size=0)
            with pytest.raises(ValueError, match="not both"):
                x.submit(src_buffer=sb, dst_image=b)
        # buffers a copy command may not read or write (found by the long fuzz profile)
        with Buffer(s1, 64, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT) as storage, Buffer(s0, 64) as db:
            with pytest.raises(ValueError, match="src_buffer lacks VK_BUFFER_USAGE_TRANSFER_SRC_BIT"):
                x.submit(src_buffer=storage, dst_buffer=db)
        with Buffer(s1, 64) as sb, Buffer(s0, 64, usage=vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT) as nodst:
            with pytest.raises(ValueError, match="dst_buffer lacks VK_BUFFER_USAGE_TRANSFER_DST_BIT"):
                x.submit(src_buffer=sb, dst_buffer=nodst)
        sampled = vk.VK_IMAGE_USAGE_SAMPLED_BIT
        with Image(s1, 8, 8, usage=sampled | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT) as nosrc:
            with pytest.raises(ValueError, match="src_image lacks VK_IMAGE_USAGE_TRANSFER_SRC_BIT"):
                x.run(src_image=nosrc, dst_image=b)
        with Image(s0, 8, 8, usage=sampled | vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT) as nodst:
            with pytest.raises(ValueError, match="dst_image lacks VK_IMAGE_USAGE_TRANSFER_DST_BIT"):
                x.run(src_image=a, dst_image=nodst)
        x.run(src_image=a, dst_image=b, timeout=10)   # still usable after all that
        x.destroy()
        with pytest.raises(DestroyedError):
            x.run(src_image=a, dst_image=b)
        x.destroy()
    finally:
        for img in (a, b, c):
            img.destroy()


def test_raw_handles_with_seed_fields(manager):
    """The seed's calling convention: raw VkImage handles, size from the transfer's fields."""
    s1, s0 = manager.slot(1), manager.slot(0)
    with Image(s1, 33, 17) as a, Image(s0, 33, 17) as b:
        px = np.random.default_rng(0).integers(0, 256, (17, 33, 8), dtype=np.uint8)
        a.upload(px)
        x = CrossDeviceTransfer(s1, s0, TransferMethod.STAGING_COPY, width=33, height=17)
        info = x.ensure_staging(None, None)
        assert info["size"] == 33 * 17 * 8 and x.extra["staging"] is info
        x.run_staging_copy(src_image=a.handle, dst_image=b.handle)
        x.destroy()
        np.testing.assert_array_equal(b.download(), px)


def test_none_method_is_noop(manager):
    x = CrossDeviceTransfer(manager.slot(0), manager.slot(0), TransferMethod.NONE)
    x.run()
    x.destroy()


def test_manager_destroy_frees_links(manager):
    """Links still held by transfers are freed with the manager (no validation leak reports)."""
    x = CrossDeviceTransfer(manager.slot(1), manager.slot(0), TransferMethod.HOST_SHARED)
    x.ensure_staging()
    manager.destroy()
    with pytest.raises(DestroyedError):
        x.run(src_image=None, dst_image=None)


@pytest.mark.gpu
@pytest.mark.parametrize("method", [TransferMethod.STAGING_COPY, TransferMethod.HOST_SHARED])
@pytest.mark.parametrize("src, dst", [(0, 1), (1, 0)])
@pytest.mark.parametrize("w, h", [(1, 1), (1023, 7), (3840, 2160)])
@pytest.mark.parametrize("exclusive", [False, True])
def test_gpu_image_roundtrip(manager, method, src, dst, w, h, exclusive):
    if exclusive:   # owned by the universal family, copied on the transfer family
        assert manager.slot(src).copy_queue.family != manager.slot(src).graphics_queue.family
    roundtrip_image(manager, method, w, h, src=src, dst=dst, exclusive=exclusive)


@pytest.mark.gpu
@pytest.mark.parametrize("method", [TransferMethod.STAGING_COPY, TransferMethod.HOST_SHARED])
def test_gpu_buffer_roundtrip(manager, method):
    test_buffer_roundtrip(manager, method, (256 << 20) + 13, 64, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("method", [TransferMethod.STAGING_COPY, TransferMethod.HOST_SHARED])
@pytest.mark.parametrize("src, dst", [(0, 1), (1, 0)])
def test_gpu_queue_family_ownership_transfer(method, src, dst):
    """An engine's primary whose copy queue is the dedicated transfer family: images
    owned by the universal family go through release/acquire barriers."""
    from vkmulti import MultiDeviceManager
    from vkmulti import create_logical_device
    from vkmulti.device.logical import destroy_logical_device
    from vkmulti import Instance

    inst = Instance()
    pds = inst.physical_devices()
    ld = create_logical_device(pds[0])
    if ld.transfer_queue is None:
        destroy_logical_device(ld.device, ld.native)
        inst.destroy()
        pytest.skip("no dedicated transfer family")
    mgr = MultiDeviceManager(primary_physical_device=pds[0], primary_queue_families=ld.queue_families,
                             primary_device=ld.device, primary_graphics_queue=ld.graphics_queue,
                             primary_present_queue=ld.present_queue, physical_devices=pds, enabled=True,
                             primary_transfer_queue=ld.transfer_queue, primary_extensions=ld.enabled_extensions)
    try:
        assert mgr.primary.copy_queue.family != mgr.primary.graphics_queue.family
        for w, h in ((1, 1), (1023, 7), (1920, 1080)):
            roundtrip_image(mgr, method, w, h, src=src, dst=dst, exclusive=True)
    finally:
        mgr.destroy()
        destroy_logical_device(ld.device, ld.native)
        inst.destroy()


def test_resource_destroy_timeout_keeps_it(manager):
    """A transfer that cannot finish in time: destroy() raises TimeoutError and frees nothing;
    once the transfer completes, destroy() works."""
    sem, data, s, d, release, cleanup = _blocked_source(manager)
    x = CrossDeviceTransfer(manager.slot(1), manager.slot(0), TransferMethod.HOST_SHARED)
    try:
        t = x.submit(src_buffer=s, dst_buffer=d, src_wait=(sem, 1))
        with pytest.raises(vkmulti.TimeoutError):
            d.destroy(timeout=0.05)
        assert d.handle is not None
        release()
        t.wait(30)
        np.testing.assert_array_equal(d.download(), data)
        d.destroy()
        assert d.handle is None
    finally:
        x.destroy()
        cleanup()


def test_mapped_buffer_destroy_timeout_keeps_it_mapped(manager):
    """A host-mapped buffer whose destroy() times out stays mapped; the destroy() that
    succeeds later unmaps it once (the validation guard fails a second unmap)."""
    from vkmulti.memory.buffer import MappedBuffer
    sem, data, s, d, release, cleanup = _blocked_source(manager)
    m = MappedBuffer(manager.slot(0), data.nbytes)
    x = CrossDeviceTransfer(manager.slot(1), manager.slot(0), TransferMethod.HOST_SHARED)
    try:
        t = x.submit(src_buffer=s, dst_buffer=m, src_wait=(sem, 1))
        with pytest.raises(vkmulti.TimeoutError):
            m.destroy(timeout=0.05)
        release()
        t.wait(30)
        np.testing.assert_array_equal(m.bytes, data)
        m.destroy()
        assert m.handle is None and m.bytes is None
    finally:
        x.destroy()
        m.destroy()
        cleanup()


def test_many_submits_after_a_link_is_gone(manager):
    """Tracking transfers on a resource never makes a later submit fail, even when earlier
    tickets belong to a destroyed transfer."""
    n = 4096
    data = np.arange(n, dtype=np.uint8)
    with Buffer(manager.slot(1), n) as a, Buffer(manager.slot(0), n) as b:
        a.upload(data)
        x1 = CrossDeviceTransfer(manager.slot(1), manager.slot(0), TransferMethod.STAGING_COPY)
        for _ in range(20):
            x1.submit(src_buffer=a, dst_buffer=b)
        x1.destroy()
        x2 = CrossDeviceTransfer(manager.slot(1), manager.slot(0), TransferMethod.HOST_SHARED)
        try:
            for _ in range(20):
                x2.submit(src_buffer=a, dst_buffer=b)
            x2.submit(src_buffer=a, dst_buffer=b).wait(30)
            np.testing.assert_array_equal(b.download(), data)
        finally:
            x2.destroy()


_COPY_TEAM_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkm_copy_team.h"
int main(void)
{
    size_t most = (3u << 20) + 64;
    uint8_t *src = malloc(most), *dst = malloc(most);
    for (size_t i = 0; i < most; i++) src[i] = (uint8_t)(i * 131 + 7);
    for (int helpers = 1; helpers <= 7; helpers++) {
        vkm_copy_team t;
        vkm_copy_team_start(&t, helpers);
        size_t parts = (size_t)t.helpers + 1;
        /* len / parts a multiple of 64 with len % parts != 0, and lengths around it */
        size_t base = ((1u << 20) / parts / 64 + 1) * 64 * parts;
        for (size_t len = base - 3; len <= base + 2 * parts; len++) {
            memset(dst, 0, most);
            vkm_copy_team_copy(&t, dst, src, len);
            for (size_t i = 0; i < len; i++)
                if (dst[i] != src[i]) {
                    printf("%d helper(s), %zu B: byte %zu not copied\n", t.helpers, len, i);
                    return 1;
                }
        }
        vkm_copy_team_stop(&t);
    }
    return 0;
}
"""


def test_the_staging_ring_s_split_cpu_copy_copies_every_byte(tmp_path):
    """Before: each helper's part was len / parts rounded down before the cache-line round
    up, so where that was already a multiple of 64 the parts ended len % parts bytes short
    (a staging transfer of 1 MiB + 1 B on a host of 4+ CPUs lost its last byte)."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("needs a C compiler")
    src, exe = tmp_path / "copy_team.c", tmp_path / "copy_team"
    src.write_text(_COPY_TEAM_C)
    r = subprocess.run([cc, "-std=gnu11", "-O1", f"-I{NATIVE}", str(src), os.path.join(NATIVE, "vkm_copy_team.c"),
                        "-o", str(exe), "-lpthread"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
