"""Probe: do shader cores move bytes over PCIe faster than the copy engines?

With CuPy (CUDA) on the GPU host: pinned, mapped host memory; each hop timed
as a copy-engine memcpy and as a kernel that loads and stores 16-byte words
through the mapped pointer. Then the two hops of a host-staged GPU1 -> GPU0
copy at once (GPU1 writes buffer A while GPU0 reads buffer B), both ways, the
case HOST_SHARED's pipeline runs in. Prints JSON and a ratio line
(kernel / copy engine).

    python bench/probes/sm_pcie_probe.py [--mib 64] [--reps 20]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

KERNEL = r"""
extern "C" __global__ void copy16(const uint4* __restrict__ s, uint4* __restrict__ d, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        d[i] = s[i];
}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--blocks", type=int, nargs="*", default=[132, 264, 528, 1056])
    a = ap.parse_args(argv)
    import cupy as cp

    rt = cp.cuda.runtime
    n = a.mib << 20
    flags = rt.hostAllocPortable | rt.hostAllocMapped
    host = [rt.hostAlloc(n, flags) for _ in range(2)]   # A (GPU1 writes), B (GPU0 reads)

    def host_array(ptr: int, dev: int) -> cp.ndarray:
        mem = cp.cuda.UnownedMemory(ptr, n, None, device_id=dev)
        return cp.ndarray((n // 16, 2), dtype=cp.uint64, memptr=cp.cuda.MemoryPointer(mem, 0))

    devs, kernels, streams, dev_bufs = [0, 1], {}, {}, {}
    for dv in devs:
        with cp.cuda.Device(dv):
            kernels[dv] = cp.RawKernel(KERNEL, "copy16")
            streams[dv] = cp.cuda.Stream(non_blocking=True)
            dev_bufs[dv] = cp.zeros((n // 16, 2), dtype=cp.uint64)

    def hop(dv: int, to_host: bool, how: str, hbuf: int, blocks: int = 528) -> None:
        """Queue one hop on device dv's stream: device buffer <-> host buffer hbuf."""
        with cp.cuda.Device(dv):
            h = host_array(host[hbuf], dv)
            s, d = (dev_bufs[dv], h) if to_host else (h, dev_bufs[dv])
            if how == "ce":
                rt.memcpyAsync(d.data.ptr, s.data.ptr, n, rt.memcpyDefault, streams[dv].ptr)
            else:
                kernels[dv]((blocks,), (256,), (s, d, cp.uint64(n // 16)), stream=streams[dv])

    def timed(plan: list[tuple]) -> float:
        times = []
        for _ in range(a.reps + 2):
            for dv in devs:
                streams[dv].synchronize()
            t = time.perf_counter()
            for args in plan:
                hop(*args)
            for dv in devs:
                streams[dv].synchronize()
            times.append(time.perf_counter() - t)
        return statistics.median(times[2:])

    out: dict[str, float] = {}
    for dv in devs:
        for to_host in (True, False):
            way = "d2h" if to_host else "h2d"
            out[f"gpu{dv} {way} copy engine"] = n / timed([(dv, to_host, "ce", 0)]) / 1e9
            for b in a.blocks:
                out[f"gpu{dv} {way} kernel {b} blocks"] = n / timed([(dv, to_host, "sm", 0, b)]) / 1e9
    best = max(a.blocks, key=lambda b: out[f"gpu1 d2h kernel {b} blocks"] + out[f"gpu0 h2d kernel {b} blocks"])
    for how in ("ce", "sm"):
        t = timed([(1, True, how, 0, best), (0, False, how, 1, best)])
        out[f"both hops at once, {'copy engines' if how == 'ce' else f'kernels {best} blocks'} (GB/s each)"] = n / t / 1e9
    print(json.dumps({"mib": a.mib, "gbps": {k: round(v, 2) for k, v in out.items()}}, indent=1))
    ce = out["both hops at once, copy engines (GB/s each)"]
    sm = out[f"both hops at once, kernels {best} blocks (GB/s each)"]
    print(f"ratio: both hops at once, kernels / copy engines = {sm / ce:.3f}x; "
          f"GPU1 D2H kernel / CE = {out[f'gpu1 d2h kernel {best} blocks'] / out['gpu1 d2h copy engine']:.3f}x; "
          f"GPU0 H2D kernel / CE = {out[f'gpu0 h2d kernel {best} blocks'] / out['gpu0 h2d copy engine']:.3f}x")
    for p in host:
        rt.freeHost(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
