"""The coordinator's listeners see its changes in the order they were applied, when
several threads change it at once, and a listener may change the coordinator itself
(no deadlock; its change is told after the event it reacts to). No GPU."""
from __future__ import annotations

import random
import sys
import threading
import time

from vkmulti import Backend, CoordinatorEventKind, DeviceInfo, MultiGpuConfig, MultiGpuCoordinator
from vkmulti.errors import VkmError

K = CoordinatorEventKind
JOIN = 60.0


def make(n=3):
    coord = MultiGpuCoordinator(MultiGpuConfig(max_kernels_per_device=1000))
    for i in range(n):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.CUDA))
    return coord


class Model:
    """The kernel map and online devices as a listener rebuilds them from the events;
    each event is checked against the state the events before it left (an event seen
    out of order names a previous device the model does not have)."""

    def __init__(self, coord):
        self.map = coord.kernel_map()
        self.online = set(coord.online_devices())
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, ev):
        with self.lock:
            kid, dev = ev.kernel_id, ev.device_index
            if ev.kind is K.KERNEL_ASSIGNED:
                if self.map.get(kid) != ev.previous_device:
                    self.errors.append(f"{ev}: the model has {kid} on {self.map.get(kid)}")
                if dev not in self.online:
                    self.errors.append(f"{ev}: device {dev} is offline in the model")
                self.map[kid] = dev
            elif ev.kind is K.KERNEL_MIGRATED:
                if self.map.get(kid) != ev.previous_device:
                    self.errors.append(f"{ev}: the model has {kid} on {self.map.get(kid)}")
                self.map[kid] = dev
            elif ev.kind is K.KERNEL_REMOVED:
                if self.map.get(kid) != dev:
                    self.errors.append(f"{ev}: the model has {kid} on {self.map.get(kid)}")
                self.map.pop(kid, None)
            elif ev.kind is K.DEVICE_UNREGISTERED:
                for plan in ev.result.kernels_to_migrate:
                    if self.map.get(plan.kernel_id) != plan.source_device:
                        self.errors.append(f"{ev}: the model has {plan.kernel_id} on {self.map.get(plan.kernel_id)}")
                    self.map[plan.kernel_id] = plan.target_device
                if any(self.map.get(k) == dev for k in ev.result.orphaned_kernels):
                    self.errors.append(f"{ev}: an orphan is still on {dev} in the model")
                self.online.discard(dev)
            elif ev.kind is K.DEVICE_REGISTERED:
                self.online.add(dev)


def _start(fn, name=None):
    errors: list[BaseException] = []

    def guarded():
        try:
            fn()
        except BaseException as exc:   # the test asserts on them
            errors.append(exc)
    t = threading.Thread(target=guarded, name=name, daemon=True)
    t.start()
    return t, errors


def test_a_later_change_of_another_thread_is_not_told_first():
    """Thread A assigns k to GPU 0, thread B then moves it to GPU 1 while A's event is
    still being handed out (A's first listener is slow): the second listener must see
    A's event first, and B's call must not wait for A's listener (it waits for B)."""
    coord = make(2)
    seen = []
    b_done = threading.Event()
    a_in_listener = threading.Event()

    def slow(ev):
        if threading.current_thread().name == "A" and ev.kernel_id == "k" and ev.device_index == 0:
            a_in_listener.set()
            b_done.wait(10)   # B's change is applied meanwhile

    coord.add_listener(slow)
    coord.add_listener(lambda ev: seen.append((ev.kind, ev.device_index, ev.previous_device)))
    ta, ea = _start(lambda: coord.assign_kernel("k", 0), "A")
    assert a_in_listener.wait(JOIN) or ea, ea

    def b():
        coord.assign_kernel("k", 1)
        b_done.set()
    tb, eb = _start(b)
    tb.join(JOIN)
    b_done.set()
    ta.join(JOIN)
    assert not ta.is_alive() and not tb.is_alive() and not ea and not eb
    assert seen == [(K.KERNEL_ASSIGNED, 0, None), (K.KERNEL_ASSIGNED, 1, 0)], seen
    assert coord.get_kernel_device("k") == 1


def test_threads_changing_the_coordinator_at_once_are_told_in_order():
    """Threads register, unregister, place, assign, migrate and remove at once; a
    listener rebuilding the registry from its events finds every event consistent with
    the ones before it, and ends with the coordinator's own map."""
    coord = make(4)
    model = Model(coord)
    coord.add_listener(lambda ev: time.sleep(0))   # (lets another thread in between a change and its event)
    coord.add_listener(model)
    order = []
    coord.add_listener(lambda ev: order.append(ev))

    def worker(seed):
        rng = random.Random(seed)
        for _ in range(300):
            kid = f"k{rng.randrange(12)}"
            op = rng.randrange(7)
            try:
                if op == 0:
                    coord.assign_kernel(kid, rng.randrange(4))
                elif op == 1:
                    coord.place_kernel(kid)
                elif op == 2:
                    coord.remove_kernel(kid)
                elif op == 3:
                    coord.complete_migration(coord.request_migration(kid, rng.randrange(4)))
                elif op == 4 and rng.random() < 0.2:
                    coord.unregister_device(rng.randrange(1, 4))
                elif op == 5:
                    d = rng.randrange(1, 4)
                    coord.register_device(DeviceInfo(d, f"GPU {d}", Backend.CUDA))
            except VkmError:
                pass   # (a device offline, a kernel moved or removed meanwhile)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)   # (thread switches often: interleavings that are rare otherwise)
    try:
        threads = [_start(lambda s=s: worker(s)) for s in range(6)]
        for t, _ in threads:
            t.join(JOIN)
    finally:
        sys.setswitchinterval(interval)
    assert all(not t.is_alive() and not errs for t, errs in threads), [e for _, errs in threads for e in errs]
    assert not model.errors, model.errors[:5]
    assert model.map == coord.kernel_map()
    assert model.online == set(coord.online_devices())
    assert len(order) > 100


def test_a_listener_that_changes_the_coordinator():
    """A listener that removes each kernel it is told was assigned: no deadlock, and
    every listener sees the assignment before the removal it caused."""
    coord = make(2)
    seen = []

    def undo(ev):
        if ev.kind is K.KERNEL_ASSIGNED:
            coord.remove_kernel(ev.kernel_id)
    coord.add_listener(undo)
    coord.add_listener(lambda ev: seen.append((ev.kind, ev.kernel_id)))
    t, errs = _start(lambda: [coord.assign_kernel(f"k{i}", i % 2) for i in range(5)])
    t.join(JOIN)
    assert not t.is_alive() and not errs, errs
    assert seen == [e for i in range(5) for e in ((K.KERNEL_ASSIGNED, f"k{i}"), (K.KERNEL_REMOVED, f"k{i}"))], seen
    assert coord.kernel_map() == {}


def test_a_listener_added_or_removed_is_told_the_changes_after_it():
    """add_listener: the changes from then on; remove_listener: none after it, even
    of changes still being handed out."""
    coord = make(2)
    late, early = [], []

    def first(ev):
        if ev.kernel_id == "a":
            coord.remove_listener(early.append)
            coord.add_listener(late.append)
    coord.add_listener(first)
    coord.add_listener(early.append)
    coord.assign_kernel("a", 0)
    coord.assign_kernel("b", 1)
    assert [e.kernel_id for e in early] == []     # removed before "a" reached it
    assert [e.kernel_id for e in late] == ["b"]   # added after "a" was applied


def test_a_listener_interrupted_loses_no_event_of_the_change_it_was_told():
    """A listener that raises KeyboardInterrupt on the first event of a change with several
    (unregister_device of the last device: its kernels removed, then the unregistration):
    the interrupt reaches the caller, and the next change hands out the rest first, in
    order, to every listener."""
    coord = make(1)
    for i in range(2):
        coord.assign_kernel(f"k{i}", 0)
    first, second = [], []
    interrupt = [True]

    def flaky(ev):
        first.append(ev.kind)
        if interrupt[0]:
            interrupt[0] = False
            raise KeyboardInterrupt
    coord.add_listener(flaky)
    coord.add_listener(lambda ev: second.append(ev.kind))
    try:
        coord.unregister_device(0)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the listener's KeyboardInterrupt did not reach the caller")
    coord.register_device(DeviceInfo(1, "GPU 1", Backend.CUDA))
    told = [K.KERNEL_REMOVED, K.KERNEL_REMOVED, K.DEVICE_UNREGISTERED, K.DEVICE_REGISTERED]
    assert first == told and second == told, (first, second)


def test_a_ctrl_c_while_a_listeners_failure_is_logged_loses_no_event():
    """A listener that fails (its exception logged) and a Ctrl-C that lands while that
    failure is being logged (here: a log filter raising KeyboardInterrupt once): the
    interrupt reaches the caller, and the next change hands out what was left of the
    interrupted change first, in order, to every listener."""
    import logging

    coord = make(1)
    for i in range(2):
        coord.assign_kernel(f"k{i}", 0)
    told: list = []

    def failing(ev):
        raise ValueError("a listener's bug")

    class CtrlCWhileLogging(logging.Filter):
        fired = False

        def filter(self, record):
            if not self.fired:
                self.fired = True
                raise KeyboardInterrupt
            return True

    coord.add_listener(failing)
    coord.add_listener(lambda ev: told.append(ev.kind))
    logger = logging.getLogger("vkmulti.kernels.coordinator.events")
    ctrl_c = CtrlCWhileLogging()
    logger.addFilter(ctrl_c)
    try:
        try:
            coord.unregister_device(0)
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the KeyboardInterrupt did not reach the caller")
        assert ctrl_c.fired
        coord.register_device(DeviceInfo(1, "GPU 1", Backend.CUDA))
    finally:
        logger.removeFilter(ctrl_c)
    assert told == [K.KERNEL_REMOVED, K.KERNEL_REMOVED, K.DEVICE_UNREGISTERED, K.DEVICE_REGISTERED], told
