"""What InterGpuTransfer's operations run through: registrations, held Buffers, and the routes between devices.

`Routes` owns, per InterGpuTransfer, the host-copy port of each device, the
CrossDeviceTransfer of each device pair (the best method the pair supports)
and the Buffers the operations made; `Holds` keeps the Buffers one operation
uses alive until it returns; a `Registration` is a device's registered buffer.
"""
from __future__ import annotations

import logging
import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from .._core.lifetime import Deadline
from ..errors import DestroyedError, UnsupportedError
from ..memory.buffer import Buffer
from ..memory.host_port import HostPort
from .cross_device import CrossDeviceTransfer
from .methods import select_transfer_method

log = logging.getLogger(__name__)

__all__ = ["Registration", "Holds", "Routes", "wait_all", "NOTHING_RAN"]

#: Errors raised before a submit reached the GPU: buffers made for the operation can go.
NOTHING_RAN = (ValueError, TypeError, UnsupportedError)


@dataclass(frozen=True)
class Registration:
    """The buffer registered for one device (or an operation's device source in that shape)."""
    device: int
    buffer: Any             # a vkmulti Buffer or a raw VkBuffer handle (int)
    size: int
    ready: tuple[int, int] | None

    def handle(self) -> int:
        if isinstance(self.buffer, Buffer):
            if self.buffer.handle is None:
                raise DestroyedError(f"the buffer registered for GPU {self.device} was destroyed")
            return self.buffer.handle_int
        return self.buffer

    @property
    def waits(self) -> list[tuple[int, int]]:
        return [self.ready] if self.ready else []

    def hold(self, holds: "Holds") -> int:
        """Hold the registered Buffer for the operation (its destroy() waits); its handle."""
        try:
            holds(self.buffer)
        except DestroyedError:
            raise DestroyedError(f"the buffer registered for GPU {self.device} was destroyed") from None
        return self.handle()


class Holds:
    """The Buffers one operation holds: `holds(a, b, ...)` enters each Buffer's
    lifetime once (DestroyedError if it is gone) and returns the Buffers among them."""

    def __init__(self, stack: ExitStack):
        self._stack = stack
        self._held: set[int] = set()

    def own(self, buf: Buffer) -> None:
        """A Buffer the operation made itself: nobody else has it yet (and the
        operation may free it on failure), so it is not held."""
        self._held.add(id(buf))

    def __call__(self, *objs: Any) -> list[Buffer]:
        out = []
        for obj in objs:
            if isinstance(obj, Buffer):
                if id(obj) not in self._held:
                    self._stack.enter_context(obj._life)
                    self._held.add(id(obj))
                out.append(obj)
        return out


def wait_all(jobs: list[Any], dl: Deadline, *, quiet: bool = False) -> None:
    """Wait for every job (tickets or pendings); raise the first error unless `quiet`.

    A job that does not finish stays with its link or port, which waits for it
    before freeing anything.
    """
    first: BaseException | None = None
    for job in jobs:
        try:
            job.wait(dl.left())
        except Exception as exc:   # Ctrl-C ends the waiting at once
            if quiet:
                log.warning("InterGpuTransfer: a copy of the failed operation also failed (%r)", exc)
            first = first or exc
    if first is not None and not quiet:
        raise first


class Routes:
    """The ports, pair transfers and made Buffers of one InterGpuTransfer (made on first use).

    `host_import` and `prefer_dmabuf` are InterGpuTransfer's; `slot_size` and
    `slot_count` shape every pair's ring.
    """

    def __init__(self, slots: Sequence[Any], *, host_import: bool | None, prefer_dmabuf: bool, slot_size: int,
                 slot_count: int):
        self._slots = slots
        self._host_import, self._prefer_dmabuf = host_import, prefer_dmabuf
        self._slot_size, self._slot_count = slot_size, slot_count
        self._lock = threading.Lock()
        self._ports: dict[tuple[int, bool], HostPort] = {}
        self._transfers: dict[tuple[int, int], CrossDeviceTransfer] = {}
        self.owned: list[Buffer] = []

    def method(self, src: int, dst: int) -> str:
        """The best method from device `src` to device `dst` (what their VkDevices enabled counts)."""
        return select_transfer_method(self._slots[src], self._slots[dst], prefer_dmabuf=self._prefer_dmabuf)

    def port(self, device: int, *, local: bool = False) -> HostPort:
        """The device's host-copy port; `local`: the one on the universal queue, for on-device copies."""
        key = (device, local)
        with self._lock:
            port = self._ports.get(key)
            if port is None:
                slot = self._slots[device]
                port = self._ports[key] = HostPort(slot, queue=slot.graphics_queue if local else None,
                                                   host_import=self._host_import)
            return port

    def transfer(self, src: int, dst: int) -> CrossDeviceTransfer:
        """The transfer from device `src` to device `dst`."""
        with self._lock:
            x = self._transfers.get((src, dst))
            if x is None:
                x = self._transfers[(src, dst)] = CrossDeviceTransfer(
                    self._slots[src], self._slots[dst], self.method(src, dst), slot_size=self._slot_size,
                    slot_count=self._slot_count)
            return x

    def create(self, device: int, size: int, made: list[Buffer], holds: Holds) -> tuple[Buffer, int]:
        """A new Buffer the InterGpuTransfer owns (on failure, the others in `made` are freed)."""
        try:
            buf = Buffer(self._slots[device], size)
        except BaseException:
            self.discard(made)
            raise
        made.append(buf)
        holds.own(buf)
        with self._lock:
            if len(self.owned) > 64:   # forget the ones the caller destroyed already
                self.owned = [b for b in self.owned if b.handle is not None]
            self.owned.append(buf)
        return buf, buf.handle_int

    def discard(self, made: list[Buffer]) -> None:
        """Free buffers made for an operation that failed before any GPU work."""
        with self._lock:
            self.owned = [b for b in self.owned if all(b is not m for m in made)]
        for b in made:
            b.destroy()
        made.clear()

    def detach(self, buffer: Buffer) -> bool:
        """Stop owning `buffer`; False when it is not one of the Buffers made here."""
        with self._lock:
            for k, b in enumerate(self.owned):
                if b is buffer:
                    del self.owned[k]
                    return True
        return False

    @contextmanager
    def settled(self, jobs: list[Any], dl: Deadline, made: list[Buffer]) -> Iterator[None]:
        """Around the body that queues `jobs`: then wait for them all. If the body
        fails, wait (quietly) for what it queued, free `made` when nothing ran, re-raise."""
        try:
            yield
        except BaseException as exc:
            wait_all(jobs, dl, quiet=True)
            if not jobs and isinstance(exc, NOTHING_RAN):
                self.discard(made)
            raise
        wait_all(jobs, dl)

    def destroy(self, dl: Deadline) -> None:
        """Free the transfers, ports and Buffers (vkmulti.TimeoutError keeps what is left)."""
        with self._lock:
            transfers, ports, owned = list(self._transfers.values()), list(self._ports.values()), list(self.owned)
        for x in transfers:
            x.destroy(dl.left())
        for p in ports:
            p.destroy(dl.left())
        for b in owned:
            b.destroy(dl.left())
        with self._lock:
            self._transfers, self._ports, self.owned = {}, {}, []
