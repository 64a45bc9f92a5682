# Bindings of the CUDA_PEER link (vkm_cuda.h); included into _native.pyx after transfer.pxi.
from libc.stdint cimport uint8_t

cdef extern from "vkm_cuda.h" nogil:
    ctypedef struct vkm_cuda_link:
        pass

    ctypedef struct vkm_cuda_link_config:
        VkDeviceSize slot_size
        uint32_t slot_count
        uint64_t stall_timeout_ns
        uint64_t spin_ns
        int no_landing
        int cuda_ordinals[2]
        int ramps
        uint32_t src_batch

    enum:
        VKM_ERROR_CUDA
        VKM_ERROR_CUDA_UNSUPPORTED

    int vkm_cuda_available(char *reason, size_t reason_len)
    int vkm_cuda_device_count()
    int vkm_cuda_device_info(int ordinal, uint8_t *uuid, char *name, size_t name_len)
    int vkm_cuda_device_attributes(int ordinal, int *cc_major, int *cc_minor, int *sm_count)
    int vkm_cuda_peer_check(const uint8_t *uuid_a, const char *name_a, const uint8_t *uuid_b, const char *name_b,
                            char *reason, size_t reason_len)

    VkResult vkm_cuda_link_create(vkm_device *src, vkm_queue *src_queue, vkm_device *dst, vkm_queue *dst_queue,
                                  const vkm_cuda_link_config *config, vkm_cuda_link **out, const char **call,
                                  char *msg, size_t msg_len)
    void vkm_cuda_link_destroy(vkm_cuda_link *link)
    VkSemaphore vkm_cuda_link_src_timeline(const vkm_cuda_link *link)
    VkSemaphore vkm_cuda_link_dst_timeline(const vkm_cuda_link *link)
    VkDeviceSize vkm_cuda_link_slot_size(const vkm_cuda_link *link)
    const char *vkm_cuda_link_ring_note(const vkm_cuda_link *link)
    uint64_t vkm_cuda_link_kernel_bytes(const vkm_cuda_link *link)
    const char *vkm_cuda_link_message(const vkm_cuda_link *link)
    VkResult vkm_cuda_link_submit(vkm_cuda_link *link, const vkm_endpoint *src, const vkm_endpoint *dst,
                                  VkDeviceSize size, uint64_t *ticket, uint64_t *src_done, uint64_t *dst_ready,
                                  const char **call)
    VkResult vkm_cuda_link_poll(vkm_cuda_link *link, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns,
                                const char **call)
    VkResult vkm_cuda_link_wait_submitted(vkm_cuda_link *link, uint64_t ticket, uint64_t dst_ready,
                                          uint64_t timeout_ns, const char **call)


cdef str _text(const char *s):
    return (<bytes>s).decode("utf-8", "replace") if s != NULL else ""


cdef int cuda_check(VkResult r, const char *call, const char *msg) except -1:
    """Like `check`, plus the CUDA link's own failures (their text is in `msg`)."""
    if r == VK_SUCCESS:
        return 0
    if r == VKM_ERROR_CUDA_UNSUPPORTED:
        from vkmulti.errors import UnsupportedError
        raise UnsupportedError(f"CUDA_PEER is not possible here: {_text(msg)}")
    if r == VKM_ERROR_CUDA:
        from vkmulti.errors import TransferError
        raise TransferError(f"CUDA_PEER transfer failed: {_text(msg) or _text(call)}")
    return check(r, call if call != NULL else <const char*>"CUDA_PEER link")


def cuda_status():
    """None when the CUDA driver (libcuda.so.1) loads and initialises, else why not.

    The first call opens the driver and runs cuInit; later calls are free.
    """
    cdef char reason[512]
    cdef int ok
    reason[0] = 0
    with nogil:
        ok = vkm_cuda_available(reason, sizeof(reason))
    return None if ok else _text(reason)


def cuda_devices():
    """The CUDA devices as (ordinal, uuid text, name); empty without CUDA."""
    cdef uint8_t uuid[16]
    cdef char name[256]
    cdef int i, n
    with nogil:
        n = vkm_cuda_device_count()
    out = []
    for i in range(n):
        name[0] = 0
        if vkm_cuda_device_info(i, uuid, name, sizeof(name)):
            h = (<char *>uuid)[:16].hex()
            out.append((i, f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}", _text(name)))
    return out


def cuda_device_attributes(int ordinal):
    """(compute capability major, minor, multiprocessor count) of CUDA device
    `ordinal`, zeros where the driver does not say; None for an unknown ordinal."""
    cdef int major = 0, minor = 0, sms = 0
    cdef int ok
    with nogil:
        ok = vkm_cuda_device_attributes(ordinal, &major, &minor, &sms)
    return (major, minor, sms) if ok else None


def cuda_peer_reason(bytes uuid_a not None, bytes uuid_b not None, str name_a="", str name_b=""):
    """None when CUDA_PEER can run between two Vulkan devices (their 16-byte
    deviceUUIDs), else the reason: no CUDA, not CUDA devices, no peer access."""
    if len(uuid_a) != 16 or len(uuid_b) != 16:
        raise ValueError(f"device UUIDs are 16 bytes, got {len(uuid_a)} and {len(uuid_b)}")
    cdef char reason[512]
    cdef bytes na = name_a.encode(), nb = name_b.encode()
    cdef const uint8_t *pa = <const uint8_t *><const char *>uuid_a
    cdef const uint8_t *pb = <const uint8_t *><const char *>uuid_b
    cdef const char *ca = <const char *>na if name_a else NULL
    cdef const char *cb = <const char *>nb if name_b else NULL
    cdef int ok
    reason[0] = 0
    with nogil:
        ok = vkm_cuda_peer_check(pa, ca, pb, cb, reason, sizeof(reason))
    return None if ok else _text(reason)


cdef class CudaPeerLink(_LinkBase):
    """A CUDA_PEER transfer link: rings shared by Vulkan and CUDA, NVLink peer copies.

    The same interface as `Link` (submit, poll, wait, destroy, alive,
    src_timeline, dst_timeline, slot_size). `src_queue`/`dst_queue` should be
    of the universal family: the device-local copies run there. Images must be
    shared with, or owned by, that family (no ownership transfer is made).

    `spin` (seconds) polls that long before blocking (lower latency on GPUs;
    leave 0 on CPU devices). The link's worker thread orders CUDA and Vulkan:
    it polls each step's completion and queues the next. The destination ring
    is CUDA memory imported into Vulkan where the drivers allow, so one NVLink
    copy per chunk is all CUDA does; else a CUDA bounce ring and a local copy
    (`landing`, `ring_note`); `landing=False` asks for the latter.
    `cuda_ordinals=(i, j)`
    names the CUDA devices instead of matching deviceUUIDs (diagnostics, and
    tests with a stand-in driver).
    """
    cdef vkm_cuda_link *link
    cdef readonly Device src
    cdef readonly Device dst
    cdef readonly QueueLock src_queue
    cdef readonly QueueLock dst_queue
    cdef list keep

    def __cinit__(self, Device src not None, QueueLock src_queue not None, Device dst not None,
                  QueueLock dst_queue not None, uint64_t slot_size, uint32_t slot_count,
                  double stall_timeout=30.0, double spin=0.0, bint landing=True, cuda_ordinals=None,
                  int ramps=-1, uint32_t src_batch=0):
        cdef vkm_cuda_link_config cfg
        cdef const char *call = NULL
        cdef char msg[512]
        cdef vkm_device *sd = src.ptr()
        cdef vkm_device *dd = dst.ptr()
        cdef VkResult r
        self.link = NULL
        self.keep = []
        if slot_size == 0 or slot_count == 0:
            raise ValueError(f"slot_size and slot_count must be positive, got {slot_size}, {slot_count}")
        if slot_count > 4096 or slot_size > (1 << 40):
            raise ValueError(f"ring of {slot_count} slots of {slot_size} B is out of range")
        if not (stall_timeout > 0):
            raise ValueError(f"stall_timeout must be positive, got {stall_timeout}")
        cfg.slot_size = slot_size
        cfg.slot_count = slot_count
        cfg.stall_timeout_ns = <uint64_t>(stall_timeout * 1e9)
        cfg.spin_ns = <uint64_t>(spin * 1e9) if spin > 0 else 0
        cfg.no_landing = not landing
        cfg.ramps = check_ramps(ramps)
        cfg.src_batch = src_batch
        cfg.cuda_ordinals[0] = cfg.cuda_ordinals[1] = -1
        if cuda_ordinals is not None:
            i, j = cuda_ordinals
            if not (isinstance(i, int) and isinstance(j, int)) or i < 0 or j < 0:
                raise ValueError(f"cuda_ordinals must be two non-negative ints, got {cuda_ordinals!r}")
            cfg.cuda_ordinals[0], cfg.cuda_ordinals[1] = i, j
        msg[0] = 0
        self.src, self.dst, self.src_queue, self.dst_queue = src, dst, src_queue, dst_queue
        with nogil:
            r = vkm_cuda_link_create(sd, &src_queue.q, dd, &dst_queue.q, &cfg, &self.link, &call, msg, sizeof(msg))
        cuda_check(r, call if call != NULL else <const char*>"vkm_cuda_link_create", msg)

    cdef vkm_cuda_link* enter(self) except NULL:
        """The link for a call that releases the GIL; the caller decrements
        `users` when done, so that destroy() never frees it under the call."""
        cdef vkm_cuda_link *l = self.ptr()
        self.users += 1
        return l

    cdef vkm_cuda_link* ptr(self) except NULL:
        if self.link == NULL:
            from vkmulti.errors import DestroyedError
            raise DestroyedError("CUDA_PEER link used after destroy()")
        return self.link

    @property
    def alive(self):
        return self.link != NULL

    @property
    def src_timeline(self):
        return <uintptr_t>vkm_cuda_link_src_timeline(self.ptr())

    @property
    def dst_timeline(self):
        return <uintptr_t>vkm_cuda_link_dst_timeline(self.ptr())

    @property
    def slot_size(self):
        return vkm_cuda_link_slot_size(self.ptr())

    @property
    def landing(self):
        """True when NVLink copies land in the destination ring itself (CUDA memory imported into Vulkan)."""
        return self.ring_note.startswith("landing")

    @property
    def kernel_bytes(self):
        """Bytes moved by compute kernels so far (the rest went by copy commands)."""
        return vkm_cuda_link_kernel_bytes(self.ptr())

    @property
    def ring_note(self):
        """How the destination ring is made, and why."""
        return _text(vkm_cuda_link_ring_note(self.ptr()))

    def submit(self, src, dst, uint64_t size):
        """Queue a job; returns (ticket, src_done value, dst_ready value)."""
        cdef vkm_endpoint es, ed
        cdef uint64_t ticket = 0, sdone = 0, dready = 0
        cdef const char *call = NULL
        cdef vkm_cuda_link *l
        cdef VkResult r
        for label, spec, q in (("source", src, self.src_queue), ("destination", dst, self.dst_queue)):
            owner = spec.owner
            if owner is not None and owner.family != q.family:
                raise ValueError(f"the {label} is owned by queue family {owner.family}, but this CUDA_PEER link "
                                 f"copies on family {q.family}; pass a queue of the owner's (universal) family")
        l = self.enter()
        try:
            fill_endpoint(&es, src, self.keep)
            fill_endpoint(&ed, dst, self.keep)
            if len(self.keep) > 64:
                self.keep = list({id(q): q for q in self.keep}.values())
            with nogil:
                r = vkm_cuda_link_submit(l, &es, &ed, size, &ticket, &sdone, &dready, &call)
            cuda_check(r, call if call != NULL else <const char*>"vkm_cuda_link_submit", vkm_cuda_link_message(l))
        finally:
            self.users -= 1
        return ticket, sdone, dready

    def poll(self, uint64_t ticket, uint64_t dst_ready, double timeout=0.0, bint submitted_only=False):
        """True when the job is complete (or, with submitted_only, fully submitted);
        False if not within `timeout` s (one slice)."""
        cdef const char *call = NULL
        cdef uint64_t ns = _poll_ns(timeout)
        cdef vkm_cuda_link *l = self.enter()
        cdef VkResult r
        try:
            with nogil:
                if submitted_only:
                    r = vkm_cuda_link_wait_submitted(l, ticket, dst_ready, ns, &call)
                else:
                    r = vkm_cuda_link_poll(l, ticket, dst_ready, ns, &call)
            if r == VK_TIMEOUT:
                return False
            cuda_check(r, call if call != NULL else <const char*>"vkm_cuda_link_poll", vkm_cuda_link_message(l))
        finally:
            self.users -= 1
        return True


    def destroy(self):
        """Finish queued jobs, wait (bounded) for both GPUs and CUDA, free CUDA's
        imports, then the Vulkan rings (idempotent)."""
        cdef vkm_cuda_link *l = self.link
        if l == NULL:
            return
        self.link = NULL   # calls from now on raise DestroyedError
        self._quiesce()   # calls already inside the link return within a slice
        with nogil:
            vkm_cuda_link_destroy(l)
        self.keep = []
