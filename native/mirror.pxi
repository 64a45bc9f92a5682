# mirror.pxi - included by _native.pyx: TimelineMirror over vkm_mirror.h.

cdef extern from "vkm_mirror.h" nogil:
    ctypedef struct vkm_mirror:
        pass
    VkResult vkm_mirror_create(vkm_device *src, VkSemaphore src_sem, vkm_device *dst, uint64_t spin_ns,
                               vkm_mirror **out, vkm_error *err)
    VkSemaphore vkm_mirror_semaphore(const vkm_mirror *m)
    VkResult vkm_mirror_status(vkm_mirror *m, vkm_error *err)
    void vkm_mirror_release(vkm_mirror *m, const char *why)
    void vkm_mirror_destroy(vkm_mirror *m)


@cython.no_gc_clear
cdef class TimelineMirror:
    """A timeline semaphore of device `src` mirrored on a new timeline semaphore of
    device `dst` (`semaphore`): a native thread waits (no GIL) for each new value
    of the source and signals it from the host there, so `dst`'s GPU work can
    wait on the GPU for `src`'s; such a wait may be queued before the value
    exists, on any queue. `spin` (s): poll the source that long before blocking
    (0 on CPU devices). The source semaphore must outlive the mirror; destroy()
    it (idempotent) once no GPU work waits on `semaphore`. release() and check() may
    race destroy() from other threads: destroy() frees the native mirror only once
    the calls already inside it have returned."""
    cdef vkm_mirror *m
    cdef int users   # calls inside the native mirror without the GIL (changed with the GIL held)
    cdef readonly Device src
    cdef readonly Device dst

    def __cinit__(self, Device src not None, src_semaphore, Device dst not None, *, double spin=0.0):
        cdef vkm_error err
        cdef uint64_t sem = _u64(src_semaphore, "src_semaphore", 1)
        cdef uint64_t spin_ns = _seconds_ns(spin, "spin", 1.0) if spin != 0 else 0
        cdef vkm_device *sd = src.ptr()
        cdef vkm_device *dd = dst.ptr()
        cdef VkResult r
        self.m = NULL
        if src is dst:
            raise ValueError("a mirror joins two devices, got the same one twice")
        src.own(sem, "src_semaphore")
        self.src, self.dst = src, dst
        vkm_error_clear(&err)
        with nogil:
            r = vkm_mirror_create(sd, <VkSemaphore><uintptr_t>sem, dd, spin_ns, &self.m, &err)
        check_error(r, &err)
        dst.timelines.add(<uintptr_t>vkm_mirror_semaphore(self.m))

    @property
    def semaphore(self):
        """The destination timeline semaphore (a VkSemaphore handle as an int)."""
        if self.m == NULL:
            from vkmulti.errors import DestroyedError
            raise DestroyedError("TimelineMirror used after destroy()")
        return <uintptr_t>vkm_mirror_semaphore(self.m)

    @property
    def alive(self):
        return self.m != NULL

    def check(self):
        """Raise the failure that stopped the mirror (a lost device), if any."""
        cdef vkm_error err
        cdef vkm_mirror *m = self.m
        cdef VkResult r
        if m == NULL:
            return
        vkm_error_clear(&err)
        self.users += 1   # (with the read of self.m, under the GIL: destroy() waits for it)
        try:
            with nogil:   # (the mirror's lock may be held by its thread's signal)
                r = vkm_mirror_status(m, &err)
        finally:
            self.users -= 1
        check_error(r, &err)

    def release(self, why="its source is lost"):
        """Let the GPU work waiting on the mirror go now (the destination is raised as far
        as it goes) and stop following the source; check() then raises DeviceLostError
        with `why`. A source marked lost is still followed through the driver until then
        (or until the driver itself reports the loss). Idempotent."""
        cdef bytes text = str(why).encode("utf-8", "replace")[:200]
        cdef const char *c_why = text
        cdef vkm_mirror *m = self.m
        if m == NULL:
            return
        self.users += 1   # (with the read of self.m, under the GIL: destroy() waits for it)
        try:
            with nogil:
                vkm_mirror_release(m, c_why)
        finally:
            self.users -= 1

    def destroy(self):
        """Stop the thread (within 20 ms) and free the semaphore (idempotent); a
        release() or check() already inside the mirror on another thread ends first."""
        cdef vkm_mirror *m = self.m
        if m == NULL:
            return
        self.m = NULL   # calls from now on find it destroyed
        self.dst.timelines.discard(<uintptr_t>vkm_mirror_semaphore(m))
        while self.users:   # (each holds the mirror's lock for one signal at most)
            with nogil:
                usleep(1000)
        with nogil:
            vkm_mirror_destroy(m)

    def __dealloc__(self):
        if self.m != NULL and self.src.alive and self.dst.alive:   # (never destroyed: its devices still live)
            self.dst.timelines.discard(<uintptr_t>vkm_mirror_semaphore(self.m))
            vkm_mirror_destroy(self.m)
        self.m = NULL
