"""The matrix of blocking calls held for real (test_interruptible_waits*.py): the script
every case runs in a child process (PRELUDE: probe() and its helpers), the fragments
cases share (a runtime with a counter kernel, a step of it held behind a gate) and
the check of what a case printed."""
from __future__ import annotations

import os
import textwrap

from child_runs import printed_in_order, run_script

HERE = os.path.dirname(os.path.abspath(__file__))

PRELUDE = textwrap.dedent("""
    import asyncio, math, os, signal, sys, threading, time
    import numpy as np
    sys.path.insert(0, {here!r})
    import conftest   # the virtual pair and validation, as in the tests
    import vkmulti
    from vkmulti import Buffer, CrossDeviceTransfer, MultiDeviceManager, TransferMethod
    from gates import Gate

    signal.signal(signal.SIGINT, signal.default_int_handler)
    BAD = (-1, math.nan, "5", True)
    SLOW_S = 20.0   # a hang bound, not a timing

    def outcome(label, fn):
        t0 = time.monotonic()
        try:
            fn()
            text = "RETURNED"
        except BaseException as exc:
            text = f"RAISED {{type(exc).__name__}} {{str(exc)[:200]}}"
        slow = " SLOW" if time.monotonic() - t0 > SLOW_S else ""
        print(f"{{label}}: {{text}}{{slow}}", flush=True)

    def interrupted(label, fn, process=False):
        '''fn() with a Ctrl-C (SIGINT) 0.3 s in: raised in a timer thread, or (`process`) sent to the
        process as a terminal does, for an event loop, which sleeps until a signal reaches its thread.'''
        send = (lambda: os.kill(os.getpid(), signal.SIGINT)) if process else (lambda: signal.raise_signal(signal.SIGINT))
        timer = threading.Timer(0.3, send)
        returned = []
        t0 = time.monotonic()
        try:
            timer.start()
            fn()
            returned.append(1)
            timer.join()
            time.sleep(0.2)
            text = "RETURNED"
        except BaseException as exc:
            text = ("RETURNED-THEN " if returned else "RAISED ") + type(exc).__name__
        slow = " SLOW" if time.monotonic() - t0 > SLOW_S else ""
        print(f"{{label}} ctrl-c: {{text}}{{slow}}", flush=True)

    def probe(label, call, process=False):
        '''call(timeout) while it is held: 0.2 s, None with a Ctrl-C, then the bad timeouts.'''
        outcome(f"{{label}} 0.2", lambda: call(0.2))
        interrupted(label, lambda: call(None), process)
        for bad in BAD:
            outcome(f"{{label}} bad {{bad!r}}", lambda: call(bad))

    def opened(gate):
        '''The gate open (once: a timeline value is signalled only once).'''
        if gate.slot.native.timeline_value(gate.sem) < 1:
            gate.open()

    def in_thread(fn):
        '''fn() on a daemon thread (a wait of its own that holds something up).'''
        out = []
        def run():
            try:
                fn()
            except BaseException as exc:
                out.append(exc)
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t, out
""")

#: the lines each case prints, in order, for one probe() of `label`
def probed(label):
    lines = [f"{label} 0.2: RAISED TimeoutError", f"{label} ctrl-c: RAISED KeyboardInterrupt\n"]
    return lines + [f"{label} bad {bad}: RAISED " for bad in ("-1", "nan", "'5'", "True")]


RUNTIME = """
    from vkmulti._core.timeline import TimelinePoint
    from vkmulti.kernels import KernelMigrator, KernelRuntime, MultiGpuCoordinator, counter_kernel
    from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state, read_counter
    from vkmulti.kernels.engine.device_context import step_queue
    mgr = MultiDeviceManager.create()
    rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr), mgr, max_kernels=8)
    k = rt.launch(counter_kernel(max_sources=8), "k", device=0, state=[counter_initial_state(8)])
    rt.step(k).wait(30)
    gate = Gate(mgr.slot(0))
"""

#: a step of k held on the GPU until the gate opens
HELD = """
    held = rt.step(k, wait=TimelinePoint(gate.sem, 1, 0))
"""

#: the gate opens: k's steps run, k counts what it is sent, everything is freed cleanly
RUNTIME_END = """
    opened(gate)
    rt.synchronize(30)
    rt.send(k, np.array([4], np.uint32), tag=COUNTER_TAG_ADD)
    rt.step(k).wait(30)
    print("SUM", read_counter(rt.read_state(k)).sum, flush=True)
    outcome("rt", lambda: rt.destroy(30))
    gate.destroy()
    outcome("mgr", lambda: mgr.destroy(30))
"""

RUNTIME_DONE = ["SUM 4", "rt: RETURNED", "mgr: RETURNED"]


#: every queue of GPU 1 held until the gate opens (uploads and copies to it wait)
HOLD_1 = """
    from vkmulti import Image, InterGpuTransfer
    mgr = MultiDeviceManager.create()
    s0, s1 = mgr.slot(0), mgr.slot(1)
    gate = Gate(s1)
    data = np.arange(1 << 14, dtype=np.uint8)
    img = Image(s1, 64, 64)   # (making one waits on the queue too)
    for q in s1.queues():
        gate.hold(q)
"""


def body(*parts):
    """A case's script: its fragments, each dedented, one after another."""
    return "".join(textwrap.dedent(p) for p in parts)


EPILOGUE = textwrap.dedent('''
    from vkmulti.device.instance import drain_all_validation_messages
    print("VALIDATION ERRORS:", [t[:300] for sev, t in drain_all_validation_messages() if sev == "error"], flush=True)
    print("EXITING", flush=True)
''')


def check_case(case: str, code: str, expected: list[str]) -> None:
    """Run a case's script (PRELUDE + `code` + EPILOGUE) in a child process: no wait went
    past the hang bound, `expected` was printed in order, no validation error, exit 0."""
    p = run_script(PRELUDE.format(here=HERE) + code + EPILOGUE, case, 120, HERE)
    assert " SLOW" not in p.stdout and "RETURNED-THEN" not in p.stdout, p.stdout[-4000:]
    printed_in_order(p, expected + ["VALIDATION ERRORS: []", "EXITING"], case)
