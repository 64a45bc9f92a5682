"""KernelMigrator: ringkernel's checkpoint-based kernel migration (MigrationResult,
MigrationStats, MigrationStatsSnapshot), live for runtime kernels.

`migrate_with_checkpoint(kernel, request)`:

* a runtime kernel (`vkmulti.kernels.Kernel`) is moved live by its runtime
  (live_migration.py): quiesce, state GPU to GPU with the pair's best
  transfer method, CRC32 compared on both GPUs, directory (and so the K2K
  router) rewired, messages sent meanwhile held and delivered after;
* any other CheckpointableKernel gets the seed's sequence: checkpoint, save
  under "migration_{kernel}_{src}_{dst}" in the storage, load it back
  (checked: CRC32 per chunk), complete the migration in the coordinator,
  delete the stored copy.

The request walks PENDING -> QUIESCING -> CHECKPOINTING -> TRANSFERRING ->
RESTORING -> COMPLETED; on any failure it is FAILED, `failed_migrations`
counts it, the kernel stays where it was (mapped there too) and
MigrationError says why (vkmulti.TimeoutError when `timeout` ran out;
KeyboardInterrupt at a Ctrl-C).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from ..._core.checks import short_repr, timeout_seconds, short_str, short_text
from ..._core.reprs import short_value
from ...errors import KernelNotFoundError, MigrationError
from ..checkpoint.format import Checkpoint
from ..checkpoint.storage import CheckpointStorage, MemoryStorage
from ..ids import KernelId, as_kernel_id
from ..engine.kernel import Kernel
from ..coordinator.records import DeviceUnregisterResult, KernelMigrationPlan, MigrationRequest, MigrationState

if TYPE_CHECKING:
    from ..coordinator.coordinator import MultiGpuCoordinator
    from .protocols import CheckpointableKernel


class KernelsById(Protocol):
    """Where carry_out finds the kernels of a plan: `kernel(kernel_id)` (a KernelRuntime)."""

    def kernel(self, kernel_id: KernelId | str) -> Kernel: ...

log = logging.getLogger(__name__)

__all__ = ["KernelMigrator", "MigrationResult", "MigrationStats", "MigrationStatsSnapshot", "PlanOutcome"]


@dataclass
class MigrationResult:
    """A completed migration; durations in seconds. The seed's fields, then the
    live path's: quiesce (steps drained, router idle), the CRC32 check, bytes
    moved GPU to GPU, messages carried over, the transfer method, and whether
    the CRC32s of source and destination matched (None: not checked)."""
    kernel_id: KernelId
    source_device: int
    target_device: int
    checkpoint_size: int
    checkpoint_duration: float
    transfer_duration: float
    restore_duration: float
    total_duration: float
    quiesce_duration: float = 0.0
    verify_duration: float = 0.0
    bytes_moved: int = 0
    messages_moved: int = 0
    transfer_method: str | None = None
    checksum_match: bool | None = None
    live: bool = False

    def __repr__(self) -> str:
        v = short_value
        return (f"MigrationResult({short_text(self.kernel_id)}, GPU {v(self.source_device, 24)} -> "
                f"{v(self.target_device, 24)}, {v(self.bytes_moved or self.checkpoint_size, 24)} bytes, "
                f"{self.total_duration * 1e3:.2f} ms, "
                f"{'live' if self.live else 'checkpoint'}, crc_match={self.checksum_match})")


@dataclass
class MigrationStatsSnapshot:
    """Counters and averages (seconds) over successful + failed migrations (0 when none)."""
    successful_migrations: int = 0
    failed_migrations: int = 0
    bytes_transferred: int = 0
    avg_checkpoint_time: float = 0.0
    avg_restore_time: float = 0.0

    def __repr__(self) -> str:
        v = short_value
        return (f"MigrationStatsSnapshot(successful={v(self.successful_migrations, 24)}, "
                f"failed={v(self.failed_migrations, 24)}, bytes={v(self.bytes_transferred, 24)}, avg_checkpoint={self.avg_checkpoint_time * 1e3:.3f} ms, "
                f"avg_restore={self.avg_restore_time * 1e3:.3f} ms)")


class MigrationStats:
    """The live counters behind MigrationStatsSnapshot (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.successful_migrations = 0
        self.failed_migrations = 0
        self.bytes_transferred = 0
        self.checkpoint_time = 0.0
        self.restore_time = 0.0

    def add(self, **amounts: float) -> None:
        """Add to counters by name."""
        with self._lock:
            for k, v in amounts.items():
                setattr(self, k, getattr(self, k) + v)

    @property
    def checkpoint_time_us(self) -> int:
        """The seed's counter: whole microseconds spent checkpointing, over all migrations."""
        return int(self.checkpoint_time * 1e6)

    @property
    def restore_time_us(self) -> int:
        """The seed's counter: whole microseconds spent restoring, over all migrations."""
        return int(self.restore_time * 1e6)

    def __repr__(self) -> str:
        return f"MigrationStats(successful={self.successful_migrations}, failed={self.failed_migrations})"

    def snapshot(self) -> MigrationStatsSnapshot:
        """The snapshot (averages over successful + failed migrations)."""
        with self._lock:
            n = self.successful_migrations + self.failed_migrations
            return MigrationStatsSnapshot(self.successful_migrations, self.failed_migrations, self.bytes_transferred,
                                          self.checkpoint_time / n if n else 0.0, self.restore_time / n if n else 0.0)


@dataclass
class PlanOutcome:
    """One planned migration of `carry_out`: the plan, and its result or error."""
    plan: KernelMigrationPlan
    result: MigrationResult | None = None
    error: BaseException | None = None

    def __repr__(self) -> str:
        what = "ok" if self.result is not None else f"failed: {type(self.error).__name__}"
        return (f"PlanOutcome({short_text(self.plan.kernel_id)}, GPU {self.plan.source_device} -> "
                f"{self.plan.target_device}, {what})")

    @property
    def ok(self) -> bool:
        """Whether the planned migration succeeded."""
        return self.result is not None


class KernelMigrator:
    """Moves kernels between devices with checkpoints (see the module docstring)."""

    def __init__(self, coordinator: MultiGpuCoordinator, storage: CheckpointStorage | None = None):
        for name in ("request_migration", "complete_migration", "get_kernel_device"):
            if not callable(getattr(coordinator, name, None)):
                raise TypeError(f"coordinator must be a MultiGpuCoordinator (it has no {name}()), "
                                f"got {type(coordinator).__name__}")
        if storage is None:
            storage = MemoryStorage()
        if not isinstance(storage, CheckpointStorage):
            raise TypeError(f"storage must have save, load, list, delete and exists (a CheckpointStorage), "
                            f"got {type(storage).__name__}")
        self._coordinator = coordinator
        self.storage = storage
        self._stats = MigrationStats()

    @classmethod
    def with_storage(cls, coordinator: MultiGpuCoordinator, storage: CheckpointStorage) -> "KernelMigrator":
        """A migrator that keeps its checkpoints in `storage` (the seed's with_storage)."""
        return cls(coordinator, storage)

    def coordinator(self) -> MultiGpuCoordinator:
        """The coordinator it completes migrations in."""
        return self._coordinator

    def stats(self) -> MigrationStatsSnapshot:
        """A snapshot of the counters."""
        return self._stats.snapshot()

    @property
    def live_stats(self) -> MigrationStats:
        """The counters themselves (the seed's MigrationStats)."""
        return self._stats

    # -- one migration -------------------------------------------------------------------

    def migrate_with_checkpoint(self, kernel: Kernel | CheckpointableKernel, request: MigrationRequest, *, timeout: float | None = 60.0,
                                verify: bool = True) -> MigrationResult:
        """Move `kernel` as `request` says (see the module docstring). `timeout` bounds
        the live path's waits; `verify=False` skips its CRC32 comparison."""
        if not isinstance(request, MigrationRequest):
            raise TypeError(f"request must be a MigrationRequest, got {type(request).__name__}")
        if not isinstance(verify, bool):   # (verify=None would quietly move without the CRC32 check)
            raise TypeError(f"verify must be a bool, got {type(verify).__name__}")
        timeout = timeout_seconds(timeout)   # (a bad one fails neither the request nor the stats)
        if request.state is not MigrationState.PENDING:
            raise MigrationError(f"request for {short_repr(request.kernel_id.as_str())} is {request.state.name}, not PENDING: "
                                 f"make a new one with coordinator.request_migration()")
        if isinstance(kernel, Kernel):
            if kernel.id != request.kernel_id:
                raise ValueError(f"the request moves {short_repr(request.kernel_id.as_str())}, the kernel is {short_repr(kernel.id)}")
            if kernel.runtime.coordinator is not self._coordinator:  # type: ignore[attr-defined]
                raise ValueError(f"kernel {short_repr(kernel.id)} is placed by another coordinator than this migrator's")
            try:
                result = kernel.runtime._migrate_live(kernel, request, timeout=timeout, verify=verify)  # type: ignore[attr-defined]
            except BaseException:
                request.state = MigrationState.FAILED
                self._stats.add(failed_migrations=1)
                raise
            self._stats.add(successful_migrations=1, bytes_transferred=result.bytes_moved,
                            checkpoint_time=result.checkpoint_duration, restore_time=result.restore_duration)
            return result
        for name in ("create_checkpoint", "checkpoint_kernel_id"):
            if not callable(getattr(kernel, name, None)):
                raise TypeError(f"kernel must be a vkmulti Kernel or a CheckpointableKernel (it has no {name}()), "
                                f"got {type(kernel).__name__}")
        return self._migrate_checkpointable(kernel, request)

    def _fail(self, request: MigrationRequest, text: str, exc: BaseException | None) -> MigrationError:
        request.state = MigrationState.FAILED
        self._stats.add(failed_migrations=1)
        err = MigrationError(text + (f": {short_str(exc)}" if exc is not None else ""))
        if exc is not None:
            err.__cause__ = exc
        return err

    def _migrate_checkpointable(self, kernel: Any, request: MigrationRequest) -> MigrationResult:
        start = time.monotonic()
        request.started_at = start
        request.state = MigrationState.QUIESCING
        prepared = False
        try:
            if callable(getattr(kernel, "prepare_for_migration", None)):
                kernel.prepare_for_migration()
                prepared = True
        except Exception as exc:
            raise self._fail(request, "Kernel quiesce failed", exc) from None
        request.state = MigrationState.CHECKPOINTING
        t0 = time.monotonic()
        try:
            cp = kernel.create_checkpoint()
            if not isinstance(cp, Checkpoint):
                raise TypeError(f"create_checkpoint() returned {type(cp).__name__}, not a Checkpoint")
        except Exception as exc:
            self._cancel(kernel, prepared)
            raise self._fail(request, "Checkpoint creation failed", exc) from None
        checkpoint_d = time.monotonic() - t0
        size = cp.total_size()
        request.state = MigrationState.TRANSFERRING
        t0 = time.monotonic()
        name = f"migration_{_safe(request.kernel_id.as_str())}_{request.source_device}_{request.target_device}"
        try:
            self.storage.save(cp, name)
        except Exception as exc:
            self._cancel(kernel, prepared)
            raise self._fail(request, "Checkpoint transfer failed", exc) from None
        transfer_d = time.monotonic() - t0
        request.state = MigrationState.RESTORING
        t0 = time.monotonic()
        try:
            loaded = self.storage.load(name)
            if loaded.metadata.kernel_id != cp.metadata.kernel_id or len(loaded.chunks) != len(cp.chunks):
                raise MigrationError("the stored checkpoint is not the one saved")
            self._coordinator.complete_migration(request)
        except Exception as exc:
            self._cancel(kernel, prepared)
            self._delete(name)
            raise self._fail(request, "Checkpoint restore failed", exc) from None
        restore_d = time.monotonic() - t0
        self._delete(name)
        request.state = MigrationState.COMPLETED
        self._stats.add(successful_migrations=1, bytes_transferred=size, checkpoint_time=checkpoint_d,
                        restore_time=restore_d)
        return MigrationResult(request.kernel_id, request.source_device, request.target_device, size, checkpoint_d,
                               transfer_d, restore_d, time.monotonic() - start)

    @staticmethod
    def _cancel(kernel: Any, prepared: bool) -> None:
        if prepared and callable(getattr(kernel, "cancel_migration", None)):
            try:
                kernel.cancel_migration()
            except Exception:   # the migration's own error is the one to report
                log.exception("cancel_migration failed after a failed migration")

    def _delete(self, name: str) -> None:
        try:
            self.storage.delete(name)
        except Exception:   # the seed ignores errors here too: the migration's outcome stands
            log.debug("could not delete migration checkpoint %r", name, exc_info=True)

    # -- unregister_device plans ----------------------------------------------------------

    def carry_out(self, result: DeviceUnregisterResult,
                  kernels: KernelsById | Mapping[KernelId, Kernel | CheckpointableKernel], *, timeout: float | None = 60.0,
                  verify: bool = True) -> list[PlanOutcome]:
        """Carry out the plans of `coordinator.unregister_device(...)` in one call:
        each planned kernel is migrated to its target, one after the other.
        `kernels`: a KernelRuntime (its kernels by id) or {kernel id: kernel}.
        unregister_device already mapped each kernel to its target; a migration
        that fails is reported in its PlanOutcome (the kernel keeps running on
        the source device, and can be moved again) and the others go on."""
        if not isinstance(result, DeviceUnregisterResult):
            raise TypeError(f"result must be a DeviceUnregisterResult, got {type(result).__name__}")
        timeout = timeout_seconds(timeout)   # (a bad one is the caller's error, not each plan's)
        outcomes = []
        for plan in result.kernels_to_migrate:
            outcome = PlanOutcome(plan)
            outcomes.append(outcome)
            try:
                kernel = _find(kernels, plan.kernel_id)
                request = self._plan_request(plan)
                outcome.result = self.migrate_with_checkpoint(kernel, request, timeout=timeout, verify=verify)
            except Exception as exc:
                outcome.error = exc
                log.warning("planned migration of %r from GPU %d to GPU %d failed: %s", plan.kernel_id.as_str(),
                            plan.source_device, plan.target_device, exc)
        return outcomes

    def _plan_request(self, plan: KernelMigrationPlan) -> MigrationRequest:
        """A PENDING request for a plan whose kernel unregister_device already mapped
        to the target (request_migration would refuse it: the source is offline)."""
        coord = self._coordinator
        now = coord.get_kernel_device(plan.kernel_id)
        if now is None:
            raise KernelNotFoundError(f"kernel {short_repr(plan.kernel_id.as_str())} is not mapped any more")
        if now != plan.target_device:
            raise MigrationError(f"kernel {short_repr(plan.kernel_id.as_str())} is mapped to GPU {now}, not to the plan's "
                                 f"target GPU {plan.target_device}: the plan is stale")
        topo = coord.topology()
        path = topo.best_path(plan.source_device, plan.target_device) if plan.source_device < topo.device_count \
            and plan.target_device < topo.device_count else [plan.source_device, plan.target_device]
        conn = topo.get_connection(plan.source_device, plan.target_device) \
            if max(plan.source_device, plan.target_device) < topo.device_count else None
        bw = conn.bandwidth_gbps if conn is not None and conn.bandwidth_gbps > 0 else 16.0  # type: ignore[operator]
        lat = conn.latency_us if conn is not None else 10.0
        return MigrationRequest(plan.kernel_id, plan.source_device, plan.target_device, path, bw, lat)  # type: ignore[arg-type]


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:120]


def _find(kernels: Any, kernel_id: KernelId) -> Any:
    kid = as_kernel_id(kernel_id)
    get = getattr(kernels, "kernel", None)
    if callable(get):
        return get(kid)
    if isinstance(kernels, dict):
        if kid in kernels:
            return kernels[kid]
        raise KernelNotFoundError(f"no kernel {short_repr(kid.as_str())} among those given")
    raise TypeError(f"kernels must be a KernelRuntime or a dict of kernel id -> kernel, got {type(kernels).__name__}")

