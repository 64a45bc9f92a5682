"""The inline Cross-GPU K2K Router tests of ringkernel-core's multi_gpu.rs, ported
with the Python spelling (X::new(a) -> X(a), enum -> UPPER_SNAKE, Result error
-> exception); `matches!` / `match` on the RoutingDecision enum become checks of
`decision.kind` and the variant's fields."""
from __future__ import annotations

import time

from vkmulti import (Backend, CrossGpuK2KRouter, DeviceInfo, HlcTimestamp, K2KMessage, KernelId, MultiGpuBuilder,
                     RoutingKind)


def make_test_k2k_message(source: KernelId, dest: KernelId) -> K2KMessage:
    timestamp = HlcTimestamp(time.time_ns() // 1000, 42)
    return K2KMessage(source, dest, b"", timestamp=timestamp)


def test_router_same_device():
    coord = MultiGpuBuilder().build()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.CUDA))
    k1 = KernelId("k1")
    k2 = KernelId("k2")
    coord.assign_kernel(k1, 0)
    coord.assign_kernel(k2, 0)
    router = CrossGpuK2KRouter(coord)
    msg = make_test_k2k_message(k1, k2)
    decision = router.route_message(k1, k2, msg)
    assert decision.kind == RoutingKind.SAME_DEVICE


def test_router_cross_device():
    coord = MultiGpuBuilder().enable_p2p(True).build()
    dev0 = DeviceInfo(0, "GPU 0", Backend.CUDA)
    dev0.p2p_capable = True
    dev1 = DeviceInfo(1, "GPU 1", Backend.CUDA)
    dev1.p2p_capable = True
    coord.register_device(dev0)
    coord.register_device(dev1)
    k1 = KernelId("k1")
    k2 = KernelId("k2")
    coord.assign_kernel(k1, 0)
    coord.assign_kernel(k2, 1)
    router = CrossGpuK2KRouter(coord)
    msg = make_test_k2k_message(k1, k2)
    decision = router.route_message(k1, k2, msg)
    assert decision.kind == RoutingKind.DIRECT_P2P, "Expected DirectP2P routing"
    assert decision.source_device == 0
    assert decision.dest_device == 1


def test_router_pending_messages():
    coord = MultiGpuBuilder().enable_p2p(True).build()
    dev0 = DeviceInfo(0, "GPU 0", Backend.CUDA)
    dev0.p2p_capable = True
    dev1 = DeviceInfo(1, "GPU 1", Backend.CUDA)
    dev1.p2p_capable = True
    coord.register_device(dev0)
    coord.register_device(dev1)
    k1 = KernelId("k1")
    k2 = KernelId("k2")
    coord.assign_kernel(k1, 0)
    coord.assign_kernel(k2, 1)
    router = CrossGpuK2KRouter(coord)
    for _ in range(3):
        msg = make_test_k2k_message(k1, k2)
        router.route_message(k1, k2, msg)
    assert router.stats().messages_pending == 3
    pending = router.drain_pending(0, 1)
    assert len(pending) == 3
    assert router.stats().messages_pending == 0


def test_router_stats():
    coord = MultiGpuBuilder().build()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.CUDA))
    k1 = KernelId("k1")
    k2 = KernelId("k2")
    coord.assign_kernel(k1, 0)
    coord.assign_kernel(k2, 0)
    router = CrossGpuK2KRouter(coord)
    stats = router.stats()
    assert stats.messages_routed == 0
    assert stats.bytes_transferred == 0
    assert stats.routing_failures == 0
