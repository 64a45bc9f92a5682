"""Kernel pipelines no kernel holds are let go (kernels/engine/device_context.py,
hold_pass/release_pass): a device keeps the newest MAX_UNUSED_PASSES of them
built (a reload back or a rollback finds them) and destroys older ones once no
step can bind them, so a process that hot-reloads code many times does not
grow without bound; a pipeline a kernel holds, or that a live kernel may move
to its device with, is never destroyed; code whose pipeline was let go is built
again when it comes back. Virtual GPU pair."""
from __future__ import annotations

import struct

import numpy as np

from kernel_support import runtime_fixture
from vkmulti.kernels import KernelCodeSource, counter_kernel
from vkmulti.kernels.engine import device_context
from vkmulti.kernels.engine.device_context import KERNEL_PUSH, MAX_UNUSED_PASSES
from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state, read_counter

MAX = 32
runtime = runtime_fixture(max_kernels=MAX)


def code(tag: int) -> KernelCodeSource:
    raw = bytearray(counter_kernel(max_sources=MAX).spirv)
    struct.pack_into("<I", raw, 8, tag)   # another generator word: the same program, new bytes
    return KernelCodeSource.from_spirv(bytes(raw))


def kernel_passes(ctx):
    with ctx.pass_lock:
        return [p for p in ctx.passes.values() if p.push_bytes == KERNEL_PUSH]


def add(rt, k, n):
    rt.send(k, np.array([n], np.uint32), tag=COUNTER_TAG_ADD)
    rt.step(k)
    rt.synchronize()


def test_reloading_many_times_keeps_a_bounded_number_of_pipelines(runtime):
    base = counter_kernel(max_sources=MAX)
    k = runtime.launch(base, "k", device=0, state=[counter_initial_state(MAX)])
    other = runtime.launch(base, "other", device=0, state=[counter_initial_state(MAX)])   # holds the first code
    ctx = k.ctx
    first = k.kernel_pass
    total = 0
    for i in range(MAX_UNUSED_PASSES + 6):
        k.apply_code(code(0xE000 + i), timeout=60)
        add(runtime, k, i + 1)
        total += i + 1
        runtime.prebuild.wait_idle(60)
        assert runtime.ready_twins.wait_idle(60)
        held = {id(k.kernel_pass), id(other.kernel_pass)}
        idle = [p for p in kernel_passes(ctx) if id(p) not in held]
        assert len(idle) <= MAX_UNUSED_PASSES + 1   # (the newest one let go may still wait for its step)
    assert ctx.unused.evicted >= 5
    assert other.kernel_pass is first and first.pipeline is not None   # held: never destroyed
    add(runtime, other, 7)
    assert read_counter(runtime.read_state(other)).sum == 7
    assert read_counter(runtime.read_state(k)).sum == total
    # code whose pipeline was destroyed long ago comes back: built again, and it runs
    k.apply_code(code(0xE000), timeout=60)
    add(runtime, k, 1000)
    assert read_counter(runtime.read_state(k)).sum == total + 1000


def test_a_destroyed_kernel_lets_its_pipeline_go(runtime):
    k = runtime.launch(counter_kernel(max_sources=MAX), "k", device=0, state=[counter_initial_state(MAX)])
    p = k.kernel_pass
    assert p.users == 1 and p.key not in k.ctx.unused.passes
    runtime.destroy_kernel(k)
    assert p.users == 0 and p.key in k.ctx.unused.passes and p.pipeline is not None   # kept: among the newest


def test_a_pipeline_a_live_kernel_may_move_with_stays_built(runtime, monkeypatch):
    runtime.ready_twins.enabled = False   # (no twin holds the pipelines on GPU 1)
    base = counter_kernel(max_sources=MAX)
    a = runtime.launch(base, "a", device=0, state=[counter_initial_state(MAX)])
    add(runtime, a, 3)
    runtime.prebuild.wait_idle(60)
    runtime.migrate(a, 1)
    runtime.migrate(a, 0)   # the half on GPU 1 is freed: a's pipeline there is let go
    churn = runtime.launch(base, "churn", device=1, state=[counter_initial_state(MAX)])
    for i in range(MAX_UNUSED_PASSES + 4):   # pipelines let go on GPU 1, the oldest a's
        churn.apply_code(code(0xF001 + i), timeout=60)
        add(runtime, churn, 1)
    ctx1 = churn.ctx
    assert ctx1.unused.evicted >= 3
    assert ctx1.has_pass(base.spirv, base.entry_point, device_context.kernel_types(len(base.state_sizes)),
                         KERNEL_PUSH)   # still wanted: a may move here
    made = []
    real = device_context.ComputePass.__init__

    def counting(self, *args, **kw):
        made.append(1)
        real(self, *args, **kw)
    monkeypatch.setattr(device_context.ComputePass, "__init__", counting)
    assert runtime.migrate(a, 1).checksum_match is True and made == []   # nothing compiled on the move
    add(runtime, a, 4)
    assert read_counter(runtime.read_state(a)).sum == 7
