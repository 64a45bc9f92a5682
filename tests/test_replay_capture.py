"""The replay log's copy of a step is recorded in the step itself (virtual pair,
CheckpointPolicy): a step makes no GPU job of its own for the log, and a step
whose submit failed leaves the log as it was, so the failover of a GPU lost
later still restores its kernels exactly (every message once, in order)."""
from __future__ import annotations

import struct

import pytest

from vkmulti import MultiDeviceManager
from vkmulti.errors import VkmError
from vkmulti.kernels import CheckpointPolicy, CrossGpuK2KRouter, KernelRuntime, MultiGpuCoordinator, counter_kernel
from vkmulti.kernels.lifecycle.replay_log import ReplayLog
from vkmulti.kernels.reference import COUNTER_TAG_FORWARD, counter_initial_state, read_counter
from vkmulti.testing import lose_device

ROUNDS, PER_ROUND = 12, 2


@pytest.fixture
def pair():
    """Counters a (GPU 0) and b (GPU 1) that forward every host message to each other."""
    mgr = MultiDeviceManager.create()
    coord = MultiGpuCoordinator.from_manager(mgr)
    rt = KernelRuntime(coord, mgr)
    rt.set_checkpoint_policy(CheckpointPolicy(every_steps=4))
    router = CrossGpuK2KRouter(coord, rt)
    a = rt.launch(counter_kernel(), "a", device=0, state=[counter_initial_state()])
    b = rt.launch(counter_kernel(), "b", device=1, state=[counter_initial_state()])
    a.set_params(b.address, 0, 0, 0)
    b.set_params(a.address, 0, 0, 0)
    yield mgr, rt, a, b
    router.detach()
    rt.destroy(timeout=10)
    mgr.destroy(timeout=10)


def _send_round(rt, i):
    for j in range(PER_ROUND):
        rt.send("a", struct.pack("<I", 1000 * i + j + 1), tag=COUNTER_TAG_FORWARD, timeout=10)
        rt.send("b", struct.pack("<I", 1000 * i + j + 7), tag=COUNTER_TAG_FORWARD, timeout=10)


def _check_exact(rt):
    n = ROUNDS * PER_ROUND
    total = sum(2000 * i + 2 * j + 8 for i in range(ROUNDS) for j in range(PER_ROUND))
    assert dict(rt.restored_kernels) == {"b": (1, 0)} and not rt.lost_kernels, (rt.restored_kernels,
                                                                                 rt.lost_kernels)
    assert rt.dead_letters == 0
    for k in ("a", "b"):
        st = read_counter(rt.read_state(k, 0))
        assert (st.count, st.sum, st.forwards, st.fifo_errors, st.failed_emits) == (2 * n, total, n, 0, 0), (k, st)


def test_a_logged_step_makes_no_job_of_its_own(pair, monkeypatch):
    """Every step of both kernels is logged (the failover replays them) without the
    separate copy job a step used to queue behind itself."""
    mgr, rt, a, b = pair
    jobs = []
    real = ReplayLog._submit
    monkeypatch.setattr(ReplayLog, "_submit", lambda self, *args: (jobs.append(args), real(self, *args))[1])
    for i in range(ROUNDS):
        _send_round(rt, i)
        rt.step(timeout=10)
    assert jobs == [] and a.steps > 0 and b.steps > 0
    _lose_gpu1_and_check(mgr, rt)


def _lose_gpu1_and_check(mgr, rt):
    """GPU 1 lost once every step is done; the counters then end exact (b restored on GPU 0)."""
    rt.synchronize(10)
    lose_device(mgr, 1)
    for _ in range(12):
        rt.step(timeout=10)
    rt.synchronize(10)
    _check_exact(rt)


class _FailingSubmit:
    """A device's StepCommands whose next submit fails before the driver sees it."""

    def __init__(self, real):
        self.real, self.armed = real, True

    def submit(self, *args):
        if self.armed:
            self.armed = False
            raise VkmError("a submit refused on purpose (test)")
        return self.real.submit(*args)

    def __getattr__(self, name):
        return getattr(self.real, name)


def _step_failing_on(rt, k):
    """One step() call whose submit on k's device fails (the devices stepped before it ran)."""
    ctx = k.ctx
    ctx.step_cmds = _FailingSubmit(ctx.step_cmds)
    try:
        with pytest.raises(VkmError, match="on purpose"):
            rt.step(timeout=10)
    finally:
        ctx.step_cmds = ctx.step_cmds.real


def test_a_step_whose_submit_failed_leaves_the_log_as_it_was(pair):
    """Nothing of the failed step ran: its kernels' logs go back to their previous step,
    the step made again later is logged, and the failover restores b exactly."""
    mgr, rt, a, b = pair
    for i in range(ROUNDS):
        _send_round(rt, i)
        if i == ROUNDS - 2:   # (after the last checkpoint before the loss: its inputs are replayed)
            _step_failing_on(rt, b)
        rt.step(timeout=10)
    _lose_gpu1_and_check(mgr, rt)


def test_a_capture_after_every_step_is_copied_by_the_step_and_recycled_unread(pair, monkeypatch):
    """CheckpointPolicy(every_steps=1): no capture is a GPU job of its own, the copy
    buffers are recycled (a device holds at most its steps in flight, the kept capture
    and one being read), and the newest capture, read only when asked for, restores
    the kernel to its state of that step."""
    from vkmulti.kernels.lifecycle import policy as policy_module

    mgr, rt, a, b = pair
    rt.set_checkpoint_policy(CheckpointPolicy(every_steps=1))
    jobs, made = [], []
    real_capture, real_buffer = policy_module.PolicyState._capture, policy_module.MappedBuffer
    monkeypatch.setattr(policy_module.PolicyState, "_capture", lambda self, k: (jobs.append(k.id), real_capture(self, k)))
    monkeypatch.setattr(policy_module, "MappedBuffer", lambda *args: (made.append(args), real_buffer(*args))[1])
    steps = 40
    for i in range(steps):
        if i < ROUNDS:
            _send_round(rt, i)
        rt.step(timeout=10)
    rt.synchronize(10)
    assert jobs == []
    assert len(made) <= 2 * (rt.in_flight + 3), len(made)   # (a buffer a step: 80)
    want = read_counter(rt.read_state(b, 0))
    cp = rt.latest_checkpoint(b)
    assert cp.metadata.current_step == b.steps > steps // 2   # (a step may hold b back under load)
    rt.restore(cp, into=b, device=0)
    assert read_counter(rt.read_state(b, 0)) == want


def _step_of(cp):
    """The step count a checkpoint's control block holds (the kernel's own, from the GPU)."""
    from vkmulti.kernels.checkpoint.header import ChunkType

    lo, hi = struct.unpack_from("<2I", bytes(cp.get_chunk(ChunkType.CONTROL_BLOCK).data), 8)
    return lo | hi << 32


def test_a_capture_copied_in_a_failed_step_call_keeps_its_own_step(pair):
    """a's due capture is copied by its step in a step() call that then fails on GPU 1:
    the checkpoint says the step it holds, not a later one."""
    mgr, rt, a, b = pair
    for i in range(3):
        _send_round(rt, i)
        rt.step(timeout=10)
    assert a.steps == 3
    _step_failing_on(rt, b)   # a makes its 4th step (a capture is due), b's submit fails
    assert a.steps == 4
    for _ in range(2):
        rt.step(timeout=10)
    rt.synchronize(10)
    cp = rt.latest_checkpoint(a)
    assert cp.metadata.current_step == _step_of(cp) == 4


def test_checkpoints_taken_before_a_policy_change_stay_usable(pair):
    """The completed checkpoints go on under a new policy; no buffer is left behind
    (the validation layer reports any at the devices' destruction)."""
    mgr, rt, a, b = pair
    rt.set_checkpoint_policy(CheckpointPolicy(every_steps=1))
    for i in range(5):
        _send_round(rt, i)
        rt.step(timeout=10)
    rt.synchronize(10)
    rt.set_checkpoint_policy(CheckpointPolicy(every_steps=2, keep=2))
    cp = rt.latest_checkpoint(a)
    assert cp.metadata.current_step == _step_of(cp) == a.steps
    for _ in range(3):
        rt.step(timeout=10)
    rt.synchronize(10)
    cp = rt.latest_checkpoint(b)
    assert cp.metadata.current_step == _step_of(cp) and cp.metadata.current_step % 2 == 0
    rt.set_checkpoint_policy(None)
    assert rt.latest_checkpoint(a) is None


def test_captures_read_out_of_their_order_keep_the_newest(pair, monkeypatch):
    """Threads stepping and waiting at once read completed captures each in a call of
    its own, so a newer capture can be read before an older one: the newest stays
    the kernel's checkpoint (the failover restored from the older one while the
    replay log had dropped the inputs since it: 'not all logged', b lost)."""
    mgr, rt, a, b = pair
    state = rt._lifecycle.policy_state
    monkeypatch.setattr(state, "materialize", lambda *args, **kw: None)   # captures pile up unread
    for i in range(ROUNDS):
        _send_round(rt, i)
        rt.step(timeout=10)
    mine = sorted(c.image.steps for c in state.pending if c.kernel is b)
    assert len(mine) >= 2, mine
    monkeypatch.undo()
    state.pending.reverse()   # the newest read first
    state.materialize(wait=True, timeout=10)
    assert state.latest_image(b.id).steps == mine[-1]
    _lose_gpu1_and_check(mgr, rt)
