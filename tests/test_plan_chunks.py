"""The chunk plans links cut jobs into (vkm_plan_chunks)."""

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vkmulti._core import _native

U64 = (1 << 64) - 1


def _check_plan(b, size, chunk, unit):
    assert b[0] == 0 and b[-1] == size
    lens = [y - x for x, y in pairwise(b)]
    assert all(n > 0 for n in lens)
    assert all(n <= chunk for n in lens)
    assert all(x % unit == 0 for x in b[:-1])
    assert len(lens) == -(-size // max(lens))          # even: all chunks but the last are equal
    assert len(set(lens[:-1])) <= 1
    assert len(lens) == -(-size // chunk)              # no more chunks than needed


@settings(max_examples=300, deadline=None)
@given(unit=st.sampled_from([1, 256, 30720, 8 * 1023]), units=st.integers(1, 64), chunks=st.floats(0.001, 200))
def test_plan_covers_the_job_in_even_whole_units_within_a_chunk(unit, units, chunks):
    chunk = unit * units
    size = max(1, int(chunk * chunks))
    _check_plan(_native.plan_chunks(size, chunk, unit), size, chunk, unit)


def test_even_chunks():
    mib = 1 << 20
    assert [y - x for x, y in pairwise(_native.plan_chunks(20 * mib, 8 * mib, 256))] == [6990592, 6990592, 6990336]
    assert _native.plan_chunks(256 * mib, 16 * mib, 256) == [i * 16 * mib for i in range(17)]
    assert _native.plan_chunks(5, 8, 1) == [0, 5]


@pytest.mark.parametrize("size, chunk, unit", [
    (U64, 1 << 63, 256), (U64, U64 - 255, 256), (U64, (U64 // 256) * 256, 256), ((1 << 64) - 256, 1 << 60, 1 << 20),
    (U64, U64, 1), (U64 - 1, 3 << 60, 3 << 10), (1 << 63, 1 << 63, 1 << 63), (U64, 1 << 50, 1 << 20),
])
def test_sizes_near_2_to_the_64(size, chunk, unit):
    """Defect I: sizes near 2**64 wrapped the arithmetic and wrote past the plan's array."""
    _check_plan(_native.plan_chunks(size, chunk, unit), size, chunk, unit)


@settings(max_examples=100, deadline=None)
@given(size=st.integers(U64 - (1 << 40), U64), shift=st.integers(50, 63), unit_shift=st.integers(0, 20))
def test_any_size_near_2_to_the_64(size, shift, unit_shift):
    chunk, unit = 1 << shift, 1 << unit_shift
    _check_plan(_native.plan_chunks(size, chunk, unit), size, chunk, unit)


@pytest.mark.parametrize("args, error", [
    ((0, 256, 256), ValueError), ((1024, 100, 256), ValueError), ((1024, 256, 0), ValueError),
    ((1024, 384, 256), ValueError), ((-1, 256, 256), ValueError), ((1 << 64, 256, 256), ValueError),
    ((U64, 256, 256), ValueError),           # 2**56 chunks: more than a job may have
    ((1024.0, 256, 256), TypeError), ((None, 256, 256), TypeError), ((True, 256, 256), TypeError),
])
def test_bad_plans_are_refused(args, error):
    with pytest.raises(error):
        _native.plan_chunks(*args)


def test_the_chunk_limit_is_named():
    with pytest.raises(ValueError, match=f"at most {_native.MAX_CHUNKS}"):
        _native.plan_chunks(_native.MAX_CHUNKS * 256 + 1, 256, 256)
