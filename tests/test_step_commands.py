"""The native step recorder (StepCommands, native/vkm_step.c): its argument checks,
a recorded command buffer doing what it says, its submit's waits, signal and
lost flag; and the handles the runtime hands it never outliving their objects
(a kernel destroyed and its slot reused by another)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import vulkan as vk

from vkmulti import DestroyedError, DeviceLostError
from vkmulti._core import _native
from vkmulti.kernels.engine.device_context import MappedBuffer, step_queue
from vkmulti.kernels.engine import step_ops
from vkmulti.kernels.engine.recording import handle_value
from kernel_support import routed_runtime

U64 = (1 << 64) - 1


@pytest.fixture
def bench(manager):
    """(slot, StepCommands, command buffer int, queue, mapped buffer, timeline) on GPU 0."""
    slot = manager.slot(0)
    dev = slot.device
    queue = step_queue(slot)
    pool = vk.vkCreateCommandPool(dev, vk.VkCommandPoolCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
        flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=queue.family), None)
    cmd = vk.vkAllocateCommandBuffers(dev, vk.VkCommandBufferAllocateInfo(
        sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=pool,
        level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
    buf = MappedBuffer(slot, 4096)
    timeline = slot.native.create_timeline(0)
    gate = slot.native.create_timeline(0)
    try:
        yield slot, _native.StepCommands(slot.native), handle_value(cmd), queue, buf, timeline, gate
    finally:
        for sem in (timeline, gate):
            try:
                slot.native.wait_timeline(sem, 0, 10)
            except DeviceLostError:
                pass
        vk.vkDeviceWaitIdle(dev)
        for sem in (timeline, gate):
            vk.vkDestroySemaphore(dev, vk.ffi.cast("VkSemaphore", sem), None)
        buf.destroy()
        vk.vkDestroyCommandPool(dev, pool, None)


def test_step_commands_refuse_bad_arguments(bench):
    slot, c, cmd, queue, buf, timeline, _ = bench
    with pytest.raises(TypeError):
        _native.StepCommands(None)
    with pytest.raises(ValueError, match="cmd"):
        c.begin(0)
    for call in (c.barrier, c.end, lambda: c.bind_pipeline(1), lambda: c.dispatch(1, 1, (), b""),
                 lambda: c.copy(1, 1, 0, 0, 4), lambda: c.update(1, 0, bytes(4))):
        with pytest.raises(ValueError, match="begin"):   # nothing is being recorded
            call()
    c.begin(cmd)
    assert c.recording == cmd
    h = buf.handle_int
    with pytest.raises(ValueError, match="pipeline"):
        c.bind_pipeline(0)
    with pytest.raises(ValueError, match="layout"):
        c.dispatch(0, 1, (), b"")
    with pytest.raises(ValueError, match="descriptor set"):
        c.dispatch(1, 0, (), b"")
    with pytest.raises(ValueError, match="dynamic offsets"):
        c.dispatch(1, 1, (0, 0, 0, 0, 0), b"")
    for push in (bytes(6), bytes(132)):
        with pytest.raises(ValueError, match="push constants"):
            c.dispatch(1, 1, (0,), push)
    with pytest.raises(TypeError):
        c.dispatch(1, 1, [0], b"")   # offsets: a tuple
    with pytest.raises(OverflowError):
        c.dispatch(1, 1, (-1,), b"")
    with pytest.raises(ValueError, match="buffer"):
        c.dispatch_indirect(1, 1, (0,), b"", 0, 0)
    with pytest.raises(ValueError, match="multiple of 4"):
        c.dispatch_indirect(1, 1, (0,), b"", h, 2)
    with pytest.raises(ValueError, match="copy size"):
        c.copy(h, h, 0, 16, 0)
    with pytest.raises(ValueError, match="src"):
        c.copy(0, h, 0, 16, 4)
    for offset, data in ((0, b""), (0, bytes(6)), (2, bytes(4)), (0, bytes(65540))):
        with pytest.raises(ValueError, match="update"):
            c.update(h, offset, data)
    with pytest.raises(ValueError, match="still being recorded"):
        c.submit(queue.lock, cmd, [], timeline, 1)
    c.end()
    assert c.recording == 0
    for waits, match in (([(0, 1)], "non-null"), ([(timeline, U64 + 1)], "value"), ([(timeline, -1)], "value")):
        with pytest.raises(ValueError, match=match):
            c.submit(queue.lock, cmd, waits, timeline, 1)
    with pytest.raises(ValueError, match="signal"):
        c.submit(queue.lock, cmd, [], 0, 1)
    with pytest.raises(TypeError):
        c.submit(None, cmd, [], timeline, 1)
    assert slot.native.timeline_value(timeline) == 0   # nothing was submitted


def test_step_commands_on_a_released_device_raise_destroyed(manager):
    slot = manager.slot(0)
    other = _native.Device(handle_value(slot.physical_device), handle_value(slot.device))
    c = _native.StepCommands(other)
    other.release()
    with pytest.raises(DestroyedError):
        c.begin(1)


def test_a_step_submit_whose_waits_change_while_converted_raises(manager):
    """Before: submit read waits[i] up to the length taken first, without a bounds check; a
    wait value whose __index__ emptied the list made the next read go through the list's
    freed item array (a crash). Now the waits are read from a snapshot."""
    slot = manager.slot(0)
    sem = slot.native.create_timeline(0)
    waits = []

    class Empties:
        def __index__(self):
            waits.clear()
            return 1

    waits.extend([(sem, Empties()), (0, 1), (sem, 1)])
    try:
        with pytest.raises(ValueError, match="wait 1: the semaphore must be a non-null handle"):
            _native.StepCommands(slot.native).submit(slot.copy_queue.lock, 1, waits, sem, 1)
    finally:
        vk.vkDestroySemaphore(slot.device, vk.ffi.cast("VkSemaphore", sem), None)


def test_a_recorded_step_updates_copies_and_signals_after_its_wait(bench):
    slot, c, cmd, queue, buf, timeline, gate = bench
    words = buf.words
    words[:16] = 0
    c.begin(cmd)
    c.update(buf.handle_int, 0, np.arange(1, 5, dtype=np.uint32).tobytes())
    c.barrier()
    c.copy(buf.handle_int, buf.handle_int, 0, 16, 16)
    c.barrier(True)
    c.end()
    c.submit(queue.lock, cmd, [(gate, 1)], timeline, 7)
    assert slot.native.timeline_value(timeline) == 0   # waits on the GPU for the gate
    vk.vkSignalSemaphore(slot.device, vk.VkSemaphoreSignalInfo(
        sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", gate), value=1))
    slot.native.wait_timeline(timeline, 7, 10)
    assert words[:8].tolist() == [1, 2, 3, 4, 1, 2, 3, 4]
    # recorded again from the start (begin resets it), after an abandoned recording
    c.begin(cmd)
    c.update(buf.handle_int, 0, bytes(16))
    c.abandon()
    assert c.recording == 0
    c.begin(cmd)
    c.update(buf.handle_int, 32, np.full(4, 9, np.uint32).tobytes())
    c.barrier(True)
    c.end()
    c.submit(queue.lock, cmd, [], timeline, 8)
    slot.native.wait_timeline(timeline, 8, 10)
    assert words[:12].tolist() == [1, 2, 3, 4, 1, 2, 3, 4, 9, 9, 9, 9]


def test_a_step_recorded_in_one_call_updates_copies_and_signals(bench):
    """StepCommands.record: the whole step's operations (packed by step_ops.py) in one
    call, in order: an update, a barrier, a copy, a host barrier."""
    slot, c, cmd, queue, buf, timeline, _ = bench
    h = buf.handle_int
    words = buf.words
    words[:16] = 0
    ops = [step_ops.BARRIER, step_ops.update_op(h, 0, np.arange(5, 9, dtype=np.uint32).tobytes()),
           step_ops.BARRIER, step_ops.copy_op(h, h, 0, 16, 16), step_ops.HOST_BARRIER]
    c.record(cmd, b"".join(ops))
    assert c.recording == 0   # (begun and ended inside the call)
    c.submit(queue.lock, cmd, [], timeline, 3)
    slot.native.wait_timeline(timeline, 3, 10)
    assert words[:8].tolist() == [5, 6, 7, 8, 5, 6, 7, 8]
    c.record(cmd, b"")   # nothing but begin and end: a valid empty step
    c.submit(queue.lock, cmd, [], timeline, 4)
    slot.native.wait_timeline(timeline, 4, 10)


def test_step_record_refuses_bad_operations_before_recording(bench):
    slot, c, cmd, queue, buf, timeline, _ = bench
    h = buf.handle_int
    op = step_ops.OP
    assert op.size == _native.STEP_OP_BYTES == step_ops.OP_BYTES
    good = step_ops.pass_op(1, 1, 1, (0,), bytes(16))

    def raw(kind, noffsets=0, nbytes=0, buffer=0, offset=0, layout=1, dset=1, dst=0, size=0, data=b""):
        return op.pack(kind, noffsets, nbytes, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, layout, dset, buffer, offset, dst,
                       0, size, data)
    with pytest.raises(TypeError):
        c.record(cmd, bytearray(good))   # bytes only
    with pytest.raises(TypeError):
        c.record(cmd, None)
    with pytest.raises(ValueError, match="cmd"):
        c.record(0, good)
    for ops in (good[:-1], good + b"x", b"\0" * 7):
        with pytest.raises(ValueError, match="whole records"):
            c.record(cmd, ops)
    bad = [(raw(_native.STEP_OP_PASS, layout=0), "layout"), (raw(_native.STEP_OP_PASS, dset=0), "descriptor set"),
           (raw(_native.STEP_OP_PASS, noffsets=5), "dynamic offsets"),
           (raw(_native.STEP_OP_PASS, nbytes=6), "push constants"),
           (raw(_native.STEP_OP_PASS, nbytes=132), "push constants"),
           (raw(_native.STEP_OP_PASS, buffer=h, offset=2), "indirect"),
           (raw(_native.STEP_OP_UPDATE, buffer=0, nbytes=4), "buffer"),
           (raw(_native.STEP_OP_UPDATE, buffer=h, nbytes=0), "update"),
           (raw(_native.STEP_OP_UPDATE, buffer=h, nbytes=4, offset=2), "update"),
           (raw(_native.STEP_OP_UPDATE, buffer=h, nbytes=256), "update"),
           (raw(_native.STEP_OP_COPY, buffer=h, dst=0, size=4), "src and dst"),
           (raw(_native.STEP_OP_COPY, buffer=h, dst=h, size=0), "size"),
           (raw(99), "unknown operation kind"), (raw(1 << 31), "unknown operation kind")]
    for record, match in bad:
        with pytest.raises(ValueError, match=f"operation 1: .*{match}"):
            c.record(cmd, step_ops.BARRIER + record + good)   # (checked whole: nothing reaches the driver)
    # what pass_op packs is checked as well: too many push bytes or offsets for a record
    with pytest.raises(ValueError, match="push constants"):
        c.record(cmd, step_ops.pass_op(1, 1, 1, (), bytes(132)))
    with pytest.raises(ValueError, match="dynamic offsets"):
        c.record(cmd, step_ops.pass_op(1, 1, 1, (0, 0, 0, 0, 0), b""))
    c.begin(cmd)
    with pytest.raises(ValueError, match="being recorded"):
        c.record(cmd, b"")
    c.abandon()
    assert slot.native.timeline_value(timeline) == 0   # nothing was submitted


def test_step_record_on_a_released_device_raises_destroyed(manager):
    slot = manager.slot(0)
    other = _native.Device(handle_value(slot.physical_device), handle_value(slot.device))
    c = _native.StepCommands(other)
    other.release()
    with pytest.raises(DestroyedError):
        c.record(1, step_ops.BARRIER)


def test_a_step_submit_on_a_lost_device_raises_without_reaching_the_driver(manager, bench):
    from vkmulti.testing import lose_device

    slot, c, cmd, queue, buf, timeline, _ = bench
    c.begin(cmd)
    c.barrier(True)
    c.end()
    lose_device(manager, 0)
    with pytest.raises(DeviceLostError, match="kernel step"):
        c.submit(queue.lock, cmd, [], timeline, 1)
    assert vk.vkGetSemaphoreCounterValue(slot.device, vk.ffi.cast("VkSemaphore", timeline)) == 0   # (the driver's)


def test_handle_value_is_the_handle_address_even_when_an_address_is_reused():
    a = vk.ffi.cast("VkDescriptorSet", 0x1000)
    assert handle_value(a) == 0x1000
    assert handle_value(vk.ffi.cast("VkDescriptorSet", 0x1000)) == 0x1000   # another object, same address
    assert handle_value(vk.ffi.cast("VkDescriptorSet", 0x2000)) == 0x2000
    assert handle_value(0x3000) == 0x3000


def test_a_kernel_in_the_slot_of_a_destroyed_one_gets_its_own_sets(manager):
    """Ping-pong across the pair, the partner destroyed and another launched in its
    local slot: every step binds the new kernel's sets (with validation on, a stale
    set of the destroyed one fails the test), and the hops reach the new kernel."""
    from vkmulti.kernels import pingpong_kernel
    from vkmulti.kernels.reference import read_pingpong

    def play(a, b, hops):
        payload = np.zeros(16, np.uint32)
        payload[0] = hops
        rt.send(a, payload)
        for _ in range(8 * hops + 50):
            rt.step([a, b])
            if rt.pending_receives(a) + rt.pending_receives(b):
                break
        rt.synchronize()
        assert rt.pending_receives(a) + rt.pending_receives(b) == 1
        (rt.receive(a, timeout=5) if rt.pending_receives(a) else rt.receive(b, timeout=5))

    with routed_runtime(manager, None) as (rt, _):
        a = rt.launch(pingpong_kernel(), "a", device=0)
        b = rt.launch(pingpong_kernel(), "b", device=1, params=[a.address])
        a.set_params(b.address)
        play(a, b, 6)
        slot = b.local_slot
        rt.destroy_kernel(b)
        c = rt.launch(pingpong_kernel(), "c", device=1, params=[a.address])
        assert c.local_slot == slot
        a.set_params(c.address)
        play(a, c, 6)
        bounces = read_pingpong(rt.read_state(c)).bounces
        assert bounces >= 3, bounces
        assert read_pingpong(rt.read_state(a)).bounces >= 6


def test_a_lazy_event_set_before_or_after_its_waiter_wakes_it():
    import threading

    from vkmulti._core.lifetime import LazyEvent

    e = LazyEvent()
    assert not e.is_set() and not e.wait(0)
    e.set()
    assert e.is_set() and e.wait(0) and e.wait(None)
    late = LazyEvent()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(late.wait(10)))
    waiter.start()
    late.set()
    waiter.join(10)
    assert woke == [True]


def test_kernel_ops_are_made_once_per_key_and_stamped_with_step_and_clock():
    """A kernel's packed passes (step_ops.KernelOps): made again only for a key not kept,
    the step number and the clock put into the push constants at every step."""
    made = []

    def make(tag):
        def f():
            made.append(tag)
            return step_ops.pass_op(1, 2, 3, (64,), bytes(48)), step_ops.pass_op(4, 5, 6, (64, 128), bytes(32))
        return f
    ops = step_ops.KernelOps()
    ops.get(("a",), make("a"), (7 << 32) | 5, (3 << 32) | 11)
    data = step_ops.OP.size - 128
    assert np.frombuffer(ops.kernel, np.uint32, 2, data).tolist() == [5, 7]
    assert np.frombuffer(ops.finish, np.uint32, 4, data).tolist() == [11, 3, 5, 7]
    assert ops.get(("a",), make("a2")) is ops and made == ["a"]
    ops.get(("b",), make("b"))
    ops.get(("a",), make("a3"))
    assert made == ["a", "b"]   # both kept
    for i in range(step_ops.KernelOps.KEEP):
        ops.get((i,), make(i))
    assert made[-1] == step_ops.KernelOps.KEEP - 1 and len(ops.made) <= step_ops.KernelOps.KEEP


def test_descriptor_sets_made_natively_check_their_bindings(manager):
    """StepCommands.make_set (one native call: allocate and write) refuses bad bindings
    before the driver sees them; free_set gives a set back."""
    slot = manager.slot(0)
    dev = slot.device
    sb = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
    c = _native.StepCommands(slot.native)
    dsl = vk.vkCreateDescriptorSetLayout(dev, vk.VkDescriptorSetLayoutCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, bindingCount=1, pBindings=[
            vk.VkDescriptorSetLayoutBinding(binding=0, descriptorType=sb, descriptorCount=1,
                                            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)]), None)
    pool = vk.vkCreateDescriptorPool(dev, vk.VkDescriptorPoolCreateInfo(
        sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
        flags=vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT, maxSets=1, poolSizeCount=1,
        pPoolSizes=[vk.VkDescriptorPoolSize(type=sb, descriptorCount=1)]), None)
    buf = MappedBuffer(slot, 256)
    p, layout, h = handle_value(pool), handle_value(dsl), buf.handle_int
    try:
        for args, error, match in (((0, layout, [(sb, h, 0, 256)]), ValueError, "pool"),
                                   ((p, 0, [(sb, h, 0, 256)]), ValueError, "layout"),
                                   ((p, layout, [(sb, 0, 0, 256)]), ValueError, "null buffer"),
                                   ((p, layout, [(sb, h, 0)]), TypeError, "binding 0"),
                                   ((p, layout, [[sb, h, 0, 256]]), TypeError, "binding 0"),
                                   ((p, layout, [(sb, h, 0, 256)] * 65), ValueError, "at most 64"),
                                   ((p, layout, [(-1, h, 0, 256)]), ValueError, "descriptor type -1"),
                                   ((p, layout, [(0, h, 0, 256)]), ValueError, "not a buffer's"),
                                   ((p, layout, [(sb, h, 0, 0)]), ValueError, "range"),
                                   ((p, layout, [(sb, h, -4, 256)]), ValueError, "out of range"),
                                   ((p, layout, [(sb, h, 0.5, 256)]), TypeError, "offset must be an int"),
                                   ((p, layout, [(sb, h, 0, 1 << 64)]), ValueError, "out of range"),
                                   ((p, layout, None), TypeError, "")):
            with pytest.raises(error, match=match or None):
                c.make_set(*args)
        with pytest.raises(ValueError, match="dset"):
            c.free_set(p, 0)
        for _ in range(3):   # (maxSets 1: each set freed makes room for the next; lavapipe does not enforce it)
            dset = c.make_set(p, layout, [(sb, h, 0, 256)])
            assert dset
            c.free_set(p, dset)
    finally:
        buf.destroy()
        vk.vkDestroyDescriptorPool(dev, pool, None)
        vk.vkDestroyDescriptorSetLayout(dev, dsl, None)


def test_an_interrupt_right_after_a_gpu_jobs_native_submit_counts_the_job(manager):
    """GpuJobs.submit_ops: a Ctrl-C that comes once the driver took the job leaves it
    counted (its command buffer is not reused under the GPU, the next job signals the
    next value, its buffers' destroy() waits for it)."""
    from vkmulti.kernels.engine.gpu_jobs import GpuJobs

    slot = manager.slot(0)
    jobs = GpuJobs(slot, step_queue(slot))
    buf = MappedBuffer(slot, 256)

    def write(value):
        return step_ops.update_op(buf.handle_int, 0, np.uint32(value).tobytes()) + step_ops.HOST_BARRIER

    class Interrupted:
        def __init__(self, real):
            self.real = real

        def submit(self, *args):
            self.real.submit(*args)
            raise KeyboardInterrupt

        def __getattr__(self, name):
            return getattr(self.real, name)
    try:
        jobs.wait(jobs.submit_ops(write(1)), 10)
        real = jobs._native_cmds
        jobs._native_cmds = Interrupted(real)
        try:
            with pytest.raises(KeyboardInterrupt):
                jobs.submit_ops(write(2), users=[buf])
        finally:
            jobs._native_cmds = real
        assert jobs.value == 2
        last = jobs.submit_ops(write(3))
        assert last.value == 3
        jobs.wait(last, 10)
        assert int(buf.words[0]) == 3
    finally:
        buf.destroy()
        jobs.destroy()


def test_native_sets_and_jobs_after_their_device_or_jobs_are_gone_raise_destroyed(manager):
    """make_set/free_set on a released native device, and GpuJobs.submit_ops once the
    jobs were destroyed (by another thread meanwhile), raise DestroyedError without
    reaching the driver."""
    from vkmulti.kernels.engine.gpu_jobs import GpuJobs

    slot = manager.slot(0)
    other = _native.Device(handle_value(slot.physical_device), handle_value(slot.device))
    c = _native.StepCommands(other)
    other.release()
    with pytest.raises(DestroyedError):
        c.make_set(1, 1, [])
    with pytest.raises(DestroyedError):
        c.free_set(1, 1)
    jobs = GpuJobs(slot, step_queue(slot))
    buf = MappedBuffer(slot, 256)
    try:
        op = step_ops.update_op(buf.handle_int, 0, bytes(4)) + step_ops.HOST_BARRIER
        jobs.wait(jobs.submit_ops(op), 10)
        t = threading.Thread(target=jobs.destroy)
        t.start()
        t.join(30)
        with pytest.raises(DestroyedError):
            jobs.submit_ops(op)
        with pytest.raises(DestroyedError):   # nor does a command buffer get made ahead
            jobs.prepare(2)
    finally:
        buf.destroy()
