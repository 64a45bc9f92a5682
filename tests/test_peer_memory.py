"""Bytes between devices that share memory: ExportedBuffer / ImportedBuffer on
the virtual pair (opaque fds: equal UUIDs), and TimelineRelay, a native
timeline mirror that lets one device's GPU work wait for another's without a
host wait, even queued before the value exists."""
from __future__ import annotations

import numpy as np
import pytest
import vulkan as vk

import vkmulti
from vkmulti._core import _native
from vkmulti.errors import DestroyedError, DeviceLostError, UnsupportedError
from vkmulti.kernels.engine import recording as cmds
from vkmulti.transfer import ExportedBuffer, TimelineRelay, shares_memory
from vkmulti.testing import lose_device
from vkmulti import TimelinePoint


def test_the_pair_shares_memory_and_imports_see_the_same_bytes(manager):
    s0, s1 = manager.slot(0), manager.slot(1)
    assert shares_memory(s0, s1) and shares_memory(s1, s0) and not shares_memory(s0, s0)
    e = ExportedBuffer(s0, 1 << 16)
    try:
        view = e.import_on(s1)
        assert e.import_on(s1) is view and e.imports() == [view] and view.source is e
        data = np.arange(1 << 14, dtype=np.uint32)
        e.upload(data)
        assert np.array_equal(np.frombuffer(view.download(1 << 16), np.uint32), data)
        view.upload(data[::-1].copy())   # and the other way
        assert np.array_equal(np.frombuffer(e.download(1 << 16), np.uint32), data[::-1])
        with pytest.raises(UnsupportedError, match="GPU 0"):
            e.import_on(s0)   # its own device: not another device's view
    finally:
        e.destroy()
    assert view.destroyed and e.destroyed


def test_an_imports_finalizer_gets_the_time_left_and_runs_again_after_it_raised(manager):
    """A finalizer is given what is left of destroy()'s timeout; one that times out keeps
    the import alive (its readers may still run) and is called again by the next destroy()."""
    from vkmulti.errors import TimeoutError as VkmTimeout

    e = ExportedBuffer(manager.slot(1), 4096)
    view = e.import_on(manager.slot(0))
    given = []

    def finalizer(timeout):
        given.append(timeout)
        if len(given) == 1:
            raise VkmTimeout("the readers did not finish")
    view.on_destroy(finalizer)
    with pytest.raises(VkmTimeout):
        view.destroy(5.0)
    assert not view.destroyed and 0 < given[0] <= 5.0
    view.destroy(None)
    assert view.destroyed and given[1:] == [None]
    e.destroy()


def test_an_import_runs_its_finalizers_before_its_memory_goes(manager):
    e = ExportedBuffer(manager.slot(1), 4096)
    view = e.import_on(manager.slot(0))
    seen = []
    view.on_destroy(lambda timeout: seen.append(view.handle is not None))
    with pytest.raises(TypeError):
        view.on_destroy("not callable")
    e.destroy()
    assert seen == [True] and view.destroyed
    with pytest.raises(DestroyedError):
        e.import_on(manager.slot(0))


def test_import_refused_where_memory_is_not_shared(manager, monkeypatch):
    e = ExportedBuffer(manager.slot(0), 4096)
    try:
        monkeypatch.setattr(vkmulti.transfer.peer, "shares_memory", lambda a, b: False)
        with pytest.raises(UnsupportedError, match="cannot import memory of GPU 0"):
            e.import_on(manager.slot(1))
    finally:
        e.destroy()


def _submitter(slot, n):
    q = slot.universal_copy_queue
    pool = vk.vkCreateCommandPool(slot.device, vk.VkCommandPoolCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
        flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=q.family), None)
    buffers = vk.vkAllocateCommandBuffers(slot.device, vk.VkCommandBufferAllocateInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=pool,
        level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=n))
    for c in buffers:
        cmds.begin(c)
        cmds.barrier(c)
        cmds.end(c)
    return q, pool, buffers


def _destroy_semaphore(slot, sem):
    slot.native.destroy_timeline(sem)


def test_a_relay_orders_two_devices_with_waits_queued_before_the_values_exist(manager):
    """GPU 1 submits work waiting on relayed values of GPU 0's timeline before GPU 0
    has submitted what signals them (no host wait); 40 values, validation clean."""
    s0, s1 = manager.slot(0), manager.slot(1)
    t0, t1 = s0.native.create_timeline(0), s1.native.create_timeline(0)
    q0, p0, c0 = _submitter(s0, 40)
    q1, p1, c1 = _submitter(s1, 40)
    relay = TimelineRelay(s0, t0, s1)
    try:
        tickets = [relay.relay(TimelinePoint(t0, v, 0)) for v in range(1, 41)]
        assert [t.dst_ready.value for t in tickets] == list(range(1, 41))
        assert not tickets[0].done()
        for v, c in enumerate(c1, 1):   # the waits first
            cmds.submit(s1.native, q1, c, [(relay.timeline, v)], (t1, v))
        for v, c in enumerate(c0, 1):   # then the signals
            cmds.submit(s0.native, q0, c, [], (t0, v))
        tickets[-1].wait(30)
        s1.native.wait_timeline(t1, 40, 30)
        assert all(t.done() for t in tickets)
        with pytest.raises(ValueError, match="not a point of the timeline"):
            relay.relay(TimelinePoint(t1, 1, 1))
        with pytest.raises(TypeError):
            relay.relay((t0, 1))
    finally:
        relay.destroy()
        relay.destroy()
        for s, p in ((s0, p0), (s1, p1)):
            vk.vkDestroyCommandPool(s.device, p, None)
        _destroy_semaphore(s0, t0)
        _destroy_semaphore(s1, t1)
    with pytest.raises(DestroyedError):
        relay.relay(TimelinePoint(t0, 1, 0))


def test_a_relay_starts_at_the_source_value_and_checks_its_arguments(manager):
    s0, s1 = manager.slot(0), manager.slot(1)
    t0 = s0.native.create_timeline(5)
    try:
        with pytest.raises(ValueError, match="twice"):
            TimelineRelay(s0, t0, s0)
        with pytest.raises(TypeError, match="semaphore"):
            TimelineRelay(s0, 0, s1)
        with pytest.raises(ValueError, match="two devices"):
            _native.TimelineMirror(s0.native, t0, s0.native)
        with TimelineRelay(s0, t0, s1) as relay:
            assert s1.native.timeline_value(relay.timeline) == 5   # values already reached count at once
            assert relay.relay(TimelinePoint(t0, 5, 0)).done()
    finally:
        _destroy_semaphore(s0, t0)


def test_a_relay_from_a_lost_device_follows_its_driver_until_released(manager):
    """A loss injected by lose_device leaves the driver running what the source was
    given: the relay still mirrors the values the source really reaches (GPU work
    waiting on it reads what that work wrote: a survivor's step reading a lost
    device's outbox in place), never more, and lets its waiters go once released
    (the failover does, after the drain); its tickets then raise DeviceLostError."""
    s0, s1 = manager.slot(0), manager.slot(1)
    t0 = s0.native.create_timeline(0)
    relay = TimelineRelay(s0, t0, s1)
    reached, ticket = relay.relay(TimelinePoint(t0, 2, 0)), relay.relay(TimelinePoint(t0, 3, 0))
    lose_device(manager, 0)
    vk.vkSignalSemaphore(s0.device, vk.VkSemaphoreSignalInfo(   # the driver still runs the source's work
        sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", t0), value=2))
    reached.wait(10)
    assert s1.native.timeline_value(relay.timeline) == 2 and not ticket.done()   # (the mark released nothing)
    relay.release("GPU 0 was lost")
    relay.release()
    with pytest.raises(DeviceLostError, match="GPU 0 was lost"):
        ticket.wait(10)
    assert s1.native.timeline_value(relay.timeline) >= 3   # released: nothing waits on it for ever
    relay.destroy()
    _destroy_semaphore(s0, t0)



_JUMP_CHILD = """
import sys
import vulkan as vk
from vkmulti import MultiDeviceManager
from vkmulti._core import _native
mgr = MultiDeviceManager.create()
s0, s1 = mgr.slot(0), mgr.slot(1)
t0 = s0.native.create_timeline(0)
m = _native.TimelineMirror(s0.native, t0, s1.native)
vk.vkSignalSemaphore(s0.device, vk.VkSemaphoreSignalInfo(
    sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", t0), value=10**9))
s1.native.wait_timeline(m.semaphore, 1, 30)   # the thread is walking the values
getattr(m, sys.argv[1])()
m.destroy()
vk.vkDestroySemaphore(s0.device, vk.ffi.cast("VkSemaphore", t0), None)
mgr.destroy()
print("done")
"""


@pytest.mark.parametrize("end", ["destroy", "release"])
def test_a_mirror_whose_source_jumps_far_stops_when_asked(end):
    """Before: the mirror's thread signalled every value up to the source's with its lock held
    and no look at its stop flag; a source raised from 0 to 10**9 by the host kept destroy()
    (which joins the thread) and release() (which takes the lock) waiting for 10**9 signals
    (a child process, so that the hang is killed: its exit would wait for the lock too)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _JUMP_CHILD, end], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stdout + r.stderr


_RACE_CHILD = """
import sys
import threading
import vulkan as vk
from vkmulti import MultiDeviceManager
from vkmulti._core import _native
sys.setswitchinterval(1e-6)   # (threads switch often: the two calls interleave)
mgr = MultiDeviceManager.create()
s0, s1 = mgr.slot(0), mgr.slot(1)
t0 = s0.native.create_timeline(0)
value = 0
for i in range(300):
    m = _native.TimelineMirror(s0.native, t0, s1.native)
    if i % 2:   # the thread is signalling values (under the mirror's lock) when both calls come
        value += 10**6
        vk.vkSignalSemaphore(s0.device, vk.VkSemaphoreSignalInfo(sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO,
                             semaphore=vk.ffi.cast("VkSemaphore", t0), value=value))
    both = threading.Barrier(2)
    def release():
        both.wait()
        for _ in range(3):
            m.release("raced")
    def destroy():
        both.wait()
        m.destroy()
    threads = [threading.Thread(target=release), threading.Thread(target=destroy)]
    for t in threads[::-1] if i % 2 else threads:
        t.start()
    for t in threads:
        t.join()
    m.release()
    m.destroy()
    m.check()
    assert not m.alive
s0.native.destroy_timeline(t0)
mgr.destroy()
print("done")
"""


def test_a_mirrors_release_racing_its_destroy_is_safe():
    """Before: release() read the native mirror after letting the GIL go, so a destroy() on
    another thread freed it under the call (a SIGSEGV within a few dozen rounds): release and
    destroy from two threads, 300 rounds, either one first, in a child process."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _RACE_CHILD], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "done", f"exit status {r.returncode}: {r.stdout}{r.stderr[-3000:]}"
