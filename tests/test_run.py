"""KernelRuntime.run(steps=N): N steps in one call and one ticket, with everything a
step promises: exactly once and FIFO per pair with messages in flight across devices,
migrations, launches and destroys between two steps, Ctrl-C stopping it between steps
(the runtime stays usable), destroy racing it."""
from __future__ import annotations

import _thread
import functools
import threading
import time

import numpy as np
import pytest

import kernel_support
from kernel_support import router  # noqa: F401 (the shared router fixture)
from kernel_support import runtime_fixture, sigint_raises  # noqa: F401 (a fixture)
from vkmulti.errors import DestroyedError, KernelNotFoundError
from vkmulti.kernels import RunTicket
from vkmulti.kernels.reference import COUNTER_TAG_FORWARD, read_counter

MAX = 32
runtime = runtime_fixture(max_kernels=MAX)
counter = functools.partial(kernel_support.counter, max_sources=MAX)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4", None])
def test_run_refuses_a_step_count_that_is_not_a_positive_int(runtime, bad):
    k = counter(runtime, "k", device=0)
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        runtime.run(bad)
    assert runtime.run(2, k).steps == 2   # still usable


def test_one_ticket_for_the_run(runtime):
    a, b = counter(runtime, "a", device=0), counter(runtime, "b", device=1)
    ticket = runtime.run(7, [a, b])
    assert isinstance(ticket, RunTicket) and ticket.steps == 7
    assert ticket.launched == {"a": 7, "b": 7} and ticket.deferred == []
    assert sorted(ticket.points) == [0, 1]
    ticket.wait(30)
    assert ticket.done()
    runtime.synchronize(30)
    assert a.stats.steps_completed == 7 and b.stats.steps_completed == 7
    assert "RunTicket(steps=7" in repr(ticket)


def test_run_keeps_exactly_once_and_fifo_with_messages_in_flight_across_devices(runtime, router):
    """Four forwarders (two per GPU) send to one sink with a small inbox; the host's
    messages are all queued first, then run() steps until the sink has them all."""
    sink = counter(runtime, "sink", device=0, inbox=4)
    fwd = [counter(runtime, f"fwd{i}", device=i % 2, params=[sink.address]) for i in range(4)]
    total = 0
    for i in range(60):
        for j, f in enumerate(fwd):
            runtime.send(f, np.array([1000 * j + i], np.uint32), tag=COUNTER_TAG_FORWARD, timeout=30)
            total += 1000 * j + i
    for _ in range(200):
        runtime.run(10).wait(30)
        if read_counter(runtime.read_state(sink)).count >= 240:
            break
    runtime.synchronize(30)
    st = read_counter(runtime.read_state(sink))
    assert (st.count, st.sum, st.fifo_errors) == (240, total, 0)


def test_launch_destroy_and_migrate_between_the_steps_of_a_run(runtime, router):
    """Another thread launches, destroys and migrates kernels while run() steps them all
    (kernels=None: each step takes the live kernels of its moment)."""
    sink = counter(runtime, "sink", device=0, inbox=4)
    src = counter(runtime, "src", device=1, params=[sink.address])
    errors: list[BaseException] = []
    stop = threading.Event()

    def churn():
        try:
            for i in range(6):
                extra = counter(runtime, f"extra{i}", device=i % 2, params=[sink.address])
                runtime.run(2)
                extra.destroy()
                runtime.migrate(src, 1 - src.device_index, timeout=60)
        except BaseException as exc:   # reported by the test
            errors.append(exc)
        finally:
            stop.set()
    t = threading.Thread(target=churn, daemon=True)
    t.start()
    total = 0
    for i in range(80):
        runtime.send(src, np.array([i], np.uint32), tag=COUNTER_TAG_FORWARD, timeout=30)
        total += i
        runtime.run(3)
    t.join(120)
    assert not t.is_alive() and errors == []
    for _ in range(100):
        runtime.run(5).wait(30)
        if read_counter(runtime.read_state(sink)).count >= 80:
            break
    st = read_counter(runtime.read_state(sink))
    assert (st.count, st.sum, st.fifo_errors) == (80, total, 0)


def test_ctrl_c_stops_a_run_between_two_steps(runtime, sigint_raises):
    """A KeyboardInterrupt (Ctrl-C) during run() ends it; the steps submitted stand
    and the runtime goes on."""
    k = counter(runtime, "k", device=0)
    seen = threading.Event()
    calls = [0]

    def listener(batches):
        calls[0] += 1
        if calls[0] == 5:
            seen.set()

    sent: list[float] = []

    def ctrl_c():
        if seen.wait(30):
            sent.append(time.monotonic())
            _thread.interrupt_main()   # as Ctrl-C: SIGINT's handler runs in the main thread
    runtime.add_step_listener(listener, retain=False)
    t = threading.Thread(target=ctrl_c, daemon=True)
    t.start()
    start = time.monotonic()
    try:
        runtime.run(100000, k)
    except KeyboardInterrupt:
        pass
    else:   # (what happened, for a failure that is rare)
        when = f"sent {sent[0] - start:.3f} s after the start" if sent else "never sent"
        pytest.fail(f"run() ended without KeyboardInterrupt after {time.monotonic() - start:.1f} s: "
                    f"{calls[0]} step listener calls, {k.stats.steps_submitted} steps submitted, interrupt {when}")
    t.join(30)
    assert seen.is_set()
    runtime.synchronize(30)
    done = k.stats.steps_completed
    assert 5 <= done < 100000
    runtime.run(3, k).wait(30)
    assert k.stats.steps_completed == done + 3


def test_destroying_a_kernel_of_a_run_stops_it_with_a_typed_error(runtime):
    a, b = counter(runtime, "a", device=0), counter(runtime, "b", device=1)
    out: list[BaseException] = []
    started = threading.Event()
    runtime.add_step_listener(lambda batches: started.set(), retain=False)

    def loop():
        try:
            runtime.run(1_000_000, [a, b])
        except BaseException as exc:   # reported by the test
            out.append(exc)
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    assert started.wait(30)
    b.destroy()
    t.join(60)
    assert not t.is_alive()
    assert len(out) == 1 and isinstance(out[0], (DestroyedError, KernelNotFoundError)), out
    runtime.run(2, a).wait(30)   # the rest goes on


def test_destroying_the_runtime_races_a_run(runtime):
    k = counter(runtime, "k", device=0)
    out: list[BaseException] = []
    started = threading.Event()
    runtime.add_step_listener(lambda batches: started.set(), retain=False)

    def loop():
        try:
            runtime.run(1_000_000, k)
        except BaseException as exc:   # reported by the test
            out.append(exc)
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    assert started.wait(30)
    runtime.destroy(timeout=30)
    t.join(60)
    assert not t.is_alive()
    assert len(out) == 1 and isinstance(out[0], DestroyedError), out
    with pytest.raises(DestroyedError):
        runtime.run(1)


class _InterruptAfterSubmit:
    """A device context's StepCommands whose next submit is accepted by the driver,
    then interrupted (KeyboardInterrupt) before the stepper hears of it."""

    def __init__(self, real):
        self.real, self.armed = real, True

    def __getattr__(self, name):
        return getattr(self.real, name)

    def submit(self, *args):
        self.real.submit(*args)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt


def test_an_interrupt_right_after_a_submit_counts_the_step_as_submitted(runtime):
    from vkmulti.kernels.reference import COUNTER_TAG_ADD

    k = counter(runtime, "k", device=0)
    runtime.step(timeout=10)
    ctx = k.ctx
    before = k.steps
    ctx.step_cmds = _InterruptAfterSubmit(ctx.step_cmds)
    try:
        runtime.send(k, np.array([3], np.uint32), tag=COUNTER_TAG_ADD)
        with pytest.raises(KeyboardInterrupt):
            runtime.step(k, timeout=10)
        assert k.steps == before + 1   # it ran: its timeline value is not used again
        runtime.send(k, np.array([4], np.uint32), tag=COUNTER_TAG_ADD)
        runtime.step(k, timeout=10)
        runtime.synchronize(10)
    finally:
        ctx.step_cmds = ctx.step_cmds.real
    st = read_counter(runtime.read_state(k))
    assert (st.count, st.sum) == (2, 7)   # each message taken once
