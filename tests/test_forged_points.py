"""Timeline points whose semaphore vkmulti did not make (a forged handle) or already
destroyed: every wait that takes one refuses it with a typed error before any Vulkan
call, instead of handing the driver a dangling handle (a SIGSEGV, or a validation error).
The crashing cases run in a child process, so that a crash fails the test, not the run."""
from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from vkmulti import TimelinePoint
from vkmulti._core.timeline import as_wait_points, wait_point, wait_points

FORGED = 0x5EED0000BEE0

_CHILD = """
import sys
import numpy as np
from vkmulti import MultiDeviceManager, Buffer, TimelinePoint, CrossDeviceTransfer, TransferMethod
from vkmulti.kernels import KernelRuntime, MultiGpuCoordinator, counter_kernel
from vkmulti.kernels.reference import counter_initial_state
from vkmulti.offload import ReferenceRenderer, ReferenceSRU

FORGED = %d
mgr = MultiDeviceManager.create()
s0 = mgr.slot(0)
case, kind = sys.argv[1], sys.argv[2]

def runtime():
    rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr), mgr, max_kernels=8)
    k = rt.launch(counter_kernel(max_sources=8), "k", device=0, state=[counter_initial_state(8)])
    return rt, k

if kind == "forged":
    sem = FORGED
else:   # a semaphore vkmulti made, then destroyed with what made it
    old, k = runtime()
    ticket = old.step(k)
    ticket.wait(30)
    sem = ticket.points[0].semaphore
    old.destroy()

rt, k = runtime()
rt.step(k).wait(30)
r = ReferenceRenderer(s0)
sru = ReferenceSRU(1, 32, 16)
target = r.make_target(sru)
a, b = Buffer(mgr.slot(1), 256), Buffer(s0, 256)
x = CrossDeviceTransfer(s0, mgr.slot(1), TransferMethod.STAGING_COPY)
calls = {
    "step": lambda: rt.step(k, wait=TimelinePoint(sem, 1, 0)).wait(5),
    "render": lambda: r.wait(r.render(sru, target, wait=TimelinePoint(sem, 1, 0)), timeout=5),
    "transfer": lambda: x.submit(src_buffer=b, dst_buffer=a, src_wait=(sem, 1)).wait(5),
    "native_wait": lambda: s0.native.wait_timeline(sem, 1, 5),
    "native_value": lambda: s0.native.timeline_value(sem),
}
try:
    calls[case]()
except (ValueError, TypeError) as exc:
    print("refused:", type(exc).__name__, exc)
else:
    print("not refused")
    sys.exit(3)
rt.step(k).wait(30)   # everything still usable
r.wait(r.render(sru, target), timeout=60)
x.submit(src_buffer=b, dst_buffer=a).wait(30)
for obj in (x, a, b, target, r, rt):
    obj.destroy()
mgr.destroy()
print("done")
""" % FORGED


@pytest.mark.parametrize("kind", ["forged", "destroyed"])
@pytest.mark.parametrize("case", ["step", "render", "transfer", "native_wait", "native_value"])
def test_a_wait_on_a_semaphore_vkmulti_does_not_own_is_refused(case, kind):
    """Before: a TimelinePoint (or a raw pair) with any non-null handle went to the driver:
    KernelRuntime.step segfaulted in vkQueueSubmit; now each is a ValueError, and
    the runtime, renderer and transfer stay usable."""
    r = subprocess.run([sys.executable, "-c", _CHILD, case, kind], capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr[-3000:]
    assert r.returncode == 0, f"exit status {r.returncode}: {out}"
    assert "refused: ValueError" in r.stdout and "not a live timeline" in r.stdout, out
    assert r.stdout.strip().endswith("done"), out


def test_point_checks_know_the_live_semaphores_of_each_device(manager):
    """The checks themselves (no submit): a forged handle, one of the other GPU, one destroyed
    since; vkmulti's own points and semaphores pass, also after a pickle round trip."""
    s0, s1 = manager.slot(0), manager.slot(1)
    mine, other = s0.native.create_timeline(0), s1.native.create_timeline(0)
    try:
        assert as_wait_points(TimelinePoint(mine, 1, 0), 0, native=s0.native) == [TimelinePoint(mine, 1, 0)]
        assert wait_point((mine, 2), s0, "w") == (mine, 2)
        point = TimelinePoint.of(s0, mine, 3)
        again = pickle.loads(pickle.dumps(point))
        assert again == point and wait_points([point, again], s0) == [(mine, 3), (mine, 3)]
        for bad in (FORGED, other):
            with pytest.raises(ValueError, match="not a live timeline"):
                as_wait_points([TimelinePoint(bad, 1, 0)], 0, native=s0.native)
            with pytest.raises(ValueError, match="not a live timeline"):
                wait_point((bad, 1), s0, "w")
            with pytest.raises(ValueError, match="not a live timeline"):
                s0.native.wait_timeline(bad, 0, 1)
    finally:
        s1.native.destroy_timeline(other)
    s0.native.destroy_timeline(mine)
    with pytest.raises(ValueError, match="not a live timeline"):
        wait_points([TimelinePoint(mine, 1, 0)], s0)
    with pytest.raises(ValueError, match="not a live timeline"):
        s0.native.destroy_timeline(mine)   # (twice: refused, not a double free)
