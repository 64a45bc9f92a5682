"""One VkDevice per GPU and the set of them: the instance, capabilities, logical devices, the
manager and its slots, one-shot command runners, CUDA discovery, the virtual GPU pair, failover counters."""
from .capabilities import DeviceCapabilities, QueueFamilies, RenderCapabilities, probe_device
from .commands import CommandRunner, timeline_submit_info
from .cuda import CudaDevice, cuda_status, cuda_devices, cuda_device_for, cuda_peer_reason
from .failover import FailoverStats, Recovery
from .instance import Instance
from .logical import LogicalDevice, Queue, create_logical_device
from .manager import DeviceSlot, MultiDeviceManager
from .slots import check_slot, slot_lifetime, slot_queue
from .virtual import (find_lavapipe_icd, install_virtual_gpus, virtual_gpus, VIRTUAL_FALLBACK_ENV, NO_GPU_NOTE,
                      no_gpu_fallback, physical_device_types, use_virtual_if_no_gpu, is_virtual_setup)

__all__ = ["DeviceCapabilities", "QueueFamilies", "RenderCapabilities", "probe_device", "CommandRunner",
           "timeline_submit_info", "CudaDevice", "cuda_status", "cuda_devices", "cuda_device_for",
           "cuda_peer_reason", "FailoverStats", "Recovery", "Instance", "LogicalDevice", "Queue",
           "create_logical_device", "DeviceSlot", "MultiDeviceManager", "check_slot", "slot_lifetime", "slot_queue",
           "find_lavapipe_icd", "install_virtual_gpus",
           "virtual_gpus", "VIRTUAL_FALLBACK_ENV", "NO_GPU_NOTE", "no_gpu_fallback", "physical_device_types",
           "use_virtual_if_no_gpu", "is_virtual_setup"]
