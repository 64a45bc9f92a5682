"""Names for the Vulkan objects in vkmulti's signatures.

The `vulkan` package hands out handles and structs as cffi objects
(`vulkan.ffi.CData`) and ships no types, so a type checker sees them as `Any`.
These names say which handle a parameter takes or a property gives: a value
from a `vulkan` call is accepted wherever one is expected, and one kind is not
taken for another. Parameters that also take a handle's integer value (an
engine's own binding) say `VkDevice | int` and so on; vkmulti checks the kind
at run time (`_core.handles.handle_int`).
"""
from __future__ import annotations

from typing import NewType, TypeAlias

__all__ = ["VkInstance", "VkPhysicalDevice", "VkDevice", "VkQueue", "VkCommandBuffer", "VkCommandPool",
           "VkSemaphore", "VkFence", "VkDescriptorPool", "VkDescriptorSet", "VkImage", "VkBuffer", "VkStruct", "VkImageLayout"]

VkInstance = NewType("VkInstance", object)
VkPhysicalDevice = NewType("VkPhysicalDevice", object)
VkDevice = NewType("VkDevice", object)
VkQueue = NewType("VkQueue", object)
VkCommandBuffer = NewType("VkCommandBuffer", object)
VkCommandPool = NewType("VkCommandPool", object)
VkSemaphore = NewType("VkSemaphore", object)
VkFence = NewType("VkFence", object)
VkDescriptorPool = NewType("VkDescriptorPool", object)
VkDescriptorSet = NewType("VkDescriptorSet", object)
VkImage = NewType("VkImage", object)
VkBuffer = NewType("VkBuffer", object)
#: A Vulkan struct made by the `vulkan` package (vk.VkSubmitInfo(...), a pNext chain's head).
VkStruct = NewType("VkStruct", object)
#: A VkImageLayout value (the `vulkan` package's constants are ints).
VkImageLayout: TypeAlias = int
