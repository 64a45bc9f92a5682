"""`python -m vkmulti demo --ray ADDRESS`: the SRU frame across a Ray cluster's nodes.

Renders the demo frame on every node's GPUs and on one node (the driver's,
or the best-connected), prints each node's devices, measured throughput and
link, the per-node and per-GPU assignment, the per-frame times and the bytes
that crossed the network, and checks that both frames are identical.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import numpy as np

__all__ = ["run", "print_report", "main"]


def _one_node(cm: Any) -> str:
    """The node the one-node frame uses: the driver's own, else the best-connected."""
    from ..cluster.planner import node_order

    return node_order(list(cm.nodes[n] for n in cm.nodes if n not in cm.lost), cm.links)[0].node_id


def run(cm: Any, args: argparse.Namespace, note: str | None) -> dict[str, Any]:
    """Render the demo frame on the whole cluster and on one node; returns the figures."""
    from .demo import HEAVY_SIZE, LIGHT_SIZE, make_srus

    width, height = args.size or (HEAVY_SIZE if args.heavy else LIGHT_SIZE)
    srus = make_srus(args.srus, width, height, heavy=args.heavy)
    cost = {s.sru_id: s.render_cost for s in srus}
    total_cost = sum(cost.values())
    cm.render_frame(srus, width, height)                 # warm-up: render targets on every GPU
    single = _one_node(cm)
    cm.render_frame(srus, width, height, nodes=[single])
    t_all, t_one, frames = [], [], []
    for _ in range(args.frames):
        f = cm.render_frame(srus, width, height)
        g = cm.render_frame(srus, width, height, nodes=[single])
        frames.append(f)
        t_all.append(f.total_s)
        t_one.append(g.total_s)
    last = frames[-1]
    out: dict[str, Any] = {"note": note, "address": args.ray, "srus": len(srus), "size": [width, height],
                           "frames": args.frames, "heavy": bool(args.heavy), "cluster": cm.describe(),
                           "one_node": single}
    out["assignment"] = [dict(r.to_dict(), cost_share=sum(cost[i] for i in r.srus) / total_cost,
                              gpu_srus={str(gi): [i for i in r.srus if r.gpu[i] == gi]
                                        for gi in sorted(set(r.gpu.values()))})
                         for r in last.nodes.values()]
    out["frame_ms_cluster"] = statistics.median(t_all) * 1e3
    out["frame_ms_one_node"] = statistics.median(t_one) * 1e3
    out["speedup"] = out["frame_ms_one_node"] / out["frame_ms_cluster"]
    out["bytes_network_per_frame"] = last.bytes_moved
    out["bytes_shared_memory_per_frame"] = last.bytes_zero_copy
    out["replanned"] = {str(k): v for f in frames for k, v in f.replanned.items()}
    out["identical"] = bool(np.array_equal(last.pixels, g.pixels))
    if args.output:
        from PIL import Image as PILImage

        from .demo import frame_to_rgb8

        PILImage.fromarray(frame_to_rgb8(last.pixels), "RGB").save(args.output)
        out["png"] = args.output
    return out


def _link_text(link: dict | None) -> str:
    if link is None:
        return "link not measured"
    if link["bandwidth_gbps"] is None:
        return f"shared memory with the driver ({link['latency_ms']:.2f} ms per object)"
    return f"{link['bandwidth_gbps']:.2f} GB/s to the driver, {link['latency_ms']:.2f} ms per object"


def print_report(r: dict[str, Any]) -> None:
    c = r["cluster"]
    nodes = c["nodes"]
    w, h = r["size"]
    gpus = sum(len(n["devices"]) for n in nodes)
    print(f"vkmulti cluster demo ({r['address']}): {r['srus']} SRUs in a {w}x{h} RGBA16F frame on "
          f"{len(nodes)} node(s), {gpus} GPU(s), median of {r['frames']} frame(s)"
          f"{', render-heavy' if r['heavy'] else ''}")
    if r["note"]:
        print(f"note: {r['note']}")
    print("\nnodes:")
    for n in nodes:
        tag = "driver's node" if n["local"] else ""
        print(f"  node {n['node_id'][:8]} {n['address']:<15} {tag:<13} {len(n['devices'])} GPU(s) "
              f"{n['throughput'] / 1e9:7.2f} Gcost/s  {_link_text(n['link'])}")
        print(f"      {', '.join(n['devices'])}")
        if n["gpu_links"]:
            print("      GPU links (measured): " + ", ".join(
                f"{g['source']}->{g['destination']} {g['method']} {g['bandwidth_gbps']:.1f} GB/s"
                for g in n["gpu_links"]))
        elif n.get("topology_note"):
            print(f"      ({n['topology_note']})")
        if n["lost"]:
            print(f"      LOST: {n['lost']}")
    for label, why in c["skipped"].items():
        print(f"  {label} skipped: {why}")
    print("\nassignment (last cluster frame):")
    for a in r["assignment"]:
        per_gpu = "  ".join(f"GPU {gi}: [{', '.join(str(i) for i in ids)}]" for gi, ids in a["gpu_srus"].items())
        print(f"  node {a['node_id'][:8]} {len(a['srus']):>3} SRUs {a['cost_share'] * 100:5.1f}% of the cost  "
              f"{per_gpu}")
        print(f"      render {a['render_ms']:8.2f} ms  read-back {a['readback_ms']:7.2f} ms  agent "
              f"{a['agent_ms']:8.2f} ms  round trip {a['round_trip_ms']:8.2f} ms  "
              f"{a['bytes'] / 1e6:6.2f} MB {'(shared memory)' if a['local'] else 'over the network'}")
    if r["replanned"]:
        print(f"  re-planned after a node was lost: SRUs {', '.join(r['replanned'])}")
    print("\nper-frame time:")
    print(f"  cluster ({len(nodes)} nodes)      {r['frame_ms_cluster']:9.2f} ms")
    print(f"  one node ({r['one_node'][:8]})   {r['frame_ms_one_node']:9.2f} ms")
    print(f"  speed-up                {r['speedup']:9.2f}x")
    if len({n['address'] for n in nodes}) == 1 and len(nodes) > 1:
        print("  (these nodes share one machine's CPU and GPUs: no speed-up is expected from them)")
    print(f"\nbytes per frame: {r['bytes_network_per_frame'] / 1e6:.2f} MB over the network, "
          f"{r['bytes_shared_memory_per_frame'] / 1e6:.2f} MB through shared memory")
    print(f"frame on the cluster identical to the one-node frame: {'yes' if r['identical'] else 'NO'}")
    if r.get("png"):
        print(f"wrote {r['png']}")


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`demo --ray ADDRESS` (demo.main has checked the shared options)."""
    from ..cluster.connection import parse_address
    from ..cluster.errors import ClusterError

    if args.devices is not None:
        parser.error("--devices picks GPUs of this machine; with --ray every node's agent uses all of its GPUs")
    try:
        addr = parse_address(args.ray)
    except ClusterError as exc:
        parser.error(str(exc))
    note, virtual = None, 0
    if addr.kind == "auto":
        from ..device.virtual import use_virtual_if_no_gpu

        note = use_virtual_if_no_gpu(args.virtual)      # the local Ray's node inherits the driver set-up
    elif args.virtual:
        virtual = args.virtual
        note = f"every node's agent uses {virtual} virtual lavapipe GPUs (--virtual)"
    from ..cluster.manager import ClusterManager

    try:
        cm = ClusterManager.connect(args.ray, virtual_gpus=virtual)
    except ClusterError as exc:
        print(f"vkmulti demo: {exc}", file=sys.stderr)
        return 2
    try:
        r = run(cm, args, note)
    except (ClusterError, ValueError) as exc:
        print(f"vkmulti demo: {exc}", file=sys.stderr)
        return 2
    finally:
        cm.destroy()
    if args.json:
        json.dump(r, sys.stdout, indent=2)
        print()
    else:
        print_report(r)
    return 0
