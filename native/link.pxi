# Bindings of the transfer engine: one Link class over vkm_link.h, whatever
# the ring; included into _native.pyx after cuda.pxi.

cdef extern from "vkm_link.h" nogil:
    ctypedef void* VkBuffer
    ctypedef void* VkImage
    ctypedef void* VkImageView
    ctypedef int VkImageLayout
    ctypedef int VkExternalMemoryHandleTypeFlagBits

    enum:
        VKM_RING_STAGING
        VKM_RING_SHARED_HOST
        VKM_RING_EXPORTED
        VKM_RING_CUDA_PEER
        VKM_RING_KINDS
        VKM_MAX_SLOTS
        VKM_MAX_CHUNKS

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
        uint64_t stall_timeout_ns
        uint64_t spin_ns
        const char *trace_path
        VkExternalMemoryHandleTypeFlagBits export_type
        int cuda_ordinals[2]
        int cuda_bounce_ring
        int host_gates

    VkResult vkm_link_create(vkm_device *src, vkm_queue *src_queue, vkm_device *dst, vkm_queue *dst_queue,
                             const vkm_link_config *config, vkm_link **out, vkm_error *err)
    void vkm_link_destroy(vkm_link *link)
    void vkm_link_last_values(vkm_link *link, uint64_t *src_done, uint64_t *dst_ready)
    VkSemaphore vkm_link_src_timeline(const vkm_link *link)
    VkSemaphore vkm_link_dst_timeline(const vkm_link *link)
    VkDeviceSize vkm_link_slot_size(const vkm_link *link)
    const char *vkm_link_ring_note(const vkm_link *link)
    uint64_t vkm_link_kernel_bytes(const vkm_link *link)
    VkResult vkm_link_submit(vkm_link *link, const vkm_endpoint *src, const vkm_endpoint *dst, VkDeviceSize size,
                             uint64_t *ticket, uint64_t *src_done, uint64_t *dst_ready, vkm_error *err)
    VkResult vkm_link_poll(vkm_link *link, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns, vkm_error *err)
    VkResult vkm_link_wait_submitted(vkm_link *link, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns,
                                     vkm_error *err)
    VkResult vkm_plan_chunks(VkDeviceSize size, VkDeviceSize chunk, VkDeviceSize unit, VkDeviceSize **out,
                             uint32_t *count, vkm_error *err)
    uint64_t vkm_now_ns()

cdef extern from "vkm_jobq.h" nogil:
    int vkm_exit_park(uint64_t timeout_ns)

cdef extern from "vkm_link.h" nogil:
    int vkm_links_release_gates()

cdef extern from "vkm_mirror.h" nogil:
    int vkm_mirrors_release_all()


def park_native_threads(double timeout=1.0):
    """Stop every native worker and mirror thread at its next check point, outside the
    driver, for good (the process is exiting: library destructors must not run
    under a thread inside the driver). Links and mirrors destroyed afterwards are
    left to the exit. Then GPU work queued behind a wait the parked threads would
    have let go is let run out: a running link job's wait point that has not come
    (the caller's semaphore, raised to the value the job waits for) and every
    mirror's destination; a driver that tears its devices down at exit (NVIDIA's)
    waits for that work. True when none was still inside the driver after
    `timeout` s. Registered with atexit when the module loads."""
    cdef uint64_t ns = _seconds_ns(timeout, "timeout", 60.0)
    cdef int done
    with nogil:
        done = vkm_exit_park(ns)
        vkm_links_release_gates()
        vkm_mirrors_release_all()
    return bool(done)


_atexit.register(park_native_threads)


RING_STAGING = VKM_RING_STAGING
RING_SHARED_HOST = VKM_RING_SHARED_HOST
RING_EXPORTED = VKM_RING_EXPORTED
RING_CUDA_PEER = VKM_RING_CUDA_PEER
#: The deepest ring a link accepts, and the most chunks one job is cut into.
MAX_SLOTS = VKM_MAX_SLOTS
MAX_CHUNKS = VKM_MAX_CHUNKS
#: The environment variable that makes links trace their work into a file (bench/trace_report.py).
TRACE_ENV = "VKMULTI_TRACE"
#: Link(host_gates=...): the sides whose queue other work shares; a job's wait point there is
#: waited for on the link's worker before its copies are submitted, never on the GPU
GATE_SRC, GATE_DST = 1, 2

cdef uint64_t _U64_MAX = 0xFFFFFFFFFFFFFFFFULL


cdef uint64_t _u64(object value, str label, uint64_t low=0, uint64_t high=_U64_MAX) except? 0:
    """`value` as a uint64 in [low, high], or a TypeError / ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{label} must be an int, got {type(value).__name__}")
    if value < low or value > high:
        raise ValueError(f"{label} must be in [{low}, {high}], got {value}")
    return <uint64_t>value


cdef uint64_t _seconds_ns(double seconds, str label, double most) except? 0:
    """Positive seconds (at most `most`) in ns, or a ValueError naming them."""
    if not (seconds > 0) or seconds > most:
        raise ValueError(f"{label} must be a positive number of seconds up to {most:g}, got {seconds!r}")
    return <uint64_t>(seconds * 1e9)


def plan_chunks(size, chunk, unit):
    """The chunk boundaries a link cuts a job of `size` bytes into (0 ... size):
    even chunks of at most `chunk` bytes (a positive multiple of `unit`), every
    inner boundary a multiple of `unit`."""
    cdef uint64_t s = _u64(size, "size"), c = _u64(chunk, "chunk"), u = _u64(unit, "unit")
    cdef uint32_t count = 0
    cdef VkDeviceSize *b = NULL
    cdef vkm_error err
    cdef VkResult r
    vkm_error_clear(&err)
    with nogil:
        r = vkm_plan_chunks(s, c, u, &b, &count, &err)
    check_error(r, &err)
    try:
        return [b[i] for i in range(count + 1)]
    finally:
        free(b)


class _LinkTuning:
    """Private: knobs of a link for tests and diagnostics, not for use.

    `cuda_bounce_ring`: a CUDA_PEER link uses its bounce ring even where a
    landing ring would work (the fallback path, on GPUs that have both).
    `cuda_ordinals`: (source, destination) CUDA devices instead of matching
    Vulkan deviceUUIDs (tests with a stand-in CUDA driver).
    """
    __slots__ = ("cuda_bounce_ring", "cuda_ordinals")

    def __init__(self, *, cuda_bounce_ring=False, cuda_ordinals=None):
        if not isinstance(cuda_bounce_ring, bool):
            raise TypeError(f"cuda_bounce_ring must be a bool, got {_shown(cuda_bounce_ring)}")
        if cuda_ordinals is not None:
            if not (isinstance(cuda_ordinals, tuple) and len(cuda_ordinals) == 2 and
                    all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 16
                        for i in cuda_ordinals)):
                raise ValueError(f"cuda_ordinals must be two CUDA device ordinals, got {_shown(cuda_ordinals)}")
        self.cuda_bounce_ring = cuda_bounce_ring
        self.cuda_ordinals = cuda_ordinals


cdef class Endpoint:
    """One side of a job, converted once into the struct the native layer reads
    (transfers keep theirs and submit them again): a buffer range (`buffer`,
    `offset`) or a whole 2D colour image (`image`, `width`, `height`,
    `bytes_per_pixel`, the layouts it is in before and is left in after);
    `owner`: the QueueLock of the queue that owns it when that is not the
    link's copy family; `wait_semaphore`/`wait_value`: a timeline point to wait
    for first; `kernel`/`kernel_view`: what compute-kernel copies may use
    (vkm_link.h). Handles are ints; None or 0 for none. Read-only."""
    cdef vkm_endpoint e
    cdef readonly object owner

    def __cinit__(self, buffer=None, offset=0, image=None, width=0, height=0, bytes_per_pixel=0,
                  layout_before=0, layout_after=0, owner=None, wait_semaphore=None, wait_value=0, kernel=0,
                  kernel_view=None):
        cdef QueueLock q
        self.e.buffer = <VkBuffer><uintptr_t>(buffer or 0)
        self.e.offset = offset
        self.e.image = <VkImage><uintptr_t>(image or 0)
        self.e.width = width
        self.e.height = height
        self.e.bytes_per_pixel = bytes_per_pixel
        self.e.mip_level = 0
        self.e.array_layer = 0
        self.e.layout_before = layout_before
        self.e.layout_after = layout_after
        self.e.owner = NULL
        if owner is not None:
            q = owner
            self.e.owner = &q.q
        self.owner = owner
        self.e.wait_semaphore = <VkSemaphore><uintptr_t>(wait_semaphore or 0)
        self.e.wait_value = wait_value
        self.e.kernel = kernel
        self.e.kernel_view = <VkImageView><uintptr_t>(kernel_view or 0)

    @property
    def buffer(self):
        return <uintptr_t>self.e.buffer or None

    @property
    def offset(self):
        return self.e.offset

    @property
    def image(self):
        return <uintptr_t>self.e.image or None

    @property
    def width(self):
        return self.e.width

    @property
    def height(self):
        return self.e.height

    @property
    def bytes_per_pixel(self):
        return self.e.bytes_per_pixel

    @property
    def layout_before(self):
        return self.e.layout_before

    @property
    def layout_after(self):
        return self.e.layout_after

    @property
    def wait_semaphore(self):
        return <uintptr_t>self.e.wait_semaphore or None

    @property
    def wait_value(self):
        return self.e.wait_value

    @property
    def kernel(self):
        return self.e.kernel

    @property
    def kernel_view(self):
        return <uintptr_t>self.e.kernel_view or None


cdef int take_endpoint(vkm_endpoint *e, object spec, list keep) except -1:
    """`e` from an Endpoint (a copy of its struct) or another object with its fields."""
    cdef Endpoint ep
    if type(spec) is Endpoint:
        ep = <Endpoint>spec
        e[0] = ep.e
        if ep.owner is not None:
            keep.append(ep.owner)   # the queue's lock outlives the job
        return 0
    return fill_endpoint(e, spec, keep)


cdef int fill_endpoint(vkm_endpoint *e, object spec, list keep) except -1:
    """Fill `e` from an object with Endpoint's fields."""
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
        e.owner = &owner.q
    e.wait_semaphore = <VkSemaphore><uintptr_t>(spec.wait_semaphore or 0)
    e.wait_value = spec.wait_value
    e.kernel = spec.kernel
    e.kernel_view = <VkImageView><uintptr_t>(spec.kernel_view or 0)
    return 0


@cython.no_gc_clear
cdef class Link:
    """A native transfer link from one device to another: a worker thread and a
    ring of slots of one kind (RING_STAGING, RING_SHARED_HOST, RING_EXPORTED or
    RING_CUDA_PEER).

    `export_type` (RING_EXPORTED): the handle type memory is exported as (0: an
    opaque fd). `stall_timeout` (s): a wait of the worker in which the link's
    own work makes no progress for this long, after the job's wait points were
    reached, fails the link (a source still busy before its wait point is
    waited for; the caller's wait has the timeout). `spin` (s): polls that long before blocking (lower
    latency on GPUs; leave 0 on CPU devices). `trace`: a file the link appends
    a timeline of its work to (bench/trace_report.py reads it). `host_gates` (GATE_SRC | GATE_DST):
    the sides whose queue other work shares (the links of the other direction, the caller's own
    submits); a job's wait point there is waited for on the worker, and its copies submitted
    once it is reached, so that no submit there waits on the GPU for work that may itself wait
    for a copy queued behind it (an in-order queue). RING_CUDA_PEER
    wants queues of the universal family (its device-local copies run there)
    and endpoints shared with, or owned by, that family.

    The worker thread reads the devices, queues and endpoints the link holds:
    a link never destroyed keeps them (the collector does not clear them) and,
    when it goes, stops and joins its worker if the GPUs are done with its jobs,
    or else leaves the worker and everything it reads alive until the process
    ends (never freed under a running thread).
    """
    cdef vkm_link *link
    cdef int users   # calls inside the native link right now (changed with the GIL held)
    cdef readonly Device src
    cdef readonly Device dst
    cdef readonly QueueLock src_queue
    cdef readonly QueueLock dst_queue
    cdef readonly int ring
    cdef readonly uint32_t slot_count
    cdef readonly int host_gates
    cdef list keep

    def __cinit__(self, Device src not None, QueueLock src_queue not None, Device dst not None,
                  QueueLock dst_queue not None, int ring, slot_size, slot_count, int export_type=0, *,
                  double stall_timeout=30.0, double spin=0.0, str trace=None, tuning=None, int host_gates=0):
        cdef vkm_link_config cfg
        cdef vkm_error err
        cdef char reason[8]
        cdef vkm_device *sd = src.ptr()
        cdef vkm_device *dd = dst.ptr()
        cdef bytes trace_path = None
        cdef VkResult r
        self.link = NULL
        self.keep = []
        if not 0 <= ring < VKM_RING_KINDS:
            raise ValueError(f"ring must be one of RING_STAGING, RING_SHARED_HOST, RING_EXPORTED, RING_CUDA_PEER "
                             f"(0 ... {VKM_RING_KINDS - 1}), got {ring}")
        cfg.ring = ring
        cfg.slot_size = _u64(slot_size, "slot_size", 1)
        cfg.slot_count = <uint32_t>_u64(slot_count, "slot_count", 1, VKM_MAX_SLOTS)
        cfg.stall_timeout_ns = _seconds_ns(stall_timeout, "stall_timeout", 1e9)
        cfg.spin_ns = _seconds_ns(spin, "spin", 1.0) if spin != 0 else 0
        cfg.export_type = <VkExternalMemoryHandleTypeFlagBits>export_type
        cfg.trace_path = NULL
        if trace is not None and trace:
            trace_path = _os.fsencode(trace)
            if len(trace_path) >= 512 or b"\0" in trace_path:
                raise ValueError(f"trace must be a path of under 512 bytes without NUL, got {_shown(trace)}")
            cfg.trace_path = trace_path
        cfg.cuda_ordinals[0] = cfg.cuda_ordinals[1] = -1
        cfg.cuda_bounce_ring = 0
        if host_gates & ~(GATE_SRC | GATE_DST):
            raise ValueError(f"host_gates must combine GATE_SRC ({GATE_SRC}) and GATE_DST ({GATE_DST}), "
                             f"got {host_gates}")
        cfg.host_gates = host_gates
        if tuning is not None:
            if not isinstance(tuning, _LinkTuning):
                raise TypeError(f"tuning must be a _LinkTuning, got {type(tuning).__name__}")
            cfg.cuda_bounce_ring = tuning.cuda_bounce_ring
            if tuning.cuda_ordinals is not None:
                cfg.cuda_ordinals[0], cfg.cuda_ordinals[1] = tuning.cuda_ordinals
        if ring == VKM_RING_CUDA_PEER:
            _cuda_load(reason, sizeof(reason))   # the link says why when CUDA is not usable
        self.src, self.dst, self.src_queue, self.dst_queue = src, dst, src_queue, dst_queue
        self.ring, self.slot_count, self.host_gates = ring, cfg.slot_count, host_gates
        vkm_error_clear(&err)
        with nogil:
            r = vkm_link_create(sd, &src_queue.q, dd, &dst_queue.q, &cfg, &self.link, &err)
        check_error(r, &err)
        src.timelines.add(<uintptr_t>vkm_link_src_timeline(self.link))   # (points of its jobs are waited on)
        dst.timelines.add(<uintptr_t>vkm_link_dst_timeline(self.link))

    cdef void forget_timelines(self, vkm_link *l):
        """Its timelines are no longer live ones of their devices (the link is going)."""
        self.src.timelines.discard(<uintptr_t>vkm_link_src_timeline(l))
        self.dst.timelines.discard(<uintptr_t>vkm_link_dst_timeline(l))

    cdef vkm_link* enter(self) except NULL:
        """The link for a call that releases the GIL; the caller decrements
        `users` when done, so that destroy() never frees it under the call."""
        cdef vkm_link *l = self.ptr()
        self.users += 1
        return l

    cdef vkm_link* ptr(self) except NULL:
        if self.link == NULL or not (self.src.alive and self.dst.alive):
            from vkmulti.errors import DestroyedError
            raise DestroyedError("transfer link used after destroy()" if self.link == NULL else
                                 "transfer link used after its device was released")
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
        """Bytes per slot, rounded up to the ring's alignment."""
        return vkm_link_slot_size(self.ptr())

    @property
    def ring_note(self):
        """How the ring is made (and, where a fallback was taken, why)."""
        return _text(vkm_link_ring_note(self.ptr()))

    @property
    def last_values(self):
        """(src_done, dst_ready) of the latest job queued: once the GPUs reach both,
        they are done with every job of this link."""
        cdef uint64_t s = 0, d = 0
        vkm_link_last_values(self.ptr(), &s, &d)
        return s, d

    @property
    def kernel_bytes(self):
        """Bytes moved by compute kernels so far (the rest went by copy commands)."""
        return vkm_link_kernel_bytes(self.ptr())

    def submit(self, src not None, dst not None, size):
        """Queue a job; returns (ticket, src_done value, dst_ready value)."""
        cdef vkm_endpoint es, ed
        cdef uint64_t ticket = 0, sdone = 0, dready = 0, n = _u64(size, "size", 1)
        cdef vkm_error err
        cdef vkm_link *l = self.enter()
        cdef VkResult r
        try:
            take_endpoint(&es, src, self.keep)
            take_endpoint(&ed, dst, self.keep)
            if len(self.keep) > 64:
                self.keep = list({id(q): q for q in self.keep}.values())
            vkm_error_clear(&err)
            with nogil:
                r = vkm_link_submit(l, &es, &ed, n, &ticket, &sdone, &dready, &err)
            check_error(r, &err)
        finally:
            self.users -= 1
        return ticket, sdone, dready

    cdef int _poll(self, uint64_t ticket, uint64_t dst_ready, uint64_t ns, bint submitted_only) except -1:
        """1 when the job is complete (or submitted), 0 if not within `ns`; its error raised."""
        cdef vkm_error err
        cdef vkm_link *l = self.enter()
        cdef VkResult r
        try:
            vkm_error_clear(&err)
            with nogil:
                if submitted_only:
                    r = vkm_link_wait_submitted(l, ticket, dst_ready, ns, &err)
                else:
                    r = vkm_link_poll(l, ticket, dst_ready, ns, &err)
            if r == VK_TIMEOUT:
                return 0
            check_error(r, &err)
        finally:
            self.users -= 1
        return 1

    def poll(self, uint64_t ticket, uint64_t dst_ready, double timeout=0.0, bint submitted_only=False):
        """True when the job is complete (or, with submitted_only, fully submitted);
        False if not within `timeout` s (one slice)."""
        return self._poll(ticket, dst_ready, _poll_ns(timeout), submitted_only) == 1

    def wait(self, uint64_t ticket, uint64_t dst_ready, timeout=None, bint submitted_only=False):
        """Block (no GIL, Ctrl-C honoured) until the job is complete (or submitted)
        or `timeout` s pass."""
        cdef uint64_t total = _timeout_ns(timeout)
        cdef uint64_t start = vkm_now_ns(), spent, left
        while True:   # slices of at most _SLICE_NS, signals checked between them
            spent = vkm_now_ns() - start
            left = total - spent if spent < total else 0
            if self._poll(ticket, dst_ready, left if left < _SLICE_NS else _SLICE_NS, submitted_only):
                return None
            PyErr_CheckSignals()
            if vkm_now_ns() - start >= total:
                from vkmulti.errors import TimeoutError as VkmTimeout
                what = "was not submitted" if submitted_only else "did not complete"
                raise VkmTimeout(f"transfer {ticket} {what} within {total / 1e9:.3f} s")

    def destroy(self):
        """Finish queued jobs, wait (bounded) for the GPUs, free the ring (idempotent)."""
        cdef vkm_link *l = self.link
        if l == NULL:
            return
        self.link = NULL   # calls from now on raise DestroyedError
        self.forget_timelines(l)
        while self.users:  # calls already inside the link return within a slice
            with nogil:
                usleep(1000)
        with nogil:
            vkm_link_destroy(l)
        self.keep = []

    def __dealloc__(self):
        cdef vkm_link *l = self.link
        cdef uint64_t s = 0, d = 0, sv = 0, dv = 0
        cdef bint idle = False
        self.link = NULL
        if l == NULL:
            return
        if self.src.alive and self.dst.alive:
            vkm_link_last_values(l, &s, &d)
            idle = (vkm_timeline_value(&self.src.dev, vkm_link_src_timeline(l), &sv) == VK_SUCCESS and sv >= s and
                    vkm_timeline_value(&self.dst.dev, vkm_link_dst_timeline(l), &dv) == VK_SUCCESS and dv >= d)
        if idle:   # nothing left for the worker: its waits return at once
            self.src.timelines.discard(<uintptr_t>vkm_link_src_timeline(l))
            self.dst.timelines.discard(<uintptr_t>vkm_link_dst_timeline(l))
            with nogil:
                vkm_link_destroy(l)
            return
        # Jobs still queued or on the GPUs (a wait semaphore that never came, a lost or
        # released device): the worker may block for its stall timeout, so it is left
        # running, and what it reads stays alive with it.
        for held in (self.src, self.dst, self.src_queue, self.dst_queue, self.keep):
            Py_INCREF(held)
