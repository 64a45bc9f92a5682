"""One deadline per call in the kernels layer: a call given `timeout=T` whose inner waits
run one after another gives each what is left of T, so a TimeoutError comes about T in,
never a multiple of it. Each case makes the waits before the last take (nearly) all of
T, and the last one wait for work that does not finish: the call must raise by
BOUND_S (well short of 2 T; a correctness bound on the timeout, not a speed check)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import vkmulti
import vkmulti.kernels
from gates import Gate
from kernel_support import counter, runtime_fixture
from vkmulti._core.timeline import TimelinePoint
from vkmulti.device.commands import CommandRunner
from vkmulti.kernels.stencil import StencilSlabs
from vkmulti.kernels.runtime import runtime as runtime_module
from vkmulti.kernels.engine.gpu_jobs import GpuJobs, StepTimeline

runtime = runtime_fixture(max_kernels=8)

T = 1.0
#: a call given T may end this late (slices, thread hand-offs); one that gave an inner wait T again ends past 2 T
BOUND_S = 1.8


def _raises_within_bound(call):
    t0 = time.monotonic()
    with pytest.raises(vkmulti.TimeoutError):
        call()
    took = time.monotonic() - t0
    assert took < BOUND_S, f"the call given {T} s raised after {took:.2f} s: an inner wait got the whole timeout again"


@pytest.fixture
def held_step(runtime):
    """A counter kernel on GPU 0 with one step held on the GPU behind a gate (opened after the test)."""
    k = counter(runtime, "held", 0)
    runtime.step(k).wait(30)
    gate = Gate(runtime.manager.slot(0))
    runtime.step(k, wait=TimelinePoint(gate.sem, 1, 0))
    try:
        yield k
    finally:
        gate.open()
        runtime.synchronize(30)
        gate.destroy()


def test_destroy_kernel_after_a_moving_hold_waits_only_what_is_left(runtime, held_step):
    """A migration's hold on the kernel ends just before T; its held step then gets what is left."""
    k = held_step
    runtime.holds.hold(k, "test move", moving=True)
    timer = threading.Timer(0.95 * T, lambda: runtime.holds.release(k, "test move", moving=True))
    timer.start()
    try:
        _raises_within_bound(lambda: runtime.destroy_kernel(k, timeout=T))
    finally:
        timer.join()
    assert k.destroyed   # stopped, freed by the next call (the fixture's teardown, or this:)


def test_destroy_kernel_after_slow_outbox_readers_waits_only_what_is_left(runtime, held_step, monkeypatch):
    """Other devices' readers of the outbox take (nearly) all of T; the held step gets what is left."""
    k = held_step

    def slow_readers(kernel, timeout):
        time.sleep(0.95 * timeout)
    monkeypatch.setattr(runtime_module, "drop_imports", slow_readers)
    _raises_within_bound(lambda: runtime.destroy_kernel(k, timeout=T))


def test_stencil_field_waits_once_for_the_whole_read(runtime, monkeypatch):
    """StencilSlabs.field: the synchronize takes (nearly) all of T; the state reads get what is left."""
    f = np.arange(6 * 8, dtype=np.int32).reshape(6, 8)
    slabs = StencilSlabs(runtime, f, [0, 0])
    gate = Gate(runtime.manager.slot(0))
    try:
        slabs.step(1)
        runtime.step(slabs.kernels, wait=TimelinePoint(gate.sem, 1, 0))   # the state reads wait for it
        monkeypatch.setattr(runtime, "synchronize", lambda timeout=None: time.sleep(0.95 * timeout))
        _raises_within_bound(lambda: slabs.field(timeout=T))
    finally:
        monkeypatch.undo()
        gate.open()
        runtime.synchronize(30)
        gate.destroy()
        slabs.destroy()


def test_first_launch_sets_up_the_device_and_the_kernel_within_one_timeout(runtime, monkeypatch):
    """The first launch on a device: its context's set-up and the kernel's initialisation are
    GPU runs that each take 0.7 T here; the second gets what is left (it ran past T before)."""
    real_run = CommandRunner.run
    slow = 0.7 * T

    def slow_run(self, record, *, waits=(), timeout=60.0, keep=(), users=()):
        if timeout is not None and timeout < slow:
            time.sleep(timeout)
            for b in keep:   # (as a run that fails before its submit)
                b.destroy()
            raise vkmulti.TimeoutError(f"slow run: not done within {timeout:.3f} s")
        time.sleep(slow)
        return real_run(self, record, waits=waits, timeout=timeout, keep=keep, users=users)
    monkeypatch.setattr(CommandRunner, "run", slow_run)
    _raises_within_bound(lambda: counter(runtime, "first", 1, timeout=T))
    monkeypatch.undo()
    k = counter(runtime, "second", 1)   # nothing was left half made
    runtime.step(k).wait(30)


@pytest.mark.parametrize("maker", ["migration", "prebuild"])
def test_migration_makes_its_gpu_crc_engines_within_its_timeout(runtime, monkeypatch, maker):
    """A checked migration's first use of the CRC32 shader makes its engines (a GPU self-check
    each; it waited 30 s whatever the migration's timeout), or waits for the prebuild thread
    that makes them (it waited for as long as that took). A self-check job that takes 4 s
    must end the migration at its own timeout."""
    runtime.migration_crc = "shader"
    if maker == "migration":
        runtime.prebuild.devices = ()   # (nothing built or warmed ahead)
    real_wait = GpuJobs.wait
    hang = 4.0

    def slow_wait(self, point, timeout):
        if timeout is None or timeout >= hang:
            time.sleep(hang)
            return real_wait(self, point, timeout)
        time.sleep(timeout)
        raise vkmulti.TimeoutError(f"slow job: not done within {timeout:.3f} s")
    monkeypatch.setattr(GpuJobs, "wait", slow_wait)
    k = counter(runtime, "moved", 0)
    runtime.step(k).wait(30)
    try:
        _raises_within_bound(lambda: runtime.migrate(k, 1, timeout=T, verify=True))
    finally:
        monkeypatch.undo()
    assert k.device_index == 0
    runtime.step(k).wait(30)


def test_synchronize_reads_the_checkpoint_captures_within_what_is_left(runtime, monkeypatch):
    """synchronize() under a checkpoint policy: the steps take (nearly) all of T; the captures
    still pending (three, each a GPU copy that does not finish here) share what is left (each
    got T again: the call took 4 T, and left them pending without an error)."""
    runtime.set_checkpoint_policy(vkmulti.kernels.CheckpointPolicy(every_steps=1))
    ks = [counter(runtime, f"c{i}", i % 2) for i in range(3)]
    runtime.step(ks)
    runtime.synchronize(30)
    runtime.step(ks)   # (its captures are read by the next synchronize)

    def hung_copy(self, point, timeout):
        time.sleep(timeout)
        raise vkmulti.TimeoutError(f"capture copy: not done within {timeout:.3f} s")
    monkeypatch.setattr(runtime, "_wait_points", lambda points, timeout: time.sleep(0.95 * timeout))
    monkeypatch.setattr(GpuJobs, "wait", hung_copy)
    monkeypatch.setattr(StepTimeline, "wait", hung_copy)
    t0 = time.monotonic()
    runtime.synchronize(T)
    took = time.monotonic() - t0
    monkeypatch.undo()
    assert took < BOUND_S, f"synchronize({T}) took {took:.2f} s: each capture's wait got the whole timeout again"
    runtime.synchronize(30)


def test_the_replay_logs_read_of_its_captures_waits_once_for_all_of_them():
    """ReplayLog.materialize(wait=True, timeout=T): each capture's copy that did not finish
    got T again (three of them: 3 T), instead of sharing one deadline."""
    from types import SimpleNamespace

    from vkmulti.kernels.lifecycle.replay_log import ReplayLog, _Capture

    class HungCopy:
        def wait(self, point, timeout):
            time.sleep(timeout)
            raise vkmulti.TimeoutError(f"replay copy: not done within {timeout:.3f} s")

    log = ReplayLog(SimpleNamespace(rt=None, policy_state=None))
    log.pending = [_Capture(0, object(), HungCopy(), SimpleNamespace(value=1), []) for _ in range(3)]
    t0 = time.monotonic()
    log.materialize(wait=True, timeout=T)
    took = time.monotonic() - t0
    assert took < BOUND_S, f"materialize(timeout={T}) took {took:.2f} s: each capture's wait got the whole timeout"
    assert len(log.pending) == 3   # (kept for a later read)
