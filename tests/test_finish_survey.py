"""The finish pass's survey of the outbox it stamped (kernel_finish.comp, section 5):
the status record the host reads back says which local kernels, which other devices,
how many host messages and unknown addresses a step's outbox holds, and its lowest and
highest destination, for an outbox that holds one of each."""
from __future__ import annotations

import shutil

import pytest

import kernel_support
from kernel_support import runtime_fixture
from vkmulti import KernelCodeSource
from vkmulti.kernels import KernelSpec
from vkmulti.kernels.engine import harvest as harvest_module
from vkmulti.kernels.engine.kernel import OutboxBatch

pytestmark = pytest.mark.skipif(shutil.which("glslc") is None, reason="needs glslc to build the test kernel")

#: Step 0 sends one message to each of the four addresses in its params (0 is the host).
FAN_OUT = """
#version 450
#extension GL_GOOGLE_include_directive : require
#include "vkm_kernel_abi.glsl"
layout(local_size_x = 4) in;
layout(std430, set = 0, binding = 2) buffer State { uint words[]; } state;
void main() {
    if (vkm_step.step_lo != 0u)
        return;
    uint i = gl_LocalInvocationID.x;
    vkm_emit_at(i, vkm_step.params[i], 5u, 4u);
    if (i == 0u)
        vkm_outbox_set_count(4u);
}
"""
UNKNOWN = 0x7FFFFFF0   # no kernel has this address

runtime = runtime_fixture(max_kernels=32)


def test_the_finish_pass_surveys_an_outbox_with_every_kind_of_destination(runtime, monkeypatch):
    local = kernel_support.counter(runtime, "local", device=0)
    remote = kernel_support.counter(runtime, "remote", device=1)
    code = KernelCodeSource.from_glsl(FAN_OUT)
    sender = runtime.launch(KernelSpec("fan_out", code.code, state_sizes=(16,)), "sender", device=0,
                            params=[local.address, remote.address, 0, UNKNOWN])
    records: list[list[int]] = []
    apply = harvest_module.StepHarvest._apply_survey

    def spy(self, b, words):
        if isinstance(b, OutboxBatch) and b.kernel is sender:
            records.append([int(w) for w in words[:16]])
        return apply(self, b, words)
    monkeypatch.setattr(harvest_module.StepHarvest, "_apply_survey", spy)
    runtime.step(sender)
    runtime.synchronize(30)
    assert len(records) == 1
    w = records[0]
    mask = [0] * 8
    mask[local.local_slot // 32] = 1 << (local.local_slot % 32)
    assert w[:8] == mask                         # the local kernel's slot
    assert w[8] == 1 << 1                         # GPU 1
    assert w[9:13] == [1, 1, 1, 1]                # local, remote, host, unknown
    assert w[13] == 4                             # messages
    assert (w[14], w[15]) == (0, max(local.address, remote.address, UNKNOWN))
    # what the harvest made of it: the remote message has no router to move it, the unknown address none
    assert sender.stats.undeliverable == 2 and len(sender.errors) == 2
    assert runtime.receive(sender, timeout=30).tag == 5   # the host's message
