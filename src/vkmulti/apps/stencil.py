"""What the stencil demo (stencil_demo.py) and its lost-GPU drill (stencil_drill.py) share:
the heat grid they start from, its colour map, their options and how their figures are reported."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import numpy as np

from ..errors import VkmError
from .cli_args import (Parser, add_output_argument, add_virtual_argument, default_output, parse_devices, parse_loss,
                       parse_size, print_result)
from .scenes import write_png

__all__ = ["LIGHT_SIZE", "LIGHT_STEPS", "DRILL_STEPS", "HEAVY_SIZE", "HEAVY_STEPS", "HOT", "initial_field",
           "colorize", "colour_bar", "write_field_png", "rate_text", "add_arguments", "parse_arguments", "report"]

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
    return _map(t[::step, ::step])


def _map(t: np.ndarray) -> np.ndarray:
    """RGB8 of values `t` in [0, 1] through the colour map (inferno)."""
    try:
        from matplotlib import colormaps
        rgb = colormaps["inferno"](t)[..., :3] * 255.0
    except ImportError:
        pos = t * (len(_INFERNO) - 2)
        i = np.clip(pos.astype(np.int64), 0, len(_INFERNO) - 2)
        frac = (pos - i)[..., None]
        rgb = _INFERNO[i] * (1 - frac) + _INFERNO[i + 1] * frac
    return np.clip(rgb + 0.5, 0, 255).astype(np.uint8)


def colour_bar(rgb: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """`rgb` (a colorize picture) with a colour bar on its right: the map from `hi`
    (top) to `lo` (bottom), the two values written beside it, so the picture
    says what its colours mean."""
    h, w = rgb.shape[:2]
    bar_w, pad = max(8, min(24, h // 12)), 4
    labels = [f"{hi:.6g}", f"{lo:.6g}"]
    text_w = 6 * max(len(t) for t in labels) + 2 * pad      # Pillow's default font: ~6 px a character
    out = np.full((h, w + pad + bar_w + text_w, 3), 255, np.uint8)
    out[:, :w] = rgb
    ramp = _map(np.linspace(1.0, 0.0, h))                    # hot at the top
    out[:, w + pad:w + pad + bar_w] = ramp[:, None, :]
    try:
        from PIL import Image as PILImage, ImageDraw
    except ImportError:
        return out
    im = PILImage.fromarray(out, "RGB")
    draw = ImageDraw.Draw(im)
    x = w + 2 * pad + bar_w
    draw.text((x, 0), labels[0], fill=(0, 0, 0))
    draw.text((x, max(0, h - 11)), labels[1], fill=(0, 0, 0))
    return np.asarray(im)


def write_field_png(field: np.ndarray, path: str) -> None:
    """The field as a PNG: colorize's picture with its colour bar (the field's min and max)."""
    write_png(colour_bar(colorize(field), float(field.min()), float(field.max())), path)


def rate_text(nbytes: float, seconds: float) -> str:
    """A transfer rate in the unit that shows it (GB/s, MB/s, kB/s, B/s); 'not
    measurable' when nothing moved or no time was measured."""
    if nbytes <= 0 or seconds <= 0:
        return "not measurable"
    rate = nbytes / seconds
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if rate >= scale:
            return f"{rate / scale:.3g} {unit}"
    return f"{rate:.3g} B/s"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The stencil demo's options, the drill's (--lose-gpu, --checkpoint-every) included."""
    p.add_argument("--size", type=parse_size, default=None, metavar="WxH",
                   help=f"grid size in cells (default {LIGHT_SIZE[0]}x{LIGHT_SIZE[1]}, "
                        f"{HEAVY_SIZE[0]}x{HEAVY_SIZE[1]} with --heavy)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"Jacobi steps (default {LIGHT_STEPS}, {HEAVY_STEPS} with --heavy)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps of a throwaway grid first (default 2)")
    p.add_argument("--devices", type=parse_devices, default=None, metavar="I,J,...",
                   help="physical devices to use, one slab each (default: all); the one-GPU run uses the first")
    add_output_argument(p, "--output", image=True, default=default_output("vkmulti-stencil.png"), metavar="PATH",
                        help="PNG of the final field with a colour bar (default vkmulti-stencil.png in the "
                             "temporary folder, %(default)s; '' to skip)")
    p.add_argument("--heavy", action="store_true", help="a grid and step count sized for real GPUs")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--lose-gpu", type=parse_loss, default=None, metavar="GPU@STEP",
                   help="the drill: lose this secondary GPU right before this step (fault hook), restore its slab "
                        "from its checkpoint on the survivors, and check the final field against a run without "
                        f"loss (default {DRILL_STEPS} steps); exit 1 if it differs")
    p.add_argument("--checkpoint-every", type=int, default=16, metavar="N",
                   help="the drill's checkpoint policy: every N steps (default 16)")
    add_virtual_argument(p)


def parse_arguments(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and the checked options of `vkmulti demo stencil [options]`: exit 2 with a one-line
    message on bad input, before any GPU work."""
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
    return parser, args


def report(parser: argparse.ArgumentParser, args: argparse.Namespace, show: Callable[[dict[str, Any]], None],
           work: Callable[[], dict[str, Any]]) -> int:
    """Run the demo or the drill (`work`), print its figures (JSON or `show`), exit 1 if
    the field differs from one GPU's; bad arguments -> usage error, vkmulti errors -> 1."""
    try:
        r = work()
    except (ValueError, IndexError) as exc:
        parser.error(str(exc))
    except (VkmError, MemoryError) as exc:   # e.g. a grid larger than a GPU's memory
        print(f"vkmulti demo stencil: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print_result(r, args.json, show)
    return 0 if r["identical"] else 1
