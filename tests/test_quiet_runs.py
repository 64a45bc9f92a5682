"""run(steps=N)'s native path: the quiet steps of its kernels recorded and submitted in
C (engine/stepper.py's quiet_run), read back only where a step was not quiet. What a
step promises holds there too: every step runs once and is counted, a step that sends
stops the native run and its messages arrive once, host messages sent meanwhile are
delivered, Ctrl-C and destroys stop it with the steps submitted standing, a launch,
a destroy or a migration between two runs records the new shape."""
from __future__ import annotations

import _thread
import functools
import shutil
import threading
import time

import numpy as np
import pytest

import kernel_support
from kernel_support import runtime_fixture, sigint_raises  # noqa: F401 (a fixture)
from vkmulti import KernelCodeSource
from vkmulti._core import _native
from vkmulti.errors import DestroyedError, KernelNotFoundError
from vkmulti.kernels import KernelSpec
from vkmulti.kernels.reference import COUNTER_TAG_ADD, read_counter
from vkmulti.kernels.engine import stepper
from vkmulti.kernels.runtime import stepping

pytestmark = pytest.mark.skipif(shutil.which("glslc") is None, reason="needs glslc to build the test kernel")

MAX = 32
runtime = runtime_fixture(max_kernels=MAX)
counter = functools.partial(kernel_support.counter, max_sources=MAX)

#: Counts its steps in state word 0 and its step numbers' sum in word 1; at step params[1]
#: (when params[2] is 1) it sends its step number to params[0] (0: the host) with tag 7.
TIMER = """
#version 450
#extension GL_GOOGLE_include_directive : require
#include "vkm_kernel_abi.glsl"
layout(local_size_x = 1) in;
layout(std430, set = 0, binding = 2) buffer State { uint words[]; } state;
void main() {
    state.words[0] += 1u;
    state.words[1] += vkm_step.step_lo;
    if (vkm_step.params[2] != 1u || vkm_step.step_lo != vkm_step.params[1])
        return;
    uint m = vkm_emit_at(0u, vkm_step.params[0], 7u, 4u);
    vkm_set_payload(m, 0u, vkm_step.step_lo);
    vkm_outbox_set_count(1u);
}
"""


@pytest.fixture(scope="module")
def timer_code():
    return KernelCodeSource.from_glsl(TIMER).code


def timer(rt, name, device, code, *, to=0, at=0, send=False):
    return rt.launch(KernelSpec("timer", code, state_sizes=(16,)), name, device=device, params=[to, at, int(send)])


def timer_state(rt, k):
    words = np.frombuffer(rt.read_state(k), np.uint32)
    return int(words[0]), int(words[1])


class NativeSpy:
    """Counts the native runs, the steps they submitted and what they stopped at."""

    def __init__(self, monkeypatch):
        self.calls, self.steps, self.results = 0, 0, []
        real = _native.run_quiet_steps

        def spy(runs, steps, budget):
            out = real(runs, steps, budget)
            self.calls += 1
            self.steps += sum(r.submitted for r in runs)
            self.results.append(out[0])
            return out
        monkeypatch.setattr(_native, "run_quiet_steps", spy)


@pytest.fixture
def spy(monkeypatch):
    return NativeSpy(monkeypatch)


def test_a_quiet_run_goes_native_and_every_step_runs_once(runtime, timer_code, spy):
    a, b = timer(runtime, "a", 0, timer_code), timer(runtime, "b", 1, timer_code)
    c = counter(runtime, "c", device=1)
    n = 300
    ticket = runtime.run(n, [a, b, c])
    ticket.wait(60)
    runtime.synchronize(60)
    assert spy.calls > 0 and spy.steps >= 2 * (n - 10)   # (all but the first few native, on two devices)
    assert ticket.steps == n and ticket.launched == {"a": n, "b": n, "c": n}
    for k in (a, b):
        assert k.steps == n and k.stats.steps_submitted == n and k.stats.steps_completed == n
        assert timer_state(runtime, k) == (n, n * (n - 1) // 2)   # each step once, with its own number
        assert k.stats.clock.physical_us > 0
    assert c.stats.steps_completed == n
    clock = a.stats.clock
    runtime.run(40, [a]).wait(60)
    runtime.synchronize(60)
    assert a.stats.clock > clock and timer_state(runtime, a) == (n + 40, (n + 40) * (n + 39) // 2)


def test_runs_that_wait_by_naps_run_every_step_once_and_learn_the_pace(runtime, timer_code, spy, monkeypatch):
    monkeypatch.setattr(stepper, "RUN_NAPS", True)
    a, b = timer(runtime, "a", 0, timer_code), timer(runtime, "b", 1, timer_code)
    n = 300
    runtime.run(n, [a, b]).wait(60)
    runtime.synchronize(60)
    assert spy.steps >= 2 * (n - 10)
    for k in (a, b):
        assert k.steps == n and k.stats.steps_completed == n
        assert timer_state(runtime, k) == (n, n * (n - 1) // 2)
        assert 0 < runtime._device(k.device_index)[1].pace_ns < 10**9   # (learnt from the waits: the device's pace)


def test_native_and_python_runs_leave_the_same_state(runtime, timer_code, monkeypatch):
    out = []
    for native in (False, True):
        monkeypatch.setattr(stepping, "QUIET_RUNS", native)
        k = timer(runtime, f"k{native}", 0, timer_code)
        runtime.run(97, k).wait(60)
        runtime.synchronize(60)
        out.append((timer_state(runtime, k), k.stats.steps_completed, k.steps))
        k.destroy()
    assert out[0] == out[1] == ((97, 97 * 96 // 2), 97, 97)


def test_a_step_that_sends_stops_the_native_run_and_its_messages_arrive_once(runtime, timer_code, spy,
                                                                              monkeypatch):
    # (native runs long enough that a sending step is followed by its region's reuse in the same run,
    # on a slow machine too: else the run may end first and hand that step over as its last)
    monkeypatch.setattr(stepping, "QUIET_RUN_BUDGET", 5.0)
    sink = counter(runtime, "sink", device=0)
    to_host = timer(runtime, "to_host", 0, timer_code, to=0, at=150, send=True)
    to_sink = timer(runtime, "to_sink", 0, timer_code, to=sink.address, at=220, send=True)
    other = timer(runtime, "other", 1, timer_code)
    runtime.run(400, [sink, to_host, to_sink, other]).wait(60)
    runtime.synchronize(60)
    assert _native.RUN_NOT_QUIET in spy.results
    msgs = [runtime.receive(to_host, timeout=10)]
    assert msgs[0].tag == 7 and int(np.frombuffer(msgs[0].payload, np.uint32)[0]) == 150
    assert runtime.pending_receives(to_host) == 0   # once
    st = read_counter(runtime.read_state(sink))
    assert st.count == 1 and st.sum == 220
    for k in (to_host, to_sink, other):   # (a step held back while a batch waits is one it did not run)
        n = k.stats.steps_completed
        assert timer_state(runtime, k) == (n, n * (n - 1) // 2) and n == k.steps and n >= 395
    assert to_host.stats.messages_to_host == 1 and to_sink.stats.messages_sent == 1


def test_host_messages_sent_during_a_native_run_are_delivered_once(runtime, spy):
    k = counter(runtime, "k", device=0)
    other = counter(runtime, "other", device=1)
    stop = threading.Event()
    sent: list[int] = []

    def sender():
        i = 1
        while not stop.is_set():
            runtime.send(k, np.array([i], np.uint32), tag=COUNTER_TAG_ADD, timeout=30)
            sent.append(i)
            i += 1
            time.sleep(0.002)
    t = threading.Thread(target=sender, daemon=True)
    t.start()
    try:
        for _ in range(20):
            runtime.run(100, [k, other]).wait(60)
    finally:
        stop.set()
        t.join(30)
    runtime.run(5, [k, other]).wait(60)
    runtime.synchronize(60)
    st = read_counter(runtime.read_state(k))
    assert spy.steps > 0
    assert (st.count, st.sum) == (len(sent), sum(sent))


def test_ctrl_c_stops_a_native_run_and_the_steps_submitted_stand(runtime, timer_code, spy, sigint_raises):
    k = timer(runtime, "k", 0, timer_code)

    def ctrl_c():
        deadline = time.monotonic() + 30
        while spy.steps < 50 and time.monotonic() < deadline:
            time.sleep(0.005)
        _thread.interrupt_main()
    t = threading.Thread(target=ctrl_c, daemon=True)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        runtime.run(10**8, k)
    t.join(30)
    runtime.synchronize(30)
    done = k.stats.steps_completed
    assert 50 <= done == k.steps < 10**8
    assert timer_state(runtime, k) == (done, done * (done - 1) // 2)
    runtime.run(3, k).wait(30)
    runtime.synchronize(30)
    assert k.stats.steps_completed == done + 3 and timer_state(runtime, k)[0] == done + 3


def _in_thread(fn, done=None):
    """fn() on a daemon thread: (the thread, the exceptions it raised); `done` set when it ends."""
    out: list[BaseException] = []

    def guarded():
        try:
            fn()
        except BaseException as exc:   # reported by the test
            out.append(exc)
        finally:
            if done is not None:
                done.set()
    t = threading.Thread(target=guarded, daemon=True)
    t.start()
    return t, out


def _run_in_thread(runtime, kernels):
    return _in_thread(lambda: runtime.run(10**8, kernels))


def _wait_native(spy, steps=50):
    deadline = time.monotonic() + 30
    while spy.steps < steps and time.monotonic() < deadline:
        time.sleep(0.005)
    assert spy.steps >= steps


def test_ctrl_c_noted_while_a_native_run_stops_at_a_step_that_sent_keeps_the_count(runtime, timer_code, monkeypatch,
                                                                                   sigint_raises):
    """A Ctrl-C that comes while the C loop runs (without the GIL) is only noted there; the
    loop then stops at a step that sent: the steps it submitted are counted before the
    KeyboardInterrupt is raised, and the runtime goes on with every step once."""
    real = _native.run_quiet_steps
    calls = []

    def ctrl_c_during_the_loop(runs, steps, budget):
        if not calls:
            def ctrl_c():
                while runs[0].submitted == 0:
                    time.sleep(0)
                _thread.interrupt_main()
            threading.Thread(target=ctrl_c, daemon=True).start()
        calls.append(1)
        return real(runs, steps, budget)
    monkeypatch.setattr(_native, "run_quiet_steps", ctrl_c_during_the_loop)
    k = timer(runtime, "k", 0, timer_code, to=0, at=5, send=True)
    with pytest.raises(KeyboardInterrupt):
        runtime.run(40, k)
    monkeypatch.setattr(_native, "run_quiet_steps", real)
    runtime.synchronize(30)
    assert timer_state(runtime, k)[0] == k.steps > 0
    runtime.run(5, k).wait(30)
    runtime.synchronize(30)
    n = k.steps
    assert timer_state(runtime, k) == (n, n * (n - 1) // 2) and k.stats.steps_completed == n
    assert runtime.receive(k, timeout=10).tag == 7 and runtime.pending_receives(k) == 0


def test_a_native_submit_that_fails_on_a_later_device_is_raised(runtime, monkeypatch):
    """The C loop submits each step device by device: where device 1's submit fails after
    device 0's went (RUN_FAILED, its StepRun's result), the run raises the failure, as a
    step() does, instead of counting a step that device 1 never made."""
    from vkmulti.errors import VkmError

    real = _native.run_quiet_steps

    class Failed:
        result = -2   # VK_ERROR_OUT_OF_DEVICE_MEMORY

        def __init__(self, run):
            self._run = run

        def __getattr__(self, name):
            return getattr(self._run, name)

    def device_1_fails(runs, steps, budget):
        if len(runs) < 2:
            return real(runs, steps, budget)
        real(runs[:1], 1, budget)   # device 0 submits its step ...
        runs[1] = Failed(runs[1])   # ... device 1's submit of it fails
        return _native.RUN_FAILED, 1, None
    monkeypatch.setattr(_native, "run_quiet_steps", device_1_fails)
    a, b = counter(runtime, "a", device=0), counter(runtime, "b", device=1)
    with pytest.raises(VkmError, match="OUT_OF_DEVICE_MEMORY"):
        runtime.run(20, [a, b])
    monkeypatch.setattr(_native, "run_quiet_steps", real)
    runtime.synchronize(30)
    assert a.stats.steps_completed == a.steps and b.stats.steps_completed == b.steps
    runtime.run(10, [a, b]).wait(30)
    runtime.synchronize(30)
    assert a.stats.steps_completed == a.steps and b.stats.steps_completed == b.steps


def test_destroying_a_kernel_of_a_native_run_stops_it_with_a_typed_error(runtime, timer_code, spy):
    a, b = timer(runtime, "a", 0, timer_code), timer(runtime, "b", 1, timer_code)
    t, out = _run_in_thread(runtime, [a, b])
    _wait_native(spy)
    b.destroy()
    t.join(60)
    assert not t.is_alive()
    assert len(out) == 1 and isinstance(out[0], (DestroyedError, KernelNotFoundError)), out
    runtime.synchronize(30)
    done = a.stats.steps_completed
    assert timer_state(runtime, a) == (done, done * (done - 1) // 2)
    runtime.run(2, a).wait(30)


def test_destroying_the_runtime_races_a_native_run(runtime, timer_code, spy):
    k = timer(runtime, "k", 0, timer_code)
    t, out = _run_in_thread(runtime, k)
    _wait_native(spy)
    runtime.destroy(timeout=30)
    t.join(60)
    assert not t.is_alive()
    assert len(out) == 1 and isinstance(out[0], DestroyedError), out


def test_a_slot_reused_between_runs_records_the_new_kernel(runtime, timer_code, spy):
    """A kernel destroyed between two runs and another launched in its place (its local
    slot, its descriptor pool's room): the next run's steps bind the new kernel's sets."""
    a, b = timer(runtime, "a", 0, timer_code), timer(runtime, "b", 0, timer_code)
    runtime.run(60, [a, b]).wait(60)
    b.destroy()
    c = timer(runtime, "c", 0, timer_code)
    runtime.run(70, [a, c]).wait(60)
    runtime.synchronize(60)
    assert spy.steps >= 100
    assert timer_state(runtime, a) == (130, 130 * 129 // 2)
    assert timer_state(runtime, c) == (70, 70 * 69 // 2)


def test_migrating_a_kernel_while_a_native_run_steps_it(runtime, timer_code, spy):
    """A migration waits for the run's turn to end and moves the kernel between two
    native runs; the run goes on with it on its new device, no step lost or repeated."""
    k = timer(runtime, "k", 0, timer_code)
    other = timer(runtime, "other", 1, timer_code)
    done = threading.Event()

    def mover():
        _wait_native(spy)
        for i in range(4):
            runtime.migrate(k, 1 - k.device_index, timeout=60)
            time.sleep(0.01)
    t, errors = _in_thread(mover, done)
    runs = 0
    while not done.is_set() and runs < 2000:
        runtime.run(50, [k, other]).wait(60)
        runs += 1
    t.join(60)
    assert errors == [] and done.is_set()
    runtime.run(50, [k, other]).wait(60)
    runtime.synchronize(60)
    n = k.stats.steps_completed
    assert n == k.steps and k.device_index == 0   # (a step of it held back by a move is not one it ran)
    assert other.stats.steps_completed == 50 * (runs + 1)
    assert timer_state(runtime, k) == (n, n * (n - 1) // 2)


@pytest.mark.parametrize("sink_device", [1, 0], ids=["one device", "across devices"])
def test_bursts_between_native_runs_with_a_router_attached_arrive_once_and_in_order(runtime, spy, sink_device):
    """A router attached (a step listener with a quiet hook, the outbox feed): forwarders on
    GPU 1 relay bursts of host messages to one sink; between the bursts the kernels are
    quiet and the runs go native, the router seeing the last batches of each native run.
    Across devices every step's batch lands in place on the other device before anyone
    knows it is empty: once the senders have been idle, run() lets those landings settle."""
    from vkmulti import CrossGpuK2KRouter
    from vkmulti.kernels.reference import COUNTER_TAG_FORWARD

    router = CrossGpuK2KRouter(runtime.coordinator, runtime)
    try:
        sink = counter(runtime, "sink", device=sink_device, inbox=4)
        fwd = [counter(runtime, f"fwd{i}", device=1, params=[sink.address]) for i in range(3)]
        ks = [sink, *fwd]
        total = count = 0
        for burst in range(3):
            before = spy.steps
            for i in range(12):
                for j, f in enumerate(fwd):
                    runtime.send(f, np.array([1000 * j + 100 * burst + i], np.uint32), tag=COUNTER_TAG_FORWARD,
                                 timeout=30)
                    total += 1000 * j + 100 * burst + i
                    count += 1
            for _ in range(100):
                runtime.run(30, ks).wait(30)
                if read_counter(runtime.read_state(sink)).count >= count and spy.steps > before:
                    break
            assert spy.steps > before   # (quiet again: native steps)
        before = spy.steps
        runtime.run(200, ks).wait(30)   # (idle: nearly every step native, on each device)
        assert spy.steps - before >= 150 * len({k.device_index for k in ks})
        runtime.synchronize(30)
        st = read_counter(runtime.read_state(sink))
        assert (st.count, st.sum, st.fifo_errors) == (count, total, 0)
        assert router.idle() and router.stats().routing_failures == 0
        for k in ks:
            assert k.stats.steps_completed == k.steps
    finally:
        router.detach()


def test_kernels_destroyed_by_another_thread_while_runs_route_across_devices(runtime, spy):
    """A thread destroys idle kernels while run() steps them with a forwarder's messages
    crossing devices: a batch whose sender is destroyed while the router gathers or lands
    it is dropped with it (its outbox is freed only once a copy from it is tracked), the
    others arrive once and in order, and nothing counts as a routing failure."""
    import random

    from vkmulti import CrossGpuK2KRouter
    from vkmulti.errors import DestroyedError, KernelNotFoundError
    from vkmulti.kernels.reference import COUNTER_TAG_FORWARD

    rng = random.Random(9)
    router = CrossGpuK2KRouter(runtime.coordinator, runtime)
    try:
        sink = counter(runtime, "sink", device=0, inbox=4)
        fwd = counter(runtime, "fwd", device=1, params=[sink.address])
        count = total = 0
        t0 = time.monotonic()
        rounds = 0
        while time.monotonic() - t0 < 4:
            rounds += 1
            idle = [counter(runtime, f"i{rounds}_{j}", device=j % 2) for j in range(4)]
            for v in range(rng.randint(0, 5)):
                runtime.send(fwd, np.array([rounds * 10 + v], np.uint32), tag=COUNTER_TAG_FORWARD, timeout=30)
                count, total = count + 1, total + rounds * 10 + v

            def destroy(victims=idle[:3]):
                for k in victims:
                    time.sleep(rng.random() * 0.01)
                    runtime.destroy_kernel(k)
            t = threading.Thread(target=destroy)
            t.start()
            live = [sink, fwd, *idle]
            while t.is_alive():
                try:
                    runtime.run(rng.randint(1, 60), live)
                except (DestroyedError, KernelNotFoundError):
                    live = [k for k in live if not k.destroyed]
            t.join(60)
            runtime.run(30, [k for k in live if not k.destroyed])
            runtime.destroy_kernel(idle[3])
        for _ in range(400):
            runtime.run(20, [sink, fwd]).wait(30)
            if read_counter(runtime.read_state(sink)).count >= count:
                break
        runtime.synchronize(30)
        st = read_counter(runtime.read_state(sink))
        assert (st.count, st.sum, st.fifo_errors) == (count, total, 0) and rounds > 3
        assert router.stats().routing_failures == 0
    finally:
        router.detach()


def test_a_hot_reload_swaps_between_native_runs(runtime, timer_code, spy):
    """A thread runs the kernel natively; a hot reload (preserving its state) swaps in
    code that also counts its steps in word 2 between two native runs; the runs go on
    natively with the new code, every step once."""
    from vkmulti import HotReloadConfig, HotReloadManager

    k = timer(runtime, "k", 0, timer_code)
    new = KernelCodeSource.from_glsl(TIMER.replace("state.words[0] += 1u;",
                                                   "state.words[0] += 1u; state.words[2] += 1u;"))
    reloads = HotReloadManager(HotReloadConfig().with_preserve_state(True).with_validate_before_swap(False)
                               .with_timeout(60.0))
    reloads.register_runtime_kernel(k)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            runtime.run(40, k).wait(60)
    t, errors = _in_thread(loop)
    try:
        _wait_native(spy)
        result = reloads.reload(k, new)
        after = spy.steps
        _wait_native(spy, after + 100)
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive() and errors == []
    assert result.state_preserved and result.new_version == result.old_version + 1, result
    runtime.synchronize(60)
    n = k.stats.steps_completed
    words = np.frombuffer(runtime.read_state(k), np.uint32)
    assert (int(words[0]), int(words[1])) == (n, n * (n - 1) // 2) and n == k.steps
    assert 100 <= int(words[2]) < n   # the steps since the swap, with the new code


def test_the_native_run_refuses_bad_plans_and_leaves_the_runtime_usable(runtime, timer_code):
    """StepRun and run_quiet_steps check every part of a plan before any use: records,
    stamps, words and clocks inside their arrays; a bad one is a typed error."""
    k = timer(runtime, "k", 0, timer_code)
    runtime.run(5, k).wait(30)
    ctx = k.ctx
    stepper = runtime._device(0)[1]
    with ctx.lock:
        good = stepper.quiet_run([k], time.monotonic() + 30)
        assert good is not None
        ops, patches, offsets = stepper.recorder.quiet_template([k], 0, 0)
    words = k.k2h.words
    d = ctx.in_flight
    cmds = list(ctx.cmd_ints)
    tl = ctx.timeline

    def plan(**change):
        t = {"ops": ops, "patches": patches, "checks": [(words, 0)], "captures": [(words, 6, 0)]}
        t.update(change)
        templates = change.pop("templates", [(t["ops"], t["patches"], t["checks"], t["captures"])] * d)
        args = {"cmds": cmds, "region0": 0, "timeline": tl, "templates": templates, "kernels": 1}
        args.update({key: v for key, v in change.items() if key in args})
        return _native.StepRun(ctx.slot.native, ctx.queue_lock, args["timeline"], args["cmds"], args["region0"],
                               ctx.value, ctx.value, args["templates"], args["kernels"])

    plan()   # (the good plan: made, never run)
    bad = [
        ({"cmds": []}, ValueError, "1 to"),
        ({"cmds": cmds * 4}, ValueError, "1 to"),
        ({"templates": []}, ValueError, "a template each"),
        ({"region0": d}, ValueError, "region0"),
        ({"timeline": 0}, ValueError, "timeline"),
        ({"ops": ops[:-1]}, ValueError, "whole records"),
        ({"ops": b""}, ValueError, "whole records"),
        ({"ops": ops[:OP] + b"\x07" + ops[OP + 1:]}, ValueError, "unknown operation kind"),
        ({"patches": [(0, patches[0][1], 0)]}, ValueError, "not a pass"),
        ({"patches": [(patches[0][0], 10**6, 0)]}, ValueError, "not one of"),
        ({"patches": [(-1, patches[0][1], 0)]}, ValueError, "not one of"),
        ({"checks": [(words, len(words))]}, ValueError, "outside"),
        ({"checks": [(words, -1)]}, ValueError, "outside"),
        ({"checks": [(np.zeros(4, np.float64), 0)]}, ValueError, "dtype"),
        ({"captures": [(words, len(words) - 2, 0)]}, ValueError, "outside"),
        ({"checks": [(words, 2**63 - 1)]}, ValueError, "outside"),   # (index + count wrapped: passed)
        ({"captures": [(words, 2**63 - 2, 0)]}, ValueError, "outside"),
        ({"captures": [(words, 6, 1)]}, ValueError, "kernel 1"),
        ({"kernels": 0, "captures": [(words, 6, 0)]}, ValueError, "kernel 0"),
    ]
    for change, error, text in bad:
        with pytest.raises(error, match=text):
            plan(**change)
    with pytest.raises(ValueError, match="at least one"):
        _native.run_quiet_steps([], 5, 0.01)
    with pytest.raises(ValueError, match="budget"):
        _native.run_quiet_steps([plan()], 5, 0.0)
    with pytest.raises(TypeError):
        _native.run_quiet_steps([object()], 5, 0.01)
    with pytest.raises(ValueError, match="not one of"):
        plan().clock(1)
    with pytest.raises(ValueError, match="at most"):
        plan(kernels=0x55555556)   # (3 clock words a kernel: a count that wraps 32 bits)

    class Emptying:   # a command buffer whose conversion empties the list it came in (caller code, mid-loop)
        def __index__(self):
            evil.clear()
            return cmds[0]
        __int__ = __index__
    evil = [Emptying(), *cmds[1:]]
    plan(cmds=evil)   # (read from a snapshot: made as given; the list's items were read past its end)
    made = plan()
    with pytest.raises(RuntimeError, match="made once"):
        made.__init__(ctx.slot.native, ctx.queue_lock, tl, cmds, 0, ctx.value, ctx.value,
                      [(ops, patches, [(words, 0)], [(words, 6, 0)])] * d, 1)
    with pytest.raises(ValueError, match="not made"):
        _native.run_quiet_steps([_native.StepRun.__new__(_native.StepRun)], 5, 0.01)
    runtime.run(5, k).wait(30)
    runtime.synchronize(30)
    assert k.stats.steps_completed == 10 and timer_state(runtime, k) == (10, 45)


def test_a_native_run_keeps_its_step_runs_when_another_thread_empties_the_list(runtime, timer_code):
    """Before: run_quiet_steps kept pointers into the StepRuns of `runs` across its calls
    without the GIL and no reference of its own; another thread emptying the list freed a
    StepRun under the loop (its memory reused: a crash). Now the run holds them to the end."""
    import vulkan as vk

    k = timer(runtime, "k", 0, timer_code)
    runtime.run(5, k).wait(30)
    runtime.synchronize(30)
    ctx = k.ctx
    nat = ctx.slot.native
    stepper = runtime._device(0)[1]
    with ctx.lock:
        ops, patches, _ = stepper.recorder.quiet_template([k], 0, 0)
    sem = nat.create_timeline(0)   # never raised: the first step waits for room until the budget is spent
    zero = np.zeros(4, np.uint32)
    runs = [_native.StepRun(nat, ctx.queue_lock, sem, list(ctx.cmd_ints), 0, 1000, 0,
                            [(ops, patches, [(zero, 0)], [])] * ctx.in_flight, 1)]
    junk = []

    def empty():
        time.sleep(0.2)
        runs.clear()   # (the last reference), then the freed memory is reused
        junk.extend(bytearray(b"\x41" * n) for n in range(200, 4000, 8) for _ in range(4))
    t, errors = _in_thread(empty)
    try:
        rc, at, exc = _native.run_quiet_steps(runs, 10, 1.5)
    finally:
        t.join(60)
        vk.vkDestroySemaphore(ctx.slot.device, vk.ffi.cast("VkSemaphore", sem), None)
    assert (rc, at, exc) == (_native.RUN_STALLED, 0, None) and errors == []


OP = _native.STEP_OP_BYTES


def test_a_gpu_lost_during_a_native_run_fails_over_and_the_run_goes_on(manager, runtime, timer_code, spy):
    """The loss surfaces in the native loop (a failed wait or submit): the run hands over
    to a step, which releases the lost GPU's kernel; the survivor's steps go on, natively
    again, every one once."""
    from vkmulti.testing import lose_device

    a, b = timer(runtime, "a", 0, timer_code), timer(runtime, "b", 1, timer_code)
    ticket = [None]

    def loop():
        ticket[0] = runtime.run(3000, [a, b])
    t, errors = _in_thread(loop)
    _wait_native(spy, 200)
    lose_device(manager, 1)
    lost_at = spy.steps
    t.join(120)
    assert not t.is_alive() and errors == []
    assert runtime.lost_kernels == {"b": 1}
    assert ticket[0].steps == 3000 and ticket[0].launched["a"] == 3000
    assert spy.steps > lost_at   # (native again after the loss)
    runtime.synchronize(60)
    assert a.stats.steps_completed == 3000 and timer_state(runtime, a) == (3000, 3000 * 2999 // 2)


def test_native_runs_across_devices_while_another_thread_reads_the_router_stats(runtime):
    """router.stats() / idle() take the delivery lock, then device locks (a reap polls every
    device); a native run asks the router's OutboxFeed.quiet with its devices' locks held.
    The two must not wait for each other (a lock-order inversion hung here for good)."""
    from vkmulti import CrossGpuK2KRouter

    import faulthandler

    router = CrossGpuK2KRouter(runtime.coordinator, runtime)
    faulthandler.dump_traceback_later(150, exit=True)   # (a deadlock also hangs the teardown: end with the stacks)
    try:
        ks = [counter(runtime, "a", device=0), counter(runtime, "b", device=1)]
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                router.stats()
                router.idle()
        t = threading.Thread(target=poll, daemon=True)
        t.start()
        try:
            done = threading.Event()

            def runs():
                for _ in range(300):
                    runtime.run(50, ks).wait(30)
                done.set()
            r = threading.Thread(target=runs, daemon=True)
            r.start()
            r.join(120)
            assert done.is_set(), "run() and router.stats() deadlocked (device locks vs the delivery lock)"
        finally:
            stop.set()
            t.join(30)
    finally:
        faulthandler.cancel_dump_traceback_later()
        router.detach()
