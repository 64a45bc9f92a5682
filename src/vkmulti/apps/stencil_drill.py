"""The stencil's lost-GPU drill (`python -m vkmulti demo stencil --lose-gpu 1@100`):
the demo's grid split over every GPU, run twice: once as it is, once under a
checkpoint policy with GPU `gpu` lost (the fault hook, vkmulti.testing.lose_device)
right before step `at`. The runtime restores the lost slab on a survivor from its
latest checkpoint and replays it; the final fields must be bit-identical. Prints
the step times before and after the loss, the recovery, the steps replayed and
what the policy costs per step (the run with it against the run without)."""
from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from .._core.checks import check_count, check_index
from ..device.manager import MultiDeviceManager
from ..device.virtual import use_virtual_if_no_gpu
from ..kernels import CheckpointPolicy, CrossGpuK2KRouter, KernelRuntime, MultiGpuCoordinator
from ..kernels.stencil import StencilSlabs, stencil_payload_size
from ..testing import lose_device
from .stencil import DRILL_STEPS, LIGHT_SIZE, initial_field, report, write_field_png

__all__ = ["stencil_drill", "print_drill", "main"]


def _run(mgr: Any, field: np.ndarray, top: np.ndarray, bottom: np.ndarray, steps: int, policy: Any,
         lose: tuple[int, int] | None) -> dict[str, Any]:
    """One run of the grid under `policy`, losing GPU lose[0] right before step lose[1] (None: no loss)."""
    n = mgr.device_count
    coord = MultiGpuCoordinator.from_manager(mgr)
    rt = KernelRuntime(coord, mgr, payload_size=stencil_payload_size(field.shape[1]), max_kernels=max(8, 2 * n + 2))
    if policy is not None:
        rt.set_checkpoint_policy(policy)
    router = CrossGpuK2KRouter(coord, rt)
    times: list[float] = []
    try:
        slabs = StencilSlabs(rt, field, list(range(n)), top=top, bottom=bottom)
        try:
            for i in range(steps):
                if lose is not None and i == lose[1]:
                    rt.synchronize(60.0)
                    lose_device(mgr, lose[0])
                t0 = time.perf_counter()
                slabs.step(1)
                rt.synchronize(60.0)
                times.append(time.perf_counter() - t0)
            out = slabs.field() if not rt.lost_kernels else None   # (a slab lost without a checkpoint)
        finally:
            slabs.destroy()
        stats = rt.failover_stats.snapshot()
        return {"field": out, "times": times, "stats": stats, "restored": dict(rt.restored_kernels),
                "lost": dict(rt.lost_kernels)}
    finally:
        t0 = time.perf_counter()
        router.detach(30.0)
        rt.destroy(30.0)
        if lose is not None:
            times.append(time.perf_counter() - t0)   # (read as destroy_ms)


def stencil_drill(width: int, height: int, steps: int, loss: tuple[int, int], *, every: int = 16,
                  devices: list[int] | None = None, note: str | None = None,
                  output: str | None = None) -> dict[str, Any]:
    """Run the drill (see the module docstring); a JSON-ready report with `identical`.
    The final field of the run with the loss goes to `output` (a PNG) when given."""
    # (checked before any GPU work: a negative step lost nothing and still reported a drill)
    width, height = check_count(width, "width", 3), check_count(height, "height", 1)
    steps, every = check_count(steps, "steps", 1), check_count(every, "every", 1)
    gpu, at = loss
    gpu, at = check_index(gpu, "--lose-gpu GPU"), check_count(at, "--lose-gpu step")
    if at >= steps:
        raise ValueError(f"--lose-gpu {gpu}@{at}: step {at} is past the {steps} steps run")
    field, top, bottom = initial_field(width, height)
    mgr = MultiDeviceManager.create(enabled=True, device_indices=devices)
    try:
        if not 1 <= gpu < mgr.device_count:
            raise ValueError(f"--lose-gpu {gpu}@{at}: GPU {gpu} is not a secondary of this machine "
                             f"({mgr.device_count} GPU(s))")
        if height < mgr.device_count:
            raise ValueError(f"a {height}-row grid cannot be split into {mgr.device_count} slabs (one per GPU)")
        plain = _run(mgr, field, top, bottom, steps, None, None)
    finally:
        mgr.destroy()
    mgr = MultiDeviceManager.create(enabled=True, device_indices=devices)
    try:
        drill = _run(mgr, field, top, bottom, steps, CheckpointPolicy(every_steps=every), (gpu, at))
    finally:
        mgr.destroy()
    destroy_s = drill["times"].pop()
    t_plain, t_drill = plain["times"], drill["times"]
    before = t_drill[:at]
    after = t_drill[at + 1:]
    stats = drill["stats"]
    rec = stats.recoveries[0] if stats.recoveries else None

    def ms(xs: list[float]) -> float | None:   # (None: no step there, a loss before the first or the last)
        return float(np.median(xs)) * 1e3 if xs else None
    cost, noise = _policy_cost(t_plain[:at], before)
    png = None
    if output and drill["field"] is not None:
        write_field_png(drill["field"], output)
        png = output
    return {
        "note": note, "size": [width, height], "steps": steps, "lose_gpu": gpu, "at_step": at,
        "checkpoint_every": every,
        "identical": drill["field"] is not None and bool(np.array_equal(plain["field"], drill["field"])),
        "step_ms_without_policy": ms(t_plain[:at]), "step_ms_with_policy": ms(before),
        "policy_cost_ms_per_step": cost, "step_noise_ms": noise,
        "step_ms_at_loss": t_drill[at] * 1e3 if len(t_drill) > at else 0.0, "step_ms_after": ms(after),
        "recovery_ms": rec.seconds * 1e3 if rec else None, "kernels_restored": stats.kernels_restored,
        "steps_replayed": stats.steps_replayed, "messages_replayed": stats.messages_replayed,
        "restored": {str(k): list(v) for k, v in drill["restored"].items()},
        "lost": {str(k): v for k, v in drill["lost"].items()},
        "destroy_ms": destroy_s * 1e3,
        "checksum": int(drill["field"].astype(np.int64).sum()) if drill["field"] is not None else None,
        "png": png,
    }


def _policy_cost(plain: list[float], policy: list[float]) -> tuple[float | None, float]:
    """(cost, noise) in ms per step: the median step with the policy minus the median
    without it, and the step-to-step noise (the larger median absolute deviation of the
    two runs). The cost is None, not measurable, unless it stands above the noise: the
    policy cannot make a step faster, so a difference inside the noise is no figure."""
    if not plain or not policy:
        return None, 0.0
    a, b = np.asarray(plain) * 1e3, np.asarray(policy) * 1e3
    noise = float(max(np.median(np.abs(a - np.median(a))), np.median(np.abs(b - np.median(b)))))
    cost = float(np.median(b) - np.median(a))
    return (cost if cost > noise else None), noise


def _ms(v: float | None) -> str:
    return f"{v:9.3f} ms" if v is not None else f"{'n/a':>9}   "


def print_drill(r: dict[str, Any]) -> None:
    """Print the drill's figures (the JSON form has the same keys)."""
    w, h = r["size"]
    print(f"vkmulti stencil lost-GPU drill: {w}x{h} grid, {r['steps']} steps, GPU {r['lose_gpu']} lost before "
          f"step {r['at_step']}, checkpoint every {r['checkpoint_every']} steps")
    if r["note"]:
        print(f"note: {r['note']}")
    print(f"  step without a policy          {_ms(r['step_ms_without_policy'])} (median, before the loss step)")
    cost = r["policy_cost_ms_per_step"]
    cost_text = (f"{cost:+.3f} ms/step" if cost is not None else
                 "not measurable: no step before the loss" if r["step_ms_with_policy"] is None else
                 f"not measurable: within the step-to-step noise of {r['step_noise_ms']:.3f} ms")
    print(f"  step with the policy           {_ms(r['step_ms_with_policy'])} "
          f"(checkpoints + replay log: {cost_text})")
    print(f"  the step of the loss           {_ms(r['step_ms_at_loss'])} (recovery inside it)")
    print(f"  steps after                    {_ms(r['step_ms_after'])} (median, on the survivors)")
    rec = r["recovery_ms"]
    print(f"  recovery                       {rec:9.3f} ms" if rec is not None else "  recovery: none")
    moved = ", ".join(f"{k} GPU {a} -> {b}" for k, (a, b) in r["restored"].items()) or "-"
    lost = ", ".join(f"{k} (GPU {d})" for k, d in r["lost"].items()) or "-"
    print(f"  kernels restored {r['kernels_restored']}, steps replayed {r['steps_replayed']}, messages handed "
          f"again {r['messages_replayed']}; restored: {moved}; lost: {lost}")
    print(f"  destroy() after the loss       {r['destroy_ms']:9.3f} ms")
    if r["checksum"] is None:
        print("final field: NOT whole (a slab was lost without a checkpoint to restore it from)")
        return
    print(f"final field bit-identical to the run without loss: {'yes' if r['identical'] else 'NO'}"
          f"  (checksum {r['checksum']})")
    if r.get("png"):
        print(f"wrote {r['png']}")


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`vkmulti demo stencil --lose-gpu GPU@STEP [options]` (options from stencil.parse_arguments);
    exit 1 if the final field differs from the run without loss."""
    note = use_virtual_if_no_gpu(args.virtual)
    width, height = args.size or LIGHT_SIZE
    return report(parser, args, print_drill, lambda: stencil_drill(
        width, height, args.steps or DRILL_STEPS, args.lose_gpu, every=args.checkpoint_every,
        devices=args.devices, note=note, output=args.output or None))
