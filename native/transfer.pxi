# Bindings of the transfer engine (vkm_transfer.h); included into _native.pyx.

cdef extern from "vkm_transfer.h" nogil:
    ctypedef void* VkBuffer
    ctypedef void* VkImage
    ctypedef void* VkImageView
    ctypedef int VkImageLayout
    ctypedef int VkExternalMemoryHandleTypeFlagBits

    enum:
        VKM_RING_STAGING
        VKM_RING_SHARED_HOST
        VKM_RING_EXPORTED

    ctypedef struct vkm_endpoint:
        VkBuffer buffer
        VkDeviceSize offset
        VkImage image
        uint32_t width, height, bytes_per_pixel
        uint32_t mip_level, array_layer
        VkImageLayout layout_before, layout_after
        vkm_queue *owner
        VkSemaphore wait_semaphore
        uint64_t wait_value
        uint32_t kernel
        VkImageView kernel_view

    ctypedef struct vkm_link:
        pass

    ctypedef struct vkm_link_config:
        int ring
        VkDeviceSize slot_size
        uint32_t slot_count
        VkExternalMemoryHandleTypeFlagBits export_type
        uint64_t stall_timeout_ns
        uint64_t spin_ns
        int copy_threads
        int ramps
        uint32_t parts

    VkResult vkm_link_create(vkm_device *src, vkm_queue *src_queue, vkm_device *dst, vkm_queue *dst_queue,
                             const vkm_link_config *config, vkm_link **out, const char **call)
    void vkm_link_destroy(vkm_link *link)
    VkSemaphore vkm_link_src_timeline(const vkm_link *link)
    VkSemaphore vkm_link_dst_timeline(const vkm_link *link)
    VkDeviceSize vkm_link_slot_size(const vkm_link *link)
    VkResult vkm_link_submit(vkm_link *link, const vkm_endpoint *src, const vkm_endpoint *dst, VkDeviceSize size,
                             uint64_t *ticket, uint64_t *src_done, uint64_t *dst_ready, const char **call)
    VkResult vkm_link_poll(vkm_link *link, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns,
                           const char **call)
    VkResult vkm_link_wait_submitted(vkm_link *link, uint64_t ticket, uint64_t timeout_ns, const char **call)
    VkDeviceSize *vkm_plan_chunks(VkDeviceSize size, VkDeviceSize chunk, VkDeviceSize unit, int ramps,
                                  uint32_t *count)

RING_STAGING = VKM_RING_STAGING
RING_SHARED_HOST = VKM_RING_SHARED_HOST
RING_EXPORTED = VKM_RING_EXPORTED


cdef int check_ramps(int ramps) except -2:
    if ramps < -1 or ramps > 4:
        raise ValueError(f"ramps must be -1 (the default) or 0..4, got {ramps}")
    return ramps


def plan_chunks(uint64_t size, uint64_t chunk, uint64_t unit, int ramps):
    """The chunk boundaries a link cuts a job of `size` bytes into (0 ... size)."""
    cdef uint32_t count = 0
    cdef VkDeviceSize *b
    if size == 0 or unit == 0 or chunk < unit or chunk % unit:
        raise ValueError(f"need size > 0 and chunk a positive multiple of unit, got {size}, {chunk}, {unit}")
    if size // chunk > (1 << 24):
        raise ValueError(f"{size} B in chunks of {chunk} B is too many chunks")
    check_ramps(ramps)
    b = vkm_plan_chunks(size, chunk, unit, ramps, &count)
    if b == NULL:
        raise MemoryError()
    try:
        return [b[i] for i in range(count + 1)]
    finally:
        free(b)


cdef int fill_endpoint(vkm_endpoint *e, object spec, list keep) except -1:
    """Fill `e` from an Endpoint-like object (see vkmulti.transfer.Endpoint)."""
    cdef QueueLock owner
    e.buffer = <VkBuffer><uintptr_t>(spec.buffer or 0)
    e.offset = spec.offset
    e.image = <VkImage><uintptr_t>(spec.image or 0)
    e.width = spec.width
    e.height = spec.height
    e.bytes_per_pixel = spec.bytes_per_pixel
    e.mip_level = spec.mip_level
    e.array_layer = spec.array_layer
    e.layout_before = spec.layout_before
    e.layout_after = spec.layout_after
    e.owner = NULL
    if spec.owner is not None:
        owner = spec.owner
        keep.append(owner)
        e.owner = owner.ptr()
    e.wait_semaphore = <VkSemaphore><uintptr_t>(spec.wait_semaphore or 0)
    e.wait_value = spec.wait_value
    e.kernel = spec.kernel
    e.kernel_view = <VkImageView><uintptr_t>(spec.kernel_view or 0)
    return 0


cdef class _LinkBase:
    """What both link kinds share: a count of the calls inside the native link
    (destroy() waits for them, never freeing the link under one) and the
    sliced, interruptible wait built on each kind's `poll`."""
    cdef int users   # calls inside the native link right now (changed with the GIL held)

    cdef void _quiesce(self):
        """Wait until the calls already inside the native link have returned."""
        while self.users:
            with nogil:
                usleep(1000)

    def wait(self, uint64_t ticket, uint64_t dst_ready, timeout=None, bint submitted_only=False):
        """Block (no GIL, Ctrl-C honoured) until the job is complete (or submitted)
        or `timeout` s pass."""
        cdef uint64_t total = _timeout_ns(timeout)
        cdef double deadline = _time.monotonic() + (total / 1e9 if total != _FOREVER else 1e18)
        cdef double left
        while True:
            left = deadline - _time.monotonic()
            if self.poll(ticket, dst_ready, min(max(left, 0.0), _SLICE_NS / 1e9), submitted_only):
                return None
            PyErr_CheckSignals()
            if _time.monotonic() >= deadline:
                from vkmulti.errors import TimeoutError as VkmTimeout
                what = "was not submitted" if submitted_only else "did not complete"
                raise VkmTimeout(f"transfer {ticket} {what} within {total / 1e9:.3f} s")


cdef class Link(_LinkBase):
    """A native transfer link from one device to another (worker thread + ring)."""
    cdef vkm_link *link
    cdef readonly Device src
    cdef readonly Device dst
    cdef readonly QueueLock src_queue
    cdef readonly QueueLock dst_queue
    cdef list keep

    def __cinit__(self, Device src, QueueLock src_queue, Device dst, QueueLock dst_queue, int ring,
                  uint64_t slot_size, uint32_t slot_count, int export_type=0, double stall_timeout=30.0, int copy_threads=-1,
                  double spin=0.0, int ramps=-1, uint32_t parts=0):
        cdef vkm_link_config cfg
        cdef const char *call = NULL
        cdef vkm_device *sd = src.ptr()
        cdef vkm_device *dd = dst.ptr()
        cdef VkResult r
        self.link = NULL
        self.keep = []
        if slot_size == 0 or slot_count == 0:
            raise ValueError(f"slot_size and slot_count must be positive, got {slot_size}, {slot_count}")
        if not (stall_timeout > 0):
            raise ValueError(f"stall_timeout must be positive, got {stall_timeout}")
        cfg.ring = ring
        cfg.slot_size = slot_size
        cfg.slot_count = slot_count
        cfg.export_type = <VkExternalMemoryHandleTypeFlagBits>export_type
        cfg.stall_timeout_ns = <uint64_t>(stall_timeout * 1e9)
        cfg.copy_threads = copy_threads
        cfg.ramps = check_ramps(ramps)
        cfg.parts = parts
        cfg.spin_ns = <uint64_t>(spin * 1e9) if spin > 0 else 0
        self.src, self.dst, self.src_queue, self.dst_queue = src, dst, src_queue, dst_queue
        with nogil:
            r = vkm_link_create(sd, &src_queue.q, dd, &dst_queue.q, &cfg, &self.link, &call)
        check(r, call if call != NULL else <const char*>"vkm_link_create")

    cdef vkm_link* enter(self) except NULL:
        """The link for a call that releases the GIL; the caller decrements
        `users` when done, so that destroy() never frees it under the call."""
        cdef vkm_link *l = self.ptr()
        self.users += 1
        return l

    cdef vkm_link* ptr(self) except NULL:
        if self.link == NULL:
            from vkmulti.errors import DestroyedError
            raise DestroyedError("transfer link used after destroy()")
        return self.link

    @property
    def alive(self):
        return self.link != NULL

    @property
    def src_timeline(self):
        return <uintptr_t>vkm_link_src_timeline(self.ptr())

    @property
    def dst_timeline(self):
        return <uintptr_t>vkm_link_dst_timeline(self.ptr())

    @property
    def slot_size(self):
        return vkm_link_slot_size(self.ptr())

    def submit(self, src, dst, uint64_t size):
        """Queue a job; returns (ticket, src_done value, dst_ready value)."""
        cdef vkm_endpoint es, ed
        cdef uint64_t ticket = 0, sdone = 0, dready = 0
        cdef const char *call = NULL
        cdef vkm_link *l = self.enter()
        cdef VkResult r
        try:
            fill_endpoint(&es, src, self.keep)
            fill_endpoint(&ed, dst, self.keep)
            if len(self.keep) > 64:
                self.keep = list({id(q): q for q in self.keep}.values())
            with nogil:
                r = vkm_link_submit(l, &es, &ed, size, &ticket, &sdone, &dready, &call)
            check(r, call if call != NULL else <const char*>"vkm_link_submit")
        finally:
            self.users -= 1
        return ticket, sdone, dready

    def poll(self, uint64_t ticket, uint64_t dst_ready, double timeout=0.0, bint submitted_only=False):
        """True when the job is complete (or, with submitted_only, fully submitted);
        False if not within `timeout` s (one slice)."""
        cdef const char *call = NULL
        cdef uint64_t ns = _poll_ns(timeout)
        cdef vkm_link *l = self.enter()
        cdef VkResult r
        try:
            with nogil:
                if submitted_only:
                    r = vkm_link_wait_submitted(l, ticket, ns, &call)
                else:
                    r = vkm_link_poll(l, ticket, dst_ready, ns, &call)
        finally:
            self.users -= 1
        if r == VK_TIMEOUT:
            return False
        check(r, call if call != NULL else <const char*>"vkm_link_poll")
        return True


    def destroy(self):
        """Finish queued jobs, wait for the GPUs and free the ring (idempotent)."""
        cdef vkm_link *l = self.link
        if l == NULL:
            return
        self.link = NULL   # calls from now on raise DestroyedError
        self._quiesce()   # calls already inside the link return within a slice
        with nogil:
            vkm_link_destroy(l)
        self.keep = []
