"""`python -m vkmulti demo stencil`: 2D heat diffusion (Jacobi) across every GPU.

The grid is split into row slabs, one stencil kernel per GPU; halo rows cross
GPUs every step as K2K messages moved by the CrossGpuK2KRouter. Prints the
per-step time on all GPUs and on one, the speed-up, the halo traffic and GB/s
per GPU pair, checks that the result is bit-identical to the one-GPU run, and
writes the final field as a PNG with a colour map. With no GPU it runs on the
virtual lavapipe pair (whose two "GPUs" share the CPU: no speed-up there).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from .demo import parse_devices, parse_loss, parse_size
from ..errors import VkmError

LIGHT_SIZE, LIGHT_STEPS = (512, 384), 40
DRILL_STEPS = 200
HEAVY_SIZE, HEAVY_STEPS = (23000, 23000), 100
HOT = 1 << 20
#: inferno at 9 stops (matplotlib's values), used when matplotlib is not installed
_INFERNO = np.array([[0, 0, 4], [40, 11, 84], [101, 21, 110], [159, 42, 99], [212, 72, 66], [245, 125, 21],
                     [250, 193, 39], [252, 255, 164], [252, 255, 164]], np.float32)


def initial_field(width: int, height: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(field, top, bottom): a cold plate with a few hot disks, the top edge held hot."""
    rng = np.random.default_rng(seed)
    field = np.zeros((height, width), np.int32)
    for _ in range(6):   # each disk within its bounding box: no grid-sized temporaries
        cy, cx = rng.uniform(0.2, 0.9) * height, rng.uniform(0.1, 0.9) * width
        r = rng.uniform(0.04, 0.12) * min(width, height)
        y0, y1 = max(0, int(cy - r)), min(height, int(cy + r) + 1)
        x0, x1 = max(0, int(cx - r)), min(width, int(cx + r) + 1)
        yy, xx = np.ogrid[y0:y1, x0:x1]
        field[y0:y1, x0:x1][(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = HOT
    top = np.full(width, HOT, np.int32)
    bottom = np.zeros(width, np.int32)
    return field, top, bottom


def colorize(field: np.ndarray, max_side: int = 2048) -> np.ndarray:
    """The field as RGB8 through a colour map (matplotlib's inferno if installed,
    the same map at 9 stops otherwise), scaled down to at most `max_side` pixels."""
    f = field.astype(np.float64)
    lo, hi = float(f.min()), float(f.max())
    t = (f - lo) / (hi - lo) if hi > lo else np.zeros_like(f)
    step = max(1, -(-max(field.shape) // max_side))
    t = t[::step, ::step]
    try:
        from matplotlib import colormaps
        rgb = colormaps["inferno"](t)[..., :3] * 255.0
    except ImportError:
        pos = t * (len(_INFERNO) - 2)
        i = np.clip(pos.astype(np.int64), 0, len(_INFERNO) - 2)
        frac = (pos - i)[..., None]
        rgb = _INFERNO[i] * (1 - frac) + _INFERNO[i + 1] * frac
    return np.clip(rgb + 0.5, 0, 255).astype(np.uint8)


def run(args: argparse.Namespace, note: str | None) -> dict[str, Any]:
    from ..kernels.stencil import run_stencil
    from ..device.manager import MultiDeviceManager

    width, height = args.size or (HEAVY_SIZE if args.heavy else LIGHT_SIZE)
    steps = args.steps or (HEAVY_STEPS if args.heavy else LIGHT_STEPS)
    field, top, bottom = initial_field(width, height)
    mgr = MultiDeviceManager.create(enabled=True, device_indices=args.devices)
    try:
        n = mgr.device_count
        if height < n:
            raise ValueError(f"a {height}-row grid cannot be split into {n} slabs (one per GPU)")
        single = run_stencil(mgr, field, steps, [0], top=top, bottom=bottom, warmup=args.warmup)
        multi = run_stencil(mgr, field, steps, list(range(n)), top=top, bottom=bottom, warmup=args.warmup)
        names = [s.name for s in mgr.slots]
    finally:
        mgr.destroy()
    identical = bool(np.array_equal(single.field, multi.field))
    pairs = []
    for (a, b), e in sorted(multi.edges.items()):
        pairs.append({"from": a, "to": b, "method": e["method"], "moves": e["moves"], "bytes": e["bytes"],
                      "bytes_per_step": e["bytes"] / steps if steps else 0,
                      "gbps": e["bytes"] / multi.seconds / 1e9 if multi.seconds else 0.0})
    out: dict[str, Any] = {
        "note": note, "virtual": note is not None, "size": [width, height], "steps": steps,
        "devices": [{"index": i, "name": nm, "rows": list(multi.slabs[i])} for i, nm in enumerate(names)],
        "payload_size": multi.payload_size,
        "step_ms_single": single.step_ms, "step_ms_multi": multi.step_ms,
        "speedup": single.step_ms / multi.step_ms if multi.step_ms else 0.0,
        "pairs": pairs, "identical": identical,
        "checksum": int(multi.field.astype(np.int64).sum()),
    }
    if args.output:
        from PIL import Image as PILImage

        PILImage.fromarray(colorize(multi.field), "RGB").save(args.output)
        out["png"] = args.output
    return out


def print_report(r: dict[str, Any]) -> None:
    """Print the stencil demo's figures (the JSON form has the same keys)."""
    w, h = r["size"]
    print(f"vkmulti demo stencil: {w}x{h} int32 heat grid, {r['steps']} Jacobi steps, "
          f"{len(r['devices'])} GPU{'s' if len(r['devices']) != 1 else ''}")
    if r["note"]:
        print(f"note: {r['note']}")
    print("\nslabs:")
    for d in r["devices"]:
        r0, n = d["rows"]
        print(f"  GPU {d['index']} {d['name']:<32} rows {r0}-{r0 + n - 1} ({n})")
    print("\nper-step time:")
    print(f"  {len(r['devices'])} GPUs (halo rows as K2K messages)  {r['step_ms_multi']:9.3f} ms")
    print(f"  one GPU                            {r['step_ms_single']:9.3f} ms")
    print(f"  speed-up                           {r['speedup']:9.2f}x")
    if r["virtual"]:
        print("  (the virtual GPUs share this machine's CPU cores: no speed-up is expected from them)")
    if r["pairs"]:
        print(f"\nhalo traffic per GPU pair ({r['payload_size']}-byte payloads; whole outbox batches move):")
        for p in r["pairs"]:
            print(f"  GPU {p['from']} -> GPU {p['to']}  {p['method'] or '-':<13} {p['bytes_per_step'] / 1e3:9.1f} kB/step"
                  f"  {p['gbps']:8.3f} GB/s over the run  ({p['moves']} moves)")
    else:
        print("\none GPU: no halo traffic between GPUs")
    print(f"\nresult bit-identical to the one-GPU run: {'yes' if r['identical'] else 'NO'}"
          f"  (field checksum {r['checksum']})")
    if r.get("png"):
        print(f"wrote {r['png']}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The stencil demo's options (one-line errors and --virtual as every command has them)."""
    from .cli_args import add_virtual_argument

    p.add_argument("--size", type=parse_size, default=None, metavar="WxH",
                   help=f"grid size in cells (default {LIGHT_SIZE[0]}x{LIGHT_SIZE[1]}, "
                        f"{HEAVY_SIZE[0]}x{HEAVY_SIZE[1]} with --heavy)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"Jacobi steps (default {LIGHT_STEPS}, {HEAVY_STEPS} with --heavy)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps of a throwaway grid first (default 2)")
    p.add_argument("--devices", type=parse_devices, default=None, metavar="I,J,...",
                   help="physical devices to use, one slab each (default: all); the one-GPU run uses the first")
    p.add_argument("--output", default="vkmulti-stencil.png", metavar="PATH",
                   help="PNG of the final field (default vkmulti-stencil.png; '' to skip)")
    p.add_argument("--heavy", action="store_true", help="a grid and step count sized for real GPUs")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--lose-gpu", type=parse_loss, default=None, metavar="GPU@STEP",
                   help="the drill: lose this secondary GPU right before this step (fault hook), restore its slab "
                        "from its checkpoint on the survivors, and check the final field against a run without "
                        f"loss (default {DRILL_STEPS} steps); exit 1 if it differs")
    p.add_argument("--checkpoint-every", type=int, default=16, metavar="N",
                   help="the drill's checkpoint policy: every N steps (default 16)")
    add_virtual_argument(p)


def main(argv: list[str]) -> int:
    """`vkmulti demo stencil [options]`; exit 2 with a one-line message on bad input."""
    from .cli_args import Parser, check_output_path

    parser = Parser(prog="vkmulti demo stencil",
                    description="2D heat diffusion split over every GPU, halos as K2K messages")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.size is not None and args.size[0] < 3:
        parser.error(f"--size: the grid needs at least 3 columns, got {args.size[0]}")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.checkpoint_every < 1:
        parser.error(f"--checkpoint-every must be >= 1, got {args.checkpoint_every}")
    check_output_path(parser, args.output, "--output")   # before any GPU work
    from ..device.virtual import use_virtual_if_no_gpu
    note = use_virtual_if_no_gpu(args.virtual)
    if args.lose_gpu is not None:
        from .stencil_drill import print_drill, stencil_drill
        width, height = args.size or LIGHT_SIZE
        return _report(parser, args, print_drill, lambda: stencil_drill(
            width, height, args.steps or DRILL_STEPS, args.lose_gpu, every=args.checkpoint_every,
            devices=args.devices, note=note))
    return _report(parser, args, print_report, lambda: run(args, note))


def _report(parser: Any, args: Any, show: Any, work: Any) -> int:
    """Run the demo or the drill (`work`), print its figures (JSON or `show`), exit 1 if
    the field differs from one GPU's; bad arguments -> usage error, vkmulti errors -> 1."""
    try:
        r = work()
    except (ValueError, IndexError) as exc:
        parser.error(str(exc))
    except (VkmError, MemoryError) as exc:   # e.g. a grid larger than a GPU's memory
        print(f"vkmulti demo stencil: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(r, sys.stdout, indent=2)
        print()
    else:
        show(r)
    return 0 if r["identical"] else 1
