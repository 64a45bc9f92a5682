"""Error messages stay bounded, and stay the intended error, whatever a caller passes.

short_repr, which every message showing a caller's value goes through, and short_str
(the text of a caller's exception or name): bounded, never raising, and no more work
than the text they show. And the wrong types and huge numbers that got
AttributeError or OverflowError instead of a typed error.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import vkmulti
import vkmulti.kernels
from vkmulti import (Checkpoint, CheckpointBuilder, GpuConnection, GpuTopology, InterconnectType, KernelCodeFormat,
                     KernelCodeSource, LaunchOptions, MultiGpuCoordinator, ReferenceRenderer, ReferenceSRU,
                     SRUOffloadCoordinator, assign_srus)
from vkmulti._core.checks import short_repr, short_str
from vkmulti.cluster import split_rows_weighted
from vkmulti.kernels import format_topology

import test_fuzz_host
from hostile_values import HOSTILE, MB, ReprError, ReprRaises


# -- what the cases share ---------------------------------------------------------------------------

SPIRV = test_fuzz_host.SPIRV


def _checkpoint() -> Checkpoint:
    return CheckpointBuilder("k", "t").device_memory("m", b"abcd").build()


def _topology() -> GpuTopology:
    t = GpuTopology(2)
    t.set_connection(GpuConnection(0, 1, InterconnectType.PCIE))
    return t


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


# -- wrong types and huge numbers ---------------------------------------------------------------------

#: Calls that raised AttributeError or OverflowError (or allocated the number it was given)
#: where a wrong type or a number out of range should get a TypeError or ValueError.
TYPED_CASES: dict[str, tuple[Callable[[], Any], type[Exception]]] = {
    "Checkpoint.delta_from(base=1)": (lambda: Checkpoint.delta_from(1, _checkpoint()), TypeError),
    "Checkpoint.applied_with_delta(delta='x')": (lambda: Checkpoint.applied_with_delta(_checkpoint(), "x"), TypeError),
    "Checkpoint.get_device_memory(5)": (lambda: _checkpoint().get_device_memory(5), TypeError),
    "format_topology(3)": (lambda: format_topology(3), TypeError),
    "pair_methods(0, 1)": (lambda: vkmulti.pair_methods(0, 1), TypeError),
    "KernelCodeSource(hash=10**5000)": (lambda: KernelCodeSource(KernelCodeFormat.SPIRV, SPIRV.code, hash=10 ** 5000),
                                        TypeError),
    "KernelCodeSource(hash=2**40)": (lambda: KernelCodeSource(KernelCodeFormat.SPIRV, SPIRV.code, hash=1 << 40),
                                     TypeError),   # (bytes(2**40): a TiB allocated to compare with the digest)
    "assign_srus(cost=10**400)": (lambda: assign_srus([ReferenceSRU(1, 8, 8)], 2, cost=lambda s: 10 ** 400), ValueError),
    "assign_srus(weights=[10**400, 1])": (lambda: assign_srus([ReferenceSRU(1, 8, 8)], 2, weights=[10 ** 400, 1]),
                                          ValueError),
    "ReferenceSRU(color_a=10**400)": (lambda: ReferenceSRU(1, 8, 8, color_a=(10 ** 400, 0, 0)), TypeError),
    "GpuTopology.transfer_seconds(nbytes=10**400)": (lambda: _topology().transfer_seconds(0, 1, 10 ** 400), ValueError),
    "split_rows_weighted(10**400)": (lambda: split_rows_weighted(10 ** 400, [1.0]), ValueError),
}


@pytest.mark.parametrize("name", sorted(TYPED_CASES))
def test_wrong_types_and_huge_numbers_get_typed_errors(name):
    call, error = TYPED_CASES[name]
    with pytest.raises(error):
        call()


def test_wrong_types_and_huge_numbers_get_typed_errors_on_devices(manager):
    """The same on the virtual pair: a renderer's target, a compositor's scale, an SRU
    coordinator's weights and damping, a runtime's apply_code and run."""
    slot = manager.slot(0)
    renderer, compositor = ReferenceRenderer(slot), None
    rt = vkmulti.kernels.KernelRuntime(MultiGpuCoordinator.from_manager(manager), manager)
    try:
        with pytest.raises(TypeError):
            renderer.make_target(3)
        with pytest.raises(TypeError):
            compositor = vkmulti.Compositor(slot, content_scale=(10 ** 400, 1.0))
        for kw in (dict(weights=[10 ** 400, 1.0]), dict(adaptive_damping=10 ** 400)):
            with pytest.raises(TypeError):
                SRUOffloadCoordinator(manager, **kw)
        spec = vkmulti.kernels.counter_kernel(max_sources=4)
        k = rt.launch(spec, "c", device=0)
        for bad in (3, "nobody"):
            with pytest.raises((TypeError, vkmulti.KernelNotFoundError)):
                rt.apply_code(bad, KernelCodeSource.from_spirv(spec.spirv))
        with pytest.raises(TypeError):
            rt.apply_code(k, 3)
        with pytest.raises(ValueError):
            rt.run(1 << 64, k)
    finally:
        rt.destroy()
        renderer.destroy()
        if compositor is not None:
            compositor.destroy()
