"""Shapes of the duck-typed values vkmulti's signatures take, for type checkers.

Nothing here runs: the names are Protocols (structural types, so any object
with these members fits) and aliases. Layers below the one that defines a
class name it through these instead (a DeviceSlot's helpers cannot import
vkmulti.memory, say).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from typing import TypeAlias

    import numpy as np
    from typing_extensions import Buffer
    #: Host bytes: any buffer-protocol object (PEP 688: bytes, bytearray, memoryview, array.array)
    #: or a numpy array (numpy's stubs do not say it is one).
    HostData: TypeAlias = Buffer | np.ndarray
    #: Bytes whose length is read first (checkpoint headers).
    BytesLike: TypeAlias = bytes | bytearray | memoryview

__all__ = ["Destroyable", "SlotChild", "GpuJob"]   # and HostData, for type checkers only


class Destroyable(Protocol):
    """An object with destroy() (a staging buffer, a renderer, a helper a slot caches)."""

    def destroy(self) -> None: ...


class SlotChild(Protocol):
    """A per-device helper a DeviceSlot caches (a transfer link, a command runner)."""

    def destroy(self, timeout: float | None = ...) -> None: ...


class GpuJob(Protocol):
    """GPU work a resource waits for before it is freed (a transfer's ticket, an abandoned submit)."""

    def gpu_done(self, device_index: int | None = None) -> bool: ...

    def gpu_wait(self, device_index: int | None, timeout: float | None) -> bool: ...
