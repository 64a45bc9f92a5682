"""KernelRuntime, the face of the kernels layer's runtime; its host I/O, its
Inbound port and the protocols the K2K router and the runtime talk through."""
from .inbound import Inbound
from .ports import OutboxFeed, RuntimePort
from .runtime import KernelRuntime, RunTicket, StepTicket

__all__ = ["Inbound", "OutboxFeed", "RuntimePort", "KernelRuntime", "RunTicket", "StepTicket"]
