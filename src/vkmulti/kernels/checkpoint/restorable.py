"""Checks that a runtime kernel's checkpoint fits the layout it restores into.

A checkpoint's CRCs only say that its bytes are the ones written; whoever wrote
them may have forged them (to_bytes() recomputes every CRC). Before a restore
reads a chunk, copies a byte or launches a kernel, `check_kernel_checkpoint`
checks every vkmulti metadata field and every chunk the restore uses against
the kernel layout the metadata describes (sizes, slot multiples, bounds), and
`check_restore_groups` checks the workgroup count against the devices it may
run on. Each failure is an InvalidCheckpointError naming the field or chunk.
"""
from __future__ import annotations

import hashlib
import json
import re
import struct
from typing import Any, Sequence

import vulkan as vk

from ..._core.checks import is_int
from ...errors import InvalidCheckpointError
from ..messages import ENVELOPE_BYTES, RING_HEADER_BYTES
from .format import Checkpoint, DataChunk
from .header import MAX_CHECKPOINT_SIZE, ChunkType, chunk_name_id

__all__ = ["MAX_RESTORE_GROUPS", "check_kernel_checkpoint", "check_restore_groups", "device_group_limits",
           "check_restore_target"]

#: The most workgroups (x * y * z) a restored kernel's step may dispatch: a forged
#: count past it would make every step of the restored kernel run (nearly) forever.
MAX_RESTORE_GROUPS = 1 << 24
#: maxComputeWorkGroupCount every Vulkan device has (each axis), when the device's own is unknown.
_SPEC_GROUP_COUNT = (65535, 65535, 65535)

_PREFIX = "vkm."
_SPIRV_CHUNK = chunk_name_id("vkm.spirv")
_INBOX_CHUNK = chunk_name_id("vkm.inbox")
_CONTROL_HEADER_BYTES = 64
_MAX_STATE_BUFFERS = 16
_MAX_CAPACITY = 1 << 16
_MAX_PAYLOAD = 1 << 20
_MAX_JSON = 1 << 16
_MAX_JSON_DEPTH = 4
_MAX_NUMBER_CHARS = 24
_DECIMAL = re.compile(r"-?[0-9]+")
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


def _bad(kernel_id: str, what: str) -> InvalidCheckpointError:
    return InvalidCheckpointError(f"checkpoint of {kernel_id[:80]!r}: {what}")


def _field(cp: Checkpoint, key: str, required: bool = True) -> str | None:
    v = cp.metadata.custom.get(_PREFIX + key)
    if v is None and required:
        raise _bad(cp.metadata.kernel_id, f"no {_PREFIX + key!r} metadata: it is not a checkpoint of a vkmulti "
                                          f"runtime kernel")
    return v


def _json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON text (strings skipped)."""
    depth = top = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            top = max(top, depth)
        elif ch in "]}":
            depth -= 1
    return top


def _json(cp: Checkpoint, key: str) -> Any:
    text = _field(cp, key)
    assert text is not None
    if len(text) > _MAX_JSON or _json_depth(text) > _MAX_JSON_DEPTH:
        raise _bad(cp.metadata.kernel_id, f"{_PREFIX + key!r} is not the flat JSON a runtime kernel's checkpoint "
                                          f"holds ({len(text)} characters, nested {_json_depth(text)} deep)")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _bad(cp.metadata.kernel_id, f"{_PREFIX + key!r} is not JSON: {exc}") from None


def _int(cp: Checkpoint, label: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, str):
        text = value.strip()
        if len(text) > _MAX_NUMBER_CHARS or not _DECIMAL.fullmatch(text):   # ASCII digits only ("¹".isdigit())
            raise _bad(cp.metadata.kernel_id, f"{label} must be a decimal int, got {value[:40]!r}")
        value = int(text)
    if not is_int(value) or not low <= value <= high:
        raise _bad(cp.metadata.kernel_id, f"{label} must be an int in [{low}, {high}], got {str(value)[:40]}")
    return value


def _ints(cp: Checkpoint, label: str, value: Any, n_low: int, n_high: int, low: int, high: int) -> list[int]:
    if not isinstance(value, list) or not n_low <= len(value) <= n_high:
        raise _bad(cp.metadata.kernel_id, f"{label} must be a list of {n_low} to {n_high} ints, got "
                                          f"{str(value)[:80]}")
    return [_int(cp, f"{label}[{i}]", v, low, high) for i, v in enumerate(value)]


def _one(cp: Checkpoint, what: str, found: list[DataChunk], required: bool = True) -> DataChunk | None:
    if len(found) > 1:
        raise _bad(cp.metadata.kernel_id, f"{len(found)} {what} chunks: a restore takes exactly one")
    if not found:
        if required:
            raise _bad(cp.metadata.kernel_id, f"no {what} chunk")
        return None
    return found[0]


def _chunks(cp: Checkpoint, kind: ChunkType, chunk_id: int | None = None) -> list[DataChunk]:
    return [c for c in cp.chunks if c.chunk_type() is kind and (chunk_id is None or c.header.chunk_id == chunk_id)]


def _slots(cp: Checkpoint, what: str, chunk: DataChunk | None, slot: int) -> None:
    if chunk is not None and len(chunk.data) % slot:
        raise _bad(cp.metadata.kernel_id, f"the {what} chunk is {len(chunk.data)} bytes: not whole {slot}-byte "
                                          f"message slots")


def check_kernel_checkpoint(cp: Checkpoint) -> None:
    """InvalidCheckpointError unless `cp` is a runtime kernel's checkpoint whose metadata
    is well-formed and whose every restored chunk fits the layout that metadata
    describes: one control block (a 64-byte header and 16-byte table entries), one
    inbox ring of exactly the size its capacity and payload size make, one state
    chunk per state buffer of exactly its size, host queues of whole message slots,
    one SPIR-V module of whole words (matching its recorded SHA-256), and at most
    MAX_RESTORE_GROUPS workgroups."""
    if not isinstance(cp, Checkpoint):
        raise TypeError(f"expected a Checkpoint, got {type(cp).__name__}")
    kid = cp.metadata.kernel_id
    shape = _json(cp, "spec")
    if not isinstance(shape, dict):
        raise _bad(kid, f"{_PREFIX}spec must be a JSON object, got {type(shape).__name__}")
    for key in ("state_sizes", "inbox_capacity", "outbox_capacity", "groups", "entry_point"):
        if key not in shape:
            raise _bad(kid, f"{_PREFIX}spec has no {key!r}")
    state_sizes = _ints(cp, "state_sizes", shape["state_sizes"], 1, _MAX_STATE_BUFFERS, 4, MAX_CHECKPOINT_SIZE)
    for i, size in enumerate(state_sizes):
        if size % 4:
            raise _bad(kid, f"state_sizes[{i}] = {size} is not whole 32-bit words")
    inbox_capacity = _int(cp, "inbox_capacity", shape["inbox_capacity"], 1, _MAX_CAPACITY)
    _int(cp, "outbox_capacity", shape["outbox_capacity"], 1, _MAX_CAPACITY)
    groups = _ints(cp, "groups", shape["groups"], 3, 3, 1, _U32)
    entry = shape["entry_point"]
    if not isinstance(entry, str) or not entry or len(entry) > 256:
        raise _bad(kid, f"entry_point must be a non-empty str of at most 256 characters, got {str(entry)[:40]!r}")
    _ints(cp, f"{_PREFIX}params", _json(cp, "params"), 0, 4, 0, _U32)
    _int(cp, f"{_PREFIX}address", _field(cp, "address"), 0, _U32)
    _int(cp, f"{_PREFIX}tenant", _field(cp, "tenant"), 0, _U32)
    payload = _int(cp, f"{_PREFIX}payload_size", _field(cp, "payload_size"), 0, _MAX_PAYLOAD)
    _int(cp, f"{_PREFIX}host_seq", _field(cp, "host_seq"), 0, _U64)
    device = _field(cp, "device", required=False)
    if device is not None:
        _int(cp, f"{_PREFIX}device", device, -1, _U32)
    total = groups[0] * groups[1] * groups[2]
    if total > MAX_RESTORE_GROUPS:
        raise _bad(kid, f"groups {tuple(groups)} make {total} workgroups per step; a restore dispatches at most "
                        f"{MAX_RESTORE_GROUPS}")
    slot = ENVELOPE_BYTES + payload
    if payload % 4:
        raise _bad(kid, f"payload_size {payload} is not whole 32-bit words")

    control = _one(cp, "control block", _chunks(cp, ChunkType.CONTROL_BLOCK))
    assert control is not None
    n = len(control.data)
    if n < _CONTROL_HEADER_BYTES or (n - _CONTROL_HEADER_BYTES) % 16:
        raise _bad(kid, f"the control block is {n} bytes: a kernel's is a {_CONTROL_HEADER_BYTES}-byte header "
                        f"and 16-byte sequence-table entries")
    inbox = _one(cp, "inbox", _chunks(cp, ChunkType.CUSTOM, _INBOX_CHUNK))
    assert inbox is not None
    want = RING_HEADER_BYTES + inbox_capacity * slot
    if len(inbox.data) != want:
        raise _bad(kid, f"the inbox chunk is {len(inbox.data)} bytes; an inbox of {inbox_capacity} slots of "
                        f"{slot} bytes is {want}")
    for i, size in enumerate(state_sizes):
        state = _one(cp, f"state{i}", _chunks(cp, ChunkType.DEVICE_MEMORY, chunk_name_id(f"state{i}")))
        assert state is not None
        if len(state.data) != size:
            raise _bad(kid, f"state{i} holds {len(state.data)} bytes, the spec says {size}")
    _slots(cp, "H2K queue", _one(cp, "H2K queue", _chunks(cp, ChunkType.H2K_QUEUE), required=False), slot)
    _slots(cp, "K2H queue", _one(cp, "K2H queue", _chunks(cp, ChunkType.K2H_QUEUE), required=False), slot)
    spirv = _one(cp, "SPIR-V", _chunks(cp, ChunkType.CUSTOM, _SPIRV_CHUNK))
    assert spirv is not None
    code = spirv.data
    if len(code) < 20 or len(code) % 4 or struct.unpack_from("<I", code)[0] != 0x07230203:
        raise _bad(kid, f"the SPIR-V chunk ({len(code)} bytes) is not a SPIR-V module (the magic and whole words)")
    sha = _field(cp, "spirv_sha256", required=False)
    if sha is not None and hashlib.sha256(code).hexdigest() != sha:
        raise _bad(kid, "its SPIR-V does not match the recorded SHA-256")


def check_restore_groups(cp_groups: Sequence[int], kernel_id: str, limits: Sequence[Sequence[int]]) -> None:
    """InvalidCheckpointError when a checkpoint's workgroup count exceeds, on any axis, the
    maxComputeWorkGroupCount of a device it may be restored onto (`limits`: one
    (x, y, z) per such device), or MAX_RESTORE_GROUPS in all."""
    groups = tuple(int(g) for g in cp_groups)
    total = groups[0] * groups[1] * groups[2]
    if total > MAX_RESTORE_GROUPS:
        raise _bad(kernel_id, f"groups {groups} make {total} workgroups per step; a restore dispatches at most "
                              f"{MAX_RESTORE_GROUPS}")
    for top in limits:
        for axis in range(3):
            if groups[axis] > int(top[axis]):
                raise _bad(kernel_id, f"groups[{axis}] = {groups[axis]} exceeds the device's "
                                      f"maxComputeWorkGroupCount[{axis}] = {int(top[axis])}")


def device_group_limits(manager: Any, device: int | None) -> list[tuple[int, int, int]]:
    """maxComputeWorkGroupCount of `device` of a manager, or of every device when None
    (a restore's placement is chosen later); the Vulkan minimum where a device does
    not say."""
    indices = range(manager.device_count) if device is None else [device]
    out = []
    for i in indices:
        try:
            props = vk.vkGetPhysicalDeviceProperties(manager.slot(i).physical_device)   # (kept: owns `limits`)
            out.append(tuple(int(props.limits.maxComputeWorkGroupCount[a]) for a in range(3)))
        except Exception:   # noqa: BLE001 - an index out of range or a slot without a device: the spec's floor
            out.append(_SPEC_GROUP_COUNT)
    return out   # type: ignore[return-value]


def check_restore_target(rt: Any, groups: Sequence[int], kernel_id: str, device: int | None) -> None:
    """check_restore_groups against the devices of runtime `rt` a restore may use
    (`device`, or all when None)."""
    check_restore_groups(groups, kernel_id, device_group_limits(rt.manager, device))
