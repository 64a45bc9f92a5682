"""The conversation between KernelRuntime and the K2K router, named.

The runtime may not import the router (it sits below it), so the runtime
publishes both halves here and each side calls only these methods:

* `OutboxFeed`: what the runtime asks of the router it hands messages to
  (the host-routed messages a kernel's step sends, the moves still waiting,
  a lost device).
* `RuntimePort`: what the router's delivery engine asks of the runtime
  (`KernelRuntime.inbound` implements it): batches handed to the kernels of
  a device and taken back, the kernels it looks up, the senders it tells of
  messages that could not be delivered.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeAlias, runtime_checkable

from ...memory.image import Buffer
from ..._core.timeline import TimelinePoint
from ..engine.kernel import InboundBatch, Kernel, OutboxBatch
from ..ids import KernelId

if TYPE_CHECKING:   # the names KernelRuntime's signatures use (runtime.py has no lines to spare)
    from numpy.typing import NDArray as NDArray
    from ..._core.protocols import HostData as HostData
    from ..._core.timeline import Points as Points
    from ...device.manager import MultiDeviceManager as MultiDeviceManager
    from ..coordinator.config import LaunchOptions as LaunchOptions
    from ..coordinator.coordinator import MultiGpuCoordinator as MultiGpuCoordinator
    from ..engine.prebuild import Prebuilder as Prebuilder
    from ..reload.code_source import KernelCodeSource as KernelCodeSource
    #: A kernel as the runtime's methods take it: the Kernel, or its id.
    KernelRef: TypeAlias = Kernel | KernelId | str

__all__ = ["OutboxFeed", "RuntimePort"]


@runtime_checkable
class OutboxFeed(Protocol):
    """The source of the messages the host routes on kernels' behalf (the K2K
    router), as the runtime's steps and its failover see it."""

    def take(self, kernel: Kernel, limit: int) -> list[tuple[bytes, Any]]:
        """Up to `limit` messages to send with `kernel`'s next step, as (packed slot, token) pairs."""

    def settle(self, kernel: Kernel, batch: OutboxBatch | None, taken: list[Any],
               returned: list[tuple[bytes, Any]]) -> None:
        """What became of a step's messages: the tokens `taken` left in `batch` (None: no
        step was submitted); the `returned` pairs did not fit and go first next time."""

    def flush(self) -> int:
        """Submit what can go of the moves still queued (as after a step without new
        batches); returns how many still wait for room on their edges."""

    def device_lost(self, index: int) -> None:
        """GPU `index` was lost: forget everything on its way to or from it, without touching it."""

    def detach(self, timeout: float | None = 30.0) -> None:
        """Let go of the runtime (its destroy() calls it first): stop what is on its way and
        free what lives on its devices, before the runtime frees its own device objects."""

    def quiet(self, kernels: list[Kernel]) -> bool:
        """Whether nothing is on its way to, from or for `kernels` now: a run may then step them
        natively, without taking messages for them or calling the feed at each step (asked
        with no device lock held; a message routed after it waits for the step after the run)."""


@runtime_checkable
class RuntimePort(Protocol):
    """What the K2K router's delivery engine asks of the runtime."""

    manager: Any

    @property
    def kernels(self) -> list[Kernel]:
        """The runtime's live kernels."""

    def kernel_by_address(self, address: int) -> Kernel | None:
        """The live kernel with this address, or None."""

    def accept_batch(self, device: int, buffer: Any, offset: int = 0, size: int | None = None, *,
                     wait: Any = None, source: Kernel | None = None, hops: int = 0, report_unknown: bool = True,
                     submitted: Callable[[float], Any] | None = None, reuse_sets: bool = False,
                     direct: Kernel | None = None, direct_slots: int | None = None,
                     lazy: bool = False) -> InboundBatch:
        """Hand the kernels of `device` a batch in `buffer` (see KernelRuntime.accept_batch)."""

    def accept_in_place(self, device: int, view: Any, batch: OutboxBatch, wait: list[TimelinePoint], hops: int,
                        direct: Kernel | None, direct_slots: int | None, lazy: bool) -> InboundBatch:
        """Hand the kernels of `device` an outbox batch of another device, read in place
        through `view` (that outbox's import on `device`)."""

    def withdraw_batch(self, batch: InboundBatch, *, timeout: float | None = 30.0) -> int:
        """Take an accepted batch back; returns the messages it had not delivered."""

    def let_go_batch(self, batch: InboundBatch) -> None:
        """An accepted batch holds nothing more for its device: no later step reads it, and
        it is done once the steps already submitted that read it are (never waits)."""

    def wait_reads(self, batches: list[InboundBatch], timeout: float | None) -> None:
        """Wait until the steps already submitted that read `batches` are done."""

    def forget_buffer(self, buffer: Buffer) -> None:
        """Drop the descriptor sets kept for `buffer` (batches accepted with reuse_sets=True)."""

    def poll(self) -> None:
        """Harvest every completed step without waiting."""

    def fail_delivery(self, kernel: Kernel, step: int, text: str) -> None:
        """A message `kernel`'s step `step` sent could not be delivered: its next step
        raises KernelMessageError naming `text` (dead letters once it is destroyed)."""

    def record_dead_letters(self, text: str, n: int) -> None:
        """Count `n` undeliverable messages whose sender cannot be told."""
