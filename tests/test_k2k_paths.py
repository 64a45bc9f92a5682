"""The K2K router's two ways across the virtual pair, each with the same
guarantees: in place (exported outboxes read through an import after a relay,
the default between devices that share memory) and through a transfer link
(forced with transfer_methods). Direct landings (a batch guessed all for one
kernel copied into its empty inbox by a copy command), wrong and short
guesses, ring wrap, lazy batches of quiet senders, and senders destroyed
while their batches are read in place."""
from __future__ import annotations

import pytest

from kernel_support import MAX, counter, make_coordinator, routed_fixture, settle, state, words
from vkmulti import CrossGpuK2KRouter, K2KMessage
from vkmulti.kernels import KernelRuntime
from vkmulti.kernels.engine import step_recorder
from vkmulti.kernels.engine.stepper import QUIET_BATCHES
from vkmulti.kernels.runtime import Inbound
from vkmulti.kernels.reference import COUNTER_TAG_ADD, COUNTER_TAG_FORWARD
from vkmulti.transfer import ExportedBuffer

#: transfer_methods for both directions of the pair (None: the pair's best, dmabuf: in place)
PATHS = {"in place": None, "host_shared link": "host_shared", "staging link": "staging_copy"}


routed = routed_fixture(PATHS)


@pytest.fixture
def directs(monkeypatch):
    """Counts the direct landings the steppers record."""
    seen = []
    original = step_recorder.StepRecorder._directs

    def counting(self, *args):
        out = original(self, *args)
        seen.extend(out)
        return out
    monkeypatch.setattr(step_recorder.StepRecorder, "_directs", counting)
    return seen


def test_direct_landings_exactly_once_in_order_through_ring_wrap(routed, directs):
    """8 messages a step into an 8-slot inbox: every batch is all the sink's, taken in
    place; the inbox starts at slot 0 each step while its counters run on (the
    ring wraps every step)."""
    rt, router = routed
    sink = counter(rt, "sink", 1)
    fwd = counter(rt, "fwd", 0, params=[sink.address])
    values = list(range(1, 161))
    for step in range(20):
        for v in values[8 * step:8 * step + 8]:
            rt.send(fwd, words(v), tag=COUNTER_TAG_FORWARD)
        rt.step([fwd, sink])
    settle(rt, [fwd, sink], lambda: state(rt, sink).count == len(values))
    st = state(rt, sink)
    assert (st.count, st.sum, st.fifo_errors, st.hops_sum) == (len(values), sum(values), 0, len(values))
    assert any(x is sink for x, *_ in directs)
    assert rt.dead_letters == 0 and router.stats().routing_failures == 0


def test_wrong_and_mixed_guesses_lose_nothing(routed, directs):
    """The forwarder's batches are all for x, then all for y (the guess is x), then
    mixed (host-routed messages to y beside forwards to x): the GPU check turns
    each wrong guess into an ordinary delivery, in order for both receivers."""
    rt, router = routed
    x = counter(rt, "x", 1)
    y = counter(rt, "y", 1)
    fwd = counter(rt, "fwd", 0, params=[x.address])
    sent = {x: [], y: []}
    v = 0
    for phase, target in enumerate([x, y, x, y, x]):
        fwd.set_params(target.address)
        for _ in range(4):
            for _ in range(3):
                v += 1
                rt.send(fwd, words(v), tag=COUNTER_TAG_FORWARD)
                sent[target].append(v)
                if phase == 4:   # mixed: y gets host-routed messages as fwd in the same batches
                    v += 1
                    router.route_message(fwd.id, y.id, K2KMessage(fwd.id, y.id, words(v).tobytes(),
                                                                  tag=COUNTER_TAG_ADD))
                    sent[y].append(v)
            rt.step([fwd, x, y])
        while fwd.h2k:   # (a deferred step leaves them for the next: forwarded before the target changes)
            rt.step([fwd, x, y])
    settle(rt, [fwd, x, y], lambda: state(rt, x).count + state(rt, y).count == v)
    for k in (x, y):
        st = state(rt, k)
        assert (st.count, st.sum, st.fifo_errors) == (len(sent[k]), sum(sent[k]), 0), k.id
    assert directs, "no batch was guessed direct"
    assert router.stats().routing_failures == 0


def test_a_guess_short_of_the_count_copies_the_rest(routed, directs, monkeypatch):
    """One message a step makes the guess copy one slot; then eight a step: the
    direct pass copies the seven past the copy command itself (batches the
    survey says are all the sink's would be read in place: not here)."""
    monkeypatch.setattr(step_recorder, "READ_IN_PLACE", False)
    rt, router = routed
    sink = counter(rt, "sink", 1)
    fwd = counter(rt, "fwd", 0, params=[sink.address])
    v = 0
    for per_step in [1] * 8 + [8] * 6:
        for _ in range(per_step):
            v += 1
            rt.send(fwd, words(v), tag=COUNTER_TAG_FORWARD)
        rt.step([fwd, sink])
    settle(rt, [fwd, sink], lambda: state(rt, sink).count == v)
    st = state(rt, sink)
    assert (st.count, st.sum, st.fifo_errors) == (v, v * (v + 1) // 2, 0)
    assert any(copied < 8 for *_, copied in directs) and any(copied == 8 for *_, copied in directs)


def test_batches_of_a_quiet_sender_are_lazy_and_still_arrive_in_order(routed, monkeypatch):
    """A sender quiet for a while has its (empty) batches read lazily; when it
    speaks again its messages arrive, in order."""
    rt, router = routed
    accepted = []
    for name in ("accept_batch", "accept_in_place"):   # through a link, in place
        def recording(self, *args, _original=getattr(Inbound, name), **kwargs):
            b = _original(self, *args, **kwargs)
            accepted.append(b)
            return b
        monkeypatch.setattr(Inbound, name, recording)
    sink = counter(rt, "sink", 1)
    fwd = counter(rt, "fwd", 0, params=[sink.address])
    for _ in range(8):
        rt.step([fwd, sink])
    rt.synchronize()
    rt.poll()
    assert fwd.quiet_batches >= QUIET_BATCHES
    assert any(b.lazy and b.source is fwd for b in accepted)
    for v in range(1, 6):
        rt.send(fwd, words(v), tag=COUNTER_TAG_FORWARD)
    settle(rt, [fwd, sink], lambda: state(rt, sink).count == 5)
    st = state(rt, sink)
    assert (st.count, st.sum, st.fifo_errors) == (5, 15, 0)


def test_in_place_is_the_default_where_devices_share_memory(manager):
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    router = CrossGpuK2KRouter(rt.coordinator, rt)
    try:
        assert rt.exports_outboxes(0) and rt.exports_outboxes(1)
        sink = counter(rt, "sink", 1)
        fwd = counter(rt, "fwd", 0, params=[sink.address])
        assert isinstance(fwd.outbox, ExportedBuffer)
        rt.send(fwd, words(7), tag=COUNTER_TAG_FORWARD)
        settle(rt, [fwd, sink], lambda: state(rt, sink).count == 1)
        assert state(rt, sink).sum == 7
        eng = router._engine
        assert router.transfer_method(0, 1) == "dmabuf"
        assert (0, 1) not in eng.links and any(key[:2] == (0, 1) for key in eng.peers.relays)
        assert fwd.outbox.imports() and router.edge_traffic()[(0, 1)][1] > 0
    finally:
        router.detach()
        rt.destroy()


def test_destroying_a_sender_read_in_place_drops_its_batches(manager):
    """The sink's device does not step while the sender's batches wait there in
    place; destroying the sender drops them (its memory goes) and the sink
    steps on."""
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    router = CrossGpuK2KRouter(rt.coordinator, rt)
    try:
        sink = counter(rt, "sink", 1)
        fwd = counter(rt, "fwd", 0, params=[sink.address])
        other = counter(rt, "other", 0, params=[sink.address])
        for v in range(1, 4):
            rt.send(fwd, words(v), tag=COUNTER_TAG_FORWARD)
            rt.send(other, words(10 * v), tag=COUNTER_TAG_FORWARD)
        for _ in range(2):
            rt.step([fwd, other])
        rt.synchronize()
        views = fwd.outbox.imports()
        assert views
        fwd.destroy()
        assert all(v.destroyed for v in views)
        assert not any(b.buffer in views for b in rt._device(1)[1].batches)
        settle(rt, [other, sink], lambda: state(rt, sink).count == 3)
        st = state(rt, sink)
        assert (st.count, st.sum, st.fifo_errors) == (3, 60, 0)
    finally:
        router.detach()
        rt.destroy()


def test_accept_batch_checks_the_direct_and_lazy_options(manager):
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    from vkmulti import Buffer
    buf = Buffer(manager.slot(1), 64 + 4 * rt.slot_size)
    try:
        k0 = counter(rt, "k0", 0)
        k1 = counter(rt, "k1", 1)
        with pytest.raises(ValueError, match="not a kernel of this runtime on GPU 1"):
            rt.accept_batch(1, buf, direct=k0)
        with pytest.raises(TypeError, match="direct must be a Kernel"):
            rt.accept_batch(1, buf, direct="k1")
        with pytest.raises(ValueError, match="direct_slots"):
            rt.accept_batch(1, buf, direct=k1, direct_slots=5)
        with pytest.raises(TypeError, match="lazy must be a bool"):
            rt.accept_batch(1, buf, lazy=1)
        b = rt.accept_batch(1, buf, direct=k1, direct_slots=2, lazy=True)
        assert (b.direct, b.direct_slots, b.lazy) == (k1, 2, True)
        assert rt.withdraw_batch(b, timeout=5) == 0
    finally:
        rt.destroy()
        buf.destroy()


def test_a_batch_a_kernel_already_had_a_pass_over_is_never_direct_for_it(manager):
    """A direct pass that the host trusts (the sender's survey read back) takes
    every message of the batch: it must never follow an ordinary pass over the
    same batch for that kernel, which may have delivered some of them already."""
    from vkmulti import Buffer
    from vkmulti.kernels.engine.step_recorder import InFlight

    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    buf = Buffer(manager.slot(1), 64 + 8 * rt.slot_size)
    try:
        x = counter(rt, "x", 1)
        sender = counter(rt, "sender", 0)
        b = rt.accept_batch(1, buf, source=sender, direct=x)
        stepper = rt._device(1)[1]
        chosen = stepper.recorder._directs([x], InFlight(1, 0), lambda words: 0, [b])
        assert [(k, batch) for k, batch, *_ in chosen] == [(x, b)] and x in b.cleared
        b.cleared.discard(x)
        b.passed.add(id(x))
        assert stepper.recorder._directs([x], InFlight(1, 0), lambda words: 0, [b]) == []
        assert rt.withdraw_batch(b, timeout=5) == 0
    finally:
        rt.destroy()
        buf.destroy()
