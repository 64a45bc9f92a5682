"""One-line reprs for every public class: a cheap watch over the whole test suite.

`install()` wraps the `__init__` of every public class (the `__all__` of
vkmulti, vkmulti.kernels and vkmulti.cluster) so that the first few instances
of each class any test builds have their repr taken once construction is done;
a repr of 200 characters or more, one with a line break, or one that raises is
recorded, and conftest's autouse fixture fails the test that built it. Errors
are watched the same way: a VkmError whose message embeds an object's default
repr ("<... object at 0x...>") or runs past 1000 characters is recorded.
"""
from __future__ import annotations

import enum
import functools
import inspect
import re
import threading
from typing import Any

#: Instances checked per class (the first ones built): enough to catch a long
#: repr, cheap on hot paths that build many.
PER_CLASS = 3
MAX_REPR = 200
MAX_MESSAGE = 1000
_DEFAULT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-f]+>")

problems: list[str] = []
_counts: dict[type, int] = {}
_lock = threading.Lock()


def public_classes() -> list[type]:
    """Every class named in the public `__all__` lists (exceptions and enums apart)."""
    import vkmulti
    import vkmulti.cluster
    import vkmulti.kernels

    out: dict[type, None] = {}
    for mod in (vkmulti, vkmulti.kernels, vkmulti.cluster):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj) and not issubclass(obj, (BaseException, enum.Enum)):
                out[obj] = None
    return list(out)


def check_repr(obj: Any) -> str | None:
    """None when repr(obj) is one line under MAX_REPR characters, else what is wrong."""
    try:
        text = repr(obj)
    except Exception as exc:   # recorded: a repr must never raise
        return f"repr({type(obj).__name__}) raised {type(exc).__name__}: {exc}"[:300]
    if len(text) >= MAX_REPR or "\n" in text:
        return f"repr({type(obj).__name__}) is {len(text)} characters{' over several lines' if chr(10) in text else ''}: {text[:120]}..."
    return None


def check_message(exc: BaseException) -> str | None:
    """None when an error's message names values (no object dumps), else what is wrong."""
    text = str(exc)
    if len(text) > MAX_MESSAGE:
        return f"{type(exc).__name__} message is {len(text)} characters: {text[:120]}..."
    if _DEFAULT_REPR.search(text):
        return f"{type(exc).__name__} message embeds a default object repr: {text[:160]}"
    return None


def _watch_init(cls: type) -> None:
    init = cls.__dict__.get("__init__")
    if init is None or getattr(init, "_repr_watch", False):
        return

    @functools.wraps(init)
    def watched(self: Any, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        t = type(self)
        if t.__init__ is not watched:   # an inner __init__ of a subclass's: the outer one checks
            return
        with _lock:
            n = _counts.get(t, 0)
            if n >= PER_CLASS:
                return
            _counts[t] = n + 1
        why = check_repr(self)
        if why:
            problems.append(why)

    watched._repr_watch = True
    cls.__init__ = watched


def _watch_errors() -> None:
    """Check the message of every VkmError once its base __init__ has stored it."""
    from vkmulti.errors import VkmError

    if "__init__" in VkmError.__dict__:
        return

    def watched(self: BaseException, *args: Any) -> None:
        Exception.__init__(self, *args)
        try:
            why = check_message(self)
        except Exception:   # __str__ of a subclass that is not fully built yet
            return
        if why:
            problems.append(why)

    watched._repr_watch = True
    VkmError.__init__ = watched


def install() -> None:
    """Wrap every public class's __init__ (idempotent)."""
    for cls in public_classes():
        _watch_init(cls)
    _watch_errors()


def take_problems() -> list[str]:
    """The problems recorded since the last call."""
    with _lock:
        out = list(problems)
        problems.clear()
    return out
