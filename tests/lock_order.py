"""The device locks' order, checked: install() makes every kernel DeviceContext's lock
one that records a thread taking a device's lock (blocking) while it holds the lock of
a device with a higher index. Two such threads can deadlock (each holds what the other
waits for); the runtime takes device locks in index order only (finish_move sorts them),
so any such record is a defect even when no deadlock happened in that run."""
from __future__ import annotations

import threading
import traceback
from typing import Any

_held = threading.local()
problems: list[str] = []


class OrderedLock:
    """A threading.Lock that knows its device index and checks the order it is taken in."""

    def __init__(self, index: int):
        self._lock = threading.Lock()
        self.index = index

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        stack = _stack()
        if blocking:
            higher = [o.index for o in stack if o is not self and o.index > self.index]
            if higher and len(problems) < 20:
                problems.append(f"GPU {self.index}'s lock taken while holding GPU {max(higher)}'s:\n"
                                + "".join(traceback.format_stack()[-10:-1]))
        ok = self._lock.acquire(blocking, timeout)
        if ok:
            stack.append(self)
        return ok

    def release(self) -> None:
        stack = _stack()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is self:
                del stack[i]
                break
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _stack() -> list[OrderedLock]:
    stack = getattr(_held, "stack", None)
    if stack is None:
        stack = _held.stack = []
    return stack


def install() -> None:
    """From now on, every new DeviceContext's lock (and its condition) checks the order."""
    from vkmulti.kernels.engine import device_context

    cls = device_context.DeviceContext
    if getattr(cls, "_lock_order_checked", False):
        return
    real = cls.__init__

    def init(self: Any, *args: Any, **kw: Any) -> None:
        real(self, *args, **kw)
        self.lock = OrderedLock(self.index)
        self.cond = device_context.StepCondition(self.lock)
    cls.__init__ = init
    cls._lock_order_checked = True
