"""More public blocking calls held for real, as in test_interruptible_waits.py (blocking_calls.py
says what each case checks): launches, stencil slabs, the SRU offload coordinator, the
cluster's node agent in-process, and calls that test_interruptible_waits.py lacks."""
from __future__ import annotations

import pytest

from blocking_calls import RUNTIME, RUNTIME_DONE, RUNTIME_END, body, check_case, probed

CASES = {
    # the step queues of both GPUs held: a launch on GPU 1 makes the runtime's objects there
    # first, one on GPU 0 only the kernel's; what a launch that gave up queued is freed once
    # it ran, never under it
    "launch": (body(RUNTIME, """
        gate1 = Gate(mgr.slot(1))
        gate.hold(step_queue(mgr.slot(0)))
        gate1.hold(step_queue(mgr.slot(1)))
        def launched(device, **kw):
            return rt.launch(counter_kernel(max_sources=8), "j", device=device, state=[counter_initial_state(8)], **kw)
        for device, label in ((1, "first launch"), (0, "launch")):
            outcome(f"{label} 0.2", lambda: launched(device, timeout=0.2))
            interrupted(label, lambda: launched(device))
            for bad in BAD:
                outcome(f"{label} bad {bad!r}", lambda: launched(device, timeout=bad))
        print("KERNELS", [x.id for x in rt.kernels], flush=True)
        opened(gate1)
        for device in (1, 0):
            opened(gate)
            j = launched(device, timeout=None)
            rt.send(j, np.array([3], np.uint32), tag=COUNTER_TAG_ADD)
            rt.step(j).wait(30)
            print("LAUNCHED", j.device_index, read_counter(rt.read_state(j)).sum, flush=True)
            rt.destroy_kernel(j, timeout=30)
        gate1.destroy()
    """, RUNTIME_END), probed("first launch") + probed("launch")
        + ["KERNELS [KernelId('k')]", "LAUNCHED 1 3", "LAUNCHED 0 3"] + RUNTIME_DONE),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_blocking_call_ends(case):
    check_case(case, *CASES[case])
