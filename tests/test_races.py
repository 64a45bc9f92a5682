"""Destroy from one thread while others use the object, many rounds, for each public owner.

Every call on a using thread either does its job (checked) or raises
DestroyedError; nothing else is allowed, nothing may crash, and nothing may
leak (the validation layer reports leaked objects when the manager destroys
its devices, which fails the test). `VKMULTI_RACE_ROUNDS` sets the rounds per
owner (default 12; CI runs the default, a longer session e.g. 200).
"""
from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
import pytest
import vulkan as vk

from vkmulti import (DestroyedError, InterGpuTransfer, MultiDeviceManager, ReferenceRenderer, SRUOffloadCoordinator,
                     TransferMethod)
from vkmulti import Buffer, Image, OffloadRoute
from vkmulti import CrossDeviceTransfer

from test_offload import tiles

ROUNDS = int(os.environ.get("VKMULTI_RACE_ROUNDS", "12"))
DATA = np.arange(1 << 16, dtype=np.uint8)
PIXELS = np.tile(np.arange(8, dtype=np.uint8), 32 * 32).reshape(32, 32, 8)


def race(owner_destroy, users, *, rng, threads=3, wait=(0.0, 0.03)):
    """Run each of `users` (callables doing one checked use) in loops on `threads`
    threads; destroy after a random pause; return what the threads ended with."""
    stop = threading.Event()
    ends: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def loop(use):
        end = "stopped"
        try:
            while not stop.is_set():
                use()
        except DestroyedError:
            end = "destroyed"
        except BaseException as exc:   # noqa: BLE001 - collected and asserted below
            with lock:
                errors.append(exc)
            end = "error"
        with lock:
            ends.append(end)
    workers = [threading.Thread(target=loop, args=(users[k % len(users)],), daemon=True) for k in range(threads)]
    for w in workers:
        w.start()
    time.sleep(rng.uniform(*wait))
    owner_destroy()
    time.sleep(0.01)
    stop.set()
    for w in workers:
        w.join(60)
        assert not w.is_alive(), "a using thread hangs after destroy()"
    assert not errors, f"{len(errors)} unexpected error(s), first: {errors[0]!r}"
    return ends


def test_race_multi_device_manager():
    rng = random.Random(1)
    for _ in range(max(2, ROUNDS // 2)):
        mgr = MultiDeviceManager.create()
        s0, s1 = mgr.slot(0), mgr.slot(1)
        a, b, img = Buffer(s1, DATA.nbytes), Buffer(s0, DATA.nbytes), Image(s0, 32, 32)
        x = CrossDeviceTransfer(s1, s0, TransferMethod.STAGING_COPY)
        xfer = InterGpuTransfer(mgr)

        def transfer():
            x.submit(src_buffer=a, dst_buffer=b).wait(30)

        def upload_download():
            a.upload(DATA)
            np.testing.assert_array_equal(a.download(), DATA)

        def image():
            img.upload(PIXELS)
            np.testing.assert_array_equal(img.download(timeout=30), PIXELS)

        def buffers():
            out = xfer.copy_buffer_blocking(0, 1, DATA, timeout=30)
            np.testing.assert_array_equal(out.download(), DATA)
            out.destroy()
        ends = race(lambda: mgr.destroy(timeout=60), [transfer, upload_download, image, buffers], rng=rng, threads=4)
        assert "error" not in ends and mgr.destroyed
        for obj in (a, b, img):
            assert obj.handle is None


def test_race_cross_device_transfer(manager):
    rng = random.Random(2)
    s0, s1 = manager.slot(0), manager.slot(1)
    with Buffer(s1, DATA.nbytes) as a, Buffer(s0, DATA.nbytes) as b, Image(s1, 32, 32) as i1, \
            Image(s0, 32, 32) as i0:
        a.upload(DATA)
        i1.upload(PIXELS)
        methods = (TransferMethod.STAGING_COPY, TransferMethod.HOST_SHARED)
        sharing = {m: CrossDeviceTransfer(s1, s0, m) for m in methods}   # same links as the ones destroyed
        for k in range(ROUNDS):
            method = methods[k % 2]
            x = CrossDeviceTransfer(s1, s0, method)
            tickets = []

            def buffers():
                t = x.submit(src_buffer=a, dst_buffer=b)
                tickets.append(t)
                t.wait(30)

            def images():
                x.run(src_image=i1, dst_image=i0, timeout=30)

            def shared():
                sharing[method].submit(src_buffer=a, dst_buffer=b).wait(30)
            if k % 3 == 2:
                sharing[method].destroy(timeout=30)   # now x holds the last reference to the link
                sharing[method] = CrossDeviceTransfer(s1, s0, method)
            race(lambda: x.destroy(timeout=30), [buffers, images, shared], rng=rng, threads=4)
            for t in tickets:
                t.wait(1)   # a ticket of a destroyed transfer stays answerable
        for x in sharing.values():
            x.destroy(timeout=30)
        np.testing.assert_array_equal(b.download(), DATA)
        np.testing.assert_array_equal(i0.download(), PIXELS)


def test_race_inter_gpu_transfer(manager):
    rng = random.Random(3)
    for _ in range(ROUNDS):
        xfer = InterGpuTransfer(manager)
        reg = xfer.copy_buffer_blocking(0, 1, DATA, timeout=30)
        xfer.set_device_buffer(1, reg)

        def copy():
            out = xfer.copy_buffer_blocking(1, 0, timeout=30)
            np.testing.assert_array_equal(out.download(), DATA)

        def broadcast():
            for out in xfer.broadcast_blocking(DATA, timeout=30):
                assert out.size == DATA.nbytes

        def gather():
            (got,) = xfer.gather_blocking(0, timeout=30)
            np.testing.assert_array_equal(got, DATA)
        race(lambda: xfer.destroy(timeout=30), [copy, broadcast, gather], rng=rng)
        assert reg.handle is None   # the buffers it made went with it


def test_race_image(manager):
    rng = random.Random(4)
    s0, s1 = manager.slot(0), manager.slot(1)
    x = CrossDeviceTransfer(s1, s0, TransferMethod.HOST_SHARED)
    with Image(s1, 32, 32) as src:
        src.upload(PIXELS)
        for _ in range(ROUNDS):
            img = Image(s0, 32, 32)

            def upload_download():
                img.upload(PIXELS)
                np.testing.assert_array_equal(img.download(timeout=30), PIXELS)

            def transfer():
                x.submit(src_image=src, dst_image=img).wait(30)
                np.testing.assert_array_equal(img.download(timeout=30), PIXELS)
            race(lambda: img.destroy(timeout=30), [upload_download, transfer], rng=rng)
            assert img.handle is None
    x.destroy()


def test_race_buffer(manager):
    rng = random.Random(5)
    s0, s1 = manager.slot(0), manager.slot(1)
    x = CrossDeviceTransfer(s1, s0, TransferMethod.STAGING_COPY)
    xfer = InterGpuTransfer(manager)
    with Buffer(s1, DATA.nbytes) as src:
        src.upload(DATA)
        for _ in range(ROUNDS):
            buf = Buffer(s0, DATA.nbytes)

            def upload_download():
                buf.upload(DATA)
                np.testing.assert_array_equal(buf.download(), DATA)

            def transfer():
                x.submit(src_buffer=src, dst_buffer=buf).wait(30)

            def host_port():
                xfer.copy_buffer_blocking(0, 0, DATA, dst_buffer=buf, timeout=30)
            race(lambda: buf.destroy(timeout=30), [upload_download, transfer, host_port], rng=rng)
            assert buf.handle is None
    x.destroy()
    xfer.destroy()


def test_race_sru_offload_coordinator(manager):
    rng = random.Random(6)
    srus = tiles(4, 64, 32, iters=(2, 4))
    frame = Image(manager.primary, 64, 32)
    try:
        for _ in range(max(2, ROUNDS // 2)):
            c = SRUOffloadCoordinator(manager, secondary_renderer_factory=lambda ctx: ReferenceRenderer(ctx.slot))

            def render():
                rep = c.render_frame(srus, frame)
                assert set(rep.rendered_on) == {s.sru_id for s in srus}
            race(lambda: c.destroy(timeout=30), [render], rng=rng, threads=2, wait=(0.0, 0.1))
            assert c.destroyed
    finally:
        frame.destroy()


def test_threads_asking_for_a_secondary_renderer_share_one_context(manager, run_threads):
    """Threads that first ask for a device's renderer at once (render_offloaded; also
    render_sru_offloaded) each made a SecondaryRenderContext and all but one were dropped
    undestroyed: their command pools outlived the device (a validation error at its
    destroy). After destroy() no context is made at all."""
    entered = threading.Event()
    made = []

    def factory(ctx):
        if made:
            entered.set()
        made.append(ctx)
        entered.wait(1.0)   # hold the first maker until a second one comes (it must not)
        return ReferenceRenderer(ctx.slot)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=factory)
    route = OffloadRoute(1, 1, "staging_copy")
    got = []
    barrier = threading.Barrier(4)

    def ask(_):
        barrier.wait()
        got.append(c.render_offloaded(route))
    try:
        assert run_threads(ask, n=4) == []
        assert len(made) == 1 and len({id(r) for r in got}) == 1
    finally:
        c.destroy()
    with pytest.raises(DestroyedError):
        c.render_offloaded(route)
    assert len(made) == 1


def test_race_timeline_relay(manager):
    """The K2K relay (a native thread mirroring GPU 0's timeline onto GPU 1) destroyed
    while other threads relay points, poll and wait on them."""
    from vkmulti.transfer import TimelineRelay
    from vkmulti import TimelinePoint

    rng = random.Random(7)
    s0, s1 = manager.slot(0), manager.slot(1)
    for _ in range(ROUNDS):
        t0 = s0.native.create_timeline(0)
        relay = TimelineRelay(s0, t0, s1)
        value = [0]
        lock = threading.Lock()

        def signal_and_wait():
            ticket = relay.relay(TimelinePoint(t0, value[0] + 1, 0))   # (maybe before its value exists)
            with lock:   # host signals of one timeline only go up
                value[0] += 1
                vk.vkSignalSemaphore(s0.device, vk.VkSemaphoreSignalInfo(
                    sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", t0),
                    value=value[0]))
            ticket.wait(30)
            assert ticket.done()

        try:
            ends = race(lambda: relay.destroy(timeout=30), [signal_and_wait], rng=rng, threads=3)
            assert "error" not in ends and "destroyed" in ends
        finally:
            relay.destroy()
            vk.vkDestroySemaphore(s0.device, vk.ffi.cast("VkSemaphore", t0), None)
