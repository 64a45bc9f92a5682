"""A queue's lock (QueueLock, shared by an engine and vkmulti) is never lost or taken
twice by mistake: a native submit by a thread that holds the lock already (a kernel
step under the engine's own `with queue.lock:`) is refused with the lock left held,
and a Ctrl-C that lands as acquire() obtains the lock does not leave it held; a wait
for it keeps its bound when the wall clock moves. Each case runs in a child process
(a lock lost for good blocks the next waiter)."""
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

    signal.signal(signal.SIGINT, signal.default_int_handler)

    def outcome(label, fn):
        try:
            fn()
            print(label, "RETURNED", flush=True)
        except BaseException as exc:
            print(label, "RAISED", type(exc).__name__, str(exc)[:300], flush=True)

    def taken_elsewhere(lock):
        '''Whether another thread can take `lock` now (it is then let go at once).'''
        got = []
        def other():
            try:
                lock.acquire(timeout=2)
            except vkmulti.TimeoutError:
                return
            lock.release()
            got.append(1)
        t = threading.Thread(target=other)
        t.start()
        t.join(30)
        return bool(got)

    def released_with_a_ctrl_c(lock):
        '''A thread holding `lock` that, once told, raises SIGINT and lets the lock go at
        once: the Ctrl-C lands while the caller's acquire() is obtaining it.'''
        taken, go = threading.Event(), threading.Event()
        def holder():
            lock.acquire()
            taken.set()
            go.wait(30)
            time.sleep(0.3)   # (the caller is inside its acquire by now)
            signal.raise_signal(signal.SIGINT)
            lock.release()
        t = threading.Thread(target=holder, daemon=True)
        t.start()
        taken.wait(30)
        return go, t
""")

CASES = {
    # the engine holds the step queue's lock (its own `with queue.lock:`) and steps a kernel
    # on that thread: the step is refused, the engine still holds the lock, and once it lets
    # go the kernel steps
    "kernel-step-under-the-callers-lock": """
        from vkmulti.kernels import KernelRuntime, MultiGpuCoordinator, counter_kernel
        from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state, read_counter
        from vkmulti.kernels.engine.device_context import step_queue
        import numpy as np
        mgr = MultiDeviceManager.create()
        rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr), mgr, max_kernels=8)
        k = rt.launch(counter_kernel(max_sources=8), "k", device=0, state=[counter_initial_state(8)])
        rt.step(k).wait(30)
        lock = step_queue(mgr.slot(0)).lock
        lock.acquire()
        outcome("step", lambda: rt.step(k))
        outcome("run", lambda: rt.run(3, k))
        print("TAKEN ELSEWHERE", taken_elsewhere(lock), flush=True)
        outcome("release", lock.release)
        rt.send(k, np.array([4], np.uint32), tag=COUNTER_TAG_ADD)
        rt.step(k).wait(30)
        print("SUM", read_counter(rt.read_state(k)).sum, flush=True)
        outcome("rt", lambda: rt.destroy(30))
        outcome("mgr", lambda: mgr.destroy(30))
    """,
    # Ctrl-C as acquire() obtains the lock: KeyboardInterrupt, and the lock is not kept
    "ctrl-c-as-acquire-obtains-the-lock": """
        mgr = MultiDeviceManager.create()
        lock = mgr.slot(0).graphics_queue.lock
        go, t = released_with_a_ctrl_c(lock)
        go.set()
        outcome("acquire", lambda: lock.acquire(timeout=20))
        t.join(10)
        print("TAKEN ELSEWHERE", taken_elsewhere(lock), flush=True)
        outcome("mgr", lambda: mgr.destroy(30))
    """,
    # the same within a teardown's drain (vkapi.queue_submit): a retried destroy() finishes
    "ctrl-c-as-a-teardown-obtains-the-lock": """
        mgr = MultiDeviceManager.create()
        lock = mgr.slot(1).copy_queue.lock
        go, t = released_with_a_ctrl_c(lock)
        go.set()
        outcome("destroy", lambda: mgr.destroy(timeout=20))
        t.join(10)
        print("TAKEN ELSEWHERE", taken_elsewhere(lock), flush=True)
        outcome("again", lambda: mgr.destroy(timeout=30))
        print("DESTROYED", mgr.destroyed, flush=True)
    """,
}

EPILOGUE = textwrap.dedent('''
    from vkmulti.device.instance import drain_all_validation_messages
    print("VALIDATION ERRORS:", [t[:300] for sev, t in drain_all_validation_messages() if sev == "error"], flush=True)
    print("EXITING", flush=True)
''')

EXPECTED = {
    "kernel-step-under-the-callers-lock": ["step RAISED RuntimeError this thread already holds the lock",
                                           "run RAISED RuntimeError",
                                           "TAKEN ELSEWHERE False", "release RETURNED", "SUM 4",
                                           "rt RETURNED", "mgr RETURNED"],
    "ctrl-c-as-acquire-obtains-the-lock": ["acquire RAISED KeyboardInterrupt", "TAKEN ELSEWHERE True",
                                           "mgr RETURNED"],
    "ctrl-c-as-a-teardown-obtains-the-lock": ["destroy RAISED KeyboardInterrupt", "TAKEN ELSEWHERE True",
                                              "again RETURNED", "DESTROYED True"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_queue_lock_is_never_lost(case):
    p = run_script(PRELUDE.format(here=HERE) + textwrap.dedent(CASES[case]) + EPILOGUE, case, 120, HERE)
    printed_in_order(p, EXPECTED[case] + ["VALIDATION ERRORS: []", "EXITING"], case)


SHIFTED_WALL_CLOCK = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>
/* CLOCK_REALTIME an hour ahead (as after the wall clock is set back an hour during a wait
   whose deadline was taken from it); every other clock as it is */
int clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    if (r == 0 && id == CLOCK_REALTIME) ts->tv_sec += 3600;
    return r;
}
"""


def test_a_lock_wait_keeps_its_bound_when_the_wall_clock_moves(tmp_path, monkeypatch):
    """QueueLock.acquire(timeout=0.2) while another thread holds the lock, with the wall
    clock an hour off from the one the kernel times a mutex against (LD_PRELOAD): each
    50 ms slice took its deadline from CLOCK_REALTIME, so a slice lasted an hour, and
    neither the timeout nor Ctrl-C ended the wait (the child was still blocked when the
    test gave up on it). The core times every wait with CLOCK_MONOTONIC."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the clock shim")
    src, lib = tmp_path / "shift.c", tmp_path / "libshift.so"
    src.write_text(SHIFTED_WALL_CLOCK)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"], check=True, timeout=120)
    first = os.environ.get("LD_PRELOAD")   # (a sanitizer's runtime, under ASan: it must stay first)
    monkeypatch.setenv("LD_PRELOAD", f"{first}:{lib}" if first else str(lib))
    script = textwrap.dedent("""
        import threading, time
        import vkmulti
        from vkmulti._core import _native
        lock = _native.QueueLock(0x1000, 0)
        taken, done = threading.Event(), threading.Event()
        def holder():
            with lock:
                taken.set()
                done.wait(60)
        threading.Thread(target=holder, daemon=True).start()
        taken.wait(30)
        try:
            lock.acquire(timeout=0.2)
            print("ACQUIRED", flush=True)
        except vkmulti.TimeoutError as exc:
            print("RAISED TimeoutError", exc, flush=True)
        done.set()
    """)
    p = run_script(script, "wall-clock", 60, HERE)
    printed_in_order(p, ["RAISED TimeoutError", "still held by another thread"], "wall-clock")
