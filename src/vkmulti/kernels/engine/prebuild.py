"""Pipelines built ahead of need: after a kernel is launched, one background
thread builds its pipeline (and the runtime's own passes a move uses, such as
the CRC32 shader) on every device it may be moved or restored to, so that a
migration, a restore or a failover finds them built and compiles nothing on
its path. A move that comes while that build runs waits for it (the device
context never builds one pipeline twice).

`Prebuilder.devices` is the policy: None (every device of the manager, the
default), a tuple of device indices, or a callable(kernel) -> device indices;
an empty tuple turns it off. `reserve_bytes`: per device, the most bytes of
buffers made ahead for the twins of kernels that may move there (their first
move then allocates nothing, as a later one; 0: none).
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from collections import deque
from typing import Any, Callable, Iterable

from ..._core.checks import is_int, short_repr
from ..._core.lifetime import Deadline
from ...errors import DestroyedError, DeviceLostError, TimeoutError as VkmTimeout, VkmError
from .device_context import KERNEL_PUSH, kernel_types
from .spirv_gate import target_env_of, validate_kernel_spirv

log = logging.getLogger(__name__)

__all__ = ["Prebuilder", "PassSpec", "lower_priority", "join_worker", "BACKGROUND_NICE"]

#: (SPIR-V, entry point, descriptor types, push-constant bytes) of one pipeline
PassSpec = tuple[bytes, str, list, int]
#: ensure() remembers at most this many (spec, device, passes) it found built
_MAX_ENSURED = 1024
#: Prebuilder.reserve_bytes by default
DEFAULT_RESERVE_BYTES = 64 << 20


#: How much a background build thread lowers its CPU priority (Linux niceness).
BACKGROUND_NICE = 10


def lower_priority() -> None:
    """Lower the calling thread's CPU priority (Linux: its niceness, per thread), so
    a background compile leaves the cores to the steps (on a CPU device the steps
    run on the same cores); nothing where the system does not allow it."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE))
    except (AttributeError, OSError):
        pass


def join_worker(thread: threading.Thread | None, timeout: float, what: str) -> None:
    """Join a background worker told to stop (not from itself), bounded by `timeout` s;
    a warning naming `what` when it still runs then."""
    if thread is not None and thread is not threading.current_thread():
        thread.join(max(0.0, timeout))
        if thread.is_alive():
            log.warning("%s did not end within %.1f s of destroy()", what, timeout)


def _gate(spec: Any, ctx: Any, timeout: float | None) -> None:
    """The SPIR-V gate for the kernel module of `spec` on the device of `ctx` (remembered per module)."""
    validate_kernel_spirv(spec.spirv, spec.entry_point, len(spec.state_sizes), KERNEL_PUSH, target_env_of(ctx.slot),
                          timeout=timeout, label=f"the SPIR-V of kernel type {short_repr(spec.kernel_type)}")


def _kernel_pass_spec(spec: Any) -> PassSpec:
    return spec.spirv, spec.entry_point, kernel_types(len(spec.state_sizes)), KERNEL_PUSH


class Prebuilder:
    """The background pipeline builds of one runtime (see the module docstring).

    `context(index)` gives (making it if need be) the runtime's DeviceContext of
    a device; `device_count()` the manager's devices; `usable(index)` whether a
    device may take kernels (not lost); `extras(ctx)` the runtime's own passes a
    move onto that device builds (PassSpecs); `warm(index)` makes the rest of
    what a move onto that device uses (its CRC32 engine, its GPU jobs);
    `reserve(kernel, index, limit)` makes buffers for a twin of the kernel there;
    `pair(a, b)` makes what a move between two devices uses (the transfer
    links both ways, their rings touched), so the first move finds it made;
    `built(kernel)` is told once a kernel's builds ran (its twins come next); `live()` gives the
    runtime's live kernels: a device context keeps built the pipelines of those that may run
    there (`wanted`, which this builder installs on each context it builds on)."""

    def __init__(self, context: Callable[[int], Any], device_count: Callable[[], int],
                 usable: Callable[[int], bool], extras: Callable[[Any], list[PassSpec]],
                 warm: Callable[[int], Any] = lambda index: None,
                 reserve: Callable[[Any, int, int], Any] = lambda kernel, index, limit: None,
                 pair: Callable[[int, int], Any] = lambda a, b: None,
                 built: Callable[[Any], Any] = lambda kernel: None,
                 live: Callable[[], Iterable[Any]] = tuple):
        self._context, self._device_count, self._usable, self._extras = context, device_count, usable, extras
        self._warm, self._reserve, self._pair, self._built, self._live = warm, reserve, pair, built, live
        #: per device, the most bytes of twin buffers made ahead (0: none)
        self.reserve_bytes = DEFAULT_RESERVE_BYTES
        self._devices: Any = None
        self._cond = threading.Condition(threading.Lock())
        self._jobs: deque[tuple[Any, list[PassSpec], list[int]]] = deque()
        self._busy = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: pipelines this builder made (not found already built)
        self.built = 0
        #: (spec, context, extras) that ensure() found or made built: a later move asks again at no cost
        self._ensured: set[tuple[Any, Any, tuple]] = set()
        #: builds that failed (the move then builds the pipeline itself)
        self.failed = 0

    # -- policy ------------------------------------------------------------------------

    @property
    def devices(self) -> Any:
        """Where a kernel's pipelines are built ahead (see the module docstring)."""
        return self._devices

    @devices.setter
    def devices(self, value: Any) -> None:
        if value is not None and not callable(value):
            if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                raise TypeError(f"devices must be None, device indices or a callable, got {type(value).__name__}")
            value = tuple(value)
            for d in value:
                if not is_int(d) or d < 0:
                    raise ValueError(f"devices must be non-negative device indices, got {short_repr(d)}")
        self._devices = value

    def targets(self, kernel: Any) -> list[int]:
        """The devices the policy builds `kernel`'s pipelines on (usable ones only)."""
        policy, n = self._devices, self._device_count()
        chosen = range(n) if policy is None else (policy(kernel) if callable(policy) else policy)
        out = []
        for d in chosen:
            if is_int(d) and 0 <= d < n and d not in out and self._usable(d):
                out.append(int(d))
        return out

    # -- work ----------------------------------------------------------------------------

    def launched(self, kernel: Any) -> None:
        """Queue the builds of a kernel just launched (returns at once)."""
        devices = self.targets(kernel)
        if not devices:
            return
        with self._cond:
            if self._stopping:
                return
            self._jobs.append((kernel, [_kernel_pass_spec(kernel.spec)], devices))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="vkmulti-prebuild", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wanted(self, device: int) -> set[tuple[bytes, str, int]]:
        """(code, entry point, state buffers) of each live kernel that runs on `device` or
        may move there (the policy's targets)."""
        out = set()
        for k in self._live():
            if k is not None and not k.destroyed and (k.device_index == device or device in self.targets(k)):
                spec = k.spec
                out.add((spec.spirv, spec.entry_point, len(spec.state_sizes)))
        return out

    def _watch(self, ctx: Any) -> None:
        """Have `ctx` keep the pipelines of the kernels that may run on it (see wanted): once."""
        if getattr(ctx.wanted, "func", None) != self.wanted:
            ctx.wanted = functools.partial(self.wanted, ctx.index)

    def ensure(self, spec: Any, device: int, timeout: float | None) -> None:
        """Have the pipelines a move of a kernel of `spec` onto `device` needs built
        there: found built, waited for where a build of them runs, else built now.
        The caller holds no device lock."""
        ctx = self._context(device)
        self._watch(ctx)
        extras = list(self._extras(ctx))
        key = (spec, ctx, tuple((code, entry, tuple(types), push) for code, entry, types, push in extras))
        with self._cond:
            known = key in self._ensured
        if known and ctx.has_pass(*_kernel_pass_spec(spec)):   # (still built: a let-go one may be gone)
            ctx.check()
            return
        deadline = Deadline(timeout)
        _gate(spec, ctx, deadline.left())   # a checkpoint's code too: no driver sees a module the gate refuses
        for code, entry, types, push in [_kernel_pass_spec(spec)] + extras:
            ctx.build_pass(code, entry, types, push, deadline.left())
        with self._cond:
            if len(self._ensured) >= _MAX_ENSURED:
                self._ensured.clear()
            self._ensured.add(key)

    def wait_idle(self, timeout: float | None) -> None:
        """Wait until every queued build ran (vkmulti.TimeoutError after `timeout` s)."""
        deadline = Deadline(timeout)
        with self._cond:
            while self._jobs or self._busy:
                if deadline.expired():
                    raise VkmTimeout(f"the background pipeline builds did not finish within {timeout} s")
                self._cond.wait(deadline.slice())

    def _run(self) -> None:
        lower_priority()
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait(1.0)
                if self._stopping:
                    self._busy = False
                    self._cond.notify_all()
                    return
                kernel, passes, devices = self._jobs.popleft()
                self._busy = True
            try:
                self._build(kernel, passes, devices)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _build(self, kernel: Any, passes: list[PassSpec], devices: list[int]) -> None:
        for d in devices:
            if self._stopping:
                return
            try:
                if not self._usable(d):
                    continue
                ctx = self._context(d)
                self._watch(ctx)
                _gate(kernel.spec, ctx, 60.0)   # this device's target environment may differ from the launch's
                for code, entry, types, push in passes + list(self._extras(ctx)):
                    if self._stopping:
                        return
                    if not ctx.has_pass(code, entry, types, push):
                        ctx.build_pass(code, entry, types, push, 60.0)
                        self.built += 1
                self._warm(d)
                home = kernel.device_index
                if not kernel.destroyed and d != home:
                    self._pair(home, d)
                    if self.reserve_bytes > 0:
                        self._reserve(kernel, d, self.reserve_bytes)
            except DestroyedError:
                return
            except DeviceLostError as exc:   # (lost meanwhile: the failover says so; nothing moves there)
                self.failed += 1
                log.info("building a kernel's pipeline ahead on GPU %d stopped: %s", d, exc)
            except (VkmError, MemoryError) as exc:   # a full device, or the driver refused: a move there builds its own
                self.failed += 1
                log.warning("building a kernel's pipeline ahead on GPU %d failed: %s", d, exc)
        if not self._stopping:
            self._built(kernel)

    def destroy(self, timeout: float) -> None:
        """Drop the queued builds and join the thread (bounded by `timeout` s; a build
        that is running ends first, and the device context's destroy() waits for it)."""
        with self._cond:
            self._stopping = True
            self._jobs.clear()
            self._ensured.clear()
            self._cond.notify_all()
            thread = self._thread
        join_worker(thread, timeout, "a background pipeline build")
