"""KernelRuntime, the face of the kernels layer's runtime, and its host I/O."""
from .inbound import RouterHooks
from .runtime import KernelRuntime, StepTicket

__all__ = ["RouterHooks", "KernelRuntime", "StepTicket"]
