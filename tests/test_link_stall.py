"""The link's stall rule (issue 23, O): a source still busy before the job's wait
point is slow, not stalled: the link waits for it past the stall threshold and the
caller's own wait has the timeout. Only a link whose own work makes no progress
once its wait points were reached fails as stalled. The threshold is lowered to
0.3 s through the native link's `stall_timeout`; the source is made slow
deterministically by a wait point the test signals from the host only after
several thresholds have passed."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import vkmulti
from vkmulti._core import _native
from vkmulti import Buffer

from gates import Gate, settle

HERE = os.path.dirname(os.path.abspath(__file__))
STALL = 0.3   # seconds: the lowered stall threshold
N = 100_000


def _link(src, dst, ring=_native.RING_STAGING):
    return _native.Link(src.native, src.copy_queue.lock, dst.native, dst.copy_queue.lock, ring, 1 << 16, 2,
                        stall_timeout=STALL)


@pytest.mark.parametrize("side", ["source", "destination"])
@pytest.mark.parametrize("ring", [_native.RING_STAGING, _native.RING_SHARED_HOST])
def test_a_wait_point_signalled_after_the_stall_threshold_is_waited_for(manager, side, ring):
    """Before: LinkStalledError 'vkWaitSemaphores(src chunk) did not complete within
    0.3 s' once the threshold passed, the link failed for good. Now the caller's
    wait times out (vkmulti.TimeoutError, the link fine), and once the point comes
    the job completes, byte for byte, and the link takes further jobs."""
    src, dst = manager.slot(1), manager.slot(0)
    gate = Gate(src if side == "source" else dst)
    data = np.arange(N, dtype=np.uint32).astype(np.uint8)
    a, b = Buffer(src, N), Buffer(dst, N)
    a.upload(data)
    link = _link(src, dst, ring)
    try:
        gated = dict(wait_semaphore=gate.sem, wait_value=1)
        es = _native.Endpoint(buffer=a.handle_int, **(gated if side == "source" else {}))
        ed = _native.Endpoint(buffer=b.handle_int, **(gated if side == "destination" else {}))
        ticket, _, dready = link.submit(es, ed, N)
        time.sleep(5 * STALL)    # well past the threshold, the point still not reached
        assert link.poll(ticket, dready, 0.0) is False
        with pytest.raises(vkmulti.TimeoutError) as info:
            link.wait(ticket, dready, 0.05)
        assert not isinstance(info.value, vkmulti.errors.LinkStalledError)
        time.sleep(2 * STALL)
        gate.open()              # the slow source is done now
        link.wait(ticket, dready, 30)
        np.testing.assert_array_equal(b.download(), data)
        plain = _native.Endpoint(buffer=a.handle_int), _native.Endpoint(buffer=b.handle_int)
        ticket, _, dready = link.submit(*plain, N)
        link.wait(ticket, dready, 30)
    finally:
        gate.destroy()
        link.destroy()
        a.destroy()
        b.destroy()


def test_a_source_timeline_still_advancing_is_waited_for(manager):
    """A wait point reached step by step, each step under the threshold but the whole
    several thresholds long (a source rendering frame after frame): no stall."""
    src, dst = manager.slot(1), manager.slot(0)
    sem = src.native.create_timeline(0)
    a, b = Buffer(src, N), Buffer(dst, N)
    link = _link(src, dst)
    try:
        es = _native.Endpoint(buffer=a.handle_int, wait_semaphore=sem, wait_value=8)
        ticket, _, dready = link.submit(es, _native.Endpoint(buffer=b.handle_int), N)
        for v in range(1, 9):
            time.sleep(STALL / 2)
            _signal(src, sem, v)
        link.wait(ticket, dready, 30)
    finally:
        if src.native.timeline_value(sem) < 8:
            _signal(src, sem, 8)
        settle(src)
        link.destroy()
        a.destroy()
        b.destroy()
        import vulkan as vk
        vk.vkDestroySemaphore(src.device, vk.ffi.cast("VkSemaphore", sem), None)


def _signal(slot, sem, value):
    import vulkan as vk
    vk.vkSignalSemaphore(slot.device, vk.VkSemaphoreSignalInfo(
        sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", sem), value=value))


@pytest.mark.allow_validation_errors   # the stuck link's objects are leaked on purpose
def test_work_that_never_finishes_once_the_point_is_reached_is_a_stall(manager):
    """The link's own copy queued behind work that never completes, with no wait point
    of the job's outstanding: that is a stall, reported as one (LinkStalledError),
    and later submits fail the same way."""
    src, dst = manager.slot(1), manager.slot(0)
    gate = Gate(src)
    a, b = Buffer(src, N), Buffer(dst, N)
    link = _link(src, dst)
    try:
        gate.hold(src.copy_queue)
        ep = _native.Endpoint(buffer=a.handle_int), _native.Endpoint(buffer=b.handle_int)
        ticket, _, dready = link.submit(*ep, N)
        with pytest.raises(vkmulti.errors.LinkStalledError, match="after its wait point was reached"):
            link.wait(ticket, dready, 30)
        with pytest.raises(vkmulti.errors.LinkStalledError):
            link.submit(*ep, N)
    finally:
        gate.open()
        settle(src)
        link.destroy()
        gate.destroy()
        a.destroy()
        b.destroy()


DESTROY_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    from vkmulti import MultiDeviceManager
    from vkmulti._core import _native
    from vkmulti.memory.image import Buffer
    from gates import Gate, settle
    mgr = MultiDeviceManager.create()
    s0, s1 = mgr.slot(1), mgr.slot(0)
    gate = Gate(s0)
    a, b = Buffer(s0, 4096), Buffer(s1, 4096)
    link = _native.Link(s0.native, s0.copy_queue.lock, s1.native, s1.copy_queue.lock, _native.RING_STAGING,
                        1 << 16, 2, stall_timeout=1.0)
    t, _, d = link.submit(_native.Endpoint(buffer=a.handle_int, wait_semaphore=gate.sem, wait_value=1),
                          _native.Endpoint(buffer=b.handle_int), 4096)
    link.destroy()          # the point never comes: the worker stops waiting for it
    print("DESTROYED", link.alive, flush=True)
    gate.open()
    settle(s0)
""")


def test_destroy_does_not_wait_for_a_point_that_never_comes():
    """A link destroyed while its job waits for a point that never comes: waiting for
    a slow source has no end of its own, so destroy() must end it; it returns (in
    about the stall threshold, the copy queued behind the point is left alive)."""
    p = subprocess.run([sys.executable, "-c", DESTROY_SCRIPT.format(here=HERE)], capture_output=True, text=True,
                       timeout=120, cwd=HERE)
    assert "DESTROYED False" in p.stdout, p.stdout[-2000:] + p.stderr[-3000:]
