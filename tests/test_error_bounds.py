"""Error messages stay bounded, and stay the intended error, whatever a caller passes.

short_repr, which every message showing a caller's value goes through, and short_str
(the text of a caller's exception or name): bounded, never raising, and no more work
than the text they show.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import vkmulti
from vkmulti import LaunchOptions
from vkmulti._core.checks import short_repr, short_str

from hostile_values import HOSTILE, MB, ReprError, ReprRaises


# -- short_repr itself ------------------------------------------------------------------------------


class _NotStr:
    def __repr__(self) -> Any:
        return 7


class _StrRepr(str):
    def __repr__(self) -> str:
        return "s" * MB


@pytest.mark.parametrize("value", [*HOSTILE.values(), _NotStr(), _StrRepr("a"), b"b" * MB, bytearray(MB),
                                   {i: str(i) for i in range(10 ** 5)}, set(range(10 ** 5)), frozenset(range(10 ** 5)),
                                   tuple(range(10 ** 5)), [ReprRaises()], {"a": ReprRaises()}, [[[[[[[[[[[[]]]]]]]]]]]],
                                   -(10 ** 5000)], ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("limit", [60, 200, 2000])
def test_short_repr_is_bounded_and_never_raises(value, limit):
    text = short_repr(value, limit)
    assert isinstance(text, str) and 0 < len(text) <= limit


def test_short_repr_shows_values_as_repr_does():
    loop: list[Any] = [1]
    loop.append(loop)
    for v in ["abc", 'q"\'', b"\x00", bytearray(b"ab"), 12, -3, 10 ** 50, 1.5, None, True, [1, "a", (2,)], (), (1,),
              {"a": [1, {2}]}, set(), {3}, frozenset(), frozenset({4}), loop, np.int64(5), LaunchOptions(),
              vkmulti.KernelId("k")]:
        assert short_repr(v, 200) == repr(v)
    assert short_repr("x" * 100) == repr("x" * 100)[:57] + "..."
    assert short_repr(list(range(100))) == repr(list(range(100)))[:57] + "..."
    assert short_repr({"k" * 100: 1}) == repr({"k" * 100: 1})[:57] + "..."
    assert "ReprRaises" in short_repr(ReprRaises()) and "ReprError" in short_repr(ReprRaises(), 200)
    assert short_repr(10 ** 5000) == "<int of 16610 bits>"


def test_short_str_is_bounded_and_never_raises():
    class StrRaises:
        def __str__(self) -> str:
            raise ReprError("__str__ of a caller's object raised")

    assert short_str("x" * MB) == "x" * 197 + "..." and short_str(ValueError("boom")) == "boom"
    assert short_str(StrRaises(), 80).startswith("<StrRaises object") and len(short_str(ReprRaises())) <= 200
    assert len(short_str(ValueError("e" * MB), 2000)) == 2000

def test_a_record_holding_a_callers_object_keeps_a_short_repr():
    """compact_repr (the public records' repr) shows a field through short_repr: a
    field whose repr raises or runs to 1 MB leaves the record's repr short."""
    for field in (ReprRaises(), HOSTILE["repr-1MB"], HOSTILE["list-1M"]):
        text = repr(vkmulti.CudaDevice(0, field, "n"))
        assert len(text) < 200 and text.startswith("CudaDevice(ordinal=0, uuid=")
