"""Probe: does the shape of one PCIe hop's copy command change its speed?

On one GPU's transfer queue, 64 MiB between device-local memory and
host-visible memory is copied by one vkCmdCopyBuffer with 1 ... 1024 regions,
both ways, and a 3840x2160 RGBA16F image to/from host memory with its rows cut
into 1 ... 256 regions. Each shape is one submit waited with a fence (median of
--reps). Prints JSON and a ratio line (best shape vs one region).

    python bench/probes/region_probe.py [--reps 15]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import vulkan as vk

from vkmulti import create_logical_device
from vkmulti import Buffer, Image
from vkmulti import Instance
from vkmulti import MultiDeviceManager

N = 64 << 20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args(argv)
    inst = Instance(validation=False)
    pd = inst.physical_devices()[0]
    ld = create_logical_device(pd)
    slot = MultiDeviceManager._slot_from(0, pd, ld)
    q = slot.copy_queue
    dev = Buffer(slot, N)
    host = Buffer(slot, N, host_visible=True)
    img = Image(slot, 3840, 2160, vk.VK_FORMAT_R16G16B16A16_SFLOAT, layout=vk.VK_IMAGE_LAYOUT_GENERAL)
    row = 3840 * 8
    pool = vk.vkCreateCommandPool(ld.device, vk.VkCommandPoolCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, queueFamilyIndex=q.family), None)
    fence = vk.vkCreateFence(ld.device, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)

    def timed(record) -> float:
        c = vk.vkAllocateCommandBuffers(ld.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(c, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        record(c)
        vk.vkEndCommandBuffer(c)
        ts = []
        for _ in range(a.reps + 2):
            vk.vkResetFences(ld.device, 1, [fence])
            t0 = time.perf_counter()
            vk.vkQueueSubmit(q.handle, 1, [vk.VkSubmitInfo(sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                                          commandBufferCount=1, pCommandBuffers=[c])], fence)
            vk.vkWaitForFences(ld.device, 1, [fence], vk.VK_TRUE, 10**10)
            ts.append(time.perf_counter() - t0)
        vk.vkFreeCommandBuffers(ld.device, pool, 1, [c])
        return statistics.median(ts[2:])

    out: dict[str, float] = {}
    for k in (1, 4, 16, 64, 256, 1024):
        part = N // k
        regions = [vk.VkBufferCopy(i * part, i * part, part) for i in range(k)]
        out[f"buffer d2h, {k} regions"] = N / timed(
            lambda c: vk.vkCmdCopyBuffer(c, dev.handle, host.handle, k, regions)) / 1e9
        out[f"buffer h2d, {k} regions"] = N / timed(
            lambda c: vk.vkCmdCopyBuffer(c, host.handle, dev.handle, k, regions)) / 1e9
    nbytes = 3840 * 2160 * 8
    for k in (1, 4, 16, 64, 256):
        rows = [2160 * i // k for i in range(k + 1)]
        regions = [vk.VkBufferImageCopy(
            bufferOffset=rows[i] * row, bufferRowLength=0, bufferImageHeight=0,
            imageSubresource=vk.VkImageSubresourceLayers(vk.VK_IMAGE_ASPECT_COLOR_BIT, 0, 0, 1),
            imageOffset=vk.VkOffset3D(0, rows[i], 0), imageExtent=vk.VkExtent3D(3840, rows[i + 1] - rows[i], 1))
            for i in range(k)]
        out[f"image to host, {k} regions"] = nbytes / timed(lambda c: vk.vkCmdCopyImageToBuffer(
            c, img.handle, vk.VK_IMAGE_LAYOUT_GENERAL, host.handle, k, regions)) / 1e9
        out[f"host to image, {k} regions"] = nbytes / timed(lambda c: vk.vkCmdCopyBufferToImage(
            c, host.handle, img.handle, vk.VK_IMAGE_LAYOUT_GENERAL, k, regions)) / 1e9
    print(json.dumps({"gbps": {k: round(v, 2) for k, v in out.items()}}, indent=1))
    ratios = []
    for what in ("buffer d2h", "buffer h2d", "image to host", "host to image"):
        mine = {k: v for k, v in out.items() if k.startswith(what)}
        best = max(mine, key=mine.get)
        ratios.append(f"{what}: best ({best.split(', ')[1]}) / 1 region = {mine[best] / mine[what + ', 1 regions']:.3f}x")
    print("ratio: " + "; ".join(ratios))
    vk.vkDestroyFence(ld.device, fence, None)
    vk.vkDestroyCommandPool(ld.device, pool, None)
    img.destroy()
    dev.destroy()
    host.destroy()
    ld.native.wait_idle()
    vk.vkDestroyDevice(ld.device, None)
    inst.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
