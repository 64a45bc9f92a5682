"""Which device renders each scene-render-unit (SRU): the greedy cost partitioner.

Two forms run the same C implementation (native/vkm_partition.c):

- `assign_srus(srus, device_count, ...)`, the seed's object form: accessors read each SRU, the result is a list of SRUAssignment;
- `assign_srus_array(costs, device_count, ...)`: numpy arrays in, one int32
  array of device indices out, no Python call per SRU (100k SRUs in a few ms).
  `assign_srus` takes this form too when `srus` is a numpy array of ids.

`assign_srus_reference` / `reference_devices` are the same rules in pure Python, for tests.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .._core import _native, reprs
from .._core.checks import check_count, check_number, is_int, short_repr
if TYPE_CHECKING:   # S: the caller's SRU objects, handed to its accessors as given
    from numpy.typing import ArrayLike, NDArray
    S = TypeVar("S")

__all__ = ["SRUAssignment", "assign_srus", "assign_srus_array", "assign_srus_reference", "reference_devices",
           "makespan", "seed_top_n_minus_1", "sru_cost", "interleaved"]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class SRUAssignment:
    """One SRU's device for this frame."""
    __repr__ = reprs.compact_repr
    sru_id: int | str
    device_index: int

    def __init__(self, sru_id: int | str, device_index: int):
        # the slots' own setters: what the generated frozen __init__ does, at half the cost per object
        _set_sru_id(self, sru_id)
        _set_device_index(self, device_index)

    @property
    def needs_transfer(self) -> bool:
        """True when the SRU renders off the primary and its image must be moved to GPU 0."""
        return self.device_index != 0


_set_sru_id = SRUAssignment.sru_id.__set__  # type: ignore[misc, union-attr]
_set_device_index = SRUAssignment.device_index.__set__  # type: ignore[attr-defined, misc]


def sru_cost(sru: Any) -> int:
    """The seed's cost: instances + skinned instances, at least 1."""
    n = len(getattr(sru, "instances", ()) or ()) + len(getattr(sru, "skinned_instances", ()) or ())
    return n if n > 0 else 1


_default_sru_id = operator.attrgetter("sru_id")


def _default_offloadable(sru: Any) -> bool:
    return getattr(sru, "offloadable", True)


@dataclass(slots=True)
class _Problem:
    """A validated problem, as the native call takes it (arrays; None where not given)."""

    cost: np.ndarray                 # float64 [n]
    device_count: int
    keys: np.ndarray | None = None   # int64 [n], distinct; None: input order
    transfer: np.ndarray | None = None
    pin: np.ndarray | None = None    # int32 [n]: -1 free, else the device
    previous: np.ndarray | None = None  # int32 [n]: -1 none
    weights: np.ndarray | None = None   # float64 [device_count]
    link: np.ndarray | None = None      # float64 [device_count]
    hysteresis: float = 0.0

    def solve(self) -> np.ndarray:
        return _native.partition(self.cost, self.device_count, ids=self.keys, transfer=self.transfer,
                                 pinned=self.pin, previous=self.previous, weights=self.weights,
                                 link_costs=self.link, hysteresis=self.hysteresis)


# ---- argument checks shared by both forms ------------------------------------------------------

def _hysteresis(hysteresis: Any) -> float:
    try:
        h = check_number(hysteresis, "hysteresis")
    except ValueError:   # NaN, inf, negative or past float range
        h = math.inf
    if not h < 1.0:
        raise ValueError(f"hysteresis must be in [0, 1), got {short_repr(hysteresis)}")
    return h


def _per_device(values: Any, device_count: int, what: str, *, positive: bool) -> np.ndarray:
    """weights (> 0) or link costs (>= 0, device 0's not used): device_count finite numbers."""
    word = "weight" if what == "weights" else "link cost"
    if isinstance(values, np.ndarray):
        arr = values
    else:
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(f"{what} must be a sequence of numbers, got {short_repr(values)}")
        values = list(values)
        try:
            arr = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            for d, x in enumerate(values):
                try:
                    float(x)
                except (TypeError, ValueError, OverflowError):
                    raise ValueError(f"{word} of device {d} must be a finite number, got {short_repr(x)}") from None
            raise TypeError(f"{what} must be a sequence of numbers, got {short_repr(values)}") from None
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{what} must hold real numbers, got dtype {arr.dtype}")
    if what == "link_costs" and arr.ndim == 2 and arr.shape == (device_count, device_count):
        arr = arr[:, 0]   # [source, destination]: the cost of reaching device 0
    if arr.ndim != 1:
        n = short_repr(device_count)
        raise ValueError(f"{what} must have shape ({n},)" + (f" or ({n}, {n})" if what == "link_costs" else "")
                         + f", got {arr.shape}")
    if arr.shape[0] != device_count:
        raise ValueError(f"{what} has {arr.shape[0]} entries for {short_repr(device_count)} devices: {_short(arr)}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    ok = np.isfinite(arr) & ((arr > 0) if positive else (arr >= 0))
    if not positive:
        ok[0] = True
    if not ok.all():
        d = int(np.flatnonzero(~ok)[0])
        raise ValueError(f"{word} of device {d} must be a finite number {'>' if positive else '>='} 0, "
                         f"got {float(arr[d])!r}")
    return arr + 0.0


def _short(arr: np.ndarray) -> str:
    return np.array2string(arr, threshold=8, edgeitems=3)


# ---- the array form ------------------------------------------------------------------------------

def _array(values: Any, name: str, n: int | None, kinds: str, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind not in kinds:
        raise TypeError(f"{name} must be an array of {what}, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} entries for {n} SRUs")
    return arr


def _device_array(values: Any, name: str, n: int, device_count: int, none: str) -> np.ndarray:
    """pinned / previous: -1 or a device index per SRU, as int32 (range checked before narrowing)."""
    arr = _array(values, name, n, "iu", f"device indices (-1 for {none})")
    if arr.dtype != np.int32:
        bad = np.flatnonzero((arr < -1) | (arr >= device_count))
        if len(bad):
            k = int(bad[0])
            raise IndexError(f"{name}[{k}] is {int(arr[k])}: must be -1 ({none}) or a device in "
                             f"[0, {short_repr(device_count)})")
        arr = arr.astype(np.int32)
    return arr


def _array_problem(costs: Any, device_count: Any, ids: Any, transfer: Any, pinned: Any, previous: Any,
                   weights: Any, link_costs: Any, hysteresis: Any) -> _Problem:
    dc = check_count(device_count, "device_count", 1)
    h = _hysteresis(hysteresis)
    cost = _array(costs, "costs", None, "iuf", "real numbers")
    n = cost.shape[0]
    p = _Problem(cost if cost.dtype == np.float64 else cost.astype(np.float64), dc, hysteresis=h)
    if ids is not None:
        keys = _array(ids, "ids", n, "iu", "integers")
        if keys.dtype == np.uint64 and n and int(keys.max()) > _INT64_MAX:
            k = int(np.argmax(keys))
            raise ValueError(f"ids[{k}] is {int(keys[k])}: ids must fit in int64")
        p.keys = keys.astype(np.int64, copy=False)
    if transfer is not None:
        t = _array(transfer, "transfer", n, "iuf", "real numbers")
        p.transfer = t.astype(np.float64, copy=False)
    if pinned is not None:
        arr = np.asarray(pinned)
        if arr.dtype == np.bool_:
            arr = _array(arr, "pinned", n, "b", "booleans")
            p.pin = np.where(arr, np.int32(0), np.int32(-1)) if arr.any() else None
        else:
            p.pin = _device_array(arr, "pinned", n, dc, "free")
    if previous is not None:
        p.previous = _device_array(previous, "previous", n, dc, "none")
    if weights is not None:
        p.weights = _per_device(weights, dc, "weights", positive=True)
    if link_costs is not None:
        p.link = _per_device(link_costs, dc, "link_costs", positive=False)
    return p


def assign_srus_array(costs: ArrayLike, device_count: int, *, ids: ArrayLike | None = None,
                      transfer: ArrayLike | None = None, pinned: ArrayLike | None = None, previous: ArrayLike | None
                      = None, weights: ArrayLike | None = None, link_costs: ArrayLike | None = None,
                      hysteresis: float = 0.0) -> NDArray[np.int32]:
    """Assign every SRU a device from arrays; returns int32 device indices in input order.

    - `costs`: 1-D real array, finite and >= 0, the work of each SRU on a device of weight 1.
    - `ids`: 1-D integer array of distinct ids (fit in int64): equal costs are
      placed in ascending id order. Default: input position.
    - `transfer`: 1-D real array, finite and >= 0, paid when an SRU renders off GPU 0.
    - `pinned`: bool array (True keeps the SRU on GPU 0, the seed's "not
      offloadable"), or an integer array: -1 free, else the device the SRU must
      render on.
    - `previous`: integer array, last frame's device per SRU, -1 for none (see
      assign_srus for the stickiness rule and `hysteresis`).
    - `weights`: device_count speeds (> 0): SRU i takes costs[i] / weights[d] on device d.
    - `link_costs`: device_count factors (>= 0), or a device_count x
      device_count matrix indexed [source, destination] of which column 0 is
      used: moving SRU i's result from device d to GPU 0 costs
      transfer[i] * link_costs[d] (link_costs[d] alone without `transfer`).

    Same rules and same result as assign_srus (see there); with neither
    weights nor link_costs the time does not depend on device_count.
    Errors: TypeError for a wrong dtype or argument type, ValueError for a
    wrong shape, a negative or non-finite cost/transfer/weight/link cost
    (naming the array and position), a duplicate id; IndexError for a pinned
    or previous device outside [-1, device_count).
    """
    return _array_problem(costs, device_count, ids, transfer, pinned, previous, weights, link_costs,
                          hysteresis).solve()


# ---- the object form -----------------------------------------------------------------------------

def _per_sru_floats(values: list, ids: list, what: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
        good = arr.shape == (len(values),) and bool(np.isfinite(arr).all() and (arr >= 0).all())
    except (TypeError, ValueError, OverflowError):
        good = False
    if good:
        return arr + 0.0  # also turns -0.0 into 0.0
    out = np.empty(len(values), dtype=np.float64)
    for k, (i, v) in enumerate(zip(ids, values)):
        try:
            out[k] = x = float(v)
        except (TypeError, ValueError, OverflowError):
            x = math.nan
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"{what} of SRU {short_repr(i)} must be a finite number >= 0, got {short_repr(v)}")
    return out + 0.0


def _tie_keys(ids: list) -> np.ndarray:
    """int64 tie keys that order like the ids, after the type and duplicate checks."""
    if all(type(i) is int for i in ids):
        try:
            keys = np.asarray(ids, dtype=np.int64)
        except OverflowError:
            keys = None
        if keys is not None:
            if len(keys) > 1 and not (keys[1:] > keys[:-1]).all() and len(np.unique(keys)) != len(keys):
                _raise_duplicate(ids)
            return keys
    else:
        kinds = set()
        for i in ids:
            if isinstance(i, int):
                kinds.add(int)
            elif isinstance(i, str):
                kinds.add(str)  # type: ignore[arg-type]
            else:
                raise TypeError(f"sru_id must be an int or a str, got {short_repr(i)} ({type(i).__name__})")
        if len(kinds) > 1:
            raise TypeError("sru_ids must be all ints or all strs (they order ties between equal costs)")
    if len(set(ids)) != len(ids):
        _raise_duplicate(ids)
    rank = {i: r for r, i in enumerate(sorted(ids))}
    return np.fromiter((rank[i] for i in ids), dtype=np.int64, count=len(ids))


def _raise_duplicate(ids: list) -> None:
    seen = set()
    for i in ids:
        if i in seen:
            raise ValueError(f"duplicate sru_id {short_repr(i)}")
        seen.add(i)


def _prepare(srus: Any, device_count: Any, sru_id: Any, cost: Any, weights: Any, transfer_cost: Any,
             offloadable: Any, previous: Any, hysteresis: Any, link_costs: Any = None) -> tuple[list, _Problem]:
    dc = check_count(device_count, "device_count", 1)
    h = _hysteresis(hysteresis)
    srus = list(srus)
    try:
        ids = list(map(sru_id or _default_sru_id, srus))
    except AttributeError:
        if sru_id is not None:
            raise
        bad = next(s for s in srus if not hasattr(s, "sru_id"))
        raise TypeError(f"an SRU needs an sru_id attribute (or pass sru_id=), got a {type(bad).__name__}") from None
    keys = _tie_keys(ids)
    p = _Problem(_per_sru_floats(list(map(cost or sru_cost, srus)), ids, "cost"), dc, keys=keys, hysteresis=h)
    if weights is not None:
        p.weights = _per_device(weights, dc, "weights", positive=True)
    if link_costs is not None:
        p.link = _per_device(link_costs, dc, "link_costs", positive=False)
    if transfer_cost is not None:
        p.transfer = _per_sru_floats(list(map(transfer_cost, srus)), ids, "transfer_cost")
    offl = np.fromiter(map(offloadable or _default_offloadable, srus), dtype=bool, count=len(srus))
    if not offl.all():
        p.pin = np.where(offl, np.int32(-1), np.int32(0))
    if previous is not None:
        if isinstance(previous, Mapping):
            table = dict(previous)
        else:
            table = {}
            for a in previous:
                if not isinstance(a, SRUAssignment):
                    raise TypeError(f"previous must be a dict sru_id -> device or SRUAssignments, got {short_repr(a)}")
                table[a.sru_id] = a.device_index
        prev = []
        for i in ids:
            d = table.get(i, -1)
            if isinstance(d, bool):
                raise TypeError(f"previous device of SRU {short_repr(i)} must be an int, got {short_repr(d)}")
            try:
                d = operator.index(d)
            except TypeError:
                raise TypeError(f"previous device of SRU {short_repr(i)} must be an int, got {short_repr(d)}") from None
            prev.append(d if 0 <= d < dc and d <= _INT32_MAX else -1)
        p.previous = np.asarray(prev, dtype=np.int32)
    return ids, p


def assign_srus(srus: Iterable[S] | np.ndarray, device_count: int, *, sru_id: Callable[[S], int | str] | None = None,
                cost: Callable[[S], float] | np.ndarray | None = None, weights: Sequence[float] | None = None,
                transfer_cost: Callable[[S], float] | np.ndarray | None = None,
                offloadable: Callable[[S], bool] | np.ndarray | None = None,
                previous: Iterable[SRUAssignment] | Mapping[int | str, int] | np.ndarray | None = None,
                hysteresis: float = 0.0, link_costs: ArrayLike | None = None) -> list[SRUAssignment] | np.ndarray:
    """Assign every SRU a device (native implementation).

    Accessors default to ``s.sru_id``; cost = len(instances) + len(skinned_instances),
    at least 1; ``getattr(s, "offloadable", True)``; no transfer cost.

    Longest-processing-time greedy. SRU i takes ``cost(i) / weights[d]`` on device
    d, plus on d != 0 ``transfer_cost(i) * link_costs[d]`` (each factor 1 when
    not given; `link_costs` as in assign_srus_array). SRUs are taken heaviest
    cost first, equal costs in ascending ``sru_id`` order (so ids must be all
    ints or all strs; never object identity). SRUs whose ``offloadable`` is
    false go to GPU 0 first, adding to its load; every other SRU goes to the
    device where it would finish earliest. Ties: GPU 0 wins any tie; between
    other devices the one with less load so far, then the lower index.

    Stickiness: ``previous`` (the last frame's list of SRUAssignment, or a dict
    sru_id -> device; unknown SRUs and devices outside [0, device_count) count
    as having none) gives two plans: the *greedy* plan above, and the *sticky*
    plan in which every offloadable SRU with a previous device keeps it and the
    rest are placed greedily around them. The greedy plan is used only if its
    makespan < sticky makespan * (1 - hysteresis); otherwise the whole sticky
    plan is kept. With hysteresis 0 a re-plan must be strictly better.

    As in the seed, an int device_count of 1 or less keeps every SRU on GPU 0,
    and an SRU object listed twice is planned once (both entries get its
    device). Output is in input order. ValueError names the offender for a
    negative or non-finite cost or transfer cost, a duplicate sru_id of
    distinct objects, device_count < 1 in the array form,
    weights or link_costs of the wrong length or out of range, hysteresis
    outside [0, 1); TypeError for a device_count or sru_id of the wrong type.

    Array form: when `srus` is a numpy array it holds the SRU ids (integers)
    and `cost` (required), `transfer_cost`, `offloadable` (bool) and
    `previous` (-1 for none) are arrays of the same length instead of
    accessors; the result is an int32 array of device indices (see
    assign_srus_array, which also pins SRUs to any device).
    """
    if isinstance(srus, np.ndarray):
        return _assign_ids_array(srus, device_count, sru_id, cost, weights, transfer_cost, offloadable, previous,
                                 hysteresis, link_costs)
    for name, v in (("cost", cost), ("transfer_cost", transfer_cost), ("offloadable", offloadable)):
        if isinstance(v, np.ndarray):
            raise TypeError(f"{name} is an array but srus is not: pass the ids as a numpy array "
                            f"(or use assign_srus_array)")
    unique, where, device_count = _seed_form(srus, device_count)
    ids, p = _prepare(unique, device_count, sru_id, cost, weights, transfer_cost, offloadable, previous, hysteresis,
                      link_costs)
    return _each_occurrence(ids, p.solve().tolist(), where)


def _seed_form(srus: Iterable[Any], device_count: Any) -> tuple[list, list[int] | None, Any]:
    """The seed's two leniencies of the object form: an int device_count of 1 or less
    keeps every SRU on GPU 0, and one SRU object listed more than once is planned
    once, every entry getting its device. Returns (distinct SRUs, the position of
    each entry among them or None when all are distinct, device_count)."""
    if is_int(device_count) and device_count < 1:
        device_count = 1
    srus = list(srus)
    first: dict[int, int] = {}
    unique: list = []
    where: list[int] = []
    for s in srus:
        k = first.get(id(s))
        if k is None:
            k = first[id(s)] = len(unique)
            unique.append(s)
        where.append(k)
    return (srus, None, device_count) if len(unique) == len(srus) else (unique, where, device_count)


def _each_occurrence(ids: list, devices: list[int], where: list[int] | None) -> list[SRUAssignment]:
    if where is None:
        return list(map(SRUAssignment, ids, devices))
    return [SRUAssignment(ids[w], devices[w]) for w in where]


def _assign_ids_array(ids: Any, device_count: Any, sru_id: Any, cost: Any, weights: Any, transfer_cost: Any,
                      offloadable: Any, previous: Any, hysteresis: Any, link_costs: Any) -> np.ndarray:
    if sru_id is not None:
        raise TypeError("sru_id is an accessor of the object form: with an array of ids leave it None")
    if cost is None:
        raise TypeError("the array form of assign_srus needs cost= (an array of per-SRU costs)")
    for name, v in (("cost", cost), ("transfer_cost", transfer_cost), ("offloadable", offloadable)):
        if v is not None and callable(v):
            raise TypeError(f"{name} must be an array like srus in the array form, got a callable")
    pinned = None
    if offloadable is not None:
        offl = _array(offloadable, "offloadable", len(ids), "b", "booleans")
        pinned = ~offl
    return assign_srus_array(cost, device_count, ids=ids, transfer=transfer_cost, pinned=pinned, previous=previous,
                             weights=weights, link_costs=link_costs, hysteresis=hysteresis)


# ---- the reference -------------------------------------------------------------------------------

def _reference_devices(p: _Problem) -> list[int]:
    """The rules of vkm_partition.h, device by device, in plain Python."""
    n, dc = len(p.cost), p.device_count
    pin = p.pin.tolist() if p.pin is not None else [-1] * n
    if dc == 1 or n == 0:
        return [0] * n
    cost = p.cost.tolist()
    keys = p.keys.tolist() if p.keys is not None else list(range(n))
    has_transfer = p.transfer is not None or p.link is not None
    transfer = p.transfer.tolist() if p.transfer is not None else [1.0] * n
    link = p.link.tolist() if p.link is not None else None
    w = p.weights.tolist() if p.weights is not None else None
    prev = p.previous.tolist() if p.previous is not None else [-1] * n
    order = sorted(range(n), key=lambda i: (-cost[i], keys[i]))
    kept = [pin[i] < 0 and prev[i] >= 0 for i in range(n)]
    if dc <= 4096 or w is not None or link is not None:
        devices = list(range(dc))
    else:   # all devices but 0 are alike: only the first n + (named ones) + 1 and the named ones can matter
        named = sorted({d for d in pin + prev if d > 0})
        devices = sorted(set(range(min(dc, n + len(named) + 1))) | set(named))

    def time_on(load: dict, i: int, d: int) -> float:
        f = load[d] + (cost[i] / w[d] if w is not None else cost[i])
        if d != 0 and has_transfer:
            x = transfer[i]
            if link is not None:
                x = x * link[d]
            f = f + x
        return f

    def plan(sticky: bool) -> tuple[list[int], float]:
        out = [0] * n
        load = dict.fromkeys(devices, 0.0)
        for i in order:
            if pin[i] >= 0:
                d = out[i] = pin[i]
                load[d] = time_on(load, i, d)
        if sticky:
            for i in order:
                if kept[i]:
                    d = out[i] = prev[i]
                    load[d] = time_on(load, i, d)
        for i in order:
            if pin[i] >= 0 or (sticky and kept[i]):
                continue
            best, best_key = None, None
            for d in devices[1:]:
                key = (time_on(load, i, d), load[d], d)
                if best_key is None or key < best_key:
                    best, best_key = d, key
            f0 = time_on(load, i, 0)
            if best is None or f0 <= best_key[0]:  # type: ignore[index]
                out[i], load[0] = 0, f0
            else:
                out[i], load[best] = best, best_key[0]  # type: ignore[index]
        return out, max(load.values())

    greedy, greedy_span = plan(False)
    if any(kept):
        sticky, sticky_span = plan(True)
        if not greedy_span < sticky_span * (1.0 - p.hysteresis):
            return sticky
    return greedy


def assign_srus_reference(srus: Iterable[Any], device_count: int, *, sru_id: Any = None, cost: Any = None,
                          weights: Any = None, transfer_cost: Any = None, offloadable: Any = None, previous: Any = None,
                          hysteresis: float = 0.0, link_costs: Any = None) -> list[SRUAssignment]:
    """assign_srus (object form) in pure Python: the same rules and the same result, for tests."""
    unique, where, device_count = _seed_form(srus, device_count)
    ids, p = _prepare(unique, device_count, sru_id, cost, weights, transfer_cost, offloadable, previous, hysteresis,
                      link_costs)
    return _each_occurrence(ids, _reference_devices(p), where)


def reference_devices(costs: Any, device_count: int, **kwargs: Any) -> list[int]:
    """assign_srus_array in pure Python (same arguments, same checks, same result), for tests."""
    names = ("ids", "transfer", "pinned", "previous", "weights", "link_costs", "hysteresis")
    unknown = set(kwargs) - set(names)
    if unknown:
        raise TypeError(f"unknown argument(s) {short_repr(sorted(unknown), 200)}")
    p = _array_problem(costs, device_count, *(kwargs.get(k, 0.0 if k == "hysteresis" else None) for k in names))
    _check_values(p)
    return _reference_devices(p)


def _check_values(p: _Problem) -> None:
    """What the native layer checks itself (finite, >= 0 costs and transfers, pins and previous devices
    in range, distinct ids), for the pure-Python path."""
    for name, arr in (("costs", p.cost), ("transfer", p.transfer)):
        if arr is not None and not (np.isfinite(arr) & (arr >= 0)).all():
            k = int(np.flatnonzero(~(np.isfinite(arr) & (arr >= 0)))[0])
            raise ValueError(f"{name}[{k}] must be finite and >= 0, got {float(arr[k])!r}")
    for name, arr in (("pinned", p.pin), ("previous", p.previous)):
        if arr is not None and ((arr < -1) | (arr >= p.device_count)).any():
            k = int(np.flatnonzero((arr < -1) | (arr >= p.device_count))[0])
            raise IndexError(f"{name}[{k}] is {int(arr[k])}: must be -1 or a device in "
                             f"[0, {short_repr(p.device_count)})")
    if p.keys is not None and len(np.unique(p.keys)) != len(p.keys):
        raise ValueError("ids must be distinct")


# ---- measures ------------------------------------------------------------------------------------

def makespan(assignments: Iterable[SRUAssignment | int] | np.ndarray, costs: Sequence[float] | np.ndarray,
             device_count: int, weights: Sequence[float] | None = None,
             transfer: Sequence[float] | None = None, link_costs: Any = None) -> float:
    """Finish time of the busiest device: per device, the sum of cost / weight (+ transfer x link off GPU 0).

    assignments (SRUAssignments or device indices), costs and transfer are in the same order.
    """
    if isinstance(assignments, np.ndarray):
        devices = assignments.astype(np.int64, copy=False)
    else:
        devices = np.asarray([a.device_index if isinstance(a, SRUAssignment) else operator.index(a)
                              for a in assignments], dtype=np.int64)
    c = np.asarray(costs, dtype=np.float64)
    t = None if transfer is None else np.asarray(transfer, dtype=np.float64)
    if len(devices) != len(c) or (t is not None and len(t) != len(c)):
        raise ValueError(f"{len(devices)} assignments for {len(c)} costs"
                         + ("" if t is None else f" and {len(t)} transfer costs"))
    bad = np.flatnonzero((devices < 0) | (devices >= device_count))
    if len(bad):
        k = int(bad[0])
        raise ValueError(f"assignment {k} is on device {int(devices[k])}, outside [0, {short_repr(device_count)})")
    if len(devices) == 0:
        return 0.0
    time = c / (np.asarray(weights, dtype=np.float64)[devices] if weights is not None else 1.0)
    if t is not None or link_costs is not None:
        x = t if t is not None else np.ones_like(c)
        if link_costs is not None:
            x = x * _per_device(link_costs, device_count, "link_costs", positive=False)[devices]
        time = time + np.where(devices != 0, x, 0.0)
    return float(np.bincount(devices, weights=time).max())


def seed_top_n_minus_1(srus: Iterable[Any], device_count: int, *, sru_id: Any = None,
                       cost: Any = None) -> list[SRUAssignment]:
    """The seed's rule, for comparison: the N-1 heaviest SRUs one per secondary, the rest on GPU 0."""
    key = sru_id or _default_sru_id
    cost_fn = cost or sru_cost
    srus = list(srus)
    if device_count <= 1 or not srus:
        return [SRUAssignment(key(s), 0) for s in srus]
    ranked = sorted(srus, key=lambda s: (-cost_fn(s), id(s)))
    offloaded = {id(s): d for d, s in enumerate(ranked[: device_count - 1], start=1)}
    return [SRUAssignment(key(s), offloaded.get(id(s), 0)) for s in srus]


def interleaved(jobs: list[tuple[Any, Any, Any]]) -> list[tuple[Any, Any, Any]]:
    """`jobs` (sru, entry with a device_index, renderer) in submission order: each device's k-th of n
    at (k + 0.5) / n, the plan's order kept per device (a stable sort; the primary first at equal points)."""
    counts: dict[int, int] = {}
    for _, e, _ in jobs:
        counts[e.device_index] = counts.get(e.device_index, 0) + 1
    seen: dict[int, int] = {}
    keyed = []
    for job in jobs:
        d = job[1].device_index
        k = seen[d] = seen.get(d, -1) + 1
        keyed.append(((k + 0.5) / counts[d], d, job))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [job for _, _, job in keyed]
