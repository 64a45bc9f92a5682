"""Resources on one device: Buffer, Image and the host port that copies between them and host memory."""
from .buffer import Buffer, BUFFER_USAGE, BUFFER_USAGE_ALLOWED, run_one_shot
from .host_port import HostPort, Arena, Pending, Deadline, as_host_bytes
from .image import (Buffer, Image, CommandRunner, as_host_bytes, find_memory_type, timeline_submit_info,
                    check_layout, IMAGE_USAGE, BUFFER_USAGE, DEFAULT_FORMAT)
from .resource import GpuResource, as_host_bytes, find_memory_type, allocate_memory

__all__ = ["Buffer", "BUFFER_USAGE", "BUFFER_USAGE_ALLOWED", "run_one_shot", "HostPort", "Arena", "Pending",
           "Deadline", "as_host_bytes", "Image", "CommandRunner", "find_memory_type", "timeline_submit_info",
           "check_layout", "IMAGE_USAGE", "DEFAULT_FORMAT", "GpuResource", "allocate_memory"]
