"""Ready twins (kernels/lifecycle/ready_twins.py) on the virtual GPU pair: the
`vkmulti-twins` thread makes each kernel's twin on the other device ahead, a
migration or a restore takes it (and the half it leaves becomes the twin for a
move back); a migration while that build runs waits for it; destroy() racing
the thread is safe; a twin made stale by a reload is given the new code (its
buffers kept), or freed when that fails, and never used stale; a
migration without the check makes no GPU CRC32 engine. Builds are held by an
event the test releases (never by timing)."""
from __future__ import annotations

import struct
import threading

import numpy as np
import pytest

import kernel_support
from kernel_support import runtime_fixture
from vkmulti.kernels import KernelCodeSource, KernelSpec, counter_kernel
from vkmulti.kernels.lifecycle import lifecycle as lifecycle_module
from vkmulti.kernels.lifecycle import ready_twins as ready_module
from vkmulti.kernels.lifecycle import twin as twin_module
from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state, read_counter

MAX = 32
runtime = runtime_fixture(max_kernels=MAX)
_THREAD = "vkmulti-twins"


def state_spec(extra: int = 1 << 16) -> KernelSpec:
    base = counter_kernel(max_sources=MAX)
    return KernelSpec("twin-counter", base.spirv, state_sizes=(base.state_sizes[0], extra))


def launch(rt, name="k", device=0, extra=1 << 16):
    data = np.arange(extra, dtype=np.uint32).view(np.uint8)[:extra].copy()
    k = rt.launch(state_spec(extra), name, device=device, state=[counter_initial_state(MAX), data])
    return k, data


def settle(rt):
    rt.prebuild.wait_idle(60)
    assert rt.ready_twins.wait_idle(60)


class HeldBuilds:
    """build_twin of the twins' thread, held on `gate` while it is cleared."""

    def __init__(self, monkeypatch):
        self.real = ready_module.build_twin
        self.gate = threading.Event()
        self.blocked = threading.Event()
        monkeypatch.setattr(ready_module, "build_twin", self._build)

    def _build(self, *args, **kw):
        if threading.current_thread().name == _THREAD and not self.gate.is_set():
            self.blocked.set()
            assert self.gate.wait(60), "the test never released the twin build"
        return self.real(*args, **kw)


def test_a_move_takes_the_ready_twin_and_leaves_one_for_the_way_back(runtime):
    k, data = launch(runtime)
    runtime.step()
    settle(runtime)
    twins = runtime.ready_twins
    assert twins.ready(k) == [1] and twins.bytes_on(1) > 0
    for target in (1, 0, 1, 0):
        result = runtime.migrate(k, target)
        assert result.checksum_match is True and k.device_index == target
        assert np.array_equal(runtime.read_state(k, 1), data)
        settle(runtime)
        assert twins.ready(k) == [1 - target]
    assert twins.used == 4
    assert twins.recycled >= 1   # (a half whose outbox no batch reads any more)
    runtime.send(k, np.array([5], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step()
    runtime.synchronize()
    counter = read_counter(runtime.read_state(k))
    assert counter.sum == 5 and counter.fifo_errors == 0


def test_a_restore_takes_the_ready_twin(runtime):
    k, data = launch(runtime)
    runtime.step()
    settle(runtime)
    cp = runtime.checkpoint(k)
    used = runtime.ready_twins.used
    runtime.restore(cp, into=k, device=1)
    assert k.device_index == 1 and runtime.ready_twins.used == used + 1
    assert np.array_equal(runtime.read_state(k, 1), data)
    runtime.step()
    runtime.synchronize()


def test_the_policy_turns_them_off_and_bounds_their_bytes(runtime):
    twins = runtime.ready_twins
    with pytest.raises(TypeError):
        twins.enabled = 1
    with pytest.raises(ValueError):
        twins.limit_bytes = -1
    k, data = launch(runtime)
    settle(runtime)
    assert twins.ready(k) == [1]
    twins.enabled = False
    assert twins.ready(k) == [] and twins.bytes_on(1) == 0
    runtime.migrate(k, 1)
    settle(runtime)
    assert twins.ready(k) == [] and twins.used == 0
    twins.enabled = True
    twins.limit_bytes = 1024   # below one twin's buffers: none is made
    runtime.migrate(k, 0)
    settle(runtime)
    assert twins.ready(k) == []
    assert np.array_equal(runtime.read_state(k, 1), data)


def test_migrate_while_the_twin_build_runs(runtime, monkeypatch):
    kernel_support.counter(runtime, "warm", device=1, max_sources=MAX)   # GPU 1's context exists
    settle(runtime)
    held = HeldBuilds(monkeypatch)
    k, data = launch(runtime)
    assert held.blocked.wait(60)   # the twin of k on GPU 1 is being made, held
    t, out = kernel_support.call_in_thread(lambda: runtime.migrate(k, 1, timeout=60))
    t.start()
    held.gate.set()
    t.join(60)
    assert not t.is_alive() and "error" not in out, out.get("error")
    assert out["result"].checksum_match is True and k.device_index == 1
    assert np.array_equal(runtime.read_state(k, 1), data)
    settle(runtime)
    runtime.migrate(k, 0)
    assert np.array_equal(runtime.read_state(k, 1), data)


def test_destroy_racing_the_twin_thread(manager, monkeypatch):
    from vkmulti.kernels import KernelRuntime
    held = HeldBuilds(monkeypatch)
    rt = KernelRuntime(kernel_support.make_coordinator(manager), manager, max_kernels=MAX)
    try:
        kernel_support.counter(rt, "warm", device=1, max_sources=MAX)
        for i in range(3):
            launch(rt, f"k{i}")
        assert held.blocked.wait(60)   # a twin build is held in the thread
        done = threading.Event()

        def release_soon():   # destroy() stops the queue first, then joins the thread
            while not rt.ready_twins._stopping:
                if done.wait(0.001):
                    return
            held.gate.set()
        r = threading.Thread(target=release_soon)
        r.start()
        rt.destroy()
        done.set()
        r.join(60)
    finally:
        held.gate.set()
        rt.destroy()
    assert not any(t.name == _THREAD and t.is_alive() for t in threading.enumerate())
    assert rt.ready_twins.bytes_on(0) == 0 and rt.ready_twins.bytes_on(1) == 0


def test_destroyed_kernels_lose_their_twins(runtime):
    k, _ = launch(runtime)
    settle(runtime)
    assert runtime.ready_twins.ready(k) == [1]
    runtime.destroy_kernel(k)
    runtime.ready_twins.prune()
    assert runtime.ready_twins.ready(k) == [] and runtime.ready_twins.bytes_on(1) == 0


def _cold(spirv: bytes, tag: int) -> KernelCodeSource:
    raw = bytearray(spirv)
    struct.pack_into("<I", raw, 8, tag)   # another generator word: the same program, new bytes
    return KernelCodeSource.from_spirv(bytes(raw))


def test_a_reload_gives_the_ready_twin_its_new_code(runtime):
    k, data = launch(runtime)
    runtime.step()
    settle(runtime)
    twins = runtime.ready_twins
    assert twins.ready(k) == [1]
    twin = twins._ready[(k, 1)][0]
    kept = [twin.inbox, twin.outbox, *twin.states]
    built, refreshed, discarded, used = twins.built, twins.refreshed, twins.discarded, twins.used
    code = _cold(k.spec.spirv, 0xC0DE)
    k.apply_code(code, timeout=60)
    settle(runtime)
    # the same twin, its buffers kept: only its pipeline and that pipeline's set are new
    assert twins.ready(k) == [1] and twins._ready[(k, 1)][0] is twin
    assert (twins.built, twins.refreshed, twins.discarded) == (built, refreshed + 1, discarded)
    assert twin.spec == k.spec and twin.kernel_pass is not k.kernel_pass
    result = runtime.migrate(k, 1)   # onto that twin, running the new code
    assert result.checksum_match is True and k.device_index == 1 and twins.used == used + 1
    assert all(a is b for a, b in zip([k.inbox, k.outbox, *k.states], kept))
    assert k.spec.spirv == code.code
    assert np.array_equal(runtime.read_state(k, 1), data)
    runtime.send(k, np.array([5], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step()
    runtime.synchronize()
    assert read_counter(runtime.read_state(k)).sum == 5


def test_a_twin_whose_new_code_cannot_be_built_is_freed(runtime, monkeypatch):
    k, data = launch(runtime)
    settle(runtime)
    twins = runtime.ready_twins
    assert twins.ready(k) == [1]
    ctx1 = twins._ready[(k, 1)][0].ctx
    real = ctx1.kernel_pass

    def failing(*args, **kw):   # the twins' thread cannot build the new pipeline; the reload can
        if threading.current_thread().name == _THREAD:
            raise RuntimeError("no pipeline for the twin")
        return real(*args, **kw)
    monkeypatch.setattr(ctx1, "kernel_pass", failing)
    discarded = twins.discarded
    code = _cold(k.spec.spirv, 0xC0DD)
    k.apply_code(code, timeout=60)
    settle(runtime)
    assert twins.ready(k) == [] and twins.bytes_on(1) == 0 and twins.discarded == discarded + 1
    monkeypatch.undo()
    result = runtime.migrate(k, 1)   # builds a twin of its own
    assert result.checksum_match is True and k.device_index == 1 and k.spec.spirv == code.code
    assert np.array_equal(runtime.read_state(k, 1), data)


def test_a_move_never_takes_a_stale_twin(runtime, monkeypatch):
    k, data = launch(runtime)
    settle(runtime)
    twins = runtime.ready_twins
    monkeypatch.setattr(twins, "request", lambda kernel: None)   # the stale twin stays where it is
    discarded, used = twins.discarded, twins.used
    code = _cold(k.spec.spirv, 0xC0DF)
    k.apply_code(code, timeout=60)
    assert twins.ready(k) == [1]
    result = runtime.migrate(k, 1)
    assert result.checksum_match is True and k.device_index == 1
    assert twins.discarded == discarded + 1 and twins.used == used
    assert k.spec.spirv == code.code
    assert np.array_equal(runtime.read_state(k, 1), data)
    runtime.step()
    runtime.synchronize()


class CountingGpuCrc(lifecycle_module.GpuCrc):
    made = 0

    def __init__(self, *args, **kw):
        type(self).made += 1
        super().__init__(*args, **kw)


def test_a_move_without_the_check_makes_no_gpu_crc(runtime, monkeypatch):
    monkeypatch.setattr(lifecycle_module, "GpuCrc", CountingGpuCrc)
    CountingGpuCrc.made = 0
    runtime.prebuild.devices = ()    # (nothing made ahead either)
    runtime.migration_crc = "shader"
    k, data = launch(runtime)
    runtime.migrate(k, 1, verify=False)
    runtime.migrate(k, 0, verify=False)
    assert CountingGpuCrc.made == 0
    assert np.array_equal(runtime.read_state(k, 1), data)
    assert runtime.migrate(k, 1).checksum_match is True
    assert CountingGpuCrc.made == 2   # one per device, kept


def test_a_twin_being_built_holds_no_local_slot(runtime, monkeypatch):
    """A background build never takes a local slot a launch may need: the launch gets
    the first free one (on a full device it would have failed while a twin was made)."""
    kernel_support.counter(runtime, "warm", device=1, max_sources=MAX)   # GPU 1's context exists
    settle(runtime)
    gate, blocked = threading.Event(), threading.Event()
    real = twin_module.Twin.init_commands

    def held(self, *args, **kw):   # the twin exists (buffers made), its initialisation not yet recorded
        if threading.current_thread().name == _THREAD and not gate.is_set():
            blocked.set()
            assert gate.wait(60), "the test never released the twin build"
        return real(self, *args, **kw)
    monkeypatch.setattr(twin_module.Twin, "init_commands", held)
    try:
        launch(runtime)
        assert blocked.wait(60)
        ctx = runtime._context(1)
        assert not any(isinstance(s, twin_module.Twin) for s in ctx.local)
        free = ctx.local.index(None)
        c = kernel_support.counter(runtime, "c", device=1, max_sources=MAX)
        assert c.local_slot == free
    finally:
        gate.set()
    settle(runtime)

