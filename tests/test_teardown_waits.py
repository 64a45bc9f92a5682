"""Teardown waits that must end: a queue's lock held (by this thread or another) and
work queued behind a wait that never comes, at mgr.destroy(), destroy_logical_device
and QueueLock.acquire. Each case runs in a child process: before, the waits were
vkDeviceWaitIdle and a plain mutex lock without the GIL, which neither a timeout nor
Ctrl-C could end (the child hung until the test killed it)."""
from __future__ import annotations

import os
import textwrap

import pytest

from child_runs import printed_in_order, run_script

HERE = os.path.dirname(os.path.abspath(__file__))

PRELUDE = textwrap.dedent("""
    import signal, sys, threading, time
    sys.path.insert(0, {here!r})
    import conftest   # the virtual pair and validation, as in the tests
    import vkmulti
    from vkmulti import MultiDeviceManager
    from gates import Gate

    def outcome(fn):
        try:
            fn()
            print("RETURNED", flush=True)
        except BaseException as exc:
            print("RAISED", type(exc).__name__, str(exc)[:300], flush=True)

    def held(lock):   # `lock` taken by another thread until the returned event is set
        taken, done = threading.Event(), threading.Event()
        def holder():
            with lock:
                taken.set()
                done.wait(60)
        t = threading.Thread(target=holder, daemon=True)
        t.start()
        taken.wait(10)
        return done, t
""")

CASES = {
    # the caller holds a queue's lock while it destroys the manager: a clear error, not a
    # deadlock; once it lets go, destroy() finishes
    "lock-held-by-this-thread": """
        mgr = MultiDeviceManager.create()
        q = mgr.slot(0).graphics_queue
        q.lock.acquire()
        outcome(lambda: mgr.destroy(timeout=5))
        q.lock.release()
        outcome(lambda: mgr.destroy(timeout=30))
        print("DESTROYED", mgr.destroyed, flush=True)
    """,
    # another thread keeps a queue's lock: destroy() times out, then finishes once it is let go
    "lock-held-by-another-thread": """
        mgr = MultiDeviceManager.create()
        q = mgr.slot(1).copy_queue
        done, t = held(q.lock)
        outcome(lambda: mgr.destroy(timeout=1))
        done.set()
        t.join(10)
        outcome(lambda: mgr.destroy(timeout=30))
        print("DESTROYED", mgr.destroyed, flush=True)
    """,
    # work that waits for a value nobody signals, queued after the manager drained a queue
    # and before it destroys the device: that final wait is bounded too
    "work-queued-after-the-drain": """
        mgr = MultiDeviceManager.create()
        slot = mgr.slot(1)
        gate = Gate(slot)
        drain = mgr._drain
        held = []
        def drain_then_queue(s, dl):
            drain(s, dl)
            if s is slot and not held:   # (once: the retry below finds the gate freed)
                gate.hold(slot.graphics_queue)
                held.append(1)
        mgr._drain = drain_then_queue
        outcome(lambda: mgr.destroy(timeout=1))
        gate.destroy()   # opens it, waits for the queues, frees the semaphore
        outcome(lambda: mgr.destroy(timeout=30))
        print("DESTROYED", mgr.destroyed, flush=True)
    """,
    # destroy_logical_device on its own, with work that never completes: bounded
    "destroy-logical-device": """
        from vkmulti.device.logical import create_logical_device, destroy_logical_device
        import vulkan as vk
        inst = vkmulti.Instance()
        ld = create_logical_device(inst.physical_devices()[0])
        class Slot:   # what Gate needs
            device, native = ld.device, ld.native
        gate = Gate(Slot)
        gate.hold(ld.graphics_queue)
        pending = []
        args = (ld.device, ld.native, ld.queues())
        outcome(lambda: destroy_logical_device(*args, timeout=1, pending=pending))
        gate.open()
        ld.native.wait_fence(int(vk.ffi.cast("uintptr_t", pending[0][1])), 30)
        for dev, fence in pending:
            vk.vkDestroyFence(dev, fence, None)
        vk.vkDestroySemaphore(ld.device, vk.ffi.cast("VkSemaphore", gate.sem), None)
        outcome(lambda: destroy_logical_device(*args))
        inst.destroy()
    """,
    # QueueLock.acquire: a timeout, Ctrl-C, and a clear error for a second acquire
    "queue-lock-acquire": """
        mgr = MultiDeviceManager.create()
        lock = mgr.slot(0).graphics_queue.lock
        done, t = held(lock)
        outcome(lambda: lock.acquire(timeout=0.2))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Timer(0.3, lambda: signal.raise_signal(signal.SIGINT)).start()
        outcome(lambda: lock.acquire())
        done.set()
        t.join(10)
        outcome(lambda: lock.acquire(timeout=10))
        outcome(lambda: lock.acquire(timeout=10))
        lock.release()
        outcome(lambda: lock.release())
        outcome(lambda: mgr.destroy(timeout=30))
    """,
    # user work on a vkmulti queue that waits for a timeline value nobody signals:
    # destroy(timeout=) raises vkmulti.TimeoutError, keeps the manager, and the process
    # exits with the work still queued
    "self-deadlocked-queue": """
        mgr = MultiDeviceManager.create()
        slot = mgr.slot(0)
        gate = Gate(slot)
        gate.hold(slot.graphics_queue)
        outcome(lambda: mgr.destroy(timeout=1))
        print("DESTROYED", mgr.destroyed, flush=True)
    """,
}

EPILOGUE = textwrap.dedent('''
    from vkmulti.device.instance import drain_all_validation_messages
    print("VALIDATION ERRORS:", [t[:300] for sev, t in drain_all_validation_messages() if sev == "error"], flush=True)
    print("EXITING", flush=True)
''')

EXPECTED = {
    "lock-held-by-this-thread": ["RAISED RuntimeError this thread already holds the lock", "RETURNED",
                                 "DESTROYED True"],
    "lock-held-by-another-thread": ["RAISED TimeoutError", "still held by another thread", "RETURNED",
                                    "DESTROYED True"],
    "work-queued-after-the-drain": ["RAISED TimeoutError", "still runs work", "RETURNED", "DESTROYED True"],
    "destroy-logical-device": ["RAISED TimeoutError", "it was not destroyed", "RETURNED"],
    "queue-lock-acquire": ["RAISED TimeoutError the lock of queue", "RAISED KeyboardInterrupt",
                           "RETURNED\nRAISED RuntimeError this thread already holds",
                           "RAISED RuntimeError the lock of queue", "is not held by this thread"],
    "self-deadlocked-queue": ["RAISED TimeoutError", "still runs work", "DESTROYED False"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_teardown_wait_ends(case):
    p = run_script(PRELUDE.format(here=HERE) + textwrap.dedent(CASES[case]) + EPILOGUE, case, 90, HERE)
    printed_in_order(p, EXPECTED[case] + ["VALIDATION ERRORS: []", "EXITING"], case)
