"""Bench of the greedy SRU partitioner: 100k SRUs on 8 devices.

Prints one JSON object of figures, then a ratio line. Targets: native median
<= 20 ms, native >= 30x the pure-Python reference on the same input, makespan
within 2% of max(max cost, total / devices) on uniform and log-normal costs.
The seed's top-(N-1) rule is measured on the same inputs for comparison.
"""
from __future__ import annotations

import json
import statistics
import time

import numpy as np

from vkmulti import _native
from vkmulti.partition import (_prepare, _reference_devices, assign_srus, assign_srus_reference, makespan,
                               seed_top_n_minus_1)

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
    keys = np.arange(N, dtype=np.int64)
    srus = [SRU(i, c) for i, c in enumerate(costs.tolist())]
    problem = _prepare(srus, DEVICES, None, by_cost, None, None, None, None, 0.0)
    native_ms = median_ms(lambda: _native.partition(costs, keys, DEVICES), 21)
    reference_ms = median_ms(lambda: _reference_devices(problem), 3)
    plan = _native.partition(costs, keys, DEVICES)
    assert plan.tolist() == _reference_devices(problem), "native and reference plans differ"

    rng = np.random.default_rng(1)
    options = dict(weights=rng.uniform(0.5, 2.0, DEVICES), transfer=costs * 0.05,
                   pinned=rng.random(N) < 0.05, previous=plan, hysteresis=0.05)
    costs_moved = costs * rng.uniform(0.9, 1.1, N)
    all_options_ms = median_ms(lambda: _native.partition(costs_moved, keys, DEVICES, **options), 21)

    bound = max(costs.max(), costs.sum() / DEVICES)
    cost_list = costs.tolist()
    greedy_span = makespan(plan.tolist(), cost_list, DEVICES)
    seed_span = makespan(seed_top_n_minus_1(srus, DEVICES, cost=by_cost), cost_list, DEVICES)
    return {
        f"{name}_native_ms": round(native_ms, 3),
        f"{name}_reference_ms": round(reference_ms, 1),
        f"{name}_native_speedup": round(reference_ms / native_ms, 1),
        f"{name}_native_all_options_ms": round(all_options_ms, 3),
        f"{name}_assign_srus_ms": round(median_ms(lambda: assign_srus(srus, DEVICES, cost=by_cost), 5), 1),
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
    native = max(figures["uniform_native_ms"], figures["lognormal_native_ms"])
    speedup = min(figures["uniform_native_speedup"], figures["lognormal_native_speedup"])
    span = max(figures["uniform_makespan_over_bound"], figures["lognormal_makespan_over_bound"])
    print(f"ratio: native {native:.2f} ms (target <= 20), native/reference {speedup:.1f}x (target >= 30), "
          f"makespan/bound {span:.4f} (target <= 1.02), seed top-(N-1)/greedy makespan "
          f"{figures['uniform_seed_over_greedy']:.2f}x uniform, {figures['lognormal_seed_over_greedy']:.2f}x log-normal")


if __name__ == "__main__":
    main()
