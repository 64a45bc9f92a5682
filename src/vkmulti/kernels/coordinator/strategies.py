"""The load-balancing strategies of MultiGpuCoordinator: pure functions over a
RegistrySnapshot (the coordinator takes it under its lock and keeps the
round-robin counter). Rules and ties: see MultiGpuCoordinator."""
from __future__ import annotations

import operator
from typing import Any, Callable

from ...errors import BackendUnavailableError, DeviceNotAvailableError
from .config import LaunchOptions, LoadBalancingStrategy
from .records import DeviceStatus, RegistrySnapshot
from .topology import GpuTopology
from ..._core.checks import short_repr, short_str

__all__ = ["PICKERS", "require_candidates", "pick_first_available", "pick_least_loaded", "pick_round_robin",
           "pick_memory", "pick_compute", "nothing_fits", "describe_candidates", "ask_selector",
           "check_takes_kernel", "least_loaded_of", "pick_neighbour"]


def require_candidates(snap: RegistrySnapshot) -> None:
    """BackendUnavailableError when there is no slot, or no preferred slot that exists."""
    if not snap.infos:
        raise BackendUnavailableError("No GPU devices available: no device is registered")
    if not snap.candidates:
        raise BackendUnavailableError(f"No suitable GPU device available: none of the preferred devices "
                                      f"{short_repr(sorted(snap.preferred))} is registered ({len(snap.infos)} slot(s))")


def pick_first_available(snap: RegistrySnapshot) -> int:
    """The first live candidate with room; -1 when none has."""
    counts, mx = snap.counts, snap.max_kernels
    for i in snap.live:
        if counts[i] < mx:
            return i
    return -1


def pick_least_loaded(snap: RegistrySnapshot) -> int:
    """The live candidate with the fewest kernels per unit of speed; -1 when none has room."""
    counts, mx = snap.counts, snap.max_kernels
    best, best_load = -1, float("inf")
    if snap.uniform_speed:
        for i in snap.live:
            c = counts[i]
            if c < mx and c < best_load:
                best, best_load = i, c
    else:
        speed = snap.speed
        for i in snap.live:
            c = counts[i]
            if c < mx and c / speed[i] < best_load:
                best, best_load = i, c / speed[i]
    return best


def pick_round_robin(snap: RegistrySnapshot) -> int:
    """The live candidates with room, in turn (`snap.turn`); -1 when none has room."""
    counts, mx = snap.counts, snap.max_kernels
    ready = [i for i in snap.live if counts[i] < mx]
    if not ready:
        return -1
    return ready[snap.turn % len(ready)]


def pick_memory(snap: RegistrySnapshot) -> int:
    """The live candidate with room and the most available memory; -1 when none has room."""
    counts, mx, infos = snap.counts, snap.max_kernels, snap.infos
    best, most = -1, -1
    for i in snap.live:
        if counts[i] < mx and infos[i].available_memory > most:
            best, most = i, infos[i].available_memory
    return best


def pick_compute(snap: RegistrySnapshot) -> int:
    """The live candidate with room and the highest compute capability; -1 when none has room."""
    counts, mx, infos = snap.counts, snap.max_kernels, snap.infos
    best, top = -1, (-1, -1)
    for i in snap.live:
        if counts[i] < mx:
            cc = infos[i].compute_capability or (0, 0)
            if cc > top:
                best, top = i, cc
    return best


#: The built-in strategies' pickers (CUSTOM asks the user's selector instead).
PICKERS: dict[LoadBalancingStrategy, Callable[[RegistrySnapshot], int]] = {
    LoadBalancingStrategy.FIRST_AVAILABLE: pick_first_available,
    LoadBalancingStrategy.LEAST_LOADED: pick_least_loaded,
    LoadBalancingStrategy.ROUND_ROBIN: pick_round_robin,
    LoadBalancingStrategy.MEMORY_BASED: pick_memory,
    LoadBalancingStrategy.COMPUTE_CAPABILITY: pick_compute,
}


def nothing_fits(strategy: LoadBalancingStrategy, snap: RegistrySnapshot, strict: bool) -> int:
    """No candidate can take a kernel: DeviceNotAvailableError, or (strict=False) the
    seed's answer when that is an online device."""
    if not strict:
        seed = snap.candidates[0] if strategy in (LoadBalancingStrategy.FIRST_AVAILABLE,
                                                  LoadBalancingStrategy.ROUND_ROBIN) else 0
        if snap.is_live(seed):
            return seed
    raise DeviceNotAvailableError(f"no device can take a kernel ({strategy.name}): {describe_candidates(snap)}")


def describe_candidates(snap: RegistrySnapshot) -> str:
    """Why each of the first eight candidates cannot take a kernel."""
    parts = []
    for i in snap.candidates[:8]:
        if not snap.registered[i]:
            parts.append(f"device {i} is a placeholder")
        elif not snap.online[i]:
            parts.append(f"device {i} is offline")
        else:
            parts.append(f"device {i} is full ({snap.counts[i]}/{snap.max_kernels} kernels)")
    more = len(snap.candidates) - 8
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def ask_selector(selector: Callable[..., Any], statuses: list[DeviceStatus], options: LaunchOptions | None) -> \
        tuple[int, str]:
    """(the custom selector's answer as an index, the selector's name); DeviceNotAvailableError
    when it raises or answers something that is not an index. Called outside the lock."""
    name = short_str(getattr(selector, "__qualname__", type(selector).__name__), 80)
    try:
        answer = selector(statuses, options if options is not None else LaunchOptions())
    except Exception as exc:
        raise DeviceNotAvailableError(f"the custom selector {name} raised {type(exc).__name__}: {short_str(exc)}") from exc
    if isinstance(answer, bool):
        raise DeviceNotAvailableError(f"the custom selector {name} returned {short_repr(answer)}, not a device index")
    try:
        idx = operator.index(answer)
    except TypeError:
        raise DeviceNotAvailableError(f"the custom selector {name} returned {type(answer).__name__} "
                                      f"{short_repr(answer)}, not a device index") from None
    return idx, name


def check_takes_kernel(snap: RegistrySnapshot, idx: int, what: str, strict: bool) -> None:
    """DeviceNotAvailableError unless slot `idx` (`what` says where it came from) is an
    online device, with room when `strict`."""
    n = len(snap.infos)
    if not 0 <= idx < n:
        raise DeviceNotAvailableError(f"{what} is device {short_repr(idx)}, which does not exist ({n} slot(s))")
    if not (snap.registered[idx] and snap.online[idx]):
        raise DeviceNotAvailableError(f"{what} is device {idx}, which is "
                                      f"{'a placeholder' if not snap.registered[idx] else 'offline'}")
    if strict and snap.counts[idx] >= snap.max_kernels:
        raise DeviceNotAvailableError(f"{what} is device {idx}, which is full "
                                      f"({snap.counts[idx]}/{snap.max_kernels} kernels)")


def least_loaded_of(snap: RegistrySnapshot, targets: list[int]) -> int:
    """Of `targets`, the one with room and the fewest kernels per unit of speed
    (ties to the first); -1 when none has room."""
    counts, speed, mx = snap.counts, snap.speed, snap.max_kernels
    best, best_load = -1, float("inf")
    for i in targets:
        c = counts[i]
        if c < mx and c / speed[i] < best_load:
            best, best_load = i, c / speed[i]
    return best


def pick_neighbour(snap: RegistrySnapshot, topo: GpuTopology, source: int) -> int:
    """Of the P2P neighbours of device `source` that can take a kernel, the highest
    bandwidth / (load + 0.1) (ties to the lowest index); -1 when none can."""
    counts, mx = snap.counts, snap.max_kernels
    best, best_score = -1, -1.0
    for n in topo.neighbors(source):
        if snap.is_live(n) and counts[n] < mx:
            conn = topo.get_connection(source, n)
            bw = conn.bandwidth_gbps if conn is not None else 1.0
            score = bw / (counts[n] / mx + 0.1)  # type: ignore[operator]
            if score > best_score:
                best, best_score = n, score
    return best
