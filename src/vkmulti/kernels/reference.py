"""The reference kernels shipped with vkmulti (GLSL in native/shaders/kernel_*.comp,
committed SPIR-V in vkmulti/shaders): a counter/accumulator actor for tests,
a ping-pong actor for latency, and a 2D Jacobi stencil tile; plus what the
host needs to set them up and read them (state layouts, a numpy reference).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core.checks import int_in, positive_int, short_repr
from .._core.shaders import shader_bytes
from .engine.spec import KernelSpec

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from .._core.protocols import HostData

__all__ = ["COUNTER_TAG_ADD", "COUNTER_TAG_QUERY", "COUNTER_TAG_REPLY", "COUNTER_TAG_FORWARD", "PING_TAG",
           "PING_DONE_TAG", "counter_kernel", "counter_initial_state", "CounterState", "read_counter",
           "pingpong_kernel", "PingPongState", "read_pingpong", "stencil_kernel", "stencil_tile_state",
           "stencil_field", "jacobi_reference", "split_rows", "STENCIL_FROM_ABOVE", "STENCIL_FROM_BELOW",
           "burst_kernel", "BurstState", "read_burst", "BURST_TAG"]

COUNTER_TAG_ADD = 1
COUNTER_TAG_QUERY = 2
COUNTER_TAG_REPLY = 3
COUNTER_TAG_FORWARD = 4
PING_TAG = 1
PING_DONE_TAG = 2
STENCIL_FROM_ABOVE = 1
STENCIL_FROM_BELOW = 2
BURST_TAG = 7
#: The most slabs split_rows makes (one per device or node; the list is built in full).
_MAX_PARTS = 1 << 16
_COUNTER_HEADER = 16   # words before the per-source table


def counter_kernel(*, max_sources: int = 1024, inbox_capacity: int = 64, outbox_capacity: int = 64) -> KernelSpec:
    """The counter/accumulator actor. Its state holds a per-source table of
    `max_sources` entries (set it to the runtime's max_kernels so every sender
    has its own FIFO check); launch it with state=counter_initial_state(...)."""
    return KernelSpec("counter", shader_bytes("kernel_counter.comp.spv"),
                      state_sizes=(4 * _COUNTER_HEADER + 16 * max_sources,), inbox_capacity=inbox_capacity,
                      outbox_capacity=outbox_capacity)


def counter_initial_state(max_sources: int = 1024) -> np.ndarray:
    s = np.zeros(_COUNTER_HEADER, np.uint32)
    s[7] = max_sources
    return s


@dataclass(frozen=True)
class CounterState:
    count: int
    sum: int
    fifo_errors: int
    queries: int
    forwards: int
    failed_emits: int
    hops_sum: int = 0     # hop counts (device crossings) of every message consumed, summed
    max_hops: int = 0


def read_counter(raw: HostData) -> CounterState:
    """Decode the counter's state buffer (KernelRuntime.read_state)."""
    w = np.frombuffer(bytes(raw)[:4 * 10], np.uint32)
    return CounterState(int(w[0]), int(w[1]) | int(w[2]) << 32, int(w[3]), int(w[4]), int(w[5]), int(w[6]),
                        int(w[8]), int(w[9]))


def pingpong_kernel(*, inbox_capacity: int = 16, outbox_capacity: int = 16) -> KernelSpec:
    """The ping-pong actor (params[0]: partner address, 0 = reply to the sender)."""
    return KernelSpec("pingpong", shader_bytes("kernel_pingpong.comp.spv"), state_sizes=(16,),
                      inbox_capacity=inbox_capacity, outbox_capacity=outbox_capacity)


@dataclass(frozen=True)
class PingPongState:
    bounces: int
    done: int
    failed_emits: int
    last_remaining: int


def read_pingpong(raw: HostData) -> PingPongState:
    w = np.frombuffer(bytes(raw)[:16], np.uint32)
    return PingPongState(*(int(x) for x in w))


def _chunks(width: int, payload_size: int) -> int:
    return -(-width * 4 // payload_size)


def stencil_kernel(width: int, height: int, payload_size: int) -> KernelSpec:
    """A stencil tile of `height` rows of `width` int32 cells. Launch it with
    params=(up address or 0, down address or 0, width, height) and
    state=stencil_tile_state(...). Its halo rows travel in
    ceil(width*4 / payload_size) messages per side per step."""
    positive_int(width, "width")
    positive_int(height, "height")
    if width < 3:
        raise ValueError(f"width must be >= 3 (the outer columns are fixed), got {short_repr(width)}")
    chunks = _chunks(width, payload_size)
    if chunks > 255:
        raise ValueError(f"a {short_repr(width)}-cell row needs {short_repr(chunks)} messages of {short_repr(payload_size)} bytes; at most 255 "
                         f"(raise the runtime's payload_size)")
    field = (height + 2) * width * 4
    return KernelSpec("stencil", shader_bytes("kernel_stencil.comp.spv"), state_sizes=(field, field),
                      inbox_capacity=max(2 * chunks, 2), outbox_capacity=max(2 * chunks, 2),
                      groups=(-(-width // 8), -(-height // 8), 1))


def stencil_tile_state(field: np.ndarray, row0: int, rows: int, top: np.ndarray, bottom: np.ndarray) \
        -> list[np.ndarray]:
    """The two state buffers of the tile holding rows [row0, row0+rows) of the
    global `field` (int32, H x W), with halo rows from the field or the fixed
    `top`/`bottom` boundary rows where the tile touches the edge."""
    f = np.ascontiguousarray(field, dtype=np.int32)
    h, w = f.shape
    tile = np.empty((rows + 2, w), np.int32)
    tile[1:-1] = f[row0:row0 + rows]
    tile[0] = f[row0 - 1] if row0 > 0 else top
    tile[-1] = f[row0 + rows] if row0 + rows < h else bottom
    return [tile.copy(), tile.copy()]


def stencil_field(raw: HostData, width: int, height: int) -> NDArray[np.int32]:
    """The interior rows (height x width int32) of a tile state buffer."""
    a = np.frombuffer(bytes(raw), np.int32).reshape(height + 2, width)
    return a[1:-1].copy()


def jacobi_reference(field: np.ndarray, top: np.ndarray, bottom: np.ndarray, steps: int) -> np.ndarray:
    """The same Jacobi iteration as the stencil kernel, in numpy (int32, bit for bit)."""
    f = np.ascontiguousarray(field, dtype=np.int32)
    h, w = f.shape
    g = np.empty((h + 2, w), np.int32)
    g[0], g[-1], g[1:-1] = top, bottom, f
    for _ in range(steps):
        n = g.copy()
        n[1:-1, 1:-1] = (g[:-2, 1:-1] + g[2:, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:] + 2) >> 2
        g = n
    return g[1:-1].copy()


def split_rows(height: int, parts: int) -> list[tuple[int, int]]:
    """(first row, rows) of `parts` slabs that cover `height` rows as evenly as possible."""
    height = positive_int(height, "height")
    parts = positive_int(parts, "parts", hi=_MAX_PARTS)
    if parts > height:
        raise ValueError(f"cannot split {short_repr(height)} rows into {parts} slabs")
    base, extra = divmod(height, parts)
    out, row = [], 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append((row, n))
        row += n
    return out


def burst_kernel(messages: int, *, groups: int | None = None) -> KernelSpec:
    """The burst sender / checking sink (bandwidth): as a sender (params=(dest
    address, messages per step)) it fills `messages` outbox slots with full
    payloads every step; with params=(dest, messages, 1, first) steps from
    `first` on only restamp the payload words the sink checks (a sender whose
    payloads are ready; pass the runtime's in_flight so that every outbox
    region was written in full once). As a receiver it checks and counts up
    to `messages` messages a step. Both rings hold `messages` slots; `groups`
    workgroups (default: one per slot) share the slots."""
    int_in(messages, "messages", 1, 65536)
    groups = int_in(messages if groups is None else groups, "groups", 1, 65535)
    return KernelSpec("burst", shader_bytes("kernel_burst.comp.spv"), state_sizes=(64,),
                      inbox_capacity=messages, outbox_capacity=messages, groups=(groups, 1, 1))


@dataclass(frozen=True)
class BurstState:
    received: int
    bad: int           # messages whose payload did not match the sender's pattern
    bytes: int         # payload bytes received
    sent_steps: int


def read_burst(raw: HostData) -> BurstState:
    w = np.frombuffer(bytes(raw)[:20], np.uint32)
    return BurstState(int(w[0]), int(w[1]), int(w[2]) | int(w[3]) << 32, int(w[4]))
