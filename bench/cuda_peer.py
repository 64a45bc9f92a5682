"""CUDA_PEER bench on two NVLink GPUs, same run: 256 MiB GPU0 -> GPU1, a 4K RGBA16F image
end to end (submit until dst_ready is reached, Vulkan sync included), torch's
cuda:0 -> cuda:1 copy of the same bytes, and vkmulti's HOST_SHARED path.
Prints the figures as JSON, then a final "ratio:" line.

    python bench/cuda_peer.py [--src 0] [--dst 1] [--reps 30] [--slot-mib 16] [--slots 8]
                              [--sweep] [--no-torch] [--json FILE]

Targets (issue 6): 256 MiB >= 300 GB/s; 4K image <= 0.3 ms median; >= 0.8x torch's
peer copy; >= 6x HOST_SHARED.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import numpy as np
import vulkan as vk

from vkmulti.apps.benchmarks import median_time, torch_for
from vkmulti.apps.cli_args import Parser, add_output_argument, print_figures
from vkmulti.apps.progress import progress

BUFFER_BYTES = 256 << 20
W4K, H4K = 3840, 2160
RGBA16F = vk.VK_FORMAT_R16G16B16A16_SFLOAT


def timed(fn: Callable[[], None], reps: int, warmup: int = 3) -> dict[str, float]:
    median, t = median_time(fn, reps, warmup)
    t = sorted(t)
    return {"median_s": median, "min_s": t[0], "p90_s": t[min(len(t) - 1, int(len(t) * 0.9))]}


class DirectLink:
    """A native link driven directly, with what CrossDeviceTransfer keeps to
    itself (ring shape, the CUDA bounce ring, a trace file); endpoints are
    built exactly as CrossDeviceTransfer builds them."""

    def __init__(self, s: Any, d: Any, slot_size: int, slot_count: int, bounce: bool = False,
                 ring: int | None = None, queue: str = "copy", trace: str | None = None):
        """ring None: a CUDA_PEER link on universal-family queues (`bounce`: its
        bounce ring); else a link of that _native.RING_* kind, on each slot's copy
        queue (queue "copy") or universal copy queue ("universal")."""
        from vkmulti._core import _native
        from vkmulti.transfer import CrossDeviceTransfer, TransferMethod
        from vkmulti.transfer.link import SPIN_SECONDS

        self.s, self.d = s, d
        self.x = CrossDeviceTransfer(s, d, TransferMethod.STAGING_COPY)
        if ring is not None:
            if queue not in ("copy", "universal"):
                raise ValueError(f"queue must be 'copy' or 'universal', got {queue!r}")
            sq, dq = ((s.copy_queue, d.copy_queue) if queue == "copy"
                      else (s.universal_copy_queue, d.universal_copy_queue))
            self.link = _native.Link(s.native, sq.lock, d.native, dq.lock, ring, slot_size, slot_count,
                                     spin=SPIN_SECONDS, trace=trace)
            return

        def universal(slot: Any) -> Any:   # fast device-local copies: a universal-family queue
            q = slot.dedicated_copy_queue
            return (q if q is not None and q.family == slot.graphics_queue.family else slot.graphics_queue).lock
        self.link = _native.Link(s.native, universal(s), d.native, universal(d), _native.RING_CUDA_PEER, slot_size,
                                 slot_count, spin=SPIN_SECONDS, trace=trace,
                                 tuning=_native._LinkTuning(cuda_bounce_ring=bounce))

    def submit(self, *, src_image: Any = None, dst_image: Any = None, src_buffer: Any = None,
               dst_buffer: Any = None) -> Any:
        if src_image is not None:
            es, n = self.x._image_endpoint(src_image, self.s, "src_image", None, None, None)
            ed, _ = self.x._image_endpoint(dst_image, self.d, "dst_image", None, None, None)
        else:
            n = src_buffer.size
            es = self.x._buffer_endpoint(src_buffer, self.s, "src_buffer", 0, None)
            ed = self.x._buffer_endpoint(dst_buffer, self.d, "dst_buffer", 0, None)
        t, _, dready = self.link.submit(es, ed, n)
        link = self.link

        class Ticket:
            def wait(self, timeout: float | None = None) -> None:
                link.wait(t, dready, timeout)
        return Ticket()

    def run(self, **kw: Any) -> None:
        timeout = kw.pop("timeout", None)
        self.submit(**kw).wait(timeout)

    @property
    def native_link(self) -> Any:
        return self.link

    def destroy(self) -> None:
        self.link.destroy()
        self.x.destroy()


def torch_peer(nbytes: int, src: int, dst: int, reps: int) -> dict[str, float] | None:
    torch = torch_for(src, dst)
    if torch is None:
        return None
    a = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=f"cuda:{src}")
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")

    def once() -> None:
        b.copy_(a, non_blocking=True)
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
    out = timed(once, reps)
    assert torch.equal(a.cpu(), b.cpu())
    out["peer_access"] = bool(torch.cuda.can_device_access_peer(src, dst))
    a = b = None  # free them before empty_cache (once() is not called again)
    torch.cuda.empty_cache()
    return out


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def bench_pair(mgr: Any, src: int, dst: int, reps: int, slot_size: int, slot_count: int,
               with_torch: bool, say: Callable[[str], None]) -> dict[str, Any]:
    from vkmulti import Buffer, Image
    from vkmulti import TransferMethod
    from vkmulti.transfer import method_support
    from vkmulti import CrossDeviceTransfer

    s, d = mgr.slot(src), mgr.slot(dst)
    res: dict[str, Any] = {"src": f"GPU {src}: {s.name}", "dst": f"GPU {dst}: {d.name}",
                           "slot_size": slot_size, "slot_count": slot_count, "cases": {}}
    rng = np.random.default_rng(0)
    mover = CrossDeviceTransfer(s, d, TransferMethod.CUDA_PEER, slot_size=slot_size, slot_count=slot_count)
    res["path"] = "CrossDeviceTransfer"
    try:
        # 256 MiB buffer
        a, b = Buffer(s, BUFFER_BYTES), Buffer(d, BUFFER_BYTES)
        try:
            data = rng.integers(0, 256, BUFFER_BYTES, dtype=np.uint8)
            a.upload(data)
            mover.submit(src_buffer=a, dst_buffer=b).wait(60)
            if not np.array_equal(b.download(), data):
                raise AssertionError("CUDA_PEER delivered wrong bytes (256 MiB buffer)")
            res["ring_note"] = mover._ref.link.ring_note
            t = timed(lambda: mover.submit(src_buffer=a, dst_buffer=b).wait(60), reps)
            t["gbps"] = gbps(BUFFER_BYTES, t["median_s"])
            res["cases"]["cuda_peer buffer 256 MiB"] = t
            say(f"cuda_peer   256 MiB: {t['median_s'] * 1e3:8.3f} ms  {t['gbps']:7.1f} GB/s")
            burst = 8

            def stream() -> None:
                tickets = [mover.submit(src_buffer=a, dst_buffer=b) for _ in range(burst)]
                tickets[-1].wait(120)
            t = timed(stream, max(3, reps // 4), 1)
            t["gbps"] = gbps(BUFFER_BYTES * burst, t["median_s"])
            res["cases"][f"cuda_peer buffer 256 MiB x{burst} back to back"] = t
            say(f"cuda_peer   256 MiB x{burst} back to back: {t['gbps']:7.1f} GB/s")
            if method_support(TransferMethod.HOST_SHARED, s.capabilities, d.capabilities, s.enabled_extensions,
                              d.enabled_extensions) is None:
                with CrossDeviceTransfer(s, d, TransferMethod.HOST_SHARED) as hs:
                    t = timed(lambda: hs.submit(src_buffer=a, dst_buffer=b).wait(60), max(3, reps // 4), 1)
                    if not np.array_equal(b.download(), data):
                        raise AssertionError("HOST_SHARED delivered wrong bytes")
                t["gbps"] = gbps(BUFFER_BYTES, t["median_s"])
                res["cases"]["host_shared buffer 256 MiB"] = t
                say(f"host_shared 256 MiB: {t['median_s'] * 1e3:8.3f} ms  {t['gbps']:7.1f} GB/s")
        finally:
            a.destroy()
            b.destroy()

        # a 4K RGBA16F frame, end to end
        ia, ib = Image(s, W4K, H4K, RGBA16F), Image(d, W4K, H4K, RGBA16F)
        try:
            px = rng.integers(0, 256, (H4K, W4K, 8), dtype=np.uint8)
            ia.upload(px)
            mover.run(src_image=ia, dst_image=ib, timeout=60)
            if not np.array_equal(ib.download(), px):
                raise AssertionError("CUDA_PEER delivered wrong pixels (4K image)")
            t = timed(lambda: mover.run(src_image=ia, dst_image=ib, timeout=60), reps * 3, 5)
            t["gbps"] = gbps(ia.nbytes, t["median_s"])
            res["cases"]["cuda_peer image 3840x2160 RGBA16F"] = t
            say(f"cuda_peer   4K image: {t['median_s'] * 1e3:8.3f} ms median, {t['min_s'] * 1e3:.3f} ms min")
            if "host_shared buffer 256 MiB" in res["cases"]:
                with CrossDeviceTransfer(s, d, TransferMethod.HOST_SHARED) as hs:
                    t = timed(lambda: hs.run(src_image=ia, dst_image=ib, timeout=60), reps)
                t["gbps"] = gbps(ia.nbytes, t["median_s"])
                res["cases"]["host_shared image 3840x2160 RGBA16F"] = t
                say(f"host_shared 4K image: {t['median_s'] * 1e3:8.3f} ms median")
        finally:
            ia.destroy()
            ib.destroy()
    finally:
        mover.destroy()

    if with_torch:
        for label, n in (("buffer 256 MiB", BUFFER_BYTES), ("image 3840x2160 RGBA16F", W4K * H4K * 8)):
            t = torch_peer(n, src, dst, reps)
            if t:
                t["gbps"] = gbps(n, t["median_s"])
                res["cases"][f"torch peer {label}"] = t
                say(f"torch peer  {label}: {t['median_s'] * 1e3:8.3f} ms  {t['gbps']:7.1f} GB/s")
    return res


def ratios(res: dict[str, Any]) -> dict[str, float]:
    c = res["cases"]
    out: dict[str, float] = {}
    for label in ("buffer 256 MiB", "image 3840x2160 RGBA16F"):
        ours = c.get(f"cuda_peer {label}")
        if not ours:
            continue
        for other in ("torch peer", "host_shared"):
            o = c.get(f"{other} {label}")
            if o:
                out[f"{label}: cuda_peer/{other.replace(' ', '_')}"] = ours["gbps"] / o["gbps"]
    return out


def ratio_line(res: dict[str, Any]) -> str:
    c, r = res["cases"], res["ratios"]
    parts = [f"{k} = {v:.2f}x" for k, v in r.items()]
    buf = c.get("cuda_peer buffer 256 MiB")
    img = c.get("cuda_peer image 3840x2160 RGBA16F")
    if buf:
        parts.append(f"256 MiB = {buf['gbps']:.0f} GB/s (target >= 300)")
    if img:
        parts.append(f"4K end to end = {img['median_s'] * 1e3:.3f} ms median (target <= 0.3)")
    goals = "goals: >= 0.8x torch peer, >= 6x host_shared"
    return "ratio: " + ", ".join(parts) + f"; {goals}"


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", type=int, default=0)
    p.add_argument("--dst", type=int, default=1)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--slot-mib", type=int, default=16, help="ring slot size in MiB (default 16, as CUDA_PEER's)")
    p.add_argument("--slots", type=int, default=8, help="ring depth (default 8, as CUDA_PEER's)")
    p.add_argument("--sweep", action="store_true", help="also try 4, 8 and 32 MiB slots (figures per shape)")
    p.add_argument("--no-torch", action="store_true")
    add_output_argument(p, "--json", image=False, metavar="FILE", help="also write the figures to FILE")
    args = p.parse_args(argv)
    if args.reps < 1 or args.slot_mib < 1 or args.slots < 1:
        p.error("--reps, --slot-mib and --slots must be >= 1")

    from vkmulti import MultiDeviceManager
    from vkmulti import TransferMethod
    from vkmulti.transfer import method_support

    with progress(None, "bench cuda_peer", quiet=args.json is not None) as bar, \
            MultiDeviceManager.create(enabled=True, validation=False) as mgr:
        say = lambda m: (bar.say(m), bar())  # noqa: E731
        if mgr.device_count < 2:
            print("bench cuda_peer needs two GPUs", file=sys.stderr)
            return 2
        for i in (args.src, args.dst):
            if not 0 <= i < mgr.device_count:
                p.error(f"device index {i} out of range: {mgr.device_count} devices")
        s, d = mgr.slot(args.src), mgr.slot(args.dst)
        why = method_support(TransferMethod.CUDA_PEER, s.capabilities, d.capabilities, s.enabled_extensions,
                             d.enabled_extensions)
        if why is not None:
            print(f"CUDA_PEER is not available from GPU {args.src} to GPU {args.dst}: {why}", file=sys.stderr)
            return 2
        res = bench_pair(mgr, args.src, args.dst, args.reps, args.slot_mib << 20, args.slots, not args.no_torch,
                         say)
        res["ratios"] = ratios(res)
        if args.sweep:
            res["sweep"] = []
            for mib in (4, 8, 32):
                if mib == args.slot_mib:
                    continue
                r = bench_pair(mgr, args.src, args.dst, args.reps, mib << 20, args.slots, False, say)
                res["sweep"].append({"slot_mib": mib, "cases": r["cases"]})
    print_figures(res, args.json)
    print(ratio_line(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
