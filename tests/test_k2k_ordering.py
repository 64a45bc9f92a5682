"""K2K ordering under hostile threading (issue 23, J and K): several threads calling
step() at once, and both ends of a pair migrating back and forth under traffic.
Every message arrives exactly once (count and sum) and in order per sender (the
counter checks each sender's sequence numbers on the GPU: `fifo_errors`).

Before the fix four stepping threads gave the sink 15 sequence gaps in 400
messages (the issue: 371-607 in ~100k); step() calls now take turns, one whole
step (submits on every device and the router's hand-off) at a time. Both ends
migrating (K: 3-11 gaps per run in the issue's probe) is covered with one and
with several stepping threads."""
from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest

import kernel_support
from kernel_support import router  # noqa: F401 (the shared router fixture)
from kernel_support import runtime_fixture
from vkmulti.errors import TimeoutError as VkmTimeout
from vkmulti.kernels.reference import COUNTER_TAG_FORWARD, read_counter

MAX = 32
runtime = runtime_fixture(max_kernels=MAX)
counter = functools.partial(kernel_support.counter, max_sources=MAX)


def _steppers(rt, n, stop, errors, budget=4000):
    """`n` threads calling rt.step() until `stop` is set (each at most `budget` steps)."""
    def loop():
        try:
            for _ in range(budget):
                if stop.is_set():
                    return
                rt.step(timeout=30)
        except Exception as exc:   # reported by the test
            errors.append(exc)
    threads = [threading.Thread(target=loop, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def _wait_count(rt, sink, count, stop, threads, limit=2000):
    """Until the sink consumed `count` messages (at most `limit` polls), then stop the steppers."""
    try:
        for _ in range(limit):
            if read_counter(rt.read_state(sink)).count >= count or not any(t.is_alive() for t in threads):
                break
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads), "a stepping thread did not end"


@pytest.mark.parametrize("threads", [1, 4])
def test_several_stepping_threads_keep_fifo_per_pair(runtime, router, threads):
    """Four forwarders (two per GPU) send to one sink with a small inbox while
    `threads` threads call step() at once; the host keeps sending."""
    sink = counter(runtime, "sink", device=0, inbox=4)
    fwd = [counter(runtime, f"fwd{i}", device=i % 2, params=[sink.address]) for i in range(4)]
    stop, errors = threading.Event(), []
    stepping = _steppers(runtime, threads, stop, errors)
    total = 0
    try:
        for i in range(100):
            for j, f in enumerate(fwd):
                runtime.send(f, np.array([1000 * j + i], np.uint32), tag=COUNTER_TAG_FORWARD, timeout=30)
                total += 1000 * j + i
    finally:
        _wait_count(runtime, sink, 400, stop, stepping)
    runtime.synchronize(30)
    assert errors == []
    st = read_counter(runtime.read_state(sink))
    assert (st.count, st.sum, st.fifo_errors) == (400, total, 0)


@pytest.mark.parametrize("threads", [1, 3])
def test_both_ends_migrating_back_and_forth_keep_fifo(runtime, router, threads):
    """A sender and its receiver both move between the GPUs (eight moves each, from
    two threads) while `threads` threads step and the host keeps sending: the pair is
    local, remote, local... in turn, with messages in flight at every switch."""
    sink = counter(runtime, "sink", device=0, inbox=2)
    src = counter(runtime, "src", device=1, params=[sink.address])
    other = counter(runtime, "other", device=0, params=[sink.address])
    stop, errors = threading.Event(), []
    stepping = _steppers(runtime, threads, stop, errors)
    moved: list = []

    def mover(k):
        try:
            for _ in range(8):
                moved.append(runtime.migrate(k, 1 - k.device_index, timeout=60))
        except Exception as exc:   # reported by the test
            errors.append(exc)
    movers = [threading.Thread(target=mover, args=(k,), daemon=True) for k in (sink, src)]
    for t in movers:
        t.start()
    total = 0
    try:
        for i in range(150):
            runtime.send(src, np.array([i], np.uint32), tag=COUNTER_TAG_FORWARD, timeout=30)
            runtime.send(other, np.array([5000 + i], np.uint32), tag=COUNTER_TAG_FORWARD, timeout=30)
            total += 5000 + 2 * i
        for t in movers:
            t.join(120)
    finally:
        _wait_count(runtime, sink, 300, stop, stepping)
    runtime.synchronize(30)
    assert errors == []
    assert len(moved) == 16 and all(r.live and r.checksum_match for r in moved)
    st = read_counter(runtime.read_state(sink))
    assert (st.count, st.sum, st.fifo_errors) == (300, total, 0)


def test_a_step_waits_for_the_step_of_another_thread(runtime):
    """While one thread's step is inside a step listener, another thread's step() does
    not start (it would hand its batches to the router first): it waits its turn,
    or gives up after its timeout with vkmulti.TimeoutError naming the other step."""
    counter(runtime, "k", device=0)
    inside, release = threading.Event(), threading.Event()
    calls = []

    def listener(batches):
        calls.append(threading.get_ident())
        if len(calls) == 1:
            inside.set()
            release.wait(30)
    runtime.add_step_listener(listener)
    first = threading.Thread(target=runtime.step, daemon=True)
    first.start()
    assert inside.wait(30)
    with pytest.raises(VkmTimeout, match="another thread"):
        runtime.step(timeout=0.2)
    assert len(calls) == 1          # the second call ran no step
    done = []
    second = threading.Thread(target=lambda: done.append(runtime.step(timeout=30)), daemon=True)
    second.start()
    second.join(0.3)
    assert not done                 # still waiting for the first
    release.set()
    first.join(30)
    second.join(30)
    assert len(done) == 1 and len(calls) == 2
    runtime.remove_step_listener(listener)


def test_a_step_listener_may_step_again_on_its_own_thread(runtime):
    """The turn is re-entrant: a listener that calls step() on the stepping thread
    does not wait for itself."""
    k = counter(runtime, "k", device=0)
    depth = []

    def listener(batches):
        if not depth:
            depth.append(1)
            runtime.step(k, timeout=5)
    runtime.add_step_listener(listener)
    runtime.step(k, timeout=5)
    runtime.remove_step_listener(listener)
    runtime.synchronize(10)
    assert k.steps == 2
