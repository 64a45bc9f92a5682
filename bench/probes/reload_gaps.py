"""Where a hot reload's longest gaps between steps come from (issue 25's reload goal).

A counter kernel on GPU 0 is stepped by a thread (`rt.step(k)` without pause) while
the main thread reloads it; each reload is one MODE:

  cold      new SPIR-V bytes: validated and compiled on both devices (the bench's case)
  warm      code that ran before: nothing compiled
  prebuilt  new bytes whose pipelines were built on both devices before the reload
  solo      cold, with no ready twins and pipelines built ahead on GPU 0 only
  *-swi     the same with the interpreter's switch interval at 0.2 ms instead of 5 ms

For each reload: its phases (drain, checkpoint, compile, swap), the normal step, the
six longest gaps with, for the step before each, its wall and CPU time, context
switches, minor faults and the wall/CPU time of its parts (the recorder, the native
submit, waits, the device lock, harvest), what ran beside it (compiles, the SPIR-V
gate, the swap, the twins' work, garbage collections, with their threads), and the
timeline of those jobs. Timing wrappers are patched onto the library's functions:
a probe, not a bench (RESULTS.md, session 21, says what it found).

    python bench/probes/reload_gaps.py [MODE ...]
"""
from __future__ import annotations

import argparse
import functools
import gc
import os
import resource
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import migration as B  # noqa: E402  (bench/migration.py: its runtime and cold-code helpers)
from vkmulti import MultiDeviceManager  # noqa: E402
from vkmulti.kernels import HotReloadConfig, HotReloadManager, KernelCodeSource, counter_kernel, pingpong_kernel  # noqa: E402
from vkmulti.kernels.reference import counter_initial_state  # noqa: E402
from vkmulti.kernels.engine import device_context as DC  # noqa: E402
from vkmulti.kernels.engine import step_recorder as SR  # noqa: E402
from vkmulti.kernels.engine import stepper as ST  # noqa: E402
from vkmulti.kernels.lifecycle import ready_twins as RT  # noqa: E402
from vkmulti.kernels.reload import swap as SW  # noqa: E402
from vkmulti.kernels.runtime import stepping as STP  # noqa: E402

MODES = ["cold", "warm", "prebuilt", "solo", "cold-swi", "warm-swi", "prebuilt-swi", "solo-swi"]
DEFAULT = ["cold", "cold-swi", "warm", "prebuilt", "cold", "cold-swi", "warm", "prebuilt", "solo", "solo-swi"]

EV = []
def wrap(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def g(*a, **kw):
        t0 = time.perf_counter(); c0 = time.thread_time()
        try:
            return f(*a, **kw)
        finally:
            EV.append((label, threading.current_thread().name, t0, time.perf_counter(), time.thread_time() - c0))
    setattr(obj, name, g)

_GCS = {}
def _gccb(phase, info):
    me = threading.get_ident()
    if phase == "start":
        _GCS[me] = (time.perf_counter(), time.thread_time())
    elif me in _GCS:
        t0, c0 = _GCS.pop(me)
        EV.append((f"gc{info['generation']}", threading.current_thread().name, t0, time.perf_counter(),
                   time.thread_time() - c0))

ACC = threading.local()
def acc(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def g(*a, **kw):
        d = getattr(ACC, "d", None)
        if d is None:
            return f(*a, **kw)
        t0 = time.perf_counter(); c0 = time.thread_time()
        try:
            return f(*a, **kw)
        finally:
            w, c = d.get(label, (0.0, 0.0))
            d[label] = (w + time.perf_counter() - t0, c + time.thread_time() - c0)
    setattr(obj, name, g)

class LockProxy:
    def __init__(self, inner): self.inner = inner
    def acquire(self, *a, **kw):
        d = getattr(ACC, "d", None)
        t0 = time.perf_counter(); c0 = time.thread_time()
        r = self.inner.acquire(*a, **kw)
        if d is not None:
            w, c = d.get("lock", (0.0, 0.0))
            d["lock"] = (w + time.perf_counter() - t0, c + time.thread_time() - c0)
        return r
    def release(self): return self.inner.release()
    def __enter__(self): self.acquire(); return self
    def __exit__(self, *a): self.inner.release()
    def __getattr__(self, n): return getattr(self.inner, n)

class SubmitProxy:
    def __init__(self, inner): self.inner = inner
    def __getattr__(self, n): return getattr(self.inner, n)
    def submit(self, *a, **kw):
        d = getattr(ACC, "d", None)
        t0 = time.perf_counter(); c0 = time.thread_time()
        try:
            return self.inner.submit(*a, **kw)
        finally:
            if d is not None:
                w, c = d.get("submit", (0.0, 0.0))
                d["submit"] = (w + time.perf_counter() - t0, c + time.thread_time() - c0)

def instrument() -> None:
    """Patch the timing wrappers onto the library (this process only: a probe)."""
    wrap(DC.ComputePass, "__init__", "compile")
    wrap(RT.ReadyTwins, "_work", "twin")
    wrap(SW, "_swap_locked", "swap")
    wrap(SW, "_gate_in_background", "gate")
    wrap(DC.DeviceContext, "descriptor_set", "dset")
    wrap(DC.DeviceContext, "build_pass", "build_pass")
    gc.callbacks.append(_gccb)
    acc(DC.DeviceContext, "wait_unlocked", "wait")
    acc(ST.DeviceStepper, "harvest", "harvest")
    acc(ST.DeviceStepper, "_await_submitted", "await")
    acc(SR.StepRecorder, "record", "record")
    acc(ST.DeviceStepper, "_submitted", "after")
    acc(STP.Stepping, "step", "inner")
    acc(ST.DeviceStepper, "step", "dstep")


def one(rt, k, mgr_h, code, label):
    stop = threading.Event(); steps = []
    def run():
        while not stop.is_set():
            t0 = time.perf_counter(); c0 = time.thread_time()
            ru0 = resource.getrusage(resource.RUSAGE_THREAD)
            ACC.d = {}
            rt.step(k)
            ru1 = resource.getrusage(resource.RUSAGE_THREAD)
            steps.append((t0, time.perf_counter(), time.thread_time() - c0, ru1.ru_nvcsw - ru0.ru_nvcsw,
                          ru1.ru_nivcsw - ru0.ru_nivcsw, ru1.ru_minflt - ru0.ru_minflt, ACC.d))
    th = threading.Thread(target=run, name="stepper"); th.start()
    while len(steps) < 50: time.sleep(0.001)
    EV.clear()
    n0 = len(steps); t0 = time.perf_counter()
    res = mgr_h.reload(k, code)
    t1 = time.perf_counter()
    print(f"   phases ms: drain {1e3*res.drain_duration:.2f} checkpoint {1e3*res.checkpoint_duration:.2f} "
          f"compile {1e3*res.compile_duration:.2f} swap {1e3*res.swap_duration:.2f} restore {1e3*res.restore_duration:.2f}")
    B._settle(rt)
    t2 = time.perf_counter()
    time.sleep(max(0.05, t2 - t0))
    stop.set(); th.join(30)
    rt.synchronize()
    normal = statistics.median([b[0] - a[0] for a, b in zip(steps[n0 - 40:n0 - 1], steps[n0 - 39:n0])])
    win = [(i, s) for i, s in enumerate(steps) if s[1] >= t0 and s[0] <= t2]
    gaps = sorted(((steps[i][0] - steps[i - 1][0], i) for i, _ in win if i > 0), reverse=True)[:6]
    plain = [s for s in steps if s[0] > t2 + 0.01]
    pg = max(b[0] - a[0] for a, b in zip(plain, plain[1:])) if len(plain) > 2 else float("nan")
    print(f"-- {label}: reload {1e3*(t1-t0):.2f} ms, settle {1e3*(t2-t1):.2f} ms, normal step {1e6*normal:.0f} us, "
          f"longest gap {1e6*gaps[0][0]:.0f} us = {gaps[0][0]/normal:.1f}x; plain window longest {1e6*pg:.0f} us; steps in window {len(win)}")
    for g, i in gaps:
        a = steps[i - 1]
        over = [f"{e[0]}@{e[1]}" for e in EV if e[2] < steps[i][0] and e[3] > a[0]]
        print(f"   gap {1e6*g:6.0f} us at +{1e3*(a[0]-t0):7.2f} ms: prev step wall {1e6*(a[1]-a[0]):.0f} cpu {1e6*a[2]:.0f} "
              f"vcsw {a[3]} ivcsw {a[4]} minflt {a[5]}; beside: {sorted(set(over))}")
        print("      parts (wall/cpu us): " + " ".join(f"{n}={1e6*w:.0f}/{1e6*c:.0f}" for n, (w, c) in sorted(a[6].items())))
    for e in sorted(EV, key=lambda e: e[2]):
        if e[0] != "dset" or e[3] - e[2] > 2e-4:
            print(f"   ev {e[0]:8s} {e[1]:28s} +{1e3*(e[2]-t0):7.2f} .. +{1e3*(e[3]-t0):7.2f} ms cpu {1e3*e[4]:.2f}")
    return gaps[0][0] / normal

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("modes", nargs="*", choices=MODES, metavar="MODE",
                   help=f"reloads to make, in order ({', '.join(MODES)}; default: {' '.join(DEFAULT)})")
    args = p.parse_args()
    instrument()
    print(B.use_virtual_if_no_gpu(None))
    mgr = MultiDeviceManager.create(enabled=True)
    print([s.name for s in mgr.slots])
    rt, router = B._runtime(mgr)
    a, b = counter_kernel(max_sources=64), pingpong_kernel()
    k = rt.launch(a, "r", device=0, state=[counter_initial_state(64)])
    ctx = k.ctx; ctx.step_cmds = SubmitProxy(ctx.step_cmds); ctx.lock = LockProxy(ctx.lock)
    mgr_h = HotReloadManager(HotReloadConfig().with_preserve_state(True).with_validate_before_swap(False))
    mgr_h.register_runtime_kernel(k)
    codes = [KernelCodeSource.from_spirv(a.spirv), KernelCodeSource.from_spirv(b.spirv)]
    for i in range(2): mgr_h.reload(k, codes[(i + 1) % 2])
    B._settle(rt)
    modes = args.modes or DEFAULT
    tag = 0xC000 + (os.getpid() & 0xfff) * 16
    for m in modes:
        if m.startswith("solo"):
            rt.ready_twins.enabled = False; rt.prebuild.devices = (0,)
        else:
            rt.ready_twins.enabled = True; rt.prebuild.devices = None
        B._settle(rt)
        sys.setswitchinterval(0.0002 if m.endswith("-swi") else 0.005)
        if m.startswith("warm"):
            code = codes[0]
        else:
            tag += 1; code = B._cold_code(a.spirv, tag)
        if m.startswith("prebuilt"):   # the pipelines built before the reload (never bound yet)
            t = time.perf_counter()
            for c in {k.ctx, *(rt._contexts[d][0] for d in rt._contexts)}:
                c.kernel_pass(code.code, code.entry_point, len(k.states), locked=False)
            print(f"   (prebuilt in {1e3*(time.perf_counter()-t):.1f} ms)")
            time.sleep(0.2)
        one(rt, k, mgr_h, code, m)
    router.detach(); rt.destroy()

if __name__ == "__main__":
    main()
