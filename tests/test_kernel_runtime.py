"""KernelRuntime on the virtual GPU pair: launch, step, host queues, kernel-to-kernel
delivery on a device, back-pressure, typed errors, destroy races."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kernel_support import make_coordinator, runtime_fixture
from vkmulti import CrossGpuK2KRouter
from vkmulti.errors import (DestroyedError, KernelMessageError, KernelNotFoundError, QueueFullError,
                            TimeoutError)
from vkmulti import Buffer
from vkmulti.kernels import HOST_KERNEL_ID, K2KMessage, KernelRuntime, KernelSpec, counter_kernel, pingpong_kernel
from vkmulti.kernels.reference import (COUNTER_TAG_ADD, COUNTER_TAG_FORWARD, COUNTER_TAG_QUERY, COUNTER_TAG_REPLY,
                                       PING_DONE_TAG, counter_initial_state, read_counter, read_pingpong)

MAX = 64


runtime = runtime_fixture(max_kernels=MAX)


def counter(rt, name=None, *, device=0, inbox=64, outbox=64, **kw):
    return rt.launch(counter_kernel(max_sources=MAX, inbox_capacity=inbox, outbox_capacity=outbox), name,
                     device=device, state=[counter_initial_state(MAX)], **kw)


def words(*values):
    return np.array(values, np.uint32)


def query(rt, k, steps=1):
    """The counter's reply to a QUERY (count, sum, fifo_errors, step)."""
    rt.send(k, words(7), tag=COUNTER_TAG_QUERY)
    for _ in range(steps):
        rt.step(k)
    m = rt.receive(k, timeout=30)
    assert m.tag == COUNTER_TAG_REPLY and m.source_kernel == k.id and m.dest_kernel == HOST_KERNEL_ID
    w = np.frombuffer(m.payload, np.uint32)
    return int(w[0]), int(w[1]) | int(w[2]) << 32, int(w[3])


def test_counter_counts_exactly_across_steps_and_ring_wraps(runtime):
    k = counter(runtime, "c", inbox=4)
    values = list(range(1, 40))
    for v in values:   # 39 messages through a 4-slot inbox: the host queue drains 4 per step
        runtime.send(k, words(v), tag=COUNTER_TAG_ADD)
    steps = 0
    while k.h2k:
        runtime.step(k)
        steps += 1
    assert steps == 10
    count, total, fifo = query(runtime, k)
    assert (count, total, fifo) == (len(values) + 1, sum(values), 0)
    state = read_counter(runtime.read_state(k))
    assert state.count == 40 and state.sum == sum(values) and state.fifo_errors == 0 and state.queries == 1
    st = k.stats
    assert st.steps_completed == 11 and st.messages_consumed == 40 and st.messages_to_host == 1


def test_host_round_trip_keeps_order_sequence_and_causality(runtime):
    k = counter(runtime)
    sent = [runtime.send(k, words(i), tag=COUNTER_TAG_QUERY) for i in range(5)]
    assert [m.sequence for m in sent] == list(range(5))
    runtime.step(k)
    got = [runtime.receive(k, timeout=30) for _ in range(5)]
    assert [np.frombuffer(m.payload, np.uint32)[5] for m in got] == list(range(5))   # FIFO
    assert [m.sequence for m in got] == list(range(5))
    assert all(m.timestamp > s.timestamp for m, s in zip(got, sent))   # a reply is later than its cause
    assert [m.timestamp for m in got] == sorted(m.timestamp for m in got)
    assert runtime.hlc.current >= got[-1].timestamp


def test_receive_times_out_and_wakes_for_a_step_from_another_thread(runtime):
    k = counter(runtime)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="no message"):
        runtime.receive(k, timeout=0.2)
    assert time.monotonic() - t0 < 5
    runtime.send(k, words(1), tag=COUNTER_TAG_QUERY)
    timer = threading.Timer(0.3, lambda: runtime.step(k))
    timer.start()
    try:
        m = runtime.receive(k, timeout=30)
    finally:
        timer.join()
    assert m.tag == COUNTER_TAG_REPLY


def test_send_back_pressure(runtime):
    k = runtime.launch(counter_kernel(max_sources=MAX), device=0, state=[counter_initial_state(MAX)])
    k.h2k_capacity = 3
    for i in range(3):
        runtime.send(k, words(i), tag=COUNTER_TAG_ADD)
    with pytest.raises(QueueFullError, match="h2k_capacity 3"):
        runtime.send(k, words(9), tag=COUNTER_TAG_ADD)
    timer = threading.Timer(0.2, lambda: runtime.step(k))
    timer.start()
    try:
        runtime.send(k, words(3), tag=COUNTER_TAG_ADD, timeout=30)   # waits for the step to take the queue
    finally:
        timer.join()
    runtime.step(k)
    assert query(runtime, k)[:2] == (5, 6)


def test_k2h_queue_full_defers_the_kernel(runtime):
    k = counter(runtime)
    k.k2h_capacity = 2
    for i in range(3):
        runtime.send(k, words(i), tag=COUNTER_TAG_QUERY)
    runtime.step(k).wait(30)
    assert runtime.pending_receives(k) == 3
    ticket = runtime.step(k)
    assert ticket.launched == [] and ticket.deferred[0][0] is k and "receive" in ticket.deferred[0][1]
    for _ in range(3):
        runtime.receive(k, timeout=5)
    assert runtime.step(k).launched == [k]


def test_forward_between_kernels_on_one_device_is_exactly_once_and_fifo(runtime):
    b = counter(runtime, "b")
    a = counter(runtime, "a", params=[b.address])
    values = list(range(100, 160))
    for v in values:
        runtime.send(a, words(v), tag=COUNTER_TAG_FORWARD)
    ticket = runtime.step([a, b])
    ticket.wait(30)
    batch = a.outbox_batch(0)
    assert ticket.batches[0] is batch and batch.kernel is a and batch.device_index == 0
    assert batch.count == len(values) and batch.remote == 0 and batch.ready == ticket.points[0]
    assert batch.size == 64 + 64 * runtime.slot_size
    for _ in range(3):
        runtime.step([a, b])
    count, total, fifo = query(runtime, b, steps=1)
    assert (count, total, fifo) == (len(values) + 1, sum(values), 0)
    assert batch.done and a.stats.messages_sent == len(values)


def test_local_back_pressure_defers_the_sender_and_loses_nothing(runtime):
    b = counter(runtime, "b", inbox=2)
    a = counter(runtime, "a", params=[b.address], inbox=16, outbox=16)
    values = list(range(1, 49))
    for v in values:
        runtime.send(a, words(v), tag=COUNTER_TAG_FORWARD)
    deferred = 0
    for _ in range(80):
        ticket = runtime.step([a, b])
        deferred += sum(1 for k, _ in ticket.deferred if k is a)
    runtime.synchronize()
    state = read_counter(runtime.read_state(b))
    assert (state.count, state.sum, state.fifo_errors) == (len(values), sum(values), 0)
    assert deferred > 0 and a.stats.deferred_steps == deferred


def test_pingpong_between_two_kernels(runtime):
    a = runtime.launch(pingpong_kernel(), "ping", device=0)
    b = runtime.launch(pingpong_kernel(), "pong", device=0, params=[a.address])
    a.set_params(b.address)
    runtime.send(a, words(9, 42, 43))
    for _ in range(10):
        runtime.step([a, b])
    m = runtime.receive(b, timeout=30)   # 9 hops: a->b->...; the 10th handler (b) hands it to the host
    assert m.tag == PING_DONE_TAG and list(np.frombuffer(m.payload, np.uint32)) == [0, 42, 43]
    assert read_pingpong(runtime.read_state(a)).bounces == 5
    assert read_pingpong(runtime.read_state(b)).bounces == 5


def test_pingpong_host_round_trip(runtime):
    p = runtime.launch(pingpong_kernel(), device=1)
    for i in range(3):
        runtime.send(p, words(0, i))
        runtime.step(p)
        m = runtime.receive(p, timeout=30)
        assert m.tag == PING_DONE_TAG and np.frombuffer(m.payload, np.uint32)[1] == i


def test_outbox_overflow_is_a_typed_error_for_the_sender(runtime):
    k = counter(runtime, outbox=1)
    for i in range(3):
        runtime.send(k, words(i), tag=COUNTER_TAG_QUERY)
    runtime.step(k).wait(30)
    with pytest.raises(KernelMessageError, match="did not fit the outbox") as info:
        runtime.step(k)
    assert info.value.kernel_id == k.id
    assert k.stats.outbox_overflow == 2 and read_counter(runtime.read_state(k)).failed_emits == 2
    runtime.step(k)   # the error was reported once; the kernel keeps running


def test_unknown_destination_is_reported(runtime):
    a = counter(runtime, params=[MAX * 7 + 5])
    runtime.send(a, words(1), tag=COUNTER_TAG_FORWARD)
    runtime.step(a).wait(30)
    with pytest.raises(KernelMessageError, match="do not exist"):
        runtime.step(a)
    assert a.stats.undeliverable == 1


def test_message_to_another_device_needs_a_router(runtime):
    b = counter(runtime, device=1)
    a = counter(runtime, device=0, params=[b.address])
    runtime.send(a, words(1), tag=COUNTER_TAG_FORWARD)
    runtime.step(a).wait(30)
    with pytest.raises(KernelMessageError, match="no router"):
        runtime.step(a)


def test_messages_never_cross_tenants(runtime):
    b = counter(runtime, tenant=2)
    a = counter(runtime, tenant=1, params=[b.address])
    runtime.send(a, words(5), tag=COUNTER_TAG_FORWARD)
    runtime.step([a, b])
    runtime.step([a, b]).wait(30)
    with pytest.raises(KernelMessageError, match="tenant"):
        runtime.step(a)
    assert read_counter(runtime.read_state(b)).count == 0 and a.stats.rejected == 1


def test_outbox_batches_travel_to_the_other_device(manager, runtime):
    """The K2K router's path: outbox batch -> the other device (in place or a transfer) ->
    that device's steps; exactly once, FIFO."""
    router = CrossGpuK2KRouter(runtime.coordinator, runtime)
    try:
        b = counter(runtime, "far", device=1)
        a = counter(runtime, "near", device=0, params=[b.address])
        values = list(range(1, 31))
        for v in values:
            runtime.send(a, words(v), tag=COUNTER_TAG_FORWARD)
        runtime.step([a, b])
        for _ in range(3):
            runtime.step([a, b])
        runtime.synchronize()
        state = read_counter(runtime.read_state(b))
        assert (state.count, state.sum, state.fifo_errors) == (len(values), sum(values), 0)
        assert router.batches >= 4
    finally:
        runtime.synchronize()
        router.detach()


def test_an_accepted_batchs_wait_checks_its_timeout_and_takes_no_limit(manager, runtime):
    k = counter(runtime, "k", device=1)
    with Buffer(manager.slot(1), 4096) as buf:   # (zeroed: a batch of no messages)
        batch = runtime.accept_batch(1, buf, 0, 64 + runtime.slot_size)
        for bad in (-1, float("nan"), "x", True):
            with pytest.raises(ValueError, match="timeout"):
                batch.wait(bad)
        got: list = []

        def wait(timeout):
            try:
                got.append(batch.wait(timeout))
            except Exception as exc:   # (reported by the assert)
                got.append(exc)
        waiters = [threading.Thread(target=wait, args=(t,)) for t in (None, float("inf"), 1e12)]
        for t in waiters:
            t.start()
        def waiting():   # (threads blocked on the batch's event)
            event = batch.event._event
            return 0 if event is None else len(event._cond._waiters)
        while not got and waiting() < 3:   # (until all three wait, or one failed)
            time.sleep(0.01)
        while not batch.done:
            runtime.step(k).wait(30)
        for t in waiters:
            t.join(30)
        assert got == [True, True, True]


def test_state_round_trip_and_pipeline_cache(runtime):
    k1 = counter(runtime)
    k2 = counter(runtime)
    ctx = runtime._context(0)
    kernel_passes = [p for key, p in ctx.passes.items() if key[3] == 48]
    assert len(kernel_passes) == 1 and k1.kernel_pass is k2.kernel_pass   # one pipeline per code and device
    runtime.write_state(k1, 0, words(3, 4, 0), offset=0)
    state = read_counter(runtime.read_state(k1))
    assert (state.count, state.sum) == (3, 4)
    with pytest.raises(ValueError, match="outside"):
        runtime.write_state(k1, 0, np.zeros(10**6, np.uint8))


def test_many_steps_in_flight(runtime):
    k = counter(runtime)
    tickets = []
    for i in range(12):
        runtime.send(k, words(i), tag=COUNTER_TAG_ADD)
        tickets.append(runtime.step(k))
    tickets[-1].wait(30)
    assert all(t.done() for t in tickets)
    assert [t.points[0].value for t in tickets] == sorted(t.points[0].value for t in tickets)
    state = read_counter(runtime.read_state(k))
    assert (state.count, state.sum) == (12, sum(range(12)))


def test_launch_places_kernels_through_the_coordinator(runtime):
    coord = runtime.coordinator
    ks = [counter(runtime, f"k{i}", device=None) for i in range(4)]
    assert sorted(k.device_index for k in ks) == [0, 0, 1, 1]
    for k in ks:
        assert coord.get_kernel_device(k.id) == k.device_index
    ks[0].destroy()
    assert coord.get_kernel_device("k0") is None
    with pytest.raises(KernelNotFoundError):
        runtime.kernel("k0")
    pinned = counter(runtime, "pinned", device=1)
    assert pinned.device_index == 1 and coord.get_kernel_device("pinned") == 1


def test_bad_input_is_typed_and_leaves_the_runtime_usable(manager, runtime):
    k = counter(runtime, "k")
    spec = counter_kernel(max_sources=MAX)
    with pytest.raises(TypeError, match="KernelSpec"):
        runtime.launch("counter")
    with pytest.raises(ValueError, match="already running"):
        runtime.launch(spec, "k")
    with pytest.raises(ValueError, match="host"):
        runtime.launch(spec, HOST_KERNEL_ID)
    with pytest.raises(TypeError, match="kernel_id"):
        runtime.launch(spec, 5)
    with pytest.raises(IndexError, match="device 7"):
        runtime.launch(spec, device=7)
    with pytest.raises(ValueError, match="state"):
        runtime.launch(spec, state=[np.zeros(10**6, np.uint8)])
    with pytest.raises(ValueError, match="params"):
        runtime.launch(spec, params=[-1])
    with pytest.raises(ValueError, match="tenant"):
        runtime.launch(spec, tenant=-3)
    with pytest.raises(ValueError, match="payload is 300 bytes"):
        runtime.send(k, b"x" * 300)
    with pytest.raises(TypeError, match="payload"):
        runtime.send(k, 17)
    with pytest.raises(ValueError, match="tag"):
        runtime.send(k, b"", tag=-1)
    with pytest.raises(ValueError, match="addressed to"):
        runtime.send(k, K2KMessage(HOST_KERNEL_ID, "other", b""))
    with pytest.raises(KernelNotFoundError, match="nope"):
        runtime.send("nope", b"")
    with pytest.raises(TypeError, match="kernel"):
        runtime.receive(3.5)
    with pytest.raises(ValueError, match="timeout"):
        runtime.receive(k, timeout=-1)
    with pytest.raises(TypeError, match="kernels"):
        runtime.step([k, None])
    with pytest.raises(ValueError, match="where no kernel"):
        runtime.step(k, wait=runtime._context(1).point(1))
    with pytest.raises(TypeError, match="TimelinePoint"):
        runtime.step(k, wait=[(1, 2)])
    with pytest.raises(ValueError, match="index"):
        runtime.read_state(k, 3)
    with pytest.raises(ValueError, match="step must be"):
        runtime.step(k).wait(30)
        k.outbox_batch(5)
    with pytest.raises(TypeError, match="Buffer"):
        runtime.accept_batch(0, b"x")
    with Buffer(manager.slot(1), 4096) as buf:
        with pytest.raises(ValueError, match="GPU 1"):
            runtime.accept_batch(0, buf)
        with pytest.raises(ValueError, match="size"):
            runtime.accept_batch(1, buf, size=32)
    with pytest.raises(ValueError, match="payload_size"):
        KernelRuntime(runtime.coordinator, manager, payload_size=100)
    with pytest.raises(TypeError, match="coordinator"):
        KernelRuntime(object(), manager)
    with pytest.raises(ValueError, match="in_flight"):
        KernelRuntime(runtime.coordinator, manager, in_flight=1)
    runtime.send(k, words(5), tag=COUNTER_TAG_ADD)
    assert query(runtime, k)[:2] == (2, 5)


def test_destroy_racing_step_raises_destroyed_error(runtime, run_threads):
    for _ in range(3):
        k = counter(runtime)
        other = counter(runtime)
        outcome: dict[str, list] = {"step": [], "receive": []}

        def stepper() -> None:
            try:
                for i in range(200):
                    runtime.send(k, words(i), tag=COUNTER_TAG_QUERY)
                    runtime.step([k, other])
            except DestroyedError as exc:
                outcome["step"].append(exc)

        def receiver() -> None:
            try:
                while True:
                    runtime.receive(k, timeout=30)
            except DestroyedError as exc:
                outcome["receive"].append(exc)

        threads = [threading.Thread(target=stepper), threading.Thread(target=receiver)]
        for t in threads:
            t.start()
        time.sleep(0.05)
        k.destroy()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert outcome["receive"], "the waiting receiver was not woken with DestroyedError"
        with pytest.raises(DestroyedError):
            runtime.step(k)
        with pytest.raises(DestroyedError):
            runtime.send(k, b"")
        runtime.step(other).wait(30)   # the rest of the runtime still works
        other.destroy()
        k.destroy()   # idempotent


def test_runtime_destroy_then_use(manager):
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    k = counter(rt)
    rt.step(k)
    rt.destroy()
    rt.destroy()
    with pytest.raises(DestroyedError):
        rt.step()
    with pytest.raises(DestroyedError):
        rt.launch(counter_kernel())
    with pytest.raises(DestroyedError):
        rt.send(k, b"")


@pytest.mark.parametrize("kernels", [0, 1], ids=["idle", "with-kernels"])
def test_runtime_destroy_checks_its_timeout_first_and_takes_one_past_pythons_waits(manager, kernels):
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    for i in range(kernels):
        rt.step(counter(rt, f"k{i}")).wait(30)
    for bad in (float("nan"), -1, "x", True):
        with pytest.raises(ValueError, match="timeout"):
            rt.destroy(bad)
    assert len(rt.kernels) == kernels
    rt.step(counter(rt, "late")).wait(30)   # nothing was taken down
    rt.destroy(1e12)   # longer than a Python lock can wait: no limit
    with pytest.raises(DestroyedError):
        rt.step()


def test_a_single_numpy_param_is_an_int(runtime):
    k = counter(runtime, "k", params=[np.uint32(7)])
    assert k.params == (7, 0, 0, 0)
    k.set_params(np.int64(9))
    assert k.params == (9, 0, 0, 0)
    with pytest.raises(ValueError, match="params"):
        k.set_params(1.5)
    assert k.params == (9, 0, 0, 0)


def test_a_custom_kernel_spec_runs(runtime):
    from vkmulti._core.shaders import shader_path
    spec = KernelSpec("my-counter", shader_path("kernel_counter.comp.spv").read_bytes(), state_sizes=(64 + 16 * 8,))
    k = runtime.launch(spec, state=[counter_initial_state(8)])
    runtime.send(k, words(11), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    assert read_counter(runtime.read_state(k)).sum == 11


def test_eight_host_threads_and_three_kernel_senders_exactly_once(runtime, run_threads):
    """Concurrent host senders and several kernels forwarding into one small inbox:
    every message arrives once, each pair in order (checked on the GPU by sequence number)."""
    sink = counter(runtime, "sink", inbox=3)
    fwd = [counter(runtime, f"fwd{i}", params=[sink.address], inbox=8, outbox=8) for i in range(3)]
    stop = threading.Event()

    def step_loop() -> None:
        while not stop.is_set():
            runtime.step([sink] + fwd)

    stepping = threading.Thread(target=step_loop)
    stepping.start()
    try:
        def sender(t: int) -> None:
            for i in range(25):
                value = t * 1000 + i
                if t < 3:   # through a forwarding kernel
                    runtime.send(fwd[t], words(value), tag=COUNTER_TAG_FORWARD, timeout=30)
                else:
                    runtime.send(sink, words(value), tag=COUNTER_TAG_ADD, timeout=30)
        assert run_threads(sender, 8) == []
        deadline = time.monotonic() + 60
        expected = sum(t * 1000 + i for t in range(8) for i in range(25))
        while time.monotonic() < deadline:
            state = read_counter(runtime.read_state(sink))
            if state.count >= 200:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        stepping.join(60)
    runtime.synchronize()
    state = read_counter(runtime.read_state(sink))
    assert (state.count, state.sum, state.fifo_errors) == (200, expected, 0)
    assert all(read_counter(runtime.read_state(f)).fifo_errors == 0 for f in fwd)


def test_a_step_timeout_says_what_the_step_waits_for(runtime):
    """A step held back on the GPU by a wait point nobody signals: the timeout names
    the device's progress, the step and its kernels, and each timeline still short of
    the value the step needs (its value now); once signalled, everything goes on."""
    from gates import Gate

    from vkmulti._core.timeline import TimelinePoint
    from vkmulti.errors import TimeoutError as VkmTimeout

    k = runtime.launch(counter_kernel(max_sources=MAX), "held", device=0, state=[counter_initial_state(MAX)])
    runtime.step(k).wait(30)
    gate = Gate(runtime.manager.slot(0))
    try:
        ticket = runtime.step(k, wait=TimelinePoint(gate.sem, 1, 0))
        with pytest.raises(VkmTimeout) as info:
            ticket.wait(0.2)
        msg = str(info.value)
        step = ticket.points[0].value
        assert f"kernel step {step} not done" in msg and f"it completed step {step - 1}" in msg
        assert f"step {step} (held) waits for timeline {gate.sem:#x} at 0 of 1" in msg
        gate.open()
        ticket.wait(30)
    finally:
        gate.destroy()
    runtime.send(k, np.array([4], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step(k).wait(30)
    assert read_counter(runtime.read_state(k)).sum == 4


def test_points_of_another_manager_are_refused_not_handed_to_the_driver(runtime, manager):
    """A TimelinePoint vkmulti made remembers its VkDevice: one of another manager's GPU 0 (the
    same index) is refused by step()'s and a transfer's waits; before, the driver got a foreign
    semaphore and the process crashed. Pickled, a point keeps its fields only."""
    import pickle

    from vkmulti import CrossDeviceTransfer, MultiDeviceManager, TransferMethod

    k = counter(runtime, "c")
    runtime.step(k).wait(30)
    other = MultiDeviceManager.create(enabled=True)
    try:
        rt2 = KernelRuntime(make_coordinator(other), other, max_kernels=MAX)
        try:
            k2 = counter(rt2, "x")
            foreign = rt2.step(k2).points[0]
            foreign_ticket = rt2.step(k2)
            with pytest.raises(ValueError, match="another VkDevice"):
                runtime.step(k, wait=foreign)
            with pytest.raises(ValueError, match="another VkDevice"):
                runtime.step(k, wait=[runtime._context(0).point(1), foreign_ticket.points[0]])
            with Buffer(manager.slot(0), 4096) as a, Buffer(manager.slot(1), 4096) as b:
                x = CrossDeviceTransfer(manager.slot(0), manager.slot(1), TransferMethod.HOST_SHARED)
                try:
                    with pytest.raises(ValueError, match="another VkDevice"):
                        x.submit(src_buffer=a, dst_buffer=b, src_wait=foreign)
                    x.submit(src_buffer=a, dst_buffer=b, src_wait=k.last_point).wait(30)   # (its own: taken)
                finally:
                    x.destroy()
            copy = pickle.loads(pickle.dumps(foreign))
            assert copy == foreign and "_owner" not in copy.__dict__
        finally:
            rt2.destroy()
    finally:
        other.destroy()
    before = k.steps
    runtime.step(k).wait(30)   # the runtime stays usable
    assert k.steps == before + 1
