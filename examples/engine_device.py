"""An engine that owns its Vulkan device, end to end.

The engine makes its own VkInstance and VkDevice with the `vulkan` package,
enabling exactly what `vkmulti.device_requirements()` answers (extensions,
features, queue families), hands the device to `vkmulti.MultiDeviceManager`
with the seed's keywords plus `primary_extensions`/`primary_features`, and
then moves an image between its device and every other GPU by every transfer
method the pair supports, both ways, checking every pixel.

    python examples/engine_device.py            # real GPUs, or the virtual pair without one

Prints one line per method and direction; exits 1 if any pixel differs.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np
import vulkan as vk

import vkmulti


def create_engine_device(physical_device: Any, peers: list[Any]) -> tuple[Any, dict[str, Any], Any]:
    """The engine's own VkDevice, made from device_requirements' answer alone.

    Returns (device, the keywords MultiDeviceManager needs for it, the requirements)."""
    req = vkmulti.device_requirements(physical_device, peers=peers)
    qf = req.queue_families
    queue_infos = [vk.VkDeviceQueueCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                              queueFamilyIndex=f, queueCount=1, pQueuePriorities=[1.0])
                   for f in req.family_indices]
    device = vk.vkCreateDevice(physical_device, vk.VkDeviceCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, pNext=req.feature_chain(),
        queueCreateInfoCount=len(queue_infos), pQueueCreateInfos=queue_infos,
        enabledExtensionCount=len(req.extensions), ppEnabledExtensionNames=list(req.extensions) or None), None)
    graphics = vk.vkGetDeviceQueue(device, qf.graphics, 0)
    keywords = dict(
        primary_physical_device=physical_device, primary_queue_families=qf, primary_device=device,
        primary_graphics_queue=graphics, primary_present_queue=graphics,
        primary_compute_queue=vk.vkGetDeviceQueue(device, qf.compute, 0) if qf.compute is not None else None,
        primary_transfer_queue=vk.vkGetDeviceQueue(device, qf.transfer, 0) if qf.transfer is not None else None,
        primary_extensions=req.extensions, primary_features=req.features)
    return device, keywords, req


def move_by_every_method(mgr: vkmulti.MultiDeviceManager, width: int = 256, height: int = 128) -> list[dict[str, Any]]:
    """Move a random RGBA16F image GPU 0 <-> every other GPU by every method each pair
    supports; one record per (source, destination, method) with `identical`."""
    rng = np.random.default_rng(14)
    out = []
    for other in range(1, mgr.device_count):
        for src, dst in ((mgr.slot(other), mgr.primary), (mgr.primary, mgr.slot(other))):
            for method in vkmulti.pair_methods(src, dst):
                pixels = rng.integers(0, 256, (height, width, 8), dtype=np.uint8)
                with vkmulti.Image(src, width, height) as a, vkmulti.Image(dst, width, height) as b, \
                        vkmulti.CrossDeviceTransfer(src, dst, method) as x:
                    a.upload(pixels)
                    x.run(src_image=a, dst_image=b, timeout=60)
                    out.append({"src": src.index, "dst": dst.index, "method": method,
                                "identical": bool(np.array_equal(b.download(), pixels))})
    return out


def main() -> int:
    """Run the engine-style check; 0 when every method moved every pixel exactly."""
    app = vk.VkApplicationInfo(sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO, pApplicationName="engine",
                               apiVersion=vk.VK_MAKE_VERSION(1, 3, 0))
    if vkmulti.testing.use_virtual_if_no_gpu():    # the engine's instance then sees the virtual pair
        print(f"note: {vkmulti.testing.NO_GPU_NOTE}")
    instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                                                           pApplicationInfo=app), None)
    try:
        gpus = list(vk.vkEnumeratePhysicalDevices(instance))
        device, keywords, req = create_engine_device(gpus[0], gpus[1:])
        print(req)
        try:
            with vkmulti.MultiDeviceManager(physical_devices=gpus, enabled=True, **keywords) as mgr:
                if mgr.device_count < 2:
                    print("one device: nothing to move between GPUs")
                    return 0
                results = move_by_every_method(mgr)
        finally:
            vk.vkDestroyDevice(device, None)
    finally:
        vk.vkDestroyInstance(instance, None)
    for r in results:
        print(f"GPU {r['src']} -> GPU {r['dst']}  {r['method']:<13} {'identical' if r['identical'] else 'DIFFERS'}")
    return 0 if results and all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
