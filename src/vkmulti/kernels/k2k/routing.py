"""ringkernel's cross-GPU routing types (RoutingKind, RoutingDecision,
PendingK2KMessage, the router's live stats and their snapshot) and the route
computation the router delivers along: one decision per device pair, and per
source device a tree of device hops that reaches every device holding kernels
exactly once (so a broadcast batch arrives at each device once, never twice).
"""
from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..._core.reprs import compact_repr, short_value
from ..ids import KernelId, as_kernel_id
from ..._core.checks import check_count, check_index, check_number, short_repr
from ..messages import K2KMessage

__all__ = ["RoutingKind", "RoutingDecision", "DevicePath", "PendingK2KMessage", "CrossGpuRouterStats",
           "CrossGpuRouterStatsSnapshot", "decide_route", "RouteTrees"]


class RoutingKind(enum.Enum):
    """How a K2K message travels (the seed's RoutingDecision variants)."""
    SAME_DEVICE = "same_device"
    DIRECT_P2P = "direct_p2p"
    MULTI_HOP = "multi_hop"
    HOST_MEDIATED = "host_mediated"


class DevicePath(tuple):
    """A path of device indices (immutable). Compares equal to a list or tuple
    with the same devices, so code ported from the seed's `Vec<usize>` checks
    (`decision.path == [0, 1, 2]`) reads the same."""

    def __new__(cls, devices: Iterable[int] = ()) -> "DevicePath":
        return super().__new__(cls, (check_index(d, "path device") for d in devices))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple)):
            return tuple.__eq__(self, tuple(other))
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return f"DevicePath({short_value(list(self), 150)})"


@dataclass(frozen=True)
class RoutingDecision:
    """The seed's RoutingDecision enum as one immutable record: `kind` and the
    variant's fields, None where the variant has none:

    - SAME_DEVICE: no fields
    - DIRECT_P2P: source_device, dest_device, bandwidth_gbps
    - MULTI_HOP: path, total_hops
    - HOST_MEDIATED: source_device, dest_device
    """

    __repr__ = compact_repr

    kind: RoutingKind
    source_device: int | None = None
    dest_device: int | None = None
    bandwidth_gbps: float | None = None
    path: DevicePath | None = None
    total_hops: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, RoutingKind):
            raise TypeError(f"kind must be a RoutingKind, got {type(self.kind).__name__}")
        allowed = _FIELDS[self.kind]
        for name in ("source_device", "dest_device", "bandwidth_gbps", "path", "total_hops"):
            value = getattr(self, name)
            if name in allowed and value is None:
                raise ValueError(f"a {self.kind.name} decision needs {name}")
            if name not in allowed and value is not None:
                raise ValueError(f"a {self.kind.name} decision has no {name} (got {short_repr(value)})")
        for name in ("source_device", "dest_device"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_index(getattr(self, name), name))
        if self.bandwidth_gbps is not None:
            object.__setattr__(self, "bandwidth_gbps", check_number(self.bandwidth_gbps, "bandwidth_gbps"))
        if self.path is not None:
            object.__setattr__(self, "path", DevicePath(self.path))
            if len(self.path) < 3:
                raise ValueError(f"a MULTI_HOP path has 3 devices or more, got {short_repr(list(self.path))}")
        if self.total_hops is not None:
            object.__setattr__(self, "total_hops", check_count(self.total_hops, "total_hops", 1))

    # the seed's variant constructors
    @classmethod
    def same_device(cls) -> "RoutingDecision":
        """Both kernels on one device: delivered there."""
        return cls(RoutingKind.SAME_DEVICE)

    @classmethod
    def direct_p2p(cls, source_device: int, dest_device: int, bandwidth_gbps: float) -> "RoutingDecision":
        """One peer-to-peer hop from `source_device` to `dest_device`."""
        return cls(RoutingKind.DIRECT_P2P, source_device=source_device, dest_device=dest_device,
                   bandwidth_gbps=bandwidth_gbps)

    @classmethod
    def multi_hop(cls, path: Iterable[int], total_hops: int) -> "RoutingDecision":
        """Forwarded along `path` over `total_hops` peer-to-peer hops."""
        return cls(RoutingKind.MULTI_HOP, path=DevicePath(path), total_hops=total_hops)

    @classmethod
    def host_mediated(cls, source_device: int, dest_device: int) -> "RoutingDecision":
        """Through host memory (no peer-to-peer path between the devices)."""
        return cls(RoutingKind.HOST_MEDIATED, source_device=source_device, dest_device=dest_device)

    @property
    def hops(self) -> int:
        """Device crossings a message makes (the seed's PendingK2KMessage.hops):
        0 same device, 1 direct, path length - 1 multi-hop, 2 through the host."""
        return {RoutingKind.SAME_DEVICE: 0, RoutingKind.DIRECT_P2P: 1,
                RoutingKind.HOST_MEDIATED: 2}.get(self.kind, self.total_hops or 0)

    @property
    def devices(self) -> DevicePath:
        """Every device the message passes, source first (empty for SAME_DEVICE)."""
        if self.kind is RoutingKind.MULTI_HOP:
            return self.path   # type: ignore[return-value]
        if self.kind is RoutingKind.SAME_DEVICE:
            return DevicePath()
        return DevicePath((self.source_device, self.dest_device))   # type: ignore[arg-type]


_FIELDS = {
    RoutingKind.SAME_DEVICE: (),
    RoutingKind.DIRECT_P2P: ("source_device", "dest_device", "bandwidth_gbps"),
    RoutingKind.MULTI_HOP: ("path", "total_hops"),
    RoutingKind.HOST_MEDIATED: ("source_device", "dest_device"),
}


def decide_route(topology: Any, source_device: int, dest_device: int) -> RoutingDecision:
    """The seed's decision for a device pair: SAME_DEVICE for one device; DIRECT_P2P
    when the direct link supports P2P; MULTI_HOP when best_path (the widest path
    over P2P-capable links) has intermediate devices; HOST_MEDIATED otherwise."""
    s, d = check_index(source_device, "source_device"), check_index(dest_device, "dest_device")
    if s == d:
        return RoutingDecision.same_device()
    conn = topology.get_connection(s, d)
    if conn is not None and conn.interconnect.supports_p2p():
        return RoutingDecision.direct_p2p(s, d, conn.bandwidth_gbps)
    path = topology.best_path(s, d)
    if len(path) > 2:
        return RoutingDecision.multi_hop(path, len(path) - 1)
    return RoutingDecision.host_mediated(s, d)


@dataclass
class PendingK2KMessage:
    """A message routed across devices and not yet delivered (the seed's struct):
    `queued_at` is time.monotonic() seconds, `hops` the device crossings of its route."""

    __repr__ = compact_repr

    source_kernel: KernelId
    dest_kernel: KernelId
    message: K2KMessage
    queued_at: float = field(default_factory=time.monotonic)
    hops: int = 1

    def __post_init__(self) -> None:
        self.source_kernel = as_kernel_id(self.source_kernel, "source_kernel")
        self.dest_kernel = as_kernel_id(self.dest_kernel, "dest_kernel")
        if not isinstance(self.message, K2KMessage):
            raise TypeError(f"message must be a K2KMessage, got {type(self.message).__name__}")
        self.queued_at = check_number(self.queued_at, "queued_at")
        self.hops = check_count(self.hops, "hops")

    @property
    def payload_size(self) -> int:
        """Payload bytes of the pending message."""
        return len(self.message.payload)


@dataclass(frozen=True)
class CrossGpuRouterStatsSnapshot:
    """The router's counters at one moment (the seed's snapshot)."""

    __repr__ = compact_repr
    messages_routed: int = 0
    bytes_transferred: int = 0
    messages_pending: int = 0
    avg_latency_us: float = 0.0
    routing_failures: int = 0


class CrossGpuRouterStats:
    """The router's live counters (the seed's atomics, here behind one lock).
    `snapshot()` (or the router's `stats()`) is the API; the attributes are
    readable for diagnostics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages_routed = 0
        self.bytes_transferred = 0
        self.messages_pending = 0
        self.total_latency_us = 0
        self.routing_failures = 0
        #: outbox batches handed on to another device, once per batch and edge (the router's `batches`)
        self.batches_moved = 0

    def add_routed(self, messages: int, payload_bytes: int, latency_us_total: int) -> None:
        """Count `messages` routed, their payload bytes and summed latency."""
        with self._lock:
            self.messages_routed += messages
            self.bytes_transferred += payload_bytes
            self.total_latency_us += latency_us_total

    def add_bytes(self, nbytes: int) -> None:
        """Count bytes moved between devices."""
        with self._lock:
            self.bytes_transferred += nbytes

    def add_moved(self, batches: int, nbytes: int) -> None:
        """Count `batches` outbox batches handed on to another device in `nbytes` bytes."""
        with self._lock:
            self.batches_moved += batches
            self.bytes_transferred += nbytes

    def add_pending(self, n: int) -> None:
        """Change the pending count by `n` (never below 0)."""
        with self._lock:
            self.messages_pending = max(0, self.messages_pending + n)

    def add_failures(self, n: int = 1) -> None:
        """Count routing failures."""
        with self._lock:
            self.routing_failures += n

    def snapshot(self) -> CrossGpuRouterStatsSnapshot:
        """The counters now, with the average latency (a CrossGpuRouterStatsSnapshot)."""
        with self._lock:
            routed = self.messages_routed
            avg = self.total_latency_us / routed if routed else 0.0
            return CrossGpuRouterStatsSnapshot(routed, self.bytes_transferred, self.messages_pending, avg,
                                               self.routing_failures)


class RouteTrees:
    """For each source device, the device hops its batches take: `children(s, x)`
    lists the devices that device x passes a batch from s on to. Built from
    one decision per (s, d) over `devices` (those holding kernels): paths are
    laid in order of length, and a device already reached keeps its first
    parent, so every device receives each batch exactly once even when two
    widest paths disagree on the way. `edge_hops(a, b)` is 2 for a pair with no
    P2P-capable link (through the host, as the seed counts) and 1 otherwise."""

    def __init__(self, topology: Any, devices: Iterable[int]):
        self.devices = sorted(set(devices))
        self.decisions: dict[tuple[int, int], RoutingDecision] = {}
        self._children: dict[tuple[int, int], list[int]] = {}   # (source, at) -> children
        self._host: set[tuple[int, int]] = set()
        for s in self.devices:
            paths = []
            for d in self.devices:
                if d == s:
                    continue
                dec = decide_route(topology, s, d)
                self.decisions[(s, d)] = dec
                path = list(dec.devices)
                for a, b in zip(path, path[1:]):
                    conn = topology.get_connection(a, b)
                    if conn is None or not conn.interconnect.supports_p2p():
                        self._host.add((a, b))
                paths.append(path)
            parent: dict[int, int] = {}
            for path in sorted(paths, key=lambda p: (len(p), p)):
                for a, b in zip(path, path[1:]):
                    if b != s and b not in parent:
                        parent[b] = a
            for b, a in sorted(parent.items()):
                self._children.setdefault((s, a), []).append(b)

    def children(self, source: int, at: int) -> list[int]:
        """Devices that `at` sends batches from `source` on to."""
        return self._children.get((source, at), [])

    def edge_hops(self, a: int, b: int) -> int:
        return 2 if (a, b) in self._host else 1

    def is_host_mediated(self, a: int, b: int) -> bool:
        return (a, b) in self._host

    def subtree(self, source: int, at: int) -> set[int]:
        """`at` and every device it passes batches from `source` on to, directly or not."""
        out, todo = {at}, [at]
        while todo:
            for c in self.children(source, todo.pop()):
                out.add(c)
                todo.append(c)
        return out

    def reached(self, source: int) -> list[int]:
        """Every device a batch from `source` reaches (source excluded)."""
        out, todo = [], [source]
        while todo:
            x = todo.pop()
            for c in self.children(source, x):
                out.append(c)
                todo.append(c)
        return sorted(out)
