"""A lost GPU's kernels restored on the survivor from their policy checkpoints and
replayed (virtual pair, fault hook): the stencil soak gives the field of a run
without loss bit for bit; counters under K2K load across the loss see every
message exactly once and in order; a checkpoint N steps back, critical kernels,
no policy (kernels lost and listed), the primary lost, destroy racing the recovery."""
from __future__ import annotations

import os
import struct
import threading

import numpy as np
import pytest

from vkmulti import MultiDeviceManager
from vkmulti.errors import PrimaryDeviceLostError, VkmError
from vkmulti.kernels import CheckpointPolicy, CrossGpuK2KRouter, KernelRuntime, MultiGpuCoordinator, counter_kernel
from vkmulti.kernels.reference import (COUNTER_TAG_ADD, COUNTER_TAG_FORWARD, counter_initial_state, jacobi_reference,
                                       read_counter)
from vkmulti.kernels.lifecycle.replay_log import envelope_of
from vkmulti.kernels.stencil import StencilSlabs, stencil_payload_size
from vkmulti.apps.stencil import initial_field
from vkmulti.testing import lose_device

FULL = os.environ.get("VKMULTI_SOAK_FULL") == "1"


def _stencil(width, height, steps, lose_at, policy):
    f, top, bottom = initial_field(width, height)
    mgr = MultiDeviceManager.create()
    try:
        coord = MultiGpuCoordinator.from_manager(mgr)
        rt = KernelRuntime(coord, mgr, payload_size=stencil_payload_size(width), max_kernels=8)
        if policy is not None:
            rt.set_checkpoint_policy(policy)
        router = CrossGpuK2KRouter(coord, rt)
        slabs = StencilSlabs(rt, f, [0, 1], top=top, bottom=bottom)
        for i in range(steps):
            if i == lose_at:
                rt.synchronize(10)     # (the hook's drain needs the relays: see docs/explanation/failover.md)
                lose_device(mgr, 1)
            slabs.step(1)              # never raises for the lost secondary
        out = slabs.field() if not rt.lost_kernels else rt.read_state(slabs.kernels[0], steps % 2)
        stats = rt.failover_stats.snapshot()
        restored, lost = dict(rt.restored_kernels), dict(rt.lost_kernels)
        slabs.destroy()
        router.detach()
        rt.destroy(timeout=10)
        return out, jacobi_reference(f, top, bottom, steps), stats, restored, lost
    finally:
        mgr.destroy(timeout=10)


def test_stencil_soak_secondary_lost_mid_run_gives_the_same_field():
    """The issue's proof: 200 steps, the secondary lost at step 100 (the CI grid is small;
    VKMULTI_SOAK_FULL=1: the demo's 512x384)."""
    size = (512, 384) if FULL else (96, 64)
    out, ref, stats, restored, lost = _stencil(*size, 200, 100, CheckpointPolicy(every_steps=16))
    assert np.array_equal(out, ref)
    assert restored == {"stencil-1": (1, 0)} and not lost
    assert stats.devices_lost == [1] and stats.kernels_restored == 1
    assert 0 < stats.steps_replayed <= 16 and stats.messages_replayed >= 1
    assert stats.recoveries and stats.recoveries[0].seconds < 10


@pytest.mark.parametrize("every, critical", [(1, ()), (5, ()), (0, ("stencil-1",))])
def test_stencil_restored_from_a_checkpoint_n_steps_back_or_critical(every, critical):
    out, ref, stats, restored, _ = _stencil(48, 24, 23, 17, CheckpointPolicy(every_steps=every, critical=critical))
    assert np.array_equal(out, ref)
    assert restored == {"stencil-1": (1, 0)}
    if every == 5:   # checkpoint at step 15: steps 15 and 16 run again
        assert stats.steps_replayed == 2
    else:            # a checkpoint after every step: at most the last one or two run again
        assert stats.steps_replayed <= 2


def test_no_policy_loses_the_kernels_and_lists_them():
    """Without a checkpoint policy nothing is logged: the lost kernel is released and
    listed; what survivors send it later is counted as dead letters (no exception)."""
    out, ref, stats, restored, lost = _stencil(48, 24, 12, 6, None)
    assert lost == {"stencil-1": 1} and not restored and stats.kernels_restored == 0
    assert stats.devices_lost == [1] and stats.steps_replayed == 0
    mgr = MultiDeviceManager.create()
    try:
        rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr))
        a = rt.launch(counter_kernel(), "a", device=0, state=[counter_initial_state()])
        rt.launch(counter_kernel(), "b", device=1, state=[counter_initial_state()])
        rt.step().wait(10)
        lose_device(mgr, 1)
        rt.send(a, struct.pack("<I", 5), tag=COUNTER_TAG_ADD)
        rt.step().wait(10)
        assert rt.lost_kernels == {"b": 1} and not rt.restored_kernels
        assert rt.failover_stats.kernels_restored == 0 and read_counter(rt.read_state(a, 0)).sum == 5
        rt.destroy(timeout=10)
    finally:
        mgr.destroy(timeout=10)


def _counters(lose_at, steps=24, every=5):
    """Counters a (GPU 0) and b (GPU 1) forward every host message to each other (K2K in
    both directions each step); GPU 1 lost before step `lose_at`. Returns both states."""
    mgr = MultiDeviceManager.create()
    try:
        coord = MultiGpuCoordinator.from_manager(mgr)
        rt = KernelRuntime(coord, mgr)
        rt.set_checkpoint_policy(CheckpointPolicy(every_steps=every))
        router = CrossGpuK2KRouter(coord, rt)
        a = rt.launch(counter_kernel(), "a", device=0, state=[counter_initial_state()])
        b = rt.launch(counter_kernel(), "b", device=1, state=[counter_initial_state()])
        a.set_params(b.address, 0, 0, 0)
        b.set_params(a.address, 0, 0, 0)
        for i in range(steps):
            if i == lose_at:
                rt.synchronize(10)
                lose_device(mgr, 1)
            for j in range(3):   # load: three forwards to each per step
                rt.send(a, struct.pack("<I", 1000 * i + j + 1), tag=COUNTER_TAG_FORWARD)
                rt.send(b, struct.pack("<I", 1000 * i + j + 7), tag=COUNTER_TAG_FORWARD)
            rt.step().wait(10)
        for _ in range(4):   # let the last forwards land
            rt.step().wait(10)
        rt.synchronize(10)
        sa, sb = read_counter(rt.read_state(a, 0)), read_counter(rt.read_state(b, 0))
        stats = rt.failover_stats.snapshot()
        router.detach()
        rt.destroy(timeout=10)
        return sa, sb, stats
    finally:
        mgr.destroy(timeout=10)


def test_counters_under_k2k_load_see_every_message_once_in_order_across_the_loss():
    ra, rb, _ = _counters(None)
    a, b, stats = _counters(13)
    for got, ref in ((a, ra), (b, rb)):
        assert got.fifo_errors == 0 and got.failed_emits == 0
        assert (got.count, got.sum, got.forwards) == (ref.count, ref.sum, ref.forwards)
    assert stats.kernels_restored == 1 and stats.steps_replayed == 3   # checkpoint at 10: steps 10-12 again


def test_losing_the_primary_is_an_error_with_a_policy_too():
    mgr = MultiDeviceManager.create()
    try:
        rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr))
        rt.set_checkpoint_policy(CheckpointPolicy(every_steps=1))
        rt.launch(counter_kernel(), "a", device=0, state=[counter_initial_state()])
        rt.launch(counter_kernel(), "b", device=1, state=[counter_initial_state()])
        rt.step().wait(10)
        lose_device(mgr, 0)
        with pytest.raises(PrimaryDeviceLostError):
            rt.step()
        assert rt.failover_stats.kernels_restored == 0
        rt.destroy(timeout=10)
    finally:
        mgr.destroy(timeout=10)


def test_destroy_racing_the_recovery_from_another_thread():
    """One thread steps into the recovery while another destroys the runtime: both end
    (no hang, no crash); whatever the stepping thread gets is a VkmError."""
    for delay in (0.0, 0.002):
        mgr = MultiDeviceManager.create()
        try:
            coord = MultiGpuCoordinator.from_manager(mgr)
            rt = KernelRuntime(coord, mgr, payload_size=stencil_payload_size(48), max_kernels=8)
            rt.set_checkpoint_policy(CheckpointPolicy(every_steps=4))
            router = CrossGpuK2KRouter(coord, rt)
            f, top, bottom = initial_field(48, 24)
            slabs = StencilSlabs(rt, f, [0, 1], top=top, bottom=bottom)
            slabs.step(7)
            rt.synchronize(10)
            lose_device(mgr, 1)
            errors = []

            def stepper():
                try:
                    for _ in range(5):
                        rt.step()
                except VkmError as exc:
                    errors.append(exc)
            t = threading.Thread(target=stepper)
            t.start()
            threading.Event().wait(delay)
            router.detach(timeout=10)
            rt.destroy(timeout=10)
            t.join(20)
            assert not t.is_alive()
            assert all(isinstance(e, VkmError) for e in errors)
        finally:
            mgr.destroy(timeout=10)


def test_stencil_demo_drill_exits_0_with_an_identical_field(capsys):
    from vkmulti.apps.cli import main

    assert main(["demo", "stencil", "--lose-gpu", "1@20", "--size", "64x32", "--steps", "40",
                 "--checkpoint-every", "8", "--output", "", "--json"]) == 0
    import json
    r = json.loads(capsys.readouterr().out)
    assert r["identical"] and r["kernels_restored"] == 1 and r["restored"] == {"stencil-1": [1, 0]}
    assert r["steps_replayed"] == 4 and r["recovery_ms"] > 0
    with pytest.raises(SystemExit):
        main(["demo", "stencil", "--lose-gpu", "1@50", "--steps", "40", "--output", ""])   # past the steps run


def test_loss_met_inside_a_step_restores_and_steps_the_kernel_in_that_step():
    """No check before the step sees the loss: the submit on the lost GPU fails, the
    runtime fails over inside step() and the restored slab makes that step on GPU 0."""
    f, top, bottom = initial_field(48, 24)
    mgr = MultiDeviceManager.create()
    try:
        coord = MultiGpuCoordinator.from_manager(mgr)
        rt = KernelRuntime(coord, mgr, payload_size=stencil_payload_size(48), max_kernels=8)
        rt.set_checkpoint_policy(CheckpointPolicy(every_steps=4))
        router = CrossGpuK2KRouter(coord, rt)
        slabs = StencilSlabs(rt, f, [0, 1], top=top, bottom=bottom)
        slabs.step(10)
        rt.synchronize(10)
        stepper0 = rt._contexts[0][1]
        original = stepper0.step

        def then_lose(*a, **kw):   # GPU 1 is lost right after GPU 0's part of the step was submitted
            out = original(*a, **kw)
            del stepper0.step
            lose_device(mgr, 1)
            return out
        stepper0.step = then_lose
        ticket = rt.step(slabs.kernels)
        assert sorted(k.id for k in ticket.launched) == ["stencil-0", "stencil-1"] and not ticket.deferred, ticket.deferred
        slabs.steps += 1
        slabs.step(9)
        assert np.array_equal(slabs.field(), jacobi_reference(f, top, bottom, 20))
        assert rt.restored_kernels == {"stencil-1": (1, 0)} and rt.failover_stats.steps_replayed == 2
        slabs.destroy()
        router.detach()
        rt.destroy(timeout=10)
    finally:
        mgr.destroy(timeout=10)


def test_a_real_loss_whose_last_copies_are_not_trusted_releases_the_kernel_cleanly():
    """As on a real VK_ERROR_DEVICE_LOST (the lost device's memory is undefined): the
    copies not read before the loss are dropped, the kernel's inputs since its
    checkpoint are then not all logged, so it is released and listed, nothing raised,
    and what the survivor sends it later are dead letters."""
    f, top, bottom = initial_field(48, 24)
    mgr = MultiDeviceManager.create()
    try:
        coord = MultiGpuCoordinator.from_manager(mgr)
        rt = KernelRuntime(coord, mgr, payload_size=stencil_payload_size(48), max_kernels=8)
        rt.set_checkpoint_policy(CheckpointPolicy(every_steps=4))
        router = CrossGpuK2KRouter(coord, rt)
        slabs = StencilSlabs(rt, f, [0, 1], top=top, bottom=bottom)
        slabs.step(10)
        rt.synchronize(10)
        lose_device(mgr, 1)
        mgr.slot(1).lost_drained = False      # as a real loss: the copies not read yet are not trusted
        for _ in range(3):
            rt.step(slabs.kernels).wait(10)   # nothing raised
        assert rt.lost_kernels == {"stencil-1": 1} and not rt.restored_kernels
        assert rt.failover_stats.kernels_restored == 0 and rt.dead_letters >= 1
        slabs.destroy()
        router.detach()
        rt.destroy(timeout=10)
    finally:
        mgr.destroy(timeout=10)


def test_the_replay_log_holds_what_each_step_consumed_across_the_k2k_fast_paths():
    """Under a policy the log reads each step's input from the kernel's inbox ring, so no step
    reads a landing in place (its inbox would keep older slots: the merge of in-place K2K
    reading logged those as the input and replayed the lost slab on them). Each stencil step
    consumes its neighbour's halo of the step before, and only that."""
    width, height = 96, 64
    f, top, bottom = initial_field(width, height)
    mgr = MultiDeviceManager.create()
    try:
        coord = MultiGpuCoordinator.from_manager(mgr)
        rt = KernelRuntime(coord, mgr, payload_size=stencil_payload_size(width), max_kernels=8)
        rt.set_checkpoint_policy(CheckpointPolicy(every_steps=1000))   # (one checkpoint: inputs kept since)
        router = CrossGpuK2KRouter(coord, rt)
        slabs = StencilSlabs(rt, f, [0, 1], top=top, bottom=bottom)
        slabs.step(40)
        rt.synchronize(10)
        replay = rt._lifecycle.policy_state.replay
        replay.materialize(wait=True, timeout=10)
        for k in slabs.kernels:
            kl = replay.kernels[k.id]
            steps = sorted(s for s in kl.inputs if s >= 1)
            assert steps == list(range(1, 40)), (k.id, steps)
            for s in steps:
                seqs = [envelope_of(slot)[2] for slot in kl.inputs[s]]
                assert seqs == [s - 1], (k.id, s, seqs)
        slabs.destroy()
        router.detach()
        rt.destroy(timeout=10)
    finally:
        mgr.destroy(timeout=10)


@pytest.mark.parametrize("twins_on", [True, False])
def test_the_lost_half_is_freed_off_the_restore_path(monkeypatch, twins_on):
    """The buffers a restored kernel left on the lost GPU are destroyed by the ready-twin
    thread, after the restore (the kernel steps on its new device meanwhile); with
    ready twins off, by the restore itself."""
    from vkmulti.kernels.lifecycle import ready_twins as ready_module
    gate, freeing, handed = threading.Event(), threading.Event(), []
    real_free, real_later = ready_module.free_retired, ready_module.ReadyTwins.free_later

    def held_free(rt, item):
        if threading.current_thread().name == "vkmulti-twins":
            freeing.set()
            assert gate.wait(60), "the test never let the buffers be freed"
        real_free(rt, item)

    def later(self, item):
        handed.extend(item.buffers)
        real_later(self, item)
    monkeypatch.setattr(ready_module, "free_retired", held_free)
    monkeypatch.setattr(ready_module.ReadyTwins, "free_later", later)
    mgr = MultiDeviceManager.create()
    try:
        rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr))
        rt.set_checkpoint_policy(CheckpointPolicy(every_steps=1))
        rt.ready_twins.enabled = twins_on
        rt.launch(counter_kernel(), "a", device=0, state=[counter_initial_state()])
        b = rt.launch(counter_kernel(), "b", device=1, state=[counter_initial_state()])
        rt.send(b, struct.pack("<I", 7), tag=COUNTER_TAG_ADD)
        rt.step().wait(10)
        lose_device(mgr, 1)
        rt.step().wait(10)   # the failover restores b on GPU 0
        assert rt.restored_kernels == {"b": (1, 0)} and b.device_index == 0
        assert handed and all(x.slot.index == 1 for x in handed)
        if twins_on:
            assert freeing.wait(60)
            assert all(x.handle is not None for x in handed)   # held in the thread: not freed yet
        else:
            assert all(x.handle is None for x in handed) and not freeing.is_set()
        rt.send(b, struct.pack("<I", 5), tag=COUNTER_TAG_ADD)
        rt.step().wait(10)
        assert read_counter(rt.read_state(b, 0)).sum == 12
        gate.set()
        assert rt.ready_twins.wait_idle(60)
        assert all(x.handle is None for x in handed)
        rt.destroy(timeout=10)
    finally:
        gate.set()
        mgr.destroy(timeout=10)


def test_stencil_lost_before_its_first_step_is_restored_from_its_launch_capture():
    """GPU 1 lost before step 0: the policy's capture at launch is what its slab
    comes back from (nothing to replay), so the field is the run without loss."""
    out, ref, stats, restored, lost = _stencil(48, 24, 6, 0, CheckpointPolicy(every_steps=16))
    assert not lost and restored == {"stencil-1": (1, 0)}
    assert np.array_equal(out, ref)
    assert stats.kernels_restored == 1 and stats.steps_replayed == 0


@pytest.mark.parametrize("at", [0, 3])
def test_counters_lost_in_the_first_steps_see_every_message_once(at):
    """Under K2K load, a loss before any step or before the first due checkpoint
    (every 5 steps): restored from the launch capture, its steps replayed from the log."""
    ra, rb, _ = _counters(None, steps=8)
    a, b, stats = _counters(at, steps=8)
    for got, ref in ((a, ra), (b, rb)):
        assert got.fifo_errors == 0 and got.failed_emits == 0
        assert (got.count, got.sum, got.forwards) == (ref.count, ref.sum, ref.forwards)
    assert stats.kernels_restored == 1 and stats.steps_replayed == at


def test_a_kernel_restored_as_new_is_not_captured_before_its_image_is_written():
    """rt.restore(cp) as a new kernel launches it, then writes the image: the policy's
    launch capture must not stand for it (it would hold the blank launch state)."""
    mgr = MultiDeviceManager.create()
    try:
        rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr))
        rt.set_checkpoint_policy(CheckpointPolicy(every_steps=1000))
        a = rt.launch(counter_kernel(), "a", device=0, state=[counter_initial_state()])
        for i in range(3):
            rt.send(a, struct.pack("<I", i + 1), tag=COUNTER_TAG_ADD)
            rt.step().wait(10)
        cp = rt.checkpoint(a)
        b = rt.restore(cp, device=1, kernel_id="b")
        rt.synchronize(10)
        got = rt.latest_checkpoint(b)
        assert got is not None and got.metadata.current_step == b.steps == 3
        assert read_counter(got.get_device_memory("state0").data).sum == 6
        rt.destroy(timeout=10)
    finally:
        mgr.destroy(timeout=10)


def _counter_lost_after(prepare):
    """Counter `a` on GPU 1 under a policy (every 2 steps); `prepare(rt, a, step)` runs its
    steps and returns the kernel and the sum it holds; then one message, GPU 1 lost, one
    more: it must be restored on GPU 0 with every message once."""
    mgr = MultiDeviceManager.create()
    try:
        rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr))
        rt.set_checkpoint_policy(CheckpointPolicy(every_steps=2))
        a = rt.launch(counter_kernel(), "a", device=1, state=[counter_initial_state()])

        def step(k, v):
            rt.send(k, struct.pack("<I", v), tag=COUNTER_TAG_ADD)
            rt.step().wait(10)
        k, total = prepare(rt, a, step)
        step(k, 100)
        rt.synchronize(10)
        lose_device(mgr, 1)
        step(k, 1000)
        rt.synchronize(10)
        restored, lost = dict(rt.restored_kernels), dict(rt.lost_kernels)
        got = None if lost else read_counter(rt.read_state(k, 0)).sum
        rt.destroy(timeout=10)
        return restored, lost, got, total + 1100
    finally:
        mgr.destroy(timeout=10)


def test_a_kernel_restored_into_is_restored_after_a_loss_from_its_restored_state():
    """rt.restore(cp, into=a) rolls a back from step 6 to 3: its policy captures of steps
    up to 6 no longer hold its state (a loss would find no way back, 'checkpoint at step 6');
    it is captured at once as restored."""
    def prepare(rt, a, step):
        for i in range(3):
            step(a, i + 1)
        cp = rt.checkpoint(a)
        for i in range(3, 6):
            step(a, i + 1)
        rt.restore(cp, into=a)
        return a, 6
    restored, lost, got, want = _counter_lost_after(prepare)
    assert not lost and restored == {"a": (1, 0)}
    assert got == want


def test_a_kernel_launched_under_a_destroyed_ones_id_gets_its_own_launch_capture():
    """A kernel destroyed after its capture at step 4, and a new one launched under its id:
    the new one's latest checkpoint is its own launch capture, not the old kernel's."""
    def prepare(rt, a, step):
        for _ in range(5):
            step(a, 1)
        rt.synchronize(10)
        assert rt.latest_checkpoint(a).metadata.current_step == 4
        rt.destroy_kernel(a)
        b = rt.launch(counter_kernel(), "a", device=1, state=[counter_initial_state()])
        rt.synchronize(10)   # (its launch capture read back)
        got = rt.latest_checkpoint(b)
        assert got is not None and got.metadata.current_step == 0
        assert read_counter(got.get_device_memory("state0").data).sum == 0
        return b, 0
    restored, lost, got, want = _counter_lost_after(prepare)
    assert not lost and restored == {"a": (1, 0)}
    assert got == want
