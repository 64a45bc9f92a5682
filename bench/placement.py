"""Bench of placement. Section `adaptive_section`: the adaptive SRU mode on an unequal pair.

Adaptive section: one frame of ReferenceSRUs rendered three ways, a frame of
each in turn per round (so load on the machine hits all three alike):
GPU 0 alone, the equal-cost split over GPUs 0 and 1 (SRUOffloadCoordinator
default), and the adaptive mode (measured, damped speed weights). The pair is
made unequal with ReferenceRenderer(slowdown=k) on --slow-device (k x the GPU
work per SRU, same pixels), or is unequal by nature (a GPU beside lavapipe:
pass --slowdown 1). Prints one JSON object, then the ratio line: the adaptive
frame time over the better of the equal split and GPU 0 alone (goal <= 0.8).

On the virtual lavapipe pair both "GPUs" share this machine's CPU cores, so
work moved to the slow device still slows the fast one: adaptive beats the
equal split there but GPU 0 alone stays the fastest; the goal is for real GPUs.

  python bench/placement.py --virtual 2                       # CPU VM
  python bench/placement.py --heavy --slowdown 2              # two real GPUs made unequal
  python bench/placement.py --slowdown 1 --size 1920x1080 --iterations 2000,6000   # GPU + lavapipe
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np


def add_adaptive_arguments(p: argparse.ArgumentParser) -> None:
    """The adaptive section's options."""
    p.add_argument("--virtual", type=int, default=0, metavar="N", help="use N virtual lavapipe GPUs")
    p.add_argument("--devices", type=_indices, default=None, metavar="I,J",
                   help="physical devices by enumeration index, the first is GPU 0 (default: all)")
    p.add_argument("--slowdown", type=int, default=4, help="dispatches per SRU on the slow device (default 4)")
    p.add_argument("--slow-device", type=int, default=1, help="which slot is slowed (default 1)")
    p.add_argument("--srus", type=int, default=64, help="SRUs in the frame (default 64)")
    p.add_argument("--size", type=_size, default=None, metavar="WxH",
                   help="frame size (default 640x360, --heavy 3840x2160)")
    p.add_argument("--heavy", action="store_true", help="render-heavy SRUs for real GPUs")
    p.add_argument("--iterations", type=_pair, default=None, metavar="LO,HI",
                   help="steps per pixel range of the SRUs (overrides the light/heavy preset)")
    p.add_argument("--warmup", type=int, default=12, help="rounds before timing, adaptive converges (default 12)")
    p.add_argument("--rounds", type=int, default=8, help="timed rounds, medians reported (default 8)")


def _size(text: str) -> tuple[int, int]:
    from vkmulti.demo import parse_size
    return parse_size(text)


def _indices(text: str) -> list[int]:
    from vkmulti.demo import parse_devices
    return parse_devices(text)


def _pair(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI, got {text!r}") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI, got {text!r}")
    return lo, hi


def _srus(args: argparse.Namespace, width: int, height: int) -> list[Any]:
    from dataclasses import replace

    from vkmulti.demo import make_srus

    srus = make_srus(args.srus, width, height, heavy=args.heavy)
    if args.iterations is not None:
        rng = np.random.default_rng(7)
        lo, hi = args.iterations
        srus = [replace(s, iterations=int(rng.integers(lo, hi + 1))) for s in srus]
    return srus


def adaptive_section(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Frame times of GPU 0 alone, the equal split and the adaptive mode on an unequal pair.

    Returns (figures, ratio text)."""
    from vkmulti import MultiDeviceManager, ReferenceRenderer, SRUOffloadCoordinator
    from vkmulti.images import Image

    if args.slowdown < 1:
        raise SystemExit(f"--slowdown must be >= 1, got {args.slowdown}")
    width, height = args.size or ((3840, 2160) if args.heavy else (640, 360))
    srus = _srus(args, width, height)
    mgr = MultiDeviceManager.create(enabled=True, device_indices=args.devices)
    owned: list[Any] = []
    try:
        if mgr.device_count < 2:
            raise SystemExit(f"the adaptive section needs two GPUs, found {mgr.device_count} "
                             f"(use --virtual 2 on a machine without GPUs)")
        if not 0 <= args.slow_device < mgr.device_count:
            raise SystemExit(f"--slow-device {args.slow_device} is not a slot of the {mgr.device_count} GPUs")

        def factory(ctx: Any) -> ReferenceRenderer:
            return ReferenceRenderer(ctx.slot, slowdown=args.slowdown if ctx.slot.index == args.slow_device else 1)

        frames = {name: Image(mgr.primary, width, height) for name in ("alone", "equal", "adaptive")}
        owned += list(frames.values())
        pair = [0, 1]
        coords = {"alone": SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory, devices=[0]),
                  "equal": SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory, devices=pair),
                  "adaptive": SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory, devices=pair,
                                                    adaptive=True)}
        owned += list(coords.values())
        times: dict[str, list[float]] = {name: [] for name in coords}
        reports: dict[str, Any] = {}
        converge: list[list[float | None]] = []
        for k in range(args.warmup + args.rounds):
            for name, c in coords.items():
                t0 = time.perf_counter()
                reports[name] = c.render_frame(srus, frames[name])
                if k >= args.warmup:
                    times[name].append((time.perf_counter() - t0) * 1e3)
            converge.append(coords["adaptive"].measured_weights)
        pixels = {name: f.download() for name, f in frames.items()}
        identical = all(np.array_equal(pixels["alone"], pixels[n]) for n in ("equal", "adaptive"))
        cost = {s.sru_id: s.render_cost for s in srus}
        total = sum(cost.values())
        ms = {name: statistics.median(t) for name, t in times.items()}

        def shares(rep: Any) -> list[float]:
            return [round(sum(cost[i] for i in ids) / total, 4) for ids in rep.device_loads(2)]

        fig: dict[str, Any] = {
            "devices": [mgr.slot(d).name for d in pair], "slowdown": args.slowdown,
            "slow_device": args.slow_device, "srus": len(srus), "size": [width, height],
            "warmup_rounds": args.warmup, "timed_rounds": args.rounds,
            "frame_ms_gpu0_alone": round(ms["alone"], 3), "frame_ms_equal_split": round(ms["equal"], 3),
            "frame_ms_adaptive": round(ms["adaptive"], 3),
            "adaptive_over_equal": round(ms["adaptive"] / ms["equal"], 3),
            "adaptive_over_gpu0_alone": round(ms["adaptive"] / ms["alone"], 3),
            "cost_share_equal": shares(reports["equal"]), "cost_share_adaptive": shares(reports["adaptive"]),
            "measured_weights": coords["adaptive"].measured_weights,
            "speed_ratio_per_round": [round(ws[1] / ws[0], 4) if ws[0] and ws[1] else None for ws in converge],
            "adaptive_device_seconds_last_frame": {str(d): round(s, 6) for d, s in
                                                   reports["adaptive"].device_seconds.items()},
            "transfer_methods": sorted({r.transfer for r in reports["adaptive"].routes if r.offloaded}),
            "fallbacks": reports["adaptive"].fallbacks + reports["equal"].fallbacks,
            "identical_frames": identical,
            "frame_ms_all": {name: [round(t, 2) for t in ts] for name, ts in times.items()},
        }
        w = fig["measured_weights"]
        if w[0] is not None and w[1] is not None and w[1] > w[0]:
            fig["note"] = ("GPU 1 measured faster than GPU 0: 'alone' is GPU 0 (the coordinator composites "
                           "there); pass --devices with the faster GPU first to compare against it alone")
        best = min(ms["equal"], ms["alone"])
        ratio = (f"adaptive {ms['adaptive']:.2f} ms = {ms['adaptive'] / best:.2f}x the better of the equal split "
                 f"({ms['equal']:.2f} ms) and GPU 0 alone ({ms['alone']:.2f} ms) (target <= 0.8); "
                 f"adaptive/equal {ms['adaptive'] / ms['equal']:.2f}x; measured speed GPU1/GPU0 "
                 f"{(w[1] / w[0]) if w[0] and w[1] else float('nan'):.3f} (slowdown {args.slowdown} on GPU "
                 f"{args.slow_device}); frames identical: {'yes' if identical else 'NO'}")
        return fig, ratio
    finally:
        for obj in reversed(owned):
            obj.destroy()
        mgr.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_adaptive_arguments(parser)
    args = parser.parse_args(argv)
    if args.virtual:
        from vkmulti.testing import install_virtual_gpus
        install_virtual_gpus(args.virtual)
    figures, ratio = adaptive_section(args)
    print(json.dumps({"adaptive": figures}, indent=2))
    print(f"ratio: {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
