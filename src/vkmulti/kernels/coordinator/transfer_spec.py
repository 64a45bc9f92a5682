"""ringkernel's CrossDeviceTransfer: a descriptor of a device-to-device copy
(`source_device`, `dest_device`, `size`, `use_p2p`) that runs through
vkmulti's transfer engine. (vkmulti.CrossDeviceTransfer is SimVX's class, the
engine itself; this one is vkmulti.kernels.CrossDeviceTransfer.)"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..._core.checks import check_count, check_index, short_repr
from ..._core.lifetime import Deadline, destroy_idle
from ...transfer.cross_device import CrossDeviceTransfer as TransferEngine
from ...transfer.methods import TransferMethod, method_support, select_transfer_method
from ..._core.reprs import compact_repr

if TYPE_CHECKING:
    from ..._core.vktypes import VkBuffer
    from ...device.manager import MultiDeviceManager
    from ...memory.buffer import Buffer

__all__ = ["CrossDeviceTransfer"]

_PEER = (TransferMethod.CUDA_PEER, TransferMethod.DMABUF)


@dataclass
class CrossDeviceTransfer:
    """`size` bytes from device `source_device` to `dest_device`; `use_p2p=False`
    (`without_p2p()`) keeps it off peer paths (CUDA_PEER, DMABUF)."""

    __repr__ = compact_repr
    source_device: int
    dest_device: int
    size: int
    use_p2p: bool = True

    def __post_init__(self) -> None:
        self.source_device = check_index(self.source_device, "source_device")
        self.dest_device = check_index(self.dest_device, "dest_device")
        self.size = check_count(self.size, "size")
        if not isinstance(self.use_p2p, bool):
            raise TypeError(f"use_p2p must be a bool, got {short_repr(self.use_p2p)}")

    def without_p2p(self) -> "CrossDeviceTransfer":
        """A copy that avoids peer-to-peer methods (host_shared or staging_copy)."""
        return dataclasses.replace(self, use_p2p=False)

    def method(self, manager: MultiDeviceManager) -> str:
        """The transfer method this copy takes between the manager's devices."""
        src, dst = self._slots(manager)
        if src.index == dst.index:
            return TransferMethod.NONE

        class _Src:
            device_index = src.index
        best = select_transfer_method(_Src(), manager.capabilities, dst_index=dst.index)
        if self.use_p2p or best not in _PEER:
            return best
        for m in (TransferMethod.HOST_SHARED, TransferMethod.STAGING_COPY):
            if src.capabilities is None or dst.capabilities is None or \
                    method_support(m, src.capabilities, dst.capabilities, src.enabled_extensions,
                                   dst.enabled_extensions) is None:
                return m
        return TransferMethod.STAGING_COPY

    def run(self, manager: MultiDeviceManager, src_buffer: Buffer | VkBuffer | int, dst_buffer: Buffer | VkBuffer | int,
            *, src_offset: int = 0, dst_offset: int = 0,
            timeout: float | None = None) -> str:
        """Copy `size` bytes from `src_buffer` (on source_device) to `dst_buffer`
        (on dest_device), blocking until they landed; returns the method used.
        Buffers are vkmulti Buffers of those devices. After vkmulti.TimeoutError or
        Ctrl-C the copy may still run: what it uses stays to the manager's destroy()."""
        deadline = Deadline(timeout)   # (checks it before anything is queued)
        if self.size == 0:
            return TransferMethod.NONE
        src, dst = self._slots(manager)
        method = self.method(manager)
        if method == TransferMethod.NONE:
            raise ValueError(f"source and destination are both device {src.index}; copy within a device "
                             f"with the device's own commands")
        engine = TransferEngine(src, dst, method)
        try:
            engine.submit(src_buffer=src_buffer, dst_buffer=dst_buffer, src_offset=src_offset,
                          dst_offset=dst_offset, size=self.size).wait(deadline.left())
        except BaseException:
            destroy_idle([engine])
            raise
        engine.destroy(deadline.left())
        return method

    def _slots(self, manager: Any) -> tuple[Any, Any]:
        n = manager.device_count
        for label, i in (("source_device", self.source_device), ("dest_device", self.dest_device)):
            if i >= n:
                raise IndexError(f"{label} {short_repr(i)} out of range: the manager has {n} device(s)")
        return manager.slot(self.source_device), manager.slot(self.dest_device)
