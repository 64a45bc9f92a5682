"""Destroys racing use across the kernels layer: each destroyer of kernel_races.py
(the runtime, a kernel, the K2K router, the manager, a migration, a hot reload,
a lost device) against its users (steps, runs, host messages, state, checkpoints,
restores, migrations, routing, the router's and the coordinator's queries, tickets),
in a child process per destroyer (a crash or hang fails the test, not the
session). Every call either does its job or raises a vkmulti error; nothing may
hang, leak or make the validation layer report an error. The forced interleavings
of the defects the matrix found come after it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_support import counter, routed_runtime, settle, state, words
from kernel_races import DESTROYERS, LOSERS
from vkmulti import DestroyedError, KernelMessageError
from vkmulti.kernels.k2k import landing
from vkmulti.kernels.reference import COUNTER_TAG_FORWARD

HERE = Path(__file__).resolve().parent
#: rounds per destroyer (each races four users of the list against it: five cover them all)
ROUNDS = int(os.environ.get("VKMULTI_RACE_ROUNDS", "5"))
#: rounds per lost-GPU case (each a fresh manager and runtime, the loss at a random point)
LOSS_ROUNDS = 4 * ROUNDS


def run_child(source: str, *args: str, timeout: float = 240) -> str:
    """Run `source` (kernel_races.child's preamble first: the virtual pair, the validation
    layer) in a child process; its last line of output ("ok" when it ran through)."""
    code = f"import kernel_races; kernel_races.child()\n{source}\nkernel_races.child_done()\n"
    env = dict(os.environ, VKMULTI_CHILD_HANG_S=str(max(timeout - 30, timeout / 2)))
    try:
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=HERE, capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the child hung ({timeout} s):\n{str(exc.stdout)[-3000:]}\n{str(exc.stderr)[-3000:]}")
    dump = max(done.stderr.find("Timeout ("), done.stderr.find("Fatal Python error"))   # (every thread's stack)
    err = done.stderr[dump:dump + 20000] if dump >= 0 else done.stderr[-4000:]
    assert done.returncode == 0, f"rc {done.returncode}\n{done.stdout[-4000:]}\n{err}"
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("destroyer", DESTROYERS)
def test_destroy_racing_use(destroyer):
    assert run_child("import sys; kernel_races.matrix(sys.argv[1], int(sys.argv[2]))", destroyer, str(ROUNDS)) == "ok"


@pytest.mark.parametrize("timeout", ["10", "None"])
@pytest.mark.parametrize("loser", LOSERS)
def test_a_lost_gpu_racing_use_of_its_kernel(loser, timeout):
    """GPU 1 lost while other threads loop over calls on its kernel (state reads and
    writes, steps, runs, host queries, checkpoints, migrations, waits, restores), the
    checkpoint policy restoring it on GPU 0: each call ends (also with no timeout: the
    loss wakes every wait), on the survivor or with a vkmulti error; the kernel ends up
    restored or lost, never left on the lost GPU; no validation error. Before the fix:
    a query's reply lost for good (receive() with no timeout hung), the kernel left on
    the lost GPU by a migration, a running kernel released, a staging buffer freed under
    a job the driver still ran (test_failover_races.py forces each)."""
    code = ("import sys; kernel_races.loss_matrix(sys.argv[1], None if sys.argv[2] == \"None\" else float(sys.argv[2]), "
            "int(sys.argv[3]))")
    assert run_child(code, loser, timeout, str(LOSS_ROUNDS)) == "ok"


ROUTER_FIRST = """
from kernel_support import counter, make_coordinator, settle, state, words
from vkmulti import CrossGpuK2KRouter, DestroyedError, MultiDeviceManager
from vkmulti.kernels import KernelRuntime
from vkmulti.kernels.reference import COUNTER_TAG_FORWARD

mgr = MultiDeviceManager.create(enabled=True)
rt = KernelRuntime(make_coordinator(mgr), mgr)
router = CrossGpuK2KRouter(rt.coordinator, rt)
sink = counter(rt, "sink", 0)
fwd = counter(rt, "fwd", 1, params=[sink.address])
rt.send(fwd, words(3), tag=COUNTER_TAG_FORWARD)
rt.step()
rt.destroy()
assert router.runtime is None and rt.outbox_feed is None
try:
    rt.step()
    raise AssertionError("a destroyed runtime stepped")
except DestroyedError:
    pass
rt = KernelRuntime(rt.coordinator, mgr)
router.attach(rt)
sink = counter(rt, "sink", 0)
fwd = counter(rt, "fwd", 1, params=[sink.address])
rt.send(fwd, words(5), tag=COUNTER_TAG_FORWARD)
settle(rt, None, lambda: state(rt, sink).count == 1)
assert state(rt, sink).sum == 5
rt.destroy()
assert router.runtime is None
mgr.destroy()
"""


def test_destroying_the_runtime_detaches_its_router_first():
    """The runtime's destroy() freed its device contexts (their timelines) while the
    attached router's relay thread still waited on them: a SIGSEGV in the validation
    layer. It now detaches the router first, which can then serve another runtime."""
    assert run_child(ROUTER_FIRST) == "ok"


def test_a_gather_refused_by_a_destroyed_device_fails_its_senders(manager, monkeypatch):
    """A DestroyedError from gathering a device's batches for a move (the manager or
    the device going, no sender destroyed) was taken for a destroyed sender and the
    gather retried with the same batches forever (RecursionError out of the step).
    The senders are told instead; the next gather works."""
    with routed_runtime(manager, "staging_copy") as (rt, router):
        sink = counter(rt, "sink", 0)
        fwds = [counter(rt, f"fwd{i}", 1, params=[sink.address]) for i in range(2)]
        original = landing.Gather.copy
        refused = []

        def refusing(self, *args, **kw):
            if len(refused) < 5:   # (as a destroyed manager does, every time)
                refused.append(1)
                raise DestroyedError("MultiDeviceManager used after destroy()")
            return original(self, *args, **kw)
        monkeypatch.setattr(landing.Gather, "copy", refusing)
        for i, f in enumerate(fwds):
            rt.send(f, words(i + 1), tag=COUNTER_TAG_FORWARD)
        rt.step()   # both batches of GPU 1 go in one gather
        assert len(refused) == 1 and router.stats().routing_failures == 2
        refused += [1] * 4
        for f in fwds:
            with pytest.raises(KernelMessageError):
                rt.step(f)
        for i, f in enumerate(fwds):
            rt.send(f, words(10 * (i + 1)), tag=COUNTER_TAG_FORWARD)
        settle(rt, None, lambda: state(rt, sink).count == 2)
        assert state(rt, sink).sum == 30


def test_destroying_the_runtime_while_a_migration_waits_for_the_gate(manager, monkeypatch):
    """A migration holds its kernel and then waits for the runtime's gate; the runtime's
    destroy() held the gate and waited for that hold: each waited for the other until
    destroy() timed out (TimeoutError, nothing destroyed). The migration now gives up
    with DestroyedError and destroy() goes through."""
    import threading

    from vkmulti import MigrationError
    from vkmulti.kernels.engine.gate import RuntimeGate
    from kernel_support import call_in_thread, make_coordinator
    from vkmulti.kernels import KernelRuntime

    rt = KernelRuntime(make_coordinator(manager), manager)
    k = counter(rt, "k", 0)
    rt.step(k)
    original = RuntimeGate.exclusive
    mover_waits, destroy_holds = threading.Event(), threading.Event()

    def exclusive(self, timeout, what, closing=False):
        if closing:
            return _then(original(self, timeout, what, closing), destroy_holds.set)
        if not mover_waits.is_set():
            mover_waits.set()   # (k is held: it is moving)
            assert destroy_holds.wait(30)
        return original(self, timeout, what, closing)
    monkeypatch.setattr(RuntimeGate, "exclusive", exclusive)
    mover, moved = call_in_thread(lambda: rt.migrate(k, 1, timeout=20))
    mover.start()
    assert mover_waits.wait(30) and rt.is_held(k)
    destroyer, destroyed = call_in_thread(lambda: rt.destroy(timeout=10))
    destroyer.start()
    for t in (destroyer, mover):
        t.join(60)
        assert not t.is_alive()
    assert "error" not in destroyed, destroyed
    assert isinstance(moved.get("error"), (DestroyedError, MigrationError)), moved
    assert k.destroyed and "destroyed" in str(moved["error"])
    with pytest.raises(DestroyedError):
        rt.step()


def _then(cm, fn):
    """Context manager `cm`, calling fn() once it is entered."""
    from contextlib import contextmanager

    @contextmanager
    def wrapped():
        with cm:
            fn()
            yield
    return wrapped()


def test_a_migration_that_makes_gpu_jobs_while_the_runtime_is_destroyed(manager, monkeypatch):
    """A migration makes the devices' GPU jobs on first use (for its CRC32 engines); one
    that had taken the device's context when the runtime's destroy() freed the jobs made
    new ones after it, which nothing freed (the race matrix's rt.destroy child: a
    VkSemaphore and a VkCommandPool per device not destroyed at the manager's destroy).
    The migration is refused with DestroyedError now, and every GPU jobs made is freed."""
    import threading

    from vkmulti import MigrationError
    from vkmulti.kernels import KernelRuntime
    from vkmulti.kernels.engine.gpu_jobs import GpuJobs
    from vkmulti.kernels.lifecycle import lifecycle
    from kernel_support import call_in_thread, make_coordinator

    made: list[GpuJobs] = []

    def tracked(*args, **kw):
        jobs = GpuJobs(*args, **kw)
        made.append(jobs)
        return jobs
    monkeypatch.setattr(lifecycle, "GpuJobs", tracked)
    rt = KernelRuntime(make_coordinator(manager), manager)
    rt.prebuild.devices = ()   # (the background build would make the jobs first, and the mover never pause)
    k = counter(rt, "k", 1)
    rt.step(k)
    paused, go = threading.Event(), threading.Event()
    context = rt._context

    def pausing(index):   # the mover stops inside Lifecycle.extras, with the context taken
        ctx = context(index)
        if threading.current_thread().name == "mover" and sys._getframe(1).f_code.co_name == "extras" \
                and not paused.is_set():
            paused.set()
            assert go.wait(30)
        return ctx
    monkeypatch.setattr(rt, "_context", pausing)
    mover, moved = call_in_thread(lambda: rt.migrate(k, 0, timeout=20), name="mover")
    mover.start()
    assert paused.wait(30)
    rt.destroy(timeout=20)
    go.set()
    mover.join(60)
    assert not mover.is_alive()
    assert isinstance(moved.get("error"), (DestroyedError, MigrationError)), moved
    assert all(j.pool is None for j in made), "GPU jobs left unfreed after the runtime's destroy()"


def test_a_one_shot_run_on_a_context_the_runtime_destroy_closed(manager):
    """A call that took a kernel's device context before the runtime's destroy() closed
    it (a restore's upload into the kernel it just launched, in the race matrix) ran its
    one-shot commands on the closed context: AttributeError ('NoneType' object has no
    attribute 'run'), and the buffers handed to the run left to nobody. It raises
    DestroyedError now, and those buffers are freed, as a run that fails before its submit
    frees them."""
    from vkmulti.kernels import KernelRuntime
    from vkmulti.memory.image import Buffer
    from kernel_support import make_coordinator

    rt = KernelRuntime(make_coordinator(manager), manager)
    ctx = rt._context(0)
    rt.destroy()
    handed = Buffer(ctx.slot, 256)
    with pytest.raises(DestroyedError):
        ctx.run_once(lambda cmd: None, keep=[handed])
    assert handed.destroyed


def test_a_launch_under_way_while_the_runtime_is_destroyed(manager, monkeypatch):
    """A launch (a restore's, in the race matrix) that registered its kernel after the
    runtime's destroy() had listed the kernels to destroy returned a kernel nobody freed
    (its buffers and address held until the manager's destroy; the restore then ran its
    upload on the closed context). destroy() now refuses later launches and waits for
    those under way: the kernel is destroyed and freed with the others."""
    import threading

    from vkmulti.kernels import KernelRuntime, counter_kernel
    from vkmulti.kernels.runtime import runtime as runtime_module
    from kernel_support import call_in_thread, make_coordinator

    rt = KernelRuntime(make_coordinator(manager), manager)
    counter(rt, "k", 0)
    paused, go, listed = threading.Event(), threading.Event(), threading.Event()
    init_buffers = runtime_module.init_buffers

    def pausing(*args):   # the launcher stops with its kernel made and filled, not yet registered
        init_buffers(*args)
        if threading.current_thread().name == "launcher":
            paused.set()
            assert go.wait(30)
    monkeypatch.setattr(runtime_module, "init_buffers", pausing)
    spec = counter_kernel(max_sources=8, inbox_capacity=8, outbox_capacity=8)
    launcher, launched = call_in_thread(lambda: rt.launch(spec, "late", device=1), name="launcher")
    launcher.start()
    assert paused.wait(30)
    lifecycle_destroy = rt._lifecycle.destroy

    def after_the_list(timeout):   # destroy() listed (and destroyed) the kernels: the launch goes on
        listed.set()
        launcher.join(30)
        return lifecycle_destroy(timeout)
    monkeypatch.setattr(rt._lifecycle, "destroy", after_the_list)
    destroyer, destroyed = call_in_thread(lambda: rt.destroy(timeout=20), name="destroyer")
    destroyer.start()
    while not go.is_set() and destroyer.is_alive():   # (the fix: destroy() waits for the launch)
        if listed.is_set() or getattr(getattr(rt, "_launches", None), "closed", False):
            go.set()
        go.wait(0.01)
    for t in (launcher, destroyer):
        t.join(60)
        assert not t.is_alive()
    assert "error" not in destroyed, destroyed
    k = launched.get("result")
    assert k is not None or isinstance(launched.get("error"), DestroyedError), launched
    if k is not None:
        assert k.destroyed and not k.buffers, "a kernel launched while the runtime was destroyed was left unfreed"


STAGE_AFTER_DETACH = """
import sys, threading
from kernel_support import call_in_thread, counter, make_coordinator, words
from vkmulti import CrossGpuK2KRouter, DestroyedError, MigrationError, MultiDeviceManager
from vkmulti.kernels import KernelRuntime
from vkmulti.kernels.lifecycle.lifecycle import Lifecycle
from vkmulti.kernels.reference import COUNTER_TAG_FORWARD

mgr = MultiDeviceManager.create(enabled=True)
rt = KernelRuntime(make_coordinator(mgr), mgr)
methods = {(0, 1): sys.argv[1], (1, 0): sys.argv[1]}
router = CrossGpuK2KRouter(rt.coordinator, rt, transfer_methods=methods)
sink = counter(rt, "sink", 0)
fwd = counter(rt, "fwd", 1, params=[sink.address])
rt.send(fwd, words(3), tag=COUNTER_TAG_FORWARD)
rt.step(fwd)   # its batch lands on GPU 0: the sink has not stepped since
rt.synchronize(30)
paused, go = threading.Event(), threading.Event()
extras = Lifecycle.extras

def pausing(self, device):   # the move stops in its staging pass, right before the submit
    if threading.current_thread().name == "mover" and sys._getframe(1).f_code.co_name == "_stage":
        paused.set()
        assert go.wait(30)
    return extras(self, device)
Lifecycle.extras = pausing
mover, moved = call_in_thread(lambda: rt.migrate(sink, 1, timeout=30), name="mover")
mover.start()
assert paused.wait(30), moved
router.detach()   # takes the landed batch back: its relay or link goes
go.set()
mover.join(60)
assert not mover.is_alive()
assert "result" in moved or isinstance(moved.get("error"), (MigrationError, DestroyedError)), moved
Lifecycle.extras = extras
rt.destroy()
mgr.destroy()
"""


@pytest.mark.parametrize("method", ["dmabuf", "staging_copy"])
def test_a_staging_pass_of_a_move_racing_the_router_detach(method):
    """A migration's staging pass takes the batches landed for its kernel, then submits
    a pass that waits on their landing points; the router's detach (the runtime's destroy()
    detaches it first) took those batches back meanwhile and destroyed the relay (or link)
    whose timeline the pass then waited on: a SIGSEGV in vkQueueSubmit (the race matrix's
    rt.destroy child). A batch taken back since is no longer read: the move fails with
    MigrationError, and nothing waits on a destroyed semaphore."""
    assert run_child(STAGE_AFTER_DETACH, method) == "ok"


def test_a_move_engine_asked_for_after_the_runtime_is_destroyed_is_refused(manager):
    """A migration that asked for its pair's transfer engine after KernelRuntime.destroy()
    took the engines got a new one that nothing freed until the manager's destroy."""
    from vkmulti.kernels import MultiGpuCoordinator
    from vkmulti.kernels.lifecycle.twin import MoveEngines

    engines = MoveEngines(MultiGpuCoordinator.from_manager(manager), manager)
    _, first = engines.get(0, 1)
    assert engines.get(0, 1)[1] is first   # (kept for later moves)
    engines.destroy(30)
    assert first.destroyed
    with pytest.raises(DestroyedError):
        engines.get(0, 1)
