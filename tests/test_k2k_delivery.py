"""The K2K router delivering for real on the virtual GPU pair: exactly once, FIFO
per pair, HLC causality and ring wrap-around under 8 sender threads; host-routed
messages sharing their source's sequence; back-pressure with nothing lost;
tenant errors; detach; the stencil across devices."""
from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest

import kernel_support
from kernel_support import router  # noqa: F401 (the shared router fixture)
from kernel_support import make_coordinator, runtime_fixture
from vkmulti import CrossGpuK2KRouter, K2KMessage, RoutingKind, TenantMismatchError
from vkmulti.errors import K2KDestinationNotFoundError, KernelMessageError, QueueFullError
from vkmulti.kernels import KernelRuntime, pingpong_kernel
from vkmulti.kernels.reference import (COUNTER_TAG_ADD, COUNTER_TAG_FORWARD, PING_DONE_TAG, jacobi_reference,
                                       read_counter)
from vkmulti.kernels.stencil import StencilSlabs

MAX = 64


runtime = runtime_fixture(max_kernels=MAX)


counter = functools.partial(kernel_support.counter, max_sources=MAX, inbox=64, outbox=64)


def words(*values):
    return np.array(values, np.uint32)


def step_until(rt, kernels, done, limit=400):
    for _ in range(limit):
        rt.step(kernels)
        if done():
            return
    raise AssertionError("not delivered within the step limit")


def test_eight_threads_exactly_once_fifo_and_ring_wrap_across_devices(runtime, router, run_threads):
    """3 threads send to forwarders on GPU 0 (which forward to a sink on GPU 1), 3 route
    messages as those forwarders (host-routed K2K shares their sequence numbers), 2 send
    to the sink directly; the sink's 4-slot inbox wraps 50 times. The sink checks on the
    GPU that every sender's sequence numbers arrive 0, 1, 2, ..."""
    sink = counter(runtime, "sink", device=1, inbox=4)
    fwd = [counter(runtime, f"fwd{i}", device=0, params=[sink.address], inbox=8, outbox=8) for i in range(3)]
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
                if t < 3:
                    runtime.send(fwd[t], words(value), tag=COUNTER_TAG_FORWARD, timeout=30)
                elif t < 6:
                    d = router.route_message(fwd[t - 3].id, sink.id,
                                             K2KMessage(fwd[t - 3].id, sink.id, words(value).tobytes(),
                                                        tag=COUNTER_TAG_ADD))
                    assert d.kind is RoutingKind.DIRECT_P2P and (d.source_device, d.dest_device) == (0, 1)
                else:
                    runtime.send(sink, words(value), tag=COUNTER_TAG_ADD, timeout=30)
        assert run_threads(sender, 8) == []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and read_counter(runtime.read_state(sink)).count < 200:
            time.sleep(0.05)
    finally:
        stop.set()
        stepping.join(60)
    for _ in range(3):   # the last landings are counted once a step has taken them
        runtime.step([sink] + fwd)
    runtime.synchronize()
    state = read_counter(runtime.read_state(sink))
    expected = sum(t * 1000 + i for t in range(8) for i in range(25))
    assert (state.count, state.sum, state.fifo_errors) == (200, expected, 0)
    assert (state.hops_sum, state.max_hops) == (150, 1)   # 150 crossed one device boundary
    s = router.stats()
    assert (s.messages_routed, s.messages_pending, s.routing_failures) == (150, 0, 0)
    assert s.bytes_transferred > 0 and router.transfer_method(0, 1) is not None
    assert all(read_counter(runtime.read_state(f)).forwards == 25 for f in fwd)


def test_pingpong_across_devices_keeps_causality(runtime, router):
    """9 hops between GPU 0 and GPU 1; every hop's message is later (HLC) than the one
    before it, so the final message is later than the host's send."""
    a = runtime.launch(pingpong_kernel(), "ping", device=0)
    b = runtime.launch(pingpong_kernel(), "pong", device=1, params=[a.address])
    a.set_params(b.address)
    sent = runtime.send(a, words(9, 42))
    clocks = []
    for _ in range(12):
        runtime.step([a, b]).wait(30)
        clocks.append((a.stats.clock, b.stats.clock))
    m = runtime.receive(b, timeout=30)
    assert m.tag == PING_DONE_TAG and list(np.frombuffer(m.payload, np.uint32)[:2]) == [0, 42]
    assert m.timestamp > sent.timestamp and runtime.hlc.current >= m.timestamp
    for (a0, b0), (a1, b1) in zip(clocks, clocks[1:]):   # clocks never go back
        assert a1 >= a0 and b1 >= b0
    # the hop into GPU 1 happened after the hop out of GPU 0 of the same message: each kernel's clock
    # passed the other's at some step
    assert b.stats.clock > sent.timestamp and a.stats.clock > sent.timestamp
    assert router.stats().messages_routed == 9


def test_back_pressure_defers_the_sender_and_loses_nothing(manager):
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    router = CrossGpuK2KRouter(rt.coordinator, rt, max_landings=1)
    try:
        sink = counter(rt, "sink", device=1, inbox=2)
        a = counter(rt, "a", device=0, params=[sink.address], inbox=64, outbox=64)
        values = list(range(1, 129))
        for v in values:
            rt.send(a, words(v), tag=COUNTER_TAG_FORWARD)
        deferred = 0
        for _ in range(300):
            ticket = rt.step([a, sink])
            deferred += sum(1 for k, why in ticket.deferred if k is a and "outbox" in why)
            if read_counter(rt.read_state(sink)).count == len(values):
                break
        rt.synchronize()
        state = read_counter(rt.read_state(sink))
        assert (state.count, state.sum, state.fifo_errors) == (len(values), sum(values), 0)
        assert deferred > 0 and a.stats.deferred_steps >= deferred
        assert router.stats().routing_failures == 0
    finally:
        router.detach()
        rt.destroy()


def test_cross_tenant_messages_raise_and_count(runtime, router):
    sink = counter(runtime, "sink", device=1, tenant=2)
    a = counter(runtime, "a", device=0, tenant=1, params=[sink.address])
    with pytest.raises(TenantMismatchError, match="tenant 1.*tenant 2"):
        router.route_message(a.id, sink.id, b"\1\0\0\0")
    assert router.stats().routing_failures == 1
    runtime.send(a, words(5), tag=COUNTER_TAG_FORWARD)   # the GPU path: rejected on GPU 1, told to the sender
    raised = None
    for _ in range(8):
        try:
            runtime.step([a, sink]).wait(30)
        except KernelMessageError as exc:
            raised = exc
            break
    assert raised is not None and raised.kernel_id == a.id and "tenant" in str(raised)
    assert read_counter(runtime.read_state(sink)).count == 0 and a.stats.rejected == 1
    assert router.stats().routing_failures == 2
    runtime.step([a, sink])   # reported once; both keep running


def test_host_routed_messages_on_one_device_and_drain(runtime, router):
    b = counter(runtime, "b", device=0)
    a = counter(runtime, "a", device=0)
    far = counter(runtime, "far", device=1)
    assert router.route_message("a", "b", words(3)).kind is RoutingKind.SAME_DEVICE
    for v in (10, 20, 30):
        router.route_message("a", "far", words(v))
    taken_back = router.drain_pending(0, 1)     # no step took them yet: the caller has them now
    assert [int(np.frombuffer(p.message.payload, np.uint32)[0]) for p in taken_back] == [10, 20, 30]
    router.route_message("a", "far", K2KMessage("a", "far", words(7).tobytes(), tag=COUNTER_TAG_ADD))
    step_until(runtime, [a, b, far], lambda: read_counter(runtime.read_state(far)).count == 1, 20)
    step_until(runtime, [a, b, far], lambda: read_counter(runtime.read_state(b)).count == 1, 20)
    assert read_counter(runtime.read_state(far)).sum == 7 and read_counter(runtime.read_state(b)).sum == 3
    runtime.step([a, b, far])
    runtime.synchronize()
    deadline = time.monotonic() + 10   # the last step's (empty) landings are taken back once harvested
    while not router.idle() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert router.stats().messages_pending == 0 and router.idle()


def test_resolved_host_routed_messages_leave_the_pair_queues(runtime, router):
    """The pair queues keep only what drain_pending can still take back: delivered and
    failed messages go (they piled up there, with their kernels and batches, without end)."""
    a = counter(runtime, "a", device=0)
    far = counter(runtime, "far", device=1)
    for i in range(40):
        router.route_message("a", "far", K2KMessage("a", "far", words(1).tobytes(), tag=COUNTER_TAG_ADD))
        if i % 4 == 3:
            runtime.step([a, far])
    step_until(runtime, [a, far], lambda: read_counter(runtime.read_state(far)).count == 40, 100)
    gone = counter(runtime, "gone", device=1)
    router.route_message("a", "gone", words(1))
    gone.destroy()
    runtime.step([a, far])   # (it fails: its destination was destroyed)
    runtime.synchronize()
    deadline = time.monotonic() + 10
    while not router.idle() and time.monotonic() < deadline:
        time.sleep(0.01)
    s = router.stats()
    assert (s.messages_routed, s.routing_failures, s.messages_pending) == (40, 1, 0)
    assert sum(len(q) for q in router._pending.values()) == 0 and router.drain_pending(0, 1) == []


def test_a_routed_message_whose_destination_migrates_before_it_is_consumed_counts_delivered(runtime, router):
    """A host-routed message leaves with its source's step for where its destination is; the
    destination migrates before a step of it consumes the message (the move takes it along):
    it arrives once, and the router counts it delivered, not failed."""
    src = counter(runtime, "src", device=1)
    sink = counter(runtime, "sink", device=0)
    runtime.run(3, [src, sink]).wait(30)
    for n in range(1, 5):
        router.route_message("src", "sink", K2KMessage("src", "sink", words(7).tobytes(), tag=COUNTER_TAG_ADD))
        runtime.step(src)   # (it leaves for sink's device: a landing there, or a batch on this one)
        runtime.synchronize(30)
        runtime.migrate(sink, 1 - sink.device_index)
        runtime.run(4, [src, sink]).wait(30)
        runtime.synchronize(30)
        st = read_counter(runtime.read_state(sink))
        assert (st.count, st.sum) == (n, 7 * n)
        assert router.stats().routing_failures == 0 and router.stats().messages_pending == 0


def test_route_message_validation_with_a_runtime(manager):
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    router = CrossGpuK2KRouter(rt.coordinator, rt, max_pending=2)
    try:
        counter(rt, "a", device=0)
        counter(rt, "b", device=1)
        rt.coordinator.assign_kernel("outsider", 1)     # placed, but no kernel of the runtime
        with pytest.raises(K2KDestinationNotFoundError, match="outsider"):
            router.route_message("a", "outsider", b"")
        with pytest.raises(ValueError, match="payload is 300 bytes"):
            router.route_message("a", "b", bytes(300))
        with pytest.raises(ValueError, match="already attached"):
            router.attach(KernelRuntime(rt.coordinator))
        with pytest.raises(ValueError, match="outbox feed"):
            CrossGpuK2KRouter(rt.coordinator, rt)      # one router per runtime
        for _ in range(2):                              # nothing steps: they wait for a's next step
            router.route_message("a", "b", b"x")
        t0 = time.monotonic()
        with pytest.raises(QueueFullError, match="max_pending"):
            router.route_message("a", "b", b"y", timeout=0.05)
        assert time.monotonic() - t0 >= 0.05
        s = router.stats()
        assert (s.messages_pending, s.routing_failures) == (2, 1)
        rt.step()
        router.route_message("a", "b", b"z")            # a's step took two: room again
    finally:
        router.detach()
        rt.destroy()


def test_route_message_waiting_for_room_goes_in_once_a_step_takes_the_queue(manager):
    """A full queue's waiter is let in by the step that takes the queued messages,
    long before its timeout (and with none: it waits as long as it takes)."""
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    router = CrossGpuK2KRouter(rt.coordinator, rt, max_pending=1)
    try:
        counter(rt, "a", device=0)
        counter(rt, "b", device=1)
        router.route_message("a", "b", b"x")
        for timeout in (30.0, None):
            went_in = threading.Event()
            waiter = threading.Thread(target=lambda: (router.route_message("a", "b", b"y", timeout=timeout),
                                                      went_in.set()))
            waiter.start()
            assert not went_in.wait(0.2)   # full: it waits
            t0 = time.monotonic()
            rt.step()                      # a's step takes what is queued: room
            assert went_in.wait(10) and time.monotonic() - t0 < 5
            waiter.join()
    finally:
        router.detach()
        rt.destroy()


def test_detach_tells_senders_and_leaves_everything_usable(manager):
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    router = CrossGpuK2KRouter(rt.coordinator, rt)
    try:
        sink = counter(rt, "sink", device=1)
        a = counter(rt, "a", device=0, params=[sink.address])
        rt.send(a, words(1), tag=COUNTER_TAG_FORWARD)
        rt.step([a, sink])
        rt.step([a, sink]).wait(30)
        router.route_message("a", "sink", words(2))
        router.detach()
        router.detach()   # idempotent
        assert router.runtime is None and rt.outbox_feed is None
        assert [p.message.payload[:1] for p in router.drain_pending(0, 1)] == [b"\2"]
        rt.send(a, words(1), tag=COUNTER_TAG_FORWARD)
        rt.step([a, sink]).wait(30)
        with pytest.raises(KernelMessageError, match="no router"):
            rt.step([a, sink])
        router.attach(rt)   # and back
        rt.send(a, words(4), tag=COUNTER_TAG_FORWARD)
        step_until(rt, [a, sink], lambda: read_counter(rt.read_state(sink)).sum >= 5, 20)
    finally:
        router.detach()
        rt.destroy()


def test_destroying_kernels_while_messages_travel(runtime, router):
    """Two senders on GPU 0 (their batches gathered into one move) and a slow sink on
    GPU 1; the sink, then a sender, is destroyed while batches travel: no crash, the
    other sender's messages keep arriving, everything is freed."""
    sink = counter(runtime, "sink", device=1, inbox=2)
    other = counter(runtime, "other", device=1)
    a = counter(runtime, "a", device=0, params=[sink.address], outbox=64)
    b = counter(runtime, "b", device=0, params=[other.address], outbox=64)
    for v in range(40):
        runtime.send(a, words(v), tag=COUNTER_TAG_FORWARD)
        runtime.send(b, words(v), tag=COUNTER_TAG_FORWARD)
    runtime.step([a, b, sink, other])
    runtime.step([a, b, sink, other])
    sink.destroy()
    for _ in range(4):
        try:
            runtime.step([a, b, other])
        except KernelMessageError as exc:   # a's messages for the destroyed sink
            assert exc.kernel_id == a.id
    a.destroy()
    step_until(runtime, [b, other], lambda: read_counter(runtime.read_state(other)).count == 40, 30)
    assert read_counter(runtime.read_state(other)).fifo_errors == 0
    b.destroy()
    runtime.step()
    runtime.synchronize()
    assert runtime.kernels == [other]


@pytest.mark.parametrize("devices", [[0, 1], [0, 1, 1, 0], [1, 0, 0]])
def test_stencil_across_devices_matches_one_device(runtime, router, devices):
    rng = np.random.default_rng(len(devices))
    field = rng.integers(0, 1 << 22, size=(23, 70), dtype=np.int32)
    top = rng.integers(0, 1 << 22, size=70, dtype=np.int32)
    with StencilSlabs(runtime, field, [0], top=top, name="one") as one:
        one.step(9)
        single = one.field()
    with StencilSlabs(runtime, field, devices, top=top, name="many") as many:
        many.step(9)
        split = many.field()
    np.testing.assert_array_equal(single, jacobi_reference(field, top, np.zeros(70, np.int32), 9))
    np.testing.assert_array_equal(split, single)
