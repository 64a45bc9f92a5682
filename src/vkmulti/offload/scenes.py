"""Scene helpers for library users: a frame tiled with ReferenceSRUs of varied cost.

What the demos render, and a quick way to give SRUOffloadCoordinator (or
ClusterManager) a frame's worth of work without an engine of one's own.
"""
from __future__ import annotations

import math

import numpy as np

from .._core.checks import check_count
from .render import ReferenceSRU

__all__ = ["make_srus", "LIGHT_ITERATIONS", "HEAVY_ITERATIONS"]

#: Steps per pixel: light (lavapipe, a few seconds) and render-heavy (real GPUs).
LIGHT_ITERATIONS = (24, 160)
HEAVY_ITERATIONS = (40_000, 120_000)
_PALETTE = [((1.0, 0.55, 0.15), (0.08, 0.16, 0.45)), ((0.95, 0.9, 0.3), (0.35, 0.05, 0.25)),
            ((0.3, 0.95, 0.7), (0.05, 0.12, 0.2)), ((1.0, 0.35, 0.45), (0.1, 0.05, 0.3)),
            ((0.55, 0.75, 1.0), (0.02, 0.08, 0.12)), ((0.9, 0.9, 0.95), (0.25, 0.1, 0.05))]


def make_srus(count: int, width: int, height: int, *, heavy: bool = False, seed: int = 1) -> list[ReferenceSRU]:
    """`count` ReferenceSRUs tiling a width x height frame, with varied steps per pixel (varied costs).

    Ints (numpy integers too): TypeError for other types, ValueError for a count or size
    below 1, a negative seed or a frame too small for `count` tiles."""
    count = check_count(count, "SRU count", 1)
    width, height = check_count(width, "frame width", 1), check_count(height, "frame height", 1)
    seed = check_count(seed, "seed")
    if not isinstance(heavy, (bool, np.bool_)):
        raise TypeError(f"heavy must be a bool, got {type(heavy).__name__}")
    cols = math.ceil(math.sqrt(count))
    rows = math.ceil(count / cols)
    if width < cols or height < rows:
        raise ValueError(f"a {width}x{height} frame is too small for {count} SRUs ({cols}x{rows} tiles)")
    lo, hi = HEAVY_ITERATIONS if heavy else LIGHT_ITERATIONS
    rng = np.random.default_rng(seed)
    srus: list[ReferenceSRU] = []
    th = height // rows
    for r in range(rows):
        n = cols if r < rows - 1 else count - cols * (rows - 1)
        tw = width // n
        y = r * th
        h = th if r < rows - 1 else height - y
        for c in range(n):
            x = c * tw
            w = tw if c < n - 1 else width - x
            a, b = _PALETTE[int(rng.integers(len(_PALETTE)))]
            srus.append(ReferenceSRU(len(srus), w, h, x=x, y=y, seed=int(rng.integers(2**32)),
                                     iterations=int(rng.integers(lo, hi + 1)), color_a=a, color_b=b,
                                     border=max(1, min(w, h) // 128)))
    return srus
