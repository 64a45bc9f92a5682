"""SPIR-V modules as data: header checks, reflection of what a kernel declares
(entry points, local size, descriptor bindings, push-constant size, shared
memory, capabilities and extensions) and validation against the compute-kernel
ABI (spirv_gate.py adds spirv-val, which every kernel module passes before a
driver sees it; device/shader_support.py checks what it declares against the device).

Hot reload uses it to refuse code before it reaches a driver: a module whose
bindings are not the kernel ABI's (set 0: inbox 0, outbox 1, state 2..)
would read the wrong buffers, and a driver may not notice.

The module is untrusted: its size is bounded before any of it is read, every
count and id is checked before use, and a size the module computes (a
specialization constant's default, an OpSpecConstantOp of integer arithmetic,
a 64-bit constant) is evaluated whole; a size that cannot be known is refused
where a limit depends on it, never let through.
"""
from __future__ import annotations

import array
import functools
import os
import shutil
import sys
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ...errors import KernelValidationError
from ..._core.checks import short_repr, short_str
from ..._core.tools import run_tool

__all__ = ["SPIRV_MAGIC", "SpirvModule", "SpirvBinding", "reflect", "check_kernel_abi", "check_workgroup_size",
           "check_entry_point", "run_spirv_val", "spirv_env_for_api", "MAX_MODULE_BYTES"]

SPIRV_MAGIC = 0x07230203
#: The newest SPIR-V version (1.6) a module may claim.
MAX_SPIRV_VERSION = (1, 6)
#: The largest module taken (bytes): checked before any of it is read.
MAX_MODULE_BYTES = 64 << 20

_OP_EXTENSION = 10
_OP_ENTRY_POINT = 15
_OP_EXECUTION_MODE = 16
_OP_CAPABILITY = 17
_OP_TYPE_BOOL = 20
_OP_TYPE_INT = 21
_OP_TYPE_FLOAT = 22
_OP_TYPE_VECTOR = 23
_OP_TYPE_MATRIX = 24
_OP_TYPE_ARRAY = 28
_OP_TYPE_RUNTIME_ARRAY = 29
_OP_TYPE_STRUCT = 30
_OP_TYPE_POINTER = 32
_OP_CONSTANT = 43
_OP_CONSTANT_COMPOSITE = 44
_OP_SPEC_CONSTANT = 50
_OP_SPEC_CONSTANT_COMPOSITE = 51
_OP_SPEC_CONSTANT_OP = 52
_OP_VARIABLE = 59
_OP_DECORATE = 71
_OP_MEMBER_DECORATE = 72
_OP_EXECUTION_MODE_ID = 331

_DEC_BLOCK = 2
_DEC_BUFFER_BLOCK = 3
_DEC_ARRAY_STRIDE = 6
_DEC_MATRIX_STRIDE = 7
_DEC_BUILTIN = 11
_BUILTIN_WORKGROUP_SIZE = 25
_DEC_BINDING = 33
_DEC_DESCRIPTOR_SET = 34
_DEC_OFFSET = 35

_MODE_LOCAL_SIZE = 17
_MODE_LOCAL_SIZE_ID = 38
_MODEL_GLCOMPUTE = 5

_SC_UNIFORM_CONSTANT = 0
_SC_UNIFORM = 2
_SC_WORKGROUP = 4
_SC_PUSH_CONSTANT = 9
_SC_STORAGE_BUFFER = 12

_EXECUTION_MODELS = {0: "Vertex", 1: "TessellationControl", 2: "TessellationEvaluation", 3: "Geometry",
                     4: "Fragment", 5: "GLCompute", 6: "Kernel"}

#: The integer instructions an OpSpecConstantOp may compute a size with (what glslc emits for
#: sizes made of specialization constants), by opcode: each takes the operand values (ints,
#: unsigned, at the result's width) and that width in bits; None where the result is undefined.
_SPEC_OPS: dict[int, Any] = {
    113: lambda a, bits: a[0],                                          # UConvert
    114: lambda a, bits: a[0],                                          # SConvert (its operand sign-extended)
    126: lambda a, bits: -a[0],                                         # SNegate
    128: lambda a, bits: a[0] + a[1],                                   # IAdd
    130: lambda a, bits: a[0] - a[1],                                   # ISub
    132: lambda a, bits: a[0] * a[1],                                   # IMul
    134: lambda a, bits: a[0] // a[1] if a[1] else None,               # UDiv
    137: lambda a, bits: a[0] % a[1] if a[1] else None,                # UMod
    194: lambda a, bits: a[0] >> a[1] if a[1] < bits else None,        # ShiftRightLogical
    196: lambda a, bits: a[0] << a[1] if a[1] < bits else None,        # ShiftLeftLogical
    197: lambda a, bits: a[0] | a[1],                                   # BitwiseOr
    198: lambda a, bits: a[0] ^ a[1],                                   # BitwiseXor
    199: lambda a, bits: a[0] & a[1],                                   # BitwiseAnd
    200: lambda a, bits: ~a[0],                                         # Not
}
_COMPOSITE_EXTRACT = 81
_SCONVERT = 114
#: How deep an OpSpecConstantOp may build on others before its value counts as unknown.
_MAX_SPEC_DEPTH = 32


@dataclass(frozen=True)
class SpirvBinding:
    """A descriptor the module declares: (set, binding), what kind, the variable's name id."""
    set: int
    binding: int
    kind: str          # "storage_buffer", "uniform_buffer", "other"
    variable: int


@dataclass
class SpirvModule:
    """What `reflect` found in a module."""
    version: tuple[int, int]
    bound: int
    generator: int
    entry_points: dict[str, str] = field(default_factory=dict)          # name -> execution model
    local_size: dict[str, tuple[int, int, int]] = field(default_factory=dict)   # (entry points of a known size)
    bindings: list[SpirvBinding] = field(default_factory=list)
    push_constant_bytes: int | None = 0   # None: a type it could not size
    workgroup_bytes: int | None = 0   # its Workgroup (shared) variables, packed without padding: a lower
    #                                   bound (None: one of a size it could not know)
    capabilities: frozenset[int] = frozenset()   # OpCapability operands
    extensions: frozenset[str] = frozenset()     # OpExtension names
    local_size_id: frozenset[str] = frozenset()  # entry points whose size is given by LocalSizeId

    def binding(self, set_: int, binding: int) -> SpirvBinding | None:
        return next((b for b in self.bindings if b.set == set_ and b.binding == binding), None)


def _words(code: Any, label: str) -> array.array:
    """The module's 32-bit words (a copy, little-endian read), its size checked before it is read."""
    try:
        raw = memoryview(code).cast("B")
    except TypeError:
        raise TypeError(f"{label} must be bytes, got {type(code).__name__}") from None
    n = len(raw)
    if n > MAX_MODULE_BYTES:
        raise KernelValidationError(f"{label} is {n} bytes; the largest module taken is {MAX_MODULE_BYTES} bytes")
    if n == 0:
        raise KernelValidationError(f"{label} is empty")
    if n % 4:
        raise KernelValidationError(f"{label} is {n} bytes, not a whole number of 32-bit words: not SPIR-V")
    if n < 20:
        raise KernelValidationError(f"{label} is {n} bytes; a SPIR-V module has a 5-word (20-byte) header")
    words = array.array("I" if array.array("I").itemsize == 4 else "L")
    words.frombytes(raw)
    if sys.byteorder == "big":
        words.byteswap()
    if words[0] != SPIRV_MAGIC:
        if words[0] == 0x03022307:
            raise KernelValidationError(f"{label} is big-endian SPIR-V; Vulkan takes little-endian words")
        raise KernelValidationError(f"{label} starts with 0x{words[0]:08x}, not the SPIR-V magic 0x{SPIRV_MAGIC:08x}")
    return words


def _string(words: array.array, start: int, end: int, label: str) -> tuple[str, int]:
    """A nul-terminated UTF-8 literal string from words[start:end]; returns it and the word
    after it. KernelValidationError for one that does not end there or is not UTF-8: a driver
    takes the name's bytes, so a name read any other way could be one it does not have."""
    raw = words[start:end].tobytes() if sys.byteorder == "little" else b"".join(
        w.to_bytes(4, "little") for w in words[start:end])
    cut = raw.find(b"\0")
    if cut < 0:
        raise KernelValidationError(f"{label}: a literal string is not nul-terminated within its instruction")
    try:
        text = raw[:cut].decode("utf-8")
    except UnicodeDecodeError:
        raise KernelValidationError(f"{label}: the literal string {short_repr(raw[:cut])} is not UTF-8") from None
    return text, start + cut // 4 + 1


def _signed(value: int, bits: int) -> int:
    """`value` (unsigned, `bits` wide) read as two's complement."""
    return value - (1 << bits) if value >> (bits - 1) & 1 else value


def _value_of(words: Any) -> int:
    """A literal number of one or more words (low-order word first), whole."""
    return sum(int(w) << (32 * i) for i, w in enumerate(words))


#: Modules whose reflection is kept (by their bytes): a hot reload checks one module several
#: times, and each parse is Python work that would hold the interpreter while kernels step.
_KEPT = 64
#: ... and at most this many bytes of them (a few large modules must not pin gigabytes).
_KEPT_BYTES = 128 << 20
_kept: OrderedDict[bytes, SpirvModule] = OrderedDict()
_kept_lock = threading.Lock()


def reflect(code: Any, label: str = "SPIR-V") -> SpirvModule:
    """Parse the header and instruction stream of a module and reflect what a
    kernel declares. KernelValidationError for anything malformed. The result
    is shared between callers of the same bytes: read it, never change it."""
    if type(code) is not bytes:
        return _reflect(code, label)
    with _kept_lock:
        mod = _kept.get(code)
        if mod is not None:
            _kept.move_to_end(code)
            return mod
    mod = _reflect(code, label)
    with _kept_lock:
        _kept[code] = mod
        total = sum(map(len, _kept))
        while len(_kept) > _KEPT or (total > _KEPT_BYTES and len(_kept) > 1):
            total -= len(_kept.popitem(last=False)[0])
    return mod


def _reflect(code: Any, label: str) -> SpirvModule:
    words = _words(code, label)
    version_word, generator, bound, schema = words[1], words[2], words[3], words[4]
    major, minor = (version_word >> 16) & 0xFF, (version_word >> 8) & 0xFF
    if version_word & 0xFF0000FF or major != 1 or (major, minor) > MAX_SPIRV_VERSION:
        raise KernelValidationError(f"{label} claims SPIR-V version word 0x{version_word:08x} ({major}.{minor}); "
                                    f"versions 1.0 to {MAX_SPIRV_VERSION[0]}.{MAX_SPIRV_VERSION[1]} are known")
    if bound == 0 or bound > 0x3FFFFF:
        raise KernelValidationError(f"{label} has an id bound of {bound}")
    if schema != 0:
        raise KernelValidationError(f"{label} has schema word {schema}, which must be 0")
    mod = SpirvModule((major, minor), bound, generator)
    capabilities: set[int] = set()
    extensions: set[str] = set()
    entry_ids: dict[int, str] = {}
    modes: dict[int, tuple[int, int, int]] = {}
    mode_ids: dict[int, tuple[int, int, int]] = {}
    decorations: dict[int, dict[int, int]] = {}
    member_offsets: dict[int, dict[int, int]] = {}
    matrix_strides: dict[int, dict[int, int]] = {}   # struct -> member -> MatrixStride
    types: dict[int, tuple] = {}
    constants: dict[int, int] = {}               # (spec) constant -> its value (the pipelines specialize
    #                                              none: a spec constant is its default)
    spec_ops: dict[int, tuple[int, int, tuple[int, ...]]] = {}   # id -> (result type, opcode, operands)
    value_types: dict[int, int] = {}             # (spec) constant -> its type
    composites: dict[int, tuple[int, ...]] = {}   # (spec) constant composite -> its constituents
    pointers: dict[int, tuple[int, int]] = {}
    variables: list[tuple[int, int, int]] = []   # (pointer type, id, storage class)
    i, n = 5, len(words)
    while i < n:
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > n:
            raise KernelValidationError(f"{label}: instruction at word {i} (opcode {op}) claims {count} words; "
                                        f"{n - i} remain (truncated or corrupted)")
        ops = words[i + 1:i + count]
        if op == _OP_CAPABILITY and len(ops) >= 1:
            capabilities.add(ops[0])
        elif op == _OP_EXTENSION and len(ops) >= 1:
            extensions.add(_string(words, i + 1, i + count, label)[0])
        elif op == _OP_ENTRY_POINT and len(ops) >= 3:
            name, _ = _string(words, i + 3, i + count, label)
            mod.entry_points[name] = _EXECUTION_MODELS.get(ops[0], str(ops[0]))
            entry_ids[ops[1]] = name
        elif op == _OP_EXECUTION_MODE and len(ops) >= 5 and ops[1] == _MODE_LOCAL_SIZE:
            modes[ops[0]] = (ops[2], ops[3], ops[4])
        elif op == _OP_EXECUTION_MODE_ID and len(ops) >= 5 and ops[1] == _MODE_LOCAL_SIZE_ID:
            mode_ids[ops[0]] = (ops[2], ops[3], ops[4])
        elif op == _OP_DECORATE and len(ops) >= 2:
            decorations.setdefault(ops[0], {})[ops[1]] = ops[2] if len(ops) > 2 else 1
        elif op == _OP_MEMBER_DECORATE and len(ops) >= 4 and ops[2] == _DEC_OFFSET:
            member_offsets.setdefault(ops[0], {})[ops[1]] = ops[3]
        elif op == _OP_MEMBER_DECORATE and len(ops) >= 4 and ops[2] == _DEC_MATRIX_STRIDE:
            matrix_strides.setdefault(ops[0], {})[ops[1]] = ops[3]
        elif op == _OP_TYPE_BOOL and len(ops) >= 1:
            types[ops[0]] = ("bool",)
        elif op in (_OP_TYPE_INT, _OP_TYPE_FLOAT) and len(ops) >= 2:
            types[ops[0]] = ("scalar", ops[1] // 8)
        elif op == _OP_TYPE_VECTOR and len(ops) >= 3:
            types[ops[0]] = ("vector", ops[1], ops[2])
        elif op == _OP_TYPE_MATRIX and len(ops) >= 3:
            types[ops[0]] = ("matrix", ops[1], ops[2])
        elif op == _OP_TYPE_ARRAY and len(ops) >= 3:
            types[ops[0]] = ("array", ops[1], ops[2])
        elif op == _OP_TYPE_RUNTIME_ARRAY and len(ops) >= 2:
            types[ops[0]] = ("runtime_array", ops[1])
        elif op == _OP_TYPE_STRUCT and len(ops) >= 1:
            types[ops[0]] = ("struct", tuple(ops[1:]))
        elif op == _OP_TYPE_POINTER and len(ops) >= 3:
            pointers[ops[0]] = (ops[1], ops[2])
        elif op in (_OP_CONSTANT, _OP_SPEC_CONSTANT) and len(ops) >= 3:
            constants[ops[1]] = _value_of(ops[2:])
            value_types[ops[1]] = ops[0]
        elif op == _OP_SPEC_CONSTANT_OP and len(ops) >= 3:
            spec_ops[ops[1]] = (ops[0], ops[2], tuple(ops[3:]))
            value_types[ops[1]] = ops[0]
        elif op in (_OP_CONSTANT_COMPOSITE, _OP_SPEC_CONSTANT_COMPOSITE) and len(ops) >= 2:
            composites[ops[1]] = tuple(ops[2:])
        elif op == _OP_VARIABLE and len(ops) >= 3:
            variables.append((ops[0], ops[1], ops[2]))
        i += count
    mod.capabilities, mod.extensions = frozenset(capabilities), frozenset(extensions)
    computed: dict[int, int | None] = {}

    def bits_of(tid: int) -> int | None:
        t = types.get(tid)
        return 8 * t[1] if t is not None and t[0] == "scalar" and 1 <= t[1] <= 8 else None

    def value(c: int, depth: int = 0) -> int | None:
        """The value of constant `c` as the pipeline sees it (None: not known)."""
        if c in constants:
            return constants[c]
        if c in computed:
            return computed[c]
        if c not in spec_ops or depth > _MAX_SPEC_DEPTH:
            return None
        rtype, opcode, operands = spec_ops[c]
        bits, out = bits_of(rtype), None
        if opcode == _COMPOSITE_EXTRACT and len(operands) == 2:
            parts = composites.get(operands[0], ())
            out = value(parts[operands[1]], depth + 1) if operands[1] < len(parts) else None
        elif opcode in _SPEC_OPS and operands and bits is not None:
            args = [value(a, depth + 1) for a in operands]
            src = bits_of(value_types.get(operands[0], 0)) if opcode == _SCONVERT else bits
            if src is not None and all(a is not None for a in args):
                if opcode == _SCONVERT:   # (the operand's sign carried to the result's width)
                    args = [_signed(args[0], src)]  # type: ignore[arg-type]
                out = _SPEC_OPS[opcode](args, bits)
        if out is not None and bits is not None:
            out &= (1 << bits) - 1
        computed[c] = out
        return out

    # a WorkgroupSize built-in (a composite of three) overrides every entry point's LocalSize / LocalSizeId
    builtin = next((composites[c] for c, d in decorations.items()
                    if d.get(_DEC_BUILTIN) == _BUILTIN_WORKGROUP_SIZE and len(composites.get(c, ())) == 3), None)
    for eid, name in entry_ids.items():
        size = builtin or mode_ids.get(eid)
        if size is not None:
            known = [value(c) for c in size]
            if all(v is not None for v in known):
                mod.local_size[name] = tuple(known)   # type: ignore[assignment]
        elif eid in modes:
            mod.local_size[name] = modes[eid]
    mod.local_size_id = frozenset(name for eid, name in entry_ids.items() if eid in mode_ids)

    @functools.lru_cache(maxsize=None)   # (each type at each depth sized once: nested structs share members)
    def size_of(tid: int, depth: int = 0, matrix_stride: int | None = None) -> int | None:
        """Bytes of a type in an explicitly laid out block (None: not known)."""
        t = types.get(tid)
        if t is None or depth > 16:
            return None
        if t[0] == "scalar":
            return t[1]
        if t[0] == "vector":
            inner = size_of(t[1], depth + 1)
            return None if inner is None else inner * t[2]
        if t[0] == "matrix":   # (column or row major: MatrixStride times the larger of the two counts)
            column = types.get(t[1])
            scalar = size_of(column[1], depth + 2) if column is not None and column[0] == "vector" else None
            if scalar is None:
                return None
            return (matrix_stride or 4 * scalar) * max(t[2], column[2])  # type: ignore[index]
        if t[0] == "array":
            stride = decorations.get(tid, {}).get(_DEC_ARRAY_STRIDE)
            length = value(t[2])
            if stride is None or length is None:
                return None
            return stride * length
        if t[0] == "struct":
            offsets = member_offsets.get(tid, {})
            strides = matrix_strides.get(tid, {})
            end = 0
            for m, member in enumerate(t[1]):
                s = size_of(member, depth + 1, strides.get(m))
                if s is None or m not in offsets:
                    return None
                end = max(end, offsets[m] + s)
            return end
        return None

    packed: dict[int, int | None] = {}

    def packed_size(tid: int, depth: int = 0) -> int | None:
        """A type's bytes packed without padding (None where not known); each type sized once."""
        if tid not in packed:
            t = types.get(tid)
            n: int | None = None
            if t is not None and depth <= 16:
                if t[0] == "bool":
                    n = 1
                elif t[0] == "scalar":
                    n = t[1]
                elif t[0] in ("vector", "matrix"):
                    inner = packed_size(t[1], depth + 1)
                    n = None if inner is None else inner * t[2]
                elif t[0] == "array":
                    inner, length = packed_size(t[1], depth + 1), value(t[2])
                    n = None if inner is None or length is None else inner * length
                elif t[0] == "struct":
                    sizes = [packed_size(m, depth + 1) for m in t[1]]
                    n = None if None in sizes else sum(sizes)  # type: ignore[arg-type]
            packed[tid] = n
        return packed[tid]

    for ptype, vid, storage in variables:
        pointee = pointers.get(ptype, (storage, 0))[1]
        dec = decorations.get(vid, {})
        if storage == _SC_WORKGROUP:
            nbytes = packed_size(pointee)
            mod.workgroup_bytes = None if nbytes is None or mod.workgroup_bytes is None else \
                mod.workgroup_bytes + nbytes
            continue
        if storage == _SC_PUSH_CONSTANT:
            nbytes = size_of(pointee)
            mod.push_constant_bytes = None if nbytes is None or mod.push_constant_bytes is None else \
                max(mod.push_constant_bytes, nbytes)
            continue
        if _DEC_BINDING not in dec and _DEC_DESCRIPTOR_SET not in dec:
            continue
        struct_dec = decorations.get(pointee, {})
        if storage == _SC_STORAGE_BUFFER or (storage == _SC_UNIFORM and _DEC_BUFFER_BLOCK in struct_dec):
            kind = "storage_buffer"
        elif storage == _SC_UNIFORM and _DEC_BLOCK in struct_dec:
            kind = "uniform_buffer"
        else:
            kind = "other"
        mod.bindings.append(SpirvBinding(dec.get(_DEC_DESCRIPTOR_SET, 0), dec.get(_DEC_BINDING, 0), kind, vid))
    mod.bindings.sort(key=lambda b: (b.set, b.binding))
    return mod


def check_entry_point(mod: SpirvModule, entry_point: str, label: str = "SPIR-V") -> str:
    """The execution model of `entry_point`; KernelValidationError naming it (shortened) and
    the entry points the module has when it has none of that name."""
    model = mod.entry_points.get(entry_point)
    if model is None:
        have = list(mod.entry_points.items())
        listed = ", ".join(f"{short_repr(n)} ({m})" for n, m in have[:8]) or "none"
        more = f" and {len(have) - 8} more" if len(have) > 8 else ""
        raise KernelValidationError(f"{label} has no entry point {short_repr(entry_point)} (it has: {listed}{more})")
    return model


def check_kernel_abi(mod: SpirvModule, entry_point: str, n_state: int, push_bytes: int,
                     label: str = "SPIR-V") -> None:
    """KernelValidationError unless the module is a compute kernel of the ABI with
    `n_state` state buffers: a GLCompute entry point `entry_point`; every
    descriptor it declares is one the ABI's layout provides (set 0: inbox 0,
    outbox 1, state buffers 2 .. 2 + n_state - 1), as a storage buffer; a
    push-constant block of at most `push_bytes`, of a size known before the pipeline
    is made. A binding the module does not use may be absent (glslc -O drops unused
    ones), never one the layout lacks: the pipeline could not be made, or would read
    the wrong buffer."""
    model = check_entry_point(mod, entry_point, label)
    if model != "GLCompute":
        raise KernelValidationError(f"{label}'s entry point {short_repr(entry_point)} is a {model} shader, not a "
                                    f"compute (GLCompute) kernel")
    names = {0: "inbox", 1: "outbox"}
    for b in mod.bindings:
        if b.set != 0:
            raise KernelValidationError(f"{label} uses descriptor set {b.set} (binding {b.binding}); kernels have "
                                        f"only set 0")
        if b.binding >= 2 + n_state:
            raise KernelValidationError(f"{label} uses binding {b.binding}; this kernel has {n_state} state "
                                        f"buffer(s), bound at 2..{1 + n_state}")
        if b.kind != "storage_buffer":
            what = names.get(b.binding, f"state buffer {b.binding - 2}")
            raise KernelValidationError(f"{label} declares binding {b.binding} ({what}) as a {b.kind}; the ABI binds "
                                        f"a storage buffer there")
    if mod.push_constant_bytes is None:
        raise KernelValidationError(f"{label}'s push constants are of a size that cannot be known before the "
                                    f"pipeline is made (an array or type vkmulti cannot size); the kernel ABI "
                                    f"(VkmStep) has {push_bytes} bytes")
    if mod.push_constant_bytes > push_bytes:
        raise KernelValidationError(f"{label}'s push constants take {mod.push_constant_bytes} bytes; the kernel ABI "
                                    f"(VkmStep) has {push_bytes}")


def check_workgroup_size(mod: SpirvModule, entry_point: str, max_size: tuple[int, int, int], max_invocations: int,
                         max_shared: int, label: str = "SPIR-V") -> None:
    """KernelValidationError when the workgroup of `entry_point` exceeds a device's
    maxComputeWorkGroupSize (per axis) or maxComputeWorkGroupInvocations (in all), or the
    module's shared variables its maxComputeSharedMemorySize: a pipeline made of it is
    invalid usage of the driver. A size that cannot be known before the pipeline is made
    (an instruction vkmulti does not evaluate computes it) is refused too."""
    if mod.workgroup_bytes is None:
        raise KernelValidationError(f"{label}'s shared (Workgroup) variables are of a size that cannot be known "
                                    f"before the pipeline is made; this device has {max_shared} bytes "
                                    f"(maxComputeSharedMemorySize)")
    if mod.workgroup_bytes > max_shared:
        raise KernelValidationError(f"{label}'s shared (Workgroup) variables take at least {mod.workgroup_bytes} "
                                    f"bytes; this device has {max_shared} (maxComputeSharedMemorySize)")
    check_entry_point(mod, entry_point, label)
    size = mod.local_size.get(entry_point)
    if size is None:
        raise KernelValidationError(f"{label}'s workgroup size (entry point {short_repr(entry_point)}) cannot be "
                                    f"known before the pipeline is made; this device takes at most "
                                    f"{tuple(max_size)} per axis (maxComputeWorkGroupSize) and {max_invocations} "
                                    f"invocations in all (maxComputeWorkGroupInvocations)")
    if any(n > top for n, top in zip(size, max_size)) or size[0] * size[1] * size[2] > max_invocations:
        raise KernelValidationError(f"{label}'s workgroup {tuple(size)} exceeds this device's limits: at most "
                                    f"{tuple(max_size)} per axis (maxComputeWorkGroupSize) and {max_invocations} "
                                    f"invocations in all (maxComputeWorkGroupInvocations)")


def spirv_env_for_api(api_version: int) -> str:
    """spirv-val's --target-env for a Vulkan API version (VK_MAKE_API_VERSION)."""
    minor = (api_version >> 12) & 0x3FF
    return f"vulkan1.{min(max(minor, 0), 3)}"


def run_spirv_val(code: bytes, target_env: str = "vulkan1.1", timeout: float | None = 30.0,
                  label: str = "SPIR-V") -> bool:
    """Run `spirv-val` on the module when it is on PATH: False if it is not,
    True if it passed; KernelValidationError with its message if it failed,
    vkmulti.TimeoutError past `timeout` s."""
    exe = shutil.which("spirv-val")
    if exe is None:
        return False
    fd, path = tempfile.mkstemp(suffix=".spv")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(code)
        out = run_tool([exe, "--target-env", target_env, path], timeout, "spirv-val")
    finally:
        os.unlink(path)
    if out.returncode != 0:
        text = (out.stderr or out.stdout).strip().replace(path, label)
        raise KernelValidationError(f"{label} fails spirv-val ({target_env}): {text[:600]}")
    return True
