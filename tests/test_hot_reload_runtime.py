"""Hot reload of runtime kernels on the virtual GPU pair (issue 16): the new SPIR-V
is checked (header, ABI bindings and entry point by reflection, spirv-val),
built on every device where the kernel lives and swapped at a step boundary
with the state preserved byte for byte; bad code is refused with FAILED
counted and the old code running; rollback over three versions; timeout,
retries and backoff enforced; PTX on a Vulkan kernel is UnsupportedError."""
from __future__ import annotations

import shutil
import struct
import threading
import time

import numpy as np
import pytest

from kernel_support import runtime_fixture
from vkmulti import (HotReloadConfig, HotReloadManager, HotReloadState, KernelCodeSource, UnsupportedError,
                     VulkanError)
from vkmulti.errors import KernelValidationError, TimeoutError as VkmTimeout
from vkmulti.kernels import KernelSpec, counter_kernel, pingpong_kernel
from vkmulti.kernels.reload import swap as reload_swap
from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state, read_counter
from vkmulti.kernels.engine import reflect

needs_glslc = pytest.mark.skipif(shutil.which("glslc") is None, reason="needs glslc to build test kernels")

ADDER = """
#version 450
#extension GL_GOOGLE_include_directive : require
#include "vkm_kernel_abi.glsl"
layout(local_size_x = 1) in;
layout(std430, set = 0, binding = 2) buffer State { uint words[]; } state;
void main() { state.words[0] += STEP_ADD; state.words[1] = STEP_ADD; }
"""


def adder(n: int) -> KernelCodeSource:
    return KernelCodeSource.from_glsl(ADDER, defines={"STEP_ADD": str(n)})


runtime = runtime_fixture(max_kernels=64)


def words(rt, k, n=2):
    return rt.read_state(k)[:4 * n].view(np.uint32).tolist()


@needs_glslc
def test_swap_keeps_the_state_and_rollback_goes_back_three_versions(runtime):
    v1 = adder(1)
    k = runtime.launch(KernelSpec("adder", v1.code, state_sizes=(4096,)), "a", device=0,
                       state=[np.arange(1024, dtype=np.uint32)])
    mgr = HotReloadManager.with_defaults()
    mgr.register_runtime_kernel(k)
    for _ in range(3):
        runtime.step(k)
    assert words(runtime, k) == [3, 1]
    results = []
    for n in (10, 100, 1000):
        before = runtime.read_state(k)
        r = mgr.reload(k, adder(n))
        results.append(r)
        assert np.array_equal(runtime.read_state(k), before)   # byte for byte
        runtime.step(k)
        assert words(runtime, k)[1] == n
    assert words(runtime, k)[0] == 3 + 10 + 100 + 1000
    assert [r.new_version for r in results] == [2, 3, 4] and all(r.state_preserved for r in results)
    assert all(r.devices == [0] and r.swap_duration >= 0 and r.compile_duration >= 0 for r in results)
    assert [c.version_id for c in mgr.history("a")] == [1, 2, 3]
    back = mgr.rollback("a", 3)   # to v1, on the live kernel
    assert back.version_id == 1 and mgr.get_current_version("a") == 1 and k.spec.spirv == v1.code
    runtime.step(k)
    assert words(runtime, k) == [1114, 1]
    with pytest.raises(KernelValidationError, match="No fallback"):
        mgr.rollback("a")
    s = mgr.stats()
    assert (s.successful_reloads, s.failed_reloads, s.rollbacks, s.state_preserved_count) == (3, 0, 1, 3)
    assert np.array_equal(runtime.read_state(k)[8:].view(np.uint32), np.arange(2, 1024, dtype=np.uint32))


@needs_glslc
def test_one_reload_for_kernels_on_both_devices(runtime):
    spec = KernelSpec("adder", adder(1).code, state_sizes=(64,))
    ks = [runtime.launch(spec, f"slab{i}", device=i % 2) for i in range(4)]
    mgr = HotReloadManager.with_defaults()
    mgr.register_kernel("adder", KernelCodeSource.from_spirv(spec.spirv))
    r = mgr.execute_reload(mgr.request_reload("adder", adder(7)), ks)
    assert r.devices == [0, 1]
    runtime.step()
    assert all(words(runtime, k) == [7, 7] for k in ks)
    mgr.rollback("adder")
    runtime.step()
    assert all(words(runtime, k) == [8, 1] for k in ks)


def test_reload_with_the_reference_kernels_keeps_counting(runtime):
    """No glslc needed: swap the counter for the ping-pong kernel (same ABI shape) and back."""
    k = runtime.launch(counter_kernel(max_sources=64), "c", device=1, state=[counter_initial_state(64)])
    runtime.send(k, np.array([5], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    mgr = HotReloadManager(HotReloadConfig().with_preserve_state(False).with_validate_before_swap(False))
    mgr.register_runtime_kernel(k)
    before = runtime.read_state(k)
    mgr.reload(k, KernelCodeSource.from_spirv(pingpong_kernel().spirv))
    assert not runtime.read_state(k).any()   # preserve_state=False: a fresh state
    runtime.write_state(k, 0, before)
    mgr.rollback(k.id)
    runtime.send(k, np.array([6], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    st = read_counter(runtime.read_state(k))
    assert (st.count, st.sum) == (2, 11)


def _bad_modules() -> list[tuple[str, bytes, str]]:
    good = counter_kernel().spirv
    out = [("garbage", b"\x01\x02\x03\x04" * 10, "magic"),
           ("truncated", good[:len(good) // 2 + 2], "word|instruction|truncated"),
           ("not words", good[:-2], "whole number"),
           ("empty", b"", "empty")]
    wrong_version = bytearray(good)
    struct.pack_into("<I", wrong_version, 4, 0x00020000)
    out.append(("version 2.0", bytes(wrong_version), "version"))
    return out


@pytest.mark.parametrize("name,code,match", _bad_modules(), ids=[n for n, _, _ in _bad_modules()])
def test_bad_spirv_is_refused_failed_counted_old_code_running(runtime, name, code, match):
    k = runtime.launch(counter_kernel(max_sources=64), "c", device=0, state=[counter_initial_state(64)])
    mgr = HotReloadManager.with_defaults()
    mgr.register_runtime_kernel(k)
    old = k.spec.spirv
    request = mgr.request_reload("c", KernelCodeSource.from_spirv(code))
    with pytest.raises(KernelValidationError, match=match):
        mgr.execute_reload(request, k)
    assert request.state is HotReloadState.FAILED and request.error
    assert mgr.stats().failed_reloads == 1 and mgr.get_current_version("c") == 1
    assert k.spec.spirv == old and not runtime.is_held(k)
    runtime.send(k, np.array([3], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    assert read_counter(runtime.read_state(k)).sum == 3


@needs_glslc
@pytest.mark.parametrize("source,match", [
    ("layout(std430, set = 0, binding = 3) buffer S { uint w[]; } s; void main() { s.w[0] = 1u; }",
     "binding 3"),
    ("layout(std430, set = 1, binding = 0) buffer S { uint w[]; } s; void main() { s.w[0] = 1u; }", "set 1"),
    ("layout(set = 0, binding = 2) uniform U { uint w; } u; layout(std430, set = 0, binding = 0) buffer S "
     "{ uint x[]; } s; void main() { s.x[0] = u.w; }", "uniform_buffer"),
    ("layout(push_constant) uniform P { uvec4 a[4]; } p; layout(std430, set = 0, binding = 2) buffer S "
     "{ uvec4 w[]; } s; void main() { s.w[0] = p.a[3]; }", "push constants"),
    ("layout(std430, set = 0, binding = 2) buffer S { uint w[]; } s; shared uint big[262144]; "   # (1 MiB)
     "void main() { big[s.w[0]] = 1u; barrier(); s.w[1] = big[s.w[2]]; }", "maxComputeSharedMemorySize"),
])
def test_abi_mismatches_are_found_by_reflection(runtime, source, match):
    k = runtime.launch(counter_kernel(max_sources=64), "c", device=0, state=[counter_initial_state(64)])
    mgr = HotReloadManager.with_defaults()
    mgr.register_runtime_kernel(k)
    code = KernelCodeSource.from_glsl("#version 450\nlayout(local_size_x = 1) in;\n" + source)
    with pytest.raises(KernelValidationError, match=match):
        mgr.reload(k, code)
    assert mgr.stats().failed_reloads == 1
    wrong_entry = KernelCodeSource.from_spirv(counter_kernel().spirv, "nope")
    with pytest.raises(KernelValidationError, match="no entry point 'nope'"):
        mgr.reload(k, wrong_entry)


def test_ptx_wgsl_msl_on_a_vulkan_kernel_are_unsupported(runtime):
    k = runtime.launch(counter_kernel(max_sources=64), "c", device=0, state=[counter_initial_state(64)])
    mgr = HotReloadManager.with_defaults()
    mgr.register_runtime_kernel(k)
    for code in (KernelCodeSource.from_ptx(".version 7.0", "k"), KernelCodeSource.from_wgsl("fn main() {}", "main"),
                 KernelCodeSource.from_msl("kernel void k() {}", "k")):
        with pytest.raises(UnsupportedError, match="SPIR-V"):
            mgr.reload(k, code)
    assert mgr.stats().failed_reloads == 3


def test_timeout_is_enforced_and_the_old_code_keeps_running(runtime, monkeypatch):
    k = runtime.launch(counter_kernel(max_sources=64), "c", device=0, state=[counter_initial_state(64)])
    mgr = HotReloadManager(HotReloadConfig().with_timeout(0.3))
    mgr.register_runtime_kernel(k)
    real = reload_swap._build
    release, finished = threading.Event(), threading.Event()

    def slow(ctx, code, entry, n_state):   # a build that lasts until the test lets it go
        try:
            release.wait(30)
            return real(ctx, code, entry, n_state)
        finally:
            finished.set()
    monkeypatch.setattr(reload_swap, "_build", slow)
    request = mgr.request_reload("c", KernelCodeSource.from_spirv(pingpong_kernel().spirv))
    try:
        with pytest.raises(VkmTimeout, match="reload_timeout"):
            mgr.execute_reload(request, k)
        assert not finished.is_set()   # the call gave up on the build: it did not wait for it
        assert request.is_failed() and mgr.stats().failed_reloads == 1
        assert k.spec.spirv == counter_kernel(max_sources=64).spirv
        runtime.send(k, np.array([4], np.uint32), tag=COUNTER_TAG_ADD)
        runtime.step(k)
        assert read_counter(runtime.read_state(k)).sum == 4
    finally:
        release.set()
        assert finished.wait(30)   # the abandoned build finishes into the device's pipeline cache


def test_transient_vulkan_errors_are_retried_with_backoff(runtime, monkeypatch):
    k = runtime.launch(counter_kernel(max_sources=64), "c", device=0, state=[counter_initial_state(64)])
    mgr = HotReloadManager(HotReloadConfig().with_max_retries(2).with_retry_backoff(0.05))
    mgr.register_runtime_kernel(k)
    real = reload_swap._build
    fails = [2]

    def flaky(ctx, code, entry, n_state):
        if fails[0]:
            fails[0] -= 1
            raise VulkanError(-2, "vkCreateComputePipelines")
        return real(ctx, code, entry, n_state)
    monkeypatch.setattr(reload_swap, "_build", flaky)
    request = mgr.request_reload("c", KernelCodeSource.from_spirv(pingpong_kernel().spirv))
    t = time.monotonic()
    r = mgr.execute_reload(request, k)
    assert time.monotonic() - t >= 0.15 and request.retry_count == 2 and r.attempts == 3
    fails[0] = 5
    request = mgr.request_reload("c", KernelCodeSource.from_spirv(counter_kernel(max_sources=64).spirv))
    with pytest.raises(VulkanError):
        mgr.execute_reload(request, k)
    assert request.retry_count == 2 and mgr.stats().failed_reloads == 1


def test_the_kernel_protocol_methods(runtime):
    k = runtime.launch(counter_kernel(max_sources=64), "c", device=0, state=[counter_initial_state(64)])
    k.prepare_for_reload()
    assert k.is_ready_for_reload() and runtime.is_held(k)
    k.apply_code(KernelCodeSource.from_spirv(counter_kernel(max_sources=64).spirv))
    k.resume_after_reload()
    assert not runtime.is_held(k)
    with pytest.raises(UnsupportedError):
        k.apply_code(KernelCodeSource.from_ptx(".version 7.0", "k"))


def test_glsl_without_glslc_is_unsupported(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(UnsupportedError, match="glslc"):
        KernelCodeSource.from_glsl("#version 450\nvoid main() {}")


def test_a_spirv_file_is_a_bounded_regular_file(tmp_path):
    import os
    from vkmulti.kernels.engine.spirv_gate import MAX_MODULE_BYTES
    from vkmulti._core.shaders import shader_path
    good = shader_path("kernel_counter.comp.spv")
    (tmp_path / "link.spv").symlink_to(good)
    assert KernelCodeSource.from_spirv_file(tmp_path / "link.spv").code == good.read_bytes()
    os.mkfifo(tmp_path / "fifo.spv")   # (its open waited for a writer, without end)
    with open(tmp_path / "huge.spv", "wb") as f:   # (sparse)
        f.truncate(MAX_MODULE_BYTES + 1)
    for path, match in ((tmp_path, "not a regular file"), (tmp_path / "huge.spv", f"at most {MAX_MODULE_BYTES}"),
                        (tmp_path / "fifo.spv", "not a regular file"), ("/dev/zero", "not a regular file")):
        with pytest.raises(ValueError, match=match):
            KernelCodeSource.from_spirv_file(path)


@needs_glslc
def test_glsl_compile_arguments_are_checked():
    source = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n"
    for bad in (-1, float("nan"), "5", True):
        with pytest.raises(ValueError, match="timeout"):
            KernelCodeSource.from_glsl(source, timeout=bad)
    with pytest.raises(TypeError, match="include_dirs"):
        KernelCodeSource.from_glsl(source, include_dirs="/tmp")   # (was split into one folder per character)
    with pytest.raises(TypeError, match="defines"):
        KernelCodeSource.from_glsl(source, defines=[("A", "1")])
    for unbounded in (None, float("inf"), 1e12):   # (inf and 1e12 overflowed the process wait)
        assert reflect(KernelCodeSource.from_glsl(source, timeout=unbounded).code).entry_points == {"main": "GLCompute"}


@needs_glslc
def test_glsl_that_does_not_compile_is_a_validation_error():
    with pytest.raises(KernelValidationError, match="does not compile"):
        KernelCodeSource.from_glsl("#version 450\nvoid main() { nope(); }")
    code = adder(3)
    assert code.metadata["compiled_from"] == "glsl" and reflect(code.code).local_size == {"main": (1, 1, 1)}


@needs_glslc
def test_the_new_code_is_validated_on_a_thread_of_lowered_priority(runtime, monkeypatch):
    """The SPIR-V gate of a reload runs on a thread of its own with a lowered CPU
    priority (the spirv-val child inherits it), its verdict and errors reach the
    caller: the steps keep the cores."""
    import os
    seen = []
    refuse = []
    real = reload_swap.validate_kernel_spirv

    def spy(*args, **kw):
        nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if hasattr(os, "getpriority") else None
        seen.append((threading.current_thread().name, nice))
        if refuse:
            raise KernelValidationError("spirv-val: refused (test)")
        return real(*args, **kw)
    monkeypatch.setattr(reload_swap, "validate_kernel_spirv", spy)
    k = runtime.launch(KernelSpec("adder", adder(1).code, state_sizes=(4096,)), "a", device=0)
    mgr = HotReloadManager.with_defaults()
    mgr.register_runtime_kernel(k)
    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if hasattr(os, "getpriority") else None
    mgr.reload(k, adder(7))
    assert seen and all(name == "vkmulti-reload-check" for name, _ in seen), seen
    if caller is not None and caller < 19:
        assert all(nice > caller for _, nice in seen), (caller, seen)
    refuse.append(1)
    request = mgr.request_reload("a", adder(9))
    with pytest.raises(KernelValidationError, match="refused"):
        mgr.execute_reload(request, k)
    assert request.state is HotReloadState.FAILED
    runtime.step(k)
    assert words(runtime, k) == [7, 7]   # the code that passed still runs
