"""Helpers for the kernel runtime's tests: the coordinator of a manager, and a
minimal router double that moves every outbox batch to the other devices with
the transfer engine, as the K2K router will (GPU-side ordering, no host copy)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from vkmulti import CrossDeviceTransfer, select_transfer_method
from vkmulti.images import Buffer


def make_coordinator(manager: Any) -> Any:
    """A MultiGpuCoordinator with one registered device per slot of `manager`."""
    from vkmulti.kernels import MultiGpuCoordinator

    return MultiGpuCoordinator.from_manager(manager)


class CopyRouter:
    """Copies each new outbox batch to every other device that runs kernels and
    hands it to the runtime there; the destination's next step waits for the
    copy on the GPU, the source's region is held until the copy has read it."""

    def __init__(self, runtime: Any, manager: Any):
        self.rt, self.mgr = runtime, manager
        self.inbound: list[tuple[Any, Buffer]] = []
        self.transfers: dict[tuple[int, int], CrossDeviceTransfer] = {}
        self.copies = 0
        runtime.add_step_listener(self.on_step)

    def _transfer(self, src: int, dst: int) -> CrossDeviceTransfer:
        t = self.transfers.get((src, dst))
        if t is None:
            method = select_transfer_method(SimpleNamespace(device_index=src), self.mgr.capabilities, dst_index=dst)
            t = self.transfers[(src, dst)] = CrossDeviceTransfer(self.mgr.slot(src), self.mgr.slot(dst), method)
        return t

    def on_step(self, batches: list[Any]) -> None:
        self.collect()
        devices = {k.device_index for k in self.rt.kernels}
        for b in batches:
            for dst in sorted(devices - {b.device_index}):
                landing = Buffer(self.mgr.slot(dst), b.size)
                ticket = self._transfer(b.device_index, dst).submit(
                    src_buffer=b.buffer, dst_buffer=landing, src_offset=b.offset, size=b.size, src_wait=b.ready)
                ticket.wait_submitted(30)   # one queue per lavapipe device: no wait may precede its signal
                b.hold(ticket.src_done)
                self.inbound.append((self.rt.accept_batch(dst, landing, wait=ticket.dst_ready), landing))
                self.copies += 1

    def collect(self) -> None:
        keep = []
        for inbound, landing in self.inbound:
            if inbound.done:
                landing.destroy()
            else:
                keep.append((inbound, landing))
        self.inbound = keep

    def destroy(self) -> None:
        self.rt.remove_step_listener(self.on_step)
        for t in self.transfers.values():
            t.destroy(30)
        for _, landing in self.inbound:
            landing.destroy()
        self.inbound = []
