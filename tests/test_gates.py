"""The tests' host-opened Gate (gates.py) itself."""
from __future__ import annotations

from gates import Gate
from kernel_support import call_in_thread


def test_a_gate_is_let_go_through_the_queue_locks(manager):
    """Gate.destroy waits for the slot's queues under their locks, never using a
    queue another thread holds (as a runtime's ready-twin or prebuild thread does
    while it submits): before, its vkDeviceWaitIdle used every queue at once, and
    the validation layer saw it race such a submit (UNASSIGNED-Threading-MultipleThreads)."""
    slot = manager.slot(0)
    for queue in slot.queues():
        gate = Gate(slot)
        gate.open()
        t, out = call_in_thread(gate.destroy, name="gate-destroy")
        with queue.lock:   # another thread's submit to this queue
            t.start()
            t.join(0.3)
            assert t.is_alive(), f"Gate.destroy used {queue!r} while another thread held its lock"
        t.join(30)
        assert not t.is_alive() and "error" not in out, out
