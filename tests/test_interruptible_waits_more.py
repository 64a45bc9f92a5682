"""More public blocking calls held for real, as in test_interruptible_waits.py (blocking_calls.py
says what each case checks): launches, stencil slabs, the SRU offload coordinator, the
cluster's node agent in-process, and calls that test_interruptible_waits.py lacks."""
from __future__ import annotations

import pytest

from blocking_calls import HELD, RUNTIME, RUNTIME_DONE, RUNTIME_END, body, check_case, probed

#: a Jacobi grid in two slabs, on GPUs 0 and 1 (halo rows through the K2K router), and a gate on
#: each GPU (`hold` holds its step queue until the gate opens)
STENCIL = """
    from vkmulti.kernels import CrossGpuK2KRouter, KernelRuntime, MultiGpuCoordinator
    from vkmulti.kernels.engine.device_context import step_queue
    from vkmulti.kernels.reference import jacobi_reference
    from vkmulti.kernels.stencil import StencilSlabs, run_stencil
    mgr = MultiDeviceManager.create()
    rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr), mgr, max_kernels=8)
    router = CrossGpuK2KRouter(rt.coordinator, rt)
    grid = (np.arange(8 * 16, dtype=np.int32).reshape(8, 16) * 37) % 101
    zero = np.zeros(16, np.int32)
    slabs = StencilSlabs(rt, grid, [0, 1])
    slabs.step(1)
    rt.synchronize(30)
    gates = [Gate(mgr.slot(0)), Gate(mgr.slot(1))]
    def hold(gpu):
        gates[gpu].hold(step_queue(mgr.slot(gpu)))
"""

#: the gate opens: the slabs' field is numpy's after the steps they made, everything is freed cleanly
STENCIL_END = """
    for gate in gates:
        opened(gate)
    print("FIELD", bool((slabs.field(30) == jacobi_reference(grid, zero, zero, slabs.steps)).all()), flush=True)
    outcome("slabs", lambda: slabs.destroy())
    outcome("router", lambda: router.detach(30))
    outcome("rt", lambda: rt.destroy(30))
    for gate in gates:
        gate.destroy()
    outcome("mgr", lambda: mgr.destroy(30))
"""

STENCIL_DONE = ["FIELD True", "slabs: RETURNED", "router: RETURNED", "rt: RETURNED", "mgr: RETURNED"]

#: an SRU offload coordinator (`adaptive` as the case sets ADAPTIVE) that rendered a frame over both
#: GPUs; then every queue of GPU 0 held and a frame made with wait=False, whose copies to GPU 0 and
#: composite wait behind the gate
SRU = """
    from vkmulti import Image, ReferenceRenderer, ReferenceSRU, SRUOffloadCoordinator
    mgr = MultiDeviceManager.create()
    s0 = mgr.slot(0)
    srus = [ReferenceSRU(i, 32, 32, x=(i % 2) * 32, y=(i // 2) * 32, seed=i, iterations=4) for i in range(4)]
    def coordinator(**kw):
        return SRUOffloadCoordinator(mgr, secondary_renderer_factory=lambda ctx: ReferenceRenderer(ctx.slot), **kw)
    c = coordinator(adaptive=ADAPTIVE)
    frame = Image(s0, 64, 64)
    for bad in BAD:
        outcome(f"no frame bad {bad!r}", lambda: c.wait_frame(bad))
    print("ON", sorted(set(c.render_frame(srus, frame).rendered_on.values())), flush=True)
    want = frame.download()
    gate = Gate(s0)
    for q in s0.queues():
        gate.hold(q)
    c.render_frame(srus, frame, wait=False)
"""

#: the gate opens: the held frame completes, the next is the same, everything is freed cleanly
SRU_END = """
    opened(gate)
    outcome("after", lambda: c.wait_frame(30))
    print("SAME", bool((frame.download() == want).all()), flush=True)
    c.render_frame(srus, frame)
    print("SAME", bool((frame.download() == want).all()), flush=True)
    outcome("destroy", lambda: c.destroy(30))
    frame.destroy()
    gate.destroy()
    outcome("mgr", lambda: mgr.destroy(30))
"""

SRU_DONE = ["after: RETURNED", "SAME True", "SAME True", "destroy: RETURNED", "mgr: RETURNED"]
NO_FRAME = [f"no frame bad {bad}: RAISED ValueError" for bad in ("-1", "nan", "'5'", "True")] + ["ON [0, 1]"]

CASES = {
    # the coordinator's own timeout bounds a frame's waits: a new coordinator's first frame makes
    # its images, which waits behind the gate too
    "sru-offload": (body("ADAPTIVE = False", SRU, """
        probe("wait_frame", c.wait_frame)
        probe("destroy", c.destroy)
        first = coordinator(timeout=0.2)
        outcome("first frame", lambda: first.render_frame(srus, frame))
        outcome("first destroy", lambda: first.destroy(0.2))
    """, SRU_END), NO_FRAME + probed("wait_frame") + probed("destroy")
        + ["first frame: RAISED TimeoutError", "first destroy: RETURNED"] + SRU_DONE),
    # adaptive: the frame's timing waits for it too; forgetting the measurements waits for nothing
    "sru-offload-adaptive": (body("ADAPTIVE = True", SRU, """
        probe("wait_frame", c.wait_frame)
        probe("destroy", c.destroy)
        outcome("reset", c.reset_measurements)
    """, SRU_END), NO_FRAME + probed("wait_frame") + probed("destroy") + ["reset: RETURNED"] + SRU_DONE),
    # the step queues of both GPUs held: a launch on GPU 1 makes the runtime's objects there
    # first, one on GPU 0 only the kernel's; what a launch that gave up queued is freed once
    # it ran, never under it
    "launch": (body(RUNTIME, """
        gate1 = Gate(mgr.slot(1))
        gate.hold(step_queue(mgr.slot(0)))
        gate1.hold(step_queue(mgr.slot(1)))
        def launched(device, **kw):
            return rt.launch(counter_kernel(max_sources=8), "j", device=device, state=[counter_initial_state(8)], **kw)
        for device, label in ((1, "first launch"), (0, "launch")):
            outcome(f"{label} 0.2", lambda: launched(device, timeout=0.2))
            interrupted(label, lambda: launched(device))
            for bad in BAD:
                outcome(f"{label} bad {bad!r}", lambda: launched(device, timeout=bad))
        print("KERNELS", [x.id for x in rt.kernels], flush=True)
        opened(gate1)
        for device in (1, 0):
            opened(gate)
            j = launched(device, timeout=None)
            rt.send(j, np.array([3], np.uint32), tag=COUNTER_TAG_ADD)
            rt.step(j).wait(30)
            print("LAUNCHED", j.device_index, read_counter(rt.read_state(j)).sum, flush=True)
            rt.destroy_kernel(j, timeout=30)
        gate1.destroy()
    """, RUNTIME_END), probed("first launch") + probed("launch")
        + ["KERNELS [KernelId('k')]", "LAUNCHED 1 3", "LAUNCHED 0 3"] + RUNTIME_DONE),
    # GPU 0's steps held: GPU 1's slab finds its next outbox region still read in place by them;
    # the router's wait for those reads before a step is the step's (it defers the slab when it
    # runs out: the step returns)
    "step-router": (body(STENCIL, """
        hold(0)
        slabs.step(2)
        probe("step", lambda to: print("DEFERRED", [k.id for k, _ in rt.step(slabs.kernels, timeout=to).deferred],
                                       flush=True))
    """, STENCIL_END), ["DEFERRED [", "step 0.2: RETURNED",
                        "step ctrl-c: RAISED KeyboardInterrupt\n"]
        + [f"step bad {bad}: RAISED ValueError" for bad in ("-1", "nan", "'5'", "True")] + STENCIL_DONE),
    # a step of the slabs waits for room (no slab may be deferred: it would read a stale halo); a
    # destroy() that gave up leaves the slabs it stopped to the next
    "stencil-slabs": (body(STENCIL, """
        hold(0)
        slabs.step(2)
        probe("step", lambda to: slabs.step(1, timeout=to))
        probe("field", slabs.field)
        kernels = list(slabs.kernels)
        probe("destroy", slabs.destroy)
        print("STOPPED", [k.destroyed for k in kernels], flush=True)
        opened(gates[0])
        outcome("again", lambda: slabs.destroy(30))
        print("FREED", [k.buffers == [] for k in kernels], slabs.kernels, flush=True)
        slabs = StencilSlabs(rt, grid, [0, 1])
        slabs.step(3)
    """, STENCIL_END), probed("step") + probed("field") + probed("destroy")
        + ["STOPPED [True, False]", "again: RETURNED", "FREED [True, True] []"] + STENCIL_DONE),
    # a step of slab 1 on GPU 1 reads slab 0's outbox in place (an import of GPU 0's memory): a
    # destroy_kernel of slab 0 waits for it, in every call until it is done, and frees the outbox
    # only then (GPU 0 let go first: slab 0's own steps are done before that read)
    "destroy-kernel-read-in-place": (body(STENCIL, """
        hold(0), hold(1)
        k0, k1 = slabs.kernels
        rt.step(k0), rt.step(k1)
        probe("destroy_kernel", lambda to: rt.destroy_kernel(k0, timeout=to))
        opened(gates[0])
        outcome("again 0.2", lambda: rt.destroy_kernel(k0, timeout=0.2))
        opened(gates[1])
        outcome("again", lambda: rt.destroy_kernel(k0, timeout=30))
        print("FREED", k0.buffers == [], flush=True)
        rt.destroy_kernel(k1, timeout=30)
        slabs = StencilSlabs(rt, grid, [0, 1], name="again")
        slabs.step(3)
    """, STENCIL_END), probed("destroy_kernel") + ["again 0.2: RAISED TimeoutError", "again: RETURNED", "FREED True"]
        + STENCIL_DONE),
    # a kernel's seed trait methods (CheckpointableKernel, MigratableKernel, HotReloadableKernel) wait
    # for its held step; a bad timeout leaves it stepping
    "kernel-traits": (body(RUNTIME, """
        ck = k.create_checkpoint()
    """, HELD, """
        probe("create_checkpoint", lambda to: k.create_checkpoint(timeout=to))
        probe("restore_from_checkpoint", lambda to: k.restore_from_checkpoint(ck, timeout=to))
        probe("prepare_for_migration", lambda to: k.prepare_for_migration(timeout=to))
        probe("prepare_for_reload", lambda to: k.prepare_for_reload(timeout=to))
        print("HELD", rt.holds.is_held(k), flush=True)
    """, RUNTIME_END), probed("create_checkpoint") + probed("restore_from_checkpoint") + probed("prepare_for_migration")
        + probed("prepare_for_reload") + ["HELD False"] + RUNTIME_DONE),
    # downloads, gathers, a renderer's waits, the blocking transfer and a slot's teardown behind every
    # queue of GPU 1 held (a render queued there first)
    "transfers-and-downloads": (body("""
        from vkmulti import Image, InterGpuTransfer, ReferenceRenderer, ReferenceSRU
        mgr = MultiDeviceManager.create()
        s0, s1 = mgr.slot(0), mgr.slot(1)
        data = np.arange(1 << 14, dtype=np.uint8)
        igt = InterGpuTransfer(mgr)
        for i, b in enumerate(igt.broadcast_blocking(data, src_device=0, timeout=30)):
            igt.set_device_buffer(i, b)
        img, img0, buf = Image(s1, 64, 64), Image(s0, 64, 64), Buffer(s1, data.nbytes)
        buf.upload(data)
        renderer = ReferenceRenderer(s1)
        x = CrossDeviceTransfer(s1, s0, TransferMethod.HOST_SHARED)
        gate = Gate(s1)
        for q in s1.queues():
            gate.hold(q)
        point = renderer.render(ReferenceSRU(1, 64, 64, seed=1, iterations=4), img)
        probe("buffer download", lambda to: buf.download(timeout=to))
        probe("image download", lambda to: img.download(timeout=to))
        probe("gather_blocking", lambda to: igt.gather_blocking(0, timeout=to))
        probe("gather_to_device_blocking", lambda to: igt.gather_to_device_blocking(0, timeout=to))
        probe("gather", lambda to: asyncio.run(igt.gather(0, timeout=to)), process=True)
        probe("renderer wait", lambda to: renderer.wait(point, to))
        probe("renderer destroy", renderer.destroy)
        probe("run", lambda to: x.run(src_image=img, dst_image=img0, timeout=to))
        probe("release_children", s1.release_children)
        opened(gate)
        print("DATA", bool((buf.download(timeout=30) == data).all()),
              all(bool((g == data).all()) for g in igt.gather_blocking(0, timeout=30)), flush=True)
        for obj in (renderer, x, igt, img, img0, buf):
            outcome("destroy", lambda: obj.destroy(30))
        gate.destroy()
        outcome("mgr", lambda: mgr.destroy(30))
    """), probed("buffer download") + probed("image download") + probed("gather_blocking")
        + probed("gather_to_device_blocking") + probed("gather") + probed("renderer wait") + probed("renderer destroy")
        + probed("run") + probed("release_children") + ["DATA True True"] + ["destroy: RETURNED"] * 6
        + ["mgr: RETURNED"]),
    # ringkernel's descriptor of a copy (vkmulti.kernels.CrossDeviceTransfer) run behind every queue
    # of its source GPU held; what a run that gave up queued stays to the manager's destroy()
    "transfer-descriptor-run": (body("""
        from vkmulti import kernels
        mgr = MultiDeviceManager.create()
        s0, s1 = mgr.slot(0), mgr.slot(1)
        data = np.arange(1 << 14, dtype=np.uint8)
        a, b = Buffer(s1, data.nbytes), Buffer(s0, data.nbytes)
        a.upload(data)
        gate = Gate(s1)
        for q in s1.queues():
            gate.hold(q)
        copy = kernels.CrossDeviceTransfer(1, 0, data.nbytes)
        probe("run", lambda to: copy.run(mgr, a, b, timeout=to))
        opened(gate)
        outcome("after", lambda: copy.run(mgr, a, b, timeout=30))
        print("DATA", bool((b.download() == data).all()), flush=True)
        gate.destroy()
        outcome("mgr", lambda: mgr.destroy(30))
    """), probed("run") + ["after: RETURNED", "DATA True", "mgr: RETURNED"]),
    # the router's queue for kernel a is full (max_pending, no step of a takes from it)
    "route-message": (body(RUNTIME, """
        from vkmulti import CrossGpuK2KRouter
        router = CrossGpuK2KRouter(rt.coordinator, rt, max_pending=2)
        sink = rt.launch(counter_kernel(max_sources=8), "sink", device=1, state=[counter_initial_state(8)])
        a = rt.launch(counter_kernel(max_sources=8), "a", device=0, state=[counter_initial_state(8)])
        def routed(to):
            return router.route_message("a", "sink", np.array([1], np.uint32).tobytes(), timeout=to)
        routed(0), routed(0)
        probe("route_message", routed)
        rt.step(a).wait(30)
        outcome("again", lambda: routed(30))
        outcome("detach", lambda: router.detach(30))
    """, RUNTIME_END), ["route_message 0.2: RAISED QueueFullError", "route_message ctrl-c: RAISED KeyboardInterrupt\n"]
        + [f"route_message bad {bad}: RAISED ValueError" for bad in ("-1", "nan", "'5'", "True")]
        + ["again: RETURNED", "detach: RETURNED"] + RUNTIME_DONE),
    # the topology probe's transfers wait behind every queue of GPU 1 held; what a probe that gave up
    # leaves queued is freed once it ran (by the manager's destroy at the latest), never under it
    "probe-topology": (body("""
        from vkmulti.kernels import MultiGpuCoordinator
        mgr = MultiDeviceManager.create()
        coord = MultiGpuCoordinator.from_manager(mgr)
        gate = Gate(mgr.slot(1))
        for q in mgr.slot(1).queues():
            gate.hold(q)
        probe("probe_topology", lambda to: coord.probe_topology(force=True, cache=False, timeout=to))
        opened(gate)
        topo = coord.probe_topology(force=True, cache=False, timeout=60)
        print("MEASURED", sorted(topo.details["pairs"]), flush=True)
        gate.destroy()
        outcome("mgr", lambda: mgr.destroy(30))
    """), probed("probe_topology") + ["MEASURED ['0->1', '1->0']", "mgr: RETURNED"]),
    # glslc blocked reading an included file that is a FIFO nobody writes; a call that gives up leaves
    # no glslc behind
    "from-glsl": (body("""
        import tempfile
        from vkmulti import KernelCodeSource
        folder = tempfile.mkdtemp()
        held = os.path.join(folder, "held.glsl")
        os.mkfifo(held)
        src = "#version 450\\n#extension GL_GOOGLE_include_directive : require\\n#include \\"held.glsl\\"\\n" \\
              "layout(local_size_x = 1) in;\\nvoid main() {}\\n"
        probe("from_glsl", lambda to: KernelCodeSource.from_glsl(src, include_dirs=(folder,), timeout=to))
        def children():
            kids = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                            kids.append(pid)
                except (OSError, IndexError, ValueError):
                    pass
            return kids
        print("CHILDREN", children(), flush=True)
        os.unlink(held)
        with open(held, "w") as f:
            f.write("// nothing held\\n")
        outcome("after", lambda: KernelCodeSource.from_glsl(src, include_dirs=(folder,), timeout=30))
    """), probed("from_glsl") + ["CHILDREN []", "after: RETURNED"]),
    # the cluster's node agent in-process (no Ray), every queue of its GPUs held: its timeout (one
    # for all its waits, given when it is made) bounds them, Ctrl-C ends them; a bad one is refused
    "node-agent": (body("""
        from vkmulti import ReferenceSRU
        from vkmulti.cluster import NodeAgent, StencilSlab
        srus = [ReferenceSRU(i, 32, 32, x=(i % 2) * 32, y=(i // 2) * 32, seed=i, iterations=4) for i in range(4)]
        rows, edge = (np.arange(4 * 8, dtype=np.int32).reshape(4, 8) * 7) % 23, np.zeros(8, np.int32)
        for bad in BAD:
            outcome(f"NodeAgent bad {bad!r}", lambda: NodeAgent(timeout=bad))
        agent = NodeAgent(timeout=30.0)
        for bad in BAD:
            outcome(f"StencilSlab bad {bad!r}", lambda: StencilSlab(agent.manager, rows, edge, edge, [1, 1], timeout=bad))
        want = agent.render(srus)["images"]
        gates = [Gate(agent.manager.slot(g)) for g in (0, 1)]
        for gate in gates:
            for q in gate.slot.queues():
                gate.hold(q)
        interrupted("render", lambda: agent.render(srus))
        agent.timeout = 0.2
        outcome("stencil_setup 0.2", lambda: agent.stencil_setup(rows, edge, edge))
        agent.timeout = 30.0
        interrupted("stencil_setup", lambda: agent.stencil_setup(rows, edge, edge))
        agent.timeout = 0.2
        outcome("shutdown 0.2", agent.shutdown)
        agent.timeout = 30.0
        for gate in gates:
            opened(gate)
        got = agent.render(srus)
        print("SAME", sorted(set(got["gpu"].values())), all((got["images"][i] == want[i]).all() for i in want), flush=True)
        agent.stencil_setup(rows, edge, edge)
        agent.stencil_step(None, None)
        print("STEPPED", agent.stencil_field().shape, flush=True)
        for gate in gates:
            gate.destroy()
        outcome("shutdown", agent.shutdown)
    """), [f"NodeAgent bad {bad}: RAISED " for bad in ("-1", "nan", "'5'", "True")]
        + [f"StencilSlab bad {bad}: RAISED " for bad in ("-1", "nan", "'5'", "True")]
        + ["render ctrl-c: RAISED KeyboardInterrupt", "stencil_setup 0.2: RAISED TimeoutError",
           "stencil_setup ctrl-c: RAISED KeyboardInterrupt", "shutdown 0.2: RAISED TimeoutError", "SAME [0, 1] True",
           "STEPPED (4, 8)", "shutdown: RETURNED"]),
    # run_stencil's first launch waits behind GPU 0's held step queue
    "run-stencil": (body("""
        from vkmulti.kernels.engine.device_context import step_queue
        from vkmulti.kernels.reference import jacobi_reference
        from vkmulti.kernels.stencil import run_stencil
        mgr = MultiDeviceManager.create()
        grid = (np.arange(8 * 16, dtype=np.int32).reshape(8, 16) * 37) % 101
        zero = np.zeros(16, np.int32)
        gate = Gate(mgr.slot(0))
        gate.hold(step_queue(mgr.slot(0)))
        probe("run_stencil", lambda to: run_stencil(mgr, grid, 3, timeout=to))
        opened(gate)
        run = run_stencil(mgr, grid, 3, timeout=30)
        print("FIELD", bool((run.field == jacobi_reference(grid, zero, zero, 3)).all()), flush=True)
        gate.destroy()
        outcome("mgr", lambda: mgr.destroy(30))
    """), probed("run_stencil") + ["FIELD True", "mgr: RETURNED"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_blocking_call_ends(case):
    check_case(case, *CASES[case])
