"""assign_srus_array (and assign_srus given an id array): native == reference, the rules, bad input."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vkmulti import assign_srus, assign_srus_array
from vkmulti.offload import assign_srus_reference, makespan, reference_devices

COSTS = st.one_of(st.integers(0, 5).map(float), st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False))


@st.composite
def array_problems(draw):
    n = draw(st.integers(0, 30))
    kind = draw(st.sampled_from(["few", "many", "many_weighted", "beyond_srus"]))
    dc = {"few": draw(st.integers(1, 6)), "many": draw(st.integers(17, 40)),
          "many_weighted": draw(st.integers(17, 40)), "beyond_srus": draw(st.integers(2 * n + 2, 3 * n + 12))}[kind]
    costs = np.array(draw(st.lists(COSTS, min_size=n, max_size=n)), dtype=np.float64)
    kw = {}
    if draw(st.booleans()):
        kw["ids"] = np.array(draw(st.lists(st.integers(-2**62, 2**62), min_size=n, max_size=n, unique=True)),
                             dtype=np.int64)
    if draw(st.booleans()):
        kw["transfer"] = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 3.0, 1e3]), min_size=n, max_size=n)))
    if draw(st.booleans()):
        if draw(st.booleans()):
            kw["pinned"] = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
        else:
            kw["pinned"] = np.array(draw(st.lists(st.one_of(st.just(-1), st.integers(0, dc - 1)),
                                                  min_size=n, max_size=n)), dtype=np.int64)
    if kind in ("few", "many_weighted") and draw(st.booleans()):
        # few distinct values: classes of several alike devices (the heap path when > 16)
        kw["weights"] = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=dc, max_size=dc))
    if kind in ("few", "many_weighted") and draw(st.booleans()):
        link = draw(st.lists(st.sampled_from([0.0, 1.0, 2.5]), min_size=dc, max_size=dc))
        kw["link_costs"] = np.array(link) if draw(st.booleans()) else np.outer(link, np.ones(dc))
    if draw(st.booleans()):
        kw["previous"] = np.array(draw(st.lists(st.integers(-1, dc - 1), min_size=n, max_size=n)), dtype=np.int32)
        kw["hysteresis"] = draw(st.sampled_from([0.0, 0.05, 0.5, 0.99]))
    return costs, dc, kw


@settings(max_examples=400, deadline=None)
@given(array_problems())
def test_native_matches_reference(problem):
    costs, dc, kw = problem
    before = {k: np.array(v, copy=True) for k, v in kw.items() if isinstance(v, np.ndarray)}
    out = assign_srus_array(costs, dc, **kw)
    assert out.dtype == np.int32 and out.shape == costs.shape
    assert out.tolist() == reference_devices(costs, dc, **kw)
    assert ((out >= 0) & (out < dc)).all()
    pinned = kw.get("pinned")
    if pinned is not None:
        pins = np.where(pinned, 0, -1) if pinned.dtype == bool else pinned
        assert (out[pins >= 0] == pins[pins >= 0]).all()
    for k, v in before.items():                       # inputs are left as they were
        np.testing.assert_array_equal(kw[k], v)


@settings(max_examples=100, deadline=None)
@given(array_problems(), st.randoms(use_true_random=False))
def test_independent_of_input_order_given_ids(problem, rnd):
    costs, dc, kw = problem
    n = len(costs)
    kw.setdefault("ids", np.arange(n, dtype=np.int64) * 7 - 3)
    first = assign_srus_array(costs, dc, **kw)
    perm = np.array(rnd.sample(range(n), n), dtype=np.int64)
    shuffled = {k: (v[perm] if isinstance(v, np.ndarray) and v.shape[:1] == (n,) and k != "link_costs" else v)
                for k, v in kw.items()}
    again = assign_srus_array(costs[perm], dc, **shuffled)
    np.testing.assert_array_equal(again, first[perm])


@dataclass
class SRU:
    sru_id: int
    cost: float
    transfer: float = 0.0
    offloadable: bool = True


@settings(max_examples=150, deadline=None)
@given(array_problems())
def test_object_form_and_id_array_agree(problem):
    costs, dc, kw = problem
    n = len(costs)
    ids = kw.get("ids", np.arange(n, dtype=np.int64))
    transfer = kw.get("transfer")
    pinned = kw.get("pinned")
    if pinned is not None and pinned.dtype != bool:
        pinned = pinned == 0 if (pinned <= 0).all() else None
    if pinned is None:
        pinned = np.zeros(n, dtype=bool)
    srus = [SRU(int(i), float(c), float(transfer[k]) if transfer is not None else 0.0, not bool(pinned[k]))
            for k, (i, c) in enumerate(zip(ids, costs))]
    prev = kw.get("previous")
    common = dict(weights=kw.get("weights"), link_costs=kw.get("link_costs"), hysteresis=kw.get("hysteresis", 0.0))
    objects = assign_srus(srus, dc, cost=lambda s: s.cost, offloadable=lambda s: s.offloadable,
                          transfer_cost=(lambda s: s.transfer) if transfer is not None else None,
                          previous=None if prev is None else {s.sru_id: int(d) for s, d in zip(srus, prev)},
                          **common)
    arrays = assign_srus(ids, dc, cost=costs, transfer_cost=transfer, offloadable=~pinned, previous=prev, **common)
    assert isinstance(arrays, np.ndarray)
    assert [a.device_index for a in objects] == arrays.tolist()
    assert [a.sru_id for a in objects] == ids.tolist()
    if dc <= 6:
        ref = assign_srus_reference(srus, dc, cost=lambda s: s.cost, offloadable=lambda s: s.offloadable,
                                    transfer_cost=(lambda s: s.transfer) if transfer is not None else None,
                                    previous=None if prev is None else {s.sru_id: int(d) for s, d in zip(srus, prev)},
                                    **common)
        assert ref == objects


# ---- speed weights and link costs ---------------------------------------------------------------

def test_weights_give_proportional_work():
    costs = np.ones(1000)
    for weights in ([1.0, 3.0], [2.0, 1.0, 1.0], [1.0, 0.25, 4.0, 1.0]):
        out = assign_srus_array(costs, len(weights), weights=weights)
        share = np.bincount(out, minlength=len(weights)) / 1000
        np.testing.assert_allclose(share, np.array(weights) / sum(weights), atol=2e-3)
        # every device finishes within one SRU's time of the others
        finish = np.bincount(out, minlength=len(weights)) / np.array(weights)
        assert finish.max() - finish.min() <= 1.0 / min(weights)


def test_link_costs_steer_work_away_from_a_slow_link():
    costs = np.full(300, 10.0)
    transfer = np.full(300, 1.0)
    free = assign_srus_array(costs, 3, transfer=transfer)
    steered = assign_srus_array(costs, 3, transfer=transfer, link_costs=[0.0, 1.0, 40.0])
    assert np.bincount(steered, minlength=3)[2] < np.bincount(free, minlength=3)[2]
    # a [source, destination] matrix: column 0 (towards GPU 0) is what counts
    matrix = np.array([[0.0, 9.0, 9.0], [1.0, 0.0, 9.0], [40.0, 9.0, 0.0]])
    np.testing.assert_array_equal(assign_srus_array(costs, 3, transfer=transfer, link_costs=matrix), steered)
    # link costs alone: a fixed cost per SRU moved over that link
    assert assign_srus_array([1.0, 1.0], 2, link_costs=[0.0, 5.0]).tolist() == [0, 0]
    assert assign_srus_array([10.0, 10.0], 2, link_costs=[0.0, 5.0]).tolist() == [0, 1]
    span = makespan(steered, costs, 3, transfer=transfer, link_costs=[0.0, 1.0, 40.0])
    assert span <= makespan(free, costs, 3, transfer=transfer, link_costs=[0.0, 1.0, 40.0])


def test_ties_gpu0_first_then_less_loaded_then_lower_index():
    assert assign_srus_array([4.0], 2).tolist() == [0]
    assert assign_srus_array([2.0, 2.0, 2.0], 3, ids=[9, 8, 7]).tolist() == [2, 1, 0]
    # device 1 (weight 2) takes the first SRU; the second finishes at 1.0 on device 1 or 2: device 2 has less load
    assert assign_srus_array([1.0] * 4, 3, weights=[0.25, 2.0, 1.0]).tolist() == [1, 2, 1, 1]
    # GPU 0 wins a tie even against a less-loaded device
    assert assign_srus_array([1.0, 1.0], 2, transfer=[1.0, 1.0]).tolist() == [0, 0]


def test_pins_to_any_device():
    out = assign_srus_array([5.0, 5.0, 5.0, 1.0], 4, pinned=[3, -1, 3, -1])
    assert out[0] == 3 and out[2] == 3
    assert out[1] == 0 and out[3] == 1
    assert assign_srus_array([1.0, 1.0], 2, pinned=np.array([True, True])).tolist() == [0, 0]


def test_device_count_far_beyond_the_srus():
    n = 1000
    out = assign_srus_array(np.ones(n), 10**9)
    assert sorted(out.tolist()) == list(range(n))            # one SRU per device, the lowest indices
    # a device named by `previous` far out keeps its SRU in the sticky plan
    prev = np.full(n, -1, dtype=np.int64)
    prev[5] = 10**9 - 1
    out = assign_srus_array(np.ones(n), 10**9, previous=prev, hysteresis=0.5)
    assert out[5] == 10**9 - 1 and len(set(out.tolist())) == n
    assert out.tolist() == reference_devices(np.ones(n), 10**9, previous=prev, hysteresis=0.5)
    pinned = np.full(n, -1)
    pinned[:3] = 2**31 - 1
    out = assign_srus_array(np.ones(n), 2**40, pinned=pinned)
    assert out[:3].tolist() == [2**31 - 1] * 3
    # the object form too
    assert [a.device_index for a in assign_srus([SRU(i, 1.0) for i in range(4)], 10**9,
                                                cost=lambda s: s.cost)] == [0, 1, 2, 3]


def test_dtypes_accepted():
    costs = np.array([4, 3, 2, 1])
    expected = assign_srus_array(costs.astype(np.float64), 2).tolist()
    for dt in (np.int32, np.uint8, np.float32, np.int64):
        assert assign_srus_array(costs.astype(dt), 2).tolist() == expected
    assert assign_srus_array([4, 3, 2, 1], 2).tolist() == expected               # lists are arrays too
    assert assign_srus_array(costs, 2, ids=np.array([3, 2, 1, 0], dtype=np.uint16)).tolist() == expected
    assert assign_srus_array(costs, 2, previous=np.array([1, 1, 1, 1], dtype=np.int8), hysteresis=0.5).tolist() \
        == [1, 1, 1, 1]
    assert assign_srus_array(np.zeros(0), 3).tolist() == []


# ---- bad input -------------------------------------------------------------------------------------

BAD = [
    (dict(costs=np.array(["a", "b"])), TypeError, "costs must be an array of real numbers"),
    (dict(costs=np.array([True, False])), TypeError, "costs must be an array of real numbers"),
    (dict(costs=np.array([1 + 2j])), TypeError, "dtype complex"),
    (dict(costs=[1.0, None]), TypeError, "dtype object"),
    (dict(costs=np.ones((2, 2))), ValueError, r"costs must be one-dimensional, got shape \(2, 2\)"),
    (dict(costs=[1.0, math.nan]), ValueError, r"costs\[1\] must be finite and >= 0, got nan"),
    (dict(costs=[1.0, -3.0]), ValueError, r"costs\[1\] must be finite and >= 0, got -3.0"),
    (dict(costs=[math.inf]), ValueError, r"costs\[0\] must be finite"),
    (dict(transfer=[0.0, -1.0, 0.0]), ValueError, r"transfer\[1\] must be finite and >= 0, got -1.0"),
    (dict(transfer=[0.0]), ValueError, "transfer has 1 entries for 3 SRUs"),
    (dict(ids=[1, 2, 1]), ValueError, r"ids\[2\] is 1, the id of an earlier SRU"),
    (dict(ids=[1.0, 2.0, 3.0]), TypeError, "ids must be an array of integers"),
    (dict(ids=np.array([1, 2, 2**64 - 1], dtype=np.uint64)), ValueError, "must fit in int64"),
    (dict(pinned=[0, 5, -1]), IndexError, r"pinned\[1\] is 5: must be -1 \(free\) or a device in \[0, 2\)"),
    (dict(pinned=np.array([0, -2, -1], dtype=np.int32)), IndexError, r"pinned\[1\] is -2"),
    (dict(pinned=np.array([0, 2**40, -1])), IndexError, r"pinned\[1\] is 1099511627776"),
    (dict(pinned=[0.0, 1.0, 0.0]), TypeError, "pinned must be an array of device indices"),
    (dict(previous=[0, 0, 2]), IndexError, r"previous\[2\] is 2: must be -1 \(none\)"),
    (dict(previous=[0, 0]), ValueError, "previous has 2 entries for 3 SRUs"),
    (dict(weights=[1.0]), ValueError, "weights has 1 entries for 2 devices"),
    (dict(weights=[1.0, 0.0]), ValueError, "weight of device 1 must be a finite number > 0, got 0.0"),
    (dict(weights=[1.0, "x"]), ValueError, "weight of device 1 must be a finite number, got 'x'"),
    (dict(weights=5), TypeError, "weights must be a sequence of numbers"),
    (dict(link_costs=[0.0, -1.0]), ValueError, "link cost of device 1 must be a finite number >= 0"),
    (dict(link_costs=np.ones((2, 3))), ValueError, r"link_costs must have shape \(2,\) or \(2, 2\)"),
    (dict(hysteresis=1.0), ValueError, "hysteresis must be in"),
    (dict(hysteresis="0.1"), TypeError, "hysteresis must be a number"),
    (dict(hysteresis=None), TypeError, "hysteresis must be a number"),
    (dict(device_count=0), ValueError, "device_count must be >= 1, got 0"),
    (dict(device_count=2.0), TypeError, "device_count must be an int"),
    (dict(device_count=True), TypeError, "device_count must be an int"),
]


@pytest.mark.parametrize("fn", [assign_srus_array, reference_devices])
@pytest.mark.parametrize("kw, exc, match", BAD)
def test_bad_input_names_the_value(fn, kw, exc, match):
    kw = dict(kw)
    costs = kw.pop("costs", [3.0, 2.0, 1.0])
    dc = kw.pop("device_count", 2)
    if fn is reference_devices and exc is ValueError and "earlier SRU" in match:
        match = "distinct"
    if fn is reference_devices and exc is IndexError:
        match = match.split(":")[0]
    with pytest.raises(exc, match=match):
        fn(costs, dc, **kw)


def test_assign_srus_array_form_arguments():
    ids = np.array([10, 11, 12])
    assert assign_srus(ids, 2, cost=np.array([3.0, 2.0, 1.0])).tolist() == [0, 1, 1]
    with pytest.raises(TypeError, match="needs cost="):
        assign_srus(ids, 2)
    with pytest.raises(TypeError, match="must be an array like srus"):
        assign_srus(ids, 2, cost=lambda s: 1.0)
    with pytest.raises(TypeError, match="sru_id is an accessor"):
        assign_srus(ids, 2, cost=np.ones(3), sru_id=id)
    with pytest.raises(TypeError, match="offloadable must be an array of booleans"):
        assign_srus(ids, 2, cost=np.ones(3), offloadable=np.array([1, 0, 1]))
    with pytest.raises(TypeError, match="cost is an array but srus is not"):
        assign_srus([SRU(0, 1.0)], 2, cost=np.ones(1))
    assert assign_srus(ids, 2, cost=np.ones(3), offloadable=np.array([False, False, True])).tolist() == [0, 0, 1]


def test_object_form_link_costs_and_bad_previous_type():
    srus = [SRU(i, 10.0, 1.0) for i in range(6)]
    plan = assign_srus(srus, 3, cost=lambda s: s.cost, transfer_cost=lambda s: s.transfer,
                       link_costs=[0.0, 1.0, 100.0])
    assert all(a.device_index != 2 for a in plan)
    with pytest.raises(TypeError, match="previous device of SRU 0 must be an int"):
        assign_srus(srus, 3, cost=lambda s: s.cost, previous={0: "1"})
    with pytest.raises(TypeError, match="previous device of SRU 0 must be an int"):
        assign_srus(srus, 3, cost=lambda s: s.cost, previous={0: True})
