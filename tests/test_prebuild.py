"""Pipelines built ahead of need (engine/prebuild.py) on the virtual GPU pair: a
live migration or a restore makes no vkCreateComputePipelines call once the
background build ran; a migration that comes while that build runs waits for
it (no second build); the policy limits the devices; destroy() racing a build
that is blocked is safe. Builds are made slow deterministically by an event
the test releases (never by timing)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import kernel_support
from kernel_support import runtime_fixture
from vkmulti._core import vkapi
from vkmulti.kernels import KernelSpec, counter_kernel
from vkmulti.kernels.reference import counter_initial_state, read_counter

MAX = 32
runtime = runtime_fixture(max_kernels=MAX)
_PREBUILD = "vkmulti-prebuild"


class PipelineCalls:
    """vkCreateComputePipelines through the one Vulkan-call wrapper, counted per
    thread; calls of the background builder block on `gate` while it is armed."""

    def __init__(self, monkeypatch):
        self.real = getattr(vkapi, "vkCreateComputePipelines")
        self.calls: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.blocked = threading.Event()
        self._lock = threading.Lock()
        monkeypatch.setattr(vkapi, "vkCreateComputePipelines", self._call)

    def _call(self, *args):
        name = threading.current_thread().name
        with self._lock:
            self.calls.append(name)
        if name == _PREBUILD and not self.gate.is_set():
            self.blocked.set()
            assert self.gate.wait(60), "the test never released the background build"
        return self.real(*args)

    def outside_prebuild(self) -> int:
        with self._lock:
            return sum(1 for n in self.calls if n != _PREBUILD)


def wait_for(cond, what, timeout=60.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"{what} did not happen within {timeout} s"
        time.sleep(0.005)


def big_spec():
    """The counter with two more state buffers: a pipeline of its own (other bindings)."""
    base = counter_kernel(max_sources=MAX)
    return KernelSpec("big-counter", base.spirv, state_sizes=(base.state_sizes[0], 1 << 16, 4096))


@pytest.mark.parametrize("engine", ["auto", "shader"])
def test_a_migration_and_a_restore_compile_nothing(runtime, monkeypatch, engine):
    runtime.migration_crc = engine
    k = kernel_support.counter(runtime, "k", device=0, max_sources=MAX)
    runtime.step()
    runtime.prebuild.wait_idle(60)
    calls = PipelineCalls(monkeypatch)
    for target in (1, 0, 1):
        result = runtime.migrate(k, target)
        assert result.checksum_match is True and k.device_index == target
    cp = runtime.checkpoint(k)
    runtime.restore(cp, into=k, device=0)
    assert k.device_index == 0
    assert calls.calls == []
    runtime.step()
    runtime.synchronize()
    assert read_counter(runtime.read_state(k)).fifo_errors == 0


def test_migrate_while_the_background_build_runs_waits_for_it(runtime, monkeypatch):
    warm = kernel_support.counter(runtime, "warm", device=1, max_sources=MAX)   # GPU 1's context exists
    runtime.prebuild.wait_idle(60)
    calls = PipelineCalls(monkeypatch)
    calls.gate.clear()
    try:
        _migrate_during_build(runtime, calls, warm)
    finally:
        calls.gate.set()


def _migrate_during_build(runtime, calls, warm):
    built = runtime.prebuild.built
    extra = np.arange(1 << 16, dtype=np.uint8)
    k = runtime.launch(big_spec(), "big", device=0, state=[counter_initial_state(MAX), extra, None])
    assert calls.blocked.wait(60)            # the build on GPU 1 has started and is held
    assert runtime.prebuild.built == built
    ctx1 = warm.ctx
    shared = ctx1.shared_builds
    launched = calls.outside_prebuild()      # (the launch built it on GPU 0)
    t, out = kernel_support.call_in_thread(lambda: runtime.migrate(k, 1, timeout=60))
    t.start()
    wait_for(lambda: ctx1.shared_builds > shared, "the migration waiting for the running build")
    assert t.is_alive() and k.device_index == 0
    calls.gate.set()
    t.join(60)
    assert not t.is_alive() and "error" not in out, out.get("error")
    assert out["result"].checksum_match is True and k.device_index == 1
    assert calls.outside_prebuild() == launched   # the migration built nothing itself
    assert calls.calls.count(_PREBUILD) == 1  # one build of the big pipeline on GPU 1, not two
    assert np.array_equal(runtime.read_state(k, 1), extra)


def test_the_policy_limits_the_devices(runtime, monkeypatch):
    with pytest.raises(TypeError):
        runtime.prebuild.devices = "all"
    with pytest.raises(ValueError):
        runtime.prebuild.devices = (0, -1)
    runtime.prebuild.devices = (0,)
    assert runtime.prebuild.devices == (0,)
    kernel_support.counter(runtime, "warm", device=1, max_sources=MAX)
    runtime.prebuild.wait_idle(60)
    calls = PipelineCalls(monkeypatch)
    k = runtime.launch(big_spec(), "big", device=0, state=[counter_initial_state(MAX), None, None])
    runtime.prebuild.wait_idle(60)
    assert calls.calls == ["MainThread"]     # the launch's build on GPU 0; GPU 1 is not in the policy
    runtime.migrate(k, 1)                    # so the move builds it (and still works)
    # the kernel's pipeline, and on a GPU also the CRC shader's (a CPU device checks on the host)
    assert calls.calls == ["MainThread"] * (3 if runtime._lifecycle.crc_kind(runtime._context(1)) == "shader" else 2)
    runtime.prebuild.devices = lambda kernel: [0, 1, 7]   # (a device the manager lacks is skipped)
    assert runtime.prebuild.targets(k) == [0, 1]
    runtime.prebuild.devices = None


def test_destroy_racing_a_blocked_background_build(manager, monkeypatch):
    from vkmulti.kernels import KernelRuntime

    rt = KernelRuntime(kernel_support.make_coordinator(manager), manager, max_kernels=MAX)
    try:
        kernel_support.counter(rt, "warm", device=1, max_sources=MAX)
        rt.prebuild.wait_idle(60)
        calls = PipelineCalls(monkeypatch)
        calls.gate.clear()
        rt.launch(big_spec(), "big", device=0, state=[counter_initial_state(MAX), None, None])
        assert calls.blocked.wait(60)
        releaser = threading.Thread(target=lambda: (wait_for(lambda: rt.prebuild._stopping, "destroy()"),
                                                    calls.gate.set()))
        releaser.start()
    finally:
        rt.destroy()
    releaser.join(60)
    thread = rt.prebuild._thread
    assert thread is not None and not thread.is_alive()


def _cold(spirv: bytes, tag: int) -> bytes:
    """The same program with another generator word: new bytes, a pipeline not built yet."""
    raw = bytearray(spirv)
    raw[8:12] = tag.to_bytes(4, "little")
    return bytes(raw)


def test_a_reload_compiles_off_the_step_path_on_every_device(runtime, monkeypatch):
    from vkmulti.kernels import HotReloadConfig, HotReloadManager, KernelCodeSource
    from vkmulti.kernels.engine.device_context import KERNEL_PUSH, kernel_types

    k = kernel_support.counter(runtime, "k", device=0, max_sources=MAX)
    runtime.prebuild.wait_idle(60)
    reloads = HotReloadManager(HotReloadConfig().with_preserve_state(True).with_validate_before_swap(False))
    reloads.register_runtime_kernel(k)
    code = KernelCodeSource.from_spirv(_cold(k.spec.spirv, 0xB0B0))
    old_pass = k.kernel_pass
    calls = PipelineCalls(monkeypatch)
    gate = threading.Event()
    compiling = threading.Event()

    def gated(*args):
        if threading.current_thread().name.startswith("vkmulti-reload-compile"):
            compiling.set()
            assert gate.wait(60), "the test never released the reload's build"
        return calls._call(*args)
    monkeypatch.setattr(vkapi, "vkCreateComputePipelines", gated)
    stop = threading.Event()
    stepper_errors: list = []

    def steps():
        try:
            while not stop.is_set():
                runtime.step(k)
        except BaseException as exc:   # reported below
            stepper_errors.append(exc)
    mover, out = kernel_support.call_in_thread(lambda: reloads.reload(k, code), "test-reload")
    stepper = threading.Thread(target=steps, name="test-steps")
    stepper.start()
    try:
        mover.start()
        assert compiling.wait(60)
        during = k.steps
        wait_for(lambda: k.steps >= during + 10, "steps while the new pipeline is compiled")
        assert mover.is_alive() and k.kernel_pass is old_pass   # the old code runs meanwhile
    finally:
        gate.set()
        mover.join(60)
        stop.set()
        stepper.join(60)
    assert not stepper_errors and "error" not in out, (stepper_errors, out.get("error"))
    assert k.kernel_pass is not old_pass and k.spec.spirv == code.code   # swapped at a step boundary
    assert [n for n in calls.calls if not n.startswith("vkmulti-reload-compile")] == []   # no step compiled
    assert sum(n.startswith("vkmulti-reload-compile") for n in calls.calls) == 2   # GPU 0 and GPU 1
    other = next(c for c, _ in runtime._contexts.values() if c.index == 1)
    assert other.has_pass(code.code, code.entry_point, kernel_types(len(k.states)), KERNEL_PUSH)
    before = k.steps
    runtime.step(k)
    runtime.synchronize()
    assert k.steps == before + 1 and read_counter(runtime.read_state(k)).fifo_errors == 0
    calls.calls.clear()
    runtime.migrate(k, 1)                    # the new code's pipeline was built there: no compile
    assert calls.calls == []


def test_a_twin_s_buffers_are_made_ahead_and_a_first_move_takes_them(runtime):
    from vkmulti.kernels.lifecycle.twin import twin_buffer_sizes, twin_mapped_sizes

    runtime.ready_twins.enabled = False   # (with them on, the twin made ahead takes these buffers)
    k = kernel_support.counter(runtime, "k", device=0, max_sources=MAX)
    runtime.prebuild.wait_idle(60)
    pool = runtime._lifecycle.pool
    ctx1 = next(c for c, _ in runtime._contexts.values() if c.index == 1)
    sizes, mapped = twin_buffer_sizes(runtime, k, ctx1), twin_mapped_sizes(k, ctx1)
    assert all(pool.held(1, n) for n in sizes)   # made ahead on GPU 1, pages touched
    assert all(pool.held(1, n, mapped=True) for n in mapped)   # and the mapped rings
    held = pool.bytes_on(1)
    runtime.migrate(k, 1)
    taken = sum(sizes) + sum(mapped)
    assert pool.bytes_on(1) == held - taken   # the twin took them: the move allocated none there
    runtime.prebuild.reserve_bytes = 0
    kernel_support.counter(runtime, "k2", device=0, max_sources=MAX)
    runtime.prebuild.wait_idle(60)
    assert pool.bytes_on(1) == held - taken   # off: nothing more made ahead


def test_the_failover_restore_of_a_lost_gpu_s_kernel_compiles_nothing(runtime, monkeypatch):
    from vkmulti import CheckpointPolicy
    from vkmulti.errors import DeviceLostError

    runtime.set_checkpoint_policy(CheckpointPolicy(critical=["victim"]))
    victim = runtime.launch(big_spec(), "victim", device=1, state=[counter_initial_state(MAX), None, None])
    for _ in range(3):
        runtime.step()
    runtime.synchronize()
    cp = runtime.latest_checkpoint(victim)
    runtime.prebuild.wait_idle(60)            # its pipeline was built on GPU 0 in the background
    calls = PipelineCalls(monkeypatch)

    def lost():
        raise DeviceLostError(-4, "vkGetSemaphoreCounterValue")
    monkeypatch.setattr(victim.ctx, "completed", lost)
    runtime.restore(cp, into=victim, device=0)
    monkeypatch.undo()
    assert victim.device_index == 0 and victim.steps == 3
    assert calls.calls == []
    runtime.step()
    runtime.synchronize()
    assert victim.steps == 4


def test_a_first_move_makes_no_transfer_link(runtime, monkeypatch):
    """The background build made the move's links (both ways, rings touched): the
    first migration, and the one back, create none."""
    from vkmulti.transfer import link

    k = kernel_support.counter(runtime, "k", device=0, max_sources=MAX)
    runtime.prebuild.wait_idle(60)
    made = []
    real = link._native.Link

    def counting(*args, **kw):
        made.append(args)
        return real(*args, **kw)
    monkeypatch.setattr(link._native, "Link", counting)
    assert runtime.migrate(k, 1).checksum_match
    assert runtime.migrate(k, 0).checksum_match
    assert made == []


def test_a_move_asks_for_its_pipelines_again_at_no_cost(runtime, monkeypatch):
    """ensure() remembers what it found built: a later move of the same kernel runs no
    SPIR-V gate and looks up no pipeline again; a change of the move's passes (the
    CRC32 engine chosen) is asked anew; a destroyed device context still raises."""
    from vkmulti.errors import DestroyedError
    from vkmulti.kernels.engine import prebuild

    k = kernel_support.counter(runtime, "k", device=0, max_sources=MAX)
    runtime.prebuild.wait_idle(60)
    gates = []
    real = prebuild._gate
    monkeypatch.setattr(prebuild, "_gate", lambda *a: (gates.append(a[1].index), real(*a))[1])
    runtime.migrate(k, 1)
    first = len(gates)
    assert first == 2   # the first move: both devices checked
    runtime.migrate(k, 0)
    runtime.migrate(k, 1)
    assert len(gates) == first   # later moves: remembered
    ctx = runtime._context(0)
    runtime.migration_crc = "shader" if runtime._lifecycle.crc_kind(ctx) == "host" else "host"
    runtime.prebuild.ensure(k.spec, 0, 60)
    assert len(gates) == first + 1   # other passes: asked again
    monkeypatch.setattr(ctx, "alive", False)
    with pytest.raises(DestroyedError):
        runtime.prebuild.ensure(k.spec, 0, 60)
