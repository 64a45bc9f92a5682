"""Cross-GPU K2K bench: kernel-to-kernel messages between two devices through the
CrossGpuK2KRouter, against baselines measured in the same run.

(a) latency: one-way latency of a 256-byte message between ping-pong kernels on
    GPU 0 and GPU 1 (hops / time; one runtime step of both kernels per hop),
    against the same hop relayed by hand through the host with the same
    transfers: after each step the host reads the sender's outbox batch back
    (device -> host), writes it into a buffer on the other device (host ->
    device) and hands it to that device's kernels (accept_batch). Also shown:
    the cheapest host path (the message read from one kernel's host queue, K2H,
    and written to the other's, H2K), which moves a message, not a batch.
    And against the hardware floor of a hop, measured in the same rounds: a
    raw 256-byte CrossDeviceTransfer by the router's method, submitted and
    waited for, plus a bare submit/fence round trip on the receiving device
    (goal: K2K <= 1.5x the floor); host_us_per_step is the median time in
    step() of the two kernels (goal <= 100 us), host_cpu_us_per_step the
    stepping thread's own CPU time in it (on the CPU VM lavapipe runs the
    devices' steps on the same cores, and the wall time holds that too).
(b) bandwidth: batches of 16 KiB ... (--max) of messages from a burst kernel on
    GPU 0 to a checking sink on GPU 1, one batch per step, against the pair's
    raw transfer bandwidth: CrossDeviceTransfer buffer copies of the same size
    (the outbox region: 64-byte header + slots), back to back (as many as the
    K2K run moves batches: sustained), with each method the pair supports; the
    baseline of a round is its best method. K2K bandwidth = batches x batch bytes / the time from the
    first step to the last batch delivered (one more step takes it, then the
    runtime is synchronized); every message must arrive and pass the sink's
    check. Making the payloads is the sender's work, not the router's: by
    default the sender writes each outbox region's payloads in full once and
    then only restamps the words the sink checks (its step number and slot in
    words 0-1, the middle and the last word), as a kernel whose results are
    ready; the router still moves and the sink still receives every byte of
    every slot. --fresh-payloads makes the sender rewrite every payload word at
    every step (on lavapipe its shader then bounds the figure at ~2-3 GB/s).
    The JSON also gives the time spent in step() per batch (host_ms_per_step:
    the host's work plus its waits for in-flight room, the bound on K2K
    bandwidth once the bytes cost nothing), the median and longest step call
    (a long one is a stall of a shared machine, which a K2K run with its few
    steps in flight absorbs worse than 64 queued raw copies) and how many
    batches the sink read in place. --no-in-place makes the receiving step copy every
    batch into the inbox (the path before in-place reading), for comparison.
(c) run: the host's CPU time per step of `run(steps=N)` of idle kernels (one on GPU 0,
    one on each device, and one on each device with the K2K router attached), with its native path (quiet steps recorded and submitted in C,
    read back only where one was not quiet) against the same run made step by step
    (stepping.QUIET_RUNS off), paired rounds (goal: <= 30 us per step); the wall time
    per step beside it (the devices' own step time bounds it); and, in the same rounds, the
    native path with the other way of waiting for room (engine/stepper.py's RUN_NAPS: the
    driver's blocking wait, the library's default, or naps), with the ratio of their CPU.
(d) stencil: Jacobi step time of one grid on one device and split over two, and the
    host's share of the two-device run (CPU time of the stepping thread / wall time).

Both comparisons are paired: --rounds times a K2K run, then a baseline run,
alternately (the machines are shared; drift hits both sides of a pair
alike). The ratio line gives the median of the per-round ratios; the JSON has
every round, the best of each side and the ranges.

Prints figures as JSON, then a line starting with "ratio:". Uses the virtual
lavapipe pair when no GPU is present.

    python bench/k2k.py [--section all|latency|bandwidth|run|stencil] [--hops 100] [--rounds 5]
                        [--run-steps 2000] [--max 16M] [--method METHOD] [--fresh-payloads] [--no-in-place]
                        [--stencil 2048x2048] [--timeline-naps]
                        [--virtual N] [--json FILE]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import numpy as np

from vkmulti.apps.stencil import LIGHT_SIZE, LIGHT_STEPS
from vkmulti.testing import use_virtual_if_no_gpu

KIB, MIB = 1 << 10, 1 << 20


def parse_bytes(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": KIB, "M": MIB, "G": 1 << 30}.get(t[-1:], 1)
    try:
        n = int(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size like 16K, 16M or 256M, got {text!r}") from None
    if n < 16 * KIB:
        raise argparse.ArgumentTypeError(f"sizes start at 16K, got {text!r}")
    return n


def sizes_up_to(top: int) -> list[int]:
    out, n = [], 16 * KIB
    while n <= top:
        out.append(n)
        n *= 4 if n < MIB else 2
    return out


def _runtime(mgr: Any, payload: int, method: str | None) -> tuple[Any, Any]:
    from vkmulti.kernels import CrossGpuK2KRouter, KernelRuntime, MultiGpuCoordinator

    coord = MultiGpuCoordinator.from_manager(mgr)
    rt = KernelRuntime(coord, mgr, payload_size=payload, max_kernels=16)
    methods = {(0, 1): method, (1, 0): method} if method else None
    return rt, CrossGpuK2KRouter(coord, rt, transfer_methods=methods)


# -- (a) latency ----------------------------------------------------------------------

def latency(mgr: Any, hops: int, method: str | None, rounds: int) -> dict[str, Any]:
    from vkmulti.kernels import pingpong_kernel

    payload = np.zeros(64, np.uint32)       # 256 bytes: word 0 counts the hops left
    rt, router = _runtime(mgr, 256, method)
    relay = BatchRelay(mgr)
    try:
        a = rt.launch(pingpong_kernel(), "ping", device=0)
        b = rt.launch(pingpong_kernel(), "pong", device=1, params=[a.address])
        a.set_params(b.address)

        host_per_step: list[float] = []
        cpu_per_step: list[float] = []

        def k2k(n: int) -> float:
            payload[0] = n
            rt.synchronize()
            t0 = time.perf_counter()
            rt.send(a, payload)
            steps, host, cpu = 0, 0.0, 0.0
            while rt.pending_receives(a) + rt.pending_receives(b) == 0:
                t1, c1 = time.perf_counter(), time.thread_time()
                rt.step([a, b])
                host += time.perf_counter() - t1
                cpu += time.thread_time() - c1
                steps += 1
                if steps > 4 * n + 50:
                    raise RuntimeError("the ping-pong message was lost")
            dt = time.perf_counter() - t0
            host_per_step.append(host / steps)
            cpu_per_step.append(cpu / steps)
            (rt.receive(a, timeout=1) if rt.pending_receives(a) else rt.receive(b, timeout=1))
            return dt
        k2k(4)                                   # warm: rings, imports, pipelines
        relay.run(4)
        floor = Floor(mgr, router.transfer_method(0, 1))
        floor.run(20)
        host_per_step.clear()
        cpu_per_step.clear()
        t_k2k, t_batch, t_floor = [], [], []
        for _ in range(rounds):                  # paired: K2K, the hand-made relay, the hardware floor
            t_k2k.append(k2k(hops) / hops)
            t_batch.append(relay.run(hops) / hops)
            t_floor.append(floor.run(hops))

        # the same message relayed by the host: read back from one kernel, written to the other
        a.set_params(0)
        b.set_params(0)                          # reply to the sender: the host

        def by_hand(n: int) -> float:
            payload[0] = 2 * n + 1               # never reaches 0: every hop goes back to the host
            rt.synchronize()
            t0 = time.perf_counter()
            k, other = a, b
            rt.send(k, payload)
            for _ in range(n):
                rt.step(k)
                m = rt.receive(k, timeout=30)    # read back (K2H)
                rt.send(other, m.payload)        # write to the other device (H2K)
                k, other = other, k
            rt.step(k)
            rt.receive(k, timeout=30)
            return time.perf_counter() - t0
        by_hand(4)
        t_hand = min(by_hand(hops) for _ in range(3)) / (hops + 1)
        method = router.transfer_method(0, 1)
    finally:
        relay.destroy()
        if "floor" in locals():
            floor.destroy()
        router.detach()
        rt.destroy()
    ratios = [k / r for k, r in zip(t_k2k, t_batch)]
    to_floor = [k / f for k, f in zip(t_k2k, t_floor)]
    return {"message_bytes": 256, "hops": hops, "method": method, "rounds": rounds,
            "k2k_one_way_us": min(t_k2k) * 1e6,
            "floor_us": min(t_floor) * 1e6,
            "floor_us_rounds": [t * 1e6 for t in t_floor],
            "floor_transfer_us": floor.transfer_us, "floor_submit_us": floor.submit_us,
            "ratio_k2k_to_floor": statistics.median(to_floor),
            "ratio_k2k_to_floor_range": [min(to_floor), max(to_floor)],
            "host_us_per_step": statistics.median(host_per_step) * 1e6,
            "host_cpu_us_per_step": statistics.median(cpu_per_step) * 1e6,
            "host_relay_one_way_us": t_hand * 1e6,
            "batch_relay_one_way_us": min(t_batch) * 1e6,
            "k2k_one_way_us_rounds": [t * 1e6 for t in t_k2k],
            "batch_relay_one_way_us_rounds": [t * 1e6 for t in t_batch],
            "ratio_k2k_to_host_relay": min(t_k2k) / t_hand,
            "ratio_k2k_to_batch_relay": statistics.median(ratios),
            "ratio_k2k_to_batch_relay_range": [min(ratios), max(ratios)]}


class Floor:
    """What one hop needs of the hardware: a raw 256-byte CrossDeviceTransfer from
    GPU 0 to GPU 1 by the router's method, submitted and waited for, plus a bare
    submit/fence round trip on GPU 1's step queue (the receiving step's launch)."""

    def __init__(self, mgr: Any, method: str):
        from vkmulti import Buffer, CrossDeviceTransfer
        from vkmulti.kernels.engine.device_context import step_queue
        from vkmulti.kernels.engine.gpu_jobs import GpuJobs

        self.bufs = [Buffer(mgr.slot(0), 256), Buffer(mgr.slot(1), 256)]
        self.link = CrossDeviceTransfer(mgr.slot(0), mgr.slot(1), method)
        self.jobs = GpuJobs(mgr.slot(1), step_queue(mgr.slot(1)))
        self.transfer_us = self.submit_us = float("inf")

    def run(self, n: int) -> float:
        """The floor of one hop (s): the medians of `n` transfers and `n` bare submits."""
        xfer, sub = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            self.link.submit(src_buffer=self.bufs[0], dst_buffer=self.bufs[1]).wait(30)
            t1 = time.perf_counter()
            self.jobs.wait(self.jobs.submit(lambda cmd: None), 30)
            t2 = time.perf_counter()
            xfer.append(t1 - t0)
            sub.append(t2 - t1)
        x, s = statistics.median(xfer), statistics.median(sub)
        self.transfer_us, self.submit_us = min(self.transfer_us, x * 1e6), min(self.submit_us, s * 1e6)
        return x + s

    def destroy(self) -> None:
        self.jobs.destroy(30)
        self.link.destroy(30)
        for buf in self.bufs:
            buf.destroy()


class BatchRelay:
    """The K2K hop done by hand through the host: after each step the host reads the
    sender's outbox batch back (device -> host copy), writes it into a buffer on the
    other device (host -> device copy) and hands it to that device's kernels. A
    runtime of its own (a no-op step listener stands in for the router)."""

    def __init__(self, mgr: Any):
        from vkmulti import Buffer
        from vkmulti.kernels import KernelRuntime, MultiGpuCoordinator, pingpong_kernel

        self.rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr), mgr, payload_size=256, max_kernels=16)
        self.rt.add_step_listener(lambda batches: None, retain=False)   # the host is the router here
        self.landings: list[list[Any]] = [[Buffer(mgr.slot(d), 64 * KIB) for _ in range(4)] for d in range(2)]
        self.a = self.rt.launch(pingpong_kernel(), "ping", device=0)
        self.b = self.rt.launch(pingpong_kernel(), "pong", device=1, params=[self.a.address])
        self.a.set_params(self.b.address)
        self.payload = np.zeros(64, np.uint32)

    def run(self, n: int) -> float:
        rt = self.rt
        self.payload[0] = n
        rt.synchronize()
        pending: list[Any] = []
        t0 = time.perf_counter()
        rt.send(self.a, self.payload)
        k, other = self.a, self.b
        for i in range(n):
            ticket = rt.step(k)
            ticket.wait(30)
            batch = next(x for x in ticket.batches if x.kernel is k)
            data = batch.buffer.download(batch.size, batch.offset)      # read back
            landing = self.landings[other.device_index][i % 4]
            while pending and len(pending) >= 3:                        # reuse a landing once taken
                pending.pop(0).wait(30)
            landing.upload(data)                                        # write to the other device
            pending.append(rt.accept_batch(other.device_index, landing, size=batch.size))
            k, other = other, k
        rt.step(k)
        rt.receive(k, timeout=30)
        return time.perf_counter() - t0

    def destroy(self) -> None:
        self.rt.destroy()
        for per_device in self.landings:
            for buf in per_device:
                buf.destroy()


# -- (b) bandwidth -------------------------------------------------------------------------

def batch_shape(size: int) -> tuple[int, int]:
    """(payload bytes, messages) of a batch of about `size` bytes: payloads up to 64 KiB, >= 16 messages."""
    payload = max(256, min(64 * KIB, (size // 16) // 16 * 16 - 48))
    messages = max(1, (size - 64) // (48 + payload))
    return payload, messages


def k2k_bandwidth(mgr: Any, size: int, reps: int, method: str | None, rounds: int,
                  fresh: bool) -> dict[str, Any]:
    from vkmulti import CrossDeviceTransfer, pair_methods
    from vkmulti.errors import VkmError
    from vkmulti import Buffer
    from vkmulti.kernels.engine import step_recorder
    from vkmulti.kernels.reference import burst_kernel, read_burst

    payload, n = batch_shape(size)
    rt, router = _runtime(mgr, payload, method)
    links: dict[str, Any] = {}
    bufs: list[Any] = []
    in_place = [0]
    choose = step_recorder.StepRecorder._readable_in_place

    def counting(self: Any, *args: Any) -> bool:
        ok = choose(self, *args)
        in_place[0] += ok
        return ok
    step_recorder.StepRecorder._readable_in_place = counting   # (put back below)
    try:
        spec = burst_kernel(n, groups=min(n, 16))
        sink = rt.launch(spec, "sink", device=1)
        mode = (0, 0) if fresh else (1, rt.in_flight)   # restamp from the step every region was written in
        src = rt.launch(spec, "burst", device=0, params=[sink.address, n, *mode])
        batch = src.outbox_region

        host = [0.0]
        calls: list[float] = []   # each step call's time (a stall of the machine shows as a long one)

        def run(steps: int) -> float:
            rt.synchronize()
            before = read_burst(rt.read_state(sink)).received
            t0 = time.perf_counter()
            for _ in range(steps):
                h = time.perf_counter()
                rt.step([src, sink])
                calls.append(time.perf_counter() - h)
                host[0] += calls[-1]
            src.set_params(sink.address, 0)      # one more step delivers the last batch
            rt.step([src, sink])
            rt.synchronize()
            dt = time.perf_counter() - t0
            src.set_params(sink.address, n, *mode)
            got = read_burst(rt.read_state(sink)).received - before
            if got != steps * n:
                raise RuntimeError(f"{got} of {steps * n} messages arrived")
            return dt
        run(rt.in_flight + 1)                    # warm: every outbox region written once, imports made
        m = router.transfer_method(0, 1)
        a, b = Buffer(mgr.slot(0), batch), Buffer(mgr.slot(1), batch)
        bufs += [a, b]
        # the raw baseline: every method the pair supports (or the forced one), the best per round
        for name in [method] if method else pair_methods(mgr.slot(0), mgr.slot(1)):
            try:
                x = CrossDeviceTransfer(mgr.slot(0), mgr.slot(1), name)
            except VkmError:
                continue
            links[name] = x
            x.submit(src_buffer=a, dst_buffer=b).wait(120)

        def copies(x: Any, count: int) -> float:
            t0 = time.perf_counter()
            tickets = [x.submit(src_buffer=a, dst_buffer=b) for _ in range(count)]
            tickets[-1].wait(300)
            return time.perf_counter() - t0
        k2k, base, best, per_method = [], [], [], {name: [] for name in links}
        host[0], in_place[0] = 0.0, 0
        calls.clear()
        for _ in range(rounds):                  # paired: K2K, then the raw copies of every method
            k2k.append(batch * reps / run(reps) / 1e9)
            for name, x in links.items():
                per_method[name].append(batch * reps / copies(x, reps) / 1e9)
            top = max(links, key=lambda name: per_method[name][-1])
            base.append(per_method[top][-1])
            best.append(top)
        st = read_burst(rt.read_state(sink))
        ratios = [k / r for k, r in zip(k2k, base)]
        return {"batch_bytes": batch, "payload": payload, "messages": n, "steps": reps, "rounds": rounds,
                "method": m, "sender": "fresh payloads" if fresh else "restamped payloads",
                "read_in_place": step_recorder.READ_IN_PLACE, "batches_read_in_place": in_place[0],
                "batches": rounds * (reps + 1), "host_ms_per_step": host[0] / (rounds * reps) * 1e3,
                "step_call_ms_median": statistics.median(calls) * 1e3, "step_call_ms_max": max(calls) * 1e3,
                "k2k_gbps": max(k2k), "raw_gbps": max(base), "k2k_gbps_rounds": k2k, "raw_gbps_rounds": base,
                "raw_method_rounds": best, "raw_gbps_by_method": per_method,
                "ratio_k2k_to_raw": statistics.median(ratios), "ratio_k2k_to_raw_range": [min(ratios), max(ratios)],
                "bad_messages": st.bad}
    finally:
        step_recorder.StepRecorder._readable_in_place = choose
        for x in links.values():
            x.destroy(120)
        for buf in bufs:
            buf.destroy()
        router.detach()
        rt.destroy()


def bandwidth(mgr: Any, top: int, method: str | None, rounds: int, fresh: bool) -> list[dict[str, Any]]:
    out = []
    for size in sizes_up_to(top):
        reps = 64   # batches per run, each side: the steady state, past the first and last batch
        out.append(k2k_bandwidth(mgr, size, reps, method, rounds, fresh))
    return out


# -- (c) run(steps=N) ---------------------------------------------------------------------------

def run_steps(mgr: Any, steps: int, rounds: int) -> dict[str, Any]:
    from vkmulti.kernels import CrossGpuK2KRouter, KernelRuntime, MultiGpuCoordinator, counter_kernel
    from vkmulti.kernels.engine import stepper
    from vkmulti.kernels.reference import counter_initial_state
    from vkmulti.kernels.runtime import stepping

    rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr), mgr, max_kernels=64)
    out: dict[str, Any] = {"steps": steps, "rounds": rounds}
    try:
        spec = counter_kernel(max_sources=64)
        ks = [rt.launch(spec, device=i, state=[counter_initial_state(64)]) for i in range(2)]

        default = stepper.RUN_NAPS

        def timed(kernels: list[Any], native: bool, naps: bool) -> tuple[float, float]:
            stepping.QUIET_RUNS, stepper.RUN_NAPS = native, naps
            try:
                rt.run(rt.in_flight + 1, kernels).wait(60)
                cpu, wall = time.thread_time(), time.perf_counter()
                ticket = rt.run(steps, kernels)
                cpu = time.thread_time() - cpu
                ticket.wait(60)
                return cpu / steps * 1e6, (time.perf_counter() - wall) / steps * 1e6
            finally:
                stepping.QUIET_RUNS, stepper.RUN_NAPS = True, default
        for name, kernels in (("one", ks[:1]), ("two", ks), ("two_router", ks)):
            router = CrossGpuK2KRouter(rt.coordinator, rt) if name == "two_router" else None
            native, other, python = [], [], []   # (the library's default waits, the other waits, step by step)
            for _ in range(rounds):
                native.append(timed(kernels, True, default))
                other.append(timed(kernels, True, not default))
                python.append(timed(kernels, False, default))
            cpu_n, cpu_p = [c for c, _ in native], [c for c, _ in python]
            naps, blocking = (native, other) if default else (other, native)
            out[name] = {
                "host_cpu_us_per_step": statistics.median(cpu_n),
                "host_cpu_us_per_step_step_by_step": statistics.median(cpu_p),
                "wall_us_per_step": statistics.median(w for _, w in native),
                "wall_us_per_step_step_by_step": statistics.median(w for _, w in python),
                "waits": "naps" if default else "blocking",
                "host_cpu_us_per_step_naps": statistics.median(c for c, _ in naps),
                "host_cpu_us_per_step_blocking_waits": statistics.median(c for c, _ in blocking),
                "wall_us_per_step_naps": statistics.median(w for _, w in naps),
                "wall_us_per_step_blocking_waits": statistics.median(w for _, w in blocking),
                "ratio_naps_to_blocking_waits": statistics.median(a / b for (a, _), (b, _) in zip(naps, blocking)),
                "ratio_native_to_step_by_step": statistics.median(a / b for a, b in zip(cpu_n, cpu_p)),
                "host_cpu_us_range": [min(cpu_n), max(cpu_n)]}
            if router is not None:
                router.detach()
    finally:
        rt.destroy()
    return out


# -- (d) stencil ------------------------------------------------------------------------------

def stencil(mgr: Any, width: int, height: int, steps: int) -> dict[str, Any]:
    from vkmulti.kernels.stencil import run_stencil
    from vkmulti.apps.stencil_demo import initial_field

    field, top, bottom = initial_field(width, height)
    one = run_stencil(mgr, field, steps, [0], top=top, bottom=bottom)
    two = run_stencil(mgr, field, steps, [0, 1], top=top, bottom=bottom)
    return {"size": [width, height], "steps": steps, "step_ms_1": one.step_ms, "step_ms_2": two.step_ms,
            "host_us_per_step_2": two.host_seconds / steps * 1e6, "host_share_2": two.host_share,
            "speedup": one.step_ms / two.step_ms, "identical": bool(np.array_equal(one.field, two.field)),
            "halo_bytes_per_step": {f"{a}->{b}": e["bytes"] / steps for (a, b), e in two.edges.items()}}


def main(argv: list[str] | None = None) -> int:
    from vkmulti import MultiDeviceManager
    from vkmulti.apps.cli_args import Parser, add_output_argument, add_virtual_argument, print_figures
    from vkmulti.apps.demo import parse_size
    from vkmulti.apps.progress import progress

    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--section", choices=["all", "latency", "bandwidth", "run", "stencil"], default="all")
    p.add_argument("--hops", type=int, default=100, help="one-way hops per latency run (default 100)")
    p.add_argument("--rounds", type=int, default=5, help="paired runs of K2K and its baseline (default 5)")
    p.add_argument("--run-steps", type=int, default=2000, help="steps of each run() timed (default 2000)")
    p.add_argument("--fresh-payloads", action="store_true",
                   help="the bandwidth sender rewrites every payload word at every step")
    p.add_argument("--no-in-place", action="store_true",
                   help="the receiving step copies every batch into the inbox (no in-place reading)")
    p.add_argument("--max", type=parse_bytes, default=16 * MIB, help="largest batch (default 16M)")
    p.add_argument("--method", default=None, help="force the transfer method (e.g. host_shared, cuda_peer)")
    p.add_argument("--stencil", type=parse_size, default=None, metavar="WxH",
                   help="stencil grid (default the demo's 512x384 on CPU devices, 23000x23000 on GPUs)")
    p.add_argument("--stencil-steps", type=int, default=None)
    p.add_argument("--timeline-naps", action="store_true",
                   help="every wait for a step reads the timeline between naps instead of the driver's blocking "
                        "wait (set_timeline_naps; the run section compares both for its native runs anyway)")
    add_virtual_argument(p)
    add_output_argument(p, "--json", image=False, default=None, metavar="FILE", help="also write the figures here")
    args = p.parse_args(argv)
    if args.hops < 2:
        p.error("--hops must be >= 2")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.run_steps < 1:
        p.error("--run-steps must be >= 1")
    from vkmulti import TransferMethod
    if args.method is not None and args.method not in TransferMethod.CROSS_DEVICE:
        p.error(f"--method must be one of {', '.join(TransferMethod.CROSS_DEVICE)}")
    note = use_virtual_if_no_gpu(args.virtual)
    if args.no_in_place:
        from vkmulti.kernels.engine import step_recorder
        step_recorder.READ_IN_PLACE = False
    if args.timeline_naps:
        from vkmulti._core import _native
        _native.set_timeline_naps(True)
    mgr = MultiDeviceManager.create(enabled=True)
    res: dict[str, Any] = {"note": note, "devices": [s.name for s in mgr.slots]}
    try:
        if mgr.device_count < 2:
            print("bench/k2k.py needs two devices", file=sys.stderr)
            return 2
        cpu = any(s.capabilities is not None and s.capabilities.device_type == "cpu" for s in mgr.slots)
        sections = [s for s in ("latency", "bandwidth", "run", "stencil") if args.section in ("all", s)]
        with progress(len(sections), "bench k2k", quiet=args.json is not None) as bar:
            if "latency" in sections:
                res["latency"] = latency(mgr, args.hops, args.method, args.rounds)
                bar()
            if "bandwidth" in sections:
                res["bandwidth"] = bandwidth(mgr, args.max, args.method, args.rounds, args.fresh_payloads)
                bar()
            if "run" in sections:
                res["run"] = run_steps(mgr, args.run_steps, args.rounds)
                bar()
            if "stencil" in sections:
                w, h = args.stencil or (LIGHT_SIZE if cpu else (23000, 23000))
                res["stencil"] = stencil(mgr, w, h, args.stencil_steps or (LIGHT_STEPS if cpu else 100))
                bar()
    finally:
        mgr.destroy()
    print_figures(res, args.json)
    parts = []
    if "latency" in res:
        lat = res["latency"]
        lo, hi = lat["ratio_k2k_to_batch_relay_range"]
        flo, fhi = lat["ratio_k2k_to_floor_range"]
        parts.append(f"K2K one-way latency {lat['k2k_one_way_us']:.0f} us = {lat['ratio_k2k_to_floor']:.2f}x the "
                     f"hardware floor ({lat['floor_us']:.0f} us: raw 256-byte transfer {lat['floor_transfer_us']:.0f} "
                     f"+ bare submit {lat['floor_submit_us']:.0f}; {flo:.2f}-{fhi:.2f}; goal <= 1.5), host "
                     f"{lat['host_us_per_step']:.0f} us per step of two kernels on two devices (goal <= 100; "
                     f"its own CPU {lat['host_cpu_us_per_step']:.0f} us)")
        parts.append(f"K2K one-way latency = {lat['ratio_k2k_to_batch_relay']:.2f}x the batch relayed by hand "
                     f"through the host (median of {lat['rounds']} paired runs, {lo:.2f}-{hi:.2f}; goal <= 0.5), "
                     f"{lat['ratio_k2k_to_host_relay']:.2f}x the host queues relay")
    if res.get("bandwidth"):
        top = res["bandwidth"][-1]
        lo, hi = top["ratio_k2k_to_raw_range"]
        parts.append(f"{top['batch_bytes'] / MIB:.0f} MiB batches = {top['ratio_k2k_to_raw']:.2f}x the pair's best raw "
                     f"transfer ({'/'.join(sorted(set(top['raw_method_rounds'])))}; median of {top['rounds']} "
                     f"paired runs, {lo:.2f}-{hi:.2f}; best {top['k2k_gbps']:.2f} vs {top['raw_gbps']:.2f} GB/s; "
                     f"goal >= 0.9)")
    if "run" in res:
        for name, what in (("one", "one idle kernel"), ("two", "two idle kernels on two devices"),
                           ("two_router", "the same with the K2K router attached")):
            r = res["run"][name]
            parts.append(f"run(steps={res['run']['steps']}) of {what}: host CPU {r['host_cpu_us_per_step']:.1f} us "
                         f"per step (goal <= 30) = {r['ratio_native_to_step_by_step']:.2f}x step by step "
                         f"({r['host_cpu_us_per_step_step_by_step']:.1f} us), wall {r['wall_us_per_step']:.0f} us "
                         f"({r['waits']} waits); waits by naps {r['host_cpu_us_per_step_naps']:.1f} us "
                         f"(wall {r['wall_us_per_step_naps']:.0f}) = {r['ratio_naps_to_blocking_waits']:.2f}x the "
                         f"CPU of blocking waits ({r['host_cpu_us_per_step_blocking_waits']:.1f} us, wall "
                         f"{r['wall_us_per_step_blocking_waits']:.0f})")
    if "stencil" in res:
        st = res["stencil"]
        parts.append(f"stencil 2-device speed-up = {st['speedup']:.2f}x, host {st['host_us_per_step_2']:.0f} us per "
                     f"step = {100 * st['host_share_2']:.1f}% of the step time (goal <= 10%)")
    print("ratio: " + "; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
