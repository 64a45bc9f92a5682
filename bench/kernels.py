"""Kernel runtime bench: launch time, step latency and pipelined step rate, a
host round trip through a kernel, and a ping-pong hop between two kernels of
one device, against the floor measured in the same run: an empty command
buffer submitted to the same queue and waited with a fence.

Prints figures as JSON, then a line starting with "ratio:" (step latency over
the empty-submit floor). Uses the virtual lavapipe pair when no GPU is present.

    python bench/kernels.py [--reps 50] [--device 0] [--virtual N] [--json FILE]
"""
from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from vkmulti.apps.benchmarks import median_time
from vkmulti.apps.cli_args import Parser, add_output_argument, add_virtual_argument, print_figures
from vkmulti.testing import use_virtual_if_no_gpu


def stats(times: list[float]) -> dict[str, float]:
    a = np.array(times)
    return {"median_us": float(np.median(a) * 1e6), "min_us": float(a.min() * 1e6),
            "p90_us": float(np.percentile(a, 90) * 1e6)}


def run(manager: Any, device: int, reps: int) -> dict[str, Any]:
    from vkmulti.kernels import KernelRuntime, MultiGpuCoordinator, counter_kernel, pingpong_kernel
    from vkmulti.kernels.reference import COUNTER_TAG_QUERY, counter_initial_state

    res: dict[str, Any] = {"device": manager.slot(device).name, "reps": reps}
    rt = KernelRuntime(MultiGpuCoordinator.from_manager(manager), max_kernels=64)
    try:
        spec = counter_kernel(max_sources=64)
        t0 = time.perf_counter()
        first = rt.launch(spec, device=device, state=[counter_initial_state(64)])
        res["first_launch_us"] = (time.perf_counter() - t0) * 1e6   # includes the device's pipelines

        def launch_destroy() -> None:
            rt.launch(spec, device=device, state=[counter_initial_state(64)]).destroy()
        res["launch_destroy"] = stats(median_time(launch_destroy, reps, 2)[1])

        ctx = rt._context(device)
        res["empty_submit"] = stats(median_time(lambda: ctx.run_once(lambda cmd: None), reps, 3)[1])
        res["step_latency"] = stats(median_time(lambda: rt.step(first).wait(60), reps, 3)[1])

        n = max(reps, 20)
        rt.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            rt.step(first)
        rt.synchronize()
        res["pipelined_step_us"] = (time.perf_counter() - t0) / n * 1e6

        q = np.array([1], np.uint32)

        def round_trip() -> None:
            rt.send(first, q, tag=COUNTER_TAG_QUERY)
            rt.step(first)
            rt.receive(first, timeout=60)
        res["host_round_trip"] = stats(median_time(round_trip, reps, 3)[1])

        a = rt.launch(pingpong_kernel(), "ping", device=device)
        b = rt.launch(pingpong_kernel(), "pong", device=device, params=[a.address])
        a.set_params(b.address)
        hops = max(reps, 20)
        rt.send(a, np.array([hops], np.uint32))
        t0 = time.perf_counter()
        steps = 0
        while rt.pending_receives(a) + rt.pending_receives(b) == 0:
            rt.step([a, b])
            steps += 1
        rt.synchronize()
        res["pingpong_hop_us"] = (time.perf_counter() - t0) / (hops + 1) * 1e6
        res["pingpong_steps"] = steps
    finally:
        rt.destroy()
    res["ratio_step_to_empty_submit"] = res["step_latency"]["median_us"] / res["empty_submit"]["median_us"]
    return res


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--device", type=int, default=0)
    add_virtual_argument(p)
    add_output_argument(p, "--json", image=False, help="also write the figures to this file")
    args = p.parse_args(argv)
    note = use_virtual_if_no_gpu(args.virtual)
    if note:
        print(note, file=sys.stderr)
    from vkmulti import MultiDeviceManager

    mgr = MultiDeviceManager.create()
    try:
        res = run(mgr, args.device, args.reps)
    finally:
        mgr.destroy()
    print_figures(res, args.json)
    print(f"ratio: kernel step latency = {res['ratio_step_to_empty_submit']:.2f}x an empty submit+wait "
          f"({res['step_latency']['median_us']:.0f} us vs {res['empty_submit']['median_us']:.0f} us); "
          f"pipelined step {res['pipelined_step_us']:.0f} us, launch {res['launch_destroy']['median_us']:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
