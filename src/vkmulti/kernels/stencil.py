"""A 2D Jacobi (heat diffusion) grid split into row slabs, one stencil kernel per
slab, halo rows exchanged every step as K2K messages (across devices by the
CrossGpuK2KRouter). `run_stencil(manager, field, steps, devices)` is the
one-call form: N steps of a grid over these devices, the final field back.

Integer math (`new = (up + down + left + right + 2) >> 2`, int32), so every
device split gives the same field bit for bit, and `reference.jacobi_reference`
gives it in numpy. The first and last columns and the `top` / `bottom`
boundary rows stay fixed.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field as dc_field
from typing import TYPE_CHECKING, Any, Iterable, TypedDict

import numpy as np

from .._core.checks import check_count, check_index, is_int, short_repr, short_str
from .._core.lifetime import Deadline
from .reference import split_rows, stencil_field, stencil_kernel, stencil_tile_state
from .coordinator.coordinator import MultiGpuCoordinator
from .k2k.router import CrossGpuK2KRouter
from .runtime.runtime import KernelRuntime

if TYPE_CHECKING:
    from numpy.typing import ArrayLike
    from ..device.manager import MultiDeviceManager

    class EdgeStats(TypedDict):
        """What moved between one pair of devices during a run."""
        moves: int
        bytes: int
        method: str

__all__ = ["StencilSlabs", "StencilRun", "run_stencil", "stencil_payload_size"]

_MAX_PAYLOAD = 1 << 16


def stencil_payload_size(width: int) -> int:
    """The message payload that carries a `width`-cell halo row in as few messages
    as possible: the row itself (rounded up to 16 bytes) up to 64 KiB."""
    if not is_int(width) or width < 3:
        raise ValueError(f"width must be an int >= 3, got {short_repr(width)}")
    return min(_MAX_PAYLOAD, -(-width * 4 // 16) * 16)


def _as_field(field: Any) -> np.ndarray:
    try:
        f = np.asarray(field)
    except Exception as exc:   # noqa: BLE001 - anything numpy cannot read
        raise TypeError(f"field must be a 2D int32 array, got {type(field).__name__}: {short_str(exc)}") from None
    if f.ndim != 2:
        raise ValueError(f"field must be 2D (rows x columns), got shape {f.shape}")
    if f.dtype != np.int32:
        if not np.issubdtype(f.dtype, np.integer):
            raise TypeError(f"field must hold integers (int32), got {f.dtype}")
        if f.size and (f.min() < np.iinfo(np.int32).min or f.max() > np.iinfo(np.int32).max):
            raise ValueError("field values must fit int32")
        f = f.astype(np.int32)
    h, w = f.shape
    if w < 3 or h < 1:
        raise ValueError(f"field must be at least 1 row x 3 columns, got {h}x{w}")
    return np.ascontiguousarray(f)


def _boundary(row: Any, width: int, label: str) -> np.ndarray:
    if row is None:
        return np.zeros(width, np.int32)
    r = np.asarray(row)
    if r.shape != (width,):
        raise ValueError(f"{label} must be a row of {width} int32 cells, got shape {r.shape}")
    if not np.issubdtype(r.dtype, np.integer):
        raise TypeError(f"{label} must hold integers (int32), got {r.dtype}")
    return np.ascontiguousarray(r, dtype=np.int32)


class StencilSlabs:
    """The slabs of one grid on a KernelRuntime: slab i holds rows `slabs[i]` on
    device `devices[i]`. Neighbouring slabs exchange their edge rows every step;
    slabs on different devices need a CrossGpuK2KRouter attached to the runtime
    (the step raises KernelMessageError for the sender otherwise). `timeout`: for
    the launches (KernelRuntime.launch)."""

    def __init__(self, runtime: KernelRuntime, field: ArrayLike, devices: Iterable[int], *,
                 top: ArrayLike | None = None, bottom: ArrayLike | None = None,
                 name: str = "stencil", timeout: float | None = 60.0):
        deadline = Deadline(timeout)   # (checks it)
        f = _as_field(field)
        h, w = f.shape
        self.devices = [check_index(d, "device") for d in devices]   # (int() took bools, floats, digits)
        if not self.devices:
            raise ValueError("devices must name at least one device (one slab per entry)")
        if len(self.devices) > h:
            raise ValueError(f"{len(self.devices)} slabs for {h} rows: at most one slab per row")
        self.rt, self.width, self.height = runtime, w, h
        self.top, self.bottom = _boundary(top, w, "top"), _boundary(bottom, w, "bottom")
        self.slabs = split_rows(h, len(self.devices))
        self.steps = 0
        self.kernels: list[Any] = []
        # steps not seen done yet; slabs on several devices read each other's outbox regions in
        # place, read by the step after the one that wrote them: at most in_flight - 2 may be
        # unfinished when a step is submitted, or a slab's next region is still read and it is deferred
        self._unfinished: deque = deque()
        self._ahead = runtime.in_flight - (2 if len(set(self.devices)) > 1 else 1)
        try:
            for i, ((r0, n), dev) in enumerate(zip(self.slabs, self.devices)):
                spec = stencil_kernel(w, n, runtime.payload_size)
                self.kernels.append(runtime.launch(spec, f"{name}-{i}", device=dev, timeout=deadline.left(),
                                                   state=stencil_tile_state(f, r0, n, self.top, self.bottom)))
            for i, (k, (_, n)) in enumerate(zip(self.kernels, self.slabs)):
                up = self.kernels[i - 1].address if i > 0 else 0
                down = self.kernels[i + 1].address if i + 1 < len(self.kernels) else 0
                k.set_params(up, down, w, n)
        except BaseException:
            self.destroy()
            raise

    def step(self, n: int = 1, *, timeout: float | None = 60.0) -> list[float]:
        """Run `n` steps (submitted back to back, the GPUs ordered by semaphores);
        returns the host time each step() call took. Each waits up to `timeout` s for
        room (earlier steps to finish); on vkmulti.TimeoutError or Ctrl-C no slab made
        the step that was waiting."""
        n = check_count(n, "n")
        Deadline(timeout)   # (checks it)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            deadline = Deadline(timeout)
            while len(self._unfinished) > self._ahead:   # (a lost device's steps are not waited for)
                self._unfinished[0].wait(deadline.left())
                self._unfinished.popleft()
            ticket = self.rt.step(self.kernels, timeout=deadline.left())
            if ticket.deferred:   # a slab held back would read a stale halo next step
                raise RuntimeError(f"stencil slab deferred at step {self.steps}: {ticket.deferred}")
            self._unfinished.append(ticket)
            times.append(time.perf_counter() - t0)
            self.steps += 1
        return times

    def field(self, timeout: float | None = 60.0) -> np.ndarray:
        """The whole field (rows x columns int32) after the steps so far, within `timeout` s."""
        deadline = Deadline(timeout)
        self.rt.synchronize(deadline.left())
        parts = [stencil_field(self.rt.read_state(k, self.steps % 2, timeout=deadline.left()), self.width, n)
                 for k, (_, n) in zip(self.kernels, self.slabs)]
        return np.vstack(parts)

    def destroy(self, timeout: float | None = 30.0) -> None:
        """Free the slabs' kernels (idempotent), within `timeout` s. After a
        vkmulti.TimeoutError or Ctrl-C the kernels it stopped are freed by the next call."""
        deadline = Deadline(timeout)
        for k in self.kernels:
            self.rt.destroy_kernel(k, timeout=deadline.left())
        self.kernels = []
        self._unfinished.clear()

    def __enter__(self) -> "StencilSlabs":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


@dataclass
class StencilRun:
    """What `run_stencil` did: the final field and the figures of the timed steps."""
    field: np.ndarray
    steps: int
    devices: list[int]
    slabs: list[tuple[int, int]]
    seconds: float                   # the timed steps, submitted back to back, until all were done
    payload_size: int
    step_seconds: list[float] = dc_field(default_factory=list)   # host time of each step() call
    edges: dict[tuple[int, int], EdgeStats] = dc_field(default_factory=dict)   # per device pair moved
    host_seconds: float = 0.0        # CPU time of the stepping thread over the timed steps (its waits excluded)

    @property
    def step_ms(self) -> float:
        return self.seconds / self.steps * 1e3 if self.steps else 0.0

    @property
    def host_share(self) -> float:
        """The host's work as a share of the run's time (CPU time of the stepping thread / wall time)."""
        return self.host_seconds / self.seconds if self.seconds > 0 else 0.0


def run_stencil(manager: MultiDeviceManager, field: ArrayLike, steps: int, devices: Iterable[int] | None = None, *,
                top: ArrayLike | None = None, bottom: ArrayLike | None = None, payload_size: int | None = None, warmup: int = 2, in_flight: int = 3,
                timeout: float | None = 120.0) -> StencilRun:
    """Run `steps` Jacobi steps of `field` split into one row slab per entry of
    `devices` (device indices of `manager`, a MultiDeviceManager; default: one
    slab per device) and return the final field with the timings.

    `warmup` steps of a throwaway copy run first on the same devices (pipelines,
    transfer rings and landing buffers made) and are not timed.
    """
    f = _as_field(field)
    steps, warmup = check_count(steps, "steps"), check_count(warmup, "warmup")   # (numpy ints too, never bools)
    Deadline(timeout)   # (checks it before anything is made)
    devs = list(range(manager.device_count)) if devices is None else [check_index(d, "device") for d in devices]
    for d in devs:
        if not 0 <= d < manager.device_count:
            raise IndexError(f"device {short_repr(d)} out of range: the manager has {manager.device_count} device(s)")
    payload = stencil_payload_size(f.shape[1]) if payload_size is None else payload_size
    coord = MultiGpuCoordinator.from_manager(manager)
    rt = KernelRuntime(coord, manager, payload_size=payload, in_flight=in_flight, max_kernels=max(8, 2 * len(devs) + 2))
    router = CrossGpuK2KRouter(coord, rt) if len(set(devs)) > 1 else None
    try:
        if warmup:
            with StencilSlabs(rt, f, devs, top=top, bottom=bottom, name="warmup", timeout=timeout) as w:
                w.step(warmup, timeout=timeout)
                rt.synchronize(timeout)
        before = router.edge_traffic() if router is not None else {}
        slabs = StencilSlabs(rt, f, devs, top=top, bottom=bottom, timeout=timeout)
        try:
            t0, c0 = time.perf_counter(), time.thread_time()
            step_times = slabs.step(steps, timeout=timeout)
            rt.synchronize(timeout)
            seconds, host = time.perf_counter() - t0, time.thread_time() - c0
            out = slabs.field(timeout)
        finally:
            slabs.destroy()
        edges = {}
        if router is not None:
            for e, (moves, nbytes) in router.edge_traffic().items():
                m0, b0 = before.get(e, (0, 0))
                edges[e] = {"moves": moves - m0, "bytes": nbytes - b0, "method": router.transfer_method(*e)}
        return StencilRun(out, steps, devs, list(slabs.slabs), seconds, payload, step_times, edges,  # type: ignore[arg-type]
                          host)
    finally:
        if router is not None:
            router.detach()
        rt.destroy()
