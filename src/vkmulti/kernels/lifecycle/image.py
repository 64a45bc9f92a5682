"""A runtime kernel as a Checkpoint and back: what goes in which chunk, and the
metadata that lets a checkpoint be restored in another runtime or process.

Chunks: CONTROL_BLOCK (the kernel's control buffer: address, tenant, step,
HLC, per-destination sequence table), CUSTOM `INBOX_CHUNK` (the inbox ring),
DEVICE_MEMORY "state<i>" per state buffer, H2K_QUEUE (host messages not yet on
the GPU, packed slots), K2H_QUEUE (messages for the host not yet received,
packed slots), CUSTOM `SPIRV_CHUNK` (the kernel's code).
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import vulkan as vk

from ..._core.checks import short_repr, short_str
from ...errors import InvalidCheckpointError, MigrationError
from ...memory.buffer import MappedBuffer
from ..checkpoint.format import Checkpoint, CheckpointMetadata, ChunkType, DataChunk, chunk_name_id
from ..checkpoint.restorable import check_kernel_checkpoint
from ..engine.gate import at_rest
from ..engine.spec import KernelSpec
from ..messages import ENVELOPE_BYTES, HOST_KERNEL_ID, HlcTimestamp, K2KMessage, MessageEnvelope
from ..engine.spirv import reflect
from ..engine.step_ops import BARRIER, HOST_BARRIER, copy_op

__all__ = ["SPIRV_CHUNK", "INBOX_CHUNK", "KernelImage", "to_checkpoint", "from_checkpoint", "local_size", "upload",
           "upload_many", "staged_copies", "StagedUpload",
           "image_meta", "queue_image_copy", "KernelMoved"]

SPIRV_CHUNK = chunk_name_id("vkm.spirv")
INBOX_CHUNK = chunk_name_id("vkm.inbox")
_PREFIX = "vkm."
#: control block words: address, tenant, step lo/hi, clock lo/hi, clock logical, table size
_CONTROL_HEAD = struct.Struct("<8I")
CONTROL_HEADER_BYTES = 64


@lru_cache(maxsize=64)
def _local_size(spirv_sha: str, spirv: bytes, entry: str) -> tuple[int, int, int]:
    try:
        return tuple(reflect(spirv).local_size.get(entry, (0, 0, 0)))   # type: ignore[return-value]
    except Exception:   # a module the driver took but the reflection does not understand: no tile size
        return (0, 0, 0)


def local_size(spec: KernelSpec) -> tuple[int, int, int]:
    """The workgroup size the kernel's SPIR-V declares (LocalSize), (0, 0, 0) if none."""
    return _local_size(spec.sha256, spec.spirv, spec.entry_point)


@dataclass
class KernelImage:
    """A runtime kernel's contents in host memory (what a checkpoint holds)."""
    spec: KernelSpec
    kernel_id: str
    address: int
    tenant: int
    params: tuple[int, int, int, int]
    steps: int
    host_seq: int
    payload_size: int
    control: bytes
    inbox: bytes
    states: list[bytes]
    h2k: list[bytes]                  # packed slots (envelope + payload_size bytes)
    received: list[K2KMessage]
    device: int = -1

    @property
    def clock(self) -> HlcTimestamp:
        if len(self.control) < CONTROL_HEADER_BYTES:
            return HlcTimestamp.zero()
        w = _CONTROL_HEAD.unpack_from(self.control)
        return HlcTimestamp(w[4] | w[5] << 32, w[6])


def _pack_received(messages: list[K2KMessage], address: int, payload_size: int) -> bytes:
    out = bytearray()
    for m in messages:
        env = m.envelope(address, 0)
        out += env.pack() + m.payload + bytes(payload_size - len(m.payload))
    return bytes(out)


def image_sources(k: Any) -> tuple[list[Any], list[int]]:
    """The buffers a checkpoint of kernel `k` copies (control block, inbox, states) and their sizes."""
    srcs = [k.control, k.inbox] + list(k.states)
    return srcs, [b.size for b in srcs]


def image_meta(k: Any) -> KernelImage:
    """The host-side part of a kernel's image: everything but the device bytes
    (called with its device lock held)."""
    return KernelImage(k.spec, k.id, k.address, k.tenant, tuple(k.params), k.steps, k.host_seq,
                       k.payload_size, b"", b"", [], list(k.h2k), list(k.received), k.device_index)


class StagedUpload:
    """Host bytes for several device buffers, packed into one host-visible staging
    buffer (`buffer`, taken from the device's StagingBuffers), and the copies
    out of it: `record(cmd)` through the `vulkan` package (inside a caller's
    command buffer), or `ops()`, the native recorder's packed copies. The
    caller gives `buffer` back once the submit is done, or destroys it when
    the submit's wait gave up."""

    def __init__(self, buffer: MappedBuffer, places: list[tuple[Any, int, int, int]]):
        self.buffer, self._places = buffer, places   # (device buffer, its offset, staging offset, bytes)

    def record(self, cmd: Any) -> None:
        for buf, offset, where, n in self._places:
            vk.vkCmdCopyBuffer(cmd, self.buffer.handle, buf.handle, 1, [
                vk.VkBufferCopy(srcOffset=where, dstOffset=offset, size=n)])

    def ops(self) -> list[bytes]:
        src = self.buffer.handle_int
        return [copy_op(src, buf.handle_int, where, offset, n) for buf, offset, where, n in self._places]


def staged_copies(staging: Any, items: list[tuple[Any, int, np.ndarray]]) -> StagedUpload | None:
    """The bytes of every (buffer, offset, data) item in one staging buffer taken from
    `staging` (the device's StagingBuffers), with their copies (StagedUpload):
    several buffers written by one submit instead of one staging buffer and one
    submit each. None when there are no bytes."""
    at, places, writes = 0, [], []
    for buf, offset, data in items:
        if data.nbytes:
            places.append((buf, offset, at, data.nbytes))
            writes.append((at, data))
        at += -(-data.nbytes // 16) * 16
    if not places:
        return None
    buffer = staging.take(at)
    try:
        staging.write(buffer, writes)
    except BaseException:
        buffer.destroy()
        raise
    return StagedUpload(buffer, places)


def upload_many(ctx: Any, items: list[tuple[Any, int, np.ndarray]], timeout: float | None = 60.0) -> None:
    """Write each (device buffer, offset, host bytes) of the device of `ctx` (a
    DeviceContext) in one submit through one staging buffer; returns once done."""
    staged = staged_copies(ctx.staging, items)
    if staged is None:
        return
    # a run that fails frees the buffer once the GPU is done with it (`keep`); the
    # destination buffers' destroy() waits for it too (`users`)
    ctx.run_once(staged.record, timeout=timeout, keep=[staged.buffer], users=[buf for buf, _, _ in items])
    ctx.staging.give_back(staged.buffer)


def upload(ctx: Any, buf: Any, offset: int, data: np.ndarray, timeout: float | None = 60.0) -> None:
    """Write host bytes `data` into device buffer `buf` at `offset` of the device of
    `ctx` (a DeviceContext), through a staging buffer; returns once the copy is done."""
    upload_many(ctx, [(buf, offset, data)], timeout)


def image_copy_ops(srcs: list[Any], sizes: list[int], dst: Any) -> list[bytes]:
    """The packed copies (step_ops.copy_op) of `srcs` one after another into buffer `dst`."""
    ops, at = [], 0
    for src, n in zip(srcs, sizes):
        ops.append(copy_op(src.handle_int, dst.handle_int, 0, at, n))
        at += n
    return ops


def queue_image_copy(k: Any, jobs: Any, srcs: list[Any], sizes: list[int], dst: Any) -> tuple[KernelImage, Any]:
    """Queue on `jobs` (GpuJobs of k's device) the copy of k's image buffers `srcs` into
    host-visible `dst`, behind k's submitted steps: (the image's host side, the job's
    point). Under k's device lock, so that no step comes in between the host side's
    step count and the copy; the copies are recorded natively, so it is held briefly."""
    ops = b"".join([BARRIER, *image_copy_ops(srcs, sizes, dst), HOST_BARRIER])
    with at_rest(k):
        k.check()
        if srcs[0] is not k.control:   # (a failover's restore or a move gave it another device half)
            raise KernelMoved(f"kernel {k.id!r} moved while its checkpoint was being queued")
        img = image_meta(k)
        point = jobs.submit_ops(ops, users=[*srcs, dst])
    return img, point


class KernelMoved(MigrationError):
    """queue_image_copy found the kernel on another device half than its sources' (a move or a
    failover's restore meanwhile): nothing was queued; take its sources again."""


def fill_image(img: KernelImage, raw: Any, sizes: list[int]) -> KernelImage:
    """Set img's control block, inbox and states from the packed copy `raw` (a bytes-like)."""
    parts, at = [], 0
    for n in sizes:
        parts.append(bytes(raw[at:at + n]))
        at += n
    img.control, img.inbox, img.states = parts[0], parts[1], parts[2:]
    return img


def to_checkpoint(img: KernelImage) -> Checkpoint:
    """The Checkpoint of a KernelImage."""
    spec = img.spec
    meta = CheckpointMetadata(img.kernel_id, spec.kernel_type, img.steps, tuple(spec.groups), local_size(spec),  # type: ignore[arg-type]
                              img.clock)
    meta.custom.update({
        _PREFIX + "spec": json.dumps({"state_sizes": list(spec.state_sizes), "inbox_capacity": spec.inbox_capacity,
                                      "outbox_capacity": spec.outbox_capacity, "groups": list(spec.groups),
                                      "entry_point": spec.entry_point}),
        _PREFIX + "address": str(img.address), _PREFIX + "tenant": str(img.tenant),
        _PREFIX + "params": json.dumps(list(img.params)), _PREFIX + "payload_size": str(img.payload_size),
        _PREFIX + "host_seq": str(img.host_seq), _PREFIX + "device": str(img.device),
        _PREFIX + "spirv_sha256": spec.sha256,
    })
    cp = Checkpoint(meta)
    cp.add_control_block(img.control)
    cp.add_chunk(DataChunk.with_id(ChunkType.CUSTOM, img.inbox, INBOX_CHUNK))
    for i, s in enumerate(img.states):
        cp.add_device_memory(f"state{i}", s)
    cp.add_h2k_queue(b"".join(img.h2k))
    cp.add_k2h_queue(_pack_received(img.received, img.address, img.payload_size))
    cp.add_chunk(DataChunk.with_id(ChunkType.CUSTOM, spec.spirv, SPIRV_CHUNK))
    return cp


def _custom(meta: CheckpointMetadata, key: str) -> str:
    v = meta.custom.get(_PREFIX + key)
    if v is None:
        raise InvalidCheckpointError(f"checkpoint of {short_repr(meta.kernel_id)} has no {_PREFIX + key!r} metadata: it is not "
                                     f"a checkpoint of a vkmulti runtime kernel")
    return v


def _chunk(cp: Checkpoint, found: DataChunk | None, what: str) -> bytes:
    if found is None:
        raise InvalidCheckpointError(f"checkpoint of {short_repr(cp.metadata.kernel_id)} has no {what} chunk")
    return found.data


def from_checkpoint(cp: Checkpoint) -> KernelImage:
    """The KernelImage in a checkpoint made by `to_checkpoint` (InvalidCheckpointError otherwise)."""
    if not isinstance(cp, Checkpoint):
        raise TypeError(f"expected a Checkpoint, got {type(cp).__name__}")
    check_kernel_checkpoint(cp)
    meta = cp.metadata
    try:
        shape = json.loads(_custom(meta, "spec"))
        params = tuple(int(p) for p in json.loads(_custom(meta, "params")))
        address, tenant = int(_custom(meta, "address")), int(_custom(meta, "tenant"))
        payload_size, host_seq = int(_custom(meta, "payload_size")), int(_custom(meta, "host_seq"))
        device = int(meta.custom.get(_PREFIX + "device", "-1"))
        spirv = _chunk(cp, cp.get_custom(SPIRV_CHUNK), "SPIR-V")
        spec = KernelSpec(meta.kernel_type, spirv, tuple(shape["state_sizes"]), shape["inbox_capacity"],
                          shape["outbox_capacity"], tuple(shape["groups"]), shape["entry_point"])
    except (ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, InvalidCheckpointError):
            raise
        raise InvalidCheckpointError(f"checkpoint of {short_repr(meta.kernel_id)} has bad kernel metadata: {short_str(exc)}") from None
    want = meta.custom.get(_PREFIX + "spirv_sha256")
    if want is not None and hashlib.sha256(spirv).hexdigest() != want:
        raise InvalidCheckpointError(f"checkpoint of {short_repr(meta.kernel_id)}: its SPIR-V does not match the recorded SHA-256")
    states = []
    for i, size in enumerate(spec.state_sizes):
        data = _chunk(cp, cp.get_device_memory(f"state{i}"), f"state{i}")
        if len(data) != size:
            raise InvalidCheckpointError(f"checkpoint of {short_repr(meta.kernel_id)}: state{i} holds {len(data)} bytes, the "
                                         f"spec says {size}")
        states.append(data)
    slot = ENVELOPE_BYTES + payload_size
    h2k_raw = cp.get_chunk(ChunkType.H2K_QUEUE)
    k2h_raw = cp.get_chunk(ChunkType.K2H_QUEUE)
    h2k = [] if h2k_raw is None else [h2k_raw.data[i:i + slot] for i in range(0, len(h2k_raw.data), slot)]
    received = []
    if k2h_raw is not None:
        raw = k2h_raw.data
        for i in range(0, len(raw), slot):
            env = MessageEnvelope.unpack(raw[i:i + ENVELOPE_BYTES])
            n = min(env.payload_len, payload_size)
            received.append(K2KMessage(meta.kernel_id, HOST_KERNEL_ID, raw[i + ENVELOPE_BYTES:i + ENVELOPE_BYTES + n],
                                       env.tag, env.sequence, env.timestamp, env.tenant, env.hops, env.priority))
    if any(len(s) != slot for s in h2k) or (k2h_raw is not None and len(k2h_raw.data) % slot):
        raise InvalidCheckpointError(f"checkpoint of {short_repr(meta.kernel_id)}: host queues are not whole {slot}-byte slots")
    control = _chunk(cp, cp.get_chunk(ChunkType.CONTROL_BLOCK), "control block")
    inbox = _chunk(cp, cp.get_custom(INBOX_CHUNK), "inbox")
    return KernelImage(spec, meta.kernel_id, address, tenant, params, meta.current_step, host_seq, payload_size,  # type: ignore[arg-type]
                       control, inbox, states, h2k, received, device)


def patch_control(control: bytes, address: int, tenant: int, table_size: int, keep_sequences: bool) -> np.ndarray:
    """The control block for a kernel at `address`: the header's address and tenant set,
    the sequence table kept (same address) or cleared (a new sender starts at 0)."""
    need = CONTROL_HEADER_BYTES + 16 * table_size
    out = np.zeros(need, np.uint8)
    raw = np.frombuffer(control, np.uint8)
    if keep_sequences:
        n = min(len(raw), need)
        out[:n] = raw[:n]
    else:
        out[:CONTROL_HEADER_BYTES] = raw[:CONTROL_HEADER_BYTES]
    words = out.view(np.uint32)
    words[0], words[1], words[7] = address, tenant, table_size
    return out


def readdress_slots(slots: list[bytes], address: int) -> list[bytes]:
    """Host-message slots with their destination address (envelope word 1) set to `address`."""
    out = []
    for s in slots:
        b = bytearray(s)
        struct.pack_into("<I", b, 4, address)
        out.append(bytes(b))
    return out
