"""Hot reload: ringkernel's HotReloadConfig, HotReloadState, HotReloadRequest,
HotReloadResult, HotReloadStats(Snapshot) and HotReloadManager, done for real
on vkmulti's SPIR-V kernels.

`execute_reload(request, kernel)` runs DRAINING -> CHECKPOINTING -> VALIDATING
-> COMPILING -> SWAPPING -> RESTORING -> COMPLETED. For runtime kernels
(`vkmulti.kernels.Kernel`, or a list of them, e.g. the slabs of one kernel on
several devices) it waits for their submitted steps, checks the SPIR-V
(header, the kernel ABI's bindings and entry point by reflection, and the
SPIR-V gate: spirv-val, required), builds the pipeline on every device where they live,
then swaps pipeline and descriptor set at a step boundary of the runtime
(no step is being recorded): the state buffers are not touched, so the state
is preserved byte for byte. The reload timeout bounds the whole operation
(waits, spirv-val, compilation); transient failures (a Vulkan error while
compiling) are retried `max_retries` times with exponential backoff from
`retry_backoff`: running out of memory; a driver that refuses the module
(any other Vulkan error) fails the reload at once. A failure sets FAILED, counts `failed_reloads` and leaves
the old code running. `rollback(id, steps)` goes back any number of the
`max_rule_history` versions kept, on the live kernels too.

A plain CheckpointableKernel (the seed's tests use a mock) gets the seed's
sequence without the simulated sleeps: checkpoint, validate, install in the
registry; a HotReloadableKernel also gets prepare_for_reload / apply_code /
resume_after_reload (and restore_from_checkpoint when preserving state).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, TypeAlias

from ...errors import (DestroyedError, KernelNotFoundError, KernelValidationError, TimeoutError as VkmTimeout,
                       VulkanError)
from ..checkpoint.format import Checkpoint
from ..._core.checks import int_in, short_repr, short_str
from ..engine.kernel import Kernel
from ..ids import KernelId, as_kernel_id
from .code_source import KernelCodeSource, validate_code
from .swap import check_for_kernels, clear_state, compile_on_devices, drain, let_steps_in, swap
from .types import (HotReloadConfig, HotReloadRequest, HotReloadResult, HotReloadState, HotReloadStats,
                    HotReloadStatsSnapshot)

log = logging.getLogger(__name__)

__all__ = ["HotReloadManager", "ReloadTarget"]


class ReloadTarget(Protocol):
    """A kernel that is not a vkmulti Kernel, as a hot reload acts on it: a CheckpointableKernel
    (its HotReloadableKernel methods, where it has them, swap the code in place)."""

    def create_checkpoint(self) -> Checkpoint: ...
    def restore_from_checkpoint(self, checkpoint: Checkpoint) -> None: ...
    def checkpoint_kernel_id(self) -> str: ...
    def checkpoint_kernel_type(self) -> str: ...


if TYPE_CHECKING:
    #: What reload, execute_reload and rollback act on: vkmulti Kernels (one or a list) or another kernel.
    Reloadable: TypeAlias = Kernel | Sequence[Kernel] | ReloadTarget

#: Vulkan results that may pass on another try (pools and memory run short for a while).
_TRANSIENT_RESULTS = frozenset({-1, -2, -12, -1000069000, -1000161000})   # out of host/device/pool memory, fragmented


def _transient(exc: BaseException) -> bool:
    """Whether a failure of compiling or swapping may pass on a retry: running out of
    memory may; a driver's refusal of the module (any other Vulkan error) is
    deterministic and fails the reload at once."""
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, VulkanError) and exc.result in _TRANSIENT_RESULTS


class _Entry:
    """One registered kernel id: its code, older versions, the live kernels it runs on
    (`code` None only in the entry of a request for an id not registered, until it succeeds)."""

    def __init__(self, code: KernelCodeSource | None, history: int):
        self.code = code
        self.history: deque[KernelCodeSource] = deque(maxlen=history)
        self.kernels: list[weakref.ref] = []
        self.lock = threading.Lock()
        self.active: HotReloadRequest | None = None

    def live_kernels(self) -> list[Any]:
        out = []
        for ref in self.kernels:
            k = ref()
            if k is not None and not getattr(k, "destroyed", False):
                out.append(k)
        return out


class HotReloadManager:
    """Hot reload of kernel code (see the module docstring). Thread-safe; one
    reload or rollback per kernel id at a time."""

    def __init__(self, config: HotReloadConfig | None = None):
        if config is None:
            config = HotReloadConfig()
        if not isinstance(config, HotReloadConfig):
            raise TypeError(f"config must be a HotReloadConfig, got {type(config).__name__}")
        self._config = dataclasses.replace(config)
        self._lock = threading.Lock()
        self._entries: dict[KernelId, _Entry] = {}
        self._unregistered: dict[KernelId, _Entry] = {}   # entries of reloads running for ids not registered
        self._version = 1
        self._stats = HotReloadStats()
        self._backend: Callable[[KernelId, KernelCodeSource | None, KernelCodeSource], Any] | None = None

    @classmethod
    def with_defaults(cls) -> "HotReloadManager":
        """A manager with HotReloadConfig() defaults."""
        return cls(HotReloadConfig())

    @classmethod
    def with_rule_backend(cls, config: HotReloadConfig,
                          backend: Callable[[KernelId, KernelCodeSource | None, KernelCodeSource], object]) \
            -> "HotReloadManager":
        """A manager whose swaps of kernels that are not vkmulti kernels go to
        `backend(kernel_id, old_code, new_code)` (the seed's rule swap backend; old_code
        is None for an id not registered); an exception from it fails the reload."""
        if not callable(backend):
            raise TypeError(f"backend must be callable(kernel_id, old_code, new_code), got {type(backend).__name__}")
        m = cls(config)
        m._backend = backend
        return m

    # -- registry ----------------------------------------------------------------------

    def _next_version(self) -> int:
        with self._lock:
            v = self._version
            self._version += 1
            return v

    def register_kernel(self, kernel_id: KernelId | str, code: KernelCodeSource) -> None:
        """Register (or re-register, replacing code and history) a kernel's current code; it
        gets the next version number (from 1)."""
        kid = as_kernel_id(kernel_id)
        if not isinstance(code, KernelCodeSource):
            raise TypeError(f"code must be a KernelCodeSource, got {type(code).__name__}")
        code = code.with_version(self._next_version())
        with self._lock:
            pending = self._unregistered.pop(kid, None)
            if pending is not None:   # a reload of the id runs: its entry (and lock) becomes the registered one
                pending.code = code
                pending.history.clear()
                self._entries[kid] = pending
            else:
                self._entries[kid] = _Entry(code, self._config.max_rule_history)

    def register_runtime_kernel(self, kernel: Kernel | Sequence[Kernel], kernel_id: KernelId | str | None = None) -> KernelId:
        """Register a vkmulti Kernel's current SPIR-V under `kernel_id` (default: its id)
        and remember the kernel, so reloads and rollbacks of that id reach it."""
        k = _check_runtime_kernels(kernel)[0]
        kid = as_kernel_id(kernel_id if kernel_id is not None else k.id)
        self.register_kernel(kid, KernelCodeSource.from_spirv(k.spec.spirv, k.spec.entry_point))
        self._entry(kid).kernels.append(weakref.ref(k))
        return kid

    def unregister_kernel(self, kernel_id: KernelId | str) -> None:
        """Forget a kernel's code, history and active request (unknown ids: nothing happens);
        a reload running then does not register it again."""
        with self._lock:
            self._entries.pop(as_kernel_id(kernel_id), None)
            self._unregistered.pop(as_kernel_id(kernel_id), None)

    def _entry(self, kernel_id: Any) -> _Entry:
        kid = as_kernel_id(kernel_id)
        with self._lock:
            e = self._entries.get(kid)
        if e is None:
            raise KernelNotFoundError(f"kernel {short_repr(kid.as_str())} is not registered for hot reload")
        return e

    def get_current_version(self, kernel_id: KernelId | str) -> int | None:
        """The current code version of a kernel, None if it is not registered."""
        with self._lock:
            e = self._entries.get(as_kernel_id(kernel_id))
        return None if e is None or e.code is None else e.code.version_id

    def get_current_code(self, kernel_id: KernelId | str) -> KernelCodeSource | None:
        """The current code of a kernel, None if it is not registered."""
        with self._lock:
            e = self._entries.get(as_kernel_id(kernel_id))
        return None if e is None else e.code

    def history(self, kernel_id: KernelId | str) -> list[KernelCodeSource]:
        """The older versions kept for rollback, oldest first."""
        return list(self._entry(kernel_id).history)

    def rule_registry(self) -> dict[KernelId, list[KernelCodeSource]]:
        """Every registered kernel's versions, oldest first, the current one last (the
        seed's registry of compiled rule versions; PTX rule artifacts have no
        Vulkan counterpart, the kernels' code versions are what vkmulti swaps)."""
        with self._lock:
            entries = dict(self._entries)
        return {kid: [*e.history, e.code] for kid, e in entries.items() if e.code is not None}

    def list_kernels(self) -> list[KernelId]:
        """The registered kernel ids."""
        with self._lock:
            return list(self._entries)

    def is_registered(self, kernel_id: KernelId | str) -> bool:
        """Whether a kernel id is registered."""
        with self._lock:
            return as_kernel_id(kernel_id) in self._entries

    def is_reload_in_progress(self, kernel_id: KernelId | str) -> bool:
        """Whether a reload or rollback of the kernel is running now."""
        kid = as_kernel_id(kernel_id)
        with self._lock:
            e = self._entries.get(kid) or self._unregistered.get(kid)
        return e is not None and e.active is not None and e.active.is_in_progress()

    def is_enabled(self) -> bool:
        """Whether hot reload is enabled (config.enabled)."""
        return self._config.enabled

    def config(self) -> HotReloadConfig:
        """A copy of the configuration."""
        return dataclasses.replace(self._config)

    def stats(self) -> HotReloadStatsSnapshot:
        """A snapshot of the counters."""
        return self._stats.snapshot()

    # -- reload ------------------------------------------------------------------------

    def request_reload(self, kernel_id: KernelId | str, new_code: KernelCodeSource) -> HotReloadRequest:
        """A request to move `kernel_id` to `new_code` (which gets the next version).
        KernelValidationError when hot reload is disabled or a reload of the kernel
        is in progress; KernelNotFoundError for an unregistered id."""
        kid = as_kernel_id(kernel_id)
        if not isinstance(new_code, KernelCodeSource):
            raise TypeError(f"new_code must be a KernelCodeSource, got {type(new_code).__name__}")
        if not self._config.enabled:
            raise KernelValidationError("Hot reload is disabled")
        entry = self._entry(kid)
        if entry.active is not None and entry.active.is_in_progress():
            raise KernelValidationError("Hot reload already in progress for this kernel")
        return HotReloadRequest(kid, new_code.with_version(self._next_version()))

    def reload(self, kernel: Reloadable, new_code: KernelCodeSource, kernel_id: KernelId | str | None = None) \
            -> HotReloadResult:
        """request_reload + execute_reload for `kernel` (registered under `kernel_id`,
        default: its id; a runtime kernel not yet registered is registered first)."""
        if kernel_id is None:
            kernel_id = getattr(kernel, "id", None) or kernel.checkpoint_kernel_id()  # type: ignore[union-attr]
        if not self.is_registered(kernel_id) and _is_runtime(kernel):
            self.register_runtime_kernel(kernel, kernel_id)  # type: ignore[arg-type]
        return self.execute_reload(self.request_reload(kernel_id, new_code), kernel)

    def execute_reload(self, request: HotReloadRequest, kernel: Reloadable) -> HotReloadResult:
        """Carry out `request` on `kernel` (see the module docstring); the request's
        state follows the phases. Errors propagate after FAILED is recorded. As in the
        seed, neither `enabled` (which gates request_reload) nor registration is
        checked: an id not registered has old_version 0 and is registered with the
        new code once the reload succeeds."""
        if not isinstance(request, HotReloadRequest):
            raise TypeError(f"request must be a HotReloadRequest, got {type(request).__name__}")
        targets = _check_runtime_kernels(kernel) if _is_runtime(kernel) else []
        if not targets and not callable(getattr(kernel, "create_checkpoint", None)):
            raise TypeError(f"kernel must be a vkmulti Kernel (or a list of them) or a CheckpointableKernel, "
                            f"got {type(kernel).__name__}")
        kid = request.kernel_id
        with self._lock:   # (reloads of one id not registered share its entry: one runs at a time)
            entry = self._entries.get(kid) or self._unregistered.setdefault(
                kid, _Entry(None, self._config.max_rule_history))
        if not entry.lock.acquire(blocking=False):
            raise KernelValidationError("Hot reload already in progress for this kernel")
        try:
            entry.active = request
            return self._execute(entry, request, kernel, targets)
        finally:
            entry.active = None
            with self._lock:
                if self._unregistered.get(kid) is entry:   # registered now, or failed: no longer pending
                    del self._unregistered[kid]
            entry.lock.release()

    def _execute(self, entry: _Entry, request: HotReloadRequest, kernel: Any, targets: list) -> HotReloadResult:
        cfg = self._config
        start = request.started_at = time.monotonic()
        deadline = start + cfg.reload_timeout
        code = request.new_code
        old = entry.code
        reloadable = not targets and all(callable(getattr(kernel, n, None)) for n in
                                         ("prepare_for_reload", "apply_code", "resume_after_reload"))
        prepared = False
        try:
            def left(phase: str) -> float:
                rest = deadline - time.monotonic()
                if rest <= 0:
                    raise VkmTimeout(f"hot reload of {short_repr(request.kernel_id.as_str())} did not finish within "
                                     f"{cfg.reload_timeout} s (reload_timeout; timed out while {phase})")
                return rest

            def done(phase: str) -> None:   # the end of a phase: the stepping threads run first
                left(phase)
                if targets:
                    let_steps_in()

            request.state = HotReloadState.DRAINING
            t0 = time.monotonic()
            if targets:
                drain(targets, lambda: left("draining"))
            elif reloadable:
                kernel.prepare_for_reload()
                prepared = True
                ready = getattr(kernel, "is_ready_for_reload", None)
                while callable(ready) and not ready():
                    time.sleep(min(0.001, left("draining")))
            drain_d = time.monotonic() - t0
            done("draining")

            request.state = HotReloadState.CHECKPOINTING
            t0 = time.monotonic()
            size = 0
            if cfg.preserve_state:
                if targets:
                    cps = [k.create_checkpoint() for k in targets]
                    request.checkpoint = cps[0] if len(cps) == 1 else cps
                    size = sum(c.total_size() for c in cps)
                else:
                    cp = kernel.create_checkpoint()
                    if not isinstance(cp, Checkpoint):
                        raise TypeError(f"create_checkpoint() returned {type(cp).__name__}, not a Checkpoint")
                    request.checkpoint = cp
                    size = cp.total_size()
            checkpoint_d = time.monotonic() - t0
            done("checkpointing")

            request.state = HotReloadState.VALIDATING
            if targets:
                check_for_kernels(code, targets, spirv_val=cfg.validate_before_swap,
                                  timeout=lambda: left("validating"))
            elif cfg.validate_before_swap:
                validate_code(code)
            done("validating")

            compile_d = swap_d = 0.0
            devices: list[int] = []
            attempt = 0
            while True:
                try:
                    request.state = HotReloadState.COMPILING
                    t0 = time.monotonic()
                    passes = None
                    if targets:
                        passes = compile_on_devices(code, targets, lambda: left("compiling"))
                    compile_d = time.monotonic() - t0
                    done("compiling")
                    request.state = HotReloadState.SWAPPING
                    t0 = time.monotonic()
                    if targets:
                        swap(targets, passes, code, lambda: left("swapping"))  # type: ignore[arg-type]
                        devices = sorted({k.device_index for k in targets})   # where they run the new code
                    elif reloadable:
                        kernel.apply_code(code)
                    elif self._backend is not None:
                        self._backend(request.kernel_id, old, code)
                    swap_d = time.monotonic() - t0
                    break
                except (VulkanError, MemoryError) as exc:
                    if attempt >= cfg.max_retries or not _transient(exc):
                        raise
                    attempt += 1
                    request.retry_count += 1
                    pause = min(cfg.retry_backoff * (2 ** (attempt - 1)), left("backing off before a retry"))
                    log.warning("hot reload of %r: attempt %d failed (%s); retrying in %.3f s",
                                request.kernel_id.as_str(), attempt, exc, pause)
                    time.sleep(pause)
                    left("backing off before a retry")
            self._install(entry, code, request.kernel_id)
            for k in targets:
                if all(r() is not k for r in entry.kernels):
                    entry.kernels.append(weakref.ref(k))

            request.state = HotReloadState.RESTORING
            t0 = time.monotonic()
            if targets and not cfg.preserve_state:
                clear_state(targets)
            elif reloadable and cfg.preserve_state and isinstance(request.checkpoint, Checkpoint):
                kernel.restore_from_checkpoint(request.checkpoint)
            if prepared:
                prepared = False
                kernel.resume_after_reload()
            restore_d = time.monotonic() - t0
        except BaseException as exc:
            request.state = HotReloadState.FAILED
            request.error = f"{type(exc).__name__}: {short_str(exc)}"
            self._stats.add(failed_reloads=1)
            if prepared:
                try:
                    kernel.resume_after_reload()
                except Exception:   # the reload's own error is the one to report
                    log.exception("resume_after_reload failed after a failed reload of %r", request.kernel_id)
            log.warning("hot reload of %r failed: %s", request.kernel_id.as_str(), request.error)
            raise
        request.state = HotReloadState.COMPLETED
        preserved = cfg.preserve_state and (size > 0 or bool(targets))
        self._stats.add(successful_reloads=1, total_drain_time=drain_d, total_compile_time=compile_d,
                        total_swap_time=swap_d, state_preserved_count=int(preserved))
        return HotReloadResult(request.kernel_id, 0 if old is None else old.version_id, code.version_id, preserved,
                               size, drain_d,
                               checkpoint_d, compile_d, swap_d, restore_d, time.monotonic() - start, devices,
                               attempt + 1)

    def _install(self, entry: _Entry, code: KernelCodeSource, kernel_id: KernelId) -> None:
        """Make `code` the entry's current code (the old one a fallback); an entry made for a
        request of an id not registered is registered now (unless the id was meanwhile)."""
        with self._lock:
            if self._config.keep_fallback and entry.history.maxlen and entry.code is not None:
                entry.history.append(entry.code)
            entry.code = code
            if self._unregistered.get(kernel_id) is entry:   # (not an id registered, or unregistered, meanwhile)
                self._entries.setdefault(kernel_id, entry)

    # -- rollback ----------------------------------------------------------------------

    def rollback(self, kernel_id: KernelId | str, steps: int = 1,
                 kernel: Reloadable | None = None) -> KernelCodeSource:
        """Go back `steps` versions (1: the previous one); the live kernels the id
        was reloaded on (or `kernel`) get that code at a step boundary. Returns
        the code now current. KernelValidationError("No fallback available") when
        fewer versions are kept; the registry is unchanged if applying fails."""
        int_in(steps, "steps", 1, 1 << 16)
        kid = as_kernel_id(kernel_id)
        with self._lock:
            entry = self._entries.get(kid)
        if entry is None:
            raise KernelValidationError(f"No fallback available: {short_repr(kid.as_str())} is not registered for "
                                        "hot reload")
        if not entry.lock.acquire(blocking=False):
            raise KernelValidationError("Hot reload already in progress for this kernel")
        current = entry.code
        assert current is not None   # (a registered entry always has its code)
        marker = HotReloadRequest(kid, current, HotReloadState.ROLLING_BACK)
        try:
            entry.active = marker
            if len(entry.history) < steps:
                raise KernelValidationError(f"No fallback available: {len(entry.history)} older version(s) kept "
                                            f"for {short_repr(kid.as_str())}, {steps} step(s) asked")
            target = entry.history[-steps]
            live = _check_runtime_kernels(kernel) if kernel is not None and _is_runtime(kernel) else \
                entry.live_kernels()
            live = [k for k in live if _is_runtime(k)]
            if live:
                deadline = time.monotonic() + self._config.reload_timeout

                def left() -> float:
                    rest = deadline - time.monotonic()
                    if rest <= 0:
                        raise VkmTimeout(f"rollback of {short_repr(kid.as_str())} did not finish within "
                                         f"{self._config.reload_timeout} s")
                    return rest
                swap(live, compile_on_devices(target, live, left), target, left)
            elif kernel is not None and callable(getattr(kernel, "apply_code", None)):
                kernel.apply_code(target)  # type: ignore[union-attr]
            elif self._backend is not None:
                self._backend(kid, current, target)
            with self._lock:
                for _ in range(steps):
                    entry.history.pop()
                entry.code = target
            self._stats.add(rollbacks=1)
            marker.state = HotReloadState.COMPLETED
            return target
        except BaseException:
            marker.state = HotReloadState.FAILED
            raise
        finally:
            entry.active = None
            entry.lock.release()

    def __repr__(self) -> str:
        return f"HotReloadManager({len(self._entries)} kernel(s), enabled={self._config.enabled})"


def _is_runtime(kernel: Any) -> bool:
    if isinstance(kernel, Kernel):
        return True
    return isinstance(kernel, (list, tuple)) and bool(kernel) and all(isinstance(k, Kernel) for k in kernel)


def _check_runtime_kernels(kernel: Any) -> list[Any]:
    items = [kernel] if isinstance(kernel, Kernel) else list(kernel)
    if not items or not all(isinstance(k, Kernel) for k in items):
        raise TypeError("expected a vkmulti Kernel or a non-empty list of them")
    for k in items:
        if k.destroyed:
            raise DestroyedError(f"kernel {short_repr(k.id)} was destroyed")
    return items
