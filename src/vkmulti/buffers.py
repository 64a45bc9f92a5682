"""The old path of `vkmulti.Buffer` (now `vkmulti.memory.buffer`) and of `InterGpuTransfer` (now
`vkmulti.transfer`), an alias for one release."""
from .memory.buffer import *  # noqa: F401,F403
from .memory.buffer import __all__ as _buffer_names
from .transfer.inter_gpu import GATHER_ALIGNMENT, Gathered, InterGpuTransfer

__all__ = [*_buffer_names, "InterGpuTransfer", "Gathered", "GATHER_ALIGNMENT"]
