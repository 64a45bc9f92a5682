"""The SPIR-V gate (issue 23, B and C): every module from launch, restore, rollback
and reload passes spirv-val (for the device's target environment) and the
kernel ABI's checks before a driver sees it; the validator is required,
bounded in time and output, and its verdict is remembered per module.

The cases that may reach a driver run first in a child process, so that a
regression that crashes the driver fails one test instead of pytest.
"""
from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kernel_support
from kernel_support import runtime_fixture
from vkmulti import Checkpoint, KernelValidationError, UnsupportedError, VulkanError
from vkmulti.errors import TimeoutError as VkmTimeout
from vkmulti.kernels import KernelSpec, counter_kernel
from vkmulti.kernels.checkpoint import ChunkType
from vkmulti.kernels.engine import reflect
from vkmulti.kernels.engine.spirv_gate import SPIRV_GATE, SpirvGate
from vkmulti.kernels.lifecycle import SPIRV_CHUNK
from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state, read_counter
from vkmulti.kernels.reload import HotReloadConfig, HotReloadManager, KernelCodeSource
from vkmulti.kernels.reload import swap as reload_swap
from vkmulti.kernels.reload import validate_code

HERE = os.path.dirname(os.path.abspath(__file__))
runtime = runtime_fixture(max_kernels=8)
MAX = 8
_OP_STORE, _OP_TYPE_INT = 62, 21
_OP_CONSTANT, _OP_CONSTANT_COMPOSITE, _OP_DECORATE, _DEC_BUILTIN, _BUILTIN_WORKGROUP_SIZE = 43, 44, 71, 11, 25


def _words(code: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(code) // 4}I", code))


def _pack(words: list[int]) -> bytes:
    return struct.pack(f"<{len(words)}I", *words)


def _instructions(words: list[int]):
    i = 5
    while i < len(words):
        n, op = words[i] >> 16, words[i] & 0xFFFF
        yield i, op
        i += n


def huge_bound(code: bytes) -> bytes:
    """The module with an id bound of 0xFFFFFFFF in its header."""
    w = _words(code)
    w[3] = 0xFFFFFFFF
    return _pack(w)


def bad_store(code: bytes) -> bytes:
    """The module with its first OpStore's pointer operand changed to a type id: it
    still parses (the structural check passes it), spirv-val refuses it."""
    w = _words(code)
    store = next(i for i, op in _instructions(w) if op == _OP_STORE)
    w[store + 1] = next(w[i + 1] for i, op in _instructions(w) if op == _OP_TYPE_INT)
    return _pack(w)


def renamed(code: bytes, generator: int) -> bytes:
    """The same, valid module under another digest (a different generator word)."""
    w = _words(code)
    w[2] = generator
    return _pack(w)


def big_workgroup(code: bytes) -> bytes:
    """The module with its WorkgroupSize built-in (which overrides LocalSize) made of one of its
    constants in [16, 64] on each axis: valid SPIR-V (spirv-val knows no device), thousands of
    invocations a workgroup, past every device's maxComputeWorkGroupInvocations."""
    w = _words(code)
    target = next(w[i + 1] for i, op in _instructions(w)
                  if op == _OP_DECORATE and w[i + 2] == _DEC_BUILTIN and w[i + 3] == _BUILTIN_WORKGROUP_SIZE)
    composite = next(i for i, op in _instructions(w) if op == _OP_CONSTANT_COMPOSITE and w[i + 2] == target)
    kind = next(w[i + 1] for i, op in _instructions(w) if op == _OP_CONSTANT and w[i + 2] == w[composite + 3])
    values = {w[i + 2]: w[i + 3] for i, op in _instructions(w) if op == _OP_CONSTANT and w[i + 1] == kind}
    big = max((c for c, v in values.items() if 16 <= v <= 64), key=values.__getitem__)
    w[composite + 3:composite + 6] = [big, big, big]
    return _pack(w)


FORGERIES = {"bound": huge_bound, "store": bad_store, "workgroup": big_workgroup}


def _spec(code: bytes) -> KernelSpec:
    return KernelSpec("counter", code, state_sizes=counter_kernel(max_sources=MAX).state_sizes,
                      inbox_capacity=8, outbox_capacity=8)


def _forged_checkpoint(cp: Checkpoint, code: bytes) -> Checkpoint:
    """`cp` with its SPIR-V chunk (and the SHA-256 recorded for it) replaced; CRCs recomputed."""
    import hashlib
    cp = Checkpoint.from_bytes(cp.to_bytes())
    chunk = next(c for c in cp.chunks if c.chunk_type() is ChunkType.CUSTOM and c.header.chunk_id == SPIRV_CHUNK)
    chunk.data = code
    cp.metadata.custom["vkm.spirv_sha256"] = hashlib.sha256(code).hexdigest()
    return Checkpoint.from_bytes(cp.to_bytes())


def paths(rt, how: str):
    """(path name, a call that hands the forged module to the driver through it)."""
    good = counter_kernel(max_sources=MAX).spirv
    bad = FORGERIES[how](good)
    k = rt.launch(_spec(good), f"base-{how}", device=0, state=[counter_initial_state(MAX)])
    rt.send(k, np.array([5], np.uint32), tag=COUNTER_TAG_ADD)
    rt.step(k)
    rt.synchronize()
    cp = _forged_checkpoint(k.create_checkpoint(), bad)

    def rollback():
        mgr = HotReloadManager.with_defaults()
        mgr.register_kernel(k.id, KernelCodeSource.from_spirv(bad))   # registered, never run
        mgr.reload(k, KernelCodeSource.from_spirv(good))               # the forged version becomes history
        mgr.rollback(k.id, 1)

    def reload():
        HotReloadManager(HotReloadConfig().with_validate_before_swap(False)).reload(k, KernelCodeSource.from_spirv(bad))
    return k, [("launch", lambda: rt.launch(_spec(bad), f"new-{how}", device=1)),
               ("restore-new", lambda: rt.restore(cp, kernel_id=f"copy-{how}", device=1)),
               ("restore-into", lambda: rt.restore(cp, into=k, device=1)),
               ("rollback", rollback),
               ("reload", reload)]


def body(cases: list[str]) -> None:
    """Each forged module through each path on one manager; prints what each did (so a
    crash names the case it died in)."""
    from vkmulti import MultiDeviceManager
    from vkmulti.kernels import KernelRuntime

    mgr = MultiDeviceManager.create()
    try:
        rt = KernelRuntime(kernel_support.make_coordinator(mgr), mgr, max_kernels=16)
        try:
            for how in cases:
                _, calls = paths(rt, how)
                for name, call in calls:
                    print("CASE", how, name, flush=True)
                    try:
                        call()
                        print("RESULT", how, name, "accepted", flush=True)
                    except KernelValidationError as exc:
                        print("RESULT", how, name, "refused", str(exc)[:120].replace("\n", " "), flush=True)
        finally:
            rt.destroy()
    finally:
        mgr.destroy()


def test_forged_modules_in_a_child_process():
    """Every path refuses both modules with KernelValidationError and the child exits 0
    (before: launch and restore of the 0xFFFFFFFF bound died of SIGSEGV in
    vkCreateComputePipelines; rollback to a registered version was never checked)."""
    code = f"import sys; sys.path.insert(0, {HERE!r}); import test_spirv_gate as t; t.body({list(FORGERIES)!r})"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280, cwd=HERE)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    for how in FORGERIES:
        for name in ("launch", "restore-new", "restore-into", "rollback", "reload"):
            assert f"RESULT {how} {name} refused" in p.stdout, p.stdout[-3000:]


def test_the_structural_check_passes_what_spirv_val_refuses():
    """The minimal case of C: one OpStore pointer operand changed parses, and only the
    validator sees it is wrong."""
    bad = bad_store(counter_kernel().spirv)
    reflect(bad)
    validate_code(KernelCodeSource.from_spirv(bad))
    with pytest.raises(KernelValidationError, match="spirv-val.*cannot be a type"):
        SpirvGate().check(bad, "vulkan1.1")


@pytest.mark.parametrize("how", ["store", "workgroup"])
def test_refused_paths_leave_the_runtime_usable(runtime, how):
    k, calls = paths(runtime, how)
    kernels = list(runtime.kernels)
    for name, call in calls:
        with pytest.raises(KernelValidationError):
            call()
    assert list(runtime.kernels) == kernels
    runtime.send(k, np.array([2], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    runtime.synchronize()
    assert read_counter(runtime.read_state(k)).sum == 7


def test_a_verdict_is_remembered_per_module(runtime):
    """A relaunch and a migration of the same code start no validator process."""
    spec = _spec(renamed(counter_kernel(max_sources=MAX).spirv, 0x7654_0001))
    runs = SPIRV_GATE.runs
    k = runtime.launch(spec, "a", device=0, state=[counter_initial_state(MAX)])
    assert SPIRV_GATE.runs == runs + 1
    runtime.launch(spec, "b", device=1, state=[counter_initial_state(MAX)])
    runtime.migrate(k, 1)
    runtime.step()
    runtime.synchronize()
    assert SPIRV_GATE.runs == runs + 1


def test_a_missing_validator_is_a_clear_unsupported_error(runtime, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    spec = _spec(renamed(counter_kernel(max_sources=MAX).spirv, 0x7654_0002))
    with pytest.raises(UnsupportedError, match="apt-get install spirv-tools"):
        runtime.launch(spec, "a", device=0)
    assert list(runtime.kernels) == []
    monkeypatch.undo()
    runtime.launch(spec, "a", device=0)   # not remembered as a verdict: it passes once installed


def _fake_validator(tmp_path, script: str) -> str:
    path = tmp_path / "fake-spirv-val"
    path.write_text("#!" + sys.executable + "\n" + textwrap.dedent(script))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_validator_is_bounded_in_time(tmp_path):
    gate = SpirvGate(_fake_validator(tmp_path, """
        import os, time
        open(os.environ["PIDFILE"], "w").write(str(os.getpid()))
        time.sleep(600)
    """))
    os.environ["PIDFILE"] = str(tmp_path / "pid")
    try:
        with pytest.raises(VkmTimeout, match="spirv-val did not finish"):
            gate.check(counter_kernel().spirv, "vulkan1.1", timeout=0.5)
    finally:
        del os.environ["PIDFILE"]
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):   # killed and reaped
        os.kill(pid, 0)
    assert len(gate) == 0   # a timeout is no verdict


def test_the_validator_is_bounded_in_output(tmp_path):
    gate = SpirvGate(_fake_validator(tmp_path, """
        import sys
        sys.stdout.write("x" * (8 << 20))
        sys.exit(1)
    """))
    with pytest.raises(KernelValidationError) as info:
        gate.check(counter_kernel().spirv, "vulkan1.1")
    assert len(str(info.value)) < 1000


def test_the_target_environment_is_the_devices(runtime):
    """A module of a SPIR-V version newer than vulkan1.0 takes is refused for vulkan1.0."""
    code = counter_kernel().spirv
    SpirvGate().check(code, "vulkan1.3")
    w = _words(code)
    w[1] = 0x00010600   # SPIR-V 1.6
    with pytest.raises(KernelValidationError, match="vulkan1.0"):
        SpirvGate().check(_pack(w), "vulkan1.0")


def test_a_driver_refusal_is_not_retried(runtime, monkeypatch):
    """A Vulkan error other than running out of memory fails the reload at once
    (before: retried max_retries times with exponential back-off, 3.5 s by default)."""
    k = kernel_support.counter(runtime, "c", device=0, max_sources=MAX)
    mgr = HotReloadManager.with_defaults()
    mgr.register_runtime_kernel(k)
    calls = []

    def refuse(ctx, code, entry, n_state):
        calls.append(1)
        raise VulkanError(-13, "vkCreateComputePipelines")   # VK_ERROR_UNKNOWN
    monkeypatch.setattr(reload_swap, "_build", refuse)
    request = mgr.request_reload("c", KernelCodeSource.from_spirv(renamed(k.spec.spirv, 0x7654_0003)))
    with pytest.raises(VulkanError):
        mgr.execute_reload(request, k)
    assert len(calls) == 1 and request.retry_count == 0 and request.is_failed()


def test_a_reflection_is_kept_per_module_bytes_and_bounded():
    from vkmulti.kernels.engine import spirv as spirv_module
    code = counter_kernel(max_sources=8).spirv
    first = reflect(code)
    assert reflect(bytes(code)) is first                       # the same bytes: parsed once
    assert reflect(bytearray(code)) is not first               # (only bytes are kept)
    bad = code[:20] + struct.pack("<I", 0xFFFF0000)            # an instruction past the end
    for _ in range(2):                                         # a refusal is never kept
        with pytest.raises(KernelValidationError):
            reflect(bad)
    for tag in range(spirv_module._KEPT + 1):                  # bounded: the oldest goes
        raw = bytearray(code)
        struct.pack_into("<I", raw, 8, 0xA000 + tag)
        reflect(bytes(raw))
    assert len(spirv_module._kept) == spirv_module._KEPT and reflect(code) is not first


def nested_push_constants(members: int, levels: int) -> bytes:
    """A module (1.5 KB) whose push-constant block nests `levels` structs of `members` members
    each, every member with its Offset: members ** levels paths to its scalars."""
    words: list[int] = []

    def op(code: int, *operands: int) -> None:
        words.extend([(len(operands) + 1) << 16 | code, *operands])
    uint, void, fn, ptr, pc, main, label, first = 1, 2, 3, 4, 5, 6, 7, 8
    top = first + levels
    op(17, 1)                                       # OpCapability Shader
    op(14, 0, 1)                                    # OpMemoryModel Logical GLSL450
    op(15, 5, main, *struct.unpack("<2I", b"main\0\0\0\0"))   # OpEntryPoint GLCompute "main"
    op(16, main, 17, 1, 1, 1)                       # OpExecutionMode LocalSize 1 1 1
    op(71, top, 2)                                  # OpDecorate Block
    for s in range(first, top + 1):
        for m in range(members):
            op(72, s, m, 35, 0)                     # OpMemberDecorate Offset 0
    op(19, void)
    op(33, fn, void)
    op(21, uint, 32, 0)
    op(30, first, *[uint] * members)
    for s in range(first + 1, top + 1):
        op(30, s, *[s - 1] * members)               # OpTypeStruct of the one below
    op(32, ptr, 9, top)                             # OpTypePointer PushConstant
    op(59, ptr, pc, 9)                              # OpVariable
    op(54, void, main, 0, fn)
    op(248, label)
    op(253)
    op(56)
    return struct.pack(f"<{5 + len(words)}I", 0x07230203, 0x00010300, 0, top + 1, 0, *words)


def test_reflecting_nested_structs_sizes_each_once():
    """4 ** 15 paths through a push-constant block: sized member by member, its reflection ran for
    hours (holding the interpreter) for any launch, restore or reload of the module; each struct
    is sized once now (a child process, so that a regression cannot hang the test run)."""
    code = nested_push_constants(4, 15)
    run = (f"import sys; from vkmulti.kernels.engine import reflect; "
           f"print(reflect(bytes.fromhex({code.hex()!r})).push_constant_bytes)")
    p = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.split() == ["4"], p.stderr[-2000:]
