"""One device's share of a KernelRuntime: its queue and timeline, its pipeline
cache, the descriptor layouts of the kernel ABI, the runtime's own passes
(finish, deliver, survey), the host-visible status ring and the directory.

Steps on one device are serialised on one queue and signal one timeline
semaphore, one value per step; nothing here waits for a queue to go idle.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
import vulkan as vk

from ...errors import DestroyedError, DeviceLostError, TimeoutError as VkmTimeout, UnsupportedError, VkmError, VulkanError
from ..._core import _native, vkapi
from ...device.logical import retire_submits
from ..._core.lifetime import Deadline
from ..._core.protocols import Destroyable
from ...device.commands import SubmitUser
from ...device.pipeline_helper import cache_from_blob, compiled_cache, create_compute_pipeline, use_helper
from ...device.shader_support import ShaderSupport, check_device_support
from ...memory.buffer import MappedBuffer
from ...memory.image import BUFFER_USAGE, Buffer, CommandRunner
from ...memory.staging import StagingBuffers
from ..._core.shaders import shader_bytes
from ..._core.timeline import TimelinePoint
from ...transfer.link import link_queue
from .pipeline_cache import FILES, identity_of
from .recording import barrier, handle_value
from .spirv import check_workgroup_size, reflect

_ffi = vk.ffi
log = logging.getLogger(__name__)

SB = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
SB_DYN = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER_DYNAMIC
#: Words of the status ring per in-flight step (deliver records are 8 words, surveys 16). A
#: deliver record: taken, left, rejected, the batch's count, then (planning passes) the
#: workgroup count of the copy pass that follows (x, y, z), read by vkCmdDispatchIndirect.
STATUS_WORDS = 4096
DELIVER_RECORD = 8
SURVEY_RECORD = 16
#: Local slots a device can tell apart in a survey mask (8 words of bits).
MAX_LOCAL_KERNELS = 256
#: The directory entry of an address (address, device + 1, local slot, tenant).
DIRECTORY_ENTRY = 16
_POOL_SETS = 128
#: VK_WHOLE_SIZE (the `vulkan` package's constant is negative, which cffi refuses for a VkDeviceSize)
WHOLE_SIZE = 0xFFFFFFFFFFFFFFFF


def align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class StepCondition(threading.Condition):
    """A device context's condition: threads wait on it for its steps, and the
    steps notify it at every turn; notify_all() costs nothing while no thread
    waits (the step loop's common case). Waits and notifies hold its lock."""

    def __init__(self, lock: Any):
        super().__init__(lock)
        self.waiting = 0   # threads in wait() (changed with the lock held)

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting += 1
        try:
            return super().wait(timeout)
        finally:
            self.waiting -= 1

    def notify_all(self) -> None:
        if self.waiting:
            super().notify_all()


class ComputePass:
    """A compute pipeline with its set layout and pipeline layout, made through the
    context's pipeline cache, or first through `compiled` (a cache the pipeline
    helper filled: a hit), which is then merged into the context's and destroyed."""

    def __init__(self, ctx: "DeviceContext", code: bytes, entry: str, types: list[int], push_bytes: int,
                 compiled: Any = None):
        dev = ctx.slot.device
        self.types = types
        self.push_bytes = push_bytes
        #: set by DeviceContext: its key in `passes`; kernel pipelines only: how many kernels (their
        #: Residency) hold it, and the timeline value of the last step that may bind it
        self.key: tuple | None = None
        self.made_from = (code, entry, len(types) - 2)   # (a kernel pass: code, entry point, state buffers)
        self.users = 0
        self.idle_since = 0
        self.dsl = self.layout = self.pipeline = None
        try:
            self.dsl, self.layout, self.pipeline = create_compute_pipeline(
                dev, compiled if compiled is not None else ctx.pipeline_cache, code, entry, types, push_bytes)
            if compiled is not None:
                vkapi.vkMergePipelineCaches(dev, ctx.pipeline_cache, 1, [compiled])
        finally:
            if compiled is not None:
                vk.vkDestroyPipelineCache(dev, compiled, None)
        #: the handles as ints, for the native step recorder (StepCommands)
        self.pipeline_int, self.layout_int = handle_value(self.pipeline), handle_value(self.layout)
        self.dsl_int = handle_value(self.dsl)

    def destroy(self, dev: Any) -> None:
        if self.pipeline is not None:
            vk.vkDestroyPipeline(dev, self.pipeline, None)
        if self.layout is not None:
            vk.vkDestroyPipelineLayout(dev, self.layout, None)
        if self.dsl is not None:
            vk.vkDestroyDescriptorSetLayout(dev, self.dsl, None)
        self.pipeline = self.layout = self.dsl = None
        self.layout_int = self.dsl_int = 0   # (the native recorder and make_set refuse a 0 layout)


#: Kernel pipelines that kernels held and let go which a device keeps built (the most recently let
#: go): a rollback or a reload back finds them; older ones are destroyed once no step can bind them
#: (unless a live kernel that may run there has that code), so that a process reloading code many
#: times does not grow without bound.
MAX_UNUSED_PASSES = 8


class UnusedPasses:
    """The kernel pipelines of one DeviceContext that kernels held and let go, oldest first (its
    pass_lock held by every caller): `evictable(done)` takes out those past the
    MAX_UNUSED_PASSES newest whose last step is done (`done`: the completed timeline value).
    A pipeline built ahead and never held is not among them: it stays built."""

    def __init__(self) -> None:
        self.passes: dict[tuple, ComputePass] = {}   # (insertion order: oldest first)
        self.evicted = 0

    def add(self, p: ComputePass) -> None:
        self.passes.pop(p.key, None)  # type: ignore[arg-type]
        self.passes[p.key] = p  # type: ignore[index]

    def remove(self, p: ComputePass) -> None:
        self.passes.pop(p.key, None)  # type: ignore[arg-type]

    def evictable(self, done: Callable[[], int]) -> list[ComputePass]:
        """Take out the oldest past the newest MAX_UNUSED_PASSES whose last step is done."""
        out: list[ComputePass] = []
        value = None
        while len(self.passes) > MAX_UNUSED_PASSES:
            key, p = next(iter(self.passes.items()))
            if value is None:
                value = done()
            if p.idle_since > value:
                break
            del self.passes[key]
            out.append(p)
        return out


# push-constant sizes of the runtime's passes and of the kernel ABI (VkmStep)
KERNEL_PUSH = 48
FINISH_PUSH = 32
DELIVER_PUSH = 32
SURVEY_PUSH = 16


def kernel_types(n_state: int) -> list[int]:
    """The descriptor types of a kernel with `n_state` state buffers (inbox, outbox regions, states)."""
    return [SB, SB_DYN] + [SB] * n_state


def step_queue(slot: Any) -> Any:
    """The queue kernel steps go to: the universal queue that vkmulti's transfers do
    not use (the graphics queue, where the device has a second universal queue for
    them), else the universal copy queue. On its own queue a step may wait for a
    transfer submitted after it (the K2K router's landings) without the host
    having to wait for that submit first."""
    g, u = slot.graphics_queue, slot.universal_copy_queue
    if int(g) not in (int(u), int(slot.copy_queue)):
        return g
    return u


def shares_step_queue(slot: Any, method: str | None) -> bool:
    """Whether a transfer link of `method` submits on the queue kernel steps (and the
    runtime's GPU jobs) use on `slot`: then work of theirs that waits on the
    transfer's point must be submitted after the transfer's own submit (an in-order
    queue cannot run a wait placed before its signal); on another queue it may be
    submitted first."""
    return int(link_queue(slot, method)) == int(step_queue(slot))


class DeviceContext:
    """The runtime's objects on one device (see the module docstring)."""

    # made by __init__ once the device is set up (None before, and after destroy)
    status: MappedBuffer
    directory: Buffer
    runner: CommandRunner

    def __init__(self, slot: Any, *, in_flight: int, table_size: int, timeout: float | None = 60.0):
        if getattr(slot, "device", None) is None or getattr(slot, "native", None) is None:
            raise ValueError(f"device {getattr(slot, 'index', '?')} has no live device with a native table "
                             f"(a destroyed slot, or a passthrough primary); use an active MultiDeviceManager")
        self.slot = slot
        self.index = slot.index
        self.queue = step_queue(slot)
        self.in_flight = in_flight
        self.table_size = table_size
        self.lock = threading.Lock()
        self.cond = StepCondition(self.lock)
        self.alive = True
        self.waiters = 0
        self.value = 0                  # the last value submitted
        self.passes: dict[tuple, ComputePass] = {}
        #: pipelines being built now, by key: their Event is set once `passes` has them (or the build failed)
        self.building: dict[tuple, threading.Event] = {}
        self.pass_lock = threading.Lock()   # guards `passes`, `building`, `unused` (builds run outside `lock`)
        self.unused = UnusedPasses()    # kernel pipelines no kernel holds (hold_pass / release_pass)
        #: the (code, entry point, state buffers) of the kernels that may run here: their pipelines
        #: are never destroyed while no kernel holds them (set by the runtime's Prebuilder)
        self.wanted: Callable[[], set[tuple[bytes, str, int]]] = set
        #: times a caller waited for a build another thread had started instead of building it again
        self.shared_builds = 0
        self._pools: list[Any] = []
        self.local: list[Any] = [None] * MAX_LOCAL_KERNELS   # local slot -> kernel
        self.dir_dirty: set[int] = set()   # directory entries to rewrite (guarded by dir_lock)
        self.dir_lock = threading.Lock()
        self.buffer_sets: dict[tuple, Any] = {}   # survey sets of reused inbound buffers, by (buffer, size)
        self.timeline = None
        self.pipeline_cache = None
        self.cache_identity: Any = None   # (vendorID, deviceID, pipelineCacheUUID): names its cache file
        self.cache_blob: bytes | None = None   # what the pipeline cache was made from
        self.cmd_pool = None
        self.cmd_ints: list[int] = []   # the step command buffers as ints (StepCommands' handles)
        self.step_cmds = _native.StepCommands(slot.native)   # records and submits the steps
        self.queue_lock = self.queue.lock
        self.status = self.directory = self.runner = None  # type: ignore[assignment]
        self.staging = StagingBuffers(slot)   # uploads' host-visible buffers, kept between them
        try:
            self._create(timeout)
        except BaseException:
            self.destroy()
            raise

    def _create(self, timeout: float | None) -> None:
        slot, dev, deadline = self.slot, self.slot.device, Deadline(timeout)   # (the fill and the builds: one bound)
        props = vk.vkGetPhysicalDeviceProperties(slot.physical_device)
        limits = props.limits
        self.min_offset_alignment = max(16, int(limits.minStorageBufferOffsetAlignment))
        self.max_group_count = tuple(int(limits.maxComputeWorkGroupCount[i]) for i in range(3))
        size = limits.maxComputeWorkGroupSize
        self.max_group_size = (int(size[0]), int(size[1]), int(size[2]))
        self.max_invocations = int(limits.maxComputeWorkGroupInvocations)
        self.max_shared = int(limits.maxComputeSharedMemorySize)
        self.max_storage_buffers = int(limits.maxPerStageDescriptorStorageBuffers)
        self.max_storage_range = int(limits.maxStorageBufferRange)
        del props
        self.shader_support = ShaderSupport.of_slot(slot)   # (what modules its VkDevice takes)
        self.timeline = slot.native.create_timeline(0)
        self.pipeline_cache = self._open_pipeline_cache(slot)
        caps = getattr(slot, "capabilities", None)   # (builds off the step path: by the helper process?)
        self.use_helper = use_helper(caps.device_type if caps is not None else "cpu")
        self.cmd_pool = vkapi.vkCreateCommandPool(dev, vk.VkCommandPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue.family), None)
        self.cmds = vkapi.vkAllocateCommandBuffers(dev, vk.VkCommandBufferAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, commandPool=self.cmd_pool,
            level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=self.in_flight))
        self.cmd_ints = [handle_value(c) for c in self.cmds]
        self.runner = CommandRunner(slot, self.queue)
        self.status = MappedBuffer(slot, self.in_flight * STATUS_WORDS * 4,
                                   usage=BUFFER_USAGE | vk.VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT)
        directory = Buffer(slot, self.table_size * DIRECTORY_ENTRY)   # (a fill that gave up: the slot's runner frees it once it ran)
        CommandRunner.for_slot(slot).run(lambda cmd: vk.vkCmdFillBuffer(cmd, directory.handle, 0, WHOLE_SIZE, 0),
                                         timeout=deadline.left(), keep=[directory], users=[directory])
        self.directory = directory
        # (the finish pass also surveys the outbox it stamped: the directory and the status ring last)
        self.finish = self.builtin("kernel_finish.comp.spv", [SB, SB, SB_DYN, SB_DYN, SB, SB], FINISH_PUSH, deadline.left())
        self.deliver = self.builtin("kernel_deliver.comp.spv", [SB_DYN, SB, SB], DELIVER_PUSH, deadline.left())
        self.deliver_copy = self.builtin("kernel_deliver_copy.comp.spv", [SB_DYN, SB, SB], DELIVER_PUSH, deadline.left())
        self.survey = self.builtin("kernel_survey.comp.spv", [SB_DYN, SB, SB], SURVEY_PUSH, deadline.left())

    # -- pipelines -------------------------------------------------------------

    def _open_pipeline_cache(self, slot: Any) -> Any:
        """The device's VkPipelineCache, from the machine's cache file where a checked one exists."""
        self.cache_identity = identity_of(slot.physical_device)
        blob = self.cache_blob = FILES.load(self.cache_identity)
        if blob:
            try:
                return cache_from_blob(slot.device, blob)
            except VulkanError as exc:
                log.warning("GPU %d's driver refused the pipeline cache file: %s", self.index, exc)
                self.cache_blob = None
        return cache_from_blob(slot.device, None)

    def _save_pipeline_cache(self, dev: Any) -> None:
        """Write the device's pipeline cache to the machine's file when it holds more than was read."""
        native = getattr(self.slot, "native", None)
        if not FILES.enabled() or native is None or native.lost:
            return
        try:
            data = vkapi.pipeline_cache_data(dev, self.pipeline_cache, FILES.limit)
        except VulkanError as exc:
            log.warning("could not read GPU %d's pipeline cache: %s", self.index, exc)
            return
        if data and data != self.cache_blob:
            FILES.save(self.cache_identity, data)

    def builtin(self, name: str, types: list[int], push: int, timeout: float | None = 60.0) -> ComputePass:
        return self.pipeline(shader_bytes(name), "main", types, push, timeout)

    def pipeline(self, code: bytes, entry: str, types: list[int], push: int,
                 timeout: float | None = 60.0, elsewhere: bool = False) -> ComputePass:
        """The pipeline for `code` with these bindings, made once per device: built
        here when no thread builds it yet, else the other thread's build waited for
        (never a second build). The caller may hold `lock`: the build does not take it.
        `elsewhere`: compiled by the pipeline helper process where this device uses it
        (a build off the step path), then made here from its cache blob."""
        key = (hashlib.sha256(code).digest(), entry, tuple(types), push)

        def make() -> ComputePass:   # (nor a workgroup past the device's limits, nor what it was not made with)
            mod = reflect(code)
            check_device_support(mod, entry, self.shader_support, f"GPU {self.index}: SPIR-V")
            check_workgroup_size(mod, entry, self.max_group_size, self.max_invocations, self.max_shared,
                                 f"GPU {self.index}: SPIR-V")
            compiled = self._compiled_elsewhere(code, entry, types, push, timeout) if elsewhere else None
            return ComputePass(self, code, entry, types, push, compiled)
        return self._pass(key, make, timeout)

    def _compiled_elsewhere(self, code: bytes, entry: str, types: list[int], push: int,
                            timeout: float | None) -> Any:
        """A pipeline cache holding the pipeline the helper process compiled, or None."""
        if not self.use_helper:
            return None
        return compiled_cache(self.slot.device, self.cache_identity, code, entry, types, push,
                              timeout if timeout is not None else 300.0, f"GPU {self.index}")

    def build_pass(self, code: bytes, entry: str, types: list[int], push: int,
                   timeout: float | None = 60.0) -> ComputePass:
        """pipeline() for a caller that does not hold `lock` (a background build, a
        reload), compiled elsewhere where this device uses the helper: destroy()
        waits for it, and DestroyedError when the context went."""
        with self.lock:
            self.check()
            self.waiters += 1
        try:
            return self.pipeline(code, entry, types, push, timeout, elsewhere=True)
        finally:
            with self.lock:
                self.waiters -= 1
                self.cond.notify_all()

    def has_pass(self, code: bytes, entry: str, types: list[int], push: int) -> bool:
        """Whether the pipeline for `code` with these bindings is built on this device."""
        key = (hashlib.sha256(code).digest(), entry, tuple(types), push)
        with self.pass_lock:
            return key in self.passes

    def _pass(self, key: tuple, make: Callable[[], ComputePass], timeout: float | None) -> ComputePass:
        deadline = Deadline(timeout)
        while True:
            with self.pass_lock:
                p = self.passes.get(key)
                if p is not None:
                    return p
                event = self.building.get(key)
                if event is None:
                    event = self.building[key] = threading.Event()
                    break
                self.shared_builds += 1
            while not event.wait(deadline.slice()):   # (slices: interruptible)
                if deadline.expired():
                    raise VkmTimeout(f"the pipeline another thread builds on GPU {self.index} was not ready "
                                     f"within {timeout} s")
                if not self.alive:
                    raise DestroyedError(f"the kernel runtime's context on GPU {self.index} was destroyed")
        made = None
        try:
            made = make()
        finally:
            with self.pass_lock:
                del self.building[key]
                if made is not None:
                    if self.alive:
                        made.key = key
                        self.passes[key] = made
                    else:
                        made.destroy(self.slot.device)
                event.set()
        if not self.alive:
            raise DestroyedError(f"the kernel runtime's context on GPU {self.index} was destroyed while a "
                                 f"pipeline was built")
        return made

    def kernel_pass(self, code: bytes, entry: str, n_state: int, *, locked: bool = True,
                    timeout: float | None = 60.0) -> ComputePass:
        """The pipeline of a kernel with `n_state` state buffers (ABI: inbox, outbox, state...);
        `locked`: the caller holds `lock` (else build_pass)."""
        per_stage = self.max_storage_buffers
        if 2 + n_state > per_stage:
            raise UnsupportedError(f"a kernel with {n_state} state buffers needs {2 + n_state} storage buffers per "
                                   f"stage; {self.slot.name!r} (GPU {self.index}) allows {per_stage}: merge state "
                                   f"buffers", device=self.slot.name)
        build = self.pipeline if locked else self.build_pass
        return build(code, entry, kernel_types(n_state), KERNEL_PUSH, timeout)

    def hold_pass(self, code: bytes, entry: str, n_state: int, *, locked: bool = True,
                  timeout: float | None = 60.0) -> ComputePass:
        """kernel_pass(), held by the caller (a kernel's Residency) until release_pass():
        never destroyed while held."""
        while True:
            p = self.kernel_pass(code, entry, n_state, locked=locked, timeout=timeout)
            if self.hold(p):
                return p   # (else destroyed meanwhile: built anew)

    def hold(self, p: ComputePass) -> bool:
        """Hold pipeline `p` of this context (as hold_pass) when it is still built; whether so."""
        with self.pass_lock:
            if self.passes.get(p.key) is not p:  # type: ignore[arg-type]
                return False
            p.users += 1
            self.unused.remove(p)
            return True

    def let_go(self, res: Any) -> None:
        """release_pass() of the pipeline a kernel's Residency `res` holds (then it holds none)."""
        p, res.kernel_pass = res.kernel_pass, None
        if p is not None:
            self.release_pass(p, res.last_value)

    def release_pass(self, p: ComputePass, last_value: int) -> None:
        """Let go of a pipeline hold_pass() gave, bound last by the step of timeline value
        `last_value`; pipelines no kernel holds beyond the newest MAX_UNUSED_PASSES are
        destroyed once their last step is done."""
        with self.pass_lock:
            if p.users <= 0:
                return
            p.users -= 1
            p.idle_since = max(p.idle_since, last_value)
            if p.users or self.passes.get(p.key) is not p:  # type: ignore[arg-type]
                return
            self.unused.add(p)
            if not self.alive:
                return
            try:
                candidates = self.unused.evictable(self.completed)
            except VkmError:   # (a lost device: its context destroys them all)
                return
        if not candidates:
            return
        wanted = self.wanted()   # (outside pass_lock: it reads the runtime's kernels)
        gone = []
        with self.pass_lock:
            for q in candidates:   # (one still wanted stays built, no longer counted among the unused)
                if q.users == 0 and self.passes.get(q.key) is q and q.made_from not in wanted:  # type: ignore[arg-type]
                    del self.passes[q.key]  # type: ignore[arg-type]
                    gone.append(q)
            self.unused.evicted += len(gone)
        for q in gone:
            q.destroy(self.slot.device)

    # -- descriptor sets -------------------------------------------------------

    def _new_pool(self) -> Any:
        pool = vkapi.vkCreateDescriptorPool(self.slot.device, vk.VkDescriptorPoolCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
            flags=vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT, maxSets=_POOL_SETS,
            poolSizeCount=2, pPoolSizes=[vk.VkDescriptorPoolSize(type=SB, descriptorCount=_POOL_SETS * 8),
                                         vk.VkDescriptorPoolSize(type=SB_DYN, descriptorCount=_POOL_SETS * 2)]), None)
        self._pools.append(pool)
        return pool

    def descriptor_set(self, p: ComputePass, buffers: list[tuple[Any, int, int]]) -> tuple[Any, Any]:
        """A set of `p`'s layout bound to (VkBuffer, offset, range) per binding; returns (pool, set).
        Made in one native call (allocate and write), from the newest pool with room."""
        if len(buffers) != len(p.types):
            raise ValueError(f"{len(buffers)} buffer(s) for a set of {len(p.types)} bindings")
        bindings = [(t, handle_value(b), o, r) for t, (b, o, r) in zip(p.types, buffers)]
        for pool in reversed(self._pools or [self._new_pool()]):
            dset = self.step_cmds.make_set(handle_value(pool), p.dsl_int, bindings)
            if dset:
                break
        else:
            pool = self._new_pool()
            dset = self.step_cmds.make_set(handle_value(pool), p.dsl_int, bindings)
            if not dset:
                raise VkmError(f"GPU {self.index}: a new descriptor pool has no room for one set")
        return pool, _ffi.cast("VkDescriptorSet", dset)

    def free_set(self, pool_set: tuple[Any, Any]) -> None:
        pool, dset = pool_set
        self.step_cmds.free_set(handle_value(pool), handle_value(dset))

    # -- local slots and the directory ----------------------------------------------

    def take_local_slot(self, kernel: Any) -> int:
        for i, k in enumerate(self.local):
            if k is None:
                self.local[i] = kernel
                return i
        raise UnsupportedError(f"GPU {self.index} already runs {MAX_LOCAL_KERNELS} kernels of this runtime "
                               f"(the most its message survey tells apart); place kernels on another device",
                               device=self.slot.name)

    def release_local_slot(self, i: int) -> None:
        self.local[i] = None

    # -- submission and waits -------------------------------------------------

    def check(self) -> None:
        if not self.alive:
            raise DestroyedError(f"the kernel runtime's context on GPU {self.index} was destroyed")

    def point(self, value: int) -> TimelinePoint:
        return TimelinePoint.of(self.slot, self.timeline, value)  # type: ignore[arg-type]

    def completed(self) -> int:
        return self.slot.native.timeline_value(self.timeline)

    def wait_unlocked(self, value: int, timeout: float | None) -> None:
        """Wait (lock held by the caller, released while waiting) until the timeline reaches `value`."""
        self.waiters += 1
        self.lock.release()
        try:
            self.slot.native.wait_timeline(self.timeline, value, timeout)
        finally:
            self.lock.acquire()
            self.waiters -= 1
            self.cond.notify_all()

    def run_once(self, record: Callable[[Any], None], waits: Sequence[tuple[int, int]] = (),
                 timeout: float | None = 60.0, keep: Sequence[Destroyable] = (),
                 users: Sequence[SubmitUser] = ()) -> None:
        """A one-shot command buffer on this context's queue, after a full barrier, waited with a fence.

        `keep`: objects the commands use that the runner frees if the run fails
        (once the GPU is done with them); after a run that returns they are the caller's.
        `users`: resources the commands touch, whose destroy() waits for a submit
        whose wait gave up (CommandRunner.run)."""
        def full(cmd: Any) -> None:
            barrier(cmd)
            record(cmd)
            barrier(cmd)
        self.runner.run(full, waits=list(waits), timeout=timeout, keep=keep, users=users)

    def status_words(self, region: int) -> np.ndarray:
        return self.status.words[region * STATUS_WORDS:(region + 1) * STATUS_WORDS]

    # -- teardown -----------------------------------------------------------------

    def retire(self) -> None:
        """Nothing steps on this context from now on (its objects stay until destroy())."""
        with self.lock:
            self.alive = False
            self.cond.notify_all()

    def destroy(self, timeout: float = 30.0) -> None:
        """Wait for every submitted step (bounded), then free everything."""
        self.retire()
        dev = self.slot.device
        if dev is None:
            return
        if self.timeline is not None and self.value:
            try:
                self.slot.native.wait_timeline(self.timeline, self.value, timeout)
            except DeviceLostError:
                pass
        deadline = time.monotonic() + timeout
        with self.lock:
            while self.waiters and time.monotonic() < deadline:
                self.cond.wait(0.05)
            if self.waiters:
                raise VkmTimeout(f"threads still wait on GPU {self.index}'s kernel timeline after {timeout:.1f} s")
        with self.pass_lock:
            passes, self.passes = list(self.passes.values()), {}
        for p in passes:
            p.destroy(dev)
        for pool in self._pools:
            vk.vkDestroyDescriptorPool(dev, pool, None)
        self._pools.clear()
        self.staging.destroy()
        for obj in (self.status, self.directory, self.runner):
            if obj is not None:
                obj.destroy()
        self.status = self.directory = None  # type: ignore[assignment]   # (the runner refuses runs: DestroyedError)
        if self.cmd_pool is not None:
            vk.vkDestroyCommandPool(dev, self.cmd_pool, None)
            self.cmd_pool = None
        if self.pipeline_cache is not None:
            self._save_pipeline_cache(dev)
            vk.vkDestroyPipelineCache(dev, self.pipeline_cache, None)
            self.pipeline_cache = None
        if self.timeline is not None:
            if self.value:   # (no step: no submit waited on the timeline)
                retire_submits(self.slot, Deadline(max(0.0, deadline - time.monotonic())))   # (see devices.retire_submits)
            self.slot.native.destroy_timeline(self.timeline)
            self.timeline = None
