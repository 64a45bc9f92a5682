"""Kernel migration and hot reload bench, against baselines measured in the same run.

(a) live migration of a kernel with 1, 16 and 256 MiB of state between GPU 0
    and GPU 1 (runtime.migrate: quiesce, GPU-to-GPU copy with the pair's best
    transfer method, CRC32 on both devices, switch), per phase, against
    migrating through host bytes (runtime.checkpoint -> Checkpoint.to_bytes() ->
    Checkpoint.from_bytes() -> runtime.restore(into=..., device=other)), the
    three interleaved, and the raw copy of the same bytes with the same transfer
    engine; each timed move starts once the background work the previous ones
    asked for (the next twins, made ahead while the kernel steps) is done, as
    a move finds it when moves are not back to back (`live_back_to_back_us`:
    every other round, a move right after the host restore, without that wait); each CRC32 engine alone on each device (`crc_us`: shader in both
    layouts, and the host engine on CPU devices, where it is the default and
    the live migration is also timed with the shader's check);
    the first move of a kernel (once the pipelines launch() builds ahead in the
    background are built, and once another kernel's moves warmed the process:
    `process_first_move_us` is the process's first move) against a later one;
    the live migration against the raw copy of its bytes (timed right after
    a live move; and, beside it, a raw copy started as the live moves are,
    once the background work is done: a GPU that idled meanwhile may copy
    slower);
(b) hot reload: the swap of a kernel's code (HotReloadManager, pipeline
    already built once) against tearing the kernel down and launching it anew
    with the new code and its state put back; the longest gap between two
    steps (made by another thread) from the start of a reload whose pipeline
    is compiled cold until the background work it leaves is done (the next
    twins, the pipelines of the other devices), against the kernel's normal
    step, and against the longest gap in as long a window of plain steps
    once all that is done: the machine's own noise.

(c) the stencil's lost-GPU drill (`python -m vkmulti demo stencil --lose-gpu 1@100`):
    the recovery (restore of the lost slab on the survivor from its latest
    checkpoint, then the replay of the steps since), with the default
    checkpoint policy (every 16 steps: up to 15 steps replayed) and with a
    checkpoint after every step (nothing to replay: the restore alone),
    against the slab's normal step.

Prints figures as JSON, then a line starting with "ratio:". Uses the virtual
lavapipe pair when no GPU is present.

    python bench/migration.py [--section all|migrate|reload|drill] [--sizes 1M,16M,256M] [--repeats N]
                              [--crc auto|shader|host] [--virtual N] [--json FILE]

`--crc shader` checks the moves with the GPU shader's CRC32 even on the
virtual pair (lavapipe's default is the host's): the GPU path's submits and
waits measured without a GPU (its time there is llvmpipe running the shader).
"""
from __future__ import annotations

import argparse
import statistics
import struct
import sys
import threading
import time
from typing import Any

import numpy as np

from vkmulti.apps.cli_args import Parser, add_output_argument, add_virtual_argument, print_figures
from vkmulti.testing import use_virtual_if_no_gpu

MIB = 1 << 20


def parse_sizes(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        t = part.strip().upper().removesuffix("B").removesuffix("I")
        mult = {"K": 1 << 10, "M": MIB, "G": 1 << 30}.get(t[-1:], 1)
        try:
            n = int(t[:-1] if mult > 1 else t) * mult
        except ValueError:
            raise argparse.ArgumentTypeError(f"sizes like 1M,16M,256M, got {text!r}") from None
        if n < 4096 or n % 4:
            raise argparse.ArgumentTypeError(f"a state size is at least 4K and a multiple of 4, got {part!r}")
        out.append(n)
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _median_move(moves: list) -> Any:
    """The move whose total is the median (the lower middle one): its phases add up to its
    total, where the medians of each phase would not (a move's copy lands in its quiesce or in
    its copy phase, depending on the move). None for no moves."""
    return sorted(moves, key=lambda r: r.total_duration)[(len(moves) - 1) // 2] if moves else None


def _us(move: Any, name: str = "total_duration") -> float:
    """A duration of `move` in us (0 for no move)."""
    return getattr(move, name) * 1e6 if move is not None else 0.0


def _runtime(mgr: Any) -> tuple[Any, Any]:
    from vkmulti.kernels import CrossGpuK2KRouter, KernelRuntime, MultiGpuCoordinator

    rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr), mgr, max_kernels=64)
    return rt, CrossGpuK2KRouter(rt.coordinator, rt)


def _settle(rt: Any) -> None:
    """Wait until the background work earlier moves asked for (pipelines, the next twins) is done."""
    rt.prebuild.wait_idle(60)
    if not rt.ready_twins.wait_idle(60):
        raise RuntimeError("the ready twins were not made within 60 s")


def migrate(mgr: Any, sizes: list[int], repeats: int, bar: Any = None, crc: str = "auto") -> list[dict]:
    """(a): per state size, live migrations back and forth and the host-bytes baseline;
    `crc`: the CRC32 engine of the moves (KernelRuntime.migration_crc: 'shader' forces
    the GPU shader's check on CPU devices, where 'auto' picks the host's)."""
    from vkmulti.kernels import Checkpoint, KernelSpec, counter_kernel
    from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state, read_counter
    from vkmulti import Buffer

    rt, router = _runtime(mgr)
    rt.migration_crc = crc
    out = []
    try:
        base = counter_kernel(max_sources=64)
        process_first = _warm_process(rt, base)
        for size in sizes:
            rng = np.random.default_rng(size)
            piece = min(size, 64 * MIB)   # state buffers of at most 64 MiB (lavapipe binds 128 MiB at most)
            pieces = [piece] * (size // piece) + ([size % piece] if size % piece else [])
            extra = [rng.integers(0, 256, n, dtype=np.uint8) for n in pieces]
            spec = KernelSpec("bench-state", base.spirv, state_sizes=(base.state_sizes[0], *pieces))
            k = rt.launch(spec, f"k{size}", device=0, state=[counter_initial_state(64), *extra])
            reps = repeats if size <= 16 * MIB else max(1, repeats // 2)
            rt.send(k, np.array([1], np.uint32), tag=COUNTER_TAG_ADD)
            rt.step(k)
            rt.prebuild.wait_idle(60)   # (what launch() builds ahead in the background: pipelines, then twins)
            rt.ready_twins.wait_idle(60)
            first = rt.migrate(k, 1)  # the first move of this kernel (later ones: `live`)
            rt.migrate(k, 0, verify=False)
            engine = rt._lifecycle.crc(k.device_index).kind
            other = "shader" if engine == "host" and crc == "auto" else None   # on a CPU device: the shader's too
            if other:
                rt.migration_crc = other
                rt.migrate(k, 1 - k.device_index)   # warm
                rt.migration_crc = crc
            # the raw copy of the same bytes, same engine, interleaved with the moves like every other path
            method, eng = rt._lifecycle.engines.get(0, 1)
            a, b = Buffer(mgr.slot(0), size), Buffer(mgr.slot(1), size)
            eng.submit(src_buffer=a, dst_buffer=b, size=size).wait(60)   # (warm: both buffers touched)
            try:
                live, plain, host, live_other, raw_copy, rushed, raw_settled = [], [], [], [], [], [], []
                for i in range(reps):   # interleaved: load drifting on a shared machine hits every path alike
                    if i % 2:   # (every other round: the timed moves go both ways in turn)
                        # right after the last host restore (on CPU devices: after the shader-checked move
                        # that followed it, which did not wait for the background work either)
                        rushed.append(rt.migrate(k, 1 - k.device_index))
                    _settle(rt)   # (every live move once the background work before it is done)
                    live.append(rt.migrate(k, 1 - k.device_index))
                    t0 = time.perf_counter()
                    eng.submit(src_buffer=a, dst_buffer=b, size=size).wait(60)
                    raw_copy.append(time.perf_counter() - t0)
                    _settle(rt)
                    plain.append(rt.migrate(k, 1 - k.device_index, verify=False))
                    _settle(rt)   # (the raw copy again, started as the live moves are: once the background is done)
                    t0 = time.perf_counter()
                    eng.submit(src_buffer=a, dst_buffer=b, size=size).wait(60)
                    raw_settled.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    raw = rt.checkpoint(k).to_bytes()
                    rt.restore(Checkpoint.from_bytes(raw), into=k, device=1 - k.device_index)
                    host.append(time.perf_counter() - t0)
                    if other:
                        rt.migration_crc = other
                        _settle(rt)
                        try:
                            live_other.append(rt.migrate(k, 1 - k.device_index))
                        finally:
                            rt.migration_crc = crc
                same = all(np.array_equal(rt.read_state(k, 1 + i), e) for i, e in enumerate(extra))
                rt.send(k, np.array([2], np.uint32), tag=COUNTER_TAG_ADD)
                rt.step(k)
                counting = read_counter(rt.read_state(k)).sum == 3
                crc_sides = crc_times(rt, [a, b], reps)
            finally:
                a.destroy()
                b.destroy()
            rt.destroy_kernel(k)

            mid, other_mid = _median_move(live), _median_move(live_other)
            row = {"state_bytes": size, "state_buffers": len(spec.state_sizes), "method": live[0].transfer_method, "repeats": reps,
                   "live_us": _us(mid), "live_quiesce_us": _us(mid, "quiesce_duration"),
                   "live_prepare_us": _us(mid, "checkpoint_duration"),
                   "live_transfer_us": _us(mid, "transfer_duration"),
                   "live_verify_us": _us(mid, "verify_duration"),
                   "live_restore_us": _us(mid, "restore_duration"),
                   "live_no_crc_us": _us(_median_move(plain)),
                   "live_back_to_back_us": _us(_median_move(rushed)) if rushed else None,
                   "host_bytes_us": _median(host) * 1e6, "raw_copy_us": _median(raw_copy) * 1e6,
                   "raw_copy_settled_us": _median(raw_settled) * 1e6,
                   "checksums_matched": all(r.checksum_match for r in live + live_other + rushed),
                   "state_intact": same, "kernel_counts_on": counting, "crc_engine": engine,
                   "host_crc32": _host_crc32_name(),
                   "crc_us": crc_sides}
            row["first_move_us"] = first.total_duration * 1e6
            row["process_first_move_us"] = process_first * 1e6
            row["ratio_first_to_later_move"] = row["first_move_us"] / row["live_us"]
            row["ratio_live_to_raw_copy"] = row["live_us"] / row["raw_copy_us"]
            row["ratio_live_to_raw_copy_settled"] = row["live_us"] / row["raw_copy_settled_us"]
            row["ratio_host_to_live"] = row["host_bytes_us"] / row["live_us"]
            row["ratio_host_to_live_no_crc"] = row["host_bytes_us"] / row["live_no_crc_us"]
            if other:
                row[f"live_{other}_crc_us"] = _us(other_mid)
                row[f"live_{other}_crc_verify_us"] = _us(other_mid, "verify_duration")
                row[f"ratio_host_to_live_{other}_crc"] = row["host_bytes_us"] / row[f"live_{other}_crc_us"]
            row["raw_copy_gbps"] = size / row["raw_copy_us"] / 1e3
            out.append(row)
            if bar is not None:
                bar()
    finally:
        router.detach()
        rt.destroy()
    return out


def _warm_process(rt: Any, spec: Any) -> float:
    """The process's first move (seconds): another kernel moved there and back, so that the
    first move timed for each state size is that kernel's first, not the first run of the
    move's code in this process (the interpreter's and the caches' warm-up)."""
    from vkmulti.kernels.reference import counter_initial_state

    k = rt.launch(spec, "warm-up", device=0, state=[counter_initial_state(64)])
    try:
        rt.step(k)
        _settle(rt)
        first = rt.migrate(k, 1).total_duration
        _settle(rt)
        rt.migrate(k, 0)
    finally:
        rt.destroy_kernel(k)
    return first


def _host_crc32_name() -> str:
    """Which crc32 the host CRC32 engine uses here (zlib-ng's when installed)."""
    from vkmulti.kernels.lifecycle import host_crc
    return "zlib-ng" if "zlib_ng" in (getattr(host_crc.crc32, "__module__", None) or "") else "zlib"


def crc_times(rt: Any, buffers: list, repeats: int) -> dict:
    """Each CRC32 engine alone on each device (buffer i on device i: the source's
    side, then the destination's), median us: where the check's time goes."""
    from vkmulti.kernels.lifecycle import HostCrc

    out: dict[str, list[float]] = {}
    kinds = ["shader"] + (["host"] if all(HostCrc.suits(b.slot) for b in buffers) else [])
    chosen = rt.migration_crc
    for kind in kinds:
        rt.migration_crc = kind
        try:
            layouts = [None] if kind == "host" else [False, True]
            for contiguous in layouts:
                name = kind if contiguous is None else f"shader_{'contiguous' if contiguous else 'interleaved'}"
                times = []
                for dev, buf in enumerate(buffers):
                    eng = rt._lifecycle.crc(dev)
                    saved = getattr(eng, "contiguous", None)
                    if contiguous is not None:
                        eng.contiguous = contiguous
                    try:
                        eng.run([(buf, 0, buf.size)])   # warm
                        ts = []
                        for _ in range(max(1, repeats)):
                            t0 = time.perf_counter()
                            eng.run([(buf, 0, buf.size)])
                            ts.append(time.perf_counter() - t0)
                    finally:
                        if contiguous is not None:
                            eng.contiguous = saved
                    times.append(_median(ts) * 1e6)
                out[name] = times
        finally:
            rt.migration_crc = chosen
    return out


def reload(mgr: Any, repeats: int) -> dict:
    """(b): hot-reload swap against destroy + launch anew with the state put back."""
    from vkmulti.kernels import HotReloadConfig, HotReloadManager, KernelCodeSource, counter_kernel, pingpong_kernel
    from vkmulti.kernels.reference import counter_initial_state

    rt, router = _runtime(mgr)
    try:
        a, b = counter_kernel(max_sources=64), pingpong_kernel()
        codes = [KernelCodeSource.from_spirv(a.spirv), KernelCodeSource.from_spirv(b.spirv)]
        k = rt.launch(a, "r", device=0, state=[counter_initial_state(64)])
        mgr_h = HotReloadManager(HotReloadConfig().with_preserve_state(True).with_validate_before_swap(False))
        mgr_h.register_runtime_kernel(k)
        for i in range(2):   # warm: both pipelines built
            mgr_h.reload(k, codes[(i + 1) % 2])
        swaps, totals = [], []
        for i in range(repeats * 4):
            r = mgr_h.reload(k, codes[i % 2])
            swaps.append(r.swap_duration)
            totals.append(r.total_duration)
        gaps = [_reload_gap(rt, k, mgr_h, a.spirv, 0xB000 + i) for i in range(repeats)]
        relaunch = []
        specs = [a, a.__class__(a.kernel_type, b.spirv, a.state_sizes, a.inbox_capacity, a.outbox_capacity)]
        for i in range(repeats * 4):
            t0 = time.perf_counter()
            state = rt.read_state(k)
            rt.destroy_kernel(k)
            k = rt.launch(specs[i % 2], "r", device=0, state=[state])
            relaunch.append(time.perf_counter() - t0)
        rt.destroy_kernel(k)
    finally:
        router.detach()
        rt.destroy()
    row = {"swap_us": _median(swaps) * 1e6, "reload_total_us": _median(totals) * 1e6,
           "relaunch_us": _median(relaunch) * 1e6, "state_bytes": a.state_sizes[0]}
    row["cold_reload_max_gap_us"] = _median([g[0] for g in gaps]) * 1e6
    row["normal_step_us"] = _median([g[1] for g in gaps]) * 1e6
    row["plain_window_max_gap_us"] = _median([g[2] for g in gaps]) * 1e6
    row["reload_call_max_gap_us"] = _median([g[3] for g in gaps]) * 1e6
    row["ratio_cold_reload_gap_to_step"] = row["cold_reload_max_gap_us"] / row["normal_step_us"]
    row["ratio_relaunch_to_swap"] = row["relaunch_us"] / row["swap_us"]
    row["ratio_relaunch_to_reload"] = row["relaunch_us"] / row["reload_total_us"]
    return row


def _cold_code(spirv: bytes, tag: int) -> Any:
    """The same program with another generator word in its header: new bytes, so a
    pipeline no device has built yet (a cold compile)."""
    from vkmulti.kernels import KernelCodeSource

    raw = bytearray(spirv)
    struct.pack_into("<I", raw, 8, tag)
    return KernelCodeSource.from_spirv(bytes(raw))


def _longest_gap(marks: list[float], t0: float, t1: float) -> float:
    """The longest time between two of the step times `marks` that spans part of [t0, t1]."""
    edges = [max(m for m in marks if m < t0)] + [m for m in marks if t0 <= m <= t1] + \
        [min(m for m in marks if m > t1)]
    return max(b - a for a, b in zip(edges, edges[1:]))


def _reload_gap(rt: Any, k: Any, manager: Any, spirv: bytes, tag: int) -> tuple[float, float, float, float]:
    """(the longest time between two steps of k from the start of a hot reload with a
    cold compile until the background work it leaves (the next twins, the pipelines
    of the other devices) is done, the median time between its steps before, the
    longest in a window as long of plain steps once all that is done: this machine's
    noise, the longest while reload() itself ran), steps made by another thread."""
    stop = threading.Event()
    marks: list[float] = []

    def run() -> None:
        while not stop.is_set():
            before = k.steps
            rt.step(k)
            if k.steps > before:
                marks.append(time.perf_counter())
    t = threading.Thread(target=run, name="bench-steps")
    t.start()
    try:
        while len(marks) < 20:
            time.sleep(0.001)
        n0 = len(marks)
        t0 = time.perf_counter()
        manager.reload(k, _cold_code(spirv, tag))
        t1 = time.perf_counter()
        _settle(rt)   # (what the reload started in the background)
        t2 = time.perf_counter()
        time.sleep(2 * (t2 - t0))   # the plain window, in the middle of this
        t3 = time.perf_counter()
        n3 = len(marks)
        while len(marks) < n3 + 3:
            time.sleep(0.001)
    finally:
        stop.set()
        t.join(60)
    rt.synchronize()
    normal = [b - a for a, b in zip(marks[1:n0], marks[2:n0])]
    mid, half = (t2 + t3) / 2, (t2 - t0) / 2
    return _longest_gap(marks, t0, t2), _median(normal), _longest_gap(marks, mid - half, mid + half), \
        _longest_gap(marks, t0, t1)


def drill(repeats: int) -> dict:
    """(c): the lost-GPU drill's recovery, median of `repeats` drills per policy."""
    from vkmulti.apps.stencil import LIGHT_SIZE
    from vkmulti.apps.stencil_drill import stencil_drill

    w, h = LIGHT_SIZE
    row: dict[str, Any] = {"grid": f"{w}x{h}", "steps": 200, "lose": "1@100"}
    for label, every in (("", 16), ("_every_step", 1)):
        runs = [stencil_drill(w, h, 200, (1, 100), every=every) for _ in range(repeats)]
        row[f"identical{label}"] = all(r["identical"] for r in runs)
        row[f"recovery{label}_ms"] = _median([r["recovery_ms"] for r in runs])
        row[f"steps_replayed{label}"] = _median([r["steps_replayed"] for r in runs])
        row[f"step{label}_ms"] = _median([r["step_ms_after"] for r in runs])
    row["ratio_recovery_to_step"] = row["recovery_ms"] / row["step_ms"]
    return row


def goals(res: dict) -> list[dict]:
    """Issue #25's goals: each with its figure from this run, the baseline it is
    measured against (same run), the bound and whether it is met."""
    out = []

    def goal(name: str, figure: float, baseline: float | None, bound: float, unit: str) -> None:
        out.append({"goal": name, "figure": figure, "baseline": baseline, "bound": bound, "unit": unit,
                    "met": figure <= bound})
    rows = res.get("migrate") or []
    pick = next((r for r in rows if r["state_bytes"] == 16 * MIB), None)
    if pick is not None:
        goal("16 MiB live migration with CRC check / raw copy of its bytes", pick["ratio_live_to_raw_copy"],
             pick["raw_copy_us"], 2.0, "x")
        goal("first move / a later one (16 MiB)", pick["ratio_first_to_later_move"], pick["live_us"], 1.5, "x")
    if "drill" in res:
        d = res["drill"]
        goal("stencil lost-GPU drill recovery (checkpoint every 16 steps: steps replayed)", d["recovery_ms"],
             d["step_ms"], 5.0, "ms")
        goal("stencil lost-GPU drill recovery (checkpoint every step: the restore alone)",
             d["recovery_every_step_ms"], d["step_every_step_ms"], 5.0, "ms")
    if "reload" in res:
        r = res["reload"]
        goal("longest gap between steps from a cold-compile reload's start until its background work is done "
             "/ a normal step", r["ratio_cold_reload_gap_to_step"], r["normal_step_us"], 2.0, "x")
    return out


def main(argv: list[str] | None = None) -> int:
    from vkmulti import MultiDeviceManager
    from vkmulti.apps.progress import progress

    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--section", choices=("all", "migrate", "reload", "drill"), default="all")
    p.add_argument("--sizes", type=parse_sizes, default=None, help="state sizes (default 1M,16M,256M)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--crc", choices=("auto", "shader", "host"), default="auto",
                   help="the moves' CRC32 engine (shader: the GPU shader's check even on CPU devices)")
    add_virtual_argument(p)
    add_output_argument(p, "--json", image=False, default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    note = use_virtual_if_no_gpu(args.virtual)
    mgr = MultiDeviceManager.create(enabled=True)
    res: dict[str, Any] = {"note": note, "devices": [s.name for s in mgr.slots]}
    try:
        if mgr.device_count < 2:
            print("bench/migration.py needs two devices", file=sys.stderr)
            return 2
        sizes = args.sizes or [MIB, 16 * MIB, 256 * MIB]
        steps = (len(sizes) if args.section in ("all", "migrate") else 0) + (args.section in ("all", "reload")) + \
            (args.section in ("all", "drill"))
        with progress(steps, "bench migration", quiet=args.json is not None) as bar:
            if args.section in ("all", "migrate"):
                res["migrate"] = migrate(mgr, sizes, args.repeats, bar, args.crc)
            if args.section in ("all", "reload"):
                res["reload"] = reload(mgr, args.repeats)
                bar()
            if args.section in ("all", "drill"):   # (each drill makes managers of its own)
                mgr.destroy()
                res["drill"] = drill(max(1, min(args.repeats, 3)))
                bar()
    finally:
        mgr.destroy()
    res["goals"] = goals(res)
    print_figures(res, args.json)
    parts = []
    rows = res.get("migrate") or []
    pick = next((r for r in rows if r["state_bytes"] == 16 * MIB), rows[-1] if rows else None)
    if pick is not None:
        mib = pick["state_bytes"] / MIB
        rushed = f"; right after a host restore {pick['live_back_to_back_us'] / pick['raw_copy_us']:.2f}x" \
            if pick.get("live_back_to_back_us") else ""
        shader = f"; with the GPU shader's check instead {pick['ratio_host_to_live_shader_crc']:.2f}x" \
            if "ratio_host_to_live_shader_crc" in pick else ""
        parts.append(f"live migration {mib:.0f} MiB = {pick['ratio_host_to_live']:.2f}x faster than through host "
                     f"bytes (goal >= 3; {pick['live_us']:.0f} vs {pick['host_bytes_us']:.0f} us; CRC32 check by "
                     f"the {pick['crc_engine']} engine; without the check {pick['ratio_host_to_live_no_crc']:.2f}x"
                     f"{shader}); copy phase {pick['live_transfer_us']:.0f} us (raw {pick['method']} copy "
                     f"{pick['raw_copy_us']:.0f} us), end to end {pick['live_us']:.0f} us = "
                     f"{pick['ratio_live_to_raw_copy']:.2f}x the raw copy (goal <= 2{rushed}; "
                     f"{pick['ratio_live_to_raw_copy_settled']:.2f}x a raw copy started as the moves are, once the "
                     f"background work is done: {pick['raw_copy_settled_us']:.0f} us); first move "
                     f"{pick['first_move_us']:.0f} us = {pick['ratio_first_to_later_move']:.2f}x a later one "
                     f"(goal <= 1.5; the process's first move {pick['process_first_move_us']:.0f} us)")
    if "reload" in res:
        r = res["reload"]
        parts.append(f"hot-reload swap {r['swap_us']:.0f} us = {r['ratio_relaunch_to_swap']:.1f}x faster than "
                     f"relaunching ({r['relaunch_us']:.0f} us; whole reload {r['reload_total_us']:.0f} us); "
                     f"longest gap between steps during a reload with a cold compile "
                     f"{r['cold_reload_max_gap_us']:.0f} us = {r['ratio_cold_reload_gap_to_step']:.2f}x a normal "
                     f"step ({r['normal_step_us']:.0f} us; goal <= 2; while reload() ran "
                     f"{r['reload_call_max_gap_us']:.0f} us; the longest gap in as long a window of plain steps: "
                     f"{r['plain_window_max_gap_us']:.0f} us)")
    if "drill" in res:
        d = res["drill"]
        parts.append(f"lost-GPU drill recovery {d['recovery_ms']:.1f} ms = {d['ratio_recovery_to_step']:.2f}x the "
                     f"slab's step ({d['step_ms']:.2f} ms; goal <= 5 ms; {d['steps_replayed']:.0f} steps replayed "
                     f"from a checkpoint every 16 steps; with one every step {d['recovery_every_step_ms']:.1f} ms, "
                     f"{d['steps_replayed_every_step']:.0f} replayed)")
    print("ratio: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
