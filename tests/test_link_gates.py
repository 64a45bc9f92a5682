"""A link whose queue other work shares waits for its jobs' wait points on its
worker (host_gates), never on the GPU: a copy queued there waiting for a step
of its device would hold up every later submit on that queue, among them the
copy of the other direction that the step itself waits for (an in-order queue).
Found on the H100 logical pair, where both directions' links share each device's
copy queue: a K2K step waited for a landing queued behind the other link's
source copy, which waited for that step. Here the two links share each device's
one queue, and a host-opened Gate stands for the step."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from vkmulti import Buffer
from vkmulti._core import _native
from vkmulti.transfer.link import acquire_link
from vkmulti.transfer.methods import TransferMethod

from gates import Gate

N = 50_000
BOTH = _native.GATE_SRC | _native.GATE_DST


def _link(src, dst, ring, gates):
    return _native.Link(src.native, src.copy_queue.lock, dst.native, dst.copy_queue.lock, ring, 1 << 16, 2,
                        host_gates=gates)


@pytest.mark.parametrize("ring", [_native.RING_STAGING, _native.RING_SHARED_HOST])
@pytest.mark.parametrize("side", ["source", "destination"])
def test_a_job_waiting_for_its_point_holds_up_no_other_link(manager, ring, side):
    """Job X (GPU 1 -> GPU 0) waits for a point not reached yet, on its source
    (GPU 1) or its destination (GPU 0); job Y (GPU 0 -> GPU 1), submitted after it
    on a link of the other direction, completes meanwhile, byte for byte; X then
    completes once the point comes."""
    s0, s1 = manager.slot(0), manager.slot(1)
    gate = Gate(s1 if side == "source" else s0)
    x_data = np.arange(N, dtype=np.uint32).astype(np.uint8)
    y_data = (np.arange(N, dtype=np.uint32) * 7 + 3).astype(np.uint8)
    xa, xb, ya, yb = Buffer(s1, N), Buffer(s0, N), Buffer(s0, N), Buffer(s1, N)
    xa.upload(x_data)
    ya.upload(y_data)
    x_link, y_link = _link(s1, s0, ring, BOTH), _link(s0, s1, ring, BOTH)
    try:
        gated = dict(wait_semaphore=gate.sem, wait_value=1)
        es = _native.Endpoint(buffer=xa.handle_int, **(gated if side == "source" else {}))
        ed = _native.Endpoint(buffer=xb.handle_int, **(gated if side == "destination" else {}))
        x_ticket, x_read, x_ready = x_link.submit(es, ed, N)
        if side == "destination":   # X's copies into GPU 0 come next (the only submit left): before Y's
            s1.native.wait_timeline(x_link.src_timeline, x_read, 20)
            time.sleep(0.1)
        y_ticket, _, y_ready = y_link.submit(_native.Endpoint(buffer=ya.handle_int),
                                             _native.Endpoint(buffer=yb.handle_int), N)
        y_link.wait(y_ticket, y_ready, 20)
        np.testing.assert_array_equal(yb.download(), y_data)
        assert x_link.poll(x_ticket, x_ready, 0.0) is False
        gate.open()
        x_link.wait(x_ticket, x_ready, 20)
        np.testing.assert_array_equal(xb.download(), x_data)
    finally:
        gate.destroy()
        x_link.destroy()
        y_link.destroy()
        for b in (xa, xb, ya, yb):
            b.destroy()


def test_a_link_destroyed_while_a_job_waits_for_its_gate_fails_the_job(manager):
    """The worker's host wait for a point that never comes ends with the link's
    destroy(): the job fails, nothing hangs."""
    from vkmulti.errors import DestroyedError, LinkStalledError

    s0, s1 = manager.slot(0), manager.slot(1)
    gate = Gate(s1)
    a, b = Buffer(s1, N), Buffer(s0, N)
    link = _link(s1, s0, _native.RING_STAGING, BOTH)
    try:
        ticket, _, ready = link.submit(_native.Endpoint(buffer=a.handle_int, wait_semaphore=gate.sem, wait_value=1),
                                       _native.Endpoint(buffer=b.handle_int), N)
        caught: list[BaseException] = []

        def waiter() -> None:
            try:
                link.wait(ticket, ready, 20)
            except BaseException as exc:   # noqa: BLE001 (handed to the test)
                caught.append(exc)
        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.2)
        destroyer = threading.Thread(target=link.destroy)   # (a destroy that hung would hang the run)
        destroyer.start()
        destroyer.join(20)
        assert not destroyer.is_alive(), "destroy() did not end while a job waited for its gate"
        t.join(20)
        assert not t.is_alive()
        # (the waiter sees the link end under it; a wait begun after destroy() gets DestroyedError too)
        assert len(caught) == 1 and isinstance(caught[0], (LinkStalledError, DestroyedError)), caught
    finally:
        gate.destroy()
        a.destroy()
        b.destroy()


def test_host_gates_is_checked(manager):
    s0, s1 = manager.slot(0), manager.slot(1)
    with pytest.raises(ValueError, match="host_gates must combine"):
        _link(s0, s1, _native.RING_STAGING, 4)


def test_the_gate_rule_is_the_queue_not_being_the_graphics_queue():
    """A side on the device's graphics queue (one queue for everything: its callers
    order their submits after the link's) keeps its GPU waits; a side on vkmulti's
    own copy queue (shared by the links of both directions) waits on the host."""
    from types import SimpleNamespace

    from vkmulti.transfer import link as link_module

    slot = SimpleNamespace(graphics_queue=11)
    assert link_module._gates(slot, 11) is False
    assert link_module._gates(slot, 12) is True


@pytest.mark.parametrize("src, dst", [(True, False), (False, True), (True, True)])
def test_acquire_link_hands_each_sides_gate_to_the_link(manager, monkeypatch, src, dst):
    from vkmulti.transfer import link as link_module

    s0, s1 = manager.slot(0), manager.slot(1)
    monkeypatch.setattr(link_module, "_gates", lambda slot, queue: src if slot is s0 else dst)
    ref = acquire_link(s0, s1, TransferMethod.HOST_SHARED, 1 << 17, 3)   # (a ring no other test shares)
    try:
        assert ref.link.host_gates == src * _native.GATE_SRC | dst * _native.GATE_DST
        a, b = Buffer(s0, N), Buffer(s1, N)
        data = (np.arange(N) % 251).astype(np.uint8)
        a.upload(data)
        ticket, _, ready = ref.link.submit(_native.Endpoint(buffer=a.handle_int), _native.Endpoint(buffer=b.handle_int), N)
        ref.link.wait(ticket, ready, 20)
        np.testing.assert_array_equal(b.download(), data)
        a.destroy()
        b.destroy()
    finally:
        ref.release()


def test_a_job_whose_point_came_still_runs_when_the_link_is_destroyed(manager):
    """destroy() finishes the jobs queued before it: one whose wait point was reached
    long ago is submitted, not failed as if its point never came (the gate reads
    the point before it looks at the link stopping)."""
    s0, s1 = manager.slot(0), manager.slot(1)
    gate, blocker = Gate(s1), Gate(s1)
    gate.open()
    big, small = 1 << 20, 4096
    a, b, a2, b2 = Buffer(s1, big), Buffer(s0, big), Buffer(s1, small), Buffer(s0, small)
    data = (np.arange(small) % 253).astype(np.uint8)
    a2.upload(data)
    link = _link(s1, s0, _native.RING_STAGING, BOTH)
    try:
        blocker.hold(s1.copy_queue)   # the first job's copies wait behind this until it opens
        link.submit(_native.Endpoint(buffer=a.handle_int), _native.Endpoint(buffer=b.handle_int), big)
        link.submit(_native.Endpoint(buffer=a2.handle_int, wait_semaphore=gate.sem, wait_value=1),
                    _native.Endpoint(buffer=b2.handle_int), small)
        opener = threading.Timer(0.5, blocker.open)
        opener.start()
        link.destroy()   # (taken by the worker only now, the second job finds the link stopping)
        opener.join()
        np.testing.assert_array_equal(b2.download(), data)
    finally:
        gate.destroy()
        blocker.destroy()
        for x in (a, b, a2, b2):
            x.destroy()
