"""Probe: host->device and device->host copy speed by kind of host memory.

256 MiB between a device-local buffer and (a) the driver's host-visible memory,
(b) malloc'd memory imported with VK_EXT_external_memory_host, (c) the same
imported memory allocated with mmap and locked. Transfer-family queue of GPU 0.
Prints JSON and a ratio line (imported / driver memory).
"""
import ctypes
import json
import mmap
import statistics
import time

import numpy as np
import vulkan as vk

from vkmulti import create_logical_device
from vkmulti import Buffer
from vkmulti import Instance
from vkmulti import MultiDeviceManager

N = 256 << 20
_ffi = vk.ffi


def main():
    inst = Instance(validation=False)
    pd = inst.physical_devices()[0]
    ld = create_logical_device(pd)
    slot = MultiDeviceManager._slot_from(0, pd, ld)  # the slot the manager would make of this device
    dev = ld.device
    local = Buffer(slot, N)
    driver = Buffer(slot, N, host_visible=True)
    get_props = vk.vkGetDeviceProcAddr(dev, "vkGetMemoryHostPointerPropertiesEXT")
    HOST = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT
    keep = []

    def imported(ptr):
        ext = vk.VkExternalMemoryBufferCreateInfo(sType=vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
                                                  handleTypes=HOST)
        buf = vk.vkCreateBuffer(dev, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, pNext=ext, size=N,
            usage=vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        props = _ffi.new("VkMemoryHostPointerPropertiesEXT*")
        props.sType = vk.VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT
        p = _ffi.cast("void*", ptr)
        get_props(dev, HOST, p, props)
        req = vk.vkGetBufferMemoryRequirements(dev, buf)
        bits = req.memoryTypeBits & props.memoryTypeBits
        mt = next(i for i in range(32) if bits & (1 << i))
        imp = vk.VkImportMemoryHostPointerInfoEXT(sType=vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT,
                                                  handleType=HOST, pHostPointer=p)
        mem = vk.vkAllocateMemory(dev, vk.VkMemoryAllocateInfo(sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                                               pNext=imp, allocationSize=N, memoryTypeIndex=mt), None)
        vk.vkBindBufferMemory(dev, buf, mem, 0)
        keep.append((buf, mem))
        return buf

    raw = np.zeros(N + 4096, dtype=np.uint8)
    off = (-raw.ctypes.data) % 4096
    malloc_buf = imported(raw.ctypes.data + off)
    mm = mmap.mmap(-1, N, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0))
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    ctypes.CDLL(None).mlock(ctypes.c_void_p(addr), ctypes.c_size_t(N))
    mmap_buf = imported(addr)

    q = ld.transfer_queue or ld.graphics_queue
    pool = vk.vkCreateCommandPool(dev, vk.VkCommandPoolCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, queueFamilyIndex=q.family), None)

    def timed(srcb, dstb):
        c = vk.vkAllocateCommandBuffers(dev, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(c, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        vk.vkCmdCopyBuffer(c, srcb, dstb, 1, [vk.VkBufferCopy(0, 0, N)])
        vk.vkEndCommandBuffer(c)
        ts = []
        for _ in range(12):
            f = vk.vkCreateFence(dev, vk.VkFenceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO), None)
            t0 = time.perf_counter()
            vk.vkQueueSubmit(q.handle, 1, [vk.VkSubmitInfo(sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                                           commandBufferCount=1, pCommandBuffers=[c])], f)
            vk.vkWaitForFences(dev, 1, [f], vk.VK_TRUE, 10**10)
            ts.append(time.perf_counter() - t0)
            vk.vkDestroyFence(dev, f, None)
        return N / statistics.median(ts[2:]) / 1e9

    out = {}
    for name, b in (("driver host-visible", driver.handle), ("imported malloc", malloc_buf),
                    ("imported mmap+mlock", mmap_buf)):
        out[name] = {"h2d_gbps": timed(b, local.handle), "d2h_gbps": timed(local.handle, b)}
    print(json.dumps(out, indent=1))
    print("ratio: imported malloc / driver memory h2d = %.2fx, d2h = %.2fx" % (
        out["imported malloc"]["h2d_gbps"] / out["driver host-visible"]["h2d_gbps"],
        out["imported malloc"]["d2h_gbps"] / out["driver host-visible"]["d2h_gbps"]))
    vk.vkDestroyCommandPool(dev, pool, None)
    for b, m in keep:
        vk.vkDestroyBuffer(dev, b, None)
        vk.vkFreeMemory(dev, m, None)
    local.destroy()
    driver.destroy()
    ld.native.wait_idle()
    vk.vkDestroyDevice(dev, None)
    inst.destroy()


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
