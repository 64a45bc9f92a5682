"""Placement bench: figures as one JSON object, then one `ratio:` line.

Section "strategies": `MultiGpuCoordinator.select_device` calls per second
for each load-balancing strategy, 8 devices, 10k kernels placed (goal: at
least 200k/s for the built-in strategies), plus atomic place+remove pairs.
Baseline, measured in the same run on the same registry: the seed's
select_device algorithm (ringkernel's multi_gpu.rs) written out in Python. It
builds every device's status first, scanning the whole kernel map once per
device, so its cost grows with the kernels placed: the baseline shows what
keeping per-device kernel sets and counts buys, not a language difference.

Sections are functions returning (figures, ratio text); add one to SECTIONS.

    python bench/placement.py [--section strategies] [--seconds 0.5]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable

from vkmulti import (Backend, DeviceInfo, LaunchOptions, LoadBalancingStrategy, MultiGpuConfig,
                     MultiGpuCoordinator)

S = LoadBalancingStrategy
BUILT_IN = (S.FIRST_AVAILABLE, S.LEAST_LOADED, S.ROUND_ROBIN, S.MEMORY_BASED, S.COMPUTE_CAPABILITY)
GOAL_PER_SECOND = 200_000


def rate(fn: Callable[[], object], seconds: float, batch: int = 1000) -> float:
    """Calls per second of fn, over about `seconds` (after one warm-up batch)."""
    for _ in range(batch):
        fn()
    calls, t0 = 0, time.perf_counter()
    while True:
        for _ in range(batch):
            fn()
        calls += batch
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return calls / elapsed


def populated(strategy: LoadBalancingStrategy, devices: int, kernels: int) -> MultiGpuCoordinator:
    """A coordinator with `devices` devices of distinct memory and compute
    capability and `kernels` kernels spread over them (room left on each)."""
    coord = MultiGpuCoordinator(MultiGpuConfig(load_balancing=strategy, max_kernels_per_device=4 * kernels))
    for i in range(devices):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.VULKAN, total_memory=80 << 30,
                                         available_memory=(40 + 3 * i) << 30,
                                         compute_capability=(8 + i % 2, i % 3), p2p_capable=True))
    for k in range(kernels):
        coord.assign_kernel(f"kernel-{k}", (k * 7) % devices)
    if strategy is S.CUSTOM:
        coord.set_custom_selector(lambda statuses, options: min(
            (s for s in statuses if s.available), key=lambda s: s.kernel_count).info.index)
    return coord


class SeedSelect:
    """ringkernel's select_device as the seed runs it, over a snapshot of the
    coordinator: statuses for every device (kernel lists by scanning the map),
    the preferred filter, then the strategy's rule (min_by: first of equal
    minima; max_by: last of equal maxima; 0 when nothing qualifies)."""

    def __init__(self, coord: MultiGpuCoordinator, strategy: LoadBalancingStrategy):
        self.infos = coord.devices()
        self.kmap = coord.kernel_map()
        self.counts = [s.kernel_count for s in coord.get_all_status()]
        self.max = coord.config.max_kernels_per_device
        self.strategy = strategy
        self.rr = 0

    def statuses(self) -> list[dict]:
        out = []
        for idx, info in enumerate(self.infos):
            c = self.counts[idx]
            out.append({"info": info, "kernel_count": c,
                        "kernels": [k for k, d in self.kmap.items() if d == idx],
                        "available": c < self.max, "load": c / self.max})
        return out

    def select(self, options: LaunchOptions | None = None) -> int:
        cands = self.statuses()
        avail = [s for s in cands if s["available"]]
        if self.strategy is S.FIRST_AVAILABLE:
            return cands[0]["info"].index
        if self.strategy is S.LEAST_LOADED:
            return min(avail, key=lambda s: s["kernel_count"])["info"].index if avail else 0
        if self.strategy is S.ROUND_ROBIN:
            if not avail:
                return cands[0]["info"].index
            i = avail[self.rr % len(avail)]["info"].index
            self.rr += 1
            return i
        if self.strategy is S.MEMORY_BASED:
            best = None
            for s in avail:
                if best is None or s["info"].available_memory >= best["info"].available_memory:
                    best = s
            return best["info"].index if best else 0
        best = None
        for s in avail:
            cc = s["info"].compute_capability or (0, 0)
            if best is None or cc >= (best["info"].compute_capability or (0, 0)):
                best = s
        return best["info"].index if best else 0


def strategies_section(args: argparse.Namespace) -> tuple[dict, str]:
    devices, kernels, seconds = args.devices, args.kernels, args.seconds
    figures: dict = {"devices": devices, "kernels_placed": kernels}
    opts = LaunchOptions()
    for strategy in BUILT_IN + (S.CUSTOM,):
        coord = populated(strategy, devices, kernels)
        name = strategy.name.lower()
        figures[f"select_{name}_per_s"] = round(rate(coord.select_device, seconds))
        figures[f"select_{name}_with_options_per_s"] = round(rate(lambda: coord.select_device(opts), seconds / 2))
        if strategy is not S.CUSTOM:
            seed = SeedSelect(coord, strategy)
            figures[f"seed_select_{name}_per_s"] = round(rate(seed.select, seconds / 2, batch=5))
            figures[f"select_{name}_over_seed"] = round(figures[f"select_{name}_per_s"]
                                                        / figures[f"seed_select_{name}_per_s"], 1)
    coord = populated(S.LEAST_LOADED, devices, kernels)
    n = [0]

    def place_remove() -> None:
        kid = f"extra-{n[0] % 64}"
        n[0] += 1
        coord.place_kernel(kid)
        coord.remove_kernel(kid)
    figures["place_and_remove_pairs_per_s"] = round(rate(place_remove, seconds))
    slowest = min(BUILT_IN, key=lambda s: figures[f"select_{s.name.lower()}_per_s"])
    worst = figures[f"select_{slowest.name.lower()}_per_s"]
    gain = min(figures[f"select_{s.name.lower()}_over_seed"] for s in BUILT_IN)
    figures["slowest_built_in_per_s"] = worst
    text = (f"select_device slowest built-in strategy ({slowest.name}) {worst:,} calls/s "
            f"(goal >= {GOAL_PER_SECOND:,}: {'met' if worst >= GOAL_PER_SECOND else 'NOT met'}), "
            f">= {gain:.0f}x the seed's algorithm in Python on the same {kernels:,} kernels; "
            f"CUSTOM {figures['select_custom_per_s']:,}/s")
    return figures, text


SECTIONS: dict[str, Callable[[argparse.Namespace], tuple[dict, str]]] = {"strategies": strategies_section}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--section", action="append", choices=sorted(SECTIONS),
                        help="run only this section (repeatable); default: all")
    parser.add_argument("--seconds", type=float, default=0.5, help="time per figure")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--kernels", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.devices < 1 or args.kernels < 0:
        parser.error("--seconds must be > 0, --devices >= 1, --kernels >= 0")
    figures: dict = {}
    ratios = []
    for name in args.section or list(SECTIONS):
        f, text = SECTIONS[name](args)
        figures |= f
        ratios.append(text)
    print(json.dumps(figures, indent=2))
    print("ratio: " + "; ".join(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
