"""Hostile arguments for the host-side public entry points: typed errors, and the object still works.

Each case names a call with good arguments; hypothesis replaces one or more
of them with junk (wrong types, bools in int places, NaN, inf, huge and
negative numbers, numpy scalars and arrays, empty and huge strings, nested
containers, objects of other vkmulti classes). The call must do its job or
raise ValueError, TypeError, IndexError, KeyError or a vkmulti.VkmError with
a short message; afterwards the same object answers the good call.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vkmulti import (Backend, CheckpointBuilder, CheckpointPolicy, DeviceInfo, HlcTimestamp, HotReloadConfig,
                     HotReloadManager, K2KMessage, KernelCodeFormat, KernelCodeSource, KernelId, LaunchOptions,
                     LoadBalancingStrategy,
                     MemoryStorage, MultiGpuBuilder, MultiGpuConfig, MultiGpuCoordinator, VkmError,
                     assign_srus_array)
from vkmulti.cluster import parse_address, split_rows_weighted
from vkmulti.kernels.reference import split_rows

TYPED = (ValueError, TypeError, IndexError, KeyError, VkmError)

junk = st.one_of(
    st.none(), st.booleans(), st.sampled_from([np.bool_(True), np.int64(-1), np.int64(3), np.uint64(2**64 - 1),
                                              np.float32(2.5), np.float64("nan"), np.array([1, 2]),
                                              np.zeros((2, 2)), np.array([], dtype=object)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([-1, 0, 2**31, 2**63, 2**64, -(2**63), 10**400]),
    st.text(max_size=4), st.sampled_from(["", "x" * 100_000, "\x00", "é"]), st.binary(max_size=4),
    st.lists(st.integers(-3, 3), max_size=3), st.tuples(st.integers(-3, 3)),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2), st.builds(object),
    st.sampled_from([[[1]], {"a": [None]}, (None, None)]),
    st.sampled_from([MemoryStorage(), LaunchOptions(), KernelId("a"), HlcTimestamp(1, 0), MultiGpuConfig()]))


def typed(fn: Callable[[], Any]) -> tuple[bool, Any]:
    """(True, result) or (False, error) for a typed error with a short message; anything else propagates."""
    try:
        return True, fn()
    except TYPED as exc:
        assert len(str(exc)) < 600, f"error message of {len(str(exc))} chars: {str(exc)[:200]}..."
        return False, exc


def coordinator() -> MultiGpuCoordinator:
    c = MultiGpuCoordinator()
    for i in range(2):
        c.register_device(DeviceInfo(i, f"GPU {i}", Backend.VULKAN, total_memory=1 << 30, available_memory=1 << 30))
    return c


SPIRV = KernelCodeSource.from_spirv(np.array([0x07230203, 0x00010000, 0, 1, 0], dtype=np.uint32).tobytes())


#: name -> (make the object or None, the call on it, its good arguments).
CASES: dict[str, tuple[Callable[[], Any] | None, Callable[..., Any], tuple[Any, ...]]] = {
    "coordinator.select_device": (coordinator, lambda c, o: c.select_device(o), (LaunchOptions(),)),
    "coordinator.assign_kernel": (coordinator, lambda c, k, d: c.assign_kernel(k, d), ("k", 1)),
    "coordinator.place_kernel": (coordinator, lambda c, k, o: c.place_kernel(k, o), ("p", None)),
    "coordinator.device": (coordinator, lambda c, i: c.device(i), (0,)),
    "coordinator.can_p2p": (coordinator, lambda c, a, b: c.can_p2p(a, b), (0, 1)),
    "coordinator.device_speed": (coordinator, lambda c, i: c.device_speed(i), (0,)),
    "coordinator.set_device_speed": (coordinator, lambda c, i, s: c.set_device_speed(i, s), (0, 1.5)),
    "coordinator.update_device_memory": (coordinator, lambda c, i, m: c.update_device_memory(i, m), (1, 1 << 20)),
    "coordinator.get_device_status": (coordinator, lambda c, i: c.get_device_status(i), (1,)),
    "coordinator.kernels_on_device": (coordinator, lambda c, i: c.kernels_on_device(i), (0,)),
    "coordinator.get_kernel_device": (coordinator, lambda c, k: c.get_kernel_device(k), ("k",)),
    "coordinator.remove_kernel": (coordinator, lambda c, k: c.remove_kernel(k), ("k",)),
    "coordinator.select_device_for_k2k": (coordinator, lambda c, k: c.select_device_for_k2k(k), ("k",)),
    "coordinator.is_device_online": (coordinator, lambda c, i: c.is_device_online(i), (0,)),
    "coordinator.transfer_method": (coordinator, lambda c, a, b: c.transfer_method(a, b), (0, 1)),
    "coordinator.set_custom_selector": (coordinator, lambda c, s: c.set_custom_selector(s), (None,)),
    "coordinator.register_device": (coordinator, lambda c, i, n: c.register_device(DeviceInfo(i, n, Backend.VULKAN)),
                                    (2, "GPU 2")),
    "coordinator.unregister_device": (coordinator, lambda c, i: c.unregister_device(i), (1,)),
    "MultiGpuConfig": (None, lambda lb, a, m, p, pr, s: MultiGpuConfig(lb, a, m, p, pr, s).validate(),
                       (LoadBalancingStrategy.LEAST_LOADED, True, 64, True, [0], True)),
    "MultiGpuBuilder": (MultiGpuBuilder, lambda b, m, d, s: b.max_kernels_per_device(m).preferred_devices(d)
                        .load_balancing(s).build(), (8, [1, 0], LoadBalancingStrategy.ROUND_ROBIN)),
    "LaunchOptions": (LaunchOptions, lambda o, g, b, q, s, p: o.with_grid_size(g).with_block_size(b)
                      .with_queue_capacity(q).with_shared_memory(s).with_priority(p), (2, 64, 16, 0, 1)),
    "LaunchOptions.multi_block": (None, lambda g, b: LaunchOptions.multi_block(g, b), (2, 64)),
    "HotReloadConfig": (HotReloadConfig, lambda c, t, r, b, h: c.with_timeout(t).with_max_retries(r)
                        .with_retry_backoff(b).with_max_rule_history(h), (5.0, 2, 0.1, 3)),
    "HotReloadManager.register_kernel": (HotReloadManager, lambda m, k, code: m.register_kernel(k, code),
                                         ("k", SPIRV)),
    "HotReloadManager.lookup": (HotReloadManager, lambda m, k: (
        m.is_registered("r") or m.register_kernel("r", SPIRV), m.history(k), m.get_current_code(k),
        m.get_current_version(k), m.is_reload_in_progress(k)), ("r",)),
    "HotReloadManager.request_reload": (HotReloadManager, lambda m, k, code: (
        m.is_registered("q") or m.register_kernel("q", SPIRV), m.request_reload(k, code)), ("q", SPIRV)),
    "KernelCodeSource.new": (None, lambda f, c, e: KernelCodeSource.new(f, c, e),
                             (KernelCodeFormat.WGSL, "fn main() {}", "main")),
    "KernelCodeSource.with": (lambda: SPIRV, lambda s, v, k, val: s.with_version(v).with_metadata(k, val),
                              (3, "a", "b")),
    "KernelId": (None, lambda v: KernelId(v).as_str(), ("kernel-7",)),
    "HlcTimestamp": (None, lambda p, lo: HlcTimestamp(p, lo), (1_000, 2)),
    "HlcTimestamp.from_words": (None, lambda lo, hi, lg: HlcTimestamp.from_words(lo, hi, lg), (1, 0, 0)),
    "K2KMessage": (None, lambda s, d, p, t, pr: K2KMessage(s, d, p, tag=t, priority=pr).envelope(1, 2),
                   ("a", "b", b"hi", 3, 1)),
    "CheckpointPolicy": (None, lambda e, c, k: CheckpointPolicy(e, c, k).due("a", 4), (2, ("a",), 1)),
    "CheckpointPolicy.due": (lambda: CheckpointPolicy(2), lambda p, k, s: p.due(k, s), ("a", 4)),
    "CheckpointBuilder": (None, lambda k, t, s, g, d: CheckpointBuilder(k, t).step(s).grid_size(*g)
                          .device_memory("m", d).build().to_bytes(), ("k", "t", 3, (1, 2, 3), b"abcd")),
    "MemoryStorage": (MemoryStorage, lambda m, name: (
        m.save(CheckpointBuilder("k", "t").build(), name), m.exists(name), m.load(name), m.size(name),
        m.delete(name)), ("cp",)),
    "assign_srus_array": (None, lambda c, n, w, h: assign_srus_array(c, n, weights=w, hysteresis=h),
                          ([1.0, 2.0, 3.0], 2, [1.0, 1.0], 0.0)),
    "split_rows": (None, lambda h, p: split_rows(h, p), (10, 3)),
    "split_rows_weighted": (None, lambda h, w: split_rows_weighted(h, w), (10, [1.0, 2.0])),
    "parse_address": (None, lambda a: parse_address(a), ("ray://127.0.0.1:10001",)),
}

_made: dict[str, Any] = {}


def target(name: str) -> Any:
    """The case's object, one per case for the module (so junk can pile up on it)."""
    make = CASES[name][0]
    if make is None:
        return None
    if name not in _made:
        _made[name] = make()
    return _made[name]


def call(name: str, args: tuple[Any, ...]) -> Any:
    make, fn, _ = CASES[name]
    return fn(*args) if make is None else fn(target(name), *args)


def _hostile(name: str) -> st.SearchStrategy[tuple[str, tuple[Any, ...]]]:
    good = CASES[name][2]
    slots = [st.one_of(st.just(g), junk) for g in good]
    return st.tuples(st.just(name), st.tuples(*slots)).filter(lambda case: any(a is not g for a, g in zip(case[1], good)))


LONG = "x" * 100_000


@settings(max_examples=1500, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(sorted(CASES)).flatmap(_hostile))
@example(case=("split_rows", (2**63, 2**63)))
@example(case=("split_rows_weighted", (10, [10**400])))
@example(case=("HotReloadConfig", (10**400, 2, 0.1, 3)))
@example(case=("assign_srus_array", ([1.0], 2, None, 10**400)))
@example(case=("HlcTimestamp", (LONG, 0)))
@example(case=("CheckpointBuilder", ("k", "t", LONG, (1, 2, 3), b"")))
@example(case=("MultiGpuBuilder", (8, LONG, LoadBalancingStrategy.ROUND_ROBIN)))
@example(case=("HotReloadManager.lookup", (LONG,)))
@example(case=("coordinator.get_kernel_device", (LONG,)))
@example(case=("KernelCodeSource.new", (LONG, "fn main() {}", "main")))
@example(case=("KernelCodeSource.with", (3, LONG, 0)))
def test_hostile_arguments_raise_typed_errors_and_leave_the_object_usable(case):
    name, bad = case
    typed(lambda: call(name, bad))
    ok, out = typed(lambda: call(name, CASES[name][2]))
    assert ok, f"{name} refuses its good arguments after the hostile call: {out}"
