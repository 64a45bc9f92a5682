# Bindings of a kernel runtime step's recording and submit (vkm_step.h): one
# StepCommands per device context; included into _native.pyx after link.pxi.

cdef extern from "vkm_step.h" nogil:
    ctypedef void* VkCommandBuffer
    ctypedef void* VkPipeline
    ctypedef void* VkPipelineLayout
    ctypedef void* VkDescriptorSet

    enum:
        VKM_STEP_MAX_OFFSETS
        VKM_STEP_MAX_PUSH
        VKM_STEP_OP_BYTES
        VKM_STEP_OP_PASS
        VKM_STEP_OP_BARRIER
        VKM_STEP_OP_HOST_BARRIER
        VKM_STEP_OP_UPDATE
        VKM_STEP_OP_COPY

    long vkm_step_check_ops(const void *ops, size_t n, const char **why)
    VkResult vkm_step_record(const vkm_device *d, VkCommandBuffer cmd, const void *ops, size_t n)
    VkResult vkm_step_begin(const vkm_device *d, VkCommandBuffer cmd)
    VkResult vkm_step_end(const vkm_device *d, VkCommandBuffer cmd)
    void vkm_step_abandon(const vkm_device *d, VkCommandBuffer cmd)
    void vkm_step_barrier(const vkm_device *d, VkCommandBuffer cmd, int host)
    void vkm_step_bind_pipeline(const vkm_device *d, VkCommandBuffer cmd, VkPipeline pipeline)
    void vkm_step_pass(const vkm_device *d, VkCommandBuffer cmd, VkPipelineLayout layout, VkDescriptorSet set,
                       uint32_t noffsets, const uint32_t *offsets, uint32_t push_bytes, const void *push,
                       uint32_t gx, uint32_t gy, uint32_t gz, VkBuffer indirect, VkDeviceSize indirect_offset)
    void vkm_step_copy(const vkm_device *d, VkCommandBuffer cmd, VkBuffer src, VkBuffer dst,
                       VkDeviceSize src_offset, VkDeviceSize dst_offset, VkDeviceSize size)
    void vkm_step_update(const vkm_device *d, VkCommandBuffer cmd, VkBuffer buffer, VkDeviceSize offset,
                         VkDeviceSize size, const void *data)
    VkResult vkm_step_submit(const vkm_device *d, vkm_queue *q, VkCommandBuffer cmd, uint32_t nwaits,
                             const VkSemaphore *sems, const uint64_t *values, VkSemaphore signal, uint64_t value)
    enum:
        VKM_SET_MAX_BINDINGS
        VK_ERROR_OUT_OF_POOL_MEMORY
        VK_ERROR_FRAGMENTED_POOL
    ctypedef void* VkDescriptorPool
    ctypedef void* VkDescriptorSetLayout
    VkResult vkm_set_make(const vkm_device *d, VkDescriptorPool pool, VkDescriptorSetLayout layout, uint32_t n,
                          const uint32_t *types, const VkBuffer *buffers, const VkDeviceSize *offsets,
                          const VkDeviceSize *ranges, VkDescriptorSet *out)
    VkResult vkm_set_free(const vkm_device *d, VkDescriptorPool pool, VkDescriptorSet set)


#: The operations of StepCommands.record (vkm_step.h's vkm_step_op): each a record of
#: STEP_OP_BYTES bytes, struct STEP_OP_FORMAT (native byte order) with these kinds.
STEP_OP_BYTES = VKM_STEP_OP_BYTES
STEP_OP_FORMAT = "=4I4I4I8Q128s"
STEP_OP_PASS = VKM_STEP_OP_PASS
STEP_OP_BARRIER = VKM_STEP_OP_BARRIER
STEP_OP_HOST_BARRIER = VKM_STEP_OP_HOST_BARRIER
STEP_OP_UPDATE = VKM_STEP_OP_UPDATE
STEP_OP_COPY = VKM_STEP_OP_COPY

#: The descriptor types StepCommands.make_set writes (VkDescriptorType: UNIFORM_BUFFER, STORAGE_BUFFER and
#: their DYNAMIC forms): a set of buffers only.
_BUFFER_DESCRIPTORS = frozenset((6, 7, 8, 9))
_U64_MAX = (1 << 64) - 1


def _binding_int(value, Py_ssize_t i, str what):
    """`value` as an int (no float or other number taken by truncation), naming the binding."""
    try:
        return _operator.index(value)
    except TypeError:
        raise TypeError(f"binding {i}: the {what} must be an int, got {type(value).__name__}") from None


cdef class StepCommands:
    """Records a kernel runtime's steps on one device into its command buffers
    through the device's function table (vkm_step.h), and submits them: one
    call per pass (set, push constants, dispatch) instead of a cffi call and its
    structs per command. Handles are ints.

    begin(cmd) resets and begins a command buffer; the recording methods append
    to it; end() closes it. One command buffer is recorded at a time and the
    caller serialises the use (a device's steps are recorded and submitted under
    that device's lock)."""
    cdef Device dev
    cdef VkCommandBuffer cmd
    cdef readonly uint64_t submitted   # the signal value of the last submit the driver accepted

    def __cinit__(self, Device device not None):
        self.dev = device
        self.cmd = NULL
        self.submitted = 0

    @property
    def recording(self):
        """The command buffer being recorded (0: none)."""
        return <uintptr_t>self.cmd

    cdef inline VkCommandBuffer _open(self) except NULL:
        if self.cmd == NULL:
            raise ValueError("StepCommands: no command buffer is being recorded (call begin(cmd) first)")
        return self.cmd

    def begin(self, uintptr_t cmd):
        """Reset and begin (one-time submit) command buffer `cmd` of a resettable pool."""
        cdef vkm_device *d = self.dev.ptr()
        _nonzero(cmd, "cmd")
        self.cmd = NULL
        check(vkm_step_begin(d, <VkCommandBuffer>cmd), "vkBeginCommandBuffer(kernel step)")
        self.cmd = <VkCommandBuffer>cmd

    def record(self, uintptr_t cmd, bytes ops not None):
        """Record a whole step into `cmd` in one call: reset and begin it, record `ops`
        (STEP_OP_BYTES-byte records of vkm_step_op, packed with STEP_OP_FORMAT: passes,
        which bind their pipeline unless it is bound already, barriers, updates of up
        to 128 bytes, copies) in order and end it, without the GIL. Every record is
        checked first (ValueError naming the first bad one; nothing is recorded);
        a failed begin or end leaves `cmd` reset. No other recording may be open."""
        cdef vkm_device *d = self.dev.ptr()
        cdef Py_ssize_t size = len(ops)
        cdef const char *p = ops
        cdef const char *why = NULL
        cdef long bad
        cdef size_t n
        cdef VkResult r
        _nonzero(cmd, "cmd")
        if self.cmd != NULL:
            raise ValueError("StepCommands.record: a command buffer is being recorded (end() or abandon() it first)")
        if size % VKM_STEP_OP_BYTES:
            raise ValueError(f"ops must be whole records of {VKM_STEP_OP_BYTES} bytes, got {size} bytes")
        n = <size_t>(size // VKM_STEP_OP_BYTES)
        bad = vkm_step_check_ops(p, n, &why)
        if bad >= 0:
            raise ValueError(f"operation {bad}: {why.decode()}")
        with nogil:
            r = vkm_step_record(d, <VkCommandBuffer>cmd, p, n)
        check(r, "vkBeginCommandBuffer/vkEndCommandBuffer(kernel step)")

    def end(self):
        """End the command buffer begun last (then none is being recorded)."""
        cdef vkm_device *d = self.dev.ptr()
        cdef VkCommandBuffer cmd = self._open()
        self.cmd = NULL
        check(vkm_step_end(d, cmd), "vkEndCommandBuffer(kernel step)")

    def abandon(self):
        """Drop the recording (an error while recording): the command buffer is ended and
        reset at once, so nothing recorded so far can run, and is never submitted. (Resetting
        it only at its next begin() left the abandoned commands in it on NVIDIA's driver.)"""
        cdef VkCommandBuffer cmd = self.cmd
        self.cmd = NULL
        if cmd != NULL:
            vkm_step_abandon(self.dev.ptr(), cmd)

    def barrier(self, bint host=False):
        """A global memory barrier: everything before, for everything after (`host`: and host reads)."""
        cdef VkCommandBuffer cmd = self._open()
        vkm_step_barrier(self.dev.ptr(), cmd, host)

    def bind_pipeline(self, uintptr_t pipeline):
        cdef VkCommandBuffer cmd = self._open()
        _nonzero(pipeline, "pipeline")
        vkm_step_bind_pipeline(self.dev.ptr(), cmd, <VkPipeline>pipeline)

    def dispatch(self, uintptr_t layout, uintptr_t dset, tuple offsets not None, bytes push not None,
                 uint32_t x=1, uint32_t y=1, uint32_t z=1):
        """Bind set 0 of `layout` (`dset`, with the dynamic `offsets`), push `push`
        at offset 0 (b"": none) and vkCmdDispatch(x, y, z)."""
        self._pass(layout, dset, offsets, push, x, y, z, 0, 0)

    def dispatch_indirect(self, uintptr_t layout, uintptr_t dset, tuple offsets not None, bytes push not None,
                          uintptr_t buffer, VkDeviceSize offset):
        """dispatch() whose workgroup counts are 3 uint32 at `offset` of `buffer` (vkCmdDispatchIndirect)."""
        _nonzero(buffer, "buffer")
        if offset % 4:
            raise ValueError(f"indirect offset must be a multiple of 4, got {offset}")
        self._pass(layout, dset, offsets, push, 0, 0, 0, buffer, offset)

    cdef int _pass(self, uintptr_t layout, uintptr_t dset, tuple offsets, bytes push, uint32_t x, uint32_t y,
                   uint32_t z, uintptr_t indirect, VkDeviceSize indirect_offset) except -1:
        cdef VkCommandBuffer cmd = self._open()
        cdef uint32_t offs[VKM_STEP_MAX_OFFSETS]
        cdef Py_ssize_t n = len(offsets), i, size = len(push)
        _nonzero(layout, "layout")
        _nonzero(dset, "descriptor set")
        if n > VKM_STEP_MAX_OFFSETS:
            raise ValueError(f"at most {VKM_STEP_MAX_OFFSETS} dynamic offsets, got {n}")
        if size > VKM_STEP_MAX_PUSH or size % 4:
            raise ValueError(f"push constants must be a multiple of 4 bytes, at most {VKM_STEP_MAX_PUSH}, "
                             f"got {size}")
        for i in range(n):
            offs[i] = offsets[i]
        vkm_step_pass(self.dev.ptr(), cmd, <VkPipelineLayout>layout, <VkDescriptorSet>dset, <uint32_t>n, offs,
                      <uint32_t>size, <const char *>push, x, y, z, <VkBuffer>indirect, indirect_offset)
        return 0

    def copy(self, uintptr_t src, uintptr_t dst, VkDeviceSize src_offset, VkDeviceSize dst_offset,
             VkDeviceSize size):
        """vkCmdCopyBuffer of one region (`size` > 0)."""
        cdef VkCommandBuffer cmd = self._open()
        _nonzero(src, "src")
        _nonzero(dst, "dst")
        if size == 0:
            raise ValueError("copy size must be > 0")
        vkm_step_copy(self.dev.ptr(), cmd, <VkBuffer>src, <VkBuffer>dst, src_offset, dst_offset, size)

    def update(self, uintptr_t buffer, VkDeviceSize offset, bytes data not None):
        """vkCmdUpdateBuffer of `data` (a multiple of 4 bytes, 4 to 65536) at `offset` (a multiple of 4)."""
        cdef VkCommandBuffer cmd = self._open()
        cdef Py_ssize_t size = len(data)
        _nonzero(buffer, "buffer")
        if size == 0 or size > 65536 or size % 4 or offset % 4:
            raise ValueError(f"update needs 4 to 65536 bytes, a multiple of 4, at an offset that is one; got "
                             f"{size} bytes at {offset}")
        vkm_step_update(self.dev.ptr(), cmd, <VkBuffer>buffer, offset, <VkDeviceSize>size, <const char *>data)

    def make_set(self, uintptr_t pool, uintptr_t layout, list bindings not None):
        """A descriptor set of `layout` from `pool`, each of `bindings` ((descriptor type,
        buffer, offset, range) per binding, in order) written as a buffer: its handle, or
        0 where the pool is out of room (VK_ERROR_OUT_OF_POOL_MEMORY or
        VK_ERROR_FRAGMENTED_POOL: try another pool). Every binding is checked first: a
        buffer descriptor type (uniform or storage, dynamic or not), a non-null buffer,
        ints in range, a range that is not 0."""
        cdef vkm_device *d = self.dev.ptr()
        cdef uint32_t types[VKM_SET_MAX_BINDINGS]
        cdef VkBuffer buffers[VKM_SET_MAX_BINDINGS]
        cdef VkDeviceSize offsets[VKM_SET_MAX_BINDINGS]
        cdef VkDeviceSize ranges[VKM_SET_MAX_BINDINGS]
        cdef tuple items = tuple(bindings)   # (a snapshot: the conversions below run no caller code on it)
        cdef Py_ssize_t n = len(items), i
        cdef VkDescriptorSet out = NULL
        cdef VkResult r
        _nonzero(pool, "pool")
        _nonzero(layout, "layout")
        if n > VKM_SET_MAX_BINDINGS:
            raise ValueError(f"a descriptor set of at most {VKM_SET_MAX_BINDINGS} bindings, got {n}")
        for i in range(n):
            item = items[i]
            if not isinstance(item, tuple) or len(item) != 4:
                raise TypeError(f"binding {i} must be (type, buffer, offset, range), got {_shown(item)}")
            t, b, o, rg = (_binding_int(v, i, what) for v, what in zip(item, ("type", "buffer", "offset", "range")))
            if t not in _BUFFER_DESCRIPTORS:
                raise ValueError(f"binding {i}: descriptor type {t} is not a buffer's (uniform or storage buffer, "
                                 f"dynamic or not)")
            if b == 0:
                raise ValueError(f"binding {i}: a null buffer")
            if not 0 < b <= _U64_MAX or not 0 <= o <= _U64_MAX or not 0 < rg <= _U64_MAX:
                raise ValueError(f"binding {i}: buffer {b:#x}, offset {o} or range {rg} out of range (a range is "
                                 f"not 0)")
            types[i] = <uint32_t>t
            buffers[i] = <VkBuffer><uintptr_t>b
            offsets[i] = <VkDeviceSize>o
            ranges[i] = <VkDeviceSize>rg
        with nogil:
            r = vkm_set_make(d, <VkDescriptorPool>pool, <VkDescriptorSetLayout>layout, <uint32_t>n, types, buffers,
                             offsets, ranges, &out)
        if r == VK_ERROR_OUT_OF_POOL_MEMORY or r == VK_ERROR_FRAGMENTED_POOL:
            return 0
        check(r, "vkAllocateDescriptorSets")
        return <uintptr_t>out

    def free_set(self, uintptr_t pool, uintptr_t dset):
        """vkFreeDescriptorSets of one set of `pool`."""
        cdef vkm_device *d = self.dev.ptr()
        cdef VkResult r
        _nonzero(pool, "pool")
        _nonzero(dset, "dset")
        with nogil:
            r = vkm_set_free(d, <VkDescriptorPool>pool, <VkDescriptorSet>dset)
        check(r, "vkFreeDescriptorSets")

    def submit(self, QueueLock queue not None, uintptr_t cmd, list waits not None, uintptr_t signal,
               uint64_t value):
        """vkQueueSubmit of `cmd` to `queue` that waits (all commands) for the timeline
        points `waits` ((semaphore, value) pairs) and signals `signal` to `value`,
        through the queue's lock and the device's lost flag (DeviceLostError on a
        device marked lost, without calling the driver), without the GIL."""
        cdef vkm_device *d = self.dev.ptr()
        cdef tuple items = tuple(waits)   # (a snapshot: the conversions below may run caller code that changes
                                          # `waits`, and items are read by index without a bounds check)
        cdef Py_ssize_t n = len(items), i
        cdef VkSemaphore *sems = NULL
        cdef uint64_t *values = NULL
        cdef vkm_queue *q = queue.ptr()
        cdef VkResult r
        _nonzero(cmd, "cmd")
        _nonzero(signal, "signal")
        self.dev.own(signal, "signal")
        if <VkCommandBuffer>cmd == self.cmd:
            raise ValueError("StepCommands.submit: the command buffer is still being recorded (end() it first)")
        if n:
            sems = <VkSemaphore *>malloc(n * sizeof(VkSemaphore))
            values = <uint64_t *>malloc(n * sizeof(uint64_t))
        try:
            if n and (sems == NULL or values == NULL):
                raise MemoryError()
            for i in range(n):
                sem, v = items[i]
                sems[i] = <VkSemaphore><uintptr_t>sem
                if sems[i] == NULL:
                    raise ValueError(f"wait {i}: the semaphore must be a non-null handle, got 0")
                self.dev.own(<uintptr_t>sems[i], f"wait {i}: semaphore")
                values[i] = _timeline_u64(v, f"wait {i}'s value")
            with nogil:
                r = vkm_step_submit(d, q, <VkCommandBuffer>cmd, <uint32_t>n, sems, values, <VkSemaphore>signal,
                                    value)
        finally:
            free(sems)
            free(values)
        if r == VK_SUCCESS:   # (set before any Python runs: an interrupt after the submit cannot hide it)
            self.submitted = value
        if r == VKM_ERROR_QUEUE_LOCK_HELD:
            check_held(r, "vkQueueSubmit(kernel step)", q)
        check(r, "vkQueueSubmit(kernel step)")
