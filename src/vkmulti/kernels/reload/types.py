"""ringkernel's hot-reload records: HotReloadConfig (the seed's defaults, with_*
setters, durations in seconds), HotReloadState, HotReloadRequest,
HotReloadResult and HotReloadStats / HotReloadStatsSnapshot. HotReloadManager
(manager.py) uses them."""
from __future__ import annotations

import dataclasses
import datetime
import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..._core.checks import int_in, short_repr, short_text
from ..checkpoint.format import Checkpoint
from ..ids import KernelId, as_kernel_id
from .code_source import KernelCodeSource
from ..._core.reprs import compact_repr, short_value

__all__ = ["HotReloadConfig", "HotReloadState", "HotReloadRequest", "HotReloadResult", "HotReloadStats",
           "HotReloadStatsSnapshot"]

#: The longest duration a float holds (a larger int cannot become one).
_MAX_SECONDS = 1.7976931348623157e308


def _seconds(value: Any, label: str) -> float:
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf") \
            or value > _MAX_SECONDS:
        raise ValueError(f"{label} must be a finite number of seconds >= 0 (or a timedelta), "
                         f"got {short_repr(value)}")
    return float(value)


def _flag(value: Any, label: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{label} must be a bool, got {type(value).__name__}")
    return value


@dataclass
class HotReloadConfig:
    """Hot reload settings (the seed's defaults; durations in seconds). `max_rule_history`:
    code versions kept per kernel for rollback (FIFO)."""

    __repr__ = compact_repr
    enabled: bool = True
    reload_timeout: float = 30.0
    preserve_state: bool = True
    max_retries: int = 3
    retry_backoff: float = 0.5
    validate_before_swap: bool = True
    keep_fallback: bool = True
    max_rule_history: int = 5

    def __post_init__(self) -> None:
        for name in ("enabled", "preserve_state", "validate_before_swap", "keep_fallback"):
            _flag(getattr(self, name), name)
        self.reload_timeout = _seconds(self.reload_timeout, "reload_timeout")
        self.retry_backoff = _seconds(self.retry_backoff, "retry_backoff")
        int_in(self.max_retries, "max_retries", 0, 1000)
        int_in(self.max_rule_history, "max_rule_history", 0, 1 << 16)

    @classmethod
    def new(cls) -> "HotReloadConfig":
        """The defaults (the seed's HotReloadConfig::new)."""
        return cls()

    def with_enabled(self, enabled: bool) -> "HotReloadConfig":
        """A copy with `enabled` set."""
        return dataclasses.replace(self, enabled=enabled)

    def with_timeout(self, timeout: float | datetime.timedelta) -> "HotReloadConfig":
        """A copy with `reload_timeout` set (seconds or timedelta)."""
        return dataclasses.replace(self, reload_timeout=timeout)  # type: ignore[arg-type]

    def with_preserve_state(self, preserve: bool) -> "HotReloadConfig":
        """A copy with `preserve_state` set."""
        return dataclasses.replace(self, preserve_state=preserve)

    def with_max_retries(self, retries: int) -> "HotReloadConfig":
        """A copy with `max_retries` set."""
        return dataclasses.replace(self, max_retries=retries)

    def with_retry_backoff(self, backoff: float | datetime.timedelta) -> "HotReloadConfig":
        """A copy with `retry_backoff` set (seconds or timedelta)."""
        return dataclasses.replace(self, retry_backoff=backoff)  # type: ignore[arg-type]

    def with_validate_before_swap(self, validate: bool) -> "HotReloadConfig":
        """A copy with `validate_before_swap` set."""
        return dataclasses.replace(self, validate_before_swap=validate)

    def with_keep_fallback(self, keep: bool) -> "HotReloadConfig":
        """A copy with `keep_fallback` set."""
        return dataclasses.replace(self, keep_fallback=keep)

    def with_max_rule_history(self, versions: int) -> "HotReloadConfig":
        """A copy with `max_rule_history` set."""
        return dataclasses.replace(self, max_rule_history=versions)


class HotReloadState(enum.Enum):
    """Where a reload is (execution order: DRAINING, CHECKPOINTING, VALIDATING,
    COMPILING, SWAPPING, RESTORING, then COMPLETED or FAILED)."""
    IDLE = "idle"
    DRAINING = "draining"
    CHECKPOINTING = "checkpointing"
    COMPILING = "compiling"
    VALIDATING = "validating"
    SWAPPING = "swapping"
    RESTORING = "restoring"
    COMPLETED = "completed"
    FAILED = "failed"
    ROLLING_BACK = "rolling_back"


@dataclass
class HotReloadRequest:
    """A reload of `kernel_id` to `new_code` and how far it got. Times are
    time.monotonic() values; `checkpoint` is what CHECKPOINTING captured."""
    kernel_id: KernelId
    new_code: KernelCodeSource
    state: HotReloadState = HotReloadState.IDLE
    created_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    retry_count: int = 0
    error: str | None = None
    checkpoint: Checkpoint | list[Checkpoint] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.kernel_id = as_kernel_id(self.kernel_id)
        if not isinstance(self.new_code, KernelCodeSource):
            raise TypeError(f"new_code must be a KernelCodeSource, got {type(self.new_code).__name__}")
        if not isinstance(self.state, HotReloadState):
            raise TypeError(f"state must be a HotReloadState, got {short_repr(self.state)}")

    def __repr__(self) -> str:
        return (f"HotReloadRequest({short_text(self.kernel_id)}, version {short_value(self.new_code.version_id, 24)}, "
                f"{self.state.name}, retries={short_value(self.retry_count, 24)})")

    @classmethod
    def new(cls, kernel_id: KernelId | str, new_code: KernelCodeSource) -> "HotReloadRequest":
        """A request in state IDLE (the seed's HotReloadRequest::new)."""
        return cls(kernel_id, new_code)  # type: ignore[arg-type]

    @property
    def checkpoint_data(self) -> bytes | None:
        """The captured checkpoint serialised (the seed kept these bytes)."""
        cp = self.checkpoint
        if cp is None:
            return None
        if isinstance(cp, list):
            return b"".join(c.to_bytes() for c in cp)
        return cp.to_bytes()

    def is_in_progress(self) -> bool:
        """Whether it is running (not IDLE, COMPLETED or FAILED; ROLLING_BACK counts)."""
        return self.state not in (HotReloadState.IDLE, HotReloadState.COMPLETED, HotReloadState.FAILED)

    def is_completed(self) -> bool:
        """Whether it completed."""
        return self.state is HotReloadState.COMPLETED

    def is_failed(self) -> bool:
        """Whether it failed."""
        return self.state is HotReloadState.FAILED

    def elapsed(self) -> float:
        """Seconds since the request was made."""
        return time.monotonic() - self.created_at

    def reload_elapsed(self) -> float | None:
        """Seconds since the reload started (None before)."""
        return None if self.started_at is None else time.monotonic() - self.started_at


@dataclass
class HotReloadResult:
    """What a completed reload did; durations in seconds. `devices`: where the
    new pipeline was built (runtime kernels), `attempts`: compile-and-swap tries."""
    kernel_id: KernelId
    old_version: int
    new_version: int
    state_preserved: bool
    checkpoint_size: int
    drain_duration: float
    checkpoint_duration: float
    compile_duration: float
    swap_duration: float
    restore_duration: float
    total_duration: float
    devices: list[int] = field(default_factory=list)
    attempts: int = 1

    def __repr__(self) -> str:
        return (f"HotReloadResult({short_text(self.kernel_id)}, v{short_value(self.old_version, 24)} -> "
                f"v{short_value(self.new_version, 24)}, "
                f"swap {self.swap_duration * 1e6:.0f} us, total {self.total_duration * 1e3:.2f} ms, "
                f"state_preserved={self.state_preserved})")


@dataclass
class HotReloadStatsSnapshot:
    """Counters and averages (seconds, over successful reloads, at least 1)."""
    successful_reloads: int = 0
    failed_reloads: int = 0
    rollbacks: int = 0
    avg_drain_time: float = 0.0
    avg_compile_time: float = 0.0
    avg_swap_time: float = 0.0
    state_preserved_count: int = 0

    def __repr__(self) -> str:
        v = short_value
        return (f"HotReloadStatsSnapshot(successful={v(self.successful_reloads, 24)}, failed={v(self.failed_reloads, 24)}, "
                f"rollbacks={v(self.rollbacks, 24)}, avg_swap={self.avg_swap_time * 1e6:.0f} us)")


class HotReloadStats:
    """The live counters behind HotReloadStatsSnapshot (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.successful_reloads = 0
        self.failed_reloads = 0
        self.rollbacks = 0
        self.total_drain_time = 0.0
        self.total_compile_time = 0.0
        self.total_swap_time = 0.0
        self.state_preserved_count = 0

    def add(self, **amounts: float) -> None:
        """Add to counters by name."""
        with self._lock:
            for k, v in amounts.items():
                setattr(self, k, getattr(self, k) + v)

    def __repr__(self) -> str:
        return f"HotReloadStats(successful={self.successful_reloads}, failed={self.failed_reloads})"

    def snapshot(self) -> HotReloadStatsSnapshot:
        """The snapshot (averages over successful reloads, at least 1)."""
        with self._lock:
            n = max(self.successful_reloads, 1)
            return HotReloadStatsSnapshot(self.successful_reloads, self.failed_reloads, self.rollbacks,
                                          self.total_drain_time / n, self.total_compile_time / n,
                                          self.total_swap_time / n, self.state_preserved_count)
