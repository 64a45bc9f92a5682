"""What the SRU demos share: the frame sizes, the frame as RGB8 and the PNG it is written to.

The SRUs themselves come from vkmulti.offload.make_srus (a library helper).
"""
from __future__ import annotations

import argparse

import numpy as np

from ..offload.scenes import HEAVY_ITERATIONS, LIGHT_ITERATIONS
from .cli_args import save_image

__all__ = ["LIGHT_SIZE", "HEAVY_SIZE", "LIGHT_ITERATIONS", "HEAVY_ITERATIONS", "frame_size", "frame_to_rgb8",
           "write_png"]

#: Frame sizes: light (lavapipe, a few seconds) and render-heavy (real GPUs).
LIGHT_SIZE = (1280, 720)
HEAVY_SIZE = (3840, 2160)


def frame_size(args: argparse.Namespace) -> tuple[int, int]:
    """The demo's frame size: --size, else the light or (--heavy) the heavy default."""
    return args.size or (HEAVY_SIZE if args.heavy else LIGHT_SIZE)


def frame_to_rgb8(pixels: np.ndarray) -> np.ndarray:
    """An RGBA16F frame as downloaded ((h, w, 8) uint8) -> (h, w, 3) uint8, sRGB-ish gamma 2.2."""
    h, w = pixels.shape[:2]
    f = np.ascontiguousarray(pixels).view(np.float16).reshape(h, w, 4)[..., :3].astype(np.float32)
    return (np.clip(f, 0.0, 1.0) ** (1 / 2.2) * 255.0 + 0.5).astype(np.uint8)


def write_png(rgb: np.ndarray, path: str) -> None:
    """Write an (h, w, 3) uint8 picture as an image file (Pillow, the demos' optional dependency)."""
    from PIL import Image as PILImage

    save_image(PILImage.fromarray(rgb, "RGB"), path)
