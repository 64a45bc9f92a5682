"""Hostile values for the error-bound tests, and the check of what a call does with them.

HOSTILE: a 1 MB str, a list of a million ints, an object whose __repr__ raises, one
whose __repr__ returns 1 MB, a dict with a 1 MB key, and ints of 5000 digits,
positive and negative (Python refuses their str()). `check_positions` calls a
case with each of them in one argument position: the call may do its job; if it
raises, the error must be typed, its message at most MESSAGE_LIMIT characters, and
neither the __repr__'s error nor the int's refusal may have replaced it.
"""
from __future__ import annotations

from typing import Any, Callable

from vkmulti import VkmError
from vkmulti._core.checks import short_repr

import repr_watch

MESSAGE_LIMIT = 2000
TYPED = (ValueError, TypeError, IndexError, KeyError, VkmError)
MB = 1 << 20


class ReprError(Exception):
    """What ReprRaises's __repr__ raises: never the error a bad argument should get."""


class ReprRaises:
    def __repr__(self) -> str:
        raise ReprError("__repr__ of a caller's object raised")


class ReprHuge:
    def __repr__(self) -> str:
        return "r" * MB


HOSTILE: dict[str, Any] = {
    "str-1MB": "x" * MB,
    "list-1M": list(range(10 ** 6)),
    "repr-raises": ReprRaises(),
    "repr-1MB": ReprHuge(),
    "dict-key-1MB": {"k" * MB: 1},
    "int-5000-digits": 10 ** 5000,
    "negative-int-5000-digits": -10 ** 5000,
}


class Answer:
    """A callable argument that answers `value` (a selector, an sru_id or cost function)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self, *args: Any, **kw: Any) -> Any:
        return self.value

    def __repr__(self) -> str:
        return "Answer(...)"


def _in_chain(exc: BaseException, kinds: tuple[type, ...]) -> bool:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, kinds):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def outcome(fn: Callable[[], Any]) -> str | None:
    """None when fn() returns or raises a typed error with a bounded message of its own; else what is wrong."""
    try:
        fn()
    except TYPED as exc:
        try:
            text = str(exc)
        except Exception as inner:
            return f"str() of its {type(exc).__name__} raised {type(inner).__name__}"
        if len(text) > MESSAGE_LIMIT:
            return f"{type(exc).__name__} message of {len(text)} characters: {text[:150]}..."
        if _in_chain(exc, (ReprError,)):
            return f"{type(exc).__name__} came out of a caller's __repr__: {text[:150]}"
        if "Exceeds the limit" in text and "integer string conversion" in text:
            return f"the int's str() refusal replaced the intended error: {text[:150]}"
        return None
    except ReprError:
        return "the caller's __repr__ error replaced the intended one"
    except Exception as exc:
        return f"untyped {type(exc).__name__}: {short_repr(exc, 200)}"
    return None


def forget_reprs_of_junk() -> None:
    """Drop what repr_watch recorded about reprs: an object that does not check a field keeps
    the junk it was given and its repr shows it; that is no error message (VkmError messages
    repr_watch recorded stay, for conftest's guard)."""
    kept = [p for p in repr_watch.take_problems() if not p.startswith("repr(")]
    repr_watch.problems.extend(kept)


def _substitute(good: tuple[Any, ...], pos: int, value: Any) -> list[Any]:
    args = list(good)
    args[pos] = Answer(value) if isinstance(good[pos], Answer) else value
    return args


def check_positions(name: str, good: tuple[Any, ...], pos: int, call: Callable[[list[Any]], Any], *,
                    waits_for_ever: bool = False) -> None:
    """call(args) with each hostile value in position `pos` of `good`: bounded typed errors only.
    `waits_for_ever`: the position is a timeout of a wait for what never comes, where the huge
    positive int (no limit) is left out."""
    failures = []
    for kind, value in HOSTILE.items():
        if kind == "int-5000-digits" and waits_for_ever:
            continue
        why = outcome(lambda: call(_substitute(good, pos, value)))
        forget_reprs_of_junk()
        if why:
            failures.append(f"{kind}: {why}")
    assert not failures, f"{name}, argument {pos}:\n" + "\n".join(failures)
