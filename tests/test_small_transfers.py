"""The small-transfer hot path: what submit() keeps between calls (endpoints, timeline
values read, tickets to settle), the lifetime chain every call enters, the native
poll's spin on GPU pairs, and `bench/transfer.py --small`."""
from __future__ import annotations

import gc
import json
import threading
import time

import numpy as np
import pytest
import vulkan as vk

import vkmulti
from vkmulti import DestroyedError, TransferMethod
from vkmulti import Buffer, Image
from vkmulti._core.lifetime import Lifetime
from vkmulti import CrossDeviceTransfer
from vkmulti.transfer.cross_device import _ENDPOINTS_KEPT, _Endpoint

F = vk.VK_FORMAT_R16G16B16A16_SFLOAT
GENERAL = vk.VK_IMAGE_LAYOUT_GENERAL
SHADER_READ = vk.VK_IMAGE_LAYOUT_SHADER_READ_ONLY_OPTIMAL


def _gate(slot):
    """A host-signalled timeline semaphore on `slot` and the call that signals it to 1."""
    sem = slot.native.create_timeline(0)

    def release():
        vk.vkSignalSemaphore(slot.device, vk.VkSemaphoreSignalInfo(
            sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", sem), value=1))

    def destroy():
        vk.vkDestroySemaphore(slot.device, vk.ffi.cast("VkSemaphore", sem), None)
    return sem, release, destroy


def test_kept_endpoints_follow_layouts_and_destroyed_images(manager):
    """Repeated submits reuse endpoints, yet each one starts from the layout the image is
    in now (a stale endpoint would leave the validation layer an error to report) and
    a destroyed image is refused, never copied from a kept endpoint."""
    s, d = manager.slot(1), manager.slot(0)
    a, b = Image(s, 64, 32, F), Image(d, 64, 32, F)
    x = CrossDeviceTransfer(s, d, TransferMethod.HOST_SHARED)
    try:
        rng = np.random.default_rng(5)
        expected = b.layout
        for final in (None, GENERAL, None, SHADER_READ, None, GENERAL):
            px = rng.integers(0, 256, (32, 64, 8), dtype=np.uint8)
            a.upload(px)
            x.submit(src_image=a, dst_image=b, dst_final_layout=final).wait(30)
            expected = expected if final is None else final
            assert b.layout == expected
            np.testing.assert_array_equal(b.download(), px)
        b.destroy()
        with pytest.raises(DestroyedError):
            x.submit(src_image=a, dst_image=b)
        b = Image(d, 64, 32, F)
        x.submit(src_image=a, dst_image=b).wait(30)
        np.testing.assert_array_equal(b.download(), px)
    finally:
        x.destroy()
        a.destroy()
        b.destroy()


def test_kept_endpoints_are_bounded_and_buffer_offsets_exact(manager):
    """Every offset gets its own endpoint (the bytes land where asked), and a transfer
    keeps at most _ENDPOINTS_KEPT of them, none once destroyed."""
    n, k = 256, _ENDPOINTS_KEPT + 8
    data = np.arange(n * k, dtype=np.uint32).view(np.uint8)[: n * k]
    with Buffer(manager.slot(1), n * k) as a, Buffer(manager.slot(0), n * k) as b:
        a.upload(data)
        x = CrossDeviceTransfer(manager.slot(1), manager.slot(0), TransferMethod.STAGING_COPY)
        try:
            for i in reversed(range(k)):
                x.submit(src_buffer=a, dst_buffer=b, src_offset=i * n, dst_offset=i * n, size=n)
                assert len(x._endpoints) <= _ENDPOINTS_KEPT
            x.submit(src_buffer=a, dst_buffer=b, size=n).wait(30)
            np.testing.assert_array_equal(b.download(), data)
        finally:
            x.destroy()
        assert not x._endpoints


def test_gpu_done_never_answers_from_values_not_yet_read(manager):
    """gpu_done() answers from the highest timeline value read so far when it can; a
    job still waiting on the GPU is never reported done because older ones were."""
    src, dst = manager.slot(1), manager.slot(0)
    sem, release, destroy = _gate(src)
    data = np.arange(50_000, dtype=np.uint8)
    s, d = Buffer(src, data.nbytes), Buffer(dst, data.nbytes)
    s.upload(data)
    x = CrossDeviceTransfer(src, dst, TransferMethod.HOST_SHARED)
    try:
        older = [x.submit(src_buffer=s, dst_buffer=d) for _ in range(3)]
        older[-1].wait(30)
        x.submit(src_buffer=s, dst_buffer=d).wait_source(30)
        assert all(t.gpu_done(1) and t.gpu_done(0) for t in older)
        gated = x.submit(src_buffer=s, dst_buffer=d, src_wait=(sem, 1))
        for _ in range(3):
            assert not gated.gpu_done(1) and not gated.gpu_done(0)
            assert older[0].gpu_done(1)
        release()
        gated.wait(30)
        gated.wait_source(30)
        assert gated.gpu_done(1) and gated.gpu_done(0)
        np.testing.assert_array_equal(d.download(), data)
    finally:
        x.destroy()
        s.destroy()
        d.destroy()
        destroy()


def test_tickets_kept_for_settling_stay_bounded_and_are_answered(manager):
    """A link keeps weak references to its tickets, pruned as they are answered or
    dropped; every ticket still held when its transfer goes is answered."""
    with Buffer(manager.slot(1), 4096) as a, Buffer(manager.slot(0), 4096) as b:
        a.upload(np.full(4096, 7, np.uint8))
        x = CrossDeviceTransfer(manager.slot(1), manager.slot(0), TransferMethod.HOST_SHARED)
        for _ in range(500):
            x.submit(src_buffer=a, dst_buffer=b).wait(30)
        gc.collect()
        assert len(x._ref._tickets) <= 128
        held = [x.submit(src_buffer=a, dst_buffer=b) for _ in range(150)]
        x.destroy()
        for t in held:
            t.wait(0)   # answered: no DestroyedError
            assert t.done()
        np.testing.assert_array_equal(b.download(), np.full(4096, 7, np.uint8))


def test_lifetime_chain_counts_every_ancestor_once_and_rolls_back():
    root = Lifetime(object(), "manager")
    mid = Lifetime(object(), "renderer", [root])
    leaf = Lifetime(object(), "job", [mid, root])
    with leaf:
        with leaf:
            assert (leaf.active, mid.active, root.active) == (2, 2, 2)
    assert (leaf.active, mid.active, root.active) == (0, 0, 0)
    root.close()
    with pytest.raises(DestroyedError, match="job cannot be used: its manager was destroyed"):
        with leaf:
            pass
    assert (leaf.active, mid.active, root.active) == (0, 0, 0)
    leaf.close()
    with pytest.raises(DestroyedError, match="job used after destroy"):
        with leaf:
            pass
    assert (leaf.active, mid.active, root.active) == (0, 0, 0)


def test_lifetime_drain_waits_for_an_operation_on_another_thread():
    life = Lifetime(object(), "thing")
    inside, leave = threading.Event(), threading.Event()

    def op():
        with life:
            inside.set()
            leave.wait(5)
    t = threading.Thread(target=op)
    t.start()
    inside.wait(5)
    threading.Timer(0.2, leave.set).start()
    t0 = time.monotonic()
    with life.ending(5) as dl:
        assert dl is not None and time.monotonic() - t0 >= 0.15
    t.join()
    assert life.dead


def _spinning_link(manager, spin=200e-6):
    from vkmulti._core import _native

    src, dst = manager.slot(1), manager.slot(0)
    return _native.Link(src.native, src.copy_queue.lock, dst.native, dst.copy_queue.lock, _native.RING_STAGING,
                        1 << 20, 4, 0, spin=spin)


def test_spinning_poll_moves_exact_bytes_from_threads(manager, run_threads):
    """A link that polls before blocking (as on GPU pairs) on the virtual pair: jobs from
    several threads, each waited for, all byte-exact."""
    n = 1 << 16
    data = [np.random.default_rng(k).integers(0, 256, n, dtype=np.uint8) for k in range(4)]
    srcs = [Buffer(manager.slot(1), n) for _ in range(4)]
    dsts = [Buffer(manager.slot(0), n) for _ in range(4)]
    link = _spinning_link(manager)
    try:
        for b, v in zip(srcs, data):
            b.upload(v)

        def worker(k):
            es, ed = _Endpoint(buffer=srcs[k].handle_int), _Endpoint(buffer=dsts[k].handle_int)
            for _ in range(25):
                ticket, _, dready = link.submit(es, ed, n)
                link.wait(ticket, dready, 30)
        assert run_threads(worker) == []
        for b, v in zip(dsts, data):
            np.testing.assert_array_equal(b.download(), v)
    finally:
        link.destroy()
        for b in srcs + dsts:
            b.destroy()


SPIN = 1.0   # the longest spin a link takes: 20x the wait's timeout, so load cannot blur "did not spin"


def test_spinning_poll_still_times_out_and_reports_stalls(manager):
    """The spin before blocking never outlasts a wait's timeout, a poll of 0 s answers
    at once, and a stalled job's error reaches a spinning waiter."""
    from vkmulti._core import _native

    from gates import Gate, settle

    src, dst = manager.slot(1), manager.slot(0)
    ahead = Gate(src)
    release, destroy = ahead.open, ahead.destroy
    s, d = Buffer(src, 4096), Buffer(dst, 4096)
    link = _native.Link(src.native, src.copy_queue.lock, dst.native, dst.copy_queue.lock, _native.RING_STAGING,
                        1 << 20, 4, 0, spin=SPIN, stall_timeout=0.5)
    try:
        ahead.hold(src.copy_queue)   # the copy queued behind work that never completes: a stall
        es, ed = _Endpoint(buffer=s.handle_int), _Endpoint(buffer=d.handle_int)
        ticket, _, dready = link.submit(es, ed, 4096)
        t0 = time.monotonic()
        assert link.poll(ticket, dready, 0.0) is False
        with pytest.raises(vkmulti.TimeoutError):
            link.wait(ticket, dready, 0.05)
        # relative to the spin it must not sit out: a wait of 0.05 s ends long before the spin would
        assert time.monotonic() - t0 < SPIN * 0.75
        with pytest.raises(vkmulti.errors.LinkStalledError):
            link.wait(ticket, dready, 20)
    finally:
        release()   # the stuck copy runs now: the link drains and frees everything
        settle(src, dst)
        link.destroy()
        s.destroy()
        d.destroy()
        destroy()


def test_bench_small_times_latency_and_splits_submit_from_wait(tmp_path, capsys):
    from vkmulti.apps.benchmarks import main

    out = tmp_path / "small.json"
    assert main(["--small", "--reps", "6", "--no-torch", "--methods", "host_shared", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    got = {(c["case"], c["method"]) for c in res["cases"]}
    assert got == {(case, m) for case in ("image 256x256", "buffer 64 KiB")
                   for m in (TransferMethod.HOST_SHARED, "seed_baseline")}
    for case in ("image 256x256", "buffer 64 KiB"):
        sp = res["split"][case][TransferMethod.HOST_SHARED]
        assert 0 < sp["submit_s"] < 1 and 0 < sp["wait_s"] < 1
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("ratio: image 256x256: host_shared/seed = ") and "buffer 64 KiB: host_shared/seed" in last


def test_bench_small_and_quick_exclude_each_other(capsys):
    from vkmulti.apps.benchmarks import main

    with pytest.raises(SystemExit) as e:
        main(["--small", "--quick", "--no-torch"])
    assert e.value.code == 2 and "--quick and --small" in capsys.readouterr().err
