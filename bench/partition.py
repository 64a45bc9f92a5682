"""Bench of the greedy SRU partitioner: 100k SRUs on 8 devices, object form beside array form.

Prints one JSON object of figures, then a ratio line. Targets: native core
median <= 5 ms, the public array form (assign_srus_array, validation
included) <= 15 ms, native >= 30x the pure-Python reference on the same
input, makespan within 2% of max(max cost, total / devices) on uniform and
log-normal costs. Also reported: the object form (assign_srus with
accessors, the seed's spelling) and where its time goes, the array form with
every option, and device_count = 10**9 (time independent of the device
count). The seed's top-(N-1) rule is measured on the same inputs for comparison.
"""
from __future__ import annotations

import json
import statistics
import time

import numpy as np

from vkmulti._core import _native
from vkmulti import SRUAssignment, assign_srus, assign_srus_array
from vkmulti.offload import assign_srus_reference, makespan, seed_top_n_minus_1
from vkmulti.offload.partition import _prepare, _reference_devices

N, DEVICES = 100_000, 8


class SRU:
    __slots__ = ("sru_id", "cost")

    def __init__(self, sru_id: int, cost: float):
        self.sru_id, self.cost = sru_id, cost


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def by_cost(s: SRU) -> float:
    return s.cost


def run(name: str, costs: np.ndarray) -> dict:
    srus = [SRU(i, c) for i, c in enumerate(costs.tolist())]
    ids = np.arange(N, dtype=np.int64)
    _, problem = _prepare(srus, DEVICES, None, by_cost, None, None, None, None, 0.0)
    native_ms = median_ms(lambda: _native.partition(costs, DEVICES), 21)
    native_ids_ms = median_ms(lambda: _native.partition(costs, DEVICES, ids=ids[::-1].copy()), 21)
    array_ms = median_ms(lambda: assign_srus_array(costs, DEVICES), 21)
    array_ids_ms = median_ms(lambda: assign_srus(ids, DEVICES, cost=costs), 21)
    reference_ms = median_ms(lambda: _reference_devices(problem), 3)
    plan = assign_srus_array(costs, DEVICES)
    assert plan.tolist() == _reference_devices(problem), "native and reference plans differ"
    object_plan = assign_srus(srus, DEVICES, cost=by_cost)
    assert [a.device_index for a in object_plan] == plan.tolist(), "object and array forms differ"

    rng = np.random.default_rng(1)
    options = dict(weights=rng.uniform(0.5, 2.0, DEVICES), transfer=costs * 0.05,
                   link_costs=rng.uniform(0.5, 2.0, DEVICES),
                   pinned=np.where(rng.random(N) < 0.05, rng.integers(0, DEVICES, N), -1),
                   previous=plan, hysteresis=0.05)
    costs_moved = costs * rng.uniform(0.9, 1.1, N)
    all_options_ms = median_ms(lambda: assign_srus_array(costs_moved, DEVICES, **options), 21)
    huge_ms = median_ms(lambda: assign_srus_array(costs, 10**9), 5)

    # where the object form's time goes
    prepare_ms = median_ms(lambda: _prepare(srus, DEVICES, None, by_cost, None, None, None, None, 0.0), 5)
    devices = plan.tolist()
    objects_ms = median_ms(lambda: list(map(SRUAssignment, range(N), devices)), 5)

    bound = max(costs.max(), costs.sum() / DEVICES)
    greedy_span = makespan(plan, costs, DEVICES)
    seed_span = makespan(seed_top_n_minus_1(srus, DEVICES, cost=by_cost), costs, DEVICES)
    return {
        f"{name}_native_ms": round(native_ms, 3),
        f"{name}_native_shuffled_ids_ms": round(native_ids_ms, 3),
        f"{name}_array_form_ms": round(array_ms, 3),
        f"{name}_array_form_via_assign_srus_ms": round(array_ids_ms, 3),
        f"{name}_array_form_all_options_ms": round(all_options_ms, 3),
        f"{name}_array_form_1e9_devices_ms": round(huge_ms, 3),
        f"{name}_reference_ms": round(reference_ms, 1),
        f"{name}_native_speedup": round(reference_ms / native_ms, 1),
        f"{name}_object_form_ms": round(median_ms(lambda: assign_srus(srus, DEVICES, cost=by_cost), 5), 1),
        f"{name}_object_form_prepare_ms": round(prepare_ms, 1),
        f"{name}_object_form_make_assignments_ms": round(objects_ms, 1),
        f"{name}_assign_srus_reference_ms": round(
            median_ms(lambda: assign_srus_reference(srus, DEVICES, cost=by_cost), 3), 1),
        f"{name}_makespan_over_bound": round(greedy_span / bound, 6),
        f"{name}_seed_makespan_over_bound": round(seed_span / bound, 4),
        f"{name}_seed_over_greedy": round(seed_span / greedy_span, 3),
    }


def main() -> None:
    rng = np.random.default_rng(2024)
    figures = {"srus": N, "devices": DEVICES}
    figures |= run("uniform", rng.uniform(1.0, 100.0, N))
    figures |= run("lognormal", rng.lognormal(3.0, 1.0, N))
    print(json.dumps(figures, indent=2))
    both = ("uniform", "lognormal")
    native = max(figures[f"{d}_native_ms"] for d in both)
    array = max(figures[f"{d}_array_form_ms"] for d in both)
    obj = max(figures[f"{d}_object_form_ms"] for d in both)
    speedup = min(figures[f"{d}_native_speedup"] for d in both)
    span = max(figures[f"{d}_makespan_over_bound"] for d in both)
    print(f"ratio: native {native:.2f} ms (target <= 5), array form {array:.2f} ms (target <= 15) = "
          f"{obj / array:.1f}x faster than the object form ({obj:.1f} ms), native/reference {speedup:.1f}x "
          f"(target >= 30), makespan/bound {span:.4f} (target <= 1.02), seed top-(N-1)/greedy makespan "
          f"{figures['uniform_seed_over_greedy']:.2f}x uniform, "
          f"{figures['lognormal_seed_over_greedy']:.2f}x log-normal")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
