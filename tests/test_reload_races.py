"""Hot reload racing steps and live migrations on the virtual GPU pair: one thread
steps the runtime, one sends host messages through a forwarder to a sink, one
moves both kernels back and forth, one reloads both with fresh code (the same
program with new bytes: a cold compile each time). Every message arrives at the
sink exactly once and in order per sender (count, sum and the GPU's FIFO check),
each kernel ends on the code of its last successful reload, no thread is left
hanging (every join and wait is bounded) and none fails except for the one
documented refusal: a migration of a kernel whose code was swapped while it
moved ("migrate it again")."""
from __future__ import annotations

import functools
import threading
import time

import numpy as np

import kernel_support
from kernel_support import runtime_fixture
from vkmulti import CrossGpuK2KRouter, HotReloadConfig, HotReloadManager, KernelCodeSource, MigrationError
from vkmulti.kernels.reference import COUNTER_TAG_FORWARD, read_counter

MAX = 32
runtime = runtime_fixture(max_kernels=MAX)
counter = functools.partial(kernel_support.counter, max_sources=MAX)
JOIN = 120.0


def _fresh(spirv: bytes, tag: int) -> KernelCodeSource:
    """The same program with another generator word: new bytes, a pipeline not built yet."""
    raw = bytearray(spirv)
    raw[8:12] = tag.to_bytes(4, "little")
    return KernelCodeSource.from_spirv(bytes(raw))


def test_reload_racing_steps_and_migrations(runtime):
    router = CrossGpuK2KRouter(runtime.coordinator, runtime)
    try:
        _race(runtime)
    finally:
        router.detach()


def _race(runtime):
    sink = counter(runtime, "sink", device=0, inbox=4)
    fwd = counter(runtime, "fwd", device=1, params=[sink.address])
    runtime.prebuild.wait_idle(60)
    reloads = HotReloadManager(HotReloadConfig().with_preserve_state(True).with_validate_before_swap(False)
                               .with_timeout(60.0))
    for k in (sink, fwd):
        reloads.register_runtime_kernel(k)
    stop = threading.Event()
    errors: dict[str, list] = {"step": [], "send": [], "move": [], "reload": []}
    refused = []      # migrations refused because the code changed while the kernel moved
    moved = []
    last_code = {}    # kernel -> the code of its last successful reload
    sent = [0, 0]     # count, sum

    def guard(name, fn):
        def run():
            try:
                fn()
            except BaseException as exc:   # asserted on below
                errors[name].append(exc)
        return threading.Thread(target=run, name=f"race-{name}", daemon=True)

    def steps():
        while not stop.is_set():
            runtime.step(timeout=30)

    def sends():
        for i in range(60):
            runtime.send(fwd, np.array([i + 1], np.uint32), tag=COUNTER_TAG_FORWARD, timeout=30)
            sent[0] += 1
            sent[1] += i + 1
            time.sleep(0.002)

    def moves():
        for i in range(8):
            k = (sink, fwd)[i % 2]
            try:
                moved.append(runtime.migrate(k, 1 - k.device_index, timeout=30))
            except MigrationError as exc:
                if "reloaded while it moved" not in str(exc):
                    raise
                refused.append(exc)
            time.sleep(0.005)

    def reload_loop():
        for i in range(6):
            k = (sink, fwd)[i % 2]
            code = _fresh(k.spec.spirv, 0xC000 + i)
            reloads.reload(k, code)
            last_code[k] = code.code

    threads = [guard("step", steps), guard("send", sends), guard("move", moves), guard("reload", reload_loop)]
    for t in threads:
        t.start()
    try:
        for t in threads[1:]:
            t.join(JOIN)
            assert not t.is_alive(), f"{t.name} did not finish within {JOIN} s (a deadlock?)"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and read_counter(runtime.read_state(sink)).count < sent[0]:
            time.sleep(0.01)
    finally:
        stop.set()
        threads[0].join(JOIN)
    assert not threads[0].is_alive(), "the stepping thread did not stop (a deadlock?)"
    assert errors == {"step": [], "send": [], "move": [], "reload": []}, errors
    st = read_counter(runtime.read_state(sink))
    assert (st.count, st.sum, st.fifo_errors) == (sent[0], sent[1], 0) and sent[0] == 60
    assert len(moved) + len(refused) == 8 and all(r.live and r.checksum_match for r in moved)
    for k in (sink, fwd):
        assert k.spec.spirv == last_code[k]
        assert runtime.coordinator.get_kernel_device(k.id) == k.device_index
    # both still step and move with the code they have
    r = runtime.migrate(sink, 1 - sink.device_index, timeout=30)
    assert r.checksum_match
    runtime.send(fwd, np.array([1000], np.uint32), tag=COUNTER_TAG_FORWARD, timeout=30)
    kernel_support.settle(runtime, None, lambda: read_counter(runtime.read_state(sink)).count == 61)
    assert read_counter(runtime.read_state(sink)).sum == sent[1] + 1000
