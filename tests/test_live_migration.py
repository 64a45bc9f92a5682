"""Live migration, checkpoint / restore and the checkpoint policy of runtime
kernels on the virtual GPU pair (issue 16): exactly once and in order under
message load while kernels move back and forth, state byte-identical, a
corrupted copy caught by the CRC32s (FAILED, kernel left where it was, no
message lost), destroy racing migrate, unregister_device plans carried out."""
from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest

import kernel_support
from kernel_support import router  # noqa: F401 (the shared router fixture)
from kernel_support import runtime_fixture
from vkmulti import (Checkpoint, CheckpointPolicy, CrossGpuK2KRouter, FileStorage, KernelMigrator, MemoryStorage,
                     MigrationError, MigrationState)
from vkmulti.errors import DestroyedError, InvalidCheckpointError, InvalidConfigError, KernelNotFoundError
from vkmulti.kernels import KernelSpec, counter_kernel
from vkmulti.kernels.lifecycle import GpuCrc
from vkmulti.kernels.lifecycle import HostCrc
from vkmulti.kernels.reference import (COUNTER_TAG_ADD, COUNTER_TAG_FORWARD, COUNTER_TAG_QUERY,
                                       counter_initial_state, read_counter)

MAX = 64


runtime = runtime_fixture(max_kernels=MAX)


counter = functools.partial(kernel_support.counter, max_sources=MAX)


def w(*values):
    return np.array(values, np.uint32)


def settle(rt, router, kernels, done, limit=300):
    for _ in range(limit):
        rt.step(kernels)
        if done():
            rt.synchronize()
            return
    raise AssertionError("not delivered within the step limit")


@pytest.mark.parametrize("landings", [None, 1], ids=["router-default", "router-one-landing"])
def test_exactly_once_in_order_while_kernels_move_under_load(runtime, run_threads, landings):
    """Forwarders on both GPUs send to a sink while a stepping thread runs and host
    threads keep sending; the sink and a forwarder move back and forth. Every
    message arrives exactly once (count and sum), every sender's sequence numbers
    arrive 0, 1, 2, ... (checked on the GPU). With one landing per edge the
    router's moves wait for room: the migration lets the others step between
    rounds until they are submitted."""
    router = CrossGpuK2KRouter(runtime.coordinator, runtime, max_landings=landings)
    sink = counter(runtime, "sink", device=0, inbox=4)
    fwd = [counter(runtime, f"fwd{i}", device=i % 2, params=[sink.address]) for i in range(4)]
    stop = threading.Event()
    step_errors = []

    def step_loop():
        try:
            while not stop.is_set():
                runtime.step()
        except Exception as exc:   # reported below
            step_errors.append(exc)
    stepping = threading.Thread(target=step_loop)
    stepping.start()
    total = [0]
    lock = threading.Lock()
    try:
        def sender(t):
            for i in range(40):
                v = 1000 * t + i
                runtime.send(fwd[t], w(v), tag=COUNTER_TAG_FORWARD, timeout=60)
                with lock:
                    total[0] += v
                time.sleep(0.002)

        def mover(_):
            results = []
            for i in range(6):
                time.sleep(0.03)
                k = sink if i % 3 else fwd[1]
                results.append(runtime.migrate(k, 1 - k.device_index))
            return results
        moved = []
        errors = run_threads(lambda t: sender(t) if t < 4 else moved.extend(mover(t)), 5)
        assert errors == []
    finally:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and read_counter(runtime.read_state(sink)).count < 160:
            time.sleep(0.05)
        stop.set()
        stepping.join()
    assert step_errors == []
    st = read_counter(runtime.read_state(sink))
    assert (st.count, st.sum, st.fifo_errors) == (160, total[0], 0)
    assert len(moved) == 6 and all(r.live and r.checksum_match for r in moved)
    assert all(r.total_duration >= r.transfer_duration for r in moved)
    assert runtime.coordinator.get_kernel_device("sink") == sink.device_index
    router.detach()


def test_messages_waiting_for_the_kernel_move_with_it(runtime, router):
    """Messages from a sender on the same GPU (waiting in its outbox) and from one on
    the other GPU (landed there by the router) wait for a sink that is not stepped;
    the migration takes them along (in order), none is delivered twice."""
    sink = counter(runtime, "sink", device=0, inbox=2)
    local = counter(runtime, "local", device=0, params=[sink.address])
    remote = counter(runtime, "remote", device=1, params=[sink.address])
    for i in range(6):
        runtime.send(local, w(i), tag=COUNTER_TAG_FORWARD)
        runtime.send(remote, w(100 + i), tag=COUNTER_TAG_FORWARD)
        runtime.step([local, remote])
    runtime.synchronize()
    result = runtime.migrate(sink, 1)
    assert result.messages_moved > 0 and result.checksum_match
    settle(runtime, router, None, lambda: read_counter(runtime.read_state(sink)).count == 12)
    for _ in range(5):
        runtime.step()
    runtime.synchronize()
    st = read_counter(runtime.read_state(sink))
    assert (st.count, st.sum, st.fifo_errors) == (12, sum(range(6)) + sum(range(100, 106)), 0)
    back = runtime.migrate(sink, 0)
    assert back.messages_moved == 0
    runtime.send(local, w(1000), tag=COUNTER_TAG_FORWARD)
    settle(runtime, router, None, lambda: read_counter(runtime.read_state(sink)).count == 13)
    assert read_counter(runtime.read_state(sink)).fifo_errors == 0


@pytest.mark.parametrize("engine", ["auto", "shader"])
def test_state_is_byte_identical_and_the_kernel_keeps_counting(runtime, router, engine):
    """(with the default CRC32 engine and with the GPU shader forced)"""
    runtime.migration_crc = engine
    rng = np.random.default_rng(3)
    spec = KernelSpec("big-counter", counter_kernel(max_sources=MAX).spirv,
                      state_sizes=(counter_kernel(max_sources=MAX).state_sizes[0], 1 << 20, 4100))
    extra = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    k = runtime.launch(spec, "k", device=0, state=[counter_initial_state(MAX), extra, None])
    peer = counter(runtime, "peer", device=1, params=[k.address])
    for i in range(5):
        runtime.send(k, w(i), tag=COUNTER_TAG_ADD)
        runtime.send(peer, w(100 + i), tag=COUNTER_TAG_FORWARD)
        runtime.step()
    runtime.synchronize()
    before = [runtime.read_state(k, i) for i in range(3)]
    cp_before = runtime.checkpoint(k)
    steps = k.steps
    runtime.send(k, w(7), tag=COUNTER_TAG_ADD)     # queued on the host across the move
    result = runtime.migrate(k, 1)
    assert (k.device_index, k.steps, result.source_device, result.target_device) == (1, steps, 0, 1)
    assert result.checksum_match is True and result.bytes_moved >= (1 << 20) + 4096
    assert result.transfer_method in ("dmabuf", "host_shared", "staging_copy")
    for i in range(3):
        assert np.array_equal(runtime.read_state(k, i), before[i])
    cp_after = runtime.checkpoint(k)
    assert cp_after.get_device_memory("state1").data == cp_before.get_device_memory("state1").data
    assert cp_after.metadata.hlc_timestamp == cp_before.metadata.hlc_timestamp
    settle(runtime, router, None, lambda: read_counter(runtime.read_state(k)).count == 11)
    st = read_counter(runtime.read_state(k))
    assert (st.count, st.sum, st.fifo_errors) == (11, sum(range(5)) + 7 + sum(range(100, 105)), 0)
    assert runtime.coordinator.get_kernel_device("k") == 1
    assert np.array_equal(runtime.read_state(k, 1), before[1])


def test_a_moves_phases_do_not_overlap(runtime, monkeypatch):
    """Each phase of a move is its own interval of the total: the restore phase counted
    the check's time as well (a check made slow here: 0.2 s)."""
    from vkmulti.kernels.lifecycle import chunked_copy
    for cls in (chunked_copy.ChunkedCopy, chunked_copy.HostChunkedCopy):
        def slow(self, timeout, real=cls.mismatches):
            time.sleep(0.2)
            return real(self, timeout)
        monkeypatch.setattr(cls, "mismatches", slow)
    k = counter(runtime, "k", device=0)
    result = runtime.migrate(k, 1)
    phases = (result.quiesce_duration, result.checkpoint_duration, result.transfer_duration,
              result.verify_duration, result.restore_duration)
    assert result.verify_duration >= 0.2 and sum(phases) <= result.total_duration, (phases, result.total_duration)


def test_a_move_that_a_restore_overtakes_fails_and_the_restore_stands(runtime, monkeypatch):
    """A restore into a kernel while it is being moved replaces its device half first:
    the move, at its switch, fails with MigrationError (before staging anything) and
    the kernel keeps the restored state where the restore put it. Before: both calls
    reported success and the move put back the pre-restore state."""
    from vkmulti.kernels.lifecycle import live_migration
    from vkmulti.errors import MigrationError
    k = counter(runtime, "k", device=0)
    runtime.send(k, w(1), tag=COUNTER_TAG_ADD)
    runtime.step(k).wait(30)
    cp = runtime.checkpoint(k)                       # sum 1
    runtime.send(k, w(10), tag=COUNTER_TAG_ADD)
    runtime.step(k).wait(30)                         # sum 11
    at_switch, restored = threading.Event(), threading.Event()
    real = live_migration.switch_at_step_boundary

    def late(*args, **kw):   # the move has copied; the restore runs before its switch
        at_switch.set()
        assert restored.wait(30)
        return real(*args, **kw)
    monkeypatch.setattr(live_migration, "switch_at_step_boundary", late)
    out: dict = {}

    def move():
        try:
            out["move"] = runtime.migrate(k, 1)
        except MigrationError as exc:
            out["move"] = exc
    t = threading.Thread(target=move)
    t.start()
    try:
        assert at_switch.wait(30)
        runtime.restore(cp, into=k, device=0)
    finally:
        restored.set()
        t.join(30)
    assert isinstance(out["move"], MigrationError) and "restored or moved by another call" in str(out["move"])
    assert k.device_index == 0 and read_counter(runtime.read_state(k)).sum == 1
    runtime.send(k, w(5), tag=COUNTER_TAG_ADD)
    runtime.step(k).wait(30)
    assert read_counter(runtime.read_state(k)).sum == 6
    assert runtime.migrate(k, 1).checksum_match and read_counter(runtime.read_state(k)).sum == 6


def test_host_messages_produced_before_the_move_are_received(runtime):
    k = counter(runtime, "k", device=1)
    runtime.send(k, w(5), tag=COUNTER_TAG_ADD)
    runtime.send(k, w(0), tag=COUNTER_TAG_QUERY)
    runtime.step(k)
    runtime.migrate(k, 0)
    reply = runtime.receive(k, timeout=10)
    assert reply.source_kernel == "k"
    runtime.send(k, w(0), tag=COUNTER_TAG_QUERY)
    runtime.step(k)
    assert runtime.receive(k, timeout=10).sequence == reply.sequence + 1   # the sequence numbers continue


@pytest.mark.parametrize("timeout", [None, float("inf")], ids=["none", "inf"])
def test_a_move_without_a_time_limit_completes(runtime, timeout):
    if all(HostCrc.suits(runtime.manager.slot(i)) for i in (0, 1)):   # (CPU devices: the host hashes)
        runtime.migration_crc = "host"   # (its CRC32 jobs are waited for through Python's own waits)
    k = counter(runtime, "k", device=0)
    runtime.send(k, w(5), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    assert runtime.migrate(k, 1, timeout=timeout).checksum_match and k.device_index == 1
    assert read_counter(runtime.read_state(k)).sum == 5


def test_a_receive_waiting_while_its_kernel_moves_gets_the_reply_from_the_new_device(runtime):
    k = counter(runtime, "k", device=0)
    runtime.step(k).wait(10)
    waiting, out = kernel_support.call_in_thread(lambda: runtime.receive(k, timeout=20))
    old = k.ctx
    waiting.start()
    while old.cond.waiting == 0 and waiting.is_alive():   # (the receive waits on GPU 0)
        time.sleep(0.01)
    runtime.migrate(k, 1)
    runtime.send(k, w(0), tag=COUNTER_TAG_QUERY)
    runtime.step(k)   # the reply is made on GPU 1, and nothing else reads GPU 1's steps back
    waiting.join(60)
    assert "error" not in out, out.get("error")
    assert out["result"].source_kernel == "k" and runtime.pending_receives(k) == 0


@pytest.mark.parametrize("engine", ["shader", "host"])
def test_a_corrupted_copy_fails_and_leaves_the_kernel_running(runtime, router, monkeypatch, engine):
    """The destination's CRC32 differs from the source's (a word of what arrived is
    damaged once the copy landed, before the destination hashes it; between CPU
    devices, whose copy the host makes, a byte flipped by the copy): FAILED,
    counted, the kernel still on GPU 0 and its messages (taken into the staging
    batch) not lost. With the GPU shader and with the host engine of a CPU device."""
    if engine == "host" and not HostCrc.suits(runtime.manager.slot(1)):
        pytest.skip("the host CRC32 engine is for CPU devices")
    runtime.migration_crc = engine
    cls = GpuCrc if engine == "shader" else HostCrc
    sink = counter(runtime, "sink", device=0, inbox=2)
    fwd = counter(runtime, "fwd", device=1, params=[sink.address])
    for i in range(12):
        runtime.send(fwd, w(i), tag=COUNTER_TAG_FORWARD)
    for _ in range(6):
        runtime.step([fwd])   # messages wait on GPU 0 for the sink
    runtime.synchronize()
    real = cls.submit
    damaged = []

    def corrupting(self, ranges, waits=(), *args):
        ranges = list(ranges)
        waits = list(waits)
        if self.ctx.index == 1 and not damaged and ranges[0][0] is not getattr(self, "tables", None):
            # the destination's first check of a move (not a new engine's check of itself): damage what arrived
            import vulkan as vk
            for p in waits:
                self.ctx.slot.native.wait_timeline(p.semaphore, p.value, 10.0)
            buf = ranges[0][0]
            self.ctx.run_once(lambda cmd: vk.vkCmdFillBuffer(cmd, buf.handle, 0, 4, 0xDEADBEEF))
            damaged.append(buf)
        return real(self, ranges, waits, *args)
    real_copyto = np.copyto

    def damaging(dst, src, *args, **kw):   # the host's copy between CPU devices: a byte flipped on the way
        real_copyto(dst, src, *args, **kw)
        if not damaged and threading.current_thread().name.startswith("vkm-crc-jobs"):
            dst.reshape(-1).view(np.uint8)[0] ^= 0xFF
            damaged.append(dst)
    monkeypatch.setattr(cls, "submit", corrupting)
    if engine == "host":
        monkeypatch.setattr(np, "copyto", damaging)
    migrator = KernelMigrator(runtime.coordinator)
    request = runtime.coordinator.request_migration("sink", 1)
    with pytest.raises(MigrationError, match="CRC32 mismatch"):
        migrator.migrate_with_checkpoint(sink, request)
    monkeypatch.undo()
    assert damaged
    assert request.state is MigrationState.FAILED
    assert migrator.stats().failed_migrations == 1 and migrator.stats().successful_migrations == 0
    assert sink.device_index == 0 and runtime.coordinator.get_kernel_device("sink") == 0
    assert not runtime.is_held(sink)
    settle(runtime, router, None, lambda: read_counter(runtime.read_state(sink)).count == 12)
    st = read_counter(runtime.read_state(sink))
    assert (st.count, st.sum, st.fifo_errors) == (12, sum(range(12)), 0)
    migrator.migrate_with_checkpoint(sink, runtime.coordinator.request_migration("sink", 1))   # undamaged: moves
    assert sink.device_index == 1 and migrator.stats().successful_migrations == 1
    assert read_counter(runtime.read_state(sink)).sum == sum(range(12))


def test_destroy_racing_migrate(runtime, router):
    """destroy_kernel from another thread while the kernel migrates back and forth:
    no crash, the migration either completes or fails cleanly, and the runtime
    goes on working."""
    for round_ in range(3):
        k = counter(runtime, f"victim{round_}", device=0)
        runtime.step(k)
        outcome = []

        def migrate_loop():
            try:
                for _ in range(20):
                    runtime.migrate(k, 1 - k.device_index)
            except (MigrationError, DestroyedError, KernelNotFoundError) as exc:
                outcome.append(exc)
        t = threading.Thread(target=migrate_loop)
        t.start()
        time.sleep(0.01 * (round_ + 1))
        runtime.destroy_kernel(k)
        t.join()
        assert k.destroyed
        with pytest.raises(DestroyedError):
            runtime.step(k)
        assert runtime.coordinator.get_kernel_device(k.id) is None
    other = counter(runtime, "after", device=1)
    runtime.send(other, w(3), tag=COUNTER_TAG_ADD)
    runtime.step(other)
    assert read_counter(runtime.read_state(other)).count == 1


def test_unregister_device_plans_are_carried_out(runtime, router):
    coord = runtime.coordinator
    sink = counter(runtime, "sink", device=0)
    ks = [counter(runtime, f"k{i}", device=1, params=[sink.address]) for i in range(3)]
    for i, k in enumerate(ks):
        runtime.send(k, w(i + 1), tag=COUNTER_TAG_FORWARD)
    runtime.step()
    result = coord.unregister_device(1)
    assert [p.kernel_id for p in result.kernels_to_migrate] == ["k0", "k1", "k2"]
    outcomes = KernelMigrator(coord).carry_out(result, runtime)
    assert [o.ok for o in outcomes] == [True, True, True], [o.error for o in outcomes]
    assert all(k.device_index == 0 for k in ks)
    for i, k in enumerate(ks):
        runtime.send(k, w(10 * (i + 1)), tag=COUNTER_TAG_FORWARD)
    settle(runtime, router, None, lambda: read_counter(runtime.read_state(sink)).count == 6)
    st = read_counter(runtime.read_state(sink))
    assert (st.count, st.sum, st.fifo_errors) == (6, 66, 0)


def test_bad_migrations_are_refused_and_change_nothing(runtime):
    k = counter(runtime, "k", device=0)
    with pytest.raises(InvalidConfigError):
        runtime.migrate(k, 0)
    with pytest.raises(Exception):
        runtime.migrate(k, 7)
    with pytest.raises(TypeError):
        runtime.migrate(k, "1")
    req = runtime.coordinator.request_migration("k", 1)
    other = counter(runtime, "other", device=0)
    with pytest.raises(ValueError):
        KernelMigrator(runtime.coordinator).migrate_with_checkpoint(other, req)
    for verify in (None, "no", 0):   # (None and 0 would move without the CRC32 check)
        with pytest.raises(TypeError, match="verify"):
            runtime.migrate(k, 1, verify=verify)
    assert k.device_index == 0 and not runtime.is_held(k)
    runtime.step(k)


def test_migration_without_a_router_moves_a_lone_kernel(runtime):
    k = counter(runtime, "k", device=1)
    runtime.send(k, w(4), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    r = runtime.migrate(k, 0, verify=False)
    assert r.checksum_match is None and k.device_index == 0
    runtime.send(k, w(5), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    st = read_counter(runtime.read_state(k))
    assert (st.count, st.sum) == (2, 9)


def test_held_kernels_are_deferred_with_the_reason(runtime):
    k = counter(runtime, "k", device=0)
    k.prepare_for_migration()
    assert k.is_quiescent() and runtime.is_held(k)
    ticket = runtime.step()
    assert [(d.id, why) for d, why in ticket.deferred] == [("k", "prepared for migration")]
    k.cancel_migration()
    assert not runtime.is_held(k)
    assert runtime.step().launched == [k]
    assert k.estimated_state_size() >= k.states[0].size


def test_a_release_without_its_hold_lets_go_of_no_other_hold(runtime, monkeypatch):
    k = counter(runtime, "k", device=0)
    k.prepare_for_reload()
    k.cancel_migration()   # (never prepared for migration)
    assert runtime.is_held(k)
    assert [(d.id, why) for d, why in runtime.step().deferred] == [("k", "prepared for reload")]
    k.resume_after_reload()
    assert not runtime.is_held(k)
    from vkmulti.kernels.lifecycle import live_migration
    real, seen = live_migration.wait_kernel, []

    def stray(rt, kernel, deadline):   # a careless caller's resume while the kernel moves
        kernel.resume_after_reload()
        seen.append(rt.is_held(kernel))
        return real(rt, kernel, deadline)
    monkeypatch.setattr(live_migration, "wait_kernel", stray)
    assert runtime.migrate(k, 1).checksum_match and seen == [True] and not runtime.is_held(k)


# ---- checkpoint and restore ----

def test_checkpoint_restore_new_and_into(runtime, tmp_path):
    k = counter(runtime, "k", device=0)
    for i in range(4):
        runtime.send(k, w(i + 1), tag=COUNTER_TAG_ADD)
        runtime.step(k)
    runtime.send(k, w(50), tag=COUNTER_TAG_ADD)   # still on the host at the checkpoint
    cp = k.create_checkpoint()
    assert cp.metadata.current_step == 4 and cp.metadata.kernel_type == "counter"
    assert cp.metadata.tile_size == (1, 1, 1) and cp.metadata.grid_size == (1, 1, 1)
    fs = FileStorage(tmp_path)
    fs.save(cp, "k@4")
    loaded = fs.load("k@4")
    copy = runtime.restore(loaded, device=1, kernel_id="copy")
    assert copy.device_index == 1 and copy.address != k.address and copy.steps == 4
    assert np.array_equal(runtime.read_state(copy), runtime.read_state(k))
    runtime.step([k, copy])
    assert read_counter(runtime.read_state(copy)).sum == read_counter(runtime.read_state(k)).sum == 60
    # k rolls back to the checkpoint; the host message of 50, waiting on the host
    # at the checkpoint, waits again (delivered at the next step)
    k.restore_from_checkpoint(cp)
    assert k.steps == 4 and read_counter(runtime.read_state(k)).sum == 10 and len(k.h2k) == 1
    runtime.restore(cp, into=k, device=1)
    assert k.device_index == 1 and runtime.coordinator.get_kernel_device("k") == 1 and len(k.h2k) == 1
    runtime.send(k, w(1), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    st = read_counter(runtime.read_state(k))
    assert (st.count, st.sum, st.fifo_errors) == (6, 61, 0)
    with pytest.raises(ValueError):
        runtime.restore(cp, kernel_id="copy")       # the id is taken
    with pytest.raises(InvalidCheckpointError):
        runtime.restore(Checkpoint.from_bytes(Checkpoint(cp.metadata.__class__("x", "y")).to_bytes()))
    with pytest.raises(TypeError):
        runtime.restore(b"bytes")


def test_a_restores_device_is_checked_alike_new_or_into(runtime):
    k = counter(runtime, "k", device=0)
    runtime.send(k, w(4), tag=COUNTER_TAG_ADD)
    cp = runtime.checkpoint(k)
    for bad in (0.0, 1.5, "1", True):
        for kw in ({"kernel_id": "copy"}, {"into": k}):
            with pytest.raises(TypeError, match="device"):
                runtime.restore(cp, device=bad, **kw)
    assert [x.id for x in runtime.kernels] == ["k"] and k.device_index == 0 and not runtime.is_held(k)
    assert runtime.restore(cp, kernel_id="copy", device=np.int64(1)).device_index == 1
    assert runtime.restore(cp, into=k, device=np.uint8(1)) is k and k.device_index == 1
    assert runtime.launch(k.spec, "more", device=np.int32(0)).device_index == 0
    with pytest.raises(ValueError, match="keeps its id"):   # (a new id for a restore into k: not ignored)
        runtime.restore(cp, into=k, kernel_id="zz")
    assert runtime.restore(cp, into=k, kernel_id="k") is k and not runtime.is_held(k)


def test_incremental_checkpoint(runtime):
    k = counter(runtime, "k", device=0)
    base = k.create_checkpoint()
    runtime.send(k, w(9), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    delta = k.create_incremental_checkpoint(base)
    assert k.supports_incremental()
    from vkmulti.kernels.lifecycle import SPIRV_CHUNK
    changed = {c.chunk_type().name for c in delta.chunks}
    assert "DEVICE_MEMORY" in changed and delta.get_custom(SPIRV_CHUNK) is None   # the code did not change
    full = Checkpoint.applied_with_delta(base, delta)
    assert full.get_device_memory("state0").data == k.create_checkpoint().get_device_memory("state0").data


def test_checkpoint_policy_captures_behind_steps(runtime):
    store = MemoryStorage()
    a = counter(runtime, "a", device=0)
    b = counter(runtime, "b", device=1)
    runtime.set_checkpoint_policy(CheckpointPolicy(every_steps=3, critical=["b"], keep=2, storage=store))
    for i in range(7):
        runtime.send(a, w(1), tag=COUNTER_TAG_ADD)
        runtime.send(b, w(2), tag=COUNTER_TAG_ADD)
        runtime.step()
    runtime.synchronize()
    ca, cb = runtime.latest_checkpoint(a), runtime.latest_checkpoint("b")
    assert ca.metadata.current_step == 6 and cb.metadata.current_step == 7
    assert read_counter(ca.get_device_memory("state0").data).sum == 6
    assert read_counter(cb.get_device_memory("state0").data).sum == 14
    assert "b@7" in store.list() and "a@3" in store.list() and "a@4" not in store.list()
    runtime.destroy_kernel(b)
    assert runtime.latest_checkpoint("b").metadata.current_step == 7   # kept after the kernel is gone
    back = runtime.restore(cb, device=0, kernel_id="b2")
    assert read_counter(runtime.read_state(back)).sum == 14
    runtime.set_checkpoint_policy(None)
    assert runtime.checkpoint_policy is None and runtime.latest_checkpoint("a") is None
    with pytest.raises(TypeError):
        CheckpointPolicy(critical="b")
    with pytest.raises(ValueError):
        CheckpointPolicy(every_steps=-1)


def test_restore_into_a_kernel_whose_device_is_lost(runtime, router, monkeypatch):
    """The failover path: GPU 1 stops answering (DeviceLostError from its timeline);
    a kernel there is rebuilt on GPU 0 from the policy's latest checkpoint without
    any wait on GPU 1, keeps its address (its sender's messages reach it), and the
    runtime steps on."""
    from vkmulti.errors import DeviceLostError

    runtime.set_checkpoint_policy(CheckpointPolicy(critical=["victim"]))
    victim = counter(runtime, "victim", device=1)
    sender = counter(runtime, "sender", device=0, params=[victim.address])
    for i in range(3):
        runtime.send(victim, w(i + 1), tag=COUNTER_TAG_ADD)
        runtime.step()
    runtime.synchronize()
    cp = runtime.latest_checkpoint(victim)
    assert cp.metadata.current_step == 3
    lost_ctx = victim.ctx

    def lost():
        raise DeviceLostError(-4, "vkGetSemaphoreCounterValue")
    monkeypatch.setattr(lost_ctx, "completed", lost)
    runtime.restore(cp, into=victim, device=0)
    monkeypatch.undo()
    assert victim.device_index == 0 and victim.steps == 3
    runtime.send(sender, w(10), tag=COUNTER_TAG_FORWARD)
    settle(runtime, router, [sender, victim], lambda: read_counter(runtime.read_state(victim)).count == 4)
    st = read_counter(runtime.read_state(victim))
    assert (st.count, st.sum, st.fifo_errors) == (4, 16, 0)


def test_a_kernel_prepared_by_its_user_can_still_be_written_and_destroyed(runtime):
    k = counter(runtime, "k", device=0)
    k.prepare_for_migration()
    runtime.write_state(k, 0, counter_initial_state(MAX), timeout=5)
    assert runtime.read_state(k)[28:32].view(np.uint32)[0] == MAX
    runtime.destroy_kernel(k, timeout=5)
    assert k.destroyed


def test_a_landing_left_on_a_gpu_without_kernels_lets_its_sender_go_on(runtime, router):
    """fwd (GPU 0) sends to sink (GPU 1): its batch lands on GPU 1, read in place, and
    sink moves to GPU 0 before any step there read it (the move takes the message along).
    No kernel steps on GPU 1 any more, so no step surveys that landing; every message of
    it was taken, so the router lets it go and fwd's outbox region is reused: fwd is not
    held back for good, and every later message arrives once."""
    sink = counter(runtime, "sink", device=1, inbox=4)
    fwd = counter(runtime, "fwd", device=0, params=[sink.address])
    runtime.send(fwd, w(1), tag=COUNTER_TAG_FORWARD)
    runtime.step(fwd)
    runtime.synchronize()
    assert runtime.migrate(sink, 0).messages_moved == 1
    for i in range(2, 12):
        runtime.send(fwd, w(i), tag=COUNTER_TAG_FORWARD)
        runtime.step([fwd, sink], timeout=10)
    settle(runtime, router, [fwd, sink], lambda: read_counter(runtime.read_state(sink)).count == 11)
    st = read_counter(runtime.read_state(sink))
    assert (st.count, st.sum, st.fifo_errors) == (11, sum(range(1, 12)), 0)
