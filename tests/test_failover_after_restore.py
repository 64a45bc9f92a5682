"""A kernel restored into from an earlier checkpoint (`rt.restore(cp, into=b)`), then its
GPU lost: the failover restores it on the survivor and replays it from the replay log.
Compared with the same run in which b moves to the survivor by a live migration at
that point instead of the loss (same devices from there on: the same hops, the same
order of deliveries), everything must be the same: both kernels' state bytes, their
step counts and stats (the clock aside: not replayed), every reply b sends the host,
and the replay log's counters (what each pair consumed and has not, each kernel's
logged steps, the step() calls, the latest checkpoints).

Virtual pair, fault hook, CheckpointPolicy(every_steps=3); counters a (GPU 0) and
b (GPU 1) forward every host message to each other, b answers host queries.
"""
from __future__ import annotations

import dataclasses
import struct

import pytest

from vkmulti import CrossGpuK2KRouter, MultiDeviceManager
from vkmulti.kernels import CheckpointPolicy, KernelRuntime, MultiGpuCoordinator, counter_kernel
from vkmulti.kernels.reference import COUNTER_TAG_FORWARD, COUNTER_TAG_QUERY, counter_initial_state
from vkmulti.testing import lose_device

STEPS, CHECKPOINT_AT, MAX = 20, 4, 32


def _run(restore_at: int | None, change_at: int, lose: bool, in_flight: bool) -> dict:
    """The run: b's checkpoint at step CHECKPOINT_AT, restored into b at `restore_at`,
    then at `change_at` GPU 1 lost (`lose`) or b migrated to GPU 0 (once every step
    submitted is done; `in_flight`: right after a step's submit, before the host read
    it back). Returns what is compared."""
    mgr = MultiDeviceManager.create()
    try:
        coord = MultiGpuCoordinator.from_manager(mgr)
        rt = KernelRuntime(coord, mgr, max_kernels=MAX)
        rt.set_checkpoint_policy(CheckpointPolicy(every_steps=3))
        router = CrossGpuK2KRouter(coord, rt)
        a = rt.launch(counter_kernel(max_sources=MAX), "a", device=0, state=[counter_initial_state(MAX)])
        b = rt.launch(counter_kernel(max_sources=MAX), "b", device=1, state=[counter_initial_state(MAX)])
        a.set_params(b.address, 0, 0, 0)
        b.set_params(a.address, 0, 0, 0)

        def change() -> None:
            if lose:
                lose_device(mgr, 1)
            else:
                rt.migrate(b, 0, timeout=20)
        cp = None
        for i in range(STEPS):
            if i == CHECKPOINT_AT:
                cp = rt.checkpoint(b)
            if i == restore_at:
                rt.restore(cp, into=b)
            if i == change_at and not in_flight:
                change()
            rt.send(a, struct.pack("<I", 100 + i), tag=COUNTER_TAG_FORWARD)
            rt.send(b, struct.pack("<I", 1000 + i), tag=COUNTER_TAG_FORWARD)
            if i % 3 == 0:
                rt.send(b, b"", tag=COUNTER_TAG_QUERY)
            rt.step(timeout=10)
            if i + 1 == change_at and in_flight:
                change()
            rt.synchronize(10)   # (each step's batches delivered at the next: the same steps in both runs)
        for _ in range(4):
            rt.step(timeout=10)
        rt.synchronize(10)
        replies = []
        while rt.pending_receives(b):
            m = rt.receive(b, timeout=1)
            replies.append((m.tag, m.sequence, bytes(m.payload)))
        policy = rt._lifecycle.policy_state   # (the log's own counters)
        policy.replay.materialize(wait=True)
        log = policy.replay
        out = {
            "state a": bytes(rt.read_state(a)), "state b": bytes(rt.read_state(b)),
            "steps": (a.steps, b.steps), "devices": (a.device_index, b.device_index),
            "stats a": _counts(a), "stats b": _counts(b), "replies b": replies,
            "consumed": dict(log.streams.consumed),
            "not consumed": {key: [n for n, _, _ in q] for key, q in log.streams.sent.items() if q},
            "logged steps": {kid: (sorted(kl.inputs), kl.first, kl.last, kl.gap) for kid, kl in log.kernels.items()},
            "calls": log.call, "handed": {kid: len(q) for kid, q in log.handed.items() if q},
            "latest checkpoints": {k.id: rt.latest_checkpoint(k).metadata.current_step for k in (a, b)},
            "dead letters": rt.dead_letters, "errors": (list(a.errors), list(b.errors)),
        }
        restored = dict(rt.restored_kernels)
        router.detach()
        rt.destroy(timeout=10)
        assert restored == ({"b": (1, 0)} if lose else {})
        return out
    finally:
        mgr.destroy(timeout=10)


def _counts(k) -> dict:
    return {f: v for f, v in dataclasses.asdict(k.stats).items() if f != "clock"}


@pytest.mark.parametrize("restore_at, lose_at, in_flight", [
    (8, 12, False),    # two steps since b's latest capture to replay, numbers set back four steps
    (8, 11, True),     # and one step that ran on GPU 1 unread: its reply and counts read after the loss
    (None, 12, True),  # no restore: one step in flight
    (5, 10, False),    # b's numbers set back one step: its stream past its earlier messages by the loss
])
def test_restored_then_lost_is_as_if_moved(restore_at, lose_at, in_flight):
    """Before the fix: a replayed step counted twice in b's stats (steps_submitted,
    messages consumed and sent); b's replies lost their place (handed-again messages
    went ahead of the host's); a message b sent after its restore with a number its
    receiver had consumed before was taken for consumed and dropped (a missed it:
    count 39 of 40, a FIFO error more); every handed-again message arrived with one
    hop less than a moved one (hops_sum); the reply of a step in flight at the loss
    was lost."""
    moved = _run(restore_at, lose_at, lose=False, in_flight=in_flight)
    lost = _run(restore_at, lose_at, lose=True, in_flight=in_flight)
    assert moved["devices"] == lost["devices"] == (0, 0)
    for key in moved:
        assert lost[key] == moved[key], key
