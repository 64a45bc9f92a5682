"""Batches read in place by the kernel they are all for: the receiving step binds
the batch region (an import of the sender's outbox, or a link's landing) as the
kernel's inbox instead of copying it there. Same guarantees as the copy paths:
exactly once, FIFO per pair, hop counts, HLC causality; the sender's outbox
header is whole again before its region is reused; host messages and other
senders' batches for the kernel turn it off for that step, never lose or starve
anything."""
from __future__ import annotations

import numpy as np
import pytest

from kernel_support import counter, routed_fixture, routed_runtime, settle, state, words
from vkmulti.kernels import pingpong_kernel
from vkmulti.kernels.engine import step_recorder
from vkmulti.kernels.reference import COUNTER_TAG_ADD, COUNTER_TAG_FORWARD

PATHS = {"in place": None, "host_shared link": "host_shared"}


routed = routed_fixture(PATHS)


@pytest.fixture
def in_place(monkeypatch):
    """The (kernel id, batch) pairs the steppers chose to read in place."""
    seen = []
    original = step_recorder.StepRecorder._readable_in_place

    def recording(self, b, x, readable):
        ok = original(self, b, x, readable)
        if ok:
            seen.append((x.id, b))
        return ok
    monkeypatch.setattr(step_recorder.StepRecorder, "_readable_in_place", recording)
    return seen


def test_batches_all_for_one_kernel_are_read_in_place(routed, in_place):
    """3 messages a step, then a full outbox (8) a step: read in place, every message
    once, in order, one hop each; the sender's outbox emits its full capacity
    again after its regions were read as 3-slot inboxes."""
    rt, router = routed
    sink = counter(rt, "sink", 1)
    fwd = counter(rt, "fwd", 0, params=[sink.address])
    sent = []
    v = 0
    for per_step in [3] * 12 + [8] * 12:
        for _ in range(per_step):
            v += 1
            rt.send(fwd, words(v), tag=COUNTER_TAG_FORWARD)
            sent.append(v)
        rt.step([fwd, sink])
    settle(rt, [fwd, sink], lambda: state(rt, sink).count == len(sent))
    st = state(rt, sink)
    assert (st.count, st.sum, st.fifo_errors) == (len(sent), sum(sent), 0)
    assert (st.hops_sum, st.max_hops) == (len(sent), 1)
    assert state(rt, fwd).failed_emits == 0 and state(rt, fwd).forwards == len(sent)
    assert sum(1 for kid, _ in in_place if kid == "sink") >= 4, "no batch was read in place"
    assert rt.dead_letters == 0 and router.stats().routing_failures == 0
    assert router.stats().messages_routed == len(sent) and router.stats().messages_pending == 0


def test_a_backlog_of_one_sender_is_read_in_place_one_batch_a_step(routed, in_place):
    """The sender steps alone (its batches wait on the sink's device), then both step:
    the oldest waiting batch is read in place at each step, the later ones of the same
    sender after it, in order."""
    rt, router = routed
    sink = counter(rt, "sink", 1)
    fwd = counter(rt, "fwd", 0, params=[sink.address])
    v = 0
    for _ in range(6):   # the router learns the guess; the sink's own (empty) batches go quiet
        for _ in range(5):
            v += 1
            rt.send(fwd, words(v), tag=COUNTER_TAG_FORWARD)
        rt.step([fwd, sink])
    settle(rt, [fwd, sink], lambda: state(rt, sink).count == v)
    rt.poll()
    in_place.clear()
    for _ in range(2):   # (two batches: the runtime's in_flight regions hold at most three)
        for _ in range(5):
            v += 1
            rt.send(fwd, words(v), tag=COUNTER_TAG_FORWARD)
        rt.step(fwd)
    rt.synchronize()
    rt.poll()
    for _ in range(5):
        v += 1
        rt.send(fwd, words(v), tag=COUNTER_TAG_FORWARD)
    rt.step([fwd, sink])
    settle(rt, [fwd, sink], lambda: state(rt, sink).count == v)
    st = state(rt, sink)
    assert (st.count, st.sum, st.fifo_errors) == (v, v * (v + 1) // 2, 0)
    assert sum(1 for kid, _ in in_place if kid == sink.id) >= 2
    assert rt.dead_letters == 0 and router.stats().routing_failures == 0


def test_in_place_off_reads_the_same_messages(routed, monkeypatch, in_place):
    monkeypatch.setattr(step_recorder, "READ_IN_PLACE", False)
    rt, router = routed
    sink = counter(rt, "sink", 1)
    fwd = counter(rt, "fwd", 0, params=[sink.address])
    for v in range(1, 41):
        rt.send(fwd, words(v), tag=COUNTER_TAG_FORWARD)
        if v % 4 == 0:
            rt.step([fwd, sink])
    settle(rt, [fwd, sink], lambda: state(rt, sink).count == 40)
    st = state(rt, sink)
    assert (st.count, st.sum, st.fifo_errors, st.hops_sum) == (40, 820, 0, 40)
    assert not in_place


def test_host_messages_and_other_senders_turn_it_off_for_a_step(routed, in_place):
    """The sink gets host messages at some steps and a second sender's batches at
    others: those steps copy (nothing waits behind a batch read in place), every
    message arrives once, in order per sender."""
    rt, router = routed
    sink = counter(rt, "sink", 1, inbox=16)
    a = counter(rt, "a", 0, params=[sink.address])
    b = counter(rt, "b", 0, params=[sink.address])
    total, count = 0, 0
    for step in range(30):
        for i in range(2):
            v = 1000 * step + i + 1
            rt.send(a, words(v), tag=COUNTER_TAG_FORWARD)
            total, count = total + v, count + 1
        if step % 3 == 0:
            rt.send(sink, words(7), tag=COUNTER_TAG_ADD)
            total, count = total + 7, count + 1
        if step % 5 == 0:
            rt.send(b, words(3), tag=COUNTER_TAG_FORWARD)
            total, count = total + 3, count + 1
        rt.step([a, b, sink])
    settle(rt, [a, b, sink], lambda: state(rt, sink).count == count)
    st = state(rt, sink)
    assert (st.count, st.sum, st.fifo_errors) == (count, total, 0)
    assert in_place, "no batch was read in place"
    assert rt.dead_letters == 0 and router.stats().routing_failures == 0


def test_pingpong_read_in_place_keeps_causality(routed, in_place):
    rt, router = routed
    a = rt.launch(pingpong_kernel(), "ping", device=0)
    b = rt.launch(pingpong_kernel(), "pong", device=1, params=[a.address])
    a.set_params(b.address)
    sent = rt.send(a, words(21, 42))
    clocks = []
    for _ in range(60):
        rt.step([a, b]).wait(30)
        clocks.append((a.stats.clock, b.stats.clock))
        if rt.pending_receives(b) or rt.pending_receives(a):
            break
    m = rt.receive(b if rt.pending_receives(b) else a, timeout=30)
    assert list(np.frombuffer(m.payload, np.uint32)[:2]) == [0, 42]
    assert m.timestamp > sent.timestamp and rt.hlc.current >= m.timestamp
    for (a0, b0), (a1, b1) in zip(clocks, clocks[1:]):
        assert a1 >= a0 and b1 >= b0
    assert router.stats().messages_routed == 21
    assert in_place, "no hop was read in place"


def test_a_kernel_reloaded_while_it_reads_in_place_keeps_counting(manager, in_place, tmp_path):
    """A hot reload gives the sink another pipeline (the counter built with debug
    info: other SPIR-V, same behaviour): its in-place descriptor sets are made
    again for it, the old ones let go; every message arrives once, in order."""
    import shutil
    import subprocess
    from pathlib import Path

    from vkmulti import HotReloadConfig, HotReloadManager, KernelCodeSource

    glslc = shutil.which("glslc")
    if glslc is None:
        pytest.skip("needs glslc")
    shaders = Path(__file__).resolve().parent.parent / "native" / "shaders"
    out = tmp_path / "counter_g.spv"
    subprocess.run([glslc, "-g", "--target-env=vulkan1.1", "-o", str(out), str(shaders / "kernel_counter.comp")],
                   check=True)
    with routed_runtime(manager, None) as (rt, router):
        sink = counter(rt, "sink", 1)
        fwd = counter(rt, "fwd", 0, params=[sink.address])
        reloads = HotReloadManager(HotReloadConfig().with_validate_before_swap(False))
        reloads.register_runtime_kernel(sink)
        v = 0
        for step in range(24):
            for _ in range(4):
                v += 1
                rt.send(fwd, words(v), tag=COUNTER_TAG_FORWARD)
            rt.step([fwd, sink])
            if step in (8, 16):
                chosen = len(in_place)
                before = sink.kernel_pass
                if step == 8:
                    reloads.reload(sink, KernelCodeSource.from_spirv(out.read_bytes()))
                else:
                    reloads.rollback(sink.id)
                assert sink.kernel_pass is not before
        settle(rt, [fwd, sink], lambda: state(rt, sink).count == v)
        st = state(rt, sink)
        assert (st.count, st.sum, st.fifo_errors) == (v, v * (v + 1) // 2, 0)
        assert len(in_place) > chosen, "nothing was read in place after the reload"
        passes = {key[5] for key in sink.deliver_sets if len(key) > 5 and key[3] == "in place"}
        assert passes == {id(sink.kernel_pass)}



def test_a_landing_with_nothing_for_its_device_is_let_go_without_waiting_for_its_steps(manager):
    """The router takes back a batch that holds nothing for the device it landed on
    (the sending step's survey says so) without waiting for the steps there that
    already read it: the sender's steps go on while the other device's steps are
    held back on the GPU (host-opened gates; before, a step of the sender waited
    inside the router for the held device, up to 30 s), and the batch is done once
    the held steps ran. (In place: the router lands every batch on every device
    that runs kernels; through a link it drops the move of a batch whose survey it
    already read, and the landings it does make are let go by the same call.)"""
    import threading
    import time

    from gates import Gate
    from vkmulti._core.timeline import TimelinePoint

    with routed_runtime(manager, None) as (rt, router):
        a = counter(rt, "a", 0)   # forwards nothing anywhere: its batches hold nothing for GPU 1
        c = counter(rt, "c", 1)   # a kernel on GPU 1, so a's batches land there
        rt.step([a, c]).wait(30)
        gate0, gate1 = Gate(manager.slot(0)), Gate(manager.slot(1))
        done = threading.Event()
        errors: list[BaseException] = []

        def sender() -> None:
            try:
                time.sleep(0.05)   # (the router reaps its landings every 20 ms: this step does)
                rt.step([a])
                done.set()
            except BaseException as exc:   # noqa: BLE001 (handed to the test)
                errors.append(exc)
        t = threading.Thread(target=sender)
        try:
            # a's step waits for gate 0, so its survey is unknown while c's next step reads (surveys)
            # its batch in place; c's steps wait for gate 1
            rt.step([a, c], wait=[TimelinePoint(gate0.sem, 1, 0), TimelinePoint(gate1.sem, 1, 1)])
            held = a.outbox_batches[(a.steps - 1) % len(a.outbox_batches)]
            rt.step([c])
            landed = [i for dev, i in held.k2k_landings if dev == 1]
            assert landed and all(i.last_value and not i.done for i in landed)   # read by c's held step
            gate0.open()   # a's step runs: its survey (nothing for GPU 1) is read at the sender's step
            manager.slot(0).native.wait_timeline(held.ready.semaphore, held.ready.value, 30)
            t.start()
            t.join(20)
            assert done.is_set() and not errors, errors   # gate 1 is still closed
            gate1.open()
            rt.synchronize(30)
            rt.step([a, c]).wait(30)
            rt.synchronize(30)
            assert all(i.done for i in landed)
            assert state(rt, c).count == 0 and rt.dead_letters == 0
        finally:
            for g in (gate0, gate1):   # (a sender still stuck goes on once they are open)
                if g.slot.native.timeline_value(g.sem) < 1:
                    g.open()
            if t.is_alive():
                t.join(60)
            gate0.destroy()
            gate1.destroy()
