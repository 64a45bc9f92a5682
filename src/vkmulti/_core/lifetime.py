"""Lifetimes: who may still use an object that owns Vulkan objects, and when it may be freed.

Every owner (a MultiDeviceManager, and each Image, Buffer, transfer, port,
renderer or coordinator made on its devices) has a `Lifetime`. A public
operation runs inside ``with owner._life:``; `destroy()` runs inside
``with owner._life.ending(timeout) as deadline:``, which

1. closes the lifetime: operations that start from now on raise DestroyedError;
2. waits (bounded by `timeout`, interruptible) until the operations already
   running on other threads have returned, so nothing is freed under them;
3. lets the body free the objects (the body waits for queued GPU work with
   what is left of the deadline, and raises vkmulti.TimeoutError, keeping
   everything, when the GPU is not done);
4. marks the owner dead and forgets it in its parents.

A timeout or Ctrl-C in steps 2-3 opens the owner again (what was freed
stays freed, nothing the GPU may still touch was): it stays usable and
destroy() may be called again. An operation on a child counts in its parents too, so a
manager's destroy() waits for the operations of every object made on its
devices; its children (adopted at construction) are destroyed before any device.
"""
from __future__ import annotations

import functools
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, TypeVar

from ..errors import DestroyedError, VkmError
from .checks import timeout_seconds, short_repr
from ..errors import TimeoutError as VkmTimeoutError

__all__ = ["Deadline", "LazyEvent", "Lifetime", "operation", "destroy_idle"]

_F = TypeVar("_F", bound=Callable[..., Any])

#: Waits are cut into slices this long, so that Ctrl-C lands within one.
SLICE_SECONDS = 0.05

_OPEN, _CLOSING, _DEAD = 0, 1, 2
_get_ident = threading.get_ident


class Deadline:
    """An overall time limit shared by the waits of one operation (None: none)."""

    __slots__ = ("end", "timeout")

    def __init__(self, timeout: float | None):
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
                raise ValueError(f"timeout must be None or a non-negative number of seconds, got {short_repr(timeout)}")
        self.timeout = timeout
        seconds = timeout_seconds(timeout)   # (an int beyond any float: inf, no limit in effect)
        self.end = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        """Seconds left (never negative), or None for no limit."""
        return None if self.end is None else max(0.0, self.end - time.monotonic())

    def expired(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end

    def slice(self) -> float:
        """The next wait slice: at most SLICE_SECONDS, at most what is left."""
        left = self.left()
        return SLICE_SECONDS if left is None else min(SLICE_SECONDS, left)


class Lifetime:
    """Open, closing or dead; counts the operations running now (per thread).

    `what` names the owner in errors ("Buffer", "CrossDeviceTransfer");
    `parents` are the lifetimes an operation also counts in (the manager's).
    """

    __slots__ = ("owner", "what", "parents", "_chain", "_lock", "_cond", "_active", "_state", "_children",
                 "_end_lock", "_ender")

    def __init__(self, owner: Any, what: str, parents: Iterable["Lifetime | None"] = ()):
        self.owner = owner
        self.what = what
        self.parents = tuple(dict.fromkeys(p for p in parents if p is not None))
        # this lifetime, then every ancestor once: what an operation counts in
        self._chain: tuple[Lifetime, ...] = tuple(dict.fromkeys((self, *(a for p in self.parents for a in p._chain))))
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)   # drain() waits on it
        self._active: list[int] = []   # one entry per operation running now: its thread's id
        self._state = _OPEN
        self._children: dict[int, Any] = {}    # id -> adopted owner (destroyed with this one)
        self._end_lock = threading.Lock()
        self._ender: int | None = None   # the thread inside ending(), if any

    # -- state -----------------------------------------------------------------

    @property
    def open(self) -> bool:
        return self._state == _OPEN

    @property
    def dead(self) -> bool:
        return self._state == _DEAD

    def check(self) -> None:
        """Raise DestroyedError unless this and every parent are open."""
        if self._state != _OPEN:
            raise DestroyedError(f"{self.what} used after destroy()")
        for p in self.parents:
            if p._state != _OPEN:
                raise DestroyedError(f"{self.what} cannot be used: its {p.what} was destroyed")

    # -- operations ------------------------------------------------------------

    # The hot path (every public call). Each lock is taken by a with-statement, not
    # acquire()/try: a Ctrl-C between acquire() returning and the try would leave
    # the lock held for good.

    def _enter_own(self, who: str | None = None) -> None:
        with self._lock:
            if self._state != _OPEN:
                raise DestroyedError(f"{self.what} used after destroy()" if who is None else
                                     f"{who} cannot be used: its {self.what} was destroyed")
            self._active.append(_get_ident())

    def _exit_own(self) -> None:
        with self._lock:
            active = self._active
            active.remove(_get_ident())
            if not active and self._state != _OPEN:
                self._cond.notify_all()   # a destroy() waits in drain()

    def __enter__(self) -> "Lifetime":
        """Count an operation in this lifetime and every ancestor (_chain); DestroyedError,
        counting nothing, when one of them is no longer open."""
        me = _get_ident()
        chain = self._chain
        k = 0
        try:
            for life in chain:
                with life._lock:
                    if life._state != _OPEN:
                        raise DestroyedError(f"{self.what} used after destroy()" if life is self else
                                             f"{self.what} cannot be used: its {life.what} was destroyed")
                    life._active.append(me)
                k += 1
        except BaseException:
            for life in chain[:k]:
                life._exit_own()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        me = _get_ident()
        for life in self._chain:
            with life._lock:
                active = life._active
                active.remove(me)
                if not active and life._state != _OPEN:
                    life._cond.notify_all()   # a destroy() waits in drain()

    @property
    def active(self) -> int:
        """Operations running now, on every thread."""
        with self._cond:
            return len(self._active)

    # -- children --------------------------------------------------------------

    def adopt(self, child: Any) -> None:
        """Keep `child` (an owner with destroy(timeout=...)) until it is destroyed,
        and destroy it with this one. DestroyedError once this one is closed."""
        with self._cond:
            if self._state != _OPEN:
                raise DestroyedError(f"cannot make a {type(child).__name__}: its {self.what} was destroyed")
            self._children[id(child)] = child

    def forget(self, child: Any) -> None:
        with self._cond:
            self._children.pop(id(child), None)

    def children(self) -> list[Any]:
        """The adopted children still alive, oldest first."""
        with self._cond:
            return list(self._children.values())

    # -- the end ---------------------------------------------------------------

    def close(self) -> None:
        """Let no new operation start (idempotent; destroy() goes on with `ending`)."""
        with self._cond:
            if self._state == _OPEN:
                self._state = _CLOSING

    def drain(self, deadline: Deadline) -> None:
        """Wait until no operation of another thread is running (in slices, so
        Ctrl-C lands); vkmulti.TimeoutError when `deadline` passes first."""
        me = threading.get_ident()
        with self._cond:
            if me in self._active:
                raise VkmError(f"{self.what}.destroy() called from inside one of its own operations on the "
                               f"same thread; call it after the operation returns")
            while self._active:
                if deadline.expired():
                    n = len(self._active)
                    raise VkmTimeoutError(f"{self.what}: {n} operation(s) on other threads still running after "
                                          f"{deadline.timeout} s; nothing was freed (call destroy() again)")
                self._cond.wait(deadline.slice())

    @contextmanager
    def ending(self, timeout: float | None) -> Iterator[Deadline | None]:
        """For destroy(): yields the Deadline the body frees within, or None when
        the owner is already dead (nothing to do). See the module docstring."""
        deadline = Deadline(timeout)
        if self._ender == _get_ident():   # destroy() from inside this owner's own destroy() (a hook)
            yield None
            return
        while not self._end_lock.acquire(timeout=deadline.slice() or 0.001):
            if deadline.expired():   # another thread's destroy() is still running
                raise VkmTimeoutError(f"{self.what}: another destroy() still running after {timeout} s")
        self._ender = _get_ident()
        try:
            if self._state == _DEAD:
                yield None
                return
            self.close()
            try:
                self.drain(deadline)
                yield deadline
            except BaseException:
                with self._cond:   # nothing (or not everything) was freed: usable again
                    if self._state == _CLOSING:
                        self._state = _OPEN
                raise
            with self._cond:
                self._state = _DEAD
                self._children.clear()
            for p in self.parents:
                p.forget(self.owner)
        finally:
            self._ender = None
            self._end_lock.release()

    def keep(self) -> "_Keep":
        """``with life.keep():`` holds this owner alive for a wait on one of its
        objects (its destroy() waits), counting in this lifetime only, so it
        works while a parent (the manager) is being destroyed. DestroyedError
        unless this lifetime is open."""
        return _Keep(self)

    def __repr__(self) -> str:
        state = ("open", "closing", "dead")[self._state]
        return f"Lifetime({self.what}, {state}, active={self.active})"


class _Keep:
    __slots__ = ("life",)

    def __init__(self, life: Lifetime):
        self.life = life

    def __enter__(self) -> Lifetime:
        self.life._enter_own()
        return self.life

    def __exit__(self, *exc: object) -> None:
        self.life._exit_own()


def operation(method: _F) -> _F:
    """Run a method of an owner inside the owner's lifetime (``with self._life:``)."""
    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._life:
            return method(self, *args, **kwargs)
    return run  # type: ignore[return-value]


#: Guards making a LazyEvent's threading.Event (held for a few bytecodes)
_LAZY_LOCK = threading.Lock()


class LazyEvent:
    """set() / is_set() / wait(timeout) of a threading.Event that is made only when
    someone waits: an event that is set before anyone waits (or never waited on)
    costs a flag instead of an Event with its Condition and lock. Both start as
    class defaults: making one runs no __init__ (one per kernel step's batch)."""
    _event: threading.Event | None = None
    _set = False

    def set(self) -> None:
        self._set = True   # (no lock: a waiter that makes the event looks at the flag after, under the lock)
        event = self._event
        if event is not None:
            event.set()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        with _LAZY_LOCK:
            if self._event is None:
                self._event = threading.Event()
                if self._set:
                    self._event.set()
            event = self._event
        deadline = Deadline(timeout)   # in slices: Ctrl-C ends the wait
        while not event.wait(deadline.slice()):
            if deadline.expired():
                return False
        return True


def destroy_idle(owners: Iterable[Any]) -> list[Any]:
    """destroy(0) each of `owners` in turn (objects made on a manager's devices, which
    it adopted), after a call gave up on GPU work it queued (a timeout, Ctrl-C): those
    that work still uses raise vkmulti.TimeoutError and stay, whole, to their manager's
    destroy(), which waits for it; nothing is freed under it. Returns those kept."""
    kept = []
    for owner in owners:
        try:
            owner.destroy(0)
        except VkmError:
            kept.append(owner)
    return kept
