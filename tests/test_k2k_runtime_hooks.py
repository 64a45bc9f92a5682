"""The runtime hooks the K2K router stands on, and large messages: planned
delivery (a plan pass, then a copy pass per message) for payloads >= 1 KiB on
one device and across devices, retaining listeners, accept_batch options,
poll / forget_buffer / withdraw_batch, and bench/k2k.py's figures."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kernel_support import make_coordinator
from script_support import load_script
from vkmulti import CrossGpuK2KRouter
from vkmulti import Buffer
from vkmulti.kernels import KernelRuntime, counter_kernel
from vkmulti.kernels.reference import (COUNTER_TAG_FORWARD, burst_kernel, counter_initial_state, read_burst,
                                       read_counter)
from vkmulti.kernels.engine.step_recorder import PLANNED_DELIVERY_PAYLOAD
from vkmulti.kernels.runtime import OutboxFeed, RuntimePort

MAX = 32


@pytest.fixture
def big(manager):
    """A runtime with 2 KiB payloads (planned delivery) and its router."""
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX, payload_size=2048)
    router = CrossGpuK2KRouter(rt.coordinator, rt)
    try:
        yield rt, router
    finally:
        router.detach()
        rt.destroy()


def counter(rt, name, device, **kw):
    return rt.launch(counter_kernel(max_sources=MAX, inbox_capacity=kw.pop("inbox", 64)), name, device=device,
                     state=[counter_initial_state(MAX)], **kw)


def test_large_messages_are_delivered_exactly_once_in_order(big):
    rt, _ = big
    assert rt.payload_size >= PLANNED_DELIVERY_PAYLOAD
    far = counter(rt, "far", 1, inbox=3)                 # wraps many times
    near = counter(rt, "near", 0, inbox=5)
    a = counter(rt, "a", 0, params=[far.address])
    b = counter(rt, "b", 0, params=[near.address])
    values = list(range(1, 41))
    for v in values:
        rt.send(a, np.array([v], np.uint32), tag=COUNTER_TAG_FORWARD)
        rt.send(b, np.array([v * 3], np.uint32), tag=COUNTER_TAG_FORWARD)
    for _ in range(40):
        rt.step([a, b, far, near])
    rt.synchronize()
    f, n = read_counter(rt.read_state(far)), read_counter(rt.read_state(near))
    assert (f.count, f.sum, f.fifo_errors, f.hops_sum) == (40, sum(values), 0, 40)
    assert (n.count, n.sum, n.fifo_errors, n.hops_sum) == (40, 3 * sum(values), 0, 0)


def test_full_payload_bursts_arrive_intact(manager):
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX, payload_size=8192)
    router = CrossGpuK2KRouter(rt.coordinator, rt)
    try:
        spec = burst_kernel(12)
        sink = rt.launch(spec, "sink", device=1)
        local = rt.launch(spec, "local", device=0)
        src = rt.launch(spec, "src", device=0, params=[sink.address, 12])
        src2 = rt.launch(spec, "src2", device=0, params=[local.address, 12])
        for _ in range(6):
            rt.step([src, src2, sink, local])
        src.set_params(sink.address, 0)
        src2.set_params(local.address, 0)
        rt.step([src, src2, sink, local])
        rt.synchronize()
        for k in (sink, local):
            st = read_burst(rt.read_state(k))
            assert (st.received, st.bad, st.bytes) == (72, 0, 72 * 8192)
        assert router.stats().messages_routed == 72
    finally:
        router.detach()
        rt.destroy()


def test_a_retaining_listener_holds_batches_until_released(manager):
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    kept = []
    rt.add_step_listener(kept.extend, retain=True)
    try:
        k = counter(rt, "k", 0)
        deferred = []
        for _ in range(6):
            deferred += rt.step(k).deferred
        assert len(kept) == rt.in_flight and deferred and all(b.retained == 1 for b in kept)
        for b in kept:
            b.release()
        with pytest.raises(ValueError, match="not retained"):
            kept[0].release()
        rt.remove_step_listener(kept.extend)
        rt.synchronize()
        assert not rt.step(k).deferred
    finally:
        rt.destroy()


def test_runtime_hook_arguments_are_checked(manager):
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    buf = Buffer(manager.slot(0), 4096)
    try:
        with pytest.raises(TypeError, match="retain"):
            rt.add_step_listener(print, retain=1)
        with pytest.raises(ValueError, match="hops"):
            rt.accept_batch(0, buf, hops=300)
        with pytest.raises(TypeError, match="report_unknown"):
            rt.accept_batch(0, buf, report_unknown="no")
        with pytest.raises(TypeError, match="submitted"):
            rt.accept_batch(0, buf, submitted=3)
        with pytest.raises(TypeError, match="reuse_sets"):
            rt.accept_batch(0, buf, reuse_sets=None)
        with pytest.raises(TypeError, match="InboundBatch"):
            rt.withdraw_batch(buf)
        with pytest.raises(TypeError, match="Buffer"):
            rt.forget_buffer("buffer")
        with pytest.raises(TypeError, match="take"):
            rt.set_outbox_feed(object())
        inbound = rt.accept_batch(0, buf, reuse_sets=True)   # zeros: an empty batch
        assert rt.withdraw_batch(inbound) == 0 and inbound.done
        rt.forget_buffer(buf)
        rt.poll()
        k = counter(rt, "k", 0)
        rt.step(k).wait(30)
        rt.poll()
        assert k.stats.steps_completed == 1
    finally:
        buf.destroy()
        rt.destroy()


def test_bench_prints_figures_and_a_ratio_line(capsys):
    bench = load_script(Path("bench/k2k.py"), "k2k_bench")
    assert bench.main(["--hops", "4", "--rounds", "2", "--max", "64K", "--stencil", "64x32",
                       "--stencil-steps", "3"]) == 0
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1].startswith("ratio: K2K one-way latency ") and "x the hardware floor" in out[-1]
    figures = json.loads("\n".join(out[:-1]))
    lat = figures["latency"]
    assert lat["k2k_one_way_us"] > 0 and lat["host_relay_one_way_us"] > 0 and lat["message_bytes"] == 256
    assert lat["batch_relay_one_way_us"] > 0 and lat["ratio_k2k_to_batch_relay"] > 0
    assert len(lat["k2k_one_way_us_rounds"]) == 2 and len(lat["ratio_k2k_to_batch_relay_range"]) == 2
    assert lat["floor_us"] > 0 and len(lat["floor_us_rounds"]) == 2 and lat["ratio_k2k_to_floor"] > 0
    assert lat["floor_us"] >= lat["floor_transfer_us"] > 0 and lat["floor_submit_us"] > 0
    assert lat["host_us_per_step"] > 0 and 0 < lat["host_cpu_us_per_step"] <= 2 * lat["host_us_per_step"]
    assert [r["batch_bytes"] for r in figures["bandwidth"]][0] > 15000
    for r in figures["bandwidth"]:
        assert r["bad_messages"] == 0 and r["k2k_gbps"] > 0 and r["raw_gbps"] > 0
        assert len(r["k2k_gbps_rounds"]) == len(r["raw_gbps_rounds"]) == 2 and r["sender"] == "restamped payloads"
    assert figures["stencil"]["identical"] and figures["stencil"]["speedup"] > 0
    assert 0 < figures["stencil"]["host_share_2"] and figures["stencil"]["host_us_per_step_2"] > 0
    with pytest.raises(SystemExit):
        bench.main(["--hops", "1"])
    with pytest.raises(SystemExit):
        bench.main(["--max", "1K"])
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0"])


def test_state_larger_than_a_storage_binding_is_refused(manager):
    """A stencil slab (or any state) past maxStorageBufferRange is a clear error, not a bad binding."""
    from vkmulti.kernels import KernelSpec
    from vkmulti._core.shaders import shader_path

    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    try:
        limit = rt._context(0).max_storage_range
        spec = KernelSpec("huge", shader_path("kernel_counter.comp.spv").read_bytes(), state_sizes=((limit // 4 + 1) * 4,))   # the first multiple of 4 past the limit
        with pytest.raises(ValueError, match="maxStorageBufferRange"):
            rt.launch(spec, device=0)
        assert rt.kernels == [] and counter(rt, "ok", 0).id == "ok"
    finally:
        rt.destroy()


def test_the_router_and_the_runtime_meet_through_the_published_protocols(manager):
    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    router = CrossGpuK2KRouter(rt.coordinator, rt)
    try:
        assert isinstance(router, OutboxFeed) and rt.outbox_feed is router
        assert isinstance(rt.inbound, RuntimePort)
        far = counter(rt, "far", 1)
        assert rt.inbound.kernel_by_address(far.address) is far
        assert rt.inbound.kernel_by_address(far.address + MAX) is None   # same index, another generation
        assert router.flush() == 0   # nothing queued
    finally:
        router.detach()
        rt.destroy()
    assert router.flush() == 0   # detached


def test_the_manager_tears_down_an_attached_router_first():
    """Destroying the manager while a router, its runtime and batches in flight are alive:
    the router detaches before the runtime goes, nothing leaks (validation checks the devices)."""
    from vkmulti import MultiDeviceManager

    mgr = MultiDeviceManager.create(enabled=True)
    rt = KernelRuntime(make_coordinator(mgr), mgr, max_kernels=MAX)
    router = CrossGpuK2KRouter(rt.coordinator, rt)
    far = counter(rt, "far", 1)
    senders = [counter(rt, f"s{i}", 0, params=[far.address]) for i in range(2)]   # gathered moves
    for v in range(20):
        for s in senders:
            rt.send(s, np.array([v], np.uint32), tag=COUNTER_TAG_FORWARD)
    for _ in range(3):
        rt.step()
    mgr.destroy()
    assert router.runtime is None and rt.outbox_feed is None
    router.detach()   # idempotent after the manager's teardown
    rt.destroy()
