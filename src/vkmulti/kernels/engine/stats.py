"""A kernel's counters (KernelStats): what its steps did, as the host saw them
when it harvested them."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..._core.reprs import compact_repr
from ..messages import HlcTimestamp

__all__ = ["KernelStats"]


@dataclass
class KernelStats:
    """Counters of one kernel (host view, up to the last harvested step)."""

    __repr__ = compact_repr

    steps_submitted: int = 0
    steps_completed: int = 0
    messages_consumed: int = 0
    messages_sent: int = 0
    messages_to_host: int = 0
    host_messages_sent: int = 0
    outbox_overflow: int = 0
    rejected: int = 0
    undeliverable: int = 0
    deferred_steps: int = 0
    clock: HlcTimestamp = field(default_factory=HlcTimestamp.zero)
