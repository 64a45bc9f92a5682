"""Which device renders each scene-render-unit (SRU): the greedy cost partitioner.

`assign_srus` runs the C implementation (native/vkm_partition.c);
`assign_srus_reference` is the same algorithm in pure Python, for tests.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _native

__all__ = ["SRUAssignment", "assign_srus", "assign_srus_reference", "makespan", "seed_top_n_minus_1"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class SRUAssignment:
    """One SRU's device for this frame."""

    sru_id: int | str
    device_index: int

    @property
    def needs_transfer(self) -> bool:
        """True when the SRU renders off the primary and its image must be moved to GPU 0."""
        return self.device_index != 0


def _sru_cost(sru: Any) -> int:
    """The seed's cost: instances + skinned instances, at least 1."""
    n = len(getattr(sru, "instances", ()) or ()) + len(getattr(sru, "skinned_instances", ()) or ())
    return n if n > 0 else 1


def _default_sru_id(sru: Any) -> Any:
    try:
        return sru.sru_id
    except AttributeError:
        raise TypeError(f"an SRU needs an sru_id attribute (or pass sru_id=), got a {type(sru).__name__}") from None


def _default_offloadable(sru: Any) -> bool:
    return getattr(sru, "offloadable", True)


@dataclass(slots=True)
class _Problem:
    ids: list
    cost: np.ndarray
    device_count: int         # devices the solver sees (see _device_map)
    weights: list[float] | None
    transfer: np.ndarray | None
    pinned: list[bool] | None
    previous: list[int] | None
    hysteresis: float
    device_map: list[int] | None = None   # solver device k is device_map[k] (None: the same)

    def devices(self, solved: list[int]) -> list[int]:
        m = self.device_map
        return solved if m is None else [m[k] for k in solved]


def _per_sru_floats(values: list, ids: list, what: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
        good = arr.shape == (len(values),) and bool(np.isfinite(arr).all() and (arr >= 0).all())
    except (TypeError, ValueError):
        good = False
    if good:
        return arr + 0.0  # also turns -0.0 into 0.0
    out = np.empty(len(values), dtype=np.float64)
    for k, (i, v) in enumerate(zip(ids, values)):
        try:
            out[k] = x = float(v)
        except (TypeError, ValueError):
            x = math.nan
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"{what} of SRU {i!r} must be a finite number >= 0, got {v!r}")
    return out + 0.0


def _prepare(srus, device_count, sru_id, cost, weights, transfer_cost, offloadable, previous,
             hysteresis) -> _Problem:
    if isinstance(device_count, bool):
        raise TypeError(f"device_count must be an int, got {device_count!r}")
    try:
        device_count = operator.index(device_count)
    except TypeError:
        raise TypeError(f"device_count must be an int, got {device_count!r}") from None
    if device_count < 1:
        raise ValueError(f"device_count must be >= 1, got {device_count}")
    try:
        h = float(hysteresis)
    except (TypeError, ValueError):
        raise TypeError(f"hysteresis must be a number, got {hysteresis!r}") from None
    if not 0.0 <= h < 1.0:
        raise ValueError(f"hysteresis must be in [0, 1), got {hysteresis!r}")

    srus = list(srus)
    key = sru_id or _default_sru_id
    ids = [key(s) for s in srus]
    kinds = set()
    for i in ids:
        if isinstance(i, int):
            kinds.add(int)
        elif isinstance(i, str):
            kinds.add(str)
        else:
            raise TypeError(f"sru_id must be an int or a str, got {i!r} ({type(i).__name__})")
    if len(kinds) > 1:
        raise TypeError("sru_ids must be all ints or all strs (they order ties between equal costs)")
    if len(set(ids)) != len(ids):
        seen = set()
        for i in ids:
            if i in seen:
                raise ValueError(f"duplicate sru_id {i!r}")
            seen.add(i)

    costs = _per_sru_floats([(cost or _sru_cost)(s) for s in srus], ids, "cost")

    w = None
    if weights is not None:
        w = list(weights)
        if len(w) != device_count:
            raise ValueError(f"weights has {len(w)} entries for {device_count} devices")
        for d, x in enumerate(w):
            try:
                ok = math.isfinite(float(x)) and float(x) > 0
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"weight of device {d} must be a finite number > 0, got {x!r}")
        w = [float(x) for x in w]

    transfer = None
    if transfer_cost is not None:
        transfer = _per_sru_floats([transfer_cost(s) for s in srus], ids, "transfer_cost")

    offl = offloadable or _default_offloadable
    pinned = [not offl(s) for s in srus]
    if not any(pinned):
        pinned = None

    prev = None
    if previous is not None:
        if isinstance(previous, Mapping):
            table = dict(previous)
        else:
            table = {}
            for a in previous:
                if not isinstance(a, SRUAssignment):
                    raise TypeError(f"previous must be a dict sru_id -> device or SRUAssignments, got {a!r}")
                table[a.sru_id] = a.device_index
        prev = []
        for i in ids:
            d = table.get(i, -1)
            try:
                d = operator.index(d)
            except TypeError:
                raise TypeError(f"previous device of SRU {i!r} must be an int, got {d!r}") from None
            prev.append(d if 0 <= d < device_count else -1)
    dmap = _device_map(device_count, len(ids), w, prev)
    if dmap is not None:
        index = {d: k for k, d in enumerate(dmap)}
        prev = None if prev is None else [index[d] if d >= 0 else -1 for d in prev]
        device_count = len(dmap)
    return _Problem(ids, costs, device_count, w, transfer, pinned, prev, h, dmap)


def _device_map(device_count: int, n: int, weights: list[float] | None,
                previous: list[int] | None) -> list[int] | None:
    """The devices a plan can use, in order, when there are far more devices than
    SRUs (None: all of them), so the work is linear in SRUs, not in devices.

    Without weights every secondary is alike: an SRU goes to the lowest-index
    device among those that finish it earliest, so a device no SRU is on yet
    is only ever chosen as the lowest such index. GPU 0, the previous devices
    and the n + 1 lowest other indices are therefore every device that can
    receive an SRU; solving over them alone (order kept) gives the same plan.
    """
    if weights is not None or device_count <= n + 2:
        return None
    used = sorted({d for d in previous or () if d > 0})
    taken, free, k = set(used), [], 1
    while len(free) < n + 1 and k < device_count:
        if k not in taken:
            free.append(k)
        k += 1
    return sorted({0, *used, *free})


def assign_srus(srus: Iterable[Any], device_count: int, *, sru_id: Callable[[Any], Any] | None = None,
                cost: Callable[[Any], float] | None = None, weights: Sequence[float] | None = None,
                transfer_cost: Callable[[Any], float] | None = None,
                offloadable: Callable[[Any], bool] | None = None,
                previous: Iterable[SRUAssignment] | Mapping[Any, int] | None = None,
                hysteresis: float = 0.0) -> list[SRUAssignment]:
    """Assign every SRU a device (native implementation).

    Accessors default to ``s.sru_id``; cost = len(instances) + len(skinned_instances),
    at least 1; ``getattr(s, "offloadable", True)``; no transfer cost.

    Longest-processing-time greedy. SRU i takes ``cost(i) / weights[d]`` on device
    d, plus ``transfer_cost(i)`` when d != 0. SRUs are taken heaviest cost first,
    equal costs in ascending ``sru_id`` order (so ids must be all ints or all
    strs; never object identity). SRUs whose ``offloadable`` is false go to GPU 0
    first, adding to its load; every other SRU goes to the device where it would
    finish earliest, ties to GPU 0, then to the lower index.

    Stickiness: ``previous`` (the last frame's list of SRUAssignment, or a dict
    sru_id -> device; unknown SRUs and devices outside [0, device_count) count
    as having none) gives two plans: the *greedy* plan above, and the *sticky*
    plan in which every offloadable SRU with a previous device keeps it and the
    rest are placed greedily around them. The greedy plan is used only if its
    makespan < sticky makespan * (1 - hysteresis); otherwise the whole sticky
    plan is kept. With hysteresis 0 a re-plan must be strictly better.

    Output is in input order. ValueError names the offender for a negative or
    non-finite cost or transfer cost, device_count < 1, a duplicate sru_id,
    weights of the wrong length or not positive, hysteresis outside [0, 1);
    TypeError for a device_count or sru_id of the wrong type.
    """
    p = _prepare(srus, device_count, sru_id, cost, weights, transfer_cost, offloadable, previous, hysteresis)
    if all(isinstance(i, int) and _INT64_MIN <= i <= _INT64_MAX for i in p.ids):
        keys = np.asarray(p.ids, dtype=np.int64)
    else:
        rank = {i: r for r, i in enumerate(sorted(p.ids))}
        keys = np.fromiter((rank[i] for i in p.ids), dtype=np.int64, count=len(p.ids))
    devices = _native.partition(p.cost, keys, p.device_count, weights=p.weights, transfer=p.transfer,
                                pinned=p.pinned, previous=p.previous, hysteresis=p.hysteresis)
    return [SRUAssignment(i, d) for i, d in zip(p.ids, p.devices(devices.tolist()))]


def _reference_devices(p: _Problem) -> list[int]:
    n, dc = len(p.ids), p.device_count
    if dc == 1 or n == 0:
        return [0] * n
    cost = p.cost.tolist()
    transfer = p.transfer.tolist() if p.transfer is not None else [0.0] * n
    pinned = p.pinned or [False] * n
    w = p.weights or [1.0] * dc
    ids = p.ids
    order = sorted(range(n), key=lambda i: (-cost[i], ids[i]))
    kept = [p.previous is not None and not pinned[i] and p.previous[i] >= 0 for i in range(n)]

    def plan(sticky: bool) -> tuple[list[int], float]:
        out = [0] * n
        load = [0.0] * dc
        for i in order:
            if pinned[i]:
                load[0] = load[0] + cost[i] / w[0]
        if sticky:
            for i in order:
                if kept[i]:
                    d = out[i] = p.previous[i]
                    f = load[d] + cost[i] / w[d]
                    if d != 0:
                        f += transfer[i]
                    load[d] = f
        for i in order:
            if pinned[i] or (sticky and kept[i]):
                continue
            c, t = cost[i], transfer[i]
            best, best_f = 0, load[0] + c / w[0]
            for d in range(1, dc):
                f = load[d] + c / w[d]
                f += t
                if f < best_f:
                    best, best_f = d, f
            out[i] = best
            load[best] = best_f
        return out, max(load)

    greedy, greedy_span = plan(False)
    if any(kept):
        sticky, sticky_span = plan(True)
        if not greedy_span < sticky_span * (1.0 - p.hysteresis):
            return sticky
    return greedy


def assign_srus_reference(srus: Iterable[Any], device_count: int, *, sru_id=None, cost=None, weights=None,
                          transfer_cost=None, offloadable=None, previous=None,
                          hysteresis: float = 0.0) -> list[SRUAssignment]:
    """assign_srus in pure Python: the same rules and the same result, for tests."""
    p = _prepare(srus, device_count, sru_id, cost, weights, transfer_cost, offloadable, previous, hysteresis)
    return [SRUAssignment(i, d) for i, d in zip(p.ids, p.devices(_reference_devices(p)))]


def makespan(assignments: Iterable[SRUAssignment | int], costs: Sequence[float], device_count: int,
             weights: Sequence[float] | None = None, transfer: Sequence[float] | None = None) -> float:
    """Finish time of the busiest device: per device, sum of cost / weight (+ transfer off GPU 0).

    assignments (SRUAssignments or device indices), costs and transfer are in the same order.
    """
    try:
        device_count = operator.index(device_count)
    except TypeError:
        raise TypeError(f"device_count must be an int, got {type(device_count).__name__}") from None
    if device_count < 1:
        raise ValueError(f"device_count must be >= 1, got {device_count}")
    w = list(weights) if weights is not None else None
    if w is not None and len(w) != device_count:
        raise ValueError(f"weights has {len(w)} entries for {device_count} devices")
    load: dict[int, float] = {}
    devices = [a.device_index if isinstance(a, SRUAssignment) else operator.index(a) for a in assignments]
    if len(devices) != len(costs) or (transfer is not None and len(transfer) != len(costs)):
        raise ValueError(f"{len(devices)} assignments for {len(costs)} costs"
                         + ("" if transfer is None else f" and {len(transfer)} transfer costs"))
    for k, (d, c) in enumerate(zip(devices, costs)):
        if not 0 <= d < device_count:
            raise ValueError(f"assignment {k} is on device {d}, outside [0, {device_count})")
        load[d] = load.get(d, 0.0) + c / (w[d] if w is not None else 1.0) \
            + (transfer[k] if transfer is not None and d != 0 else 0.0)
    return max(load.values(), default=0.0)


def seed_top_n_minus_1(srus: Iterable[Any], device_count: int, *, sru_id=None, cost=None) -> list[SRUAssignment]:
    """The seed's rule, for comparison: the N-1 heaviest SRUs one per secondary, the rest on GPU 0."""
    key = sru_id or _default_sru_id
    cost_fn = cost or _sru_cost
    srus = list(srus)
    if device_count <= 1 or not srus:
        return [SRUAssignment(key(s), 0) for s in srus]
    ranked = sorted(srus, key=lambda s: (-cost_fn(s), id(s)))
    offloaded = {id(s): d for d, s in enumerate(ranked[: device_count - 1], start=1)}
    return [SRUAssignment(key(s), offloaded.get(id(s), 0)) for s in srus]
