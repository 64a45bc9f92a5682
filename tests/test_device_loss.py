"""The lost-device fault hook (vkmulti.testing.lose_device): every layer fails as on
VK_ERROR_DEVICE_LOST, through the one error path, and teardown after a loss is bounded and clean."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import vkmulti
from vkmulti import DeviceLostError, MultiDeviceManager, ReferenceRenderer, ReferenceSRU
from vkmulti.device import CommandRunner
from vkmulti import Buffer, Image
from vkmulti.testing import lose_device
from vkmulti.transfer import CrossDeviceTransfer, TransferMethod

from child_runs import printed_in_order, run_script
from gates import Gate, Interrupted, interrupt_after

HERE = os.path.dirname(os.path.abspath(__file__))


def _bounded_destroy(mgr, seconds=10.0):
    t0 = time.monotonic()
    mgr.destroy(timeout=seconds)
    took = time.monotonic() - t0
    assert mgr.destroyed and took < seconds
    return took


def test_native_flag_makes_submits_and_waits_fail_as_the_driver_would():
    mgr = MultiDeviceManager.create()
    try:
        s1 = mgr.slot(1)
        sem = s1.native.create_timeline(0)
        assert not s1.native.lost and not mgr.device_lost(1)
        lose_device(mgr, 1)
        assert s1.native.lost and mgr.device_lost(1) and not mgr.device_lost(0)
        for call in (lambda: s1.native.wait_timeline(sem, 1, 1.0), lambda: s1.native.timeline_value(sem),
                     lambda: s1.native.wait_idle()):
            with pytest.raises(DeviceLostError) as err:
                call()
            assert err.value.result == -4 and err.value.result_name == "VK_ERROR_DEVICE_LOST"
        with pytest.raises(DeviceLostError) as err:
            s1.native.check_alive("vkQueueSubmit(x)")
        assert err.value.call == "vkQueueSubmit(x)"
        # the survivor is untouched
        sem0 = mgr.slot(0).native.create_timeline(3)
        assert mgr.slot(0).native.timeline_value(sem0) == 3
        import vulkan as vk
        vk.vkDestroySemaphore(mgr.slot(0).device, vk.ffi.cast("VkSemaphore", sem0), None)
        vk.vkDestroySemaphore(s1.device, vk.ffi.cast("VkSemaphore", sem), None)   # destroy is allowed when lost
        assert mgr.check_devices() == {1: "the device returned VK_ERROR_DEVICE_LOST"}
    finally:
        _bounded_destroy(mgr)


def test_a_fence_of_an_injected_loss_counts_as_done_only_once_the_driver_signals_it():
    """An injected loss leaves the driver running what it was given: waits through the
    lost flag fail at once, so what a submit uses is freed only once its fence signals
    (asked of the driver), never while it may still run."""
    import vulkan as vk
    from vkmulti._core.handles import handle_int
    from vkmulti.device.commands import driver_done, wait_fence_or_lost

    mgr = MultiDeviceManager.create()
    try:
        s1 = mgr.slot(1)
        info = vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO)
        pending = vk.vkCreateFence(s1.device, info, None)   # never submitted: never signals
        done = vk.vkCreateFence(s1.device, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO,
                                                                flags=vk.VK_FENCE_CREATE_SIGNALED_BIT), None)
        lose_device(mgr, 1)
        p, d = handle_int(pending, "VkFence"), handle_int(done, "VkFence")
        with pytest.raises(DeviceLostError):
            s1.native.wait_fence(p, 0.1)                    # the flag answers without the driver
        assert not driver_done(s1, p, 0.0) and not driver_done(s1, p, 0.15)
        assert not wait_fence_or_lost(s1, p, 0.05, "test")
        assert driver_done(s1, d, 0.0) and wait_fence_or_lost(s1, d, 1.0, "test")
        for f in (pending, done):
            vk.vkDestroyFence(s1.device, f, None)
    finally:
        _bounded_destroy(mgr)


def test_a_run_in_flight_when_the_loss_is_injected_raises_once_the_driver_ran_it(monkeypatch):
    """A one-shot run whose submit the driver still runs when the device is marked
    lost raises DeviceLostError only once the driver is done with it: the caller
    then frees what the commands use (the twin pool's buffers freed under a fill
    the driver still ran crashed lavapipe's queue thread)."""
    import vulkan as vk
    from vkmulti._core import vkapi

    submitted = threading.Event()
    real_submit = vkapi.queue_submit

    def queue_submit(*args, **kw):
        real_submit(*args, **kw)
        submitted.set()
    monkeypatch.setattr(vkapi, "queue_submit", queue_submit)
    mgr = MultiDeviceManager.create()
    try:
        s1 = mgr.slot(1)
        gate = s1.native.create_timeline(0)
        buf = Buffer(s1, 1 << 16)
        submitted.clear()
        outcome: list = []

        def run():
            try:
                CommandRunner.for_slot(s1).run(lambda cmd: vk.vkCmdFillBuffer(cmd, buf.handle, 0, 1 << 16, 7),
                                               waits=[(gate, 1)], timeout=20)
                outcome.append("returned")
            except DeviceLostError as exc:
                outcome.append(exc)
        t = threading.Thread(target=run)
        t.start()
        assert submitted.wait(20)
        s1.native.mark_lost()
        t.join(0.5)
        assert t.is_alive() and not outcome   # the driver has not run the fill: the run still waits for it
        vk.vkSignalSemaphore(s1.device, vk.VkSemaphoreSignalInfo(
            sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", gate), value=1))
        t.join(20)
        assert not t.is_alive() and len(outcome) == 1 and isinstance(outcome[0], DeviceLostError)
        assert s1.native.drain_queues_raw([q.lock for q in s1.queues()], 5.0)
        buf.destroy()
        vk.vkDestroySemaphore(s1.device, vk.ffi.cast("VkSemaphore", gate), None)
    finally:
        _bounded_destroy(mgr)


def test_python_submitters_fail_through_the_flag():
    """Command runner, renderer and host port of a lost device raise DeviceLostError at submit."""
    mgr = MultiDeviceManager.create()
    try:
        s1 = mgr.slot(1)
        buf = Buffer(s1, 4096)
        buf.upload(np.arange(1024, dtype=np.uint32))          # works before
        r = ReferenceRenderer(s1)
        sru = ReferenceSRU(0, 32, 32, iterations=4)
        img = r.make_target(sru)
        r.render(sru, img)
        lose_device(mgr, 1)
        with pytest.raises(DeviceLostError):
            buf.upload(np.zeros(1024, np.uint32))
        with pytest.raises(DeviceLostError):
            buf.download()
        with pytest.raises(DeviceLostError):
            r.render(sru, img)
        with pytest.raises(DeviceLostError):
            CommandRunner.for_slot(s1).run(lambda cmd: None)
        # GPU 0 still works
        b0 = Buffer(mgr.slot(0), 4096)
        b0.upload(np.arange(1024, dtype=np.uint32))
        assert (b0.download().view(np.uint32) == np.arange(1024)).all()
    finally:
        _bounded_destroy(mgr)


@pytest.mark.parametrize("method", [TransferMethod.HOST_SHARED, TransferMethod.STAGING_COPY])
def test_native_link_worker_sees_the_loss(method):
    """A transfer whose source is lost fails with DeviceLostError (the native worker's
    waits and submits see the flag); the primary's timeline is released, nothing hangs."""
    mgr = MultiDeviceManager.create()
    try:
        src, dst = mgr.slot(1), mgr.slot(0)
        a, b = Buffer(src, 1 << 20), Buffer(dst, 1 << 20)
        a.upload(np.full(1 << 18, 7, np.uint32))
        x = CrossDeviceTransfer(src, dst, method)
        x.submit(src_buffer=a, dst_buffer=b, size=1 << 20).wait(10.0)
        assert (b.download().view(np.uint32) == 7).all()
        lose_device(mgr, 1)
        t0 = time.monotonic()
        with pytest.raises(DeviceLostError):
            x.submit(src_buffer=a, dst_buffer=b, size=1 << 20).wait(30.0)
        assert time.monotonic() - t0 < 30.0 / 3   # failed at once, not at the wait's timeout
        # the reverse direction fails too (the lost device is the destination)
        y = CrossDeviceTransfer(dst, src, method)
        with pytest.raises(DeviceLostError):
            y.submit(src_buffer=b, dst_buffer=a, size=1 << 20).wait(10.0)
    finally:
        _bounded_destroy(mgr)


def test_loss_listeners_are_told_once():
    mgr = MultiDeviceManager.create()
    heard = []
    try:
        mgr.add_loss_listener(lambda i, why: heard.append((i, why)))
        mgr.add_loss_listener(lambda i, why: 1 / 0)   # a failing listener does not hide the loss
        lose_device(mgr, 1)
        assert heard == []                  # the hook is the driver: it tells nobody
        assert mgr.check_devices() == mgr.lost_devices and 1 in mgr.lost_devices
        mgr.check_devices()
        assert mgr.report_device_lost(1, "again") is False
        assert heard == [(1, "the device returned VK_ERROR_DEVICE_LOST")]
        with pytest.raises(TypeError):
            mgr.add_loss_listener(3)
    finally:
        _bounded_destroy(mgr)


def test_a_loss_reported_by_negative_index_is_kept_under_the_slots_index():
    mgr = MultiDeviceManager.create()
    heard = []
    try:
        mgr.add_loss_listener(lambda i, why: heard.append(i))
        assert mgr.report_device_lost(-1, "gone") is True
        assert mgr.report_device_lost(1, "again") is False
        assert mgr.lost_devices == {1: "gone"} and heard == [1]
        assert mgr.device_lost(-1) and mgr.device_lost(1)
    finally:
        _bounded_destroy(mgr)


def test_hook_arguments_are_checked():
    mgr = MultiDeviceManager.create()
    try:
        with pytest.raises(IndexError):
            lose_device(mgr, 5)
        with pytest.raises(TypeError):
            lose_device("mgr", 1)
        with pytest.raises(ValueError):
            lose_device(mgr, 1, timeout=-1)
        assert not mgr.device_lost(1)
    finally:
        mgr.destroy()


def test_hook_drain_is_interruptible():
    """lose_device waits for work held by a gate that never opens in slices: Ctrl-C
    gets through (one driver wait for the whole timeout held it off)."""
    mgr = MultiDeviceManager.create()
    s1 = mgr.slot(1)
    gate = Gate(s1)
    try:
        for q in s1.queues():
            gate.hold(q)
        t0 = time.monotonic()
        with pytest.raises(Interrupted), interrupt_after(0.5):
            lose_device(mgr, 1, timeout=10.0)
        assert time.monotonic() - t0 < 5.0
    finally:
        gate.open()
        assert s1.native.drain_queues_raw([q.lock for q in s1.queues()], 10.0)
        import vulkan as vk
        vk.vkDestroySemaphore(s1.device, vk.ffi.cast("VkSemaphore", gate.sem), None)
        _bounded_destroy(mgr)


def test_destroy_after_loss_is_bounded_with_work_in_flight():
    """Images, buffers, links, renderers and a runner on the lost device, some with work
    in flight on other threads: the manager's destroy() frees them all quickly."""
    mgr = MultiDeviceManager.create()
    s0, s1 = mgr.slot(0), mgr.slot(1)
    r1 = ReferenceRenderer(s1)
    srus = [ReferenceSRU(i, 64, 64, iterations=40) for i in range(4)]
    targets = [r1.make_target(s) for s in srus]
    landing = [Image(s0, 64, 64) for _ in srus]
    x = CrossDeviceTransfer(s1, s0, TransferMethod.HOST_SHARED, width=64, height=64, bytes_per_pixel=8)
    errors = []
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            try:
                for s, t, d in zip(srus, targets, landing):
                    p = r1.render(s, t)
                    x.submit(src_image=t, dst_image=d, src_wait=p)
            except DeviceLostError:
                return
            except Exception as exc:   # anything else is a failure of the test
                errors.append(exc)
                return

    th = threading.Thread(target=busy)
    th.start()
    time.sleep(0.2)
    lose_device(mgr, 1)
    th.join(10.0)
    stop.set()
    assert not th.is_alive() and not errors
    _bounded_destroy(mgr)


def _gated_loss(mgr):
    """GPU 1 holding work behind a closed gate on each queue, then marked lost by the fault
    hook, whose drain gives up at once (its fences stay with the slot, still pending)."""
    s1 = mgr.slot(1)
    gate = Gate(s1)
    for q in s1.queues():
        gate.hold(q)
    with pytest.raises(vkmulti.TimeoutError):
        lose_device(mgr, 1, timeout=0.0)
    assert s1.pending_fences
    return s1, gate


def _ends_only_once_opened(call, gate):
    """`call()` in a thread: still running while the gate is shut, done once it opens."""
    errors: list = []

    def run():
        try:
            call()
        except Exception as exc:   # reported below
            errors.append(exc)
    t = threading.Thread(target=run)
    t.start()
    t.join(0.5)
    running = t.is_alive()
    gate.open()
    t.join(20)
    assert not t.is_alive() and errors == []
    assert running, "it went on while the driver still ran the work behind the gate"


def test_a_drain_after_an_injected_loss_frees_its_fences_once_the_driver_ran_them():
    """The fault hook's drain gave up (its fences stay with the slot); a later drain
    of the device (retire_submits, as a semaphore's destroy or the teardown makes)
    freed those fences at once, through the lost flag, while the driver still ran the
    work before them (VUID-vkDestroyFence-fence-01120, once a link's detach in
    test_failover_in_flight's drain-times-out body). It waits for the driver now."""
    from vkmulti._core.lifetime import Deadline
    from vkmulti.device.logical import retire_submits

    mgr = MultiDeviceManager.create()
    try:
        s1, gate = _gated_loss(mgr)
        _ends_only_once_opened(lambda: retire_submits(s1, Deadline(20.0)), gate)
        assert not s1.pending_fences
        s1.native.destroy_timeline(gate.sem)
    finally:
        _bounded_destroy(mgr)


def test_a_buffer_of_a_job_on_a_gpu_lost_meanwhile_is_freed_once_the_driver_ran_the_job():
    """A GPU job (GpuJobs: a migration's staging pass, a policy capture) counted as done
    as soon as its device was marked lost: the buffers it uses were freed while the
    driver still ran it (a live migration's staging ring when its source was lost
    mid-switch: VUID-vkDestroyBuffer-buffer-00922 in the lost-GPU matrix of
    kernel_races.py; here the fill then wrote freed memory: SIGSEGV). Its buffers now
    wait for the driver to run it. In a child process: a crash is one failure."""
    script = f"import sys; sys.path.insert(0, {HERE!r})\nimport conftest\nimport test_device_loss\n" \
             "test_device_loss.job_on_a_lost_gpu()\n" \
             "from vkmulti.device.instance import drain_all_validation_messages\n" \
             "print('validation errors:', [t for s, t in drain_all_validation_messages() if s == 'error'][:2])\n"
    p = run_script(script, "a job's buffer", 120, HERE)
    printed_in_order(p, ["blocked until the gate opened", "validation errors: []"], "a job's buffer")


def job_on_a_lost_gpu():
    """The child's part: a fill job behind a closed gate on GPU 1, the GPU marked lost (the
    hook's drain gives up at once), the filled buffer destroyed in a thread."""
    import vulkan as vk
    from vkmulti.kernels.engine.gpu_jobs import GpuJobs

    mgr = MultiDeviceManager.create()
    try:
        s1 = mgr.slot(1)
        gate = Gate(s1)
        buf = Buffer(s1, 1 << 16)
        jobs = GpuJobs(s1, s1.queues()[0])
        point = jobs.submit(lambda cmd: vk.vkCmdFillBuffer(cmd, buf.handle, 0, 1 << 16, 7), [gate.point],
                            users=[buf])
        with pytest.raises(vkmulti.TimeoutError):
            lose_device(mgr, 1, timeout=0.0)
        with pytest.raises(DeviceLostError):
            jobs.wait(point, 1.0)   # (the flag answers)
        _ends_only_once_opened(lambda: buf.destroy(timeout=20), gate)
        print("blocked until the gate opened", flush=True)
        jobs.destroy(5.0)
        s1.native.destroy_timeline(gate.sem)
    finally:
        _bounded_destroy(mgr)


class _ReportsLossAtTheSecondQueue:
    """A slot's native table whose queue drain meets VK_ERROR_DEVICE_LOST from the driver
    at its second queue's submit, as the native drain does then: the first queue's fence
    was submitted (and the driver, its device lost, ran it); its handle is handed back as
    one still pending, and DeviceLostError is raised. Everything else is the real table."""

    def __init__(self, slot):
        self.real, self.slot, self.fences = slot.native, slot, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def drain_queues_raw(self, queues, timeout, pending=None):
        import vulkan as vk
        dev = self.slot.device
        fence = vk.vkCreateFence(dev, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
        with self.slot.queues()[0].lock:
            vk.vkQueueSubmit(self.slot.queues()[0].handle, 0, None, fence)
        assert vk.lib.vkWaitForFences(dev, 1, vk.ffi.new("VkFence[1]", [fence]), vk.VK_TRUE,
                                      10_000_000_000) == vk.VK_SUCCESS
        handle = int(vk.ffi.cast("uintptr_t", fence))
        self.fences.append(handle)
        if pending is not None:
            pending.append(handle)
        raise DeviceLostError(-4, "vkQueueSubmit(teardown drain)", "the driver reported the device lost")


def _spy_fence_destroys(monkeypatch):
    """The handles vkDestroyFence is called with from here on (it still destroys them)."""
    import vulkan as vk

    destroyed = []
    real_destroy = vk.vkDestroyFence
    monkeypatch.setattr(vk, "vkDestroyFence", lambda d, f, a: (destroyed.append(int(vk.ffi.cast("uintptr_t", f))),
                                                              real_destroy(d, f, a)))
    return destroyed


def test_a_drain_that_meets_a_reported_loss_frees_the_fences_it_made(monkeypatch):
    """The driver reports the device lost part-way through a drain: the fences the drain
    had submitted were left pending with the slot (the teardown waited on them again, and
    a drain of a device destroyed meanwhile leaked them), though the driver's work is over
    once it reported the loss. They are freed with the DeviceLostError now."""
    from vkmulti.device.logical import drain_through_driver

    mgr = MultiDeviceManager.create()
    try:
        s1 = mgr.slot(1)
        fake = _ReportsLossAtTheSecondQueue(s1)
        destroyed = _spy_fence_destroys(monkeypatch)
        monkeypatch.setattr(s1, "native", fake)
        with pytest.raises(DeviceLostError):
            drain_through_driver(s1, 5.0)
        monkeypatch.undo()
        assert s1.pending_fences == [] and destroyed == fake.fences
    finally:
        _bounded_destroy(mgr)


def test_a_drain_after_one_that_gave_up_waits_for_its_fences_first():
    """The fault hook's drain gave up (its fences stay with the slot); a later drain through
    the driver (a failover's, a GPU job's) made a new fence per queue on top of them and
    left the old ones pending: each drain that gave up added a set, and one that saw the
    work done did not free them. It waits for them first, and frees them once signalled."""
    from vkmulti.device.logical import drain_through_driver

    mgr = MultiDeviceManager.create()
    try:
        s1, gate = _gated_loss(mgr)
        try:
            before = list(s1.pending_fences)
            assert drain_through_driver(s1, 0.2) is False
            assert s1.pending_fences == before   # (the same ones: nothing new on top)
        finally:
            gate.open()
        assert drain_through_driver(s1, 20.0) is True
        assert s1.pending_fences == []
        s1.native.destroy_timeline(gate.sem)
    finally:
        _bounded_destroy(mgr)


def test_a_teardown_drain_that_meets_a_reported_loss_frees_its_fences_before_the_device(monkeypatch):
    """destroy_logical_device: the driver reports the device lost part-way through the
    drain; the fences the drain had submitted were added to the slot's pending list and
    the device destroyed under them (a fence leaked, and a list entry for a destroyed
    device). They go before the device now, with those already pending for it."""
    from vkmulti.device.logical import destroy_logical_device

    mgr = MultiDeviceManager.create()
    try:
        s1 = mgr.slot(1)
        fake = _ReportsLossAtTheSecondQueue(s1)
        destroyed = _spy_fence_destroys(monkeypatch)
        device, queues = s1.device, s1.queues()
        destroy_logical_device(device, fake, queues, 5.0, s1.pending_fences)
        s1.device, s1.native = None, None   # (destroyed here: the manager's destroy skips it)
        monkeypatch.undo()
        assert s1.pending_fences == [] and destroyed == fake.fences
    finally:
        _bounded_destroy(mgr)
