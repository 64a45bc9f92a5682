"""The chunk plans the links cut jobs into (vkm_plan_chunks)."""

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vkmulti import _native


@settings(max_examples=300, deadline=None)
@given(unit=st.sampled_from([1, 256, 30720, 8 * 1023]), units=st.integers(1, 64), chunks=st.floats(0.001, 200),
       ramps=st.integers(0, 4))
def test_plan_covers_the_job_in_whole_units_within_a_chunk(unit, units, chunks, ramps):
    chunk = unit * units
    size = max(1, int(chunk * chunks))
    b = _native.plan_chunks(size, chunk, unit, ramps)
    assert b[0] == 0 and b[-1] == size
    lens = [y - x for x, y in pairwise(b)]
    assert all(n > 0 for n in lens)
    assert all(n <= chunk for n in lens[:-1])
    assert lens[-1] <= chunk + unit  # the last chunk may also hold the remainder under a unit
    assert all(x % unit == 0 for x in b[:-1])
    # no more chunks than even ones plus the ramps at each end
    assert len(lens) <= -(-size // chunk) + 2 * ramps + 1


def test_ramps_halve_towards_both_ends():
    mib = 1 << 20
    b = _native.plan_chunks(256 * mib, 16 * mib, 256, 2)
    lens = [(y - x) // mib for x, y in pairwise(b)]
    assert lens[:2] == [4, 8] and lens[-2:] == [8, 4]
    assert max(y - x for x, y in pairwise(b)) <= 16 * mib
    b = _native.plan_chunks(256 * mib, 16 * mib, 256, 3)
    lens = [(y - x) // mib for x, y in pairwise(b)]
    assert lens[:3] == [2, 4, 8] and lens[-3:] == [8, 4, 2]


def test_small_jobs_get_fewer_ramp_steps():
    mib = 1 << 20
    # the middle is cut evenly
    even = _native.plan_chunks(20 * mib, 8 * mib, 256, 0)
    assert [y - x for x, y in pairwise(even)] == [6990592, 6990592, 6990336]
    # 20 MiB cannot hold two 8 MiB middles and a 4 MiB chunk at each end: no ramp
    assert _native.plan_chunks(20 * mib, 8 * mib, 256, 2) == even
    # 26 MiB can hold one step (4 MiB) at each end, not two (2 + 4 MiB)
    b = _native.plan_chunks(26 * mib, 8 * mib, 256, 2)
    lens = [y - x for x, y in pairwise(b)]
    assert lens[0] == lens[-1] == 4 * mib and sum(lens) == 26 * mib and len(lens) == 5


@pytest.mark.parametrize("args", [(0, 256, 256, 0), (1024, 100, 256, 0), (1024, 256, 0, 0), (1024, 256, 256, 5),
                                  (1024, 256, 256, -2)])
def test_bad_plans_are_refused(args):
    with pytest.raises(ValueError):
        _native.plan_chunks(*args)
