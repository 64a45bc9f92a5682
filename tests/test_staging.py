"""StagingBuffers (memory/staging.py): a device's uploads reuse one host-visible
staging buffer instead of making and freeing one each (a restore's upload, a
failover's among them), within a bound, and never hand out one still in use."""
from __future__ import annotations

import numpy as np
import pytest

from kernel_support import runtime_fixture
from vkmulti.kernels import KernelSpec, pingpong_kernel
from vkmulti.memory.staging import MIN_BYTES, StagingBuffers

runtime = runtime_fixture(max_kernels=8)


def test_a_buffer_given_back_serves_the_next_take(manager):
    s = StagingBuffers(manager.slot(0), keep_bytes=1 << 20)
    try:
        a = s.take(100)
        assert a.size == MIN_BYTES and a.host_visible
        assert s.take(10) is not a   # (a is still taken: another one is made)
        s.give_back(a)
        b = s.take(MIN_BYTES)
        assert b is a and (s.made, s.reused) == (2, 1)
        big = s.take(2 << 20)   # past keep_bytes: exactly its size, not kept
        assert big.size == 2 << 20
        s.give_back(big)
        assert big.destroyed
        s.give_back(b)
    finally:
        s.destroy()
    assert b.destroyed


def test_the_larger_buffer_is_kept_and_a_closed_pool_keeps_none(manager):
    s = StagingBuffers(manager.slot(0))
    small, large = s.take(1), s.take(200_000)
    assert large.size == 256 << 10
    s.give_back(large)
    s.give_back(small)   # smaller than the one kept: freed
    assert small.destroyed and not large.destroyed
    s.destroy()
    assert large.destroyed
    other = StagingBuffers(manager.slot(0))
    late = other.take(1)
    s.give_back(late)   # given back to a destroyed pool: freed
    assert late.destroyed
    other.destroy()


def test_bad_arguments_are_refused_and_the_pool_stays_usable(manager):
    s = StagingBuffers(manager.slot(0))
    try:
        for bad in (0, -1, 1.5, "8", None, True):
            with pytest.raises(ValueError, match="nbytes must be a positive int"):
                s.take(bad)
        with pytest.raises(ValueError, match="keep_bytes"):
            StagingBuffers(manager.slot(0), keep_bytes=-1)
        b = s.take(64)
        with pytest.raises(ValueError, match="past the"):
            s.write(b, [(b.size - 2, np.zeros(4, np.uint8))])
        s.write(b, [(0, np.arange(8, dtype=np.uint8)), (16, np.frombuffer(b"\x09\x0a", np.uint8))])
        got = b.bytes[:18]
        assert got[:8].tolist() == list(range(8)) and got[16:18].tolist() == [9, 10]
        s.give_back(b)
        assert s.take(1) is b
        s.give_back(b)
    finally:
        s.destroy()


def test_restores_reuse_the_device_s_staging_buffer(runtime):
    spec = KernelSpec("pp", pingpong_kernel().spirv, state_sizes=(64, 4096))
    k = runtime.launch(spec, device=0, state=[bytes(range(64)), bytes(4096)])
    runtime.write_state(k, 1, np.full(4096, 7, np.uint8))
    cp = runtime.checkpoint(k)
    staging = runtime._context(1).staging
    before = (staging.made, staging.reused)
    for dev in (1, 0, 1):
        runtime.restore(cp, into=k, device=dev)
        assert runtime.read_state(k, 1).tobytes() == bytes([7]) * 4096
        assert runtime.read_state(k, 0).tobytes() == bytes(range(64))
    after = (staging.made, staging.reused)
    assert after[1] > before[1], f"the second restore onto GPU 1 made its staging buffer again: {before} -> {after}"


def test_an_upload_whose_run_fails_does_not_keep_its_buffer(runtime, monkeypatch):
    from vkmulti.errors import TimeoutError as VkmTimeout
    from vkmulti.kernels.lifecycle.image import upload

    spec = KernelSpec("pp", pingpong_kernel().spirv, state_sizes=(64, 256))
    k = runtime.launch(spec, device=0)
    ctx = k.ctx
    staging = ctx.staging
    failed = []

    def gave_up(record, waits=(), timeout=None, keep=(), users=()):
        failed.extend(keep)   # (the runner owns `keep` after a failed run: it frees them once the GPU is done)
        raise VkmTimeout("the upload's wait gave up")
    monkeypatch.setattr(ctx.runner, "run", gave_up)
    try:
        with pytest.raises(VkmTimeout):
            upload(ctx, k.states[1], 0, np.ones(256, np.uint8))
        monkeypatch.undo()
        assert failed and not failed[0].destroyed
        made = staging.made
        runtime.write_state(k, 1, np.full(256, 5, np.uint8))   # a new buffer, not the one the GPU may read
        assert staging.made == made + 1
        assert runtime.read_state(k, 1).tobytes() == bytes([5]) * 256
    finally:
        for b in failed:
            b.destroy()
