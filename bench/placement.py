"""Placement bench: figures as one JSON object, then one `ratio:` line.

Section "strategies": `MultiGpuCoordinator.select_device` calls per second
for each load-balancing strategy, 8 devices, 10k kernels placed (goal: at
least 200k/s for the built-in strategies), plus atomic place+remove pairs.
Baseline, measured in the same run on the same registry: the seed's
select_device algorithm (ringkernel's multi_gpu.rs) written out in Python. It
builds every device's status first, scanning the whole kernel map once per
device, so its cost grows with the kernels placed: the baseline shows what
keeping per-device kernel sets and counts buys, not a language difference.

Section "adaptive": the adaptive SRU mode on an unequal pair. One frame of
ReferenceSRUs rendered three ways, a frame of each in turn per round (so load
on the machine hits all three alike): GPU 0 alone, the equal-cost split over
GPUs 0 and 1 (SRUOffloadCoordinator's default) and the adaptive mode
(measured, damped speed weights). The pair is made unequal with
ReferenceRenderer(slowdown=k) on GPU 1 (k dispatches per SRU: real extra
shader work, same pixels; k = 2 allows at best 0.67x the faster device alone),
or is unequal by nature (a GPU beside lavapipe: --slowdown 1). Ratio: the
adaptive frame time over the better of the equal split and GPU 0 alone (goal
<= 0.8), medians, with the spread over rounds and the ratio of the best
frames (load on a shared machine only adds time).

Splitting a frame only pays between independent devices. Each lavapipe device
renders on LP_NUM_THREADS worker threads (Mesa's default: every core), so two
of them by default share every core and neither can gain from the other; the
bench sets LP_NUM_THREADS (--threads-per-device N; default: the CPUs split
over the lavapipe devices, one left to the host thread above 2 CPUs) and
states the layout in the JSON. Each timed round also renders the frame's SRUs
render-only (no transfer, no composite) on GPU 0 alone, GPU 1 alone and both at
once: "independence" (1: both at once take the slower one's time; 0: the sum)
and the best ratio those speeds allow (ideal_ratio).

Sections are functions returning (figures, ratio text); add one to SECTIONS.

    python bench/placement.py [--section strategies] [--seconds 0.5]
    python bench/placement.py --section adaptive --virtual 2               # CPU VM: 1 thread per device
    python bench/placement.py --section adaptive --heavy --iterations 10000,30000   # two GPUs
    # GPU host, after `. ../shared/gpu/lavapipe.sh` (GPU 0 = the GPU, GPU 1 = lavapipe on 15 threads):
    python bench/placement.py --section adaptive --slowdown 1 --size 1920x1080 --iterations 2000,6000
    # GPU host, two lavapipe devices of 7 threads each (copies of /tmp/lvp_hetero.json named
    # vkmulti_lvp_0.json and vkmulti_lvp_1.json, the only entries of VK_DRIVER_FILES):
    python bench/placement.py --section adaptive --size 1280x720
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

from vkmulti import (Backend, DeviceInfo, LaunchOptions, LoadBalancingStrategy, MultiGpuConfig,
                     MultiGpuCoordinator)

S = LoadBalancingStrategy
BUILT_IN = (S.FIRST_AVAILABLE, S.LEAST_LOADED, S.ROUND_ROBIN, S.MEMORY_BASED, S.COMPUTE_CAPABILITY)
GOAL_PER_SECOND = 200_000
#: steps per pixel of the adaptive section's SRUs without --heavy/--iterations: on lavapipe a tile
#: then takes ~3 ms to render against ~0.2 ms to submit, so the frame times the devices, not Python
CPU_ITERATIONS = (500, 1500)


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


def _size(text: str) -> tuple[int, int]:
    from vkmulti.apps.demo import parse_size
    return parse_size(text)


def _indices(text: str) -> list[int]:
    from vkmulti.apps.demo import parse_devices
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

    from vkmulti.offload import make_srus

    srus = make_srus(args.srus, width, height, heavy=args.heavy)
    steps = args.iterations or (None if args.heavy else CPU_ITERATIONS)
    if steps is not None:
        rng = np.random.default_rng(7)
        lo, hi = steps
        srus = [replace(s, iterations=int(rng.integers(lo, hi + 1))) for s in srus]
    return srus


def _cpus() -> int:
    """CPUs this process may run on (its affinity mask; os.cpu_count() where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _lavapipe_manifests(args: argparse.Namespace) -> int:
    """How many lavapipe devices the loader will list, from --virtual or the manifests named in
    VK_DRIVER_FILES / VK_ICD_FILENAMES; 2 when none are named (the no-GPU fallback pair)."""
    if args.virtual:
        return args.virtual
    named = os.environ.get("VK_DRIVER_FILES") or os.environ.get("VK_ICD_FILENAMES") or ""
    if not named:
        return 2
    count = 0
    for path in filter(None, named.split(os.pathsep)):
        try:
            with open(path) as f:
                lib = json.load(f)["ICD"]["library_path"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        count += "lvp" in os.path.basename(str(lib))
    return count


def thread_layout(args: argparse.Namespace) -> dict[str, Any]:
    """Set LP_NUM_THREADS (lavapipe's worker threads per device; read when a device is created,
    so before any Instance) and return the layout: --threads-per-device, else LP_NUM_THREADS from
    the environment, else the CPUs split evenly over the lavapipe devices (one CPU left to the host
    thread that submits, when there are more than two)."""
    cpus, lavapipes = _cpus(), _lavapipe_manifests(args)
    if args.threads_per_device is not None:
        threads, source = args.threads_per_device, "--threads-per-device"
    elif os.environ.get("LP_NUM_THREADS", "").strip().isdigit():
        threads, source = int(os.environ["LP_NUM_THREADS"]), "LP_NUM_THREADS from the environment"
    else:
        spare = cpus - (1 if cpus > 2 else 0)
        threads, source = max(1, spare // max(1, lavapipes)), "default: CPUs split over the lavapipe devices"
    os.environ["LP_NUM_THREADS"] = str(threads)
    return {"cpus": cpus, "lavapipe_devices_expected": lavapipes, "lp_num_threads": threads, "source": source,
            "oversubscribed": threads * lavapipes > cpus}


class RenderOnly:
    """Render-only times of the frame's SRUs on GPU 0 alone, GPU 1 alone and both at once (the
    whole frame on each, submissions interleaved; no transfer, no composite), a round of each per
    timed round of the bench so machine load hits them as it hits the frames. Independent devices
    render both at once in about the slower one's time; devices sharing the same CPU cores take
    the sum. From the speeds: the best any split can do against the faster device alone
    (ideal_ratio = t_slow / (t_fast + t_slow))."""

    def __init__(self, mgr: Any, srus: list[Any], slowdown: Callable[[int], int]):
        from vkmulti import ReferenceRenderer

        self.srus = srus
        self.renderers: list[Any] = []
        self.targets: list[list[Any]] = []
        self.times: dict[str, list[float]] = {"gpu0": [], "gpu1": [], "both": []}
        try:
            for d in (0, 1):
                self.renderers.append(ReferenceRenderer(mgr.slot(d), slowdown=slowdown(d)))
                self.targets.append([self.renderers[d].make_target(s) for s in srus])
            self._run((0, 1))   # warm-up
        except BaseException:
            self.destroy()
            raise

    def _run(self, devices: tuple[int, ...]) -> float:
        t0 = time.perf_counter()
        last = {}
        for k, s in enumerate(self.srus):
            for d in devices:
                last[d] = self.renderers[d].render(s, self.targets[d][k])
        for d in devices:
            self.renderers[d].wait(last[d])
        return (time.perf_counter() - t0) * 1e3

    def round(self) -> None:
        self.times["gpu0"].append(self._run((0,)))
        self.times["gpu1"].append(self._run((1,)))
        self.times["both"].append(self._run((0, 1)))

    def figures(self) -> dict[str, Any]:
        m = {k: statistics.median(v) for k, v in self.times.items()}
        fast, slow = min(m["gpu0"], m["gpu1"]), max(m["gpu0"], m["gpu1"])
        return {"render_ms_gpu0_alone": round(m["gpu0"], 3), "render_ms_gpu1_alone": round(m["gpu1"], 3),
                "render_ms_both_at_once": round(m["both"], 3),
                # 1: both at once take the slower one's time (independent); 0: the sum (shared cores)
                "independence": round((m["gpu0"] + m["gpu1"] - m["both"]) / fast, 3),
                "speed_gpu1_over_gpu0": round(m["gpu0"] / m["gpu1"], 4),
                "ideal_split_ms": round(fast * slow / (fast + slow), 3),
                "ideal_ratio": round(slow / (fast + slow), 3),
                "render_ms_all": {k: [round(t, 2) for t in v] for k, v in self.times.items()}}

    def destroy(self) -> None:
        for ts in self.targets:
            for t in ts:
                t.destroy()
        for r in self.renderers:
            r.destroy()
        self.targets, self.renderers = [], []


def _settled_round(ratios: list[float | None], tolerance: float = 0.1) -> int | None:
    """The first round from which the measured speed ratio stays within `tolerance` of its final
    value (None: never measured)."""
    if not ratios or ratios[-1] is None:
        return None
    final = ratios[-1]
    k = len(ratios)
    while k > 0 and ratios[k - 1] is not None and abs(ratios[k - 1] - final) <= tolerance * final:
        k -= 1
    return k


def adaptive_section(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Frame times of GPU 0 alone, the equal split and the adaptive mode on an unequal pair.

    Returns (figures, ratio text)."""
    saved = os.environ.get("LP_NUM_THREADS")
    try:
        layout = thread_layout(args)
        return _adaptive(args, layout)
    finally:   # a caller in the same process (the tests) keeps its own setting
        if saved is None:
            os.environ.pop("LP_NUM_THREADS", None)
        else:
            os.environ["LP_NUM_THREADS"] = saved


def _adaptive(args: argparse.Namespace, layout: dict[str, Any]) -> tuple[dict[str, Any], str]:
    from vkmulti import MultiDeviceManager, ReferenceRenderer, SRUOffloadCoordinator
    from vkmulti import Image
    from vkmulti.testing import use_virtual_if_no_gpu

    note = use_virtual_if_no_gpu(args.virtual)
    if args.slowdown < 1:
        raise SystemExit(f"--slowdown must be >= 1, got {args.slowdown}")
    if args.slow_device == 0 and args.slowdown > 1:
        raise SystemExit("--slow-device 0 would time the slower device as 'GPU 0 alone'; slow GPU 1, or list "
                         "the faster GPU first with --gpus")
    width, height = args.size or ((3840, 2160) if args.heavy else (640, 360))
    srus = _srus(args, width, height)
    mgr = MultiDeviceManager.create(enabled=True, device_indices=args.gpus)
    owned: list[Any] = []
    try:
        if mgr.device_count < 2:
            raise SystemExit(f"the adaptive section needs two GPUs, found {mgr.device_count} "
                             f"(use --virtual 2 on a machine without GPUs)")
        if not 0 <= args.slow_device < mgr.device_count:
            raise SystemExit(f"--slow-device {args.slow_device} is not a slot of the {mgr.device_count} GPUs")
        pair = [0, 1]
        names = [mgr.slot(d).name for d in pair]
        layout["devices"] = [{"name": n, "threads": layout["lp_num_threads"] if "llvmpipe" in n else "its own"}
                             for n in names]

        def slowdown(d: int) -> int:
            return args.slowdown if d == args.slow_device else 1

        def factory(ctx: Any) -> ReferenceRenderer:
            return ReferenceRenderer(ctx.slot, slowdown=slowdown(ctx.slot.index))

        frames = {name: Image(mgr.primary, width, height) for name in ("alone", "equal", "adaptive")}
        owned += list(frames.values())
        coords = {"alone": SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory, devices=[0]),
                  "equal": SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory, devices=pair),
                  "adaptive": SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory, devices=pair,
                                                    adaptive=True)}
        owned += list(coords.values())
        check = RenderOnly(mgr, srus, slowdown) if args.render_only else None
        if check is not None:
            owned.append(check)
        times: dict[str, list[float]] = {name: [] for name in coords}
        overhead: list[float] = []    # adaptive frame time beyond the busier device's busy time: host
        #                               submission, idle gaps, the transfers' tail, the composite
        moved: list[int] = []         # SRUs the adaptive plan moved, per timed round
        reports: dict[str, Any] = {}
        converge: list[list[float | None]] = []
        last_plan: dict[Any, int] = {}
        from vkmulti.apps.progress import progress

        with progress(args.warmup + args.rounds, "adaptive rounds", quiet=False) as bar:
            for k in range(args.warmup + args.rounds):
                for name, c in coords.items():
                    t0 = time.perf_counter()
                    reports[name] = c.render_frame(srus, frames[name])
                    ms = (time.perf_counter() - t0) * 1e3
                    if k >= args.warmup:
                        times[name].append(ms)
                plan = dict(reports["adaptive"].rendered_on)
                if k >= args.warmup:
                    secs = reports["adaptive"].device_seconds
                    overhead.append(times["adaptive"][-1] - 1e3 * max(secs.values(), default=0.0))
                    moved.append(sum(plan[i] != last_plan.get(i, plan[i]) for i in plan))
                    if check is not None:
                        check.round()
                last_plan = plan
                converge.append(coords["adaptive"].measured_weights)
                bar()
        pixels = {name: f.download() for name, f in frames.items()}
        identical = all(np.array_equal(pixels["alone"], pixels[n]) for n in ("equal", "adaptive"))
        indep = check.figures() if check is not None else {}
        cost = {s.sru_id: s.render_cost for s in srus}
        total = sum(cost.values())
        ms = {name: statistics.median(t) for name, t in times.items()}

        def shares(rep: Any) -> list[float]:
            return [round(sum(cost[i] for i in ids) / total, 4) for ids in rep.device_loads(2)]

        ratios = [round(ws[1] / ws[0], 4) if ws[0] and ws[1] else None for ws in converge]
        settled = _settled_round(ratios)
        best = min(ms["equal"], ms["alone"])
        lows = {name: min(t) for name, t in times.items()}
        best_of_best = lows["adaptive"] / min(lows["equal"], lows["alone"])
        # each round's three frames ran back to back: their ratio sees the same machine load
        paired = statistics.median(a / min(e, g) for a, e, g in zip(times["adaptive"], times["equal"],
                                                                      times["alone"]))
        spread = {name: [round(min(t) / best, 3), round(max(t) / best, 3)] for name, t in times.items()}
        fig: dict[str, Any] = {
            "note": note, "devices": names, "thread_layout": layout, "slowdown": args.slowdown,
            "slow_device": args.slow_device, "srus": len(srus), "size": [width, height],
            "iterations": [min(s.iterations for s in srus), max(s.iterations for s in srus)],
            "warmup_rounds": args.warmup, "timed_rounds": args.rounds,
            "frame_ms_gpu0_alone": round(ms["alone"], 3), "frame_ms_equal_split": round(ms["equal"], 3),
            "frame_ms_adaptive": round(ms["adaptive"], 3),
            "adaptive_over_equal": round(ms["adaptive"] / ms["equal"], 3),
            "adaptive_over_gpu0_alone": round(ms["adaptive"] / ms["alone"], 3),
            "ratio_spread_min_max": spread["adaptive"],
            # load on a shared machine only adds time: the best frames of each mode, compared
            "ratio_of_best_frames": round(best_of_best, 3),
            "ratio_paired_median": round(paired, 3),
            "cost_share_equal": shares(reports["equal"]), "cost_share_adaptive": shares(reports["adaptive"]),
            "measured_weights": coords["adaptive"].measured_weights,
            "speed_ratio_per_round": ratios,
            "settled_after_rounds": settled,
            "settled_before_timing": settled is not None and settled <= args.warmup,
            "srus_moved_per_timed_round": moved,
            "frame_ms_beyond_busier_device": round(statistics.median(overhead), 3),
            "adaptive_device_seconds_last_frame": {str(d): round(s, 6) for d, s in
                                                   reports["adaptive"].device_seconds.items()},
            "transfer_methods": sorted({r.transfer for r in reports["adaptive"].routes if r.offloaded}),
            "fallbacks": reports["adaptive"].fallbacks + reports["equal"].fallbacks,
            "identical_frames": identical,
            "frame_ms_all": {name: [round(t, 2) for t in ts] for name, ts in times.items()},
        }
        fig |= {f"render_only_{k}": v for k, v in indep.items()}
        w = fig["measured_weights"]
        if w[0] is not None and w[1] is not None and w[1] > w[0]:
            fig["faster_gpu_note"] = ("GPU 1 measured faster than GPU 0: 'alone' is GPU 0 (the coordinator "
                                      "composites there); pass --gpus with the faster GPU first to compare "
                                      "against it alone")
        bound = (f"; render-only bound from this run's speeds {indep['ideal_ratio']:.2f}x, independence "
                 f"{indep['independence']:.2f} (1: independent devices)" if indep else "")
        threads = ", ".join(f"{d['threads']}" for d in layout["devices"])
        ratio = (f"adaptive SRU mode {ms['adaptive']:.2f} ms = {ms['adaptive'] / best:.2f}x the better of the "
                 f"equal split ({ms['equal']:.2f} ms) and GPU 0 alone ({ms['alone']:.2f} ms) (target <= 0.8; "
                 f"rounds {spread['adaptive'][0]:.2f}-{spread['adaptive'][1]:.2f}x, per-round median "
                 f"{paired:.2f}x, best frames {best_of_best:.2f}x){bound}; "
                 f"adaptive/equal {ms['adaptive'] / ms['equal']:.2f}x; measured speed GPU1/GPU0 "
                 f"{(w[1] / w[0]) if w[0] and w[1] else float('nan'):.3f} (slowdown {args.slowdown} on GPU "
                 f"{args.slow_device}); threads per device {threads} on {layout['cpus']} CPUs; "
                 f"frames identical: {'yes' if identical else 'NO'}")
        return {f"adaptive_{k}": v for k, v in fig.items()}, ratio
    finally:
        for obj in reversed(owned):
            obj.destroy()
        mgr.destroy()


SECTIONS: dict[str, Callable[[argparse.Namespace], tuple[dict, str]]] = {"strategies": strategies_section,
                                                                      "adaptive": adaptive_section}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--section", action="append", choices=sorted(SECTIONS),
                        help="run only this section (repeatable); default: all")
    parser.add_argument("--seconds", type=float, default=0.5, help="time per figure")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--kernels", type=int, default=10_000)
    adaptive = parser.add_argument_group("adaptive section")
    from vkmulti.apps.cli_args import add_virtual_argument, positive_int
    add_virtual_argument(adaptive)
    adaptive.add_argument("--gpus", type=_indices, default=None, metavar="I,J",
                          help="physical devices by enumeration index, the first is GPU 0 (default: all)")
    adaptive.add_argument("--slowdown", type=int, default=2,
                          help="dispatches per SRU on the slow device (default 2: best split 0.67x the faster "
                               "device alone, where 4 would allow no better than 0.8x)")
    adaptive.add_argument("--slow-device", type=int, default=1, help="which slot is slowed (default 1)")
    adaptive.add_argument("--threads-per-device", type=positive_int, default=None, metavar="N",
                          help="LP_NUM_THREADS: worker threads of each lavapipe device (default: "
                               "LP_NUM_THREADS if set, else the CPUs split evenly over the lavapipe devices, "
                               "one left to the host thread above 2 CPUs); GPUs are not affected")
    adaptive.add_argument("--srus", type=int, default=64, help="SRUs in the frame (default 64)")
    adaptive.add_argument("--size", type=_size, default=None, metavar="WxH",
                          help="frame size (default 640x360, --heavy 3840x2160)")
    adaptive.add_argument("--heavy", action="store_true", help="render-heavy SRUs for real GPUs")
    adaptive.add_argument("--iterations", type=_pair, default=None, metavar="LO,HI",
                          help=f"steps per pixel of the SRUs (default {CPU_ITERATIONS[0]},{CPU_ITERATIONS[1]}; "
                               f"--heavy: the demo's heavy preset)")
    adaptive.add_argument("--warmup", type=int, default=12, help="rounds before timing (default 12)")
    adaptive.add_argument("--rounds", type=int, default=8, help="timed rounds, medians reported (default 8)")
    adaptive.add_argument("--no-render-only", dest="render_only", action="store_false",
                          help="skip the render-only check (each device alone, both at once, every timed "
                               "round) that shows whether the two devices are independent and the best "
                               "ratio their speeds allow")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.devices < 1 or args.kernels < 0:
        parser.error("--seconds must be > 0, --devices >= 1, --kernels >= 0")
    if args.warmup < 0 or args.rounds < 1 or args.srus < 1:
        parser.error("--warmup must be >= 0, --rounds >= 1, --srus >= 1")
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
