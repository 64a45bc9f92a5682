"""Bench of vkmulti.cluster on one machine: a local Ray cluster of N nodes (default 2) vs one node.

Starts a head and N-1 worker nodes on 127.0.0.1 (Ray's cluster test
utilities), each offering this machine's Vulkan GPUs (the virtual lavapipe
pair with --virtual 2, the default here) as `vk_gpu`, and renders the demo's
SRU frame three ways, round by round so drift hits all alike:

- `local`: this process alone, no Ray (SRUOffloadCoordinator over its GPUs)
- `one_node`: through Ray on the driver's own node (images through shared memory)
- `cluster`: through Ray on every node (images of other nodes over the object store's network path)

and a frame of tiny SRUs (8x8 pixels, 1 step) whose time is almost all
fixed overhead; then the reference Jacobi stencil (256x1024 int32 cells, 48
steps) without Ray, on one node and on every node. Prints one JSON object
(per-frame and per-step times, overhead per frame, per step and per node,
bytes moved, the measured node-to-driver and node-to-node links, the
planner's predicted finish times) and a ratio line: cluster / local per
frame. The nodes share this machine's cores, so the ratio shows the cost of
going through the cluster, not the speed-up real hosts would give (see
docs/explanation/cluster.md for predicting that).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # keep Ray on 127.0.0.1


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 3)


def local_renderer(srus: list, width: int, height: int):
    """A closure rendering the frame with vkmulti alone on this machine's GPUs; returns (render, close)."""
    from vkmulti import MultiDeviceManager, ReferenceRenderer, SRUOffloadCoordinator
    from vkmulti import Image

    mgr = MultiDeviceManager.create(enabled=True)
    frame = Image(mgr.primary, width, height)
    co = SRUOffloadCoordinator(mgr, secondary_renderer_factory=lambda ctx: ReferenceRenderer(ctx.slot))

    def render() -> float:
        t0 = time.perf_counter()
        co.render_frame(srus, frame)
        return time.perf_counter() - t0

    def close() -> np.ndarray:
        pixels = frame.download()
        co.destroy()
        frame.destroy()
        mgr.destroy()
        return pixels
    return render, close


def tiny_srus(count: int) -> list:
    from vkmulti import ReferenceSRU

    return [ReferenceSRU(i, 8, 8, x=8 * i, y=0, seed=i, iterations=1) for i in range(count)]


def local_stencil_step_s(field: np.ndarray, top: np.ndarray, bottom: np.ndarray,
                         steps: int) -> tuple[float, np.ndarray]:
    """Seconds per step of `steps` stencil steps on this machine's GPUs without Ray (one StencilSlab;
    the first step, which builds the pipelines, untimed) and the field after them."""
    from vkmulti import MultiDeviceManager
    from vkmulti.cluster import StencilSlab

    with MultiDeviceManager.create(enabled=True) as mgr:
        slab = StencilSlab(mgr, field, top, bottom, [1.0] * mgr.device_count)
        try:
            slab.step(None, None)                     # warm: pipelines
            t0 = time.perf_counter()
            for _ in range(steps - 1):
                slab.step(None, None)
            out = slab.field()
            return (time.perf_counter() - t0) / (steps - 1), out
        finally:
            slab.destroy()


def node_split(frames: list, nodes: dict) -> dict:
    """Median per-node figures over frames: agent time, Ray's share of the round trip, bytes."""
    out = {}
    for node_id in nodes:
        reps = [f.nodes[node_id] for f in frames if node_id in f.nodes]
        if not reps:
            continue
        out[node_id[:8]] = {
            "local": reps[0].local, "srus": len(reps[-1].srus),
            "render_ms": _ms([r.render_s for r in reps]), "readback_ms": _ms([r.readback_s for r in reps]),
            "agent_ms": _ms([r.agent_s for r in reps]), "round_trip_ms": _ms([r.round_trip_s for r in reps]),
            "ray_overhead_ms": _ms([r.round_trip_s - r.agent_s for r in reps]), "bytes": reps[-1].nbytes}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2, help="Ray nodes on this machine (default 2)")
    p.add_argument("--srus", type=int, default=16)
    p.add_argument("--size", default="640x360", help="frame WxH (default 640x360)")
    p.add_argument("--frames", type=int, default=7, help="timed frames per configuration (median)")
    p.add_argument("--virtual", type=int, default=2, help="virtual lavapipe GPUs per node (0: the real GPUs)")
    p.add_argument("--split-gpus", action="store_true",
                   help="node i drives only GPU i of this machine (VKMULTI_AGENT_DEVICES), as hosts of one GPU "
                        "each would; the no-Ray baseline still uses every GPU")
    p.add_argument("--object-store-mb", type=int, default=128)
    p.add_argument("--link-mb", type=int, default=16, help="payload of the link measurements")
    p.add_argument("--stencil", default="256x1024", help="stencil grid ROWSxCOLS (default 256x1024)")
    p.add_argument("--stencil-steps", type=int, default=48, help="stencil steps per run (default 48)")
    args = p.parse_args(argv)
    if args.nodes < 1 or args.srus < 1 or args.frames < 1 or args.virtual < 0:
        p.error("--nodes, --srus, --frames must be >= 1 and --virtual >= 0")
    from vkmulti.apps.cli_args import parse_size
    from vkmulti.offload import make_srus
    width, height = parse_size(args.size)
    try:
        args.stencil = tuple(int(v) for v in args.stencil.lower().split("x"))
        assert len(args.stencil) == 2 and args.stencil[0] >= 4 and args.stencil[1] >= 3
    except (ValueError, AssertionError):
        p.error(f"--stencil must look like 256x1024 (>= 4 rows, >= 3 columns), got {args.stencil!r}")
    if args.stencil_steps < 2:
        p.error("--stencil-steps must be >= 2")
    if args.virtual:
        from vkmulti.testing import install_virtual_gpus
        install_virtual_gpus(args.virtual)           # the node processes inherit it
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        print("bench/cluster.py needs Ray: pip install 'vkmulti[cluster]'", file=sys.stderr)
        return 2
    from vkmulti.cluster import ClusterManager, vk_gpu_count

    gpus = vk_gpu_count()
    if args.split_gpus and args.nodes > gpus:
        p.error(f"--split-gpus gives each node its own GPU: at most {gpus} nodes here")

    def node(i: int) -> dict:
        out = dict(node_ip_address="127.0.0.1", num_cpus=1, resources={"vk_gpu": 1 if args.split_gpus else gpus},
                   object_store_memory=args.object_store_mb * 2**20)
        if args.split_gpus:
            out["env_vars"] = {"VKMULTI_AGENT_DEVICES": str(i)}
        return out
    t0 = time.perf_counter()
    c = Cluster(initialize_head=True, head_node_args=dict(node(0), include_dashboard=False))
    for i in range(1, args.nodes):
        c.add_node(**node(i))
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes(timeout=120)
    cm = None
    try:
        t1 = time.perf_counter()
        cm = ClusterManager(link_bytes=args.link_mb * 2**20)
        t2 = time.perf_counter()
        srus = make_srus(args.srus, width, height)
        one = [n for n, i in cm.nodes.items() if i.local] or [next(iter(cm.nodes))]
        render_local, close_local = local_renderer(srus, width, height)
        tiny = tiny_srus(args.srus)
        tiny_w = 8 * len(tiny)
        runs: dict[str, list] = {"local": [], "one_node": [], "cluster": [], "tiny_one_node": [],
                                 "tiny_cluster": []}
        frames: dict[str, list] = {"one_node": [], "cluster": []}
        from vkmulti.apps.progress import progress

        with progress(args.frames + 1, "cluster frames") as bar:
            for rnd in range(args.frames + 1):           # round 0 warms every path up
                tl = render_local()
                f1 = cm.render_frame(srus, width, height, nodes=one)
                fa = cm.render_frame(srus, width, height)
                g1 = cm.render_frame(tiny, tiny_w, 8, nodes=one)
                ga = cm.render_frame(tiny, tiny_w, 8)
                if rnd:
                    runs["local"].append(tl)
                    for k, f in (("one_node", f1), ("cluster", fa), ("tiny_one_node", g1), ("tiny_cluster", ga)):
                        runs[k].append(f.total_s)
                    frames["one_node"].append(f1)
                    frames["cluster"].append(fa)
                bar()
        local_pixels = close_local()
        # the stencil: per-step time without Ray, on one node through Ray, on every node
        from vkmulti.kernels.reference import jacobi_reference
        rng = np.random.default_rng(5)
        sh, sw = args.stencil
        sfield = rng.integers(0, 1 << 24, size=(sh, sw), dtype=np.int32)
        stop, sbottom = rng.integers(0, 1 << 24, size=sw, dtype=np.int32), np.zeros(sw, np.int32)
        want = jacobi_reference(sfield, stop, sbottom, args.stencil_steps)
        s_local, s_local_field = local_stencil_step_s(sfield, stop, sbottom, args.stencil_steps)
        cm.run_stencil(sfield, stop, sbottom, 2, nodes=one)          # warm every agent's pipelines
        cm.run_stencil(sfield, stop, sbottom, 2)
        s_one = cm.run_stencil(sfield, stop, sbottom, args.stencil_steps, nodes=one,
                               checkpoint_every=args.stencil_steps)
        s_all = cm.run_stencil(sfield, stop, sbottom, args.stencil_steps, checkpoint_every=args.stencil_steps)
        links = cm.measure_node_links(args.link_mb * 2**20)
        plan = cm.plan(srus)
        last = frames["cluster"][-1]
        fig = {
            "machine_note": "nodes share this machine's CPU cores and GPUs",
            "nodes": len(cm.nodes), "gpus_per_node": 1 if args.split_gpus else gpus, "gpus_local": gpus,
            "virtual": args.virtual, "srus": len(srus),
            "size": [width, height], "frames": args.frames,
            "cluster_start_s": round(t1 - t0, 2), "manager_start_s": round(t2 - t1, 2),
            "frame_ms_local": _ms(runs["local"]), "frame_ms_one_node": _ms(runs["one_node"]),
            "frame_ms_cluster": _ms(runs["cluster"]),
            "overhead_ms_one_node_vs_local": round(_ms(runs["one_node"]) - _ms(runs["local"]), 3),
            "overhead_ms_cluster_vs_one_node": round(_ms(runs["cluster"]) - _ms(runs["one_node"]), 3),
            "tiny_frame_ms_one_node": _ms(runs["tiny_one_node"]), "tiny_frame_ms_cluster": _ms(runs["tiny_cluster"]),
            "composite_ms_cluster": _ms([f.composite_s for f in frames["cluster"]]),
            "call_latency_ms": round(cm.call_latency * 1e3, 3),
            "bytes_network_per_frame": last.bytes_moved, "bytes_shared_memory_per_frame": last.bytes_zero_copy,
            "per_node_cluster": node_split(frames["cluster"], cm.nodes),
            "per_node_one_node": node_split(frames["one_node"], cm.nodes),
            "links_to_driver": {n[:8]: cm.links[n].to_dict() for n in cm.nodes},
            "node_to_node": [dict(v.to_dict(), source=v.source[:8], destination=v.destination[:8])
                             for v in links.values()],
            "throughput_gcost_s": {n[:8]: round(i.throughput / 1e9, 3) for n, i in cm.nodes.items()},
            "predicted_ms": {n[:8]: round(v * 1e3, 3) for n, v in plan.predicted.items()},
            "stencil": {
                "shape": [sh, sw], "steps": args.stencil_steps,
                "step_ms_local": round(s_local * 1e3, 3), "step_ms_one_node": round(s_one.step_s * 1e3, 3),
                "step_ms_cluster": round(s_all.step_s * 1e3, 3),
                "overhead_ms_per_step_one_node_vs_local": round((s_one.step_s - s_local) * 1e3, 3),
                "overhead_ms_per_step_cluster_vs_one_node": round((s_all.step_s - s_one.step_s) * 1e3, 3),
                "setup_ms_cluster": round(s_all.setup_s * 1e3, 1),
                "halo_bytes_per_step": s_all.halo_bytes_per_step,
                "rows": {n[:8]: v["rows"] for n, v in s_all.nodes.items()},
                "identical": bool(np.array_equal(s_all.field, want) and np.array_equal(s_one.field, want)
                                  and np.array_equal(s_local_field, want))},
            "identical_one_node": bool(np.array_equal(frames["one_node"][-1].pixels, local_pixels)),
            "identical_cluster": bool(np.array_equal(last.pixels, local_pixels)),
        }
        remote = [v for v in links.values()]
        bw = [v.bandwidth for v in remote if not math.isinf(v.bandwidth)]
        fig["node_to_node_gbps_median"] = round(statistics.median(bw) / 1e9, 3) if bw else None
        print(json.dumps(fig, indent=2))
        print(f"ratio: cluster of {fig['nodes']} nodes / this machine without Ray, per frame "
              f"{fig['frame_ms_cluster'] / fig['frame_ms_local']:.2f}x ({fig['frame_ms_cluster']:.1f} vs "
              f"{fig['frame_ms_local']:.1f} ms; one node through Ray {fig['frame_ms_one_node']:.1f} ms; fixed "
              f"overhead {fig['tiny_frame_ms_cluster']:.1f} ms per frame; "
              f"{fig['bytes_network_per_frame'] / 1e6:.2f} MB over the network at "
              f"{fig['node_to_node_gbps_median']} GB/s node to node; stencil step "
              f"{fig['stencil']['step_ms_cluster']:.2f} ms on the cluster vs {fig['stencil']['step_ms_local']:.2f} ms "
              f"without Ray, {fig['stencil']['halo_bytes_per_step']} halo bytes per step; identical: "
              f"{fig['identical_one_node'] and fig['identical_cluster'] and fig['stencil']['identical']})")
        return 0
    finally:
        if cm is not None:
            cm.destroy()
        ray.shutdown()
        c.shutdown()


if __name__ == "__main__":
    sys.exit(main())
