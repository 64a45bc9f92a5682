"""The lock-order checker (lock_order.py) and the orders it keeps: a cycle of lock
classes, a ctx lock below a higher one and nested locks of one class are problems; an
RLock taken again, a try-acquire and a timed acquire are not deadlock edges."""
from __future__ import annotations

import threading

import lock_order


def _take(first, second, **kw):
    with first:
        assert second.acquire(**kw)
        second.release()


def _found() -> list[str]:
    found, lock_order.problems[:] = list(lock_order.problems), []
    return found


def test_a_cycle_of_classes_is_reported_with_both_stacks():
    a, b = lock_order.TrackedLock("test:cycle.a"), lock_order.TrackedLock("test:cycle.b")
    _take(a, b)
    assert not _found()
    t = threading.Thread(target=_take, args=(b, a))   # (another thread: never both at once, still a cycle)
    t.start()
    t.join(10)
    found = _found()
    assert len(found) == 1 and "test:cycle.b -> test:cycle.a -> test:cycle.b" in found[0], found
    assert found[0].count("taken at") == 2 and "_take" in found[0]


def test_a_ctx_lock_below_a_higher_one_and_nested_locks_of_one_class_are_reported():
    g0, g1 = lock_order.TrackedLock("ctx", 0), lock_order.TrackedLock("ctx", 1)
    _take(g0, g1)
    assert not _found()
    _take(g1, g0)
    assert "GPU 0's lock taken while holding GPU 1's" in _found()[0]
    _take(lock_order.TrackedLock("test:same"), lock_order.TrackedLock("test:same"))
    assert "two locks of class test:same nested" in _found()[0]


def test_reentry_try_and_timed_acquires_are_no_deadlock_edges():
    r, x = lock_order.TrackedLock("test:r", reentrant=True), lock_order.TrackedLock("test:x")
    with r:
        _take(x, r)   # (r held already: re-entered)
    _take(x, lock_order.TrackedLock("test:y"))
    y = next(iter(lock_order.edges.keys() & {("test:x", "test:y")}))
    assert ("test:x", "test:r") not in lock_order.edges and y
    cond = threading.Condition(r)
    with r, cond:
        cond.wait(0.01)   # (a Condition over a tracked RLock waits and comes back holding it twice)
        assert r._is_owned()
    _take(lock_order.TrackedLock("test:y"), x, blocking=False)
    _take(lock_order.TrackedLock("test:y"), x, timeout=1.0)
    assert not _found()
    assert any("test:y -> test:x -> test:y (through a timed acquire)" in c for c in lock_order.timed_cycles)

