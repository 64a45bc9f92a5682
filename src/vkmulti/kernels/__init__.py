"""The kernels layer: compute kernels with resident state and message rings,
the runtime that launches and steps them on the coordinator's devices, and
the messages they exchange (ringkernel's actors, in Vulkan's form)."""
from .kernel import InboundBatch, Kernel, KernelSpec, KernelStats, OutboxBatch
from .messages import (DEFAULT_PAYLOAD_SIZE, HOST_KERNEL_ID, HlcTimestamp, HybridLogicalClock, K2KMessage,
                       MessageEnvelope)
from .reference import counter_kernel, pingpong_kernel, stencil_kernel
from .runtime import KernelRuntime, StepTicket

__all__ = [
    "KernelRuntime", "StepTicket", "KernelSpec", "Kernel", "KernelStats", "OutboxBatch", "InboundBatch",
    "K2KMessage", "MessageEnvelope", "HlcTimestamp", "HybridLogicalClock", "HOST_KERNEL_ID",
    "DEFAULT_PAYLOAD_SIZE", "counter_kernel", "pingpong_kernel", "stencil_kernel",
]
