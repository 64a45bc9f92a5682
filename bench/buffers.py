"""InterGpuTransfer bench: broadcast of 256 MiB to every device and gather of
256 MiB per device, against serial host round trips measured in the same run.

The baseline moves the same bytes the way a careful serial program would:
one device at a time, a GPU copy into a preallocated, mapped, host-cached
staging buffer, a fence wait, a CPU copy out to host memory (download), then
the reverse into the next device (upload). Prints figures as JSON, then a line
starting with "ratio:". Uses the virtual lavapipe pair when no GPU is present.

    python bench/buffers.py [--mib 256] [--reps 5] [--virtual N] [--json FILE]
                            [--slot-size MiB] [--slot-count N] [--no-dmabuf]
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import numpy as np
import vulkan as vk

from vkmulti.apps.benchmarks import median_time
from vkmulti.apps.cli_args import Parser, add_output_argument, add_virtual_argument, print_figures
from vkmulti.apps.progress import progress
from vkmulti.testing import use_virtual_if_no_gpu


def timed(fn: Callable[[], Any], reps: int, warmup: int = 1) -> dict[str, float]:
    median, times = median_time(fn, reps, warmup)
    return {"median_s": median, "min_s": min(times)}


class SerialRoundTrip:
    """The baseline: per device a preallocated, mapped, host-cached staging buffer;
    download = GPU copy + fence wait + CPU copy out; upload = the reverse. Serial."""

    def __init__(self, manager: Any, nbytes: int):
        from vkmulti.memory import find_memory_type
        from vkmulti.device import CommandRunner

        self.n, self.staging = nbytes, {}
        for slot in manager.slots:
            dev = slot.device
            buf = vk.vkCreateBuffer(dev, vk.VkBufferCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=nbytes,
                usage=vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
            req = vk.vkGetBufferMemoryRequirements(dev, buf)
            host = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
            mem = vk.vkAllocateMemory(dev, vk.VkMemoryAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size,
                memoryTypeIndex=find_memory_type(slot, req.memoryTypeBits, host,
                                             vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT)), None)
            vk.vkBindBufferMemory(dev, buf, mem, 0)
            view = np.frombuffer(vk.vkMapMemory(dev, mem, 0, nbytes, 0), dtype=np.uint8)
            self.staging[slot.index] = (slot, buf, mem, view, CommandRunner.for_slot(slot))

    def _copy(self, index: int, src: Any, dst: Any, size: int, dst_offset: int = 0) -> None:
        runner = self.staging[index][4]
        runner.run(lambda cmd: vk.vkCmdCopyBuffer(cmd, src, dst, 1, [vk.VkBufferCopy(0, dst_offset, size)]),
                   timeout=120)

    def download(self, buf: Any, host: np.ndarray) -> None:
        slot, staging, _, view, _ = self.staging[buf.slot.index]
        self._copy(slot.index, buf.handle, staging, host.nbytes)
        np.copyto(host, view[:host.nbytes])

    def upload(self, host: np.ndarray, buf: Any, offset: int = 0) -> None:
        slot, staging, _, view, _ = self.staging[buf.slot.index]
        np.copyto(view[:host.nbytes], host)
        self._copy(slot.index, staging, buf.handle, host.nbytes, offset)

    def local(self, src: Any, dst: Any, size: int, offset: int) -> None:
        self._copy(src.slot.index, src.handle, dst.handle, size, offset)

    def destroy(self) -> None:
        for slot, buf, mem, _, _ in self.staging.values():
            vk.vkUnmapMemory(slot.device, mem)
            vk.vkDestroyBuffer(slot.device, buf, None)
            vk.vkFreeMemory(slot.device, mem, None)
        self.staging = {}


def run(manager: Any, nbytes: int, reps: int, say: Callable[[str], None], **ring: int) -> dict[str, Any]:
    from vkmulti import InterGpuTransfer
    from vkmulti import Buffer

    n_dev = manager.device_count
    data = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    res: dict[str, Any] = {"devices": [s.name for s in manager.slots], "bytes": nbytes, "reps": reps, "cases": {}}
    bufs = [Buffer(s, nbytes) for s in manager.slots]            # per device: broadcast destination
    regs = [Buffer(s, nbytes) for s in manager.slots]            # per device: registered result buffer
    host = [np.empty(nbytes, np.uint8) for _ in range(n_dev)]    # preallocated host results (both sides)
    rt = SerialRoundTrip(manager, nbytes)
    t = InterGpuTransfer(manager, **ring)
    t_ring = InterGpuTransfer(manager, host_import=False, **ring)
    try:
        res["method"] = {f"{a}->{b}": t.transfer_method(a, b) for a in range(n_dev) for b in range(n_dev) if a != b}
        for i, r in enumerate(regs):
            t.copy_buffer_blocking(i, i, data, dst_buffer=r)
            t.set_device_buffer(i, r)
            t_ring.set_device_buffer(i, r)
        others = list(range(1, n_dev))

        def record(case: str, fig: dict[str, float], moved: int) -> dict[str, float]:
            fig["gbps"] = moved / fig["median_s"] / 1e9
            res["cases"][case] = fig
            say(f"{case:>32}: {fig['median_s'] * 1e3:9.2f} ms  {fig['gbps']:7.2f} GB/s")
            return fig

        def check(arr: Any, what: str) -> None:
            if not np.array_equal(arr, data):
                raise AssertionError(f"{what}: wrong bytes")

        # device -> device, one pair: the raw speed of the engine between GPUs
        d2d = record("device_to_device 0->1", timed(
            lambda: t.copy_buffer_blocking(0, 1, dst_buffer=bufs[1], timeout=120), reps), nbytes)

        # broadcast of a device buffer (on GPU 0) to every other device
        ours = record("broadcast device buffer", timed(
            lambda: t.broadcast_blocking(src_device=0, dst_buffers=[None] + bufs[1:], timeout=120), reps),
            nbytes * len(others))
        for d in others:
            rt.download(bufs[d], host[0])
            check(host[0], f"broadcast to GPU {d}")

        def serial_broadcast() -> None:
            for d in others:
                rt.download(regs[0], host[0])
                rt.upload(host[0], bufs[d])
        base = record("baseline broadcast (round trips)", timed(serial_broadcast, reps), nbytes * len(others))
        res["ratio_broadcast"] = base["median_s"] / ours["median_s"]

        # broadcast of host data: one upload + fan-out, against one serial upload per device
        ours_h = record("broadcast host data", timed(
            lambda: t.broadcast_blocking(data, dst_buffers=bufs, timeout=120), reps), nbytes * n_dev)
        ring_h = record("broadcast host data (ring)", timed(
            lambda: t_ring.broadcast_blocking(data, dst_buffers=bufs, timeout=120), reps), nbytes * n_dev)

        def serial_uploads() -> None:
            for d in range(n_dev):
                rt.upload(data, bufs[d])
        base_h = record("baseline host broadcast (uploads)", timed(serial_uploads, reps), nbytes * n_dev)
        res["ratio_broadcast_host"] = base_h["median_s"] / ours_h["median_s"]
        res["ratio_broadcast_host_ring"] = base_h["median_s"] / ring_h["median_s"]

        # gather to GPU 0: read every other device back to the host
        out = [host[i] for i in others]
        g_reuse = record("gather (zero-copy views)", timed(
            lambda: t.gather_blocking(0, reuse=True, timeout=120), reps), nbytes * len(others))
        for a in t.gather_blocking(0, reuse=True):
            check(a, "gather reuse")
        g_out = record("gather (into out= arrays)", timed(
            lambda: t.gather_blocking(0, out=out, timeout=120), reps), nbytes * len(others))
        record("gather (ring, out= arrays)", timed(
            lambda: t_ring.gather_blocking(0, out=out, timeout=120), reps), nbytes * len(others))
        record("gather (new arrays)", timed(lambda: t.gather_blocking(0, timeout=120), max(2, reps // 2)),
               nbytes * len(others))
        for a in out:
            check(a, "gather out")

        def serial_downloads() -> None:
            for i in others:
                rt.download(regs[i], host[i])
        base_g = record("baseline gather (downloads)", timed(serial_downloads, reps), nbytes * len(others))
        res["ratio_gather"] = base_g["median_s"] / g_out["median_s"]           # same host arrays as the baseline
        res["ratio_gather_zero_copy"] = base_g["median_s"] / g_reuse["median_s"]

        # gather_to_device(0): every registered buffer into one buffer on GPU 0
        g = t.gather_to_device_blocking(0, timeout=120)
        target = g.buffer
        gd = record("gather_to_device", timed(
            lambda: t.gather_to_device_blocking(0, dst_buffer=target, timeout=120), reps), nbytes * n_dev)

        def serial_gather_to_device() -> None:
            for i in range(n_dev):
                if i == 0:
                    rt.local(regs[0], target, nbytes, g.offsets[0])
                else:
                    rt.download(regs[i], host[i])
                    rt.upload(host[i], target, g.offsets[i])
        base_gd = record("baseline gather_to_device", timed(serial_gather_to_device, reps), nbytes * n_dev)
        res["ratio_gather_to_device"] = base_gd["median_s"] / gd["median_s"]
        res["device_to_device_gbps"] = d2d["gbps"]
    finally:
        t.destroy()
        t_ring.destroy()
        rt.destroy()
        for b in bufs + regs:
            b.destroy()
    return res


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256, help="bytes per device, in MiB (default 256)")
    p.add_argument("--reps", type=int, default=5)
    add_virtual_argument(p)
    add_output_argument(p, "--json", image=False, metavar="FILE", help="also write the figures to FILE")
    p.add_argument("--slot-size", type=int, metavar="MiB", help="device->device ring slot size")
    p.add_argument("--slot-count", type=int, metavar="N", help="device->device ring depth")
    p.add_argument("--no-dmabuf", action="store_true", help="pairs use host_shared/staging_copy, never dmabuf")
    args = p.parse_args(argv)
    if args.mib < 1 or args.reps < 1:
        p.error("--mib and --reps must be >= 1")
    note = use_virtual_if_no_gpu(args.virtual)
    from vkmulti import MultiDeviceManager

    with MultiDeviceManager.create(enabled=True, validation=False) as mgr:
        if mgr.device_count < 2:
            print("bench buffers needs two devices (try --virtual 2)", file=sys.stderr)
            return 2
        ring: dict[str, Any] = {k: v for k, v in (("slot_size", args.slot_size and args.slot_size << 20),
                                                  ("slot_count", args.slot_count)) if v}
        if args.no_dmabuf:
            ring["prefer_dmabuf"] = False
        with progress(None, "bench buffers", quiet=args.json is not None) as bar:
            res = run(mgr, args.mib << 20, args.reps, lambda m: (bar.say(m), bar()), **ring)
        res["ring"] = ring
    if note:
        res["note"] = note
    print_figures(res, args.json)
    print(f"ratio: broadcast = {res['ratio_broadcast']:.2f}x, gather = {res['ratio_gather']:.2f}x "
          f"(zero-copy views {res['ratio_gather_zero_copy']:.2f}x), "
          f"broadcast host data = {res['ratio_broadcast_host']:.2f}x, "
          f"gather_to_device = {res['ratio_gather_to_device']:.2f}x vs serial host round trips; "
          f"device->device {res['device_to_device_gbps']:.1f} GB/s ({res['method']['0->1']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
