"""A kernel that does not end (a GPU hang as lavapipe can have one: 65535 x 65535
workgroups that each spin as long as llvmpipe lets a loop run): every wait on that
device ends at its timeout with an error that says what was waited for, the other
device's kernels go on, nothing the hung work uses is freed under it, and the process
ends. It runs in a child process (tests/child_runs.py), so a wait that does not end
fails this test after its bound instead of hanging the suite."""
from __future__ import annotations

import os
import shutil
import textwrap

import pytest

from child_runs import printed_in_order, run_script

HERE = os.path.dirname(os.path.abspath(__file__))

SPIN = """
#version 450
#extension GL_GOOGLE_include_directive : require
#include "vkm_kernel_abi.glsl"
layout(local_size_x = 1) in;
layout(std430, set = 0, binding = 2) buffer State { uint stop; uint spins; } st;
void main() { while (st.stop == 0u) { atomicAdd(st.spins, 1u); } }
"""

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    import conftest   # the virtual pair and validation, as in the tests
    import numpy as np
    from vkmulti import Image, MultiDeviceManager
    from vkmulti.cluster.readback import BatchReadback
    from vkmulti.device.instance import drain_all_validation_messages
    from vkmulti.kernels import KernelRuntime, KernelSpec, counter_kernel
    from vkmulti.kernels.reload import KernelCodeSource
    from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state, read_counter
    import kernel_support

    def outcome(name, fn):
        try:
            print("RETURNED", name, fn(), flush=True)
        except BaseException as exc:
            print("RAISED", name, type(exc).__name__, " ".join(str(exc).split())[:300], flush=True)
        errors = [t for sev, t in drain_all_validation_messages() if sev == "error"]
        if errors:
            print("VALIDATION", name, errors[0][:300], flush=True)

    spin = KernelCodeSource.from_glsl({spin!r}).code
    mgr = MultiDeviceManager.create()
    rt = KernelRuntime(kernel_support.make_coordinator(mgr), mgr, max_kernels=8)
    c = rt.launch(counter_kernel(max_sources=8), "c", device=1, state=[counter_initial_state(8)])
    img = Image(mgr.slot(0), 8, 8)
    h = rt.launch(KernelSpec("spin", spin, state_sizes=(16,), groups=(65535, 65535, 1)), "h", device=0)
    ticket = rt.step(h, timeout=2)
    outcome("step-h", lambda: sorted(ticket.points))
    outcome("wait-h", lambda: ticket.wait(timeout=1))
    outcome("read-h", lambda: rt.read_state(h, timeout=1))
    outcome("launch-behind-h", lambda: rt.launch(counter_kernel(max_sources=8), "c0", device=0, timeout=1))
    cp = c.create_checkpoint()
    outcome("migrate-onto-h", lambda: rt.migrate(c, 0, timeout=2))
    outcome("restore-new-onto-h", lambda: rt.restore(cp, kernel_id="c2", device=0, timeout=2))
    outcome("restore-into-onto-h", lambda: rt.restore(cp, into=c, device=0, timeout=2))
    rb = BatchReadback(mgr.slot(0))
    outcome("readback-behind-h", lambda: rb.read([img], timeout=1))
    outcome("readback-destroy", lambda: rb.destroy(timeout=1))
    outcome("image-destroy", lambda: img.destroy(1))

    def other_device():
        rt.send(c, np.array([5], np.uint32), tag=COUNTER_TAG_ADD)
        rt.step(c, timeout=5)
        return read_counter(rt.read_state(c, timeout=5)).sum
    outcome("other-device", other_device)
    outcome("destroy-h", lambda: rt.destroy_kernel(h, timeout=1))
    outcome("runtime-destroy", lambda: rt.destroy(timeout=1))
    outcome("manager-destroy", lambda: mgr.destroy(timeout=1))
    print("EXITING", flush=True)
""")


@pytest.mark.skipif(shutil.which("glslc") is None, reason="glslc is not installed")
def test_a_kernel_that_does_not_end_fails_waits_at_their_timeouts_and_frees_nothing_in_use():
    """Before: a launch on the hung device waited 60 s (no timeout to give) and then freed the
    new kernel's buffers while its initialisation was still queued on the GPU
    (VUID-vkDestroyBuffer-buffer-00922: the GPU would write freed memory), and the waits'
    errors named only the Vulkan call ("vkWaitForFences did not complete within 1.000 s").
    migrate(timeout=2) and restore(timeout=2) onto the hung device took 90 s, 60 s and 32 s
    (a twin's or a launch's initialisation waited 60 s, then freeing the twin or the staging
    buffer 30 s more, under the device's lock) and said "GPU work still uses this
    MappedBuffer after 30 s"; the kernel stays where it was, usable."""
    p = run_script(SCRIPT.format(here=HERE, spin=SPIN), "GPU hang", 240, HERE)
    assert "VALIDATION" not in p.stdout, p.stdout[-4000:]
    moves = [ln for ln in p.stdout.splitlines() if ln.startswith(("RAISED migrate", "RAISED restore"))]
    assert not any("still uses this" in ln for ln in moves), moves   # (a destroy's 30 s wait, not the call's)
    printed_in_order(p, [
        "RETURNED step-h [0]", "RAISED wait-h TimeoutError", "GPU 0: kernel step",
        "RAISED read-h TimeoutError", "kernel 'h'", "GPU 0",
        "RAISED launch-behind-h TimeoutError", "launching kernel 'c0' on GPU 0",
        "RAISED migrate-onto-h TimeoutError", "live migration of",
        "RAISED restore-new-onto-h TimeoutError", "launching kernel 'c2' on GPU 0",
        "RAISED restore-into-onto-h TimeoutError",
        "RAISED readback-behind-h TimeoutError", "reading back 1 image(s) of GPU 0",
        "RAISED readback-destroy TimeoutError",
        "RAISED image-destroy TimeoutError",
        "RETURNED other-device 5",
        "RAISED destroy-h TimeoutError", "kernel 'h'", "GPU 0",
        "RAISED runtime-destroy TimeoutError", "kernel 'h'", "GPU 0",
        "RAISED manager-destroy TimeoutError",
        "EXITING"], "GPU hang")
