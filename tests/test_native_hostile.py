"""Native-layer misuse (issue 23): timeline values out of range get a ValueError naming
them; a Link dropped without destroy() never leaves its worker thread reading a
freed device (P), and a script that exits with a transfer stuck behind a
semaphore that never comes exits cleanly."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from vkmulti._core import _native
from vkmulti import Buffer

from gates import Gate

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("value", [-1, 2**64, -(2**70)])
def test_wait_timeline_value_out_of_range_is_a_value_error(manager, value):
    """Before: a bare OverflowError from the argument conversion."""
    nat = manager.slot(0).native
    sem = nat.create_timeline(0)
    try:
        with pytest.raises(ValueError, match=str(value)):
            nat.wait_timeline(sem, value, 0)
        with pytest.raises(ValueError, match="initial"):
            nat.create_timeline(value)
        with pytest.raises(TypeError, match="value must be an int"):
            nat.wait_timeline(sem, 1.5, 0)
        nat.wait_timeline(sem, np.uint64(0), 0)   # integral objects still do
    finally:
        import vulkan as vk
        vk.vkDestroySemaphore(manager.slot(0).device, vk.ffi.cast("VkSemaphore", sem), None)


def _threads(name: str = "vkm-link") -> int:
    """The process's threads called `name` (the library names its own: a driver's threads
    (NVIDIA's come and go) are not counted)."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().strip() == name
        except FileNotFoundError:   # (a thread that just ended)
            pass
    return count


def _link(manager):
    s0, s1 = manager.slot(0), manager.slot(1)
    return _native.Link(s0.native, s0.copy_queue.lock, s1.native, s1.copy_queue.lock, _native.RING_STAGING,
                        1 << 16, 2, stall_timeout=1.0)


def test_a_dropped_idle_link_joins_its_worker(manager):
    """Before: Link had no __dealloc__; a dropped link's worker thread ran on (and read
    its Device after the collector freed it). Now the worker is stopped and joined."""
    base = _threads()
    link = _link(manager)
    assert _threads() == base + 1
    del link
    gc.collect()
    assert _threads() == base


#: The start of the child scripts below: a manager, a gate on GPU 0, a buffer on each GPU.
CHILD_HEAD = """
    import gc, sys, time
    sys.path.insert(0, {here!r})
    from vkmulti import MultiDeviceManager
    from vkmulti._core import _native
    from vkmulti.memory.image import Buffer
    from gates import Gate
    mgr = MultiDeviceManager.create()
    s0, s1 = mgr.slot(0), mgr.slot(1)
    gate = Gate(s0)
    a, b = Buffer(s0, 1 << 12), Buffer(s1, 1 << 12)
"""


BUSY_SCRIPT = textwrap.dedent(CHILD_HEAD + """
    link = _native.Link(s0.native, s0.copy_queue.lock, s1.native, s1.copy_queue.lock, _native.RING_STAGING,
                        1 << 16, 2, stall_timeout=1.0)
    dev0, dev1 = s0.native, s1.native
    refs = sys.getrefcount(dev0), sys.getrefcount(dev1)
    src = _native.Endpoint(buffer=a.handle_int, wait_semaphore=gate.sem, wait_value=1)
    dst = _native.Endpoint(buffer=b.handle_int)
    link.submit(src, dst, 1 << 12)
    del link, src, dst
    gc.collect()
    print("HELD", (sys.getrefcount(dev0), sys.getrefcount(dev1)) == refs, flush=True)
""")


def test_a_dropped_busy_link_keeps_what_its_worker_reads():
    """A link dropped with a job stuck behind a semaphore that never comes: the Device
    objects its worker reads stay referenced (before: the Link's references went with
    it, and the collector freed a Device under the running worker). The child leaks
    that link by design, so it runs apart; at its exit the worker is parked outside
    the driver, and the child exits cleanly."""
    p = subprocess.run([sys.executable, "-c", BUSY_SCRIPT.format(here=HERE)], capture_output=True, text=True,
                       timeout=200, cwd=HERE)
    assert "HELD True" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-3000:]}"


PARK_SCRIPT = textwrap.dedent(CHILD_HEAD + """
    far = s0.native.create_timeline(5)
    link = _native.Link(s0.native, s0.copy_queue.lock, s1.native, s1.copy_queue.lock, _native.RING_STAGING,
                        1 << 16, 2, stall_timeout=60.0)
    mirror = _native.TimelineMirror(s0.native, far, s1.native)
    src = _native.Endpoint(buffer=a.handle_int, wait_semaphore=gate.sem, wait_value=1)
    ticket = link.submit(src, _native.Endpoint(buffer=b.handle_int), 1 << 12)
    time.sleep(0.5)   # (the worker has submitted the copy behind the gate)
    print("BEFORE", s0.native.timeline_value(gate.sem), s1.native.timeline_value(mirror.semaphore), flush=True)
    _native.park_native_threads(5.0)   # what the exit does
    print("AFTER", s0.native.timeline_value(gate.sem), s1.native.timeline_value(mirror.semaphore) > 1 << 32,
          flush=True)
""")


def test_the_exit_lets_gpu_work_behind_a_parked_thread_run_out():
    """At exit the native threads park; GPU work queued behind a running link job's
    wait point that never came (the caller's gate) or behind a mirror would then never
    run, and a driver that tears its devices down at exit (NVIDIA's) waits for it:
    the process hung (the GPU suite's dropped-busy-link and stuck-transfer exits).
    The exit raises that gate to the job's value and every mirror as far as it goes."""
    p = subprocess.run([sys.executable, "-c", PARK_SCRIPT.format(here=HERE)], capture_output=True, text=True,
                       timeout=120, cwd=HERE)
    assert "BEFORE 0 5" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]
    assert "AFTER 1 True" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-3000:]}"


GATED_PARK_SCRIPT = textwrap.dedent(CHILD_HEAD + """
    link = _native.Link(s0.native, s0.copy_queue.lock, s1.native, s1.copy_queue.lock, _native.RING_STAGING,
                        1 << 16, 2, stall_timeout=60.0, host_gates=_native.GATE_SRC | _native.GATE_DST)
    src = _native.Endpoint(buffer=a.handle_int, wait_semaphore=gate.sem, wait_value=1)
    ticket, src_done, dst_ready = link.submit(src, _native.Endpoint(buffer=b.handle_int), 1 << 12)
    time.sleep(0.5)   # (the worker waits on the host for the gate: nothing submitted)
    print("BEFORE", s0.native.timeline_value(gate.sem), s1.native.timeline_value(link.dst_timeline) < dst_ready,
          flush=True)
    _native.park_native_threads(5.0)   # what the exit does
    print("AFTER", s0.native.timeline_value(gate.sem), s0.native.timeline_value(link.src_timeline) >= src_done,
          s1.native.timeline_value(link.dst_timeline) >= dst_ready, flush=True)
""")


def test_the_exit_releases_what_waits_on_a_link_parked_in_a_host_gate():
    """A link that waits on the host for a job's wait point (host_gates) submitted
    nothing yet; parked there at exit, it never will, and GPU work waiting on the
    link's own points (a step waiting for a landing) would never run while a driver
    that tears its devices down waits for it. The exit raises the link's own
    timelines to the values it handed out; the caller's gate, which no copy waits
    on, is left as it is."""
    p = subprocess.run([sys.executable, "-c", GATED_PARK_SCRIPT.format(here=HERE)], capture_output=True, text=True,
                       timeout=120, cwd=HERE)
    assert "BEFORE 0 True" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]
    assert "AFTER 0 True True" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-3000:]}"


EXIT_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    import numpy as np
    from vkmulti import MultiDeviceManager, TransferMethod
    from vkmulti.memory.image import Buffer
    from vkmulti.transfer.cross_device import CrossDeviceTransfer
    from gates import Gate
    mgr = MultiDeviceManager.create()
    slot = mgr.slot(1)
    gate = Gate(slot)
    a, b = Buffer(slot, 1 << 16), Buffer(mgr.slot(0), 1 << 16)
    x = CrossDeviceTransfer(slot, mgr.slot(0), TransferMethod.{method})
    t = x.submit(src_buffer=a, dst_buffer=b, src_wait=gate.point)
    cycle = [mgr, x, t, a, b]
    cycle.append(cycle)
    how = {how!r}
    if how == "destroy-timeout":
        try:
            mgr.destroy(timeout=0.2)
        except Exception as exc:
            print("destroy:", type(exc).__name__)
    print("EXITING", flush=True)
    if how == "raise":
        raise SystemExit("exit by an exception")
""")


@pytest.mark.parametrize("how", ["normal", "raise", "destroy-timeout"])
def test_exit_with_a_transfer_stuck_behind_a_semaphore(how):
    """The interpreter exits with a transfer still waiting: no crash and no hang. Before,
    under ASan: heap-use-after-free in vkm_wait_timeline <- vkm_worker_wait; in the
    normal build under pytest's load about half the runs died of SIGSEGV (-11) in the
    validation layer, whose destructors ran at exit() under the worker's wait. Now an
    atexit hook parks every native thread outside the driver first."""
    code = EXIT_SCRIPT.format(here=HERE, how=how, method="HOST_SHARED")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200, cwd=HERE)
    assert "EXITING" in p.stdout, p.stderr[-3000:]
    assert p.returncode == (1 if how == "raise" else 0), f"exit {p.returncode}\n{p.stderr[-3000:]}"
    assert "AddressSanitizer" not in p.stderr and "Fatal Python error" not in p.stderr, p.stderr[-3000:]
