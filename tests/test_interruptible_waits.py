"""Every public blocking call, held for real: timeout=0.2 raises vkmulti.TimeoutError,
timeout=None ends with KeyboardInterrupt at a Ctrl-C, a bad timeout (-1, nan, "5",
True) is a TypeError/ValueError that changes nothing, and once the hold goes the call
succeeds, destroy() is clean and the validation layer saw no error. Each case runs in
a child process: a wait that does not end fails its test instead of hanging the suite."""
from __future__ import annotations

import pytest

from blocking_calls import HELD, HOLD_1, RUNTIME, RUNTIME_DONE, RUNTIME_END, body, check_case, probed

TRANSFER = """
    mgr = MultiDeviceManager.create()
    s0, s1 = mgr.slot(0), mgr.slot(1)
    gate = Gate(s1)
    data = np.arange(1 << 16, dtype=np.uint8)
    a, b = Buffer(s1, 1 << 16), Buffer(s0, 1 << 16)
    a.upload(data)
    x = CrossDeviceTransfer(s1, s0, TransferMethod.HOST_SHARED)
    t = x.submit(src_buffer=a, dst_buffer=b, src_wait=gate.point)
"""

TRANSFER_END = """
    gate.open()
    outcome("after", lambda: t.wait(30))
    print("DATA", bool((b.download() == data).all()), flush=True)
    outcome("destroy", lambda: x.destroy(30))
    gate.destroy()
    outcome("mgr", lambda: mgr.destroy(30))
"""

CASES = {
    "ticket-wait": (body(TRANSFER, """
        probe("wait", t.wait)
        probe("wait_submitted", t.wait_submitted)
        probe("wait_source", t.wait_source)
    """, TRANSFER_END), probed("wait") + probed("wait_submitted") + probed("wait_source")
        + ["after: RETURNED", "DATA True", "destroy: RETURNED"]),
    # `await ticket` under asyncio.wait_for, and Ctrl-C in asyncio.run: the loop and its
    # executor are let go at once, not when the transfer ends
    "ticket-await": (body(TRANSFER, """
        async def waited(to):
            await asyncio.wait_for(t, to)
        outcome("await 0.2", lambda: asyncio.run(waited(0.2)))
        interrupted("await", lambda: asyncio.run(waited(None)))
    """, TRANSFER_END), ["await 0.2: RAISED TimeoutError", "await ctrl-c: RAISED KeyboardInterrupt",
                         "after: RETURNED", "DATA True", "destroy: RETURNED"]),
    "cross-device-destroy": (body(TRANSFER, """
        probe("destroy", x.destroy)
    """, TRANSFER_END), probed("destroy") + ["after: RETURNED", "DATA True", "destroy: RETURNED"]),
    # the blocking forms and their asyncio forms; a Ctrl-C leaves the executor's copy waiting,
    # which destroy() then waits for
    "inter-gpu-transfer": (body(HOLD_1, """
        igt = InterGpuTransfer(mgr)
        probe("copy_buffer_blocking", lambda to: igt.copy_buffer_blocking(0, 1, data, timeout=to))
        probe("broadcast_blocking", lambda to: igt.broadcast_blocking(data, src_device=0, timeout=to))
        probe("copy_buffer", lambda to: asyncio.run(igt.copy_buffer(0, 1, data, timeout=to)), process=True)
        probe("destroy", igt.destroy)
        gate.open()
        out = igt.copy_buffer_blocking(0, 1, data, timeout=30)
        print("DATA", bool((out.download() == data).all()), flush=True)
        got = asyncio.run(igt.copy_buffer(0, 1, data, timeout=30))
        print("DATA", bool((got.download() == data).all()), flush=True)
        outcome("again", lambda: igt.destroy(30))
        gate.destroy()
        outcome("mgr", lambda: mgr.destroy(30))
    """), probed("copy_buffer_blocking") + probed("broadcast_blocking") + probed("copy_buffer") + probed("destroy")
        + ["DATA True", "DATA True", "again: RETURNED", "mgr: RETURNED"]),
    "buffer-image-upload": (body(HOLD_1, """
        buf = Buffer(s1, data.nbytes)
        px = np.random.default_rng(1).integers(0, 256, (64, 64, 8), dtype=np.uint8)
        probe("buffer upload", lambda to: buf.upload(data, timeout=to))
        probe("image upload", lambda to: img.upload(px, timeout=to))
        probe("buffer destroy", buf.destroy)
        probe("Image()", lambda to: Image(s1, 64, 64, timeout=to))
        gate.open()
        buf.upload(data, timeout=30)
        img.upload(px, timeout=30)
        print("DATA", bool((buf.download() == data).all()), bool((img.download(timeout=30) == px).all()), flush=True)
        outcome("destroy", lambda: (buf.destroy(30), img.destroy(30)))
        gate.destroy()
        outcome("mgr", lambda: mgr.destroy(30))
    """), probed("buffer upload") + probed("image upload") + probed("buffer destroy") + probed("Image()")
        + ["DATA True True", "destroy: RETURNED", "mgr: RETURNED"]),
    # a message from GPU 0 to GPU 1 whose move waits behind GPU 1's held queues; a detach() that
    # gave up leaves the router detached from the steps, its moves and buffers kept for the next
    "router-detach": (body(RUNTIME, """
        from vkmulti import CrossGpuK2KRouter
        from vkmulti.kernels.reference import COUNTER_TAG_FORWARD
        router = CrossGpuK2KRouter(rt.coordinator, rt)
        sink = rt.launch(counter_kernel(max_sources=8), "sink", device=1, state=[counter_initial_state(8)])
        a = rt.launch(counter_kernel(max_sources=8), "a", device=0, state=[counter_initial_state(8)],
                      params=[sink.address])
        rt.step([a, sink]).wait(30)
        gate1 = Gate(mgr.slot(1))
        for q in mgr.slot(1).queues():
            gate1.hold(q)
        rt.send(a, np.array([5], np.uint32), tag=COUNTER_TAG_FORWARD)
        rt.step(a).wait(30)
        rt.step(a).wait(30)
        probe("detach", router.detach)
        print("ATTACHED", router.runtime is rt, flush=True)
        gate1.open()
        outcome("again", lambda: router.detach(30))
        gate1.destroy()
    """, RUNTIME_END), probed("detach") + ["ATTACHED False", "again: RETURNED"] + RUNTIME_DONE),
    "step-ticket-wait": (body(RUNTIME, HELD, """
        probe("step", held.wait)
    """, RUNTIME_END), probed("step") + RUNTIME_DONE),
    # every in-flight slot taken (in_flight=3) by steps behind the held one
    "step-slots-full": (body(RUNTIME, HELD, """
        rt.step(k), rt.step(k)
        probe("step", lambda to: rt.step(k, timeout=to))
    """, RUNTIME_END), probed("step") + RUNTIME_DONE),
    # another thread is inside a step (waiting for a slot): this one waits for its turn
    "step-turn": (body(RUNTIME, HELD, """
        rt.step(k), rt.step(k)
        other, failed = in_thread(lambda: rt.step(k, timeout=None))
        time.sleep(0.5)
        probe("step", lambda to: rt.step(k, timeout=to))
        opened(gate)
        other.join(30)
        print("OTHER", other.is_alive(), failed, flush=True)
    """, RUNTIME_END), probed("step") + ["OTHER False []"] + RUNTIME_DONE),
    "run": (body(RUNTIME, HELD, """
        probe("run", lambda to: rt.run(3, k, timeout=to))
    """, RUNTIME_END), probed("run") + RUNTIME_DONE),
    "run-ticket-wait": (body(RUNTIME, """
        gate.hold(step_queue(mgr.slot(0)))
        ticket = rt.run(2, k)
        probe("run", ticket.wait)
    """, RUNTIME_END), probed("run") + RUNTIME_DONE),
    "synchronize": (body(RUNTIME, HELD, """
        probe("synchronize", rt.synchronize)
    """, RUNTIME_END), probed("synchronize") + RUNTIME_DONE),
    "receive": (body(RUNTIME, HELD, """
        probe("receive", lambda to: rt.receive(k, timeout=to))
    """, RUNTIME_END), probed("receive") + RUNTIME_DONE),
    # the host queue to k is full (no step takes from it)
    "send": (body(RUNTIME, """
        try:
            while True:
                rt.send(k, np.array([1], np.uint32), tag=COUNTER_TAG_ADD)
        except vkmulti.QueueFullError:
            pass
        probe("send", lambda to: rt.send(k, np.array([1], np.uint32), tag=COUNTER_TAG_ADD, timeout=to))
        print("PENDING", rt.pending_receives(k), flush=True)
        rt.step(k).wait(30)
        print("FULL SUM", read_counter(rt.read_state(k)).sum > 0, flush=True)
        outcome("rt", lambda: rt.destroy(30))
        gate.destroy()
        outcome("mgr", lambda: mgr.destroy(30))
    """), ["send 0.2: RAISED QueueFullError", "send ctrl-c: RAISED KeyboardInterrupt\n"]
        + [f"send bad {bad}: RAISED " for bad in ("-1", "nan", "'5'", "True")]
        + ["FULL SUM True", "rt: RETURNED", "mgr: RETURNED"]),
    "read-state": (body(RUNTIME, HELD, """
        probe("read_state", lambda to: rt.read_state(k, timeout=to))
        probe("write_state", lambda to: rt.write_state(k, 0, np.zeros(4, np.uint8), offset=64, timeout=to))
    """, RUNTIME_END), probed("read_state") + probed("write_state") + RUNTIME_DONE),
    "checkpoint-restore": (body(RUNTIME, """
        ck = rt.checkpoint(k, timeout=30)
    """, HELD, """
        probe("checkpoint", lambda to: rt.checkpoint(k, timeout=to))
        probe("restore", lambda to: rt.restore(ck, into=k, timeout=to))
    """, RUNTIME_END), probed("checkpoint") + probed("restore") + RUNTIME_DONE),
    # a bad timeout fails neither the request nor the migrator's stats
    "migrate": (body(RUNTIME, HELD, """
        probe("migrate", lambda to: rt.migrate(k, 1, timeout=to))
        m = KernelMigrator(rt.coordinator)
        req = rt.coordinator.request_migration(k.id, 1)
        outcome("migrator bad", lambda: m.migrate_with_checkpoint(k, req, timeout=-1))
        print("REQUEST", req.state.name, m.stats().failed_migrations, k.device_index, flush=True)
    """, RUNTIME_END), probed("migrate") + ["migrator bad: RAISED ValueError", "REQUEST PENDING 0 0"]
        + RUNTIME_DONE),
    # a call that timed out or was interrupted leaves k stopped; the next frees it
    "destroy-kernel": (body(RUNTIME, HELD, """
        probe("destroy_kernel", lambda to: rt.destroy_kernel(k, timeout=to))
        print("DESTROYED", k.destroyed, flush=True)
        opened(gate)
        outcome("again", lambda: rt.destroy_kernel(k, timeout=30))
        print("FREED", k.buffers == [], flush=True)
        k = rt.launch(counter_kernel(max_sources=8), "k", device=0, state=[counter_initial_state(8)])
    """, RUNTIME_END), probed("destroy_kernel") + ["DESTROYED True", "again: RETURNED", "FREED True"]
        + RUNTIME_DONE),
    # a kernel that destroy_kernel stopped (its step held, the call timed out) on a GPU lost afterwards:
    # the runtime's destroy() frees it without waiting on the lost device (it raised DeviceLostError)
    "stopped-then-lost": (body("""
        from vkmulti._core.timeline import TimelinePoint
        from vkmulti.kernels import KernelRuntime, MultiGpuCoordinator, counter_kernel
        from vkmulti.kernels.reference import counter_initial_state
        mgr = MultiDeviceManager.create()
        rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr), mgr, max_kernels=8)
        k = rt.launch(counter_kernel(max_sources=8), "k", device=1, state=[counter_initial_state(8)])
        rt.step(k).wait(30)
        gate = Gate(mgr.slot(1))
        held = rt.step(k, wait=TimelinePoint(gate.sem, 1, 1))
        outcome("destroy_kernel", lambda: rt.destroy_kernel(k, timeout=0.2))
        opened(gate)
        held.wait(30)   # (the lost GPU's semaphores are then freed without work that uses them)
        mgr.report_device_lost(1, "a test")
        outcome("rt", lambda: rt.destroy(30))
        print("FREED", k.buffers == [], flush=True)
        mgr.slot(1).native.destroy_timeline(gate.sem)
        outcome("mgr", lambda: mgr.destroy(30))
    """), ["destroy_kernel: RAISED TimeoutError", "rt: RETURNED", "FREED True", "mgr: RETURNED"]),
    "runtime-destroy": (body(RUNTIME, HELD, """
        probe("destroy", rt.destroy)
        gate.open()
        outcome("again", lambda: rt.destroy(30))
        gate.destroy()
        outcome("mgr", lambda: mgr.destroy(30))
    """), probed("destroy") + ["again: RETURNED", "mgr: RETURNED"]),
    # a reload waits for k's held step; apply_code and rollback swap at a step boundary, which another
    # thread inside a step (waiting for an in-flight slot) keeps from coming; reload_timeout is their bound
    "hot-reload": (body(RUNTIME, """
        from vkmulti import HotReloadConfig, HotReloadManager, KernelCodeSource
        code = KernelCodeSource.from_spirv(k.spec.spirv, entry_point=k.spec.entry_point)
        def manager(to):
            return HotReloadManager(HotReloadConfig() if to is None else HotReloadConfig(reload_timeout=to))
        backs = {to: manager(to) for to in (0.2, 30.0)}
        for m in backs.values():
            m.reload(k, code)
    """, HELD, """
        probe("reload", lambda to: manager(to).reload(k, code))
        rt.step(k), rt.step(k)
        other, failed = in_thread(lambda: rt.step(k, timeout=None))
        time.sleep(0.5)
        probe("apply_code", lambda to: k.apply_code(code, to))
        outcome("rollback 0.2", lambda: backs[0.2].rollback(k.id))
        interrupted("rollback", lambda: backs[30.0].rollback(k.id))
        print("VERSIONS", [m.get_current_version(k.id) for m in backs.values()], flush=True)
        opened(gate)
        other.join(30)
        print("OTHER", other.is_alive(), failed, flush=True)
        print("RELOADED", manager(30).reload(k, code).new_version, flush=True)
        k.apply_code(code, None)
        print("ROLLED BACK", [m.rollback(k.id).version_id for m in backs.values()], flush=True)
    """, RUNTIME_END), probed("reload") + probed("apply_code")
        + ["rollback 0.2: RAISED TimeoutError", "rollback ctrl-c: RAISED KeyboardInterrupt", "VERSIONS [2, 2]",
           "OTHER False []", "RELOADED 2", "ROLLED BACK [1, 1]"] + RUNTIME_DONE),
    # a batch handed to GPU 0 that k's held step reads; a withdraw that gave up leaves it to the steps
    "inbound-batch": (body(RUNTIME, """
        from vkmulti.kernels.messages import RING_HEADER_BYTES
        buf = Buffer(mgr.slot(0), RING_HEADER_BYTES + rt.slot_size * 4)
        buf.upload(np.zeros(buf.size, np.uint8))
        batch = rt.accept_batch(0, buf, wait=TimelinePoint(gate.sem, 1, 0))
        rt.step(k)
        outcome("wait", lambda: print("WAITED", batch.wait(0.2), flush=True))
        interrupted("wait", lambda: batch.wait(None))
        for bad in BAD:
            outcome(f"wait bad {bad!r}", lambda: batch.wait(bad))
        probe("withdraw", lambda to: rt.withdraw_batch(batch, timeout=to))
        opened(gate)
        rt.synchronize(30)
        print("DELIVERED", batch.wait(30), rt.withdraw_batch(batch, timeout=30), flush=True)
        buf.destroy()
    """, RUNTIME_END), ["WAITED False", "wait ctrl-c: RAISED KeyboardInterrupt"]
        + [f"wait bad {bad}: RAISED ValueError" for bad in ("-1", "nan", "'5'", "True")]
        + probed("withdraw") + ["DELIVERED True 0"] + RUNTIME_DONE),
    # the plan of unregister_device(0) moves k, whose held step keeps it; a migration that timed out is
    # reported in its outcome (k stays on GPU 0), a bad timeout is the caller's error
    "carry-out": (body(RUNTIME, HELD, """
        plans = rt.coordinator.unregister_device(0)
        m = KernelMigrator(rt.coordinator)
        def carried(to):
            outs = m.carry_out(plans, rt, timeout=to)
            print("OUTCOMES", [type(o.error).__name__ for o in outs], k.device_index, flush=True)
        probe("carry_out", carried)
        opened(gate)
        carried(30)
    """, RUNTIME_END), ["OUTCOMES ['TimeoutError'] 0", "carry_out 0.2: RETURNED",
                        "carry_out ctrl-c: RAISED KeyboardInterrupt\n"]
        + [f"carry_out bad {bad}: RAISED ValueError" for bad in ("-1", "nan", "'5'", "True")]
        + ["OUTCOMES ['NoneType'] 1"] + RUNTIME_DONE),
    # the CRC32 jobs of a migration, on the host and on the GPU, hashing k's state once the gate opens
    "crc-jobs": (body(RUNTIME, """
        import zlib
        from vkmulti.kernels.lifecycle.host_crc import HostCrc
        from vkmulti.kernels.lifecycle.gpu_crc import GpuCrc
        from vkmulti.kernels.engine.gpu_jobs import GpuJobs
        point, ranges = TimelinePoint(gate.sem, 1, 0), [(k.states[0], 0, 64)]
        host, jobs = HostCrc(k.ctx), GpuJobs(k.ctx.slot, k.ctx.queue)
        gpu = GpuCrc(k.ctx, jobs)
        hjob, gjob = host.submit(ranges, [point], timeout=None), gpu.submit(ranges, [point])
        probe("host result", hjob.result)
        probe("host destroy", host.destroy)
        probe("gpu result", gjob.result)
        opened(gate)
        want = [zlib.crc32(rt.read_state(k)[:64].tobytes())]
        print("CRC", hjob.result(30) == want, gjob.result(30) == want, flush=True)
        outcome("host again", lambda: host.destroy(30))
        gpu.destroy()
        jobs.destroy(30)
    """, RUNTIME_END), probed("host result") + probed("host destroy") + probed("gpu result")
        + ["CRC True True", "host again: RETURNED"] + RUNTIME_DONE),
    # a migration waiting for k's held step keeps k moving: calls on k wait for it
    "kernel-held-by-a-migration": (body(RUNTIME, HELD, """
        mover, failed = in_thread(lambda: rt.migrate(k, 1, timeout=None))
        deadline = time.monotonic() + 20
        while not rt.holds.is_moving(k) and time.monotonic() < deadline:
            time.sleep(0.01)
        print("MOVING", rt.holds.is_moving(k), flush=True)
        probe("destroy_kernel", lambda to: rt.destroy_kernel(k, timeout=to))
        probe("write_state", lambda to: rt.write_state(k, 0, np.zeros(4, np.uint8), offset=64, timeout=to))
        opened(gate)
        mover.join(30)
        print("MOVED", k.device_index, failed, flush=True)
    """, RUNTIME_END), ["MOVING True"] + probed("destroy_kernel") + probed("write_state")
        + ["MOVED 1 []"] + RUNTIME_DONE),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_blocking_call_ends(case):
    check_case(case, *CASES[case])
