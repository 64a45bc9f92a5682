"""A lockdep-style check of the order locks are taken in (tests only).

install() replaces the locks the kernels, device and transfer layers make (every
threading.Lock/RLock/Condition made through their modules' `threading`, the device
slots' `children_lock`) by tracked ones, and makes entering a runtime's gate (shared or
exclusive) count as taking a lock of class "gate". A lock's class is where it is made
(module, class and attribute, e.g. "runtime/runtime.py:KernelRuntime._lock"); each kernel DeviceContext's
`lock` is of class "ctx", ordered by device index.

Each thread keeps the stack of the locks it holds. A blocking acquire while holding
others records, once per pair of classes, the edge (held class -> acquired class) with
the innermost frames of vkmulti that took it. A problem (in `problems`, with every
edge's stack) is:
- a cycle in the class graph (A->B seen somewhere and B->A elsewhere, or longer): two
  threads taking them in both orders can each hold what the other waits for;
- a ctx lock taken while holding the ctx lock of a higher device;
- two locks of one class (other than ctx) nested: no order between them is known.

Not edges: taking again an RLock (or the gate, shared) the thread already holds, and a
non-blocking acquire (acquire(False)): it gives up at once. A timed acquire
(acquire(timeout=t), or a bounded loop of them) records a timed edge: a cycle that
closes only through timed edges cannot hang (the timed side gives up, at worst after its
timeout) and goes to `timed_cycles` for review, not to `problems`. Waiting on a Condition
is not an edge (its waits are bounded slices here; a notifier is not a lock holder). Not
tracked: the native queue locks (QueueLock): leaves, nothing is taken while one is held
(vkapi.submit, the native submit paths), so no cycle goes through them.
$VKMULTI_LOCK_LOG, where set, names a file that gets every finding and, at exit, the edges.
"""
from __future__ import annotations

import linecache
import os
import re
import sys
import threading
import types
from contextlib import contextmanager
from typing import Any, Iterator

#: what went wrong, each with its stacks (read and cleared by conftest and kernel_races)
problems: list[str] = []
#: (held class, taken class) -> the frames that first took it so (blocking acquires)
edges: dict[tuple[str, str], str] = {}
#: the same for timed acquires (acquire(timeout=t), a bounded loop of them): no deadlock
timed_edges: dict[tuple[str, str], str] = {}
#: cycles that close only through timed edges: no deadlock, at worst a wait until one
#: side's timeout; kept for review, not failed
timed_cycles: list[str] = []
_graph: dict[str, set[str]] = {}
_timed_graph: dict[str, set[str]] = {}   # blocking and timed edges
_reported: set[frozenset] = set()
_tls = threading.local()
_real_lock, _real_rlock, _real_condition = threading.Lock, threading.RLock, threading.Condition
_LAYERS = ("vkmulti.kernels", "vkmulti.device", "vkmulti.transfer")
_SKIP = ("vkmulti.kernels.engine.gate",)   # the gate's own mutex: the gate is the class "gate"
_MAX_PROBLEMS = 20


def _held() -> list:
    held = getattr(_tls, "held", None)
    if held is None:
        held = _tls.held = []
    return held


def _frames(skip: int = 2, depth: int = 8) -> str:
    """The innermost `depth` frames of vkmulti's source, and the test's frame that led there."""
    out: list[str] = []
    f: Any = sys._getframe(skip)
    test = ""
    while f is not None:
        name = f.f_code.co_filename
        if "/vkmulti/" in name and "/tests/" not in name:
            if len(out) < depth:
                out.append(f"    {name.split('/vkmulti/', 1)[1]}:{f.f_lineno} {f.f_code.co_name}")
        elif "/tests/" in name and not name.endswith("/lock_order.py"):
            test = f"    (tests/{name.rsplit('/tests/', 1)[1]}:{f.f_lineno} {f.f_code.co_name})"
        f = f.f_back
    return "\n".join(out + ([test] if test else [])) + "\n"


def _log(text: str) -> None:
    """Append `text` to the file $VKMULTI_LOCK_LOG names, if any (the suite's every finding, for review)."""
    path = os.environ.get("VKMULTI_LOCK_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"==== pid {os.getpid()}\n{text}\n")


def _problem(text: str) -> None:
    _log(text)
    if len(problems) < _MAX_PROBLEMS:
        problems.append(text)


def _path(start: str, goal: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A path of classes start -> ... -> goal in `graph` (None: none)."""
    seen, todo = {start}, [[start]]
    while todo:
        path = todo.pop()
        for nxt in graph.get(path[-1], ()):
            if nxt == goal:
                return path + [nxt]
            if nxt not in seen:
                seen.add(nxt)
                todo.append(path + [nxt])
    return None


def _edge(a: str, b: str, timed: bool) -> None:
    """Record a -> b (new) and report the cycle it closes, if any."""
    stack = _frames(3)
    (timed_edges if timed else edges)[(a, b)] = stack
    if a == b:
        if not timed:
            _problem(f"two locks of class {a} nested (no order between them):\n{stack}")
        return
    back = None if timed else _path(b, a, _graph)
    if back is None:
        back, timed = _path(b, a, _timed_graph), True
    if not timed or (a, b) in edges:
        _graph.setdefault(a, set()).add(b)
    _timed_graph.setdefault(a, set()).add(b)
    if back is not None and (frozenset(back), timed) not in _reported:
        _reported.add((frozenset(back), timed))
        pairs = [(a, b)] + list(zip(back, back[1:]))
        text = [f"lock order cycle {' -> '.join([a] + back)}{' (through a timed acquire)' if timed else ''}:"]
        text += [f"  {x} -> {y} {'taken' if (x, y) in edges else 'tried with a timeout'} at:\n"
                 f"{edges.get((x, y)) or timed_edges[(x, y)]}" for x, y in pairs]
        if timed:
            timed_cycles.append("\n".join(text))
            _log("\n".join(text))
        else:
            _problem("\n".join(text))


def _check(lock: Any, held: list, timed: bool = False) -> None:
    """The edges from the classes held to `lock`'s (a blocking acquire; `timed`: with a timeout)."""
    cls, index = lock.cls, lock.index
    for h in held:
        if h is lock:
            continue
        if h.cls == cls and index is not None:
            if h.index is not None and h.index > index:
                _problem(f"GPU {index}'s lock taken while holding GPU {h.index}'s:\n{_frames(3)}")
            continue
        if (h.cls, cls) not in edges and (not timed or (h.cls, cls) not in timed_edges):
            _edge(h.cls, cls, timed)


class TrackedLock:
    """A threading.Lock (or, `reentrant`, an RLock) of class `cls` that records the
    order it is taken in (`index`: the ctx locks' device index)."""

    def __init__(self, cls: str, index: int | None = None, reentrant: bool = False):
        self._lock = _real_rlock() if reentrant else _real_lock()
        self.cls, self.index, self._reentrant = cls, index, reentrant
        self._in: list | None = None   # the held stack of the thread holding it

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        held = _held()
        if held and blocking and not (self._reentrant and self._lock._is_owned()):
            _check(self, held, timeout >= 0)
        ok = self._lock.acquire(blocking, timeout)
        if ok:
            held.append(self)
            self._in = held
        return ok

    def release(self) -> None:
        held = self._in if self._in is not None else _held()
        for i in range(len(held) - 1, -1, -1):
            if held[i] is self:
                del held[i]
                break
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()   # type: ignore[attr-defined]

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # a Condition over an RLock waits through these (a Lock's falls back to acquire/release)
    def _is_owned(self) -> bool:
        if self._reentrant:
            return self._lock._is_owned()
        return self._lock.locked()   # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        if name in ("_release_save", "_acquire_restore") and self._reentrant:
            return getattr(self, "_r" + name)
        raise AttributeError(name)

    def _r_release_save(self) -> Any:
        held = self._in if self._in is not None else _held()
        count = sum(1 for h in held if h is self)
        held[:] = [h for h in held if h is not self]
        return self._lock._release_save(), count

    def _r_acquire_restore(self, state: Any) -> None:
        inner, count = state
        self._lock._acquire_restore(inner)
        held = _held()
        held.extend([self] * count)
        self._in = held

    def __repr__(self) -> str:
        return f"<TrackedLock {self.cls}>"


_SITE = re.compile(r"([\w.\[\]]+)\s*(?::[^=]*)?=[^=]")


def _site_class(depth: int = 2) -> str:
    f = sys._getframe(depth)
    name = f.f_code.co_filename.split("/vkmulti/", 1)[-1]
    line = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    m = _SITE.match(line)
    owner = f.f_code.co_qualname.rpartition(".")[0]
    return f"{name}:{owner + '.' if owner else ''}{m.group(1).removeprefix('self.') if m else f.f_lineno}"


def _shim() -> types.ModuleType:
    """A `threading` whose Lock, RLock and Condition make tracked locks."""
    shim = types.ModuleType("threading")
    shim.__dict__.update(threading.__dict__)
    shim.Lock = lambda: TrackedLock(_site_class())   # type: ignore[attr-defined]
    shim.RLock = lambda: TrackedLock(_site_class(), reentrant=True)   # type: ignore[attr-defined]

    def condition(lock: Any = None) -> Any:
        return _real_condition(lock if lock is not None else TrackedLock(_site_class(), reentrant=True))
    shim.Condition = condition   # type: ignore[attr-defined]
    return shim


class _GateMark:
    """What a thread's held stack has while it is inside a gate."""
    cls, index = "gate", None

    def __repr__(self) -> str:
        return "<gate>"


def _install_gate() -> None:
    from vkmulti.kernels.engine import gate as gate_mod

    cls = gate_mod.RuntimeGate
    enter, leave, exclusive = cls.enter_shared, cls.leave_shared, cls.exclusive.__wrapped__   # type: ignore[attr-defined]

    def mark(self: Any) -> _GateMark:
        m = self.__dict__.get("_lockdep_mark")
        if m is None:
            m = self.__dict__["_lockdep_mark"] = _GateMark()
        return m

    def enter_shared(self: Any) -> tuple[int, bool]:
        held, m = _held(), mark(self)
        if held and not self._local.depth and self._writer != threading.get_ident():
            _check(m, held)
        token = enter(self)
        held.append(m)
        return token

    def leave_shared(self: Any, token: tuple[int, bool]) -> None:
        held, m = _held(), mark(self)
        for i in range(len(held) - 1, -1, -1):
            if held[i] is m:
                del held[i]
                break
        leave(self, token)

    @contextmanager
    def exclusive_(self: Any, timeout: float | None, what: str, closing: bool = False) -> Iterator[None]:
        held, m = _held(), mark(self)
        if held:
            _check(m, held)
        with contextmanager(exclusive)(self, timeout, what, closing):
            held.append(m)
            try:
                yield
            finally:
                held.remove(m)

    cls.enter_shared, cls.leave_shared, cls.exclusive = enter_shared, leave_shared, exclusive_   # type: ignore[method-assign]


def install() -> None:
    """From now on, the locks the kernels, device and transfer layers make are tracked."""
    import importlib
    import pkgutil

    import vkmulti
    from vkmulti.device import manager
    from vkmulti.kernels.engine import device_context

    cls = device_context.DeviceContext
    if getattr(cls, "_lock_order_checked", False):
        return
    shim = _shim()
    for info in pkgutil.walk_packages(vkmulti.__path__, "vkmulti."):
        if not info.name.startswith(_LAYERS) or info.name.startswith(_SKIP):
            continue
        try:
            mod = importlib.import_module(info.name)
        except ImportError:
            continue
        if getattr(mod, "threading", None) is threading:
            mod.threading = shim   # type: ignore[attr-defined]
    real = cls.__init__

    def init(self: Any, *args: Any, **kw: Any) -> None:
        real(self, *args, **kw)
        self.lock = TrackedLock("ctx", self.index)
        self.cond = device_context.StepCondition(self.lock)
    cls.__init__ = init   # type: ignore[method-assign]
    cls._lock_order_checked = True   # type: ignore[attr-defined]

    slot_init = manager.DeviceSlot.__init__

    def slot(self: Any, *args: Any, **kw: Any) -> None:
        slot_init(self, *args, **kw)
        self.children_lock = TrackedLock("device/manager.py:DeviceSlot.children_lock", reentrant=True)
    manager.DeviceSlot.__init__ = slot   # type: ignore[method-assign]
    _install_gate()
    if os.environ.get("VKMULTI_LOCK_LOG"):
        import atexit
        atexit.register(lambda: _log("edges:\n" + "".join(
            f"{a} -> {b}{' (timed)' if t else ''}\n" for t, es in ((0, edges), (1, timed_edges)) for a, b in es)))
