"""runtime.checkpoint() queues its copy under the device lock (no step comes in
between the image's step count and the copy) and waits for it without the lock,
so the device's other kernels go on stepping; a wait that gives up leaves the
copy's staging buffer to be freed once the copy is done, and the runtime usable."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from kernel_support import runtime_fixture
from vkmulti.errors import TimeoutError as VkmTimeout
from vkmulti.kernels.engine.gpu_jobs import GpuJobs

runtime = runtime_fixture(max_kernels=8)


def _counters(runtime):
    from vkmulti.kernels import counter_kernel
    from vkmulti.kernels.reference import counter_initial_state

    a = runtime.launch(counter_kernel(), "a", device=0, state=[counter_initial_state()])
    b = runtime.launch(counter_kernel(), "b", device=0, state=[counter_initial_state()])
    return a, b


def test_the_wait_does_not_hold_the_device_lock(runtime, monkeypatch):
    from vkmulti.kernels.reference import COUNTER_TAG_ADD, read_counter

    a, b = _counters(runtime)
    runtime.step(timeout=10)
    seen = []
    real = GpuJobs.wait

    def wait(self, point, timeout):   # another thread steps b on the same device meanwhile
        def other():
            runtime.send(b, np.array([5], np.uint32), tag=COUNTER_TAG_ADD)
            seen.append(runtime.step(b, timeout=10).launched)
        t = threading.Thread(target=other)
        t.start()
        t.join(20)
        seen.append(t.is_alive())
        return real(self, point, timeout)
    monkeypatch.setattr(GpuJobs, "wait", wait)
    cp = runtime.checkpoint(a)
    monkeypatch.setattr(GpuJobs, "wait", real)
    assert seen[-1] is False and len(seen[0]) == 1, seen   # b stepped while a's copy was awaited
    assert cp.metadata.current_step == a.steps
    runtime.synchronize(10)
    assert read_counter(runtime.read_state(b)).sum == 5


def test_a_wait_that_gives_up_parks_the_staging_until_the_copy_is_done(runtime, monkeypatch):
    a, _ = _counters(runtime)
    runtime.step(timeout=10)

    def gives_up(self, point, timeout):
        raise VkmTimeout("given up (test)")
    monkeypatch.setattr(GpuJobs, "wait", gives_up)
    with pytest.raises(VkmTimeout):
        runtime.checkpoint(a)
    monkeypatch.undo()
    life = runtime._lifecycle
    assert len(life._parked) == 1
    runtime.synchronize(10)
    life.extras(0).jobs.wait(life._parked[0][1], 10)
    runtime.step(timeout=10)   # each step frees what is done
    assert life._parked == []
    cp = runtime.checkpoint(a)   # usable
    assert cp.metadata.current_step == a.steps


def test_a_later_checkpoint_reuses_the_copy_buffer(runtime, monkeypatch):
    """A checkpoint's host-visible copy buffer is kept for the next one of the same size:
    a later checkpoint allocates none (and still reads the kernel's current bytes)."""
    from vkmulti.kernels.lifecycle import lifecycle
    from vkmulti.kernels.reference import COUNTER_TAG_ADD, read_counter

    a, _ = _counters(runtime)
    runtime.step(timeout=10)
    first = runtime.checkpoint(a)
    made = []
    real = lifecycle.MappedBuffer
    monkeypatch.setattr(lifecycle, "MappedBuffer", lambda *args, **kw: (made.append(args), real(*args, **kw))[1])
    runtime.send(a, np.array([7], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step(a, timeout=10)
    second = runtime.checkpoint(a)
    assert made == []
    assert second.metadata.current_step == first.metadata.current_step + 1
    runtime.synchronize(10)
    assert read_counter(runtime.read_state(a)).sum == 7
    assert second.to_bytes() != first.to_bytes()


def test_spare_copy_buffers_are_bounded_and_freed_after_destroy(runtime):
    """SpareBuffers keeps buffers up to `largest` bytes each and `total` in all; one
    given after destroy() is freed at once; a large kernel's checkpoint keeps none."""
    from vkmulti.kernels.engine.device_context import MappedBuffer
    from vkmulti.memory.staging import SpareBuffers

    slot = runtime.manager.slot(0)
    spares = SpareBuffers(largest=4096, total=8192)
    small = [MappedBuffer(slot, 4096) for _ in range(3)]
    big = MappedBuffer(slot, 8192)
    for b in small + [big]:
        spares.give(b)
    assert big.handle is None                     # too large: freed
    assert small[2].handle is None                # past the total: freed
    assert spares.take(0, 8192) is None
    got = [spares.take(0, 4096), spares.take(0, 4096)]
    assert {id(b) for b in got} == {id(small[0]), id(small[1])} and spares.take(0, 4096) is None
    spares.give(got[0])
    spares.destroy()
    assert got[0].handle is None
    spares.give(got[1])                           # after destroy(): freed, not kept
    assert got[1].handle is None
