"""The kernel runtime with a lost GPU (virtual pair, fault hook): the coordinator
unregisters the device by itself, the runtime releases what was there without
touching it and steps the other kernels on, identically; no exception reaches
step(); losing the primary is PrimaryDeviceLostError; teardown is bounded and clean."""
from __future__ import annotations

import struct
import time

import pytest

from vkmulti import MultiDeviceManager
from vkmulti.errors import DestroyedError, DeviceNotAvailableError, PrimaryDeviceLostError
from vkmulti.kernels import CoordinatorEventKind, KernelRuntime, MultiGpuCoordinator, counter_kernel
from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state
from vkmulti.testing import lose_device

#: The teardowns' timeout: a teardown that waited for the lost device's work would sit it out
#: (and raise); one that does not ends well inside a third of it, even with the GPU shared by
#: a dozen test processes (the driver's own teardown is not a wait the timeout bounds).
TEARDOWN = 60.0


def _run(lose_at=None, steps=8):
    """Counters a (GPU 0) and b (GPU 1), each sent step+1 per step; GPU 1 lost before step `lose_at`.
    Returns a's state after `steps` steps, the runtime's stats, and the coordinator events."""
    mgr = MultiDeviceManager.create()
    events = []
    try:
        coord = MultiGpuCoordinator.from_manager(mgr)
        coord.add_listener(events.append)
        rt = KernelRuntime(coord)
        a = rt.launch(counter_kernel(), "a", device=0, state=[counter_initial_state()])
        b = rt.launch(counter_kernel(), "b", device=1, state=[counter_initial_state()])
        for i in range(steps):
            if i == lose_at:
                lose_device(mgr, 1)
            rt.send(a, struct.pack("<I", i + 1), tag=COUNTER_TAG_ADD)
            if lose_at is None or i < lose_at:
                rt.send(b, struct.pack("<I", i + 1), tag=COUNTER_TAG_ADD)
            rt.step().wait(10)                       # never raises for the lost secondary
        state = bytes(rt.read_state(a, 0))
        out = state, rt.failover_stats.snapshot(), dict(rt.lost_kernels), coord.is_device_online(1), events, rt
        t0 = time.monotonic()
        rt.destroy(timeout=TEARDOWN)
        assert time.monotonic() - t0 < TEARDOWN / 3
        return out
    finally:
        t0 = time.monotonic()
        mgr.destroy(timeout=TEARDOWN)
        assert time.monotonic() - t0 < TEARDOWN / 3


def test_survivors_continue_identically_and_the_device_is_unregistered():
    ref, stats0, lost0, online0, _, _ = _run()
    assert not lost0 and online0 and not stats0.devices_lost
    state, stats, lost, online, events, rt = _run(lose_at=4)
    assert state == ref                                   # kernel a never noticed
    assert lost == {"b": 1} and not online and stats.devices_lost == [1]
    assert stats.recoveries and stats.recoveries[0].device == 1 and stats.recoveries[0].seconds < 5
    un = [e for e in events if e.kind is CoordinatorEventKind.DEVICE_UNREGISTERED]
    assert len(un) == 1 and un[0].device_index == 1
    assert [p.kernel_id for p in un[0].result.kernels_to_migrate] == ["b"]


def test_loss_met_inside_a_step_and_explicit_lists():
    """The step itself meets the loss (no check before it); a list naming the lost kernel
    steps the others; the lost kernel's object then says it is gone."""
    mgr = MultiDeviceManager.create()
    try:
        rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr))
        a = rt.launch(counter_kernel(), "a", device=0, state=[counter_initial_state()])
        b = rt.launch(counter_kernel(), "b", device=1, state=[counter_initial_state()])
        rt.step().wait(10)
        mgr.slot(1).native.mark_lost()        # as a driver's VK_ERROR_DEVICE_LOST inside the next submit
        lose_device(mgr, 1)
        t = rt.step([a, b])
        t.wait(10)
        assert [k.id for k in t.launched] == ["a"] and rt.lost_kernels == {"b": 1}
        rt.step(["a", "b"]).wait(10)
        rt.synchronize(10)
        with pytest.raises(DestroyedError):
            rt.send(b, b"\0" * 4)
        with pytest.raises(DeviceNotAvailableError, match="unregistered"):
            rt.launch(counter_kernel(), "c", device=1)
        c = rt.launch(counter_kernel(), "c")              # the coordinator places it on a survivor
        assert c.device_index == 0
        rt.destroy(timeout=10)
    finally:
        mgr.destroy(timeout=10)


def test_losing_the_primary_raises_and_teardown_is_clean():
    mgr = MultiDeviceManager.create()
    try:
        rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr))
        rt.launch(counter_kernel(), "a", device=0, state=[counter_initial_state()])
        rt.launch(counter_kernel(), "b", device=1, state=[counter_initial_state()])
        rt.step().wait(10)
        lose_device(mgr, 0)
        with pytest.raises(PrimaryDeviceLostError, match="primary GPU 0"):
            rt.step()
        with pytest.raises(PrimaryDeviceLostError):
            rt.synchronize(5)
        t0 = time.monotonic()
        rt.destroy(timeout=TEARDOWN)
        assert time.monotonic() - t0 < TEARDOWN / 3
    finally:
        t0 = time.monotonic()
        mgr.destroy(timeout=TEARDOWN)
        assert time.monotonic() - t0 < TEARDOWN / 3


def test_destroy_right_after_a_loss_without_a_step():
    """Nobody stepped since the loss: destroy() still releases the lost device's kernels without waits."""
    mgr = MultiDeviceManager.create()
    rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr))
    for i in range(4):
        rt.launch(counter_kernel(), f"k{i}", device=i % 2, state=[counter_initial_state()])
    for _ in range(3):
        rt.step()
    lose_device(mgr, 1)
    t0 = time.monotonic()
    mgr.destroy(timeout=TEARDOWN)      # destroys the runtime first
    assert time.monotonic() - t0 < TEARDOWN / 3 and sorted(rt.lost_kernels) == ["k1", "k3"]
