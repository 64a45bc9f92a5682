"""assign_srus: the native greedy partitioner against its pure-Python reference, and its rules."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vkmulti._core import _native
from vkmulti import SRUAssignment, assign_srus
from vkmulti.offload import assign_srus_reference, makespan, seed_top_n_minus_1


@dataclass
class SRU:
    sru_id: object
    cost: float = 1.0
    transfer: float = 0.0
    offloadable: bool = True
    instances: list = field(default_factory=list)
    skinned_instances: list = field(default_factory=list)


def by_cost(s):
    return s.cost


def by_transfer(s):
    return s.transfer


def devices(plan):
    return [a.device_index for a in plan]


def plan_of(srus, device_count, **kw):
    return devices(assign_srus(srus, device_count, cost=by_cost, **kw))


# ---- native == reference on random inputs ------------------------------------------------------

costs_st = st.one_of(st.integers(0, 6).map(float),
                     st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False))


@st.composite
def problems(draw):
    n = draw(st.integers(0, 40))
    dc = draw(st.integers(1, 6))
    id_kind = draw(st.sampled_from(["small", "big", "str"]))
    raw = draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n, unique=True))
    ids = {"small": raw, "big": [2**70 + i for i in raw], "str": [f"sru{i}" for i in raw]}[id_kind]
    srus = [SRU(i, draw(costs_st), draw(st.sampled_from([0.0, 0.5, 3.0, 1e3])), draw(st.booleans()))
            for i in ids]  # SRU(sru_id, cost, transfer, offloadable)
    kw = {"cost": by_cost}
    if draw(st.booleans()):
        kw["weights"] = draw(st.lists(st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0]),
                                      min_size=dc, max_size=dc))
    if draw(st.booleans()):
        kw["transfer_cost"] = by_transfer
    if draw(st.booleans()):
        kw["offloadable"] = lambda s: True  # else the default accessor reads .offloadable
    if draw(st.booleans()):
        prev = {s.sru_id: draw(st.integers(-1, dc)) for s in srus if draw(st.booleans())}
        if draw(st.booleans()):
            prev = [SRUAssignment(k, d) for k, d in prev.items()]
        kw["previous"] = prev
        kw["hysteresis"] = draw(st.sampled_from([0.0, 0.05, 0.2, 0.5, 0.99]))
    return srus, dc, kw


@settings(max_examples=300, deadline=None)
@given(problems())
def test_native_matches_reference(problem):
    srus, dc, kw = problem
    native = assign_srus(srus, dc, **kw)
    assert native == assign_srus_reference(srus, dc, **kw)
    assert [a.sru_id for a in native] == [s.sru_id for s in srus]
    assert all(0 <= a.device_index < dc for a in native)


@settings(max_examples=100, deadline=None)
@given(problems(), st.randoms(use_true_random=False))
def test_deterministic_and_independent_of_input_order(problem, rnd):
    srus, dc, kw = problem
    first = assign_srus(srus, dc, **kw)
    assert assign_srus(srus, dc, **kw) == first
    shuffled = list(srus)
    rnd.shuffle(shuffled)
    again = {a.sru_id: a.device_index for a in assign_srus(shuffled, dc, **kw)}
    assert again == {a.sru_id: a.device_index for a in first}


@settings(max_examples=100, deadline=None)
@given(st.lists(costs_st, max_size=60), st.integers(1, 8))
def test_balanced(costs, dc):
    srus = [SRU(i, c) for i, c in enumerate(costs)]
    span = makespan(assign_srus(srus, dc, cost=by_cost), costs, dc)
    total = sum(costs)
    biggest = max(costs, default=0.0)
    assert span >= max(biggest, total / dc) * (1 - 1e-12)
    # list scheduling: the last SRU on the busiest device started no later than the mean load
    assert span <= total / dc + biggest * (dc - 1) / dc + 1e-9 * (total + 1)


@pytest.mark.parametrize("dist", ["uniform", "lognormal"])
def test_many_srus_within_two_percent_of_lower_bound(dist):
    rng = np.random.default_rng(7)
    costs = (rng.uniform(1, 100, 5000) if dist == "uniform" else rng.lognormal(3, 1, 5000)).tolist()
    srus = [SRU(i, c) for i, c in enumerate(costs)]
    span = makespan(assign_srus(srus, 8, cost=by_cost), costs, 8)
    assert span <= 1.02 * max(max(costs), sum(costs) / 8)
    seed = makespan(seed_top_n_minus_1(srus, 8, cost=by_cost), costs, 8)
    assert seed > 5 * span


# ---- the rules -----------------------------------------------------------------------------------

def test_ties_go_to_gpu0_then_lower_index_and_sru_ties_by_id():
    assert plan_of([SRU(0, 4.0)], 2) == [0]                      # the seed offloaded a lone SRU
    assert plan_of([SRU(5, 1.0), SRU(3, 1.0)], 2) == [1, 0]       # id 3 is placed first, on GPU 0
    assert plan_of([SRU(i, 2.0) for i in (9, 8, 7)], 3) == [2, 1, 0]
    assert plan_of([SRU("b", 1.0), SRU("a", 1.0)], 2) == [1, 0]


def test_greedy_follows_earliest_finish():
    assert plan_of([SRU(i, c) for i, c in enumerate([7, 5, 4, 3, 1])], 2) == [0, 1, 1, 0, 1]


def test_weights_make_a_device_faster():
    # device 1 is twice as fast: 4 -> d1 (2 < 4); 4 -> tie at 4, GPU 0; 4 -> d1 (4 < 8)
    assert plan_of([SRU(i, 4.0) for i in range(3)], 2, weights=[1.0, 2.0]) == [1, 0, 1]
    assert plan_of([SRU(i, 1.0) for i in range(6)], 3, weights=[1, 1, 4]) == [2, 2, 2, 0, 1, 2]


def test_transfer_cost_keeps_small_srus_home():
    assert plan_of([SRU(0, 1.0, transfer=5.0)], 2, transfer_cost=by_transfer) == [0]
    srus = [SRU(0, 10.0, transfer=1.0), SRU(1, 10.0, transfer=1.0)]
    assert plan_of(srus, 2, transfer_cost=by_transfer) == [0, 1]
    tiny = [SRU(i, 1.0, transfer=2.0) for i in range(4)]     # 3 vs 1 + 2: a tie stays home
    assert plan_of(tiny, 2, transfer_cost=by_transfer) == [0, 0, 0, 1]


def test_pinned_srus_stay_on_gpu0_and_count_there():
    srus = [SRU(0, 4.0), SRU(1, 10.0, offloadable=False), SRU(2, 4.0)]
    assert plan_of(srus, 2) == [1, 0, 1]
    # default accessor reads .offloadable; a pinned SRU is never offloaded, even when alone
    assert devices(assign_srus([SRU(0, offloadable=False), SRU(1)], 2)) == [0, 1]
    assert plan_of([SRU(0, 50.0, offloadable=False)], 4) == [0]


def test_stickiness_with_hysteresis():
    srus = [SRU(c, 10.0) for c in "abcd"]
    prev = {"a": 0, "b": 1, "c": 1, "d": 1}                     # sticky makespan 30, greedy 20
    assert plan_of(srus, 2, previous=prev) == [0, 1, 0, 1]      # 20 < 30: re-plan
    assert plan_of(srus, 2, previous=prev, hysteresis=0.3) == [0, 1, 0, 1]   # 20 < 21
    assert plan_of(srus, 2, previous=prev, hysteresis=0.34) == [0, 1, 1, 1]  # 20 >= 19.8: keep
    # equal makespans keep the previous plan, even with hysteresis 0
    assert plan_of(srus, 2, previous={"a": 1, "b": 1, "c": 0, "d": 0}) == [1, 1, 0, 0]


def test_stickiness_places_new_srus_around_kept_ones():
    srus = [SRU("a", 10.0), SRU("b", 10.0), SRU("new", 6.0), SRU("gone", 1.0)]
    prev = {"a": 1, "b": 0, "gone": 7}                          # device 7 no longer exists
    assert plan_of(srus, 3, previous=prev, hysteresis=0.5) == [1, 0, 2, 2]


def test_pinned_overrides_previous():
    srus = [SRU(0, 5.0, offloadable=False), SRU(1, 5.0)]
    assert plan_of(srus, 2, previous={0: 1, 1: 0}, hysteresis=0.9) == [0, 0]


def test_previous_as_list_or_dict_agree():
    srus = [SRU(i, float(c)) for i, c in enumerate([9, 8, 7, 6, 5, 4, 3, 2, 1])]
    last = assign_srus(srus, 3, cost=by_cost)
    srus[0].cost = 2.0
    as_list = assign_srus(srus, 3, cost=by_cost, previous=last, hysteresis=0.5)
    as_dict = assign_srus(srus, 3, cost=by_cost, hysteresis=0.5,
                          previous={a.sru_id: a.device_index for a in last})
    assert as_list == as_dict == last


@settings(max_examples=100, deadline=None)
@given(problems())
def test_result_is_the_greedy_or_the_sticky_plan(problem):
    srus, dc, kw = problem
    if "previous" not in kw:
        return
    h = kw["hysteresis"]
    prev = kw["previous"]
    prev = prev if isinstance(prev, dict) else {a.sru_id: a.device_index for a in prev}
    pinned = {s.sru_id for s in srus if "offloadable" not in kw and not s.offloadable}
    plan = assign_srus(srus, dc, **kw)
    greedy = assign_srus(srus, dc, **{k: v for k, v in kw.items() if k not in ("previous", "hysteresis")})
    if dc == 1 or plan == greedy:
        return
    for a in plan:
        d = prev.get(a.sru_id, -1)
        if a.sru_id not in pinned and 0 <= d < dc:
            assert a.device_index == d
    args = ([s.cost for s in srus], dc, kw.get("weights"),
            [s.transfer for s in srus] if "transfer_cost" in kw else None)
    assert makespan(greedy, *args) >= makespan(plan, *args) * (1 - h) * (1 - 1e-9)


def test_default_accessors_and_single_device():
    srus = [SRU(1, instances=[1, 2, 3]), SRU(2, skinned_instances=[1]), SRU(3, instances=None)]
    plan = assign_srus(srus, 1)
    assert plan == [SRUAssignment(1, 0), SRUAssignment(2, 0), SRUAssignment(3, 0)]
    assert not any(a.needs_transfer for a in plan)
    # costs 3, 1, 1 (an empty SRU costs 1) on two devices
    assert devices(assign_srus(srus, 2)) == [0, 1, 1]
    assert SRUAssignment(4, 1).needs_transfer


def test_identity_ids_and_empty_list():
    objs = [SRU(None, float(c)) for c in (3, 2, 1)]
    plan = assign_srus(objs, 2, sru_id=id, cost=by_cost)
    assert [a.sru_id for a in plan] == [id(o) for o in objs]
    assert devices(plan) == [0, 1, 1]
    assert assign_srus([], 4) == [] == assign_srus_reference([], 4)


def test_frozen_assignment():
    a = SRUAssignment(1, 0)
    with pytest.raises(AttributeError):
        a.device_index = 1


# ---- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [assign_srus, assign_srus_reference])
@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "x"])
def test_bad_cost_names_the_sru(fn, bad):
    with pytest.raises(ValueError, match="SRU 7"):
        fn([SRU(1, 1.0), SRU(7, bad)], 2, cost=by_cost)
    with pytest.raises(ValueError, match="transfer_cost of SRU 7"):
        fn([SRU(1, 1.0), SRU(7, 1.0, transfer=bad)], 2, cost=by_cost, transfer_cost=by_transfer)


@pytest.mark.parametrize("fn", [assign_srus, assign_srus_reference])
def test_bad_arguments(fn):
    srus = [SRU(1), SRU(2)]
    for dc in (1.5, "2", None, True):
        with pytest.raises(TypeError, match="device_count"):
            fn(srus, dc)
    with pytest.raises(ValueError, match="duplicate sru_id 2"):
        fn([SRU(2), SRU(1), SRU(2)], 2)
    with pytest.raises(ValueError, match=r"weights has 3 entries for 2 devices"):
        fn(srus, 2, weights=[1, 1, 1])
    for w in (0, -1, math.nan, math.inf):
        with pytest.raises(ValueError, match="weight of device 1"):
            fn(srus, 2, weights=[1, w])
    for h in (1.0, -0.1, math.nan):
        with pytest.raises(ValueError, match="hysteresis"):
            fn(srus, 2, hysteresis=h)
    with pytest.raises(TypeError, match=r"sru_id must be an int or a str, got \(1, 2\)"):
        fn([SRU((1, 2))], 2)
    with pytest.raises(TypeError, match="all ints or all strs"):
        fn([SRU(1), SRU("a")], 2)
    with pytest.raises(TypeError, match="previous"):
        fn(srus, 2, previous=[(1, 0)])


def test_native_layer_rejects_bad_arrays():
    with pytest.raises(ValueError, match="ids has 1 entries for 2 costs"):
        _native.partition([1.0, 2.0], 2, ids=[0])
    with pytest.raises(ValueError, match="weights has 1 entries for 2 devices"):
        _native.partition([1.0, 2.0], 2, weights=[1.0])
    with pytest.raises(ValueError, match=r"costs\[1\] must be finite and >= 0, got -2.0"):
        _native.partition([1.0, -2.0], 2)
    with pytest.raises(ValueError, match="hysteresis"):
        _native.partition([1.0, 2.0], 2, previous=[0, 1], hysteresis=1.0)
    with pytest.raises(ValueError, match="device_count"):
        _native.partition([1.0], 0)
    with pytest.raises(IndexError, match=r"pinned\[0\] is 2"):
        _native.partition([1.0], 2, pinned=[2])
    with pytest.raises(ValueError, match=r"ids\[2\] is 5, the id of an earlier SRU"):
        _native.partition([1.0, 1.0, 1.0], 2, ids=[5, 1, 5])
    out = _native.partition(np.array([3.0, 1.0, 1.0]), 2, ids=np.array([0, 1, 2]))
    assert out.dtype == np.int32 and out.tolist() == [0, 1, 1]
    assert _native.partition(np.zeros(0), 3).tolist() == []


def test_native_large_input_matches_reference():
    rnd = random.Random(3)
    srus = [SRU(i, rnd.lognormvariate(2, 1.5), rnd.random(), rnd.random() > 0.05) for i in range(3000)]
    kw = dict(cost=by_cost, transfer_cost=by_transfer, offloadable=lambda s: s.offloadable,
              weights=[1.0, 0.5, 2.0, 1.0, 1.25])
    first = assign_srus(srus, 5, **kw)
    assert first == assign_srus_reference(srus, 5, **kw)
    for s in srus[::7]:
        s.cost *= rnd.uniform(0.8, 1.25)
    for h in (0.0, 0.01, 0.2):
        kw.update(previous=first, hysteresis=h)
        assert assign_srus(srus, 5, **kw) == assign_srus_reference(srus, 5, **kw)


@pytest.mark.parametrize("fn", [assign_srus, assign_srus_reference])
@pytest.mark.parametrize("dc", [1, 0, -3])
def test_one_device_or_less_keeps_every_sru_on_gpu0_as_the_seed(fn, dc):
    """The seed documents "1 or less keeps every SRU on GPU 0". Before: ValueError
    'device_count must be >= 1, got 0'. The array forms stay strict."""
    srus = [SRU(1, 3.0), SRU(2, 1.0), SRU(3, 2.0)]
    assert [(a.sru_id, a.device_index) for a in fn(srus, dc, cost=by_cost)] == [(1, 0), (2, 0), (3, 0)]
    with pytest.raises(ValueError, match="costs? of SRU 9"):
        fn([SRU(9, -1.0)], dc, cost=by_cost)               # the SRUs are still checked


@pytest.mark.parametrize("fn", [assign_srus, assign_srus_reference])
def test_the_same_sru_object_twice_gets_one_device_as_in_the_seed(fn):
    """Before: ValueError 'duplicate sru_id 1' for one object listed twice. Now it is
    planned once and both entries get its device (the seed keys offloads by id());
    distinct objects with one sru_id still raise."""
    a, b, c = SRU(1, 5.0), SRU(2, 1.0), SRU(3, 1.0)
    got = fn([a, b, a, c], 2, cost=by_cost)
    assert [x.sru_id for x in got] == [1, 2, 1, 3]
    assert got[0].device_index == got[2].device_index
    single = {x.sru_id: x.device_index for x in fn([a, b, c], 2, cost=by_cost)}
    assert {x.sru_id: x.device_index for x in got} == single
    with pytest.raises(ValueError, match="duplicate sru_id 1"):
        fn([a, SRU(1, 5.0)], 2, cost=by_cost)
