"""Hostile arguments for KernelRuntime, CrossGpuK2KRouter and KernelMigrator on the virtual pair.

One runtime with a router for the module; counters `a` (GPU 0) and `b`
(GPU 1), a plain kernel `w` whose state the writes land in, a destroyed
kernel `dead`. Each case names a call with good arguments; hypothesis
replaces some of them with junk (test_fuzz_host's, plus destroyed kernels
and buffers and objects of the wrong vkmulti class). The call must do its
job or raise a typed error with a short message; then the good call works.
The validation layer is on: a bad value that reaches the driver fails.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kernel_support import MAX, make_coordinator
from test_fuzz_host import junk as host_junk, typed
from vkmulti import (Buffer, CheckpointPolicy, CrossGpuK2KRouter, DeviceUnregisterResult, KernelMigrator, MemoryStorage,
                     MultiDeviceManager)
from vkmulti.kernels import KernelRuntime, KernelSpec, counter_kernel
from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state


class World:
    """The module's manager, runtime, router, migrator and kernels."""

    def __init__(self) -> None:
        self.mgr = MultiDeviceManager.create(enabled=True)
        self.rt = KernelRuntime(make_coordinator(self.mgr), self.mgr, max_kernels=MAX)
        self.router = CrossGpuK2KRouter(self.rt.coordinator, self.rt)
        self.migrator = KernelMigrator(self.rt.coordinator, MemoryStorage())
        self.spec = counter_kernel(max_sources=MAX, inbox_capacity=8, outbox_capacity=8)
        self.a = self.launch("a", 0)
        self.b = self.launch("b", 1)
        self.w = self.rt.launch(KernelSpec("plain", self.spec.spirv, state_sizes=(256,)), "w", device=0)
        self.dead = self.launch("dead", 1)
        self.rt.destroy_kernel(self.dead)
        self.dead_buffer = Buffer(self.mgr.slot(0), 256)
        self.dead_buffer.destroy()
        self.cp = self.rt.checkpoint(self.a)

    def launch(self, name: str, device: int) -> Any:
        return self.rt.launch(self.spec, name, device=device, state=[counter_initial_state(MAX)])

    def destroy(self) -> None:
        self.router.detach()
        self.rt.destroy()
        self.mgr.destroy()


WORLD: World | None = None


@pytest.fixture(scope="module")
def world():
    global WORLD
    WORLD = World()
    try:
        yield WORLD
    finally:
        WORLD.destroy()
        WORLD = None


def _w() -> World:
    assert WORLD is not None
    return WORLD


def _launch_and_drop(rt: KernelRuntime, spec: Any, kid: Any, device: Any, tenant: Any) -> None:
    k = rt.launch(spec, kid, device=device, state=[counter_initial_state(MAX)], tenant=tenant)
    rt.destroy_kernel(k)


def _restore_and_drop(rt: KernelRuntime, cp: Any, device: Any, kid: Any) -> None:
    k = rt.restore(cp, device=device, kernel_id=kid)
    rt.destroy_kernel(k)


#: name -> (the call on the world, its good arguments; a str "@x" stands for the world's attribute x).
CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "launch": (lambda w, s, k, d, t: _launch_and_drop(w.rt, s, k, d, t), ("@spec", "fresh", 1, 0)),
    "send": (lambda w, k, p, t, pr, to: (w.rt.send(k, p, tag=t, priority=pr, timeout=to), w.rt.step(k).wait(30)),
             ("a", np.array([1], np.uint32), COUNTER_TAG_ADD, 0, 0.0)),
    "receive": (lambda w, k, to: w.rt.pending_receives(k) if to == 0.5 else w.rt.receive(k, to), ("b", 0.5)),
    "read_state": (lambda w, k, i, o, s, to: w.rt.read_state(k, i, offset=o, size=s, timeout=to),
                   ("a", 0, 0, 16, 30.0)),
    "write_state": (lambda w, k, i, d, o, to: w.rt.write_state(k, i, d, offset=o, timeout=to),
                    ("w", 0, np.arange(4, dtype=np.uint32), 8, 30.0)),
    "step": (lambda w, ks, wait, to: w.rt.step(ks, wait=wait, timeout=to).wait(30), (["a", "b"], None, 30.0)),
    "run": (lambda w, n, ks, to: w.rt.run(n, ks, timeout=to).wait(30), (2, "b", 30.0)),
    "kernel": (lambda w, k: (w.rt.kernel(k), w.rt.is_held(k), w.rt.latest_checkpoint(k)), ("a",)),
    "checkpoint": (lambda w, k, to: w.rt.checkpoint(k, timeout=to), ("b", 30.0)),
    "restore": (lambda w, cp, d, k: _restore_and_drop(w.rt, cp, d, k), ("@cp", 1, "restored")),
    "device_queries": (lambda w, i: (w.rt.directory_entry(i), w.rt.exports_outboxes(i)), (1,)),
    "set_checkpoint_policy": (lambda w, p: w.rt.set_checkpoint_policy(p), (None,)),
    "migrate": (lambda w, k, to, v: w.rt.migrate(k, 1 - w.rt.kernel("a").device_index, timeout=to, verify=v)
                if k == "a" else w.rt.migrate(k, 0, timeout=to, verify=v), ("a", 60.0, True)),
    "router.route": (lambda w, s, d: (w.router.route(s, d), w.router.transfer_method(s, d)), (0, 1)),
    "router.route_message": (lambda w, s, d, m, to: w.router.route_message(s, d, m, timeout=to),
                             ("a", "b", np.array([1], np.uint32), 0.0)),
    "router.drain_pending": (lambda w, s, d: w.router.drain_pending(s, d), (0, 1)),
    "migrator.carry_out": (lambda w, r, ks: w.migrator.carry_out(r, ks), (DeviceUnregisterResult(1), {})),
}


def resolve(value: Any) -> Any:
    return getattr(_w(), value[1:]) if isinstance(value, str) and value.startswith("@") else value


def call(name: str, args: tuple[Any, ...]) -> Any:
    fn, _ = CASES[name]
    return fn(_w(), *(resolve(a) for a in args))


junk = st.one_of(host_junk, st.sampled_from(["@dead", "@dead_buffer", "@cp", "@router", "@migrator", "@w", "dead",
                                             "@spec", "nobody", CheckpointPolicy(1)]))


def _hostile(name: str) -> st.SearchStrategy[tuple[str, tuple[Any, ...]]]:
    good = CASES[name][1]
    slots = [st.one_of(st.just(g), junk) for g in good]
    return st.tuples(st.just(name), st.tuples(*slots)).filter(lambda case: any(a is not g for a, g in zip(case[1], good)))


@settings(max_examples=600, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(sorted(CASES)).flatmap(_hostile))
@example(case=("write_state", ("w", 0, np.arange(4, dtype=np.uint32), 8, 10**400)))
def test_hostile_runtime_arguments_raise_typed_errors_and_leave_the_runtime_usable(world, case):
    name, bad = case
    typed(lambda: call(name, bad))
    ok, out = typed(lambda: call(name, CASES[name][1]))
    assert ok, f"{name} refuses its good arguments after the hostile call: {out}"
