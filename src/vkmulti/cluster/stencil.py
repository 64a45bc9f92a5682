"""One node's slab of a cluster stencil run: the reference Jacobi stencil tile kernels on its GPUs.

A node holds a contiguous band of rows of the grid, split over its GPUs
(rows in proportion to each GPU's throughput), one `stencil_kernel` tile per
GPU in the node's KernelRuntime. Halo rows between tiles of the node travel
as K2K messages on the GPU path (same device: the runtime; another GPU of the
node: the runtime's `CrossGpuK2KRouter`). Halo rows at the node's edges come
from the neighbouring nodes: the agent hands them in as host messages with
the kernel's halo tags before a step, and reads its own new edge rows back
after it (the driver passes them on through Ray's object store).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..kernels import CrossGpuK2KRouter, KernelRuntime, MultiGpuCoordinator, stencil_kernel
from ..kernels.reference import stencil_field, stencil_tile_state
from .errors import ClusterError
from .._core.checks import check_number, is_int, short_repr

if TYPE_CHECKING:
    from ..device.manager import MultiDeviceManager

__all__ = ["StencilSlab", "split_rows_weighted"]

#: The most rows a split takes (past it the proportional shares leave float range).
MAX_ROWS = 1 << 62
#: The stencil kernel's halo tags (kernels/reference.py: STENCIL_FROM_ABOVE / _BELOW).
_FROM_ABOVE, _FROM_BELOW = 1, 2


def split_rows_weighted(height: int, weights: Sequence[float]) -> list[tuple[int, int]]:
    """(first row, rows) per part, contiguous, rows in proportion to `weights` (largest
    remainder), every part at least one row; parts beyond `height` rows get none (0 rows)."""
    if not is_int(height) or not 1 <= height <= MAX_ROWS:
        raise ValueError(f"height must be an int in [1, {MAX_ROWS}], got {short_repr(height)}")
    try:
        w = [check_number(x, "a weight", positive=True) for x in weights]
    except TypeError:
        raise TypeError(f"weights must be a sequence of numbers, got {short_repr(weights)}") from None
    if not w:
        raise ValueError("weights must name at least one part, got none")
    n = min(len(w), height)
    order = sorted(range(len(w)), key=lambda i: (-w[i], i))[:n]       # the heaviest parts get rows
    share = [w[i] if i in order else 0.0 for i in range(len(w))]
    total = sum(share)
    exact = [height * x / total for x in share]
    rows = [max(1, math.floor(e)) if i in order else 0 for i, e in enumerate(exact)]
    while sum(rows) > height:                                          # the max(1, ...) overshot
        i = max((i for i in order if rows[i] > 1), key=lambda i: (rows[i] - exact[i], i))
        rows[i] -= 1
    for i in sorted(order, key=lambda i: (-(exact[i] - rows[i]), i))[:height - sum(rows)]:
        rows[i] += 1
    out, r0 = [], 0
    for n_rows in rows:
        out.append((r0, n_rows))
        r0 += n_rows
    return out


class StencilSlab:
    """Rows [row0, row0 + rows) of a width-wide Jacobi grid on one node's GPUs.

    `above` / `below`: the halo rows just outside the slab (the neighbour
    node's edge rows or the grid's fixed boundary). `gpu_weights`: one weight
    per GPU of the node (0: leave that GPU out).
    """

    def __init__(self, manager: MultiDeviceManager, slab: np.ndarray, above: np.ndarray, below: np.ndarray,
                 gpu_weights: Sequence[float], *, payload_size: int = 256, timeout: float = 60.0):
        slab = np.ascontiguousarray(slab, dtype=np.int32)
        if slab.ndim != 2 or slab.shape[1] < 3 or slab.shape[0] < 1:
            raise ValueError(f"slab must be a (rows >= 1, width >= 3) int32 array, got shape {slab.shape}")
        self.rows, self.width = slab.shape
        self.timeout = check_number(timeout, "timeout", positive=True)
        gpus = [g for g, w in enumerate(gpu_weights) if w > 0]
        if not gpus:
            raise ValueError(f"no GPU with a weight > 0: {short_repr(list(gpu_weights))}")
        parts = [(g, r0, n) for g, (r0, n) in zip(gpus, split_rows_weighted(self.rows, [gpu_weights[g] for g in gpus]))
                 if n > 0]
        self.runtime = KernelRuntime(MultiGpuCoordinator.from_manager(manager), manager, max_kernels=64,
                                     payload_size=payload_size)
        self.router: CrossGpuK2KRouter | None = None   # halo rows between the node's GPUs
        self.tiles: list[tuple[Any, int]] = []
        try:
            if len({g for g, _, _ in parts}) > 1:
                self.router = CrossGpuK2KRouter(self.runtime.coordinator, self.runtime)
            a = np.asarray(above, dtype=np.int32).reshape(self.width)
            b = np.asarray(below, dtype=np.int32).reshape(self.width)
            for i, (g, r0, n) in enumerate(parts):
                k = self.runtime.launch(stencil_kernel(self.width, n, payload_size), f"tile{i}", device=g,
                                        state=stencil_tile_state(slab, r0, n, a, b), timeout=self.timeout)
                self.tiles.append((k, n))
            for i, (k, n) in enumerate(self.tiles):
                up = self.tiles[i - 1][0].address if i > 0 else 0
                down = self.tiles[i + 1][0].address if i + 1 < len(self.tiles) else 0
                k.set_params(up, down, self.width, n)
        except BaseException:
            self.destroy()
            raise
        self.gpu_rows = {g: n for g, _, n in parts}
        self.steps = 0
        self._pw = payload_size // 4

    def _send_halo(self, kernel: Any, row: np.ndarray, side: int) -> None:
        row = np.ascontiguousarray(row)
        for c in range(-(-self.width // self._pw)):
            self.runtime.send(kernel, row[c * self._pw:(c + 1) * self._pw].tobytes(), tag=side | (c << 8),
                              timeout=self.timeout)

    def step(self, above: np.ndarray | None, below: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """One Jacobi step with this step's halo rows from the neighbour nodes (None: keep the
        stored one, e.g. the fixed boundary or the initial field); returns the new first and last row."""
        for row in (above, below):   # (a neighbouring node's rows: a peer's data, never cast to fit)
            if row is not None and not (isinstance(row, np.ndarray) and row.dtype == np.int32
                                        and row.shape == (self.width,)):
                got = f"{row.dtype} {row.shape}" if isinstance(row, np.ndarray) else type(row).__name__
                raise ClusterError(f"a halo row from the neighbouring node is {got[:80]}, not a ({self.width},) "
                                   f"int32 row; nothing was stepped")
        if above is not None:
            self._send_halo(self.tiles[0][0], above, _FROM_ABOVE)
        if below is not None:
            self._send_halo(self.tiles[-1][0], below, _FROM_BELOW)
        ticket = self.runtime.step([k for k, _ in self.tiles], timeout=self.timeout)
        if ticket.deferred:
            raise ClusterError(f"stencil tiles were deferred: {ticket.deferred}")
        self.steps += 1
        gen = self.steps % 2                        # the generation the step just wrote
        row = self.width * 4
        first = self.runtime.read_state(self.tiles[0][0], gen, offset=row, size=row, timeout=self.timeout)
        k_last, n_last = self.tiles[-1]
        last = self.runtime.read_state(k_last, gen, offset=n_last * row, size=row, timeout=self.timeout)
        return first.view(np.int32).copy(), last.view(np.int32).copy()

    def field(self) -> np.ndarray:
        """The slab's rows as of the latest step (rows x width int32)."""
        gen = self.steps % 2
        return np.vstack([stencil_field(self.runtime.read_state(k, gen, timeout=self.timeout), self.width, n)
                          for k, n in self.tiles])

    def destroy(self) -> None:
        """Free the tiles, the router and the runtime (idempotent)."""
        if self.router is not None:
            self.router.detach(self.timeout)
            self.router = None
        if self.runtime is not None:
            self.runtime.destroy(self.timeout)
            self.runtime = None  # type: ignore[assignment]
        self.tiles = []
