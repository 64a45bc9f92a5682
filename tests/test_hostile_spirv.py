"""Hostile SPIR-V that spirv-val passes: modules that declare what the device was not
made with (capabilities, extensions, LocalSizeId), sizes computed by
OpSpecConstantOp or held in 64-bit constants (a workgroup, shared memory, push
constants past the device's limits or the kernel ABI's), an entry point whose name
is not UTF-8, a huge or foreign entry point name, modules of any byte count.

Each must be refused with a clear error before a driver sees it, on every path SPIR-V
comes in by (launch, KernelSpec.from_file, Kernel.apply_code, KernelCodeSource
.from_spirv_file), with the validation layer silent. The cases that reach a driver
run in a child process (a regression may crash it: the entry point case did, SIGSEGV
in vkCreateComputePipelines).
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import tracemalloc

import pytest

from child_runs import printed_in_order, run_script
from vkmulti import KernelValidationError, UnsupportedError
from vkmulti.kernels import KernelSpec
from vkmulti.kernels.engine import check_kernel_abi, reflect
from vkmulti.kernels.engine.spirv_gate import MAX_MODULE_BYTES, validate_kernel_spirv
from vkmulti.kernels.reload import KernelCodeSource, validate_code

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.skipif(shutil.which("spirv-as") is None, reason="spirv-as (SPIRV-Tools) is not installed")

#: A kernel of the ABI that uses only state buffer 0 (binding 2): LocalSize 1 1 1, does nothing.
TEMPLATE = """OpCapability Shader
{caps}
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main"
{mode}
OpDecorate %State Block
OpMemberDecorate %State 0 Offset 0
OpDecorate %st DescriptorSet 0
OpDecorate %st Binding 2
{decor}
%void = OpTypeVoid
%fn = OpTypeFunction %void
%uint = OpTypeInt 32 0
%State = OpTypeStruct %uint
%ptr = OpTypePointer StorageBuffer %State
%st = OpVariable %ptr StorageBuffer
%zero = OpConstant %uint 0
{types}
%main = OpFunction %void None %fn
%e = OpLabel
{body}
OpReturn
OpFunctionEnd
"""
_LOCAL = "OpExecutionMode %main LocalSize 1 1 1"
_PUSH = ("OpDecorate %parr ArrayStride 4\nOpDecorate %P Block\nOpMemberDecorate %P 0 Offset 0",
         "%parr = OpTypeArray %uint %n\n%P = OpTypeStruct %parr\n%pp = OpTypePointer PushConstant %P\n"
         "%pc = OpVariable %pp PushConstant\n%pu = OpTypePointer PushConstant %uint\n"
         "%ps = OpTypePointer StorageBuffer %uint\n%last = OpConstant %uint 1000",
         "%p = OpAccessChain %pu %pc %zero %last\n%v = OpLoad %uint %p\n%q = OpAccessChain %ps %st %zero\n"
         "OpStore %q %v")

#: name -> (assembler arguments, SPIR-V version, error class, words the message holds)
CASES: dict[str, tuple[dict, str, str, tuple[str, ...]]] = {
    "int8": (dict(caps="OpCapability Int8", types="%u8 = OpTypeInt 8 0\n%c = OpConstant %u8 5"), "spv1.3",
             "UnsupportedError", ("Int8", "shaderInt8", "GPU ")),
    "int64-atomics": (dict(caps="OpCapability Int64\nOpCapability Int64Atomics"), "spv1.3",
                      "UnsupportedError", ("Int64Atomics", "shaderBufferInt64Atomics", "GPU ")),
    "storage-image-multisample": (dict(caps="OpCapability StorageImageMultisample"), "spv1.3",
                                  "UnsupportedError", ("StorageImageMultisample", "shaderStorageImageMultisample",
                                                       "GPU ")),
    "ray-query": (dict(caps='OpCapability RayQueryKHR\nOpExtension "SPV_KHR_ray_query"'), "spv1.4",
                  "UnsupportedError", ("RayQueryKHR", "rayQuery feature", "GPU ")),
    "shader-clock": (dict(caps='OpCapability ShaderClockKHR\nOpExtension "SPV_KHR_shader_clock"'), "spv1.3",
                     "UnsupportedError", ("ShaderClockKHR", "VK_KHR_shader_clock extension", "GPU ")),
    "local-size-id": (dict(mode="OpExecutionModeId %main LocalSizeId %one %one %one",
                           types="%one = OpConstant %uint 1"), "spv1.6",
                      "UnsupportedError", ("LocalSizeId", "maintenance4", "GPU ")),
    "workgroup-spec-op": (dict(decor="OpDecorate %wg BuiltIn WorkgroupSize",
                               types="%v3 = OpTypeVector %uint 3\n%c64 = OpSpecConstant %uint 64\n"
                                     "%one = OpConstant %uint 1\n%big = OpSpecConstantOp %uint IMul %c64 %c64\n"
                                     "%wg = OpSpecConstantComposite %v3 %big %one %one"), "spv1.3",
                          "KernelValidationError", ("4096", "maxComputeWorkGroup")),
    "shared-spec-op": (dict(decor="OpDecorate %arr ArrayStride 4",
                            types="%c = OpSpecConstant %uint 4096\n%n = OpSpecConstantOp %uint IMul %c %c\n"
                                  "%arr = OpTypeArray %uint %n\n%parr = OpTypePointer Workgroup %arr\n"
                                  "%sh = OpVariable %parr Workgroup\n%pu = OpTypePointer Workgroup %uint",
                            body="%p = OpAccessChain %pu %sh %zero\nOpStore %p %zero"), "spv1.3",
                       "KernelValidationError", ("67108864", "maxComputeSharedMemorySize")),
    "push-spec-length": (dict(decor=_PUSH[0], types="%n = OpSpecConstant %uint 100000\n" + _PUSH[1], body=_PUSH[2]),
                         "spv1.3", "KernelValidationError", ("400000", "push constants")),
    "entry-not-utf8": (dict(), "spv1.3", "KernelValidationError", ("UTF-8",)),
}
#: The entry point each case asks for: the non-UTF-8 name as a lossy decode reads it.
ENTRY = {"entry-not-utf8": "m\ufffdin"}
PATHS = ("launch", "spec-from-file", "apply-code", "code-from-file")


def assemble(caps: str = "", mode: str = _LOCAL, decor: str = "", types: str = "", body: str = "",
             version: str = "spv1.3") -> bytes:
    """The TEMPLATE module with these parts, assembled by spirv-as."""
    text = TEMPLATE.format(caps=caps, mode=mode, decor=decor, types=types, body=body)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "m.spvasm"), os.path.join(tmp, "m.spv")
        with open(src, "w") as f:
            f.write(text)
        p = subprocess.run(["spirv-as", "--target-env", version, src, "-o", out], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        with open(out, "rb") as f:
            return f.read()


def module(name: str) -> bytes:
    args, version, _, _ = CASES[name] if name in CASES else ({}, "spv1.3", "", ())
    code = assemble(version=version, **args)
    if name == "entry-not-utf8":   # "main" -> b"m\xffin": valid SPIR-V to spirv-val, not UTF-8
        raw = bytearray(code)
        at = raw.index(b"main\0")
        raw[at:at + 4] = b"m\xffin"
        code = bytes(raw)
    return code


def body(cases: list[str]) -> None:
    """Each case through each path on one runtime of the virtual pair (the pipeline helper on,
    so a reload's build goes through it); prints what each did and any validation error."""
    os.environ["VKMULTI_PIPELINE_HELPER"] = "1"
    import numpy as np

    from vkmulti import MultiDeviceManager
    from vkmulti.device.instance import drain_all_validation_messages
    from vkmulti.kernels import KernelRuntime, counter_kernel
    from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state, read_counter

    import kernel_support

    mgr = MultiDeviceManager.create()
    rt = KernelRuntime(kernel_support.make_coordinator(mgr), mgr, max_kernels=8)
    base = rt.launch(counter_kernel(max_sources=8), "base", device=0, state=[counter_initial_state(8)])
    tmp = tempfile.mkdtemp()
    try:
        for name in ["control", *cases]:
            code, entry = module(name), ENTRY.get(name, "main")
            path = os.path.join(tmp, f"{name}.spv")
            with open(path, "wb") as f:
                f.write(code)
            calls = {
                "launch": lambda: rt.launch(KernelSpec(name, code, state_sizes=(16,), entry_point=entry),
                                            f"{name}-a", device=0),
                "spec-from-file": lambda: rt.launch(KernelSpec.from_file(name, path, state_sizes=(16,),
                                                                         entry_point=entry), f"{name}-b", device=1),
                "apply-code": lambda: base.apply_code(KernelCodeSource.from_spirv(code, entry), timeout=60),
                "code-from-file": lambda: base.apply_code(KernelCodeSource.from_spirv_file(path, entry), timeout=60),
            }
            for how, call in calls.items():
                print("CASE", name, how, flush=True)
                try:
                    made = call()
                    print("RESULT", name, how, "accepted", flush=True)
                    if made is not None:
                        rt.destroy_kernel(made)
                    if how.endswith("code") or how == "code-from-file":
                        base.apply_code(KernelCodeSource.from_spirv(counter_kernel(max_sources=8).spirv), timeout=60)
                except Exception as exc:   # what the test checks
                    text = " ".join(str(exc).split())
                    print("RESULT", name, how, "refused", type(exc).__name__, len(text), text[:400], flush=True)
                errors = [t for sev, t in drain_all_validation_messages() if sev == "error"]
                if errors:
                    print("VALIDATION", name, how, errors[0][:300], flush=True)
        rt.send(base, np.array([7], np.uint32), tag=COUNTER_TAG_ADD)
        rt.step(base)
        rt.synchronize()
        print("STILL WORKS", read_counter(rt.read_state(base)).sum, flush=True)
    finally:
        rt.destroy()
        mgr.destroy()


def test_hostile_modules_are_refused_on_every_path_before_a_driver_sees_them():
    """Before: every case but the workgroup one reached vkCreateShaderModule or
    vkCreateComputePipelines (validation errors VUID-VkShaderModuleCreateInfo-pCode-01091 /
    -04147, VUID-RuntimeSpirv-LocalSizeId-06434, -x-06429, -Workgroup-06530,
    VUID-VkComputePipelineCreateInfo-layout-00703), and the non-UTF-8 entry point died
    of SIGSEGV in vkCreateComputePipelines."""
    script = f"import sys; sys.path.insert(0, {HERE!r}); import test_hostile_spirv as t; t.body({list(CASES)!r})"
    p = run_script(script, "hostile SPIR-V", 280, HERE)
    out = p.stdout
    assert "VALIDATION" not in out, out[-4000:]
    for how in PATHS:
        assert f"RESULT control {how} accepted" in out, out[-4000:]
    for name, (_, _, error, words) in CASES.items():
        for how in PATHS:
            line = next((ln for ln in out.splitlines() if ln.startswith(f"RESULT {name} {how} ")), None)
            assert line is not None, f"{name} {how}: no result\n{out[-3000:]}\n{p.stderr[-3000:]}"
            assert f" refused {error} " in line, line
            assert all(w in line for w in words), (words, line)
    printed_in_order(p, ["STILL WORKS 7"], "hostile SPIR-V")


def test_a_64_bit_array_length_is_read_whole():
    """An array length held in a 64-bit constant (2**32 + 1) was read as its low word (1), so
    a push-constant block of 16 GiB passed the ABI's 48-byte check."""
    code = assemble(caps="OpCapability Int64", decor=_PUSH[0],
                    types="%u64 = OpTypeInt 64 0\n%n = OpConstant %u64 4294967297\n" + _PUSH[1], body=_PUSH[2])
    assert reflect(code).push_constant_bytes == 4 * (2 ** 32 + 1)
    with pytest.raises(KernelValidationError, match="push constants take 17179869188 bytes"):
        check_kernel_abi(reflect(code), "main", 1, 48)


def test_a_matrix_is_sized_by_its_stride():
    """A mat4x3 push constant (4 columns of vec3, MatrixStride 16) reaches byte 60: sized as
    packed columns (48) it passed the ABI's 48 bytes."""
    code = assemble(decor="OpDecorate %P Block\nOpMemberDecorate %P 0 Offset 0\nOpMemberDecorate %P 0 ColMajor\n"
                          "OpMemberDecorate %P 0 MatrixStride 16",
                    types="%float = OpTypeFloat 32\n%v3 = OpTypeVector %float 3\n%m43 = OpTypeMatrix %v3 4\n"
                          "%P = OpTypeStruct %m43\n%pp = OpTypePointer PushConstant %P\n%pc = OpVariable %pp PushConstant")
    assert reflect(code).push_constant_bytes >= 60
    with pytest.raises(KernelValidationError, match="push constants"):
        check_kernel_abi(reflect(code), "main", 1, 48)


@pytest.mark.parametrize("raw, words", [
    (b"", "empty"), (b"\x03\x02\x23", "3 bytes"), (b"\x03\x02\x23\x07" * 4 + b"\x00", "17 bytes"),
    (b"\x01\x02\x03\x04" * 5, "not the SPIR-V magic"), (b"\x07\x23\x02\x03" + b"\0" * 16, "big-endian")])
def test_short_or_foreign_bytes_are_refused_by_every_entrance(raw, words):
    with pytest.raises(ValueError):
        KernelSpec("k", raw)
    for call in (lambda: reflect(raw), lambda: validate_code(KernelCodeSource.from_spirv(raw)),
                 lambda: validate_kernel_spirv(raw, "main", 1, 48, "vulkan1.1")):
        with pytest.raises(KernelValidationError, match=words):
            call()


def test_a_module_over_the_bound_is_refused_before_it_is_parsed(tmp_path):
    """A 100 MB module: KernelSpec took it, and the gate (launch, reload) and validate_code
    unpacked all of it into Python ints (about 1 GB, 20 s) before the size check."""
    good = module("control")
    big = good + struct.pack("<I", 0x00010000) * ((100 << 20) // 4)   # OpNop padding
    with pytest.raises(ValueError, match=f"at most {MAX_MODULE_BYTES}"):
        KernelSpec("big", big)
    path = tmp_path / "big.spv"
    path.write_bytes(big)
    with pytest.raises(ValueError, match=f"at most {MAX_MODULE_BYTES}"):
        KernelSpec.from_file("big", path)
    with pytest.raises(ValueError, match=f"at most {MAX_MODULE_BYTES}"):
        KernelCodeSource.from_spirv_file(path)
    tracemalloc.start()
    try:
        for call in (lambda: reflect(big), lambda: validate_code(KernelCodeSource.from_spirv(big)),
                     lambda: validate_kernel_spirv(big, "main", 1, 48, "vulkan1.3")):
            with pytest.raises(KernelValidationError, match=f"{len(big)} bytes.*{MAX_MODULE_BYTES}"):
                call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < (16 << 20), f"{peak} bytes allocated to refuse it"


@pytest.mark.parametrize("entry, words", [("\udcff", "UTF-8"), ("ma\0in", "NUL"), ("", "non-empty")])
def test_an_entry_point_a_driver_cannot_take_is_refused_by_the_spec(entry, words):
    with pytest.raises((TypeError, ValueError), match=words):
        KernelSpec("k", module("control"), entry_point=entry)


def test_a_missing_or_huge_entry_point_is_named_in_a_short_message():
    code = module("control")
    huge = "e" * (1 << 20)
    spec = KernelSpec("k", code, entry_point=huge)
    for call in (lambda: check_kernel_abi(reflect(spec.spirv), spec.entry_point, 1, 48),
                 lambda: validate_code(KernelCodeSource.from_spirv(code, huge)),
                 lambda: validate_kernel_spirv(code, huge, 1, 48, "vulkan1.1")):
        with pytest.raises(KernelValidationError, match="no entry point 'eeee") as info:
            call()
        assert len(str(info.value)) < 1000 and "'main' (GLCompute)" in str(info.value)


@pytest.mark.parametrize("cap, feature, types", [
    ("Int64", "shaderInt64", "%u64 = OpTypeInt 64 0\n%c = OpConstant %u64 5"),
    ("Float64", "shaderFloat64", "%f64 = OpTypeFloat 64\n%c = OpConstant %f64 5"),
    ("Int16", "shaderInt16", "%u16 = OpTypeInt 16 0\n%c = OpConstant %u16 5")])
def test_the_shader_arithmetic_a_gpu_offers_is_enabled_for_kernels(cap, feature, types):
    """The devices vkmulti makes enable the Int64 / Float64 / Int16 arithmetic their GPU
    offers: a module declaring it is taken there, and refused (naming the feature) on a
    device that was not made with it."""
    import dataclasses

    from vkmulti import MultiDeviceManager
    from vkmulti.device.shader_support import ShaderSupport, check_device_support

    code = assemble(caps=f"OpCapability {cap}", types=types)
    mgr = MultiDeviceManager.create()
    try:
        slot = mgr.slot(0)
        support = ShaderSupport.of_slot(slot)
        if feature not in slot.capabilities.shader_features:
            pytest.skip(f"{slot.name} does not offer {feature}")
        assert feature in slot.enabled_features
        check_device_support(reflect(code), "main", support)
        without = dataclasses.replace(support, features=support.features - {feature})
        with pytest.raises(UnsupportedError, match=feature):
            check_device_support(reflect(code), "main", without)
    finally:
        mgr.destroy()
