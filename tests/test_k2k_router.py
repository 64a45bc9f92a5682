"""CrossGpuK2KRouter's decisions and bookkeeping on coordinator records (no devices):
every RoutingKind with its fields, queue keys and hop counts, drain order, stats,
the fixed seed defects, route trees, bad input, and many threads at once."""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

from vkmulti import (Backend, CrossGpuK2KRouter, CrossGpuRouterStats, CrossGpuRouterStatsSnapshot, DeviceInfo,
                     GpuConnection, GpuTopology, InterconnectType as I, K2KDestinationNotFoundError, K2KMessage,
                     KernelId, MultiGpuBuilder, PendingK2KMessage, RoutingDecision, RoutingKind)
from vkmulti.kernels import DevicePath
from vkmulti.kernels.k2k import RouteTrees, decide_route


def coordinator(n: int, links: list[tuple[int, int, I]] | None = None):
    coord = MultiGpuBuilder().build()
    for i in range(n):
        info = DeviceInfo(i, f"GPU {i}", Backend.CUDA)
        info.p2p_capable = True
        coord.register_device(info)
    if links is not None:
        topo = GpuTopology(n)
        for a, b, kind in links:
            topo.set_connection(GpuConnection(a, b, kind))
        coord.set_topology(topo)
    return coord


def place(coord, **kernels: int):
    for k, dev in kernels.items():
        coord.assign_kernel(k, dev)


CHAIN = [(0, 1, I.NVLINK), (1, 2, I.PCIE), (0, 2, I.NONE)]


def test_every_kind_with_its_fields():
    coord = coordinator(4, CHAIN + [(0, 3, I.NONE), (1, 3, I.NONE), (2, 3, I.NONE)])
    place(coord, a=0, b=0, c=1, d=2, e=3)
    router = CrossGpuK2KRouter(coord)
    same = router.route_message("a", "b", b"x")
    assert same == RoutingDecision.same_device() and same.kind is RoutingKind.SAME_DEVICE
    assert (same.source_device, same.dest_device, same.bandwidth_gbps, same.path, same.total_hops) == \
        (None, None, None, None, None)
    direct = router.route_message("a", "c", b"x")
    assert direct.kind is RoutingKind.DIRECT_P2P
    assert (direct.source_device, direct.dest_device, direct.bandwidth_gbps) == (0, 1, 300.0)
    assert direct.path is None and direct.total_hops is None
    hop = router.route_message("a", "d", b"x")
    assert hop.kind is RoutingKind.MULTI_HOP and hop.path == [0, 1, 2] and hop.total_hops == 2
    assert hop.source_device is None and hop.bandwidth_gbps is None and isinstance(hop.path, DevicePath)
    host = router.route_message("a", "e", b"x")
    assert host.kind is RoutingKind.HOST_MEDIATED and (host.source_device, host.dest_device) == (0, 3)
    assert host.bandwidth_gbps is None and host.path is None
    # queued under (source, first hop), with the seed's hop counts; SAME_DEVICE queues nothing
    assert [p.hops for p in router.drain_pending(0, 1)] == [1, 2]
    assert [p.hops for p in router.drain_pending(0, 3)] == [2]
    assert router.drain_pending(0, 2) == [] and router.drain_pending(0, 0) == []
    assert (same.hops, direct.hops, hop.hops, host.hops) == (0, 1, 2, 2)


def test_decisions_are_immutable_and_validated():
    d = RoutingDecision.direct_p2p(0, 1, 25.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.kind = RoutingKind.SAME_DEVICE   # type: ignore[misc]
    assert d == RoutingDecision(RoutingKind.DIRECT_P2P, source_device=0, dest_device=1, bandwidth_gbps=25.0)
    assert hash(RoutingDecision.multi_hop([0, 1, 2], 2)) == hash(RoutingDecision.multi_hop((0, 1, 2), 2))
    with pytest.raises(ValueError, match="no path"):
        RoutingDecision(RoutingKind.DIRECT_P2P, source_device=0, dest_device=1, bandwidth_gbps=1.0, path=[0, 1])
    with pytest.raises(ValueError, match="needs total_hops"):
        RoutingDecision(RoutingKind.MULTI_HOP, path=[0, 1, 2])
    with pytest.raises(ValueError, match="3 devices"):
        RoutingDecision.multi_hop([0, 1], 1)
    with pytest.raises(TypeError, match="RoutingKind"):
        RoutingDecision("direct")   # type: ignore[arg-type]
    with pytest.raises(ValueError, match="source_device"):
        RoutingDecision.host_mediated(-1, 2)
    p = DevicePath([0, 1, 2])
    assert p == [0, 1, 2] and p == (0, 1, 2) and p != [0, 2] and {p: 1}[(0, 1, 2)] == 1


def test_fixed_seed_defect_no_multi_hop_through_host_links():
    """The seed's best_path accepted NONE links as hops: 3 GPUs with no P2P gave MULTI_HOP."""
    coord = coordinator(3, [(0, 1, I.NONE), (1, 2, I.NONE), (0, 2, I.NONE)])
    place(coord, a=0, b=2)
    assert CrossGpuK2KRouter(coord).route_message("a", "b", b"").kind is RoutingKind.HOST_MEDIATED


def test_multi_hop_takes_the_widest_path_of_any_length():
    links = [(0, 1, I.PCIE), (1, 3, I.PCIE), (0, 2, I.NVLINK), (2, 4, I.NVLINK), (4, 3, I.NVLINK), (0, 3, I.NONE)]
    coord = coordinator(5, links)
    place(coord, a=0, b=3)
    d = CrossGpuK2KRouter(coord).route_message("a", "b", b"")
    assert d.kind is RoutingKind.MULTI_HOP and d.path == [0, 2, 4, 3] and d.total_hops == 3


def test_unplaced_kernels_raise_and_count_as_failures():
    coord = coordinator(2)
    place(coord, a=0)
    router = CrossGpuK2KRouter(coord)
    with pytest.raises(K2KDestinationNotFoundError, match="'ghost'"):
        router.route_message("a", "ghost", b"")
    with pytest.raises(K2KDestinationNotFoundError, match="'nobody'"):
        router.route_message("nobody", "a", b"")
    assert router.stats().routing_failures == 2 and router.stats().messages_pending == 0


def test_stats_record_delivery_latency_and_failures():
    coord = coordinator(2)
    place(coord, a=0, b=1)
    router = CrossGpuK2KRouter(coord)
    for i in range(4):
        router.route_message("a", "b", bytes([i]) * 10)
    pending = router.drain_pending(0, 1)
    assert [p.message.payload[0] for p in pending] == [0, 1, 2, 3]   # FIFO
    # queued half a second earlier: the latency counts from queued_at, whatever the machine's speed
    pending = [dataclasses.replace(p, queued_at=p.queued_at - 0.5) for p in pending]
    for p in pending:
        router.record_delivery(p, p.payload_size)
    router.record_failure()
    s = router.stats()
    assert isinstance(s, CrossGpuRouterStatsSnapshot)
    assert (s.messages_routed, s.bytes_transferred, s.messages_pending, s.routing_failures) == (4, 40, 0, 1)
    assert s.avg_latency_us >= 500_000
    live = CrossGpuRouterStats()
    assert live.snapshot() == CrossGpuRouterStatsSnapshot()


def test_message_forms():
    coord = coordinator(2)
    place(coord, a=0, b=1)
    router = CrossGpuK2KRouter(coord)
    router.route_message("a", "b", b"abc")
    router.route_message(KernelId("a"), KernelId("b"), bytearray(b"def"))
    router.route_message("a", "b", np.array([7], np.uint32))
    router.route_message("a", "b", K2KMessage("a", "b", b"ghi", tag=5))
    got = router.drain_pending(0, 1)
    assert [p.message.payload for p in got] == [b"abc", b"def", b"\x07\0\0\0", b"ghi"]
    assert got[3].message.tag == 5 and all(isinstance(p, PendingK2KMessage) for p in got)
    assert got[0].source_kernel == "a" and isinstance(got[0].dest_kernel, KernelId)


@pytest.mark.parametrize("call, err, what", [
    (lambda r: r.route_message(1, "b", b""), TypeError, "source_kernel"),
    (lambda r: r.route_message("a", None, b""), TypeError, "dest_kernel"),
    (lambda r: r.route_message("a", "b", 3.5), TypeError, "message"),
    (lambda r: r.route_message("a", "b", K2KMessage("b", "a", b"")), ValueError, "from 'b' to 'a'"),
    (lambda r: r.route_message("a", "b", b"", timeout=-1), ValueError, "timeout"),
    (lambda r: r.drain_pending(-1, 0), ValueError, "source"),
    (lambda r: r.drain_pending(0, "1"), TypeError, "dest"),
    (lambda r: r.record_delivery("msg", 3), TypeError, "PendingK2KMessage"),
    (lambda r: r.record_delivery(PendingK2KMessage("a", "b", K2KMessage("a", "b")), -3), ValueError,
     "payload_size"),
    (lambda r: r.route(0, -2), ValueError, "dest_device"),
    (lambda r: r.attach("runtime"), TypeError, "KernelRuntime"),
])
def test_bad_input_is_typed_and_leaves_the_router_usable(call, err, what):
    coord = coordinator(2)
    place(coord, a=0, b=1)
    router = CrossGpuK2KRouter(coord)
    with pytest.raises(err, match=what):
        call(router)
    assert router.route_message("a", "b", b"ok").kind is RoutingKind.DIRECT_P2P
    assert router.stats().routing_failures == 0 and router.stats().messages_pending == 1


def test_constructor_checks():
    with pytest.raises(TypeError, match="MultiGpuCoordinator"):
        CrossGpuK2KRouter(object())
    with pytest.raises(ValueError, match="max_pending"):
        CrossGpuK2KRouter(coordinator(1), max_pending=0)
    with pytest.raises(ValueError, match="max_landings"):
        CrossGpuK2KRouter(coordinator(1), max_landings=-1)
    for bad in (0, 0.0, -1, float("nan")):   # (0 was taken as the 30 s default)
        with pytest.raises(ValueError, match="submit_timeout"):
            CrossGpuK2KRouter(coordinator(1), submit_timeout=bad)
    assert CrossGpuK2KRouter(coordinator(1), submit_timeout=None).submit_timeout is None
    with pytest.raises(TypeError):
        PendingK2KMessage("a", "b", b"not a K2KMessage")   # type: ignore[arg-type]


def test_routes_follow_topology_changes():
    coord = coordinator(3, CHAIN)
    place(coord, a=0, b=2)
    router = CrossGpuK2KRouter(coord)
    assert router.route_message("a", "b", b"").kind is RoutingKind.MULTI_HOP
    coord.set_topology(GpuTopology(3))          # no links at all: through the host
    assert router.route_message("a", "b", b"").kind is RoutingKind.HOST_MEDIATED
    topo = GpuTopology(3)
    topo.set_connection(GpuConnection(0, 2, I.NVLINK))
    coord.set_topology(topo)
    assert router.route_message("a", "b", b"").kind is RoutingKind.DIRECT_P2P
    assert [p.hops for p in router.drain_pending(0, 1)] == [2]
    assert [p.hops for p in router.drain_pending(0, 2)] == [2, 1]


def test_route_trees_reach_every_device_once():
    """Two widest paths that disagree (0->3 via 1, 0->4 via 2 then 3) still give one parent per device."""
    topo = GpuTopology(5)
    for a, b, kind in [(0, 1, I.NVLINK), (1, 3, I.NVLINK), (0, 2, I.NVSWITCH), (2, 4, I.NVSWITCH),
                       (4, 3, I.NVSWITCH), (0, 3, I.NONE)]:
        topo.set_connection(GpuConnection(a, b, kind))
    trees = RouteTrees(topo, range(5))
    for s in range(5):
        reached = trees.reached(s)
        assert sorted(reached) == [d for d in range(5) if d != s] and len(reached) == len(set(reached))
    assert trees.decisions[(0, 3)].path == [0, 2, 4, 3] and trees.children(0, 4) == [3]
    assert trees.edge_hops(0, 1) == 1
    host = RouteTrees(GpuTopology(2), [0, 1])
    assert host.children(0, 0) == [1] and host.edge_hops(0, 1) == 2 and host.is_host_mediated(0, 1)
    assert decide_route(topo, 2, 2).kind is RoutingKind.SAME_DEVICE


def test_many_threads_route_at_once():
    coord = coordinator(2)
    for t in range(8):
        place(coord, **{f"s{t}": t % 2, f"d{t}": 1 - t % 2})
    router = CrossGpuK2KRouter(coord)
    errors = []

    def worker(t: int) -> None:
        try:
            for i in range(200):
                router.route_message(f"s{t}", f"d{t}", np.array([t, i], np.uint32))
        except Exception as exc:   # noqa: BLE001 - asserted below
            errors.append(exc)
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == [] and router.stats().messages_pending == 1600
    got = router.drain_pending(0, 1) + router.drain_pending(1, 0)
    assert len(got) == 1600 and router.stats().messages_pending == 0
    for t in range(8):   # each sender's messages in its own order
        seq = [int(np.frombuffer(p.message.payload, np.uint32)[1]) for p in got if p.source_kernel == f"s{t}"]
        assert seq == list(range(200))
