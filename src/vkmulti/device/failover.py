"""What a lost GPU cost: the counters SRUOffloadCoordinator and KernelRuntime keep
when they fail over (docs/explanation/failover.md)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .._core.reprs import short_value

__all__ = ["FailoverStats", "Recovery"]


@dataclass(frozen=True)
class Recovery:
    """One failover: the device lost, what was moved and how long it took.

    `seconds` runs from the moment the loss was noticed until the work it
    touched was whole again (the frame re-composited, the kernels restored and
    replayed up to the step in progress)."""

    device: int
    what: str
    seconds: float
    reason: str = ""

    def __repr__(self) -> str:
        return f"Recovery(GPU {short_value(self.device, 24)}, {self.seconds * 1e3:.2f} ms, {short_value(self.what, 82)})"


@dataclass
class FailoverStats:
    """Counters of one coordinator or runtime (read them any time; `snapshot()` copies)."""

    #: devices this object stopped using because they were lost, in order
    devices_lost: list[int] = field(default_factory=list)
    #: SRUs rendered again on the primary because their device was lost mid-frame
    srus_rerendered: int = 0
    #: frames composited a second time after a mid-frame loss
    frames_repaired: int = 0
    #: kernels brought back on a survivor from their latest checkpoint
    kernels_restored: int = 0
    #: steps run again by restored kernels (from their checkpoint to where the others were)
    steps_replayed: int = 0
    #: messages handed again to restored kernels (sent to them after their checkpoint)
    messages_replayed: int = 0
    #: checkpoints taken by the runtime's policy
    checkpoints_taken: int = 0
    recoveries: list[Recovery] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def lost(self, device: int) -> bool:
        """Record `device` as lost; False when it was already."""
        with self._lock:
            if device in self.devices_lost:
                return False
            self.devices_lost.append(device)
            return True

    def recovered(self, device: int, what: str, started: float, reason: str = "") -> Recovery:
        """Record a recovery that began at `started` (time.perf_counter())."""
        r = Recovery(device, what, time.perf_counter() - started, reason)
        with self._lock:
            self.recoveries.append(r)
        return r

    def __repr__(self) -> str:
        v = short_value
        return (f"FailoverStats(lost={v(self.devices_lost, 40)}, kernels_restored={v(self.kernels_restored, 20)}, "
                f"steps_replayed={v(self.steps_replayed, 20)}, messages_replayed={v(self.messages_replayed, 20)}, "
                f"srus_rerendered={v(self.srus_rerendered, 20)}, frames_repaired={v(self.frames_repaired, 20)}, "
                f"recoveries={len(self.recoveries)})")

    def snapshot(self) -> "FailoverStats":
        """A copy of the counters now (a plain FailoverStats that no longer changes)."""
        with self._lock:
            return FailoverStats(list(self.devices_lost), self.srus_rerendered, self.frames_repaired,
                                 self.kernels_restored, self.steps_replayed, self.messages_replayed,
                                 self.checkpoints_taken, list(self.recoveries))

    def as_dict(self) -> dict[str, Any]:
        """The counters as plain JSON-ready data."""
        s = self.snapshot()
        return {"devices_lost": s.devices_lost, "srus_rerendered": s.srus_rerendered,
                "frames_repaired": s.frames_repaired, "kernels_restored": s.kernels_restored,
                "steps_replayed": s.steps_replayed, "messages_replayed": s.messages_replayed,
                "checkpoints_taken": s.checkpoints_taken,
                "recoveries": [{"device": r.device, "what": r.what, "seconds": r.seconds, "reason": r.reason}
                               for r in s.recoveries]}
