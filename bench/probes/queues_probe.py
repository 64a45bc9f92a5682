"""Probe: does splitting a device->host copy over two queues raise PCIe throughput?

Times 256 MiB device-local -> host-visible on one transfer queue, then the same
bytes split in halves over two queues (transfer family 0/1, or transfer +
universal) submitted together. Then a 64 MiB job (about a 4K frame) cut as the
links cut it, 16 chunks of 4 MiB each with its own submit and fence, on one
queue or alternating over two, against the same 64 MiB as one copy: what each
chunk's completion costs, and whether a second queue hides it. Prints JSON and
ratio lines.
"""
import json
import statistics
import time

import vulkan as vk

from vkmulti import create_logical_device
from vkmulti import Buffer
from vkmulti import Instance
from vkmulti import MultiDeviceManager

N = 256 << 20


def main():
    inst = Instance(validation=False)
    pd = inst.physical_devices()[0]
    ld = create_logical_device(pd)
    slot = MultiDeviceManager._slot_from(0, pd, ld)  # the slot the manager would make of this device
    src = Buffer(slot, N)
    dst = Buffer(slot, N, host_visible=True)
    queues = {"transfer0": ld.transfer_queue, "transfer1": ld.copy_queue, "universal": ld.graphics_queue,
              "universal1": ld.universal_copy_queue}
    queues = {n: q or ld.graphics_queue for n, q in queues.items()}  # a device without them: its one queue
    pools = {}
    for name, q in queues.items():
        pools[name] = vk.vkCreateCommandPool(ld.device, vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, queueFamilyIndex=q.family), None)
    fence = vk.vkCreateFence(ld.device, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)

    def record(name, off, size, pieces=1):
        """A command buffer copying [off, off + size) in `pieces` separate copy commands."""
        c = vk.vkAllocateCommandBuffers(ld.device, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=pools[name],
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(c, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        part = size // pieces
        for i in range(pieces):
            vk.vkCmdCopyBuffer(c, src.handle, dst.handle, 1, [vk.VkBufferCopy(off + i * part, off + i * part, part)])
        vk.vkEndCommandBuffer(c)
        return c

    def run(plan):
        fences = []
        for name, c in plan:
            f = vk.vkCreateFence(ld.device, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
            fences.append(f)
        t0 = time.perf_counter()
        for (name, c), f in zip(plan, fences):
            vk.vkQueueSubmit(queues[name].handle, 1, [vk.VkSubmitInfo(sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                                                      commandBufferCount=1, pCommandBuffers=[c])], f)
        vk.vkWaitForFences(ld.device, len(fences), fences, vk.VK_TRUE, 10**10)
        dt = time.perf_counter() - t0
        for f in fences:
            vk.vkDestroyFence(ld.device, f, None)
        return dt

    out = {}
    plans = {
        "one transfer queue": [("transfer1", record("transfer1", 0, N))],
        "one universal queue": [("universal", record("universal", 0, N))],
        "two transfer queues": [("transfer0", record("transfer0", 0, N // 2)),
                                ("transfer1", record("transfer1", N // 2, N // 2))],
        "transfer + universal": [("transfer1", record("transfer1", 0, N // 2)),
                                 ("universal", record("universal", N // 2, N // 2))],
    }
    for name, plan in plans.items():
        ts = [run(plan) for _ in range(12)][2:]
        out[name] = N / statistics.median(ts) / 1e9
    print(json.dumps({"d2h_gbps": out}, indent=1))
    print("ratio: two transfer queues / one = %.2fx, transfer+universal / one = %.2fx" % (
        out["two transfer queues"] / out["one transfer queue"], out["transfer + universal"] / out["one transfer queue"]))
    m, k = 64 << 20, 16
    chunk = m // k
    chunked = {
        "64 MiB as one copy": [("transfer1", record("transfer1", 0, m))],
        "16 copies in one submit": [("transfer1", record("transfer1", 0, m, k))],
        "16 chunks, a submit each, one queue": [("transfer1", record("transfer1", i * chunk, chunk))
                                                for i in range(k)],
        "16 chunks, a submit each, two transfer queues": [
            (q, record(q, i * chunk, chunk)) for i, q in zip(range(k), ["transfer0", "transfer1"] * k)],
        "16 chunks, a submit each, one universal queue": [("universal1", record("universal1", i * chunk, chunk))
                                                          for i in range(k)],
        "16 chunks, a submit each, two universal queues": [
            (q, record(q, i * chunk, chunk)) for i, q in zip(range(k), ["universal", "universal1"] * k)],
    }
    us = {}
    for name, plan in chunked.items():
        ts = [run(plan) for _ in range(25)][3:]
        us[name] = statistics.median(ts) * 1e6
    print(json.dumps({"64 MiB d2h, median us": {n: round(v, 1) for n, v in us.items()}}, indent=1))
    one = us["64 MiB as one copy"]
    print("ratio: universal / transfer queue, 16 submits: one queue %.3fx, two queues %.3fx" % (
        us["16 chunks, a submit each, one queue"] / us["16 chunks, a submit each, one universal queue"],
        us["16 chunks, a submit each, two transfer queues"] / us["16 chunks, a submit each, two universal queues"]))
    print("ratio: vs one copy: 16 copies in one submit %.3fx, 16 submits one queue %.3fx, 16 submits two queues "
          "%.3fx; per-chunk cost of a submit on one queue %.1f us, on two %.1f us" % (
              one / us["16 copies in one submit"], one / us["16 chunks, a submit each, one queue"],
              one / us["16 chunks, a submit each, two transfer queues"],
              (us["16 chunks, a submit each, one queue"] - one) / k,
              (us["16 chunks, a submit each, two transfer queues"] - one) / k))
    vk.vkDestroyFence(ld.device, fence, None)
    for p in pools.values():
        vk.vkDestroyCommandPool(ld.device, p, None)
    src.destroy()
    dst.destroy()
    ld.native.wait_idle()
    vk.vkDestroyDevice(ld.device, None)
    inst.destroy()


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
