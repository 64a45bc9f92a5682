"""`python -m vkmulti demo`: one frame of many SRUs rendered across every GPU, and on one GPU.

Prints the assignment per device, the per-frame time with and without
offload, the transfer method between each secondary and GPU 0 with its
measured GB/s, and the speed-up; writes the frame as a PNG. With no GPU it
runs on the virtual lavapipe pair (whose two "GPUs" share the CPU, so no
speed-up is expected there).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import numpy as np

from ..device.manager import MultiDeviceManager
from ..device.virtual import use_virtual_if_no_gpu
from ..memory.image import Image
from ..offload import ReferenceRenderer, SRUOffloadCoordinator, make_srus
from ..transfer.cross_device import CrossDeviceTransfer
from .charts import bar_chart
from .cli_args import (add_output_argument, add_virtual_argument, default_output, parse_devices, parse_loss,
                       parse_size, positive_int, print_result)
from .progress import progress
from .scenes import HEAVY_ITERATIONS, HEAVY_SIZE, LIGHT_SIZE, frame_size, frame_to_rgb8, write_png

__all__ = ["run", "print_report", "add_arguments", "check_arguments", "main", "plot_frames"]


def _measure_transfer(mgr: Any, src: int, method: str, width: int, height: int,
                      repeats: int = 3) -> tuple[float, int]:
    """Best time of moving a width x height RGBA16F image from GPU `src` to GPU 0 with `method`."""
    a = Image(mgr.slot(src), width, height)
    b = Image(mgr.primary, width, height)
    x = CrossDeviceTransfer(mgr.slot(src), mgr.primary, method)
    try:
        x.run(src_image=a, dst_image=b, timeout=120)   # warm: the ring is made on first use
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            x.run(src_image=a, dst_image=b, timeout=120)
            best = min(best, time.perf_counter() - t0)
        return best, a.nbytes
    finally:
        x.destroy()
        a.destroy()
        b.destroy()


def run(args: argparse.Namespace, note: str | None) -> dict[str, Any]:
    """Render the demo frame with and without offload; returns the figures (also printed)."""
    width, height = frame_size(args)
    srus = make_srus(args.srus, width, height, heavy=args.heavy)
    out: dict[str, Any] = {"note": note, "virtual": note is not None, "srus": len(srus), "size": [width, height],
                           "frames": args.frames, "heavy": bool(args.heavy)}
    mgr = MultiDeviceManager.create(enabled=True, device_indices=args.devices)
    owned: list[Any] = []        # destroyed in reverse order: coordinators before the frames they write

    def factory(ctx: Any) -> ReferenceRenderer:
        return ReferenceRenderer(ctx.slot)
    try:
        frame_multi = Image(mgr.primary, width, height)
        frame_single = Image(mgr.primary, width, height)
        multi = SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory)
        single = SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory, devices=[0])
        owned += [frame_multi, frame_single, multi, single]
        report = multi.render_frame(srus, frame_multi)      # warm-up: pipelines, targets, rings
        single.render_frame(srus, frame_single)
        t_multi, t_single = [], []
        with progress(args.frames, "demo frames", quiet=bool(args.json)) as advance:
            for _ in range(args.frames):
                t0 = time.perf_counter()
                report = multi.render_frame(srus, frame_multi)
                t1 = time.perf_counter()
                single.render_frame(srus, frame_single)
                t2 = time.perf_counter()
                t_multi.append(t1 - t0)
                t_single.append(t2 - t1)
                advance(1)
        pixels = frame_multi.download()
        identical = bool(np.array_equal(pixels, frame_single.download()))

        cost = {s.sru_id: s.render_cost for s in srus}
        total = sum(cost.values())
        loads = report.device_loads(mgr.device_count)
        out["devices"] = [{"index": s.index, "name": s.name, "srus": loads[s.index],
                           "cost_share": sum(cost[i] for i in loads[s.index]) / total} for s in mgr.slots]
        out["frames_ms"] = {"offload": [t * 1e3 for t in t_multi], "single": [t * 1e3 for t in t_single]}
        out["frame_ms_offload"] = statistics.median(t_multi) * 1e3
        out["frame_ms_single"] = statistics.median(t_single) * 1e3
        out["speedup"] = out["frame_ms_single"] / out["frame_ms_offload"]
        out["offloaded_bytes_per_frame"] = report.transferred_bytes
        out["fallbacks"] = report.fallbacks
        out["identical"] = identical
        transfers = {}
        for r in report.routes:
            if r.offloaded and r.device_index not in transfers:
                sec, nbytes = _measure_transfer(mgr, r.device_index, r.transfer, width, height)
                transfers[r.device_index] = {"method": r.transfer, "bytes": nbytes, "ms": sec * 1e3,
                                             "gbps": nbytes / sec / 1e9}
        out["transfers"] = {str(k): v for k, v in transfers.items()}
    finally:
        for obj in reversed(owned):
            obj.destroy()
        mgr.destroy()
    if args.output:
        write_png(frame_to_rgb8(pixels), args.output)
        out["png"] = args.output
    return out


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def print_report(r: dict[str, Any]) -> None:
    """Print the demo's figures as a report (the JSON form has the same keys)."""
    w, h = r["size"]
    print(f"vkmulti demo: {r['srus']} SRUs in a {w}x{h} RGBA16F frame, {_gpus(len(r['devices']))}, "
          f"median of {r['frames']} frame(s){', render-heavy' if r['heavy'] else ''}")
    if r["note"]:
        print(f"note: {r['note']}")
    print("\nassignment (offload run):")
    for d in r["devices"]:
        ids = ", ".join(str(i) for i in d["srus"]) or "-"
        print(f"  GPU {d['index']} {d['name']:<28} {len(d['srus']):>3} SRUs  {d['cost_share'] * 100:5.1f}% of the "
              f"cost  [{ids}]")
    if r["fallbacks"]:
        print(f"  rendered on GPU 0 after a secondary failed: {r['fallbacks']}")
    print("\nper-frame time:")
    n = len(r["devices"])
    label = f"with offload ({n} GPU{'s' if n != 1 else ''})"
    print(f"  {label:<23} {r['frame_ms_offload']:9.2f} ms")
    print(f"  one GPU                 {r['frame_ms_single']:9.2f} ms")
    print(f"  speed-up                {r['speedup']:9.2f}x")
    if r["virtual"]:
        print("  (the virtual GPUs share this machine's CPU cores: no speed-up is expected from them)")
    if r["transfers"]:
        mb = r["offloaded_bytes_per_frame"] / 1e6
        print(f"\ntransfers to GPU 0 ({mb:.1f} MB of SRU images per frame):")
        for src, t in r["transfers"].items():
            print(f"  GPU {src} -> GPU 0  {t['method']:<13} {t['gbps']:6.2f} GB/s  "
                  f"({t['bytes'] / 1e6:.1f} MB frame-sized image in {t['ms']:.2f} ms)")
    else:
        print("\nno SRU was offloaded (one GPU): no transfers")
    print(f"\nframe with offload identical to the one-GPU frame: {'yes' if r['identical'] else 'NO'}")
    if r.get("png"):
        print(f"wrote {r['png']}")
    if r.get("plot"):
        print(f"wrote {r['plot']}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's options, --lose-gpu (failover_drill.py) and --ray (cluster_demo.py) included."""
    p.add_argument("--srus", type=positive_int, default=16, help="number of SRUs in the frame (default 16)")
    p.add_argument("--size", type=parse_size, default=None, metavar="WxH",
                   help=f"frame size (default {LIGHT_SIZE[0]}x{LIGHT_SIZE[1]}, "
                        f"{HEAVY_SIZE[0]}x{HEAVY_SIZE[1]} with --heavy)")
    p.add_argument("--frames", type=positive_int, default=3, help="timed frames per configuration (default 3)")
    p.add_argument("--devices", type=parse_devices, default=None, metavar="I,J,...",
                   help="physical devices to use, primary first (default: all)")
    add_output_argument(p, "--output", image=True, default=default_output("vkmulti-demo.png"), metavar="PATH",
                        help="PNG of the frame (with --lose-gpu: the last frame) to write (default "
                             "vkmulti-demo.png in the temporary folder, %(default)s; '' to skip)")
    p.add_argument("--heavy", action="store_true",
                   help=f"render-heavy SRUs ({HEAVY_ITERATIONS[0]}-{HEAVY_ITERATIONS[1]} steps per pixel) "
                        f"for real GPUs")
    add_output_argument(p, "--plot", image=True, default=None, metavar="PNG",
                   help="also write a chart of every timed frame's time, with offload and on one GPU")
    p.add_argument("--json", action="store_true", help="print the figures as JSON (no progress bar)")
    add_virtual_argument(p)
    p.add_argument("--lose-gpu", type=parse_loss, default=None, metavar="GPU@FRAME",
                   help="failover drill: render --frames frames and lose that GPU during that frame (through "
                        "vkmulti.testing.lose_device); every frame is checked against the one-GPU frame")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="render across a Ray cluster (HEAD:PORT, ray://HEAD:PORT, or 'auto' to start a local Ray); "
                        "needs pip install 'vkmulti[cluster]'")


def check_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The checks of the demo's options that every form of it (plain, --lose-gpu, --ray) shares:
    parser.error (exit 2, one line) before any rendering. (Output paths are checked
    when the line is parsed: add_output_argument.)"""
    if args.size is not None:
        try:
            make_srus(args.srus, *args.size)
        except ValueError as exc:
            parser.error(str(exc))
    if args.ray is not None and args.lose_gpu is not None:
        parser.error("--lose-gpu drills one machine's GPUs; it cannot be combined with --ray")
    if args.plot and args.lose_gpu is not None:
        parser.error("--plot charts the timed frames of the demo; the --lose-gpu drill has none")


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The `demo` subcommand on this machine's GPUs (the CLI has run check_arguments)."""
    note = use_virtual_if_no_gpu(args.virtual)
    try:
        r = run(args, note)
    except (ValueError, IndexError) as exc:
        parser.error(str(exc))
    if args.plot:
        plot_frames(r, args.plot)
        r["plot"] = args.plot
    print_result(r, args.json, print_report)
    return 0


def plot_frames(r: dict[str, Any], path: str) -> str:
    """A bar chart of each timed frame, with offload and on one GPU (vkmulti.charts);
    the title names the devices. Returns the library that drew it."""
    n = len(r["devices"])
    series = [f"with offload ({_gpus(n)})", "one GPU"]
    frames = [f"frame {i + 1}" for i in range(len(r["frames_ms"]["offload"]))]
    values = {}
    for i, f in enumerate(frames):
        values[(f, series[0])] = r["frames_ms"]["offload"][i]
        values[(f, series[1])] = r["frames_ms"]["single"][i]
    names = ", ".join(dict.fromkeys(d["name"] for d in r["devices"]))
    w, h = r["size"]
    return bar_chart(frames, series, values, title=f"vkmulti demo: {r['srus']} SRUs, {w}x{h} frame",
                     ylabel="ms per frame", xlabel="timed frame", path=path,
                     machine=f"{_gpus(n)}: {names}" + (" (virtual)" if r["virtual"] else ""))
