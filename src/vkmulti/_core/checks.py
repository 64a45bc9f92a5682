"""The argument checks every layer shares: ints, counts, indices, numbers and timeouts.

One set, so that the same mistake gets the same typed error and the same
message wherever it is made. Each check returns the value in its canonical
type (a numpy integer comes back as an int), so callers write
``n = check_count(n, "n")``. `bool` is never an int here, and the value in a
message is shortened so that a huge argument cannot flood a log.
"""
from __future__ import annotations

import math
import threading
import operator
from typing import Any

__all__ = ["is_int", "short_repr", "short_str", "short_text", "int_in", "positive_int", "check_index", "check_count",
           "check_number", "timeout_seconds", "wait_bound", "seconds_text", "U32_MAX", "U64_MAX"]

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1


def is_int(value: Any) -> bool:
    """True for a Python int (not a bool); the predicate behind every int check."""
    return isinstance(value, int) and not isinstance(value, bool)


def short_repr(value: Any, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters (the cut ends in "..."); never raises.

    For a message about a value a caller gave: a long str or bytes and the built-in
    containers (lists, tuples, dicts, sets, however long or nested) are shown from
    their first items, without building the whole repr; an int too long for
    decimal is named by its size; a repr that raises or returns a non-str is
    replaced by the type's name, so the error being reported stays the one raised.
    """
    limit = max(limit, 3)
    try:
        text = _bounded(value, limit + 1, 0, set())
    except Exception:   # (not expected: _bounded catches what a value's own code raises)
        text = "<unprintable value>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def short_str(value: Any, limit: int = 200) -> str:
    """str(value), cut to `limit` characters like short_repr; never raises. For text that a
    caller's code made (the message of an exception it raised, a function's name), shown as
    it reads rather than quoted; a __str__ that raises is named by the type."""
    limit = max(limit, 3)
    try:
        if isinstance(value, str):
            text = str.__getitem__(value, slice(0, limit + 1))   # (a long str is not copied whole)
        else:
            text = str(value)
            text = text if type(text) is str else str.__str__(text)
    except Exception as exc:
        text = f"<{_type_name(value)} object; its str raised {type(exc).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def short_text(value: Any, limit: int = 40) -> str:
    """str(value) quoted, as a repr shows a name: short_str's cut to `limit` characters, then
    quoted; at most `limit` + 2 characters however many escapes the text needs. Never raises."""
    return short_repr(short_str(value, limit), limit + 2)


#: How deep nested containers are shown before "..." (the text is cut long before in practice).
_MAX_DEPTH = 24
#: The bits an int may have and still be written out in decimal (Python refuses past 4300 digits).
_INT_BITS = 12_000
_SLICED: dict[Any, Any] = {str.__repr__: str, bytes.__repr__: bytes, bytearray.__repr__: bytearray}


def _bounded(value: Any, room: int, depth: int, seen: set[int]) -> str:
    """repr(value), or a prefix of it at least `room` characters long, with no more work
    than that where the value is built in; never raises an Exception."""
    kind = type(value)
    try:
        rep: Any = kind.__repr__
        base: Any = _SLICED.get(rep)
        if base is not None:   # the base type's own slicing, not a subclass's
            return rep(base.__getitem__(value, slice(0, room)) if base.__len__(value) > room else value)
        if rep is int.__repr__:
            bits = int.bit_length(value)
            return rep(value) if bits <= _INT_BITS else f"<int of {bits} bits>"
        if rep in _SHAPES:
            if id(value) in seen or depth >= _MAX_DEPTH:   # (a container inside itself: repr's own "[...]")
                return "..." if rep in (set.__repr__, frozenset.__repr__) else _SHAPES[rep][1] + "..." + _SHAPES[rep][2]
            seen.add(id(value))
            try:
                return _container(value, rep, room, depth, seen)
            finally:
                seen.discard(id(value))
        text = repr(value)
        return text if type(text) is str else str.__str__(text)
    except Exception as exc:
        return f"<{_type_name(value)} object; its repr raised {type(exc).__name__}>"


def _type_name(value: Any) -> str:
    try:
        name = type(value).__name__
        return name if type(name) is str else "?"
    except Exception:   # (a metaclass's __name__ that raises)
        return "?"


def _container(value: Any, rep: Any, room: int, depth: int, seen: set[int]) -> str:
    """The start of a built-in container's repr: its items, shown until `room` is used up."""
    base: Any
    base, open_, close = _SHAPES[rep]
    count = base.__len__(value)
    if base in (set, frozenset) and (kind := type(value)) is not set:   # frozenset({..}), Sub({..})
        if not count:
            return f"{kind.__name__}()"
        open_, close = f"{kind.__name__}({{", "})"
    elif base is set and not count:
        return "set()"
    if base in (list, tuple):
        items: Any = (base.__getitem__(value, i) for i in range(count))
    else:
        items = iter(dict.items(value)) if base is dict else base.__iter__(value)
    out = open_
    n = 0
    for item in items:
        if len(out) >= room:
            return out
        if n:
            out += ", "
        if base is dict:
            out += _bounded(item[0], room - len(out), depth + 1, seen)[:room] + ": "
            item = item[1]
        out += _bounded(item, room - len(out), depth + 1, seen)[:room]
        n += 1
    return out + ("," if base is tuple and n == 1 else "") + close


_SHAPES: dict[Any, tuple[Any, str, str]] = {
    list.__repr__: (list, "[", "]"), tuple.__repr__: (tuple, "(", ")"), dict.__repr__: (dict, "{", "}"),
    set.__repr__: (set, "{", "}"), frozenset.__repr__: (frozenset, "{", "}"),
}


def int_in(value: Any, label: str, lo: int = 0, hi: int | None = U32_MAX) -> int:
    """An int in [lo, hi] (hi None: no upper bound); ValueError otherwise, wrong types included."""
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        top = "inf" if hi is None else hi
        raise ValueError(f"{label} must be an int in [{lo}, {top}], got {short_repr(value)}")
    return value


def positive_int(value: Any, label: str, hi: int | None = None) -> int:
    """An int >= 1 (and <= hi when given); ValueError otherwise."""
    return int_in(value, label, 1, hi)


def _index(value: Any, label: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{label} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{label} must be an int, got {type(value).__name__} {short_repr(value)}") from None


def check_index(value: Any, label: str) -> int:
    """A device index: a non-negative int (numpy integers too, never bool); TypeError / ValueError."""
    i = _index(value, label)
    if i < 0:
        raise ValueError(f"{label} must be >= 0, got {short_repr(i)}")
    return i


def check_count(value: Any, label: str, minimum: int = 0) -> int:
    """An int >= `minimum` (bytes, counts, sizes; numpy integers too); TypeError / ValueError."""
    i = _index(value, label)
    if i < minimum:
        raise ValueError(f"{label} must be >= {minimum}, got {short_repr(i)}")
    return i


def check_number(value: Any, label: str, *, positive: bool = False) -> float:
    """A finite float >= 0 (> 0 when `positive`); TypeError / ValueError. Bools (numpy's
    too) are not numbers here, and an int past float range is a ValueError."""
    if isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", None) == "b" \
            or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"{label} must be a number, got {type(value).__name__} {short_repr(value)}")
    try:
        f = float(value)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f) or f < 0 or (positive and f == 0):
        raise ValueError(f"{label} must be a finite number {'> 0' if positive else '>= 0'}, got {short_repr(value)}")
    return f


def timeout_seconds(value: Any, label: str = "timeout") -> float | None:
    """A timeout: None (wait as long as it takes) or a number of seconds >= 0; ValueError otherwise."""
    if value is None:
        return None
    if type(value) is float and value >= 0:   # (the common case, checked without calls; NaN fails >= 0)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise ValueError(f"{label} must be a number of seconds >= 0 or None, got {short_repr(value)}")
    try:
        return float(value)
    except OverflowError:   # an int beyond any float: longer than any wait
        return math.inf


def wait_bound(seconds: float | None) -> float | None:
    """A checked timeout (timeout_seconds') as Python's lock, event, future and process waits
    take it: None (no limit) where it is longer than they can express (inf, 10**400, a far
    deadline), which would raise OverflowError there."""
    return None if seconds is None or seconds >= threading.TIMEOUT_MAX else seconds


def seconds_text(value: Any) -> str:
    """A number of seconds for a message, rounded to the millisecond ("0.099", "30");
    what a wait was given may be the remainder of a deadline, with float noise."""
    if value is None:
        return "unbounded"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return short_repr(value)
    return f"{round(float(value), 3):g}"
