"""Issue 12, defects A-K, and L (a later review): each body crashed the process (or leaked, or hung) before its fix.

Every body runs here in-process, on the virtual pair with the validation layer
on (a leak at vkDestroyDevice fails the test). `test_bodies_in_a_child_process`
runs them all once more in a child process, so that a regression that crashes
shows up as that test failing (naming the body) instead of taking pytest down.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import vulkan as vk

import vkmulti
from vkmulti import DestroyedError, InterGpuTransfer, MultiDeviceManager, TransferMethod
from vkmulti.device import CommandRunner
from vkmulti.memory import HostPort
from vkmulti import Buffer, Image
from vkmulti import CrossDeviceTransfer

from gates import Gate, Interrupted, interrupt_after

HERE = os.path.dirname(os.path.abspath(__file__))


def _until_destroyed(fn, stop):
    """Call fn() until it raises DestroyedError or `stop` is set; any other error propagates."""
    try:
        while not stop.is_set():
            fn()
    except DestroyedError:
        return "destroyed"
    return "stopped"


def _run(threads):
    for t in threads:
        t.start()
    return threads


class _Worker(threading.Thread):
    """A thread that records what its target raised (to assert on, not to hide)."""

    def __init__(self, target):
        super().__init__(daemon=True)
        self.fn, self.result, self.error = target, None, None

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as exc:   # noqa: BLE001 - the test asserts on it
            self.error = exc


# -- the bodies ----------------------------------------------------------------------


def body_a_manager_destroy_while_submitting(rounds=4):
    """A: MultiDeviceManager.destroy() while threads submit on its transfers: the
    submits see DestroyedError, no link is re-created on the destroyed devices,
    and every object of the manager raises DestroyedError afterwards."""
    for _ in range(rounds):
        mgr = MultiDeviceManager.create()
        slots = mgr.slots
        a, b = Buffer(slots[1], 1 << 16), Buffer(slots[0], 1 << 16)
        x = CrossDeviceTransfer(slots[1], slots[0], TransferMethod.STAGING_COPY)
        stop = threading.Event()
        workers = _run([_Worker(lambda: _until_destroyed(lambda: x.submit(src_buffer=a, dst_buffer=b), stop))
                        for _ in range(3)])
        time.sleep(0.05)
        mgr.destroy()
        time.sleep(0.02)
        stop.set()
        for w in workers:
            w.join(30)
            assert not w.is_alive() and w.error is None, w.error
            assert w.result == "destroyed"
        assert all(not s.children for s in slots), "a link or runner was made after destroy()"
        for call in (lambda: x.submit(src_buffer=a, dst_buffer=b), lambda: a.upload(b"x"),
                     lambda: b.download(), lambda: x.ensure_staging(), lambda: a.handle_int):
            with pytest.raises(DestroyedError):
                call()


def body_b_destroy_during_upload_download(mgr, rounds=12):
    """B: Buffer.destroy() on one thread while another is inside upload()/download();
    InterGpuTransfer.destroy() while another thread reads a result buffer."""
    data = np.arange(1 << 20, dtype=np.uint32).view(np.uint8)
    for k in range(rounds):
        buf = Buffer(mgr.slot(k % 2), data.nbytes)

        def use(buf=buf):
            for _ in range(4):
                buf.upload(data)
                np.testing.assert_array_equal(buf.download(), data)
        w = _run([_Worker(lambda: _until_destroyed(use, threading.Event()))])[0]
        time.sleep(0.001 * (k % 4))
        buf.destroy()
        w.join(30)
        assert w.error is None, w.error
    for k in range(rounds // 2):
        xfer = InterGpuTransfer(mgr)
        out = xfer.copy_buffer_blocking(0, 1, data, timeout=30)

        def read(out=out):
            for _ in range(4):
                np.testing.assert_array_equal(out.download(), data)
        w = _run([_Worker(lambda: _until_destroyed(read, threading.Event()))])[0]
        time.sleep(0.001 * (k % 3))
        xfer.destroy()
        w.join(30)
        assert w.error is None, w.error
        assert out.handle is None


def body_c_first_uses_race(rounds=3):
    """C: first uploads from several threads at once make one CommandRunner per
    slot (the extra ones leaked: command pool, fence, command buffer); first
    transfers from several threads make one link table per slot."""
    made = []
    init = CommandRunner.__init__

    def counting(self, *a, **kw):
        made.append(self)
        init(self, *a, **kw)
    CommandRunner.__init__ = counting
    try:
        for _ in range(rounds):
            made.clear()
            mgr = MultiDeviceManager.create()
            try:
                bufs = [Buffer(mgr.slot(1), 4096) for _ in range(6)]
                xs = [CrossDeviceTransfer(mgr.slot(1), mgr.slot(0), TransferMethod.STAGING_COPY) for _ in range(6)]
                dst = Buffer(mgr.slot(0), 4096)
                go = threading.Barrier(6)

                def first(k):
                    go.wait()
                    bufs[k].upload(np.full(4096, k, np.uint8))
                    xs[k].submit(src_buffer=bufs[k], dst_buffer=dst).wait(30)
                workers = _run([_Worker(lambda k=k: first(k)) for k in range(6)])
                for w in workers:
                    w.join(30)
                    assert w.error is None, w.error
                assert len([r for r in made if r.slot is mgr.slot(1)]) == 1
                tables = {id(x._ref.links) for x in xs}
                assert tables == {id(mgr.slot(1).children["links"])}
            finally:
                mgr.destroy()   # a leaked runner or link shows up here (validation: not destroyed)
    finally:
        CommandRunner.__init__ = init


def body_d_destroy_after_manager():
    """D: Image.destroy() / Buffer.destroy() after their manager was destroyed (SIGABRT
    on a NULL device before): the manager destroyed them first; the calls are no-ops."""
    mgr = MultiDeviceManager.create()
    img, buf = Image(mgr.slot(1), 16, 16), Buffer(mgr.slot(1), 4096)
    port = HostPort(mgr.slot(0))
    mgr.destroy()
    for obj in (img, buf, port):
        obj.destroy()
        obj.destroy()
    assert img.handle is None and buf.handle is None and img.destroyed and buf.destroyed
    for call in (lambda: img.download(), lambda: buf.upload(b"1"), lambda: img.upload(b""),
                 lambda: Image(mgr.slot(0), 4, 4)):
        with pytest.raises(DestroyedError):
            call()


def body_d_kernel_runtime_after_manager():
    """D, for the kernel runtime (landed after the issue was filed): the manager's
    destroy() freed devices under a live KernelRuntime (SIGABRT, heap corruption);
    now it destroys the runtime first, whose calls then raise DestroyedError."""
    from kernel_support import make_coordinator
    from vkmulti.kernels import KernelRuntime, counter_kernel
    from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state

    mgr = MultiDeviceManager.create()
    rt = KernelRuntime(make_coordinator(mgr), mgr, max_kernels=64)
    k = rt.launch(counter_kernel(max_sources=64), device=0, state=[counter_initial_state(64)])
    rt.step(k)
    mgr.destroy()
    for call in (lambda: rt.send(k, np.array([1], np.uint32), tag=COUNTER_TAG_ADD), lambda: rt.step(k),
                 lambda: rt.read_state(k)):
        with pytest.raises(DestroyedError):
            call()
    rt.destroy()


def body_e_ring_shapes_that_wrap(mgr):
    """E: slot_size x slot_count (or its rounding up) past 64 bits crashed in staging
    creation; slot_count >= 2**32 failed later with a conversion error."""
    s1, s0 = mgr.slot(1), mgr.slot(0)
    for size, count, named in ((2**63, 2, "slot_size"), (2**64 - 4095, 1, "slot_size"), (1 << 20, 2**32, "slot_count"),
                               (1 << 30, 1 << 10, "ring of 1024"), (-1, 2, "slot_size"), (1, 0, "slot_count"),
                               (1.5, 2, "slot_size"), (True, 2, "slot_size")):
        for make in (lambda: CrossDeviceTransfer(s1, s0, TransferMethod.HOST_SHARED, slot_size=size, slot_count=count),
                     lambda: InterGpuTransfer(mgr, slot_size=size, slot_count=count)):
            with pytest.raises(ValueError, match=named):
                make()
    for kw in ({"ring_slot_size": 2**63}, {"ring_slot_count": 2**32}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            HostPort(s0, **kw)
    with pytest.raises(ValueError, match="buffer size"):
        Buffer(s0, 2**64)
    with pytest.raises(vkmulti.OutOfDeviceMemoryError):
        Buffer(s0, 1 << 62)   # larger than any heap: refused before the driver is asked


def body_f_null_wait_semaphore(mgr):
    """F: Image.download(waits=[(0, 0)]) put a null semaphore into vkQueueSubmit."""
    s0, s1 = mgr.slot(0), mgr.slot(1)
    with Image(s0, 8, 8) as img, Buffer(s1, 64) as a, Buffer(s0, 64) as b:
        for waits in ([(0, 0)], [(0, 1)], [(-5, 1)], [(None, 1)], [("x", 1)], [None], [(1, 2, 3)], 7, "ab"):
            with pytest.raises((ValueError, TypeError)):
                img.download(waits=waits)
        x = CrossDeviceTransfer(s1, s0, TransferMethod.STAGING_COPY)
        for bad in ((0, 1), (0, 0)):
            with pytest.raises(ValueError, match="non-null"):
                x.submit(src_buffer=a, dst_buffer=b, src_wait=bad)
        port = HostPort(s0)
        with pytest.raises(ValueError, match="non-null"):
            port.upload(b.handle_int, 0, np.zeros(8, np.uint8), waits=[(0, 0)])
        port.destroy()
        x.destroy()
        assert img.download(waits=[]).shape == (8, 8, 8)   # still usable


def body_l_null_timeline_points(mgr):
    """L: a TimelinePoint a caller made with a null or negative semaphore, or a value outside
    uint64, reached vkQueueSubmit as a compositor's or renderer's wait (or as what a secondary's
    renderer returned in render_frame): a segfault. Refused; a renderer returning one falls back."""
    from vkmulti import ReferenceRenderer, ReferenceSRU, SRUOffloadCoordinator, TimelinePoint
    from vkmulti.offload import Compositor

    s0 = mgr.slot(0)
    bad = [TimelinePoint(0, 1, 0), TimelinePoint(-5, 1, 0), TimelinePoint("x", 1, 0),
           TimelinePoint(0x1234, -1, 0), TimelinePoint(0x1234, 2**64, 0)]
    comp, rend = Compositor(s0), ReferenceRenderer(s0)
    sru = ReferenceSRU(1, 8, 8)
    try:
        with Image(s0, 8, 8) as frame, rend.make_target(sru) as target:
            for p in bad:
                with pytest.raises((ValueError, TypeError)):
                    comp.composite(frame, [], wait=p)
                with pytest.raises((ValueError, TypeError)):
                    rend.render(sru, target, wait=[p])
            comp.wait(comp.composite(frame, [(target, 0, 0)], wait=rend.render(sru, target)), timeout=60)
    finally:
        comp.destroy()
        rend.destroy()

    class NullPoint:   # renders, then returns a point with a null semaphore
        def __init__(self, slot):
            self.inner = ReferenceRenderer(slot)

        def render(self, sru, target, *, wait=None):
            self.inner.render(sru, target, wait=wait)
            return TimelinePoint(0, 1, self.inner.slot.index)

        def destroy(self):
            self.inner.destroy()

    home = ReferenceRenderer(s0)
    mgr.attach_renderer(0, home)
    c = SRUOffloadCoordinator(mgr, secondary_renderer_factory=lambda ctx: NullPoint(ctx.slot))
    try:
        with Image(s0, 32, 16) as frame:
            srus = [ReferenceSRU(i, 16, 16, x=16 * i, iterations=2) for i in range(2)]
            rep = c.render_frame(srus, frame)
            assert set(rep.rendered_on.values()) == {0} and 1 in c.unavailable   # fell back
            c.render_frame(srus, frame)
    finally:
        c.destroy()   # raised ValueError: it waited for the renderer's null point
        home.destroy()


def body_g_object_arrays(mgr):
    """G: numpy arrays of Python objects were uploaded as pointers, and gather(out=)
    overwrote them; the next use crashed. Only plain data is accepted."""
    objs = np.array([object() for _ in range(8)], dtype=object)
    structured = np.zeros(4, dtype=[("a", "i4"), ("b", "O")])
    xfer = InterGpuTransfer(mgr)
    try:
        with Buffer(mgr.slot(1), 64) as buf, Image(mgr.slot(0), 2, 2) as img:
            for arr in (objs, structured):
                with pytest.raises(TypeError, match="Python objects"):
                    buf.upload(arr)
                with pytest.raises(TypeError, match="Python objects"):
                    xfer.copy_buffer_blocking(0, 1, arr)
            with pytest.raises(TypeError, match="Python objects"):
                img.upload(np.array([object()] * 32, dtype=object))
            buf.upload(np.full(64, 0x41, np.uint8))
            xfer.set_device_buffer(1, buf)
            with pytest.raises(TypeError, match="Python objects"):
                xfer.gather_blocking(0, out=[objs])
            assert all(o is not None and type(o) is object for o in objs)   # untouched
            (got,) = xfer.gather_blocking(0, timeout=30)
            assert bytes(got) == b"A" * 64
    finally:
        xfer.destroy()


def body_h_host_port_copies_are_waited(mgr):
    """H: Buffer.destroy() did not wait for copies through a HostPort (same-device
    copies, gather_to_device's local part) and freed the buffer under them."""
    slot = mgr.slot(0)
    gate = Gate(slot)
    xfer = InterGpuTransfer(mgr)
    src = Buffer(slot, 8 << 20)
    try:
        xfer.set_device_buffer(0, src, ready=gate.point)
        with pytest.raises(vkmulti.TimeoutError):
            xfer.gather_to_device_blocking(0, timeout=0.2)      # the local copy waits on the gate
        with pytest.raises(vkmulti.TimeoutError):
            xfer.copy_buffer_blocking(0, 0, timeout=0.2)        # a same-device copy, likewise
        with pytest.raises(vkmulti.TimeoutError):
            src.destroy(timeout=0.2)                             # the copies still read it: kept
        assert src.handle is not None and not src.destroyed
        gate.open()
        src.destroy(timeout=30)
        assert src.handle is None
    finally:
        xfer.destroy(timeout=30)
        gate.destroy()


def body_j_download_timeout_and_interrupt(mgr):
    """J: Image.download(waits=...) had a fixed 60 s wait and, after it or Ctrl-C,
    freed its staging buffer under the still-queued copy (a crash when the wait
    point was reached). Now it takes timeout=, and keeps what the GPU may touch."""
    slot = mgr.slot(0)
    gate = Gate(slot)
    img = Image(slot, 256, 256)
    try:
        px = np.random.default_rng(1).integers(0, 256, (256, 256, 8), dtype=np.uint8)
        img.upload(px)
        t0 = time.monotonic()
        with pytest.raises(vkmulti.TimeoutError):
            img.download(waits=[gate.point], timeout=0.2)
        assert time.monotonic() - t0 < 5
        with pytest.raises(Interrupted):
            with interrupt_after(0.2):
                img.download(waits=[gate.point], timeout=30)
        with pytest.raises(vkmulti.TimeoutError):
            img.destroy(timeout=0.1)   # the two copies still read it
        gate.open()                     # the abandoned copies run now, into staging memory still alive
        np.testing.assert_array_equal(img.download(timeout=30), px)
        img.destroy(timeout=30)
    finally:
        img.destroy(timeout=30)
        gate.destroy()


STUCK_S = 90.0   # how long the stuck transfer blocked mgr.destroy() before the fix


def body_k_manager_destroy_bounded(timeout=0.5):
    """K: mgr.destroy() with a stuck transfer blocked ~90 s and ignored SIGINT. Now
    destroy(timeout=) raises vkmulti.TimeoutError in time, Ctrl-C ends it, both
    leave the manager usable, and a later destroy() frees everything."""
    mgr = MultiDeviceManager.create()
    slot = mgr.slot(1)
    gate = Gate(slot)
    a, b = Buffer(slot, 1 << 16), Buffer(mgr.slot(0), 1 << 16)
    a.upload(np.arange(1 << 16, dtype=np.uint8))
    x = CrossDeviceTransfer(slot, mgr.slot(0), TransferMethod.HOST_SHARED)
    t = x.submit(src_buffer=a, dst_buffer=b, src_wait=gate.point)
    t0 = time.monotonic()
    with pytest.raises(vkmulti.TimeoutError):
        mgr.destroy(timeout=timeout)
    # relative to the bug's ~90 s block: in time means a small fraction of it, whatever the load
    assert time.monotonic() - t0 < STUCK_S / 6
    assert not mgr.destroyed and a.handle is not None and b.handle is not None
    t0 = time.monotonic()
    with pytest.raises(Interrupted):
        with interrupt_after(0.2):
            mgr.destroy(timeout=None)
    assert time.monotonic() - t0 < STUCK_S / 6
    assert not mgr.destroyed
    gate.open()
    t.wait(30)
    np.testing.assert_array_equal(b.download(), np.arange(1 << 16, dtype=np.uint8))
    vk.vkDestroySemaphore(slot.device, vk.ffi.cast("VkSemaphore", gate.sem), None)
    mgr.destroy(timeout=30)
    assert mgr.destroyed and a.handle is None and x._destroyed


BODIES_WITH_MANAGER = [body_b_destroy_during_upload_download, body_e_ring_shapes_that_wrap,
                       body_f_null_wait_semaphore, body_g_object_arrays, body_h_host_port_copies_are_waited,
                       body_j_download_timeout_and_interrupt, body_l_null_timeline_points]
BODIES_ALONE = [body_a_manager_destroy_while_submitting, body_c_first_uses_race, body_d_destroy_after_manager,
                body_d_kernel_runtime_after_manager, body_k_manager_destroy_bounded]


# -- in-process --------------------------------------------------------------------


def test_a_manager_destroy_while_submitting():
    body_a_manager_destroy_while_submitting()


def test_b_destroy_during_upload_download(manager):
    body_b_destroy_during_upload_download(manager)


def test_c_first_uses_make_one_runner_and_one_link_table():
    body_c_first_uses_race()


def test_d_destroy_after_manager_destroyed():
    body_d_destroy_after_manager()


def test_d_kernel_runtime_after_manager_destroyed():
    body_d_kernel_runtime_after_manager()


def test_e_ring_shapes_that_wrap_are_refused(manager):
    body_e_ring_shapes_that_wrap(manager)


def test_f_null_wait_semaphore_is_refused(manager):
    body_f_null_wait_semaphore(manager)


def test_l_null_timeline_points_are_refused(manager):
    body_l_null_timeline_points(manager)


def test_g_object_arrays_are_refused(manager):
    body_g_object_arrays(manager)


def test_h_buffer_destroy_waits_for_host_port_copies(manager):
    body_h_host_port_copies_are_waited(manager)


def test_j_download_timeout_and_interrupt_keep_staging(manager):
    body_j_download_timeout_and_interrupt(manager)


def test_k_manager_destroy_is_bounded_and_interruptible():
    body_k_manager_destroy_bounded()


# -- unclear errors made clear (issue 12) --------------------------------------------------


def test_ensure_staging_of_method_none_says_there_is_no_ring(manager):
    x = CrossDeviceTransfer(manager.slot(0), manager.slot(0), TransferMethod.NONE)   # KeyError: 'none' before
    info = x.ensure_staging()
    assert info["method"] == "none" and info["slot_size"] == 0 and info["slot_count"] == 0
    x.destroy()


def test_wrongly_typed_srus_get_a_type_error(manager):
    from vkmulti import SRUOffloadCoordinator, assign_srus

    for srus in ([object()], [3], ["a"]):   # AttributeError before
        with pytest.raises(TypeError, match="sru_id"):
            assign_srus(srus, 2)
    with SRUOffloadCoordinator(manager) as c:
        with pytest.raises(TypeError, match="sru_id"):
            c.plan([object()])
        frame = Image(manager.primary, 8, 8)
        try:
            with pytest.raises(TypeError, match="width and height"):
                c.render_frame([object()], frame)
        finally:
            frame.destroy()


def test_select_transfer_method_and_cuda_peer_reason_check_their_arguments(manager):
    from types import SimpleNamespace

    from vkmulti import cuda_peer_reason, select_transfer_method

    with pytest.raises(TypeError, match="capabilities must be RenderCapabilities"):   # AttributeError before
        select_transfer_method(SimpleNamespace(device_index=1), 3)
    with pytest.raises(TypeError, match="dst_index"):
        select_transfer_method(SimpleNamespace(device_index=1), None, dst_index="0")
    assert isinstance(cuda_peer_reason(manager.slot(0), manager.slot(1)), str)      # a DeviceSlot works
    with pytest.raises(TypeError, match="DeviceCapabilities or a DeviceSlot"):
        cuda_peer_reason(3, manager.slot(1))


def test_coordinator_timeout_and_image_layout_are_checked_at_construction(manager):
    from vkmulti import SRUOffloadCoordinator

    for bad in (-1, 0, float("nan"), "1", True):   # accepted until destroy before
        with pytest.raises(ValueError, match="timeout"):
            SRUOffloadCoordinator(manager, timeout=bad)
    for layout in (99, -1, vk.VK_IMAGE_LAYOUT_UNDEFINED, vk.VK_IMAGE_LAYOUT_DEPTH_STENCIL_ATTACHMENT_OPTIMAL):
        with pytest.raises(ValueError, match="layout"):   # reached the driver before
            Image(manager.slot(0), 8, 8, layout=layout)
    with pytest.raises(ValueError, match="COLOR_ATTACHMENT_OPTIMAL needs image usage"):
        Image(manager.slot(0), 8, 8, layout=vk.VK_IMAGE_LAYOUT_COLOR_ATTACHMENT_OPTIMAL)


def test_assign_srus_is_linear_in_srus_not_devices():
    from types import SimpleNamespace

    from vkmulti import assign_srus
    from vkmulti.offload import assign_srus_reference

    srus = [SimpleNamespace(sru_id=i, instances=[0] * (i % 5)) for i in range(40)]

    def best(devices):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            assign_srus(srus, devices)
            times.append(time.perf_counter() - t0)
        return min(times)
    # relative: a billion devices cost about what ten do (19 s before, linear in devices);
    # the floor keeps a loaded machine's scheduling jitter out of it
    assert best(10**9) < 20 * best(10) + 0.25
    plan = assign_srus(srus, 10**9)
    assert plan == assign_srus(srus, 42) == assign_srus_reference(srus, 10**9)
    previous = {0: 10**8, 1: 5}
    assert assign_srus(srus, 10**9, previous=previous, hysteresis=0.5) == \
        assign_srus_reference(srus, 10**9, previous=previous, hysteresis=0.5)


def test_queues_given_to_ports_runners_and_renderers_are_checked(manager):
    from vkmulti import ReferenceRenderer

    s0, s1 = manager.slot(0), manager.slot(1)
    for make in (lambda q: HostPort(s0, queue=q), lambda q: CommandRunner(s0, q),
                 lambda q: ReferenceRenderer(s0, queue=q)):
        with pytest.raises(TypeError, match="Queue"):
            make("graphics")   # AttributeError before
        with pytest.raises(ValueError, match="not a queue of GPU 0"):
            make(s1.graphics_queue)   # another device's queue
    with pytest.raises(ValueError, match="usage"):
        Buffer(s0, 64, usage=1 << 29)   # an undefined bit reached the driver before


def test_a_finished_ticket_stays_answerable_after_its_transfer_is_destroyed(manager):
    s1, s0 = manager.slot(1), manager.slot(0)
    with Buffer(s1, 4096) as a, Buffer(s0, 4096) as b:
        a.upload(np.arange(4096, dtype=np.uint16).view(np.uint8)[:4096])
        x = CrossDeviceTransfer(s1, s0, TransferMethod.STAGING_COPY)
        tickets = [x.submit(src_buffer=a, dst_buffer=b) for _ in range(3)]
        x.destroy()
        for t in tickets:   # DestroyedError before, for the ones never waited
            t.wait(1)
            assert t.done()
        t.wait_source(1)


# -- in a child process: a crash fails one test instead of ending the run --------------


@pytest.mark.virtual
def test_bodies_in_a_child_process():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, capture_output=True, text=True,
                          timeout=300)
    done = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("ok ")]
    names = [b.__name__ for b in BODIES_WITH_MANAGER + BODIES_ALONE]
    missing = [n for n in names if n not in done]
    assert proc.returncode == 0 and not missing, (
        f"child exited with {proc.returncode} (a negative status is the signal that killed it); "
        f"bodies not passed: {missing}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def _main() -> int:
    os.environ["VKMULTI_VALIDATION"] = "1"
    from vkmulti.device.instance import drain_all_validation_messages
    from vkmulti.testing import install_virtual_gpus

    install_virtual_gpus(2)
    for body in BODIES_WITH_MANAGER + BODIES_ALONE:
        print("start", body.__name__, flush=True)
        if body in BODIES_WITH_MANAGER:
            mgr = MultiDeviceManager.create()
            try:
                body(mgr)
            finally:
                mgr.destroy()
        else:
            body()
        errors = [t for sev, t in drain_all_validation_messages() if sev == "error"]
        if errors:
            print("validation", body.__name__, errors[0][:300], flush=True)
            return 1
        print("ok", body.__name__, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
