"""Coordinator registry bench: figures as one JSON object, then one `ratio:` line.

Registers n devices (`--devices`, default 1,000,000) one register_device call
each, then times select_device over all of them for each built-in strategy
and place_kernel + remove_kernel pairs with n kernels on 8 devices. The
`ratio:` line is the time per registration at n over that at n/10: about 1
for O(1) amortised registration (it was ~n/(n/10) = 10 when every
registration rebuilt the candidate and live lists). Peak RSS is reported:
memory grows linearly with the devices registered.
"""
from __future__ import annotations

import argparse
import json
import resource
import time

from vkmulti import Backend, DeviceInfo, LoadBalancingStrategy, MultiGpuConfig, MultiGpuCoordinator


def register(n: int) -> tuple[MultiGpuCoordinator, float]:
    coord = MultiGpuCoordinator(MultiGpuConfig(load_balancing=LoadBalancingStrategy.LEAST_LOADED))
    t = time.perf_counter()
    for i in range(n):
        coord.register_device(DeviceInfo(i, "gpu", Backend.VULKAN))
    return coord, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=1_000_000)
    ap.add_argument("--kernels", type=int, default=1_000_000)
    args = ap.parse_args()
    n = args.devices
    _, small = register(n // 10)
    coord, big = register(n)
    out: dict = {"devices": n, "register_s": round(big, 3), "register_us_each": round(big / n * 1e6, 3),
                 f"register_s_at_{n // 10}": round(small, 3)}
    select = {}
    for strategy in (LoadBalancingStrategy.FIRST_AVAILABLE, LoadBalancingStrategy.LEAST_LOADED,
                     LoadBalancingStrategy.ROUND_ROBIN, LoadBalancingStrategy.MEMORY_BASED):
        c = MultiGpuCoordinator(MultiGpuConfig(load_balancing=strategy))
        for info in coord.devices():
            c.register_device(info)
        t = time.perf_counter()
        for _ in range(5):
            c.select_device()
        select[strategy.name] = round((time.perf_counter() - t) / 5 * 1e3, 2)
    out["select_ms_over_all_devices"] = select
    few = MultiGpuCoordinator(MultiGpuConfig(load_balancing=LoadBalancingStrategy.LEAST_LOADED,
                                             max_kernels_per_device=args.kernels))
    for i in range(8):
        few.register_device(DeviceInfo(i, "gpu", Backend.VULKAN))
    t = time.perf_counter()
    for k in range(args.kernels):
        few.place_kernel(f"k{k}")
    out["place_kernel_s"] = round(time.perf_counter() - t, 3)
    out["kernels"] = args.kernels
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=1))
    print(f"ratio: per-registration time at {n} / at {n // 10} = {(big / n) / (small / (n // 10)):.2f}")


if __name__ == "__main__":
    main()
