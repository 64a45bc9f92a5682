"""Do Vulkan copies and CUDA copies on the same GPU run at the same time?

Times, alone and then concurrently (Vulkan in a thread, CUDA through torch in
the main thread): Vulkan 256 MiB buffer copies on a universal and on a
transfer-only queue, Vulkan 4K RGBA16F image->buffer copies, torch peer copies
GPU0 -> GPU1, torch local copies on GPU1. Prints GB/s per case as JSON lines.

    python bench/probes/interop_probe.py [--n 10]
"""
from __future__ import annotations

import argparse
import json
import threading
import time

import vulkan as vk

from vkmulti import MultiDeviceManager
from vkmulti import Buffer, Image
from vkmulti.device import CommandRunner

N = 256 << 20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    n = ap.parse_args().n
    import torch   # after --help: the probe needs torch with two CUDA GPUs
    with MultiDeviceManager.create(enabled=True, validation=False) as mgr:
        s0, s1 = mgr.slot(0), mgr.slot(1)
        va, vb = Buffer(s0, N), Buffer(s0, N)
        wa, wb = Buffer(s1, N), Buffer(s1, N)
        img = Image(s0, 3840, 2160, vk.VK_FORMAT_R16G16B16A16_SFLOAT)
        t0a = torch.empty(N, dtype=torch.uint8, device="cuda:0")
        t1a = torch.empty(N, dtype=torch.uint8, device="cuda:1")
        t1b = torch.empty(N, dtype=torch.uint8, device="cuda:1")

        def vk_job(slot, queue, kind, src, dst):
            runner = CommandRunner(slot, queue)

            def record(cmd):
                for _ in range(n):
                    if kind == "buffer":
                        vk.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1, [vk.VkBufferCopy(0, 0, N)])
                    else:
                        vk.vkCmdCopyImageToBuffer(cmd, src.handle, vk.VK_IMAGE_LAYOUT_SHADER_READ_ONLY_OPTIMAL,
                                                  dst.handle, 1, [vk.VkBufferImageCopy(
                                                      0, 0, 0, vk.VkImageSubresourceLayers(
                                                          vk.VK_IMAGE_ASPECT_COLOR_BIT, 0, 0, 1),
                                                      vk.VkOffset3D(0, 0, 0), vk.VkExtent3D(3840, 2160, 1))])
                    vk.vkCmdPipelineBarrier(cmd, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                                            0, 1, [vk.VkMemoryBarrier(
                                                srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                                                dstAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT)], 0, None, 0, None)
            nbytes = N if kind == "buffer" else 3840 * 2160 * 8

            def go():
                t = time.perf_counter()
                runner.run(record, timeout=60)
                return n * nbytes / (time.perf_counter() - t) / 1e9
            return go

        def torch_job(dst, src, dev):
            def go():
                torch.cuda.synchronize(0), torch.cuda.synchronize(1)
                t = time.perf_counter()
                for _ in range(n):
                    dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize(dev)
                return n * N / (time.perf_counter() - t) / 1e9
            return go

        vks = {
            "vk GPU0 universal buffer": vk_job(s0, s0.universal_copy_queue, "buffer", va, vb),
            "vk GPU0 transfer buffer": vk_job(s0, s0.copy_queue, "buffer", va, vb),
            "vk GPU0 universal image->buffer": vk_job(s0, s0.universal_copy_queue, "image", img, vb),
            "vk GPU1 universal buffer": vk_job(s1, s1.universal_copy_queue, "buffer", wa, wb),
        }
        cus = {
            "torch peer 0->1": (torch_job(t1a, t0a, 1)),
            "torch local GPU1": (torch_job(t1b, t1a, 1)),
        }
        for name, f in {**vks, **cus}.items():
            f()
            print(json.dumps({"alone": name, "gbps": round(f(), 1)}), flush=True)
        for vname in vks:
            for cname, cf in cus.items():
                out = {}
                th = threading.Thread(target=lambda: out.__setitem__("vk", vks[vname]()))
                th.start()
                time.sleep(0.0005)
                out["cuda"] = cf()
                th.join()
                print(json.dumps({"together": [vname, cname], "vk_gbps": round(out["vk"], 1),
                                  "cuda_gbps": round(out["cuda"], 1)}), flush=True)
        for x in (va, vb, wa, wb, img):
            x.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
