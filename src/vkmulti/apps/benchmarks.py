"""Transfer benchmark: every method against the seed's serial algorithm, same run.

Used by `bench/transfer.py` and `python -m vkmulti bench transfer`. Prints
figures as JSON and ends with a ratio line; optionally draws a PNG bar chart.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np
import vulkan as vk

from .._core import vkapi
from ..device.manager import MultiDeviceManager
from ..device.virtual import use_virtual_if_no_gpu
from ..memory.buffer import Buffer
from ..memory.image import Image
from ..transfer.cross_device import CrossDeviceTransfer
from ..transfer.link import DEFAULT_SLOT_COUNT, DEFAULT_SLOT_SIZE, check_ring_shape
from ..transfer.methods import TransferMethod, pair_methods
from .charts import bar_chart
from .cli_args import Parser, add_output_argument, add_virtual_argument, print_figures
from .progress import progress

_ffi = vk.ffi
IMAGE_SIZES = ((256, 256), (1920, 1080), (3840, 2160))
BUFFER_BYTES = 256 << 20
#: --small: the latency of small transfers (a 256x256 RGBA16F image, 512 KiB,
#: and a 64 KiB buffer), many transfers timed one at a time, where the per-
#: transfer host work (Python, the link's worker, wake-ups) is most of the time.
SMALL_SIZES = ((256, 256),)
SMALL_BUFFER_BYTES = 64 << 10
SMALL_REPS = 1000
RGBA16F = vk.VK_FORMAT_R16G16B16A16_SFLOAT


def median_time(fn: Callable[[], None], reps: int, warmup: int = 2) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


class SeedStagingCopy:
    """The seed's algorithm, as it ran: copy into a host-visible buffer, vkQueueWaitIdle,
    map both buffers and memmove on the CPU, copy out, vkQueueWaitIdle. Serial."""

    def __init__(self, src_slot: Any, dst_slot: Any, nbytes: int):
        self.src, self.dst, self.nbytes = src_slot, dst_slot, nbytes
        self.src_buf = Buffer(src_slot, nbytes, usage=vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, host_visible=True)
        self.dst_buf = Buffer(dst_slot, nbytes, usage=vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT, host_visible=True)
        self.pools = {}
        for slot in (src_slot, dst_slot):
            self.pools[slot.index] = vkapi.vkCreateCommandPool(slot.device, vk.VkCommandPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, queueFamilyIndex=slot.graphics_queue.family),
                None)

    def _one_shot(self, slot: Any, record: Callable[[Any], None]) -> None:
        pool = self.pools[slot.index]
        cmd = vkapi.vkAllocateCommandBuffers(slot.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vkapi.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        record(cmd)
        vkapi.vkEndCommandBuffer(cmd)
        q = slot.graphics_queue
        vkapi.queue_submit(slot.native, q, [vk.VkSubmitInfo(sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                                             commandBufferCount=1, pCommandBuffers=[cmd])])
        with q.lock:
            vkapi.vkQueueWaitIdle(q.handle)
        vk.vkFreeCommandBuffers(slot.device, pool, 1, [cmd])

    def _memmove(self) -> None:
        s = vkapi.vkMapMemory(self.src.device, self.src_buf.memory, 0, self.nbytes, 0)
        d = vkapi.vkMapMemory(self.dst.device, self.dst_buf.memory, 0, self.nbytes, 0)
        _ffi.memmove(d, s, self.nbytes)
        vk.vkUnmapMemory(self.src.device, self.src_buf.memory)
        vk.vkUnmapMemory(self.dst.device, self.dst_buf.memory)

    def run_image(self, a: Image, b: Image) -> None:
        region = a._region()

        def out(cmd: Any) -> None:
            a.barrier(cmd, a.layout, vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL)
            vk.vkCmdCopyImageToBuffer(cmd, a.handle, vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL, self.src_buf.handle,
                                      1, [region])
            a.barrier(cmd, vk.VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL, a.layout)

        def into(cmd: Any) -> None:
            b.barrier(cmd, b.layout, vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL)
            vk.vkCmdCopyBufferToImage(cmd, self.dst_buf.handle, b.handle, vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL,
                                      1, [region])
            b.barrier(cmd, vk.VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, b.layout)
        self._one_shot(self.src, out)
        self._memmove()
        self._one_shot(self.dst, into)

    def run_buffer(self, a: Buffer, b: Buffer) -> None:
        self._one_shot(self.src, lambda cmd: vk.vkCmdCopyBuffer(cmd, a.handle, self.src_buf.handle, 1,
                                                                [vk.VkBufferCopy(0, 0, self.nbytes)]))
        self._memmove()
        self._one_shot(self.dst, lambda cmd: vk.vkCmdCopyBuffer(cmd, self.dst_buf.handle, b.handle, 1,
                                                                [vk.VkBufferCopy(0, 0, self.nbytes)]))

    def destroy(self) -> None:
        for slot in (self.src, self.dst):
            vk.vkDestroyCommandPool(slot.device, self.pools[slot.index], None)
        self.src_buf.destroy()
        self.dst_buf.destroy()


def torch_for(src: int, dst: int) -> Any:
    """The torch module when it is installed and sees CUDA devices `src` and `dst`, else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() <= max(src, dst):
        return None
    return torch


def interleaved(fns: dict[str, Callable[[], None]], reps: int, warmup: int = 2,
                block: int | None = None) -> dict[str, list[float]]:
    """Time every function `reps` times in rounds: each round gives every
    function one untimed call, then `block` timed ones (default: about six
    rounds). A slow spell of a noisy
    machine hits every contender alike, while each is timed warm, back to back
    (right after another method's work a GPU link pays wake-up costs that the
    steady state does not)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    block = block or max(1, reps // 6)
    times: dict[str, list[float]] = {name: [] for name in fns}
    while any(len(t) < reps for t in times.values()):
        for name, fn in fns.items():
            fn()
            for _ in range(min(block, reps - len(times[name]))):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return times


def _torch_pinned(nbytes: int, src: int, dst: int) -> Callable[[], None] | None:
    """torch's copy of the same bytes cuda:src -> pinned host -> cuda:dst (None without 2 CUDA GPUs)."""
    torch = torch_for(src, dst)
    if torch is None:
        return None
    a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}")
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def once() -> None:
        host.copy_(a, non_blocking=True)
        torch.cuda.synchronize(src)
        b.copy_(host, non_blocking=True)
        torch.cuda.synchronize(dst)
    return once


def methods_for(src: Any, dst: Any) -> list[str]:
    """The methods the pair of slots supports, best first (vkmulti.pair_methods)."""
    return pair_methods(src, dst)


def bytes_label(n: int) -> str:
    """'256 MiB', '64 KiB' or '100 B': a size as the case names say it."""
    for shift, unit in ((20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def split_times(fn_submit: Callable[[], Any], reps: int) -> dict[str, float]:
    """Median seconds of submit() alone and of the ticket's wait() alone, over
    `reps` transfers made one after another (`fn_submit` queues one, returns its ticket)."""
    submit, wait = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ticket = fn_submit()
        t1 = time.perf_counter()
        ticket.wait(120)
        submit.append(t1 - t0)
        wait.append(time.perf_counter() - t1)
    return {"submit_s": statistics.median(submit), "wait_s": statistics.median(wait)}


def run_transfer_bench(manager: Any, *, src: int = 1, dst: int = 0, reps: int = 10, buffer_reps: int | None = None,
                       methods: list[str] | None = None, sizes: tuple = IMAGE_SIZES, buffer_bytes: int = BUFFER_BYTES,
                       torch: bool = True, log: Callable[[str], None] | None = None,
                       slot_size: int = DEFAULT_SLOT_SIZE, slot_count: int = DEFAULT_SLOT_COUNT,
                       advance: Callable[[int], None] | None = None, split: bool = False) -> dict[str, Any]:
    """Time each method and size end to end (submit to dst_ready), plus the seed
    baseline and torch's pinned-host copy, interleaved round by round.
    `advance(1)` is called after each case (progress). `split`: also the medians
    of submit() alone and wait() alone per method (results["split"])."""
    s, d = manager.slot(src), manager.slot(dst)
    methods = methods or methods_for(s, d)
    buffer_reps = buffer_reps or max(3, reps // 2)
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {"machine": {"src": f"GPU {src}: {s.name}", "dst": f"GPU {dst}: {d.name}"},
                               "reps": reps, "rings": {}, "cases": []}
    if split:
        results["split"] = {}
    say = log or (lambda msg: None)

    def record(case: str, nbytes: int, method: str, med: float, times: list[float]) -> None:
        results["cases"].append({"case": case, "bytes": nbytes, "method": method, "median_s": med,
                                 "min_s": min(times), "gbps": nbytes / med / 1e9})
        say(f"{case:>16} {method:>13}: {med * 1e3:9.3f} ms  {nbytes / med / 1e9:7.2f} GB/s")

    def run_case(case: str, a: Any, b: Any, expected: Any, kind: str, n: int, warmup: int) -> None:
        """Every method, the seed and torch timed round by round, moving `a` to `b`
        (images or buffers, `kind`); each method's output is checked against `expected`."""
        nbytes = expected.nbytes
        xs = [CrossDeviceTransfer(s, d, m, slot_size=slot_size, slot_count=slot_count) for m in methods]
        seed = SeedStagingCopy(s, d, nbytes)
        try:
            kw = {f"src_{kind}": a, f"dst_{kind}": b}
            fns: dict[str, Callable[[], None]] = {
                m: (lambda x=x: x.submit(**kw).wait(120)) for m, x in zip(methods, xs)}  # type: ignore[misc]
            results["rings"].update({m: dict(zip(("slot_size", "slot_count"), x._ring()))
                                     for m, x in zip(methods, xs)})
            seed_run = getattr(seed, f"run_{kind}")
            fns["seed_baseline"] = lambda: seed_run(a, b)
            t = _torch_pinned(nbytes, src, dst) if torch else None
            if t is not None:
                fns["torch_pinned"] = t
            for m, fn in fns.items():   # each method alone once: its output is checked
                fn()
                if m in methods:
                    if not np.array_equal(b.download(), expected):
                        raise AssertionError(f"{m} produced wrong bytes for {case}")
                    b.upload(np.zeros_like(expected))
            for m, times in interleaved(fns, n, warmup).items():
                record(case, nbytes, m, statistics.median(times), times)
            if split:
                for m, x in zip(methods, xs):
                    sp = results["split"].setdefault(case, {})[m] = split_times(lambda x=x: x.submit(**kw),  # type: ignore[misc]
                                                                               max(1, n // 4))
                    say(f"{case:>16} {m:>13}: submit {sp['submit_s'] * 1e6:7.1f} us, wait {sp['wait_s'] * 1e6:7.1f} us")
            if advance is not None:
                advance(1)
        finally:
            seed.destroy()
            for x in xs:
                x.destroy()

    for w, h in sizes:
        a, b = Image(s, w, h, RGBA16F), Image(d, w, h, RGBA16F)
        try:
            px = rng.integers(0, 256, (h, w, 8), dtype=np.uint8)
            a.upload(px)
            run_case(f"image {w}x{h}", a, b, px, "image", reps, 2)
        finally:
            a.destroy()
            b.destroy()

    if buffer_bytes:
        a, b = Buffer(s, buffer_bytes), Buffer(d, buffer_bytes)  # type: ignore[assignment]
        try:
            data = rng.integers(0, 256, buffer_bytes, dtype=np.uint8)
            a.upload(data)
            run_case(f"buffer {bytes_label(buffer_bytes)}", a, b, data, "buffer", buffer_reps, 1)
        finally:
            a.destroy()
            b.destroy()
    results["ratios"] = ratios(results)
    return results


def ratios(results: dict[str, Any]) -> dict[str, float]:
    """Throughput of each method over the seed baseline (and torch) per case."""
    by: dict[str, dict[str, float]] = {}
    for c in results["cases"]:
        by.setdefault(c["case"], {})[c["method"]] = c["gbps"]
    out = {}
    for case, ms in by.items():
        for m, g in ms.items():
            if m in ("seed_baseline", "torch_pinned"):
                continue
            if "seed_baseline" in ms:
                out[f"{case}: {m}/seed"] = g / ms["seed_baseline"]
            if "torch_pinned" in ms:
                out[f"{case}: {m}/torch_pinned"] = g / ms["torch_pinned"]
    return out


def ratio_line(results: dict[str, Any]) -> str:
    """The ratios of the largest image case and of the buffer case."""
    r = results["ratios"]
    images = [c for c in results["cases"] if c["case"].startswith("image ")]
    top = max(images, key=lambda c: c["bytes"])["case"] + ":" if images else "buffer"
    keys = [k for k in r if k.startswith((top, "buffer"))]
    return "ratio: " + ", ".join(f"{k} = {r[k]:.2f}x" for k in keys)


def plot(results: dict[str, Any], path: str) -> str:
    """A grouped bar chart of GB/s by case and method (vkmulti.charts: matplotlib,
    else Pillow); the title names the two devices. Returns the library used."""
    cases = list(dict.fromkeys(c["case"] for c in results["cases"]))
    methods = list(dict.fromkeys(c["method"] for c in results["cases"]))
    gb = {(c["case"], c["method"]): c["gbps"] for c in results["cases"]}
    machine = f"{results['machine']['src']} -> {results['machine']['dst']}"
    return bar_chart(cases, methods, gb, title="vkmulti transfer bandwidth by method", ylabel="GB/s (median)",
                     xlabel="what moves (image: RGBA16F)", path=path, machine=machine)


def main(argv: list[str] | None = None) -> int:
    """`vkmulti bench transfer [options]`: run the bench and print its figures; the exit status."""
    p = Parser(prog="vkmulti bench transfer", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", type=int, default=1, metavar="I",
                   help="device the bytes move from (an index as `vkmulti info` lists them; default 1)")
    p.add_argument("--dst", type=int, default=0, metavar="J",
                   help="device the bytes move to (default 0, the primary)")
    p.add_argument("--reps", type=int, default=None,
                   help=f"rounds per case (default 10; 5 with --quick; {SMALL_REPS} with --small)")
    p.add_argument("--quick", action="store_true", help="4K image and a 64 MiB buffer only, 5 reps")
    p.add_argument("--small", action="store_true",
                   help=f"small transfers only: a 256x256 image and a {bytes_label(SMALL_BUFFER_BYTES)} buffer, "
                        f"{SMALL_REPS} reps, each timed alone, plus submit() and wait() timed apart "
                        f"(the per-transfer host cost)")
    p.add_argument("--no-torch", action="store_true",
                   help="leave out torch's pinned-host CUDA copy, the second baseline (timed only when torch is "
                        "installed and sees both devices as CUDA GPUs)")
    p.add_argument("--slot-size", type=int, default=DEFAULT_SLOT_SIZE >> 20, metavar="MiB",
                   help="ring slot size in MiB (default %(default)s)")
    p.add_argument("--slot-count", type=int, default=DEFAULT_SLOT_COUNT, metavar="N",
                   help="ring depth: slots of the pipelined methods' rings, so chunks in flight at once "
                        "(default %(default)s)")
    p.add_argument("--methods", help="comma-separated methods to time (default: all the pair supports)")
    add_output_argument(p, "--plot", image=True, metavar="PNG", help="write a bar chart of GB/s by method and size")
    add_output_argument(p, "--json", image=False, metavar="FILE", help="also write the figures to FILE")
    p.add_argument("--quiet", action="store_true", help="no progress bar (also off when stderr is no terminal)")
    add_virtual_argument(p)
    args = p.parse_args(argv)
    if args.quick and args.small:
        p.error("--quick and --small are different case sets: pick one")
    if args.reps is None:
        args.reps = SMALL_REPS if args.small else 5 if args.quick else 10
    for flag, value in (("--reps", args.reps), ("--slot-size", args.slot_size), ("--slot-count", args.slot_count)):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    try:   # (the ring's limits, before any GPU work)
        check_ring_shape(args.slot_size << 20, args.slot_count)
    except ValueError as exc:
        p.error(f"--slot-size {args.slot_size} MiB x --slot-count {args.slot_count}: {exc}")

    note = use_virtual_if_no_gpu(args.virtual)
    if note:
        print(f"note: {note}", file=sys.stderr)
    with MultiDeviceManager.create(enabled=True, validation=False) as mgr:
        if mgr.device_count < 2:
            print("bench transfer needs two devices (try --virtual 2)", file=sys.stderr)
            return 2
        for i in (args.src, args.dst):
            if not 0 <= i < mgr.device_count:
                p.error(f"device index {i} out of range: {mgr.device_count} devices")
        kw: dict[str, Any] = {}
        if args.quick:
            kw = {"sizes": ((3840, 2160),), "buffer_bytes": 64 << 20}
        if args.small:
            kw = {"sizes": SMALL_SIZES, "buffer_bytes": SMALL_BUFFER_BYTES, "buffer_reps": args.reps, "split": True}
        if args.methods:
            kw["methods"] = [m.strip() for m in args.methods.split(",")]
            supported = pair_methods(mgr.slot(args.src), mgr.slot(args.dst))
            for m in kw["methods"]:
                if m not in TransferMethod.CROSS_DEVICE:
                    p.error(f"unknown method {m!r}; choose from {', '.join(TransferMethod.CROSS_DEVICE)}")
                if m not in supported:
                    p.error(f"method {m!r} does not work from GPU {args.src} to GPU {args.dst}; that pair "
                            f"supports {', '.join(supported)}")
        if args.src == args.dst:
            p.error(f"--src and --dst are both {args.src}: a transfer needs two devices")
        cases = len(kw.get("sizes", IMAGE_SIZES)) + 1
        with progress(cases, "bench transfer", quiet=args.quiet or bool(args.json)) as bar:
            res = run_transfer_bench(mgr, src=args.src, dst=args.dst, reps=args.reps,
                                     torch=not args.no_torch, log=bar.say,
                                     slot_size=args.slot_size << 20, slot_count=args.slot_count,
                                     advance=bar, **kw)
        if note:
            res["note"] = note
    print_figures(res, args.json)
    if args.plot:
        plot(res, args.plot)
    print(ratio_line(res))
    return 0
