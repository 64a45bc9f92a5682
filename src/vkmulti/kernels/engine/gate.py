"""The runtime's gate: steps (and other calls that use kernels' device
resources) pass it shared; a migration's switch or a hot reload's swap takes
it exclusively, so that it happens between steps of the whole runtime. Also
the wait for a kernel that is held back (being migrated or reloaded)."""
from __future__ import annotations

import functools
import inspect
import math
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol, TypeVar

from ..._core.checks import timeout_seconds
from ...errors import DestroyedError, MigrationError, TimeoutError as VkmTimeout

__all__ = ["KernelHolds", "RuntimeGate", "at_rest", "gate_of", "gated", "gated_unheld"]


class KernelHolds(Protocol):
    """The holds of a runtime's kernels (its `holds`): a held kernel makes no step while
    a migration, restore or reload replaces its code or device resources."""

    def hold(self, kernel: Any, why: str, moving: bool = False) -> None:
        """Hold `kernel` back from stepping for `why` (`moving`: its device half is being replaced)."""

    def release(self, kernel: Any, why: str | None = None, moving: bool = False) -> None:
        """Let go of the hold `why` (None: every hold) on `kernel`."""

    def is_held(self, kernel: Any) -> bool:
        """Whether `kernel` is held now."""

    def is_moving(self, kernel: Any) -> bool:
        """Whether `kernel`'s device half is being replaced now."""

    def wait_unheld(self, kernel: Any, deadline: float) -> None:
        """Wait (until time.monotonic() `deadline`) for `kernel`'s moving holds to end."""


class _Depth(threading.local):
    """A thread's nesting of shared passes (0 until it first passes: read without a getattr default)."""
    depth = 0


class RuntimeGate:
    """A readers-writer gate: steps (and other calls that use kernels' device
    resources) pass shared; a migration's switch or a hot reload's swap takes it
    exclusively, so it happens between steps of the whole runtime. Writers go
    first (new readers wait while one waits); a thread that holds it shared may
    enter again."""

    def __init__(self) -> None:
        self._mutex = threading.RLock()   # (taken directly by the shared side: no Condition.__enter__)
        self._cond = threading.Condition(self._mutex)
        self._readers = 0
        self._writer: int | None = None
        self._waiting = 0
        self._closing = 0   # destroy()s waiting for or holding it: other writers give up (DestroyedError)
        self._local = _Depth()

    def enter_shared(self) -> tuple[int, bool]:
        """Pass the gate shared (what shared() does on entry); returns the token
        leave_shared() takes (a step's hot path: no generator-based context manager)."""
        local = self._local
        depth = local.depth
        counted = False
        writer = self._writer
        if depth == 0 and (writer is None or writer != threading.get_ident()):
            with self._mutex:
                while self._writer is not None or self._waiting:
                    self._cond.wait(0.25)
                self._readers += 1
            counted = True
        local.depth = depth + 1
        return depth, counted

    def leave_shared(self, token: tuple[int, bool]) -> None:
        """Undo the enter_shared() that returned `token`."""
        depth, counted = token
        self._local.depth = depth
        if counted:
            with self._mutex:
                self._readers -= 1
                if self._waiting:   # (a writer waits for the last reader; new readers wait only for writers)
                    self._cond.notify_all()

    @contextmanager
    def shared(self) -> Iterator[None]:
        token = self.enter_shared()
        try:
            yield
        finally:
            self.leave_shared(token)

    @contextmanager
    def exclusive(self, timeout: float | None, what: str, closing: bool = False) -> Iterator[None]:
        """Hold the gate alone. `closing` (the runtime's destroy()): writers waiting meanwhile
        raise DestroyedError, so that the holds they keep on kernels (a migration's, a
        restore's, a reload's) end before destroy() waits for them."""
        me = threading.get_ident()
        if self._local.depth:
            raise MigrationError(f"{what} cannot run inside a step of the same runtime (from a step listener): "
                                 f"call it after the step returned")
        if self._writer == me:
            raise MigrationError(f"{what} is already switching this runtime on this thread")
        deadline = time.monotonic() + (timeout if timeout is not None else 1e18)
        with self._cond:
            self._waiting += 1
            self._closing += closing
            try:
                while self._writer is not None or self._readers:
                    if self._closing and not closing:
                        raise DestroyedError(f"{what}: the runtime is being destroyed")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise VkmTimeout(f"{what}: steps of the runtime did not make way within {timeout} s")
                    self._cond.wait(min(left, 0.25))
                if self._closing and not closing:
                    raise DestroyedError(f"{what}: the runtime is being destroyed")
                self._writer = me
            except BaseException:
                self._closing -= closing
                raise
            finally:
                self._waiting -= 1
                self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._writer = None
                self._closing -= closing
                self._cond.notify_all()


@contextmanager
def at_rest(k: Any) -> Iterator[Any]:
    """k's device context with its lock held, once no failover is restoring k: from there
    until the lock is let go k neither moves (a move swaps its device half under the locks
    of both devices) nor runs a replayed step, so its queues, state buffers and device are
    those of its latest submitted step. The wait for a restore is bounded by the restore's
    own time (lifecycle.replay.RECOVERY_TIMEOUT), in slices (Ctrl-C ends it)."""
    while True:
        ctx = k.ctx
        ctx.lock.acquire()
        if k.ctx is ctx and not k.restoring:
            break
        try:
            if k.ctx is ctx:
                ctx.cond.wait(0.25)
        finally:
            ctx.lock.release()
    try:
        yield ctx
    finally:
        ctx.lock.release()


def gate_of(rt: Any) -> RuntimeGate:
    """The gate of a runtime (the RuntimeGate its __init__ builds as `gate`)."""
    return rt.gate


_F = TypeVar("_F", bound=Callable[..., Any])


def gated(fn: _F) -> _F:
    """Run a KernelRuntime method with the runtime's gate held shared (it touches
    kernels' device resources, which a migration's switch replaces)."""
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        gate = gate_of(self)
        token = gate.enter_shared()
        try:
            return fn(self, *args, **kwargs)
        finally:
            gate.leave_shared(token)
    return wrapper  # type: ignore[return-value]


def _kernel_arg(rt: Any, args: tuple, kwargs: dict) -> Any:
    kernel = args[0] if args else kwargs.get("kernel")
    try:
        return rt._resolve(kernel)
    except Exception:   # the method itself reports a bad argument
        return None


def gated_unheld(fn: _F) -> _F:
    """Like `gated`, for a method whose first argument is a kernel: it first waits
    (bounded by the call's keyword `timeout`, its default where not given; None: no limit)
    until no migration or restore is replacing that kernel's device resources, so it never
    acts on a half-moved kernel. The method then gets what is left of that timeout."""
    default = inspect.signature(fn).parameters["timeout"].default

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        timeout = timeout_seconds(kwargs.get("timeout", default))   # (a bad one is refused before any wait)
        deadline = time.monotonic() + (timeout if timeout is not None else 1e18)
        gate = gate_of(self)
        while True:
            k = _kernel_arg(self, args, kwargs)
            if k is not None:
                self.holds.wait_unheld(k, deadline)
            with gate.shared():
                if k is None or not self.holds.is_moving(k):
                    if timeout is not None and math.isfinite(timeout):   # (one deadline for the whole call)
                        kwargs["timeout"] = max(0.0, deadline - time.monotonic())
                    return fn(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]
