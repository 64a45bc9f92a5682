"""Lost-GPU drills (`python -m vkmulti demo --lose-gpu 1@50`): run frames across the
GPUs, lose one GPU in the middle of a given frame through the fault hook
(vkmulti.testing.lose_device), and check every frame against the one-GPU frame.
The same drill runs on real GPUs: the hook marks the device lost exactly as
the driver's VK_ERROR_DEVICE_LOST would."""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from ..device.manager import MultiDeviceManager
from ..device.virtual import use_virtual_if_no_gpu
from ..memory.image import Image
from ..offload import ReferenceRenderer, SRUOffloadCoordinator, make_srus
from ..testing import lose_device
from .cli_args import print_result
from .scenes import frame_size, frame_to_rgb8, write_png

__all__ = ["LossInjector", "sru_drill", "print_sru_drill", "main"]


class LossInjector:
    """A renderer that, once armed, loses its device right after its next render
    is submitted (so the loss lands in the middle of a frame, with that SRU's
    render and transfer in flight)."""

    def __init__(self, inner: Any, manager: Any, index: int):
        self.inner, self.manager, self.index = inner, manager, index
        self.armed = False
        self.fired_at: float | None = None

    def render(self, sru: Any, target: Any, *, wait: Any = None) -> Any:
        point = self.inner.render(sru, target, wait=wait)
        if self.armed:
            self.fire()
        return point

    def fire(self) -> None:
        """Lose the device now (once); disarms."""
        self.armed = False
        if self.fired_at is None:
            self.fired_at = time.perf_counter()
            lose_device(self.manager, self.index)

    def destroy(self) -> None:
        self.inner.destroy()


def sru_drill(srus: list[Any], width: int, height: int, frames: int, loss: tuple[int, int], *,
              devices: list[int] | None = None, note: str | None = None,
              output: str | None = None) -> dict[str, Any]:
    """Render `frames` frames of `srus` across the GPUs, losing GPU loss[0] during
    frame loss[1]; every frame is compared with the one-GPU frame; the last frame
    is written to `output` (a PNG) when given. Returns the figures."""
    gpu, at = loss
    mgr = MultiDeviceManager.create(enabled=True, device_indices=devices)
    owned: list[Any] = []
    injectors: dict[int, LossInjector] = {}
    out: dict[str, Any] = {"drill": "sru", "note": note, "virtual": note is not None, "srus": len(srus),
                           "size": [width, height], "frames": frames, "lose_gpu": gpu, "at_frame": at}

    arm: set[int] = set()   # GPUs to lose at their next render (a renderer made later is armed as made)

    def factory(ctx: Any) -> LossInjector:
        inj = injectors[ctx.slot.index] = LossInjector(ReferenceRenderer(ctx.slot), mgr, ctx.slot.index)
        inj.armed = ctx.slot.index in arm
        return inj
    t_destroy = None
    try:
        if not 1 <= gpu < mgr.device_count:
            raise ValueError(f"--lose-gpu {gpu}@{at}: GPU {gpu} is not a secondary of this machine "
                             f"({mgr.device_count} GPU{'s' if mgr.device_count != 1 else ''})")
        if at >= frames:
            raise ValueError(f"--lose-gpu {gpu}@{at}: frame {at} is past the {frames} frames rendered")
        frame = Image(mgr.primary, width, height)
        ref_frame = Image(mgr.primary, width, height)
        owned += [frame, ref_frame]
        single = SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory, devices=[0])
        owned.append(single)
        single.render_frame(srus, ref_frame)
        reference = ref_frame.download()
        multi = SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory)
        owned.append(multi)
        times, bad, lost_in = [], [], []
        pixels = None
        for f in range(frames):
            if f == at:   # (frame 0: the multi-GPU renderer of `gpu` is made during the frame)
                arm.add(gpu)
                if gpu in injectors:
                    injectors[gpu].armed = True
            t0 = time.perf_counter()
            rep = multi.render_frame(srus, frame)
            times.append(time.perf_counter() - t0)
            if f == at:
                arm.discard(gpu)
                if gpu not in injectors or injectors[gpu].fired_at is None:
                    LossInjector(None, mgr, gpu).fire()   # nothing ran there this frame: lose it after the frame
            if rep.lost:
                lost_in.append(f)
            pixels = frame.download()
            if not np.array_equal(pixels, reference):
                bad.append(f)
        stats = multi.failover_stats.as_dict()
        out.update({
            "identical": not bad, "frames_not_identical": bad, "loss_seen_in_frames": lost_in,
            "frame_ms_before_loss": _median_ms(times[:at]),
            "frame_ms_loss_frame": times[at] * 1e3,
            "frame_ms_after_loss": _median_ms(times[at + 1:]),
            "failover": stats, "unavailable": {str(k): v for k, v in multi.unavailable.items()},
            "devices_after": multi.usable_devices(),
        })
    finally:
        t0 = time.perf_counter()
        for obj in reversed(owned):
            obj.destroy()
        mgr.destroy()
        t_destroy = time.perf_counter() - t0
    out["destroy_ms_after_loss"] = t_destroy * 1e3
    if output and pixels is not None:
        write_png(frame_to_rgb8(pixels), output)
        out["png"] = output
    return out


def _median_ms(times: list[float]) -> float | None:
    """The median of `times` in ms; None without any (a loss in the first or the last frame)."""
    return statistics.median(times) * 1e3 if times else None


def _ms(v: float | None) -> str:
    return f"{v:9.2f} ms" if v is not None else f"{'n/a':>9}   "


def print_sru_drill(r: dict[str, Any]) -> None:
    """Print the drill's figures (the JSON form has the same keys)."""
    w, h = r["size"]
    print(f"vkmulti lost-GPU drill: {r['srus']} SRUs, {w}x{h}, {r['frames']} frames, GPU {r['lose_gpu']} lost "
          f"during frame {r['at_frame']}")
    if r["note"]:
        print(f"note: {r['note']}")
    print(f"  loss seen in frame(s)          {r['loss_seen_in_frames']}")
    print(f"  frame time before the loss     {_ms(r['frame_ms_before_loss'])} (median)")
    print(f"  the frame of the loss          {_ms(r['frame_ms_loss_frame'])}")
    print(f"  frame time after the loss      {_ms(r['frame_ms_after_loss'])} (median, GPUs {r['devices_after']})")
    fo = r["failover"]
    print(f"  SRUs rendered again            {fo['srus_rerendered']} (on the primary, GPU 0); frames "
          f"composited again: {fo['frames_repaired']}")
    for rec in fo["recoveries"]:
        print(f"  recovery on GPU {rec['device']}: {rec['what']} in {rec['seconds'] * 1e3:.2f} ms")
    print(f"  destroy after the loss         {r['destroy_ms_after_loss']:9.2f} ms")
    print(f"  all {r['frames']} frames identical to the one-GPU frame: {'yes' if r['identical'] else 'NO'}"
          + ("" if r["identical"] else f" (frames {r['frames_not_identical']})"))
    if r.get("png"):
        print(f"wrote {r['png']} (the last frame)")


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`demo --lose-gpu GPU@FRAME` (the CLI has checked the demo's shared options: demo.check_arguments);
    exit status 1 unless every frame is identical to the one-GPU frame."""
    note = use_virtual_if_no_gpu(args.virtual)
    width, height = frame_size(args)
    try:
        srus = make_srus(args.srus, width, height, heavy=args.heavy)
        r = sru_drill(srus, width, height, args.frames, args.lose_gpu, devices=args.devices, note=note,
                      output=args.output or None)
    except (ValueError, IndexError) as exc:
        parser.error(str(exc))
    print_result(r, args.json, print_sru_drill)
    return 0 if r["identical"] else 1
