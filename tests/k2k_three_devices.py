"""Run by test_k2k_multihop.py in a subprocess: three virtual lavapipe GPUs (the
test session has two), a topology that forces hops, and the K2K router
forwarding hop by hop. Prints one JSON object with what it saw."""
from __future__ import annotations

import json
import os
import sys

os.environ["VKMULTI_VALIDATION"] = "1"
from vkmulti.testing import install_virtual_gpus  # noqa: E402

install_virtual_gpus(3)

import numpy as np  # noqa: E402

from vkmulti import MultiDeviceManager  # noqa: E402
from vkmulti.device.instance import drain_all_validation_messages  # noqa: E402
from vkmulti.kernels import (CrossGpuK2KRouter, GpuConnection, GpuTopology, InterconnectType as I,  # noqa: E402
                             KernelRuntime, MultiGpuCoordinator, counter_kernel)
from vkmulti.kernels.reference import (COUNTER_TAG_FORWARD, counter_initial_state, jacobi_reference,  # noqa: E402
                                       read_counter)
from vkmulti.kernels.stencil import StencilSlabs  # noqa: E402

MAX = 64


def topology(links):
    topo = GpuTopology(3)
    for a, b, kind in links:
        topo.set_connection(GpuConnection(a, b, kind))
    return topo


def counter(rt, name, device, **kw):
    return rt.launch(counter_kernel(max_sources=MAX), name, device=device, state=[counter_initial_state(MAX)], **kw)


def state(rt, k):
    s = read_counter(rt.read_state(k))
    return {"count": s.count, "sum": s.sum, "fifo_errors": s.fifo_errors, "hops_sum": s.hops_sum,
            "max_hops": s.max_hops}


def settle(rt, kernels, steps=8):
    for _ in range(steps):
        rt.step(kernels)
    rt.synchronize()


def chain_with_kernels_everywhere(mgr, out):
    coord = MultiGpuCoordinator.from_manager(mgr)
    coord.set_topology(topology([(0, 1, I.NVLINK), (1, 2, I.PCIE), (0, 2, I.NONE)]))
    rt = KernelRuntime(coord, mgr, max_kernels=MAX)
    router = CrossGpuK2KRouter(coord, rt)
    try:
        c = counter(rt, "c", 2)
        m = counter(rt, "m", 1)
        f = counter(rt, "f", 0)
        a = counter(rt, "a", 0, params=[c.address])
        e = counter(rt, "e", 2, params=[f.address])
        b = counter(rt, "b", 0, params=[m.address])
        for v in range(1, 31):
            rt.send(a, np.array([v], np.uint32), tag=COUNTER_TAG_FORWARD)
            rt.send(e, np.array([100 + v], np.uint32), tag=COUNTER_TAG_FORWARD)
            rt.send(b, np.array([1000 + v], np.uint32), tag=COUNTER_TAG_FORWARD)
        decisions = [router.route_message("a", "c", np.array([5000 + i], np.uint32)) for i in range(5)]
        out["decision_a_c"] = {"kind": decisions[0].kind.name, "path": list(decisions[0].path),
                               "total_hops": decisions[0].total_hops}
        back = router.route(2, 0)
        out["decision_2_0"] = {"kind": back.kind.name, "path": list(back.path)}
        kernels = [a, b, c, e, f, m]
        settle(rt, kernels, 10)
        out["c"], out["f"], out["m"] = state(rt, c), state(rt, f), state(rt, m)
        out["expected_c_sum"] = sum(range(1, 31)) + sum(5000 + i for i in range(5))
        out["expected_f_sum"] = sum(100 + v for v in range(1, 31))
        out["expected_m_sum"] = sum(1000 + v for v in range(1, 31))
        s = router.stats()
        out["stats"] = {"routed": s.messages_routed, "pending": s.messages_pending, "failures": s.routing_failures}
        out["edges"] = sorted(f"{x}->{y}" for x, y in router.edge_traffic())
    finally:
        router.detach()
        rt.destroy()


def relay_without_kernels(mgr, out):
    coord = MultiGpuCoordinator.from_manager(mgr)
    coord.set_topology(topology([(0, 1, I.NVLINK), (1, 2, I.PCIE), (0, 2, I.NONE)]))
    rt = KernelRuntime(coord, mgr, max_kernels=MAX)
    router = CrossGpuK2KRouter(coord, rt)
    try:
        c = counter(rt, "c", 2)
        a = counter(rt, "a", 0, params=[c.address])
        for v in range(1, 21):
            rt.send(a, np.array([v], np.uint32), tag=COUNTER_TAG_FORWARD)
        settle(rt, [a, c], 8)
        out["relay_c"] = state(rt, c)
        out["relay_edges"] = sorted(f"{x}->{y}" for x, y in router.edge_traffic())
    finally:
        router.detach()
        rt.destroy()


def host_mediated(mgr, out):
    coord = MultiGpuCoordinator.from_manager(mgr)
    coord.set_topology(topology([(0, 1, I.NVLINK), (1, 2, I.NONE), (0, 2, I.NONE)]))
    rt = KernelRuntime(coord, mgr, max_kernels=MAX)
    router = CrossGpuK2KRouter(coord, rt)
    try:
        c = counter(rt, "c", 2)
        a = counter(rt, "a", 0, params=[c.address])
        for v in range(1, 11):
            rt.send(a, np.array([v], np.uint32), tag=COUNTER_TAG_FORWARD)
        d = router.route_message("a", "c", np.array([7], np.uint32))
        out["host_decision"] = {"kind": d.kind.name, "source": d.source_device, "dest": d.dest_device}
        settle(rt, [a, c], 6)
        out["host_c"] = state(rt, c)
        out["host_method"] = router.transfer_method(0, 2)
    finally:
        router.detach()
        rt.destroy()


def stencil(mgr, out):
    coord = MultiGpuCoordinator.from_manager(mgr)
    coord.set_topology(topology([(0, 1, I.NVLINK), (1, 2, I.PCIE), (0, 2, I.NONE)]))
    rt = KernelRuntime(coord, mgr, max_kernels=MAX, payload_size=64)
    router = CrossGpuK2KRouter(coord, rt)
    rng = np.random.default_rng(3)
    field = rng.integers(0, 1 << 20, size=(31, 40), dtype=np.int32)
    top = np.full(40, 1 << 20, np.int32)
    try:
        fields = {}
        for devs in ([0], [0, 1, 2], [0, 2, 1], [2, 0, 1, 2, 0]):
            with StencilSlabs(rt, field, devs, top=top) as s:
                s.step(11)
                fields[str(devs)] = s.field()
        ref = jacobi_reference(field, top, np.zeros(40, np.int32), 11)
        out["stencil_identical"] = {k: bool(np.array_equal(v, ref)) for k, v in fields.items()}
    finally:
        router.detach()
        rt.destroy()


def main() -> int:
    drain_all_validation_messages()
    out: dict = {}
    mgr = MultiDeviceManager.create(enabled=True)
    try:
        out["devices"] = mgr.device_count
        chain_with_kernels_everywhere(mgr, out)
        relay_without_kernels(mgr, out)
        host_mediated(mgr, out)
        stencil(mgr, out)
    finally:
        mgr.destroy()
    out["validation_errors"] = [text for sev, text in drain_all_validation_messages() if sev == "error"][:5]
    print("\n" + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
