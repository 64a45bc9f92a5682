"""Calls on a kernel racing the failover of its GPU (virtual pair, fault hook,
checkpoint policy): each forced interleaving of the defects the lost-GPU matrix
(kernel_races.loss_matrix, run by test_kernel_destroy_races.py) found. Every
call ends, on the survivor or with a vkmulti error; the kernel ends up restored
or listed lost, never left on the lost GPU or destroyed while it runs."""
from __future__ import annotations

import os
import struct
import threading

import numpy as np
import pytest

from child_runs import printed_in_order, run_script
from vkmulti import MigrationError, MultiDeviceManager
from vkmulti.kernels import CheckpointPolicy, KernelRuntime, MultiGpuCoordinator, counter_kernel
from vkmulti.kernels.lifecycle import live_migration, replay
from vkmulti.kernels.reference import COUNTER_TAG_ADD, COUNTER_TAG_QUERY, counter_initial_state, read_counter
from vkmulti.testing import lose_device

HERE = os.path.dirname(os.path.abspath(__file__))


class _Runtime:
    """A runtime over a fresh manager under `policy`, with counter `k` on GPU 1."""

    def __init__(self, policy: CheckpointPolicy):
        self.mgr = MultiDeviceManager.create()
        self.rt = KernelRuntime(MultiGpuCoordinator.from_manager(self.mgr))
        self.rt.set_checkpoint_policy(policy)
        self.k = self.rt.launch(counter_kernel(), "k", device=1, state=[counter_initial_state()])

    def add(self, *values: int) -> None:
        for v in values:
            self.rt.send(self.k, struct.pack("<I", v), tag=COUNTER_TAG_ADD)
            self.rt.step().wait(10)

    def __enter__(self) -> "_Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.rt.destroy(timeout=10)
        finally:
            self.mgr.destroy(timeout=10)


def test_the_reply_of_a_step_running_at_the_loss_comes_once():
    """A query's step was submitted and ran on GPU 1 (the hook's drain), but the host had
    not read it back when the GPU was lost, and the kernel's capture at the end of that
    very step is what the failover restores it from: nothing to replay, and the reply
    was dropped with the GPU (receive() without a timeout then waited for ever; the
    lost-GPU matrix's receive hang). The failover now reads the reports of a drained
    GPU's steps as a harvest would: the reply comes once, the counts are the run's."""
    with _Runtime(CheckpointPolicy(critical=["k"])) as r:
        r.add(1, 2, 3)
        r.rt.send(r.k, b"", tag=COUNTER_TAG_QUERY)
        r.rt.step()   # submitted, not read back
        lose_device(r.mgr, 1)
        r.rt.step()
        assert dict(r.rt.restored_kernels) == {"k": (1, 0)}
        reply = r.rt.receive(r.k, timeout=10)
        assert struct.unpack_from("<2I", reply.payload) == (4, 6) and r.rt.pending_receives(r.k) == 0
        r.rt.synchronize(10)
        st = r.k.stats
        assert (st.steps_submitted, st.steps_completed, st.messages_consumed, st.messages_to_host) == (5, 5, 4, 1)


def test_the_reply_of_a_step_running_at_the_loss_ends_a_receive_without_timeout():
    """The same, with receive(timeout=None) in a child process (a hang is cut after 120 s)."""
    script = f"""
import struct, sys
sys.path.insert(0, {HERE!r})
import conftest   # the virtual pair and validation, as in the tests
from test_failover_races import _Runtime
from vkmulti.kernels import CheckpointPolicy
from vkmulti.kernels.reference import COUNTER_TAG_QUERY
from vkmulti.testing import lose_device
with _Runtime(CheckpointPolicy(critical=["k"])) as r:
    r.add(1, 2, 3)
    r.rt.send(r.k, b"", tag=COUNTER_TAG_QUERY)
    r.rt.step()
    lose_device(r.mgr, 1)
    r.rt.step()
    print("reply", *struct.unpack_from("<2I", r.rt.receive(r.k, timeout=None).payload), flush=True)
from vkmulti.device.instance import drain_all_validation_messages
print("validation errors:", [t for sev, t in drain_all_validation_messages() if sev == "error"][:2], flush=True)
"""
    p = run_script(script, "receive(timeout=None)", 120, HERE)
    printed_in_order(p, ["reply 4 6", "validation errors: []"], "receive(timeout=None)")


def test_a_move_onto_a_gpu_lost_during_its_switch_leaves_the_kernel_where_it_was(monkeypatch):
    """GPU 1 lost while a migration of k from GPU 0 to GPU 1 swaps, and failed over from
    another thread's wait meanwhile: that failover found no kernel on GPU 1, then the
    swap put k there, a kernel no failover would ever see again (every call on it
    raised DeviceLostError, steps skipped it, neither restored nor listed lost). A
    failover now runs between the switches of moves (it passes the runtime's gate, as
    steps do) and the swap refuses a device lost meanwhile: k stays on GPU 0."""
    with _Runtime(CheckpointPolicy(every_steps=2)) as r:
        k = r.rt.launch(counter_kernel(), "k0", device=0, state=[counter_initial_state()])
        r.rt.send(k, struct.pack("<I", 5), tag=COUNTER_TAG_ADD)
        r.rt.step().wait(10)
        real = live_migration.finish_move

        def finish_move(*args, **kw):
            lose_device(r.mgr, 1)
            waiter = threading.Thread(target=r.rt.synchronize, args=(10,))
            waiter.start()
            waiter.join(1.0)   # (done at once before the fix; now it waits for the switch to end)
            return real(*args, **kw)
        monkeypatch.setattr(live_migration, "finish_move", finish_move)
        with pytest.raises(MigrationError, match="lost"):
            r.rt.migrate(k, 1, timeout=20)
        monkeypatch.undo()
        r.rt.send(k, struct.pack("<I", 7), tag=COUNTER_TAG_ADD)
        r.rt.step().wait(10)
        r.rt.synchronize(10)
        assert k.device_index == 0 and not k.destroyed and read_counter(r.rt.read_state(k)).sum == 12
        assert dict(r.rt.restored_kernels) == {"k": (1, 0)}


def test_a_restore_into_a_kernel_its_failover_restores_fails_and_the_kernel_lives_on(monkeypatch):
    """Another thread's restore(cp, into=k) of a kernel of the lost GPU landed just before
    the failover's own restore of k: k was on the survivor then, the failover's restore
    of it (inside a step) failed, and the failover released k, a kernel running on
    GPU 0 (destroyed, listed in lost_kernels; its next step's buffers freed under it:
    "Buffer used after destroy()" in the matrix). A restore of a kernel a failover is
    restoring now fails (MigrationError), and the failover restores k as always."""
    with _Runtime(CheckpointPolicy(every_steps=2)) as r:
        r.add(1, 2, 3)
        cp = r.rt.checkpoint(r.k)
        r.add(4)
        real = replay.restore_into
        outcome: list = []

        def restore_into(life, k, *args, **kw):
            def user():
                try:
                    r.rt.restore(cp, into=k, device=0, timeout=10)
                    outcome.append("restored")
                except Exception as exc:   # reported below
                    outcome.append(exc)
            t = threading.Thread(target=user)
            t.start()
            t.join(5.0)
            return real(life, k, *args, **kw)
        monkeypatch.setattr(replay, "restore_into", restore_into)
        lose_device(r.mgr, 1)
        r.rt.step()
        monkeypatch.undo()
        assert len(outcome) == 1 and isinstance(outcome[0], MigrationError), outcome
        assert not r.k.destroyed and r.k.device_index == 0 and not r.rt.lost_kernels
        assert dict(r.rt.restored_kernels) == {"k": (1, 0)}
        r.add(5)
        assert read_counter(r.rt.read_state(r.k)).sum == 15


def test_state_calls_during_the_replay_of_a_restored_kernel_wait_for_its_end(monkeypatch):
    """read_state and write_state of another thread while the failover replays k's steps
    on the survivor: the read returned the checkpoint's state, older than what it had
    read before the loss, and the write landed before the replayed steps, which then
    added to it. They now wait for the end of the restore (as send() does): the read
    sees the state of before the loss, the write comes after every replayed step."""
    with _Runtime(CheckpointPolicy(every_steps=4)) as r:
        r.add(1, 2, 3, 4, 5, 6)   # checkpoint at step 4: two steps to replay
        r.rt.synchronize(10)
        before = read_counter(r.rt.read_state(r.k))
        assert before.sum == 21
        real = replay._replay_steps
        users: list = []
        read: list = []

        def replay_steps(*args):
            if not users:
                def user():
                    read.append(read_counter(r.rt.read_state(r.k, timeout=10)))
                    r.rt.write_state(r.k, 0, np.array([0, 1000, 0], np.uint32), offset=0, timeout=10)
                users.append(threading.Thread(target=user))
                users[0].start()
                users[0].join(1.0)   # (both done at once before the fix; now they wait for the restore)
            return real(*args)
        monkeypatch.setattr(replay, "_replay_steps", replay_steps)
        lose_device(r.mgr, 1)
        r.rt.step()
        monkeypatch.undo()
        users[0].join(10)
        assert not users[0].is_alive() and r.rt.failover_stats.steps_replayed == 2
        assert read == [before]
        st = read_counter(r.rt.read_state(r.k))
        assert (st.count, st.sum) == (0, 1000)


def test_the_failover_drain_waits_for_the_fences_a_drain_that_gave_up_left():
    """GPU 1's queues held behind a gate when the fault hook marks it lost: the hook's
    drain gives up at once and its fences stay with the slot. The failover's own drain
    through the driver (bounded by DRAIN_TIMEOUT) made a new fence per queue on top of
    them, and left both sets pending when the gate was still shut; it waits for the
    hook's fences now (still pending, the same ones), and once the gate opens the next
    drain frees them."""
    import vkmulti
    from gates import Gate
    from vkmulti.device.logical import drain_through_driver
    from vkmulti.kernels.lifecycle import failover

    with _Runtime(CheckpointPolicy()) as r:
        s1 = r.mgr.slot(1)
        r.rt.step().wait(10)
        gate = Gate(s1)
        try:
            for q in s1.queues():
                gate.hold(q)
            with pytest.raises(vkmulti.TimeoutError):
                lose_device(r.mgr, 1, timeout=0.0)
            before = list(s1.pending_fences)
            assert before
            failover.DRAIN_TIMEOUT, saved = 0.2, failover.DRAIN_TIMEOUT
            try:
                r.rt.step()   # the failover: the kernel is lost with its GPU (no checkpoint)
            finally:
                failover.DRAIN_TIMEOUT = saved
            assert r.rt.lost_kernels == {"k": 1}
            assert s1.pending_fences == before
        finally:
            gate.open()
        assert drain_through_driver(s1, 20.0) and s1.pending_fences == []
        s1.native.destroy_timeline(gate.sem)


def test_a_restore_into_a_kernel_of_a_reported_lost_gpu_frees_nothing_its_driver_still_runs():
    """GPU 1 reported lost (the driver keeps running what it was given) while its
    last step still waits behind a gate, then restore(cp, into=k) before any failover:
    k comes back on GPU 0. The half k left on GPU 1 was freed at once (its descriptor
    sets under that step: VUID-vkFreeDescriptorSets-pDescriptorSets-00309); now what it
    left (sets and buffers) goes on the ready-twin thread once the driver ran GPU 1's work."""
    from gates import Gate

    with _Runtime(CheckpointPolicy()) as r:
        r.add(1)
        cp = r.rt.checkpoint(r.k, timeout=10)
        s1 = r.mgr.slot(1)
        gate = Gate(s1)
        try:
            for q in s1.queues():
                gate.hold(q)
            r.rt.send(r.k, struct.pack("<I", 2), tag=COUNTER_TAG_ADD)
            r.rt.step()   # queued behind the gate
            r.mgr.report_device_lost(1, "test")
            left = list(r.k.buffers)
            k = r.rt.restore(cp, into=r.k, timeout=10)
            assert k is r.k and k.device_index == 0
        finally:
            gate.open()
        assert r.rt.ready_twins.wait_idle(30)
        assert all(b.destroyed for b in left)
        r.rt.step().wait(10)
        read_counter(r.rt.read_state(r.k, timeout=10))
        r.rt.synchronize(10)
        from vkmulti.device.logical import drain_through_driver
        assert drain_through_driver(s1, 20.0)
        s1.native.destroy_timeline(gate.sem)


def test_a_step_does_not_record_a_kernel_a_restore_moved_off_its_gpu_while_it_waited_for_room():
    """A step on GPU 1 lets the device lock go while it waits for room (make_room);
    meanwhile GPU 1 is reported lost and restore(cp, into=k) moves k to GPU 0 (no gate:
    its source is lost). The step recorded k on GPU 1 all the same, with GPU 0's
    buffers (the child died of SIGSEGV in the native record); now it leaves k out.
    In a child process (run_child): a crash ends only the child."""
    from test_kernel_destroy_races import run_child

    assert run_child("import test_failover_races as t; t.step_racing_a_restore_off_a_lost_gpu()") == "ok"


def step_racing_a_restore_off_a_lost_gpu() -> None:
    """The child's part of the test above."""
    with _Runtime(CheckpointPolicy()) as r:
        r.add(1)
        cp = r.rt.checkpoint(r.k, timeout=10)
        ctx, stepper = r.rt._contexts[1]
        waiting, go = threading.Event(), threading.Event()
        real = stepper.make_room

        def make_room(kernels, deadline):   # as a wait for room does: the lock let go meanwhile
            real(kernels, deadline)
            ctx.lock.release()
            try:
                waiting.set()
                assert go.wait(20)
            finally:
                ctx.lock.acquire()
        stepper.make_room = make_room
        out: list = []
        t = threading.Thread(target=lambda: out.append(r.rt.step(r.k, timeout=20)))
        t.start()
        try:
            assert waiting.wait(20)
            r.mgr.report_device_lost(1, "test")
            assert r.rt.restore(cp, into=r.k, timeout=10).device_index == 0
        finally:
            go.set()
            t.join(30)
        assert not t.is_alive()
        assert not out or all(k is not r.k or k.device_index == 0 for k in out[0].launched)
        r.rt.step().wait(10)
        r.rt.synchronize(10)
