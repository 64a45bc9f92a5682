# cython: language_level=3
"""Bindings over the C core (vkm.h). Integer handles in, exceptions out.

Everything that waits or copies runs without the GIL; long waits are cut into
short slices so that Ctrl-C (PyErr_CheckSignals) is honoured.
"""
from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset
from posix.unistd cimport usleep
from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport Py_INCREF
cimport cython
import atexit as _atexit
import numbers as _numbers
import operator as _operator
import os as _os
import time as _time

cdef extern from "<errno.h>":
    enum:
        EDEADLK
        ETIMEDOUT

cdef extern from "vkm_errors.h":
    const VkResult VKM_ERROR_QUEUE_LOCK_HELD

cdef uint64_t _SLICE_NS = 50_000_000          # 50 ms between signal checks
cdef uint64_t _FOREVER = 0xFFFFFFFFFFFFFFFFULL
cdef bint _timeline_naps = False              # set_timeline_naps
#: VkDevice handle -> the live timeline semaphores vkmulti made on it (create_timeline, links,
#: mirrors), shared by every native Device of that VkDevice (two managers over an engine's)
cdef dict _live_timelines = {}


def set_timeline_naps(bint on):
    """Whether waits for a timeline value (Device.wait_timeline) read the timeline between
    naps (vkm_nap_wait) instead of the driver's blocking wait, which on some drivers spins
    the host's CPU for as long as it waits; returns the setting it replaces."""
    global _timeline_naps
    before = _timeline_naps
    _timeline_naps = on
    return before


cdef str _text(const char *s):
    return (<bytes>s).decode("utf-8", "replace") if s != NULL else ""


cdef str _shown(object value):
    """A caller's value for an error message: vkmulti's short_repr (bounded; never raises)."""
    from vkmulti._core.checks import short_repr
    return short_repr(value)


cdef int check(VkResult result, const char *call) except -1:
    """The one place a VkResult becomes an exception (table in vkmulti.errors)."""
    if result == VK_SUCCESS:
        return 0
    from vkmulti.errors import raise_for_result
    raise_for_result(int(result), _text(call) or "?")
    return -1


cdef int check_error(VkResult result, const vkm_error *err) except -1:
    """`check` for a failure the core described: where (the call or step) and,
    separately, what happened."""
    if result == VK_SUCCESS:
        return 0
    from vkmulti.errors import raise_for_result
    raise_for_result(int(result), _text(err.where) or "?", _text(err.message) or None)
    return -1


def native_results():
    """vkmulti's own result codes as the core defines them (vkm_errors.h):
    {name: (value, meaning)}; vkmulti.errors maps each to a typed error."""
    cdef size_t n = 0, i
    cdef const vkm_result_info *t = vkm_result_table(&n)
    return {_text(t[i].name): (t[i].value, _text(t[i].what)) for i in range(n)}


cdef uint64_t _poll_ns(double timeout):
    """A poll's timeout in ns: 0 for none, negative or NaN; forever past 1e9 s."""
    if timeout != timeout or timeout <= 0:
        return 0
    if timeout > 1e9:
        return _FOREVER
    return <uint64_t>(timeout * 1e9)


def result_check(int result, str call not None):
    """Python access to `check` (for results obtained elsewhere)."""
    cdef bytes c = call.encode()
    check(<VkResult>result, c)


cdef uint64_t _timeout_ns(timeout) except? 0:
    """A wait's timeout (None or seconds >= 0, a real number: not a bool or a string) in ns."""
    if timeout is None:
        return _FOREVER
    if type(timeout) is not float and (isinstance(timeout, bool) or not isinstance(timeout, _numbers.Real)):
        raise ValueError(f"timeout must be None or a non-negative number of seconds, got {_shown(timeout)}")
    try:
        t = float(timeout)
    except OverflowError:   # an int beyond any float: longer than any wait
        if timeout < 0:
            raise ValueError(f"timeout must be None or a non-negative number of seconds, got {_shown(timeout)}")
        return _FOREVER
    if t != t or t < 0:
        raise ValueError(f"timeout must be None or a non-negative number of seconds, got {_shown(timeout)}")
    if t > 1e9:
        return _FOREVER
    return <uint64_t>(t * 1e9)


cdef class Device:
    """The native view of one VkDevice: its function table, loaded once."""

    def __cinit__(self, uintptr_t physical, uintptr_t device, bint external_memory_host=False,
                  bint external_memory_fd=False, bint external_memory_dma_buf=False):
        cdef vkm_error err
        if physical == 0 or device == 0:
            raise ValueError("Device needs non-null VkPhysicalDevice and VkDevice handles")
        self.alive = False
        self.timelines = _live_timelines.setdefault(device, set())
        vkm_error_clear(&err)
        check_error(vkm_device_init(&self.dev, <VkPhysicalDevice>physical, <VkDevice>device,
                                    external_memory_host, external_memory_fd, external_memory_dma_buf, &err), &err)
        self.alive = True

    cdef vkm_device* ptr(self) except NULL:
        if not self.alive:
            from vkmulti.errors import DestroyedError
            raise DestroyedError("the native device was released (its VkDevice is destroyed)")
        return &self.dev

    cdef int own(self, uintptr_t semaphore, str label) except -1:
        """ValueError unless `semaphore` is a live timeline vkmulti made on this device: a
        forged handle, one of another device or one destroyed since never reaches the driver."""
        if semaphore not in self.timelines:
            raise ValueError(f"{label} {semaphore:#x} is not a live timeline semaphore of this device: not made "
                             f"by vkmulti here, or destroyed since")
        return 0

    def owns_timeline(self, semaphore):
        """Whether `semaphore` (an int) is a live timeline vkmulti made on this VkDevice."""
        return semaphore in self.timelines

    def release(self, bint destroyed=False):
        """Forget the device (called just before vkDestroyDevice, `destroyed`, or when
        letting go of an engine's device, which keeps its semaphores)."""
        self.alive = False
        if destroyed:   # (every semaphore goes with the device)
            self.timelines.clear()
            _live_timelines.pop(<uintptr_t>self.dev.device, None)

    @property
    def handle(self):
        return <uintptr_t>self.dev.device

    @property
    def host_pointer_alignment(self):
        return self.dev.host_pointer_alignment

    @property
    def name(self):
        """The device's name (VkPhysicalDeviceProperties::deviceName)."""
        return _text(self.dev.name)

    @property
    def lost(self):
        """Whether the device returned VK_ERROR_DEVICE_LOST (or a test marked it
        lost): its submits and waits then fail with DeviceLostError at once."""
        return bool(vkm_device_is_lost(&self.dev))

    def mark_lost(self):
        """Mark the device lost (idempotent; never undone): from now on every
        submit and wait through vkmulti, native link workers included, returns
        VK_ERROR_DEVICE_LOST without reaching the driver."""
        vkm_device_mark_lost(&self.dev)

    def check_alive(self, str call not None="vkQueueSubmit"):
        """DeviceLostError (as `call` returning VK_ERROR_DEVICE_LOST) when the device is lost."""
        cdef bytes c
        if vkm_device_is_lost(&self.dev):
            c = call.encode()
            check(VK_ERROR_DEVICE_LOST, c)

    def fence_signalled(self, uintptr_t fence):
        """vkGetFenceStatus: True when signalled, False when not yet."""
        cdef vkm_device *d = self.ptr()
        cdef VkResult r
        _nonzero(fence, "fence")
        r = vkm_fence_status(d, <VkFence>fence)
        if r == VK_NOT_READY:
            return False
        check(r, "vkGetFenceStatus")
        return True

    def drain_queues_raw(self, queues, timeout, list pending=None):
        """Wait until each QueueLock in `queues` finished its submitted work, through
        the driver even when the device is marked lost (an injected loss: the
        driver still runs what it was given). True when drained, False when work
        was still running after `timeout` s (one bound for all of them; waited in
        slices, signals checked between them). Fences still pending when it gives up
        (a timeout, an interrupt) stay alive; their handles are appended to `pending`."""
        cdef vkm_device *d = self.ptr()
        cdef list qs = list(queues)
        cdef uint32_t n = len(qs), i
        cdef vkm_queue **arr
        cdef VkFence *fences
        cdef QueueLock q
        cdef uint64_t t = _timeout_ns(timeout)
        cdef double deadline = _time.monotonic() + (t / 1e9 if t != _FOREVER else 1e18)
        cdef uint64_t slice_ns
        cdef VkResult r
        if n == 0:
            return True
        arr = <vkm_queue **>malloc(n * sizeof(vkm_queue *))
        fences = <VkFence *>calloc(n, sizeof(VkFence))
        if arr == NULL or fences == NULL:
            free(arr)
            free(fences)
            raise MemoryError()
        try:   # fences still pending when this gives up are left alive: they may still signal
            for i in range(n):
                q = qs[i]
                arr[i] = q.ptr()
            while True:
                slice_ns = _slice_before(deadline)
                with nogil:
                    r = vkm_queues_drain_raw(d, arr, n, fences, slice_ns)
                if r == VKM_ERROR_QUEUE_LOCK_HELD:   # (at the first queue without a fence)
                    i = 0
                    while fences[i] != NULL:
                        i += 1
                    check_held(r, "vkQueueSubmit(teardown drain)", arr[i])
                if r != VK_TIMEOUT or _time.monotonic() >= deadline:
                    break
                PyErr_CheckSignals()
        finally:
            if pending is not None:
                for i in range(n):
                    if fences[i] != NULL:
                        pending.append(<uintptr_t>fences[i])
            free(arr)
            free(fences)
        if r == VK_TIMEOUT:
            return False
        check(r, "vkWaitForFences(drain)")
        return True

    def wait_idle(self):
        """vkDeviceWaitIdle without the GIL."""
        cdef vkm_device *d = self.ptr()
        cdef VkResult r
        with nogil:
            r = vkm_device_wait_idle(d)
        check(r, "vkDeviceWaitIdle")

    def create_timeline(self, initial=0):
        cdef VkSemaphore s = NULL
        cdef uint64_t v = _timeline_u64(initial, "initial")
        cdef vkm_device *d = self.ptr()
        check(vkm_create_timeline(d, v, &s), "vkCreateSemaphore(timeline)")
        self.timelines.add(<uintptr_t>s)
        return <uintptr_t>s

    def destroy_timeline(self, uintptr_t semaphore):
        """Destroy a timeline of create_timeline (the caller makes sure no GPU work still
        uses it); ValueError for any other handle, or one destroyed already."""
        self.own(semaphore, "semaphore")
        self.timelines.discard(semaphore)
        if self.alive:   # (else the device took it)
            vkm_destroy_timeline(&self.dev, <VkSemaphore>semaphore)

    def timeline_value(self, uintptr_t semaphore):
        cdef uint64_t v = 0
        cdef vkm_device *d = self.ptr()
        _nonzero(semaphore, "semaphore")
        self.own(semaphore, "semaphore")
        check(vkm_timeline_value(d, <VkSemaphore>semaphore, &v), "vkGetSemaphoreCounterValue")
        return v

    def wait_timeline(self, uintptr_t semaphore, value, timeout=None):
        """Wait until `semaphore` reaches `value` (an int in [0, 2**64)); TimeoutError after `timeout` s."""
        cdef uint64_t v = _timeline_u64(value, "value")
        cdef vkm_device *d = self.ptr()
        _nonzero(semaphore, "semaphore")
        self.own(semaphore, "semaphore")
        return wait_slices(d, <VkSemaphore>semaphore, NULL, v, _timeout_ns(timeout),
                           "vkWaitSemaphores")

    def wait_fence(self, uintptr_t fence, timeout=None):
        cdef vkm_device *d = self.ptr()
        _nonzero(fence, "fence")
        return wait_slices(d, NULL, <VkFence>fence, 0, _timeout_ns(timeout), "vkWaitForFences")


cdef uint64_t _timeline_u64(object value, str label) except? 0:
    """A timeline value (any integral object) as a uint64, or a TypeError / ValueError naming it."""
    try:
        v = _operator.index(value)
    except TypeError:
        raise TypeError(f"{label} must be an int, got {type(value).__name__}") from None
    if not 0 <= v <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError(f"{label} must be a timeline value in [0, 2**64), got {v}")
    return <uint64_t>v


cdef int _nonzero(uintptr_t handle, str label) except -1:
    if handle == 0:
        raise ValueError(f"{label} must be a non-null handle, got 0")
    return 0


cdef uint64_t _slice_before(double deadline):
    """The next wait slice (ns) before `deadline` (monotonic s): at most _SLICE_NS, 0 once it passed."""
    cdef double left = deadline - _time.monotonic()
    if left * 1e9 < _SLICE_NS:
        return <uint64_t>(left * 1e9) if left > 0 else 0
    return _SLICE_NS


cdef object wait_slices(vkm_device *d, VkSemaphore sem, VkFence fence, uint64_t value,
                        uint64_t timeout_ns, const char *call):
    """Wait in slices of at most 50 ms, checking signals between slices."""
    cdef VkResult r
    cdef uint64_t slice_ns
    cdef double deadline = _time.monotonic() + (timeout_ns / 1e9 if timeout_ns != _FOREVER else 1e18)
    cdef vkm_nap nap
    cdef bint naps = _timeline_naps
    memset(&nap, 0, sizeof(nap))
    while True:
        slice_ns = _slice_before(deadline)
        with nogil:
            if sem != NULL and naps:
                r = vkm_nap_wait(d, sem, value, slice_ns, &nap)
            elif sem != NULL:
                r = vkm_wait_timeline(d, sem, value, slice_ns)
            else:
                r = vkm_wait_fence(d, fence, slice_ns)
        if r == VK_SUCCESS:
            return None
        if r != VK_TIMEOUT:
            check(r, call)
        PyErr_CheckSignals()
        if _time.monotonic() >= deadline:
            from vkmulti.errors import TimeoutError as VkmTimeout
            raise VkmTimeout(f"{call.decode()} did not complete within {timeout_ns / 1e9:.3f} s")


cdef str _held_by_caller(const vkm_queue *q):
    """What a thread that takes a queue's lock it holds already is told."""
    return (f"this thread already holds the lock of queue 0x{<uintptr_t>q.queue:x} (family {q.family}); "
            f"the lock is not re-entrant: release it first")


cdef int check_held(VkResult result, const char *call, const vkm_queue *q) except -1:
    """`check` for VKM_ERROR_QUEUE_LOCK_HELD, its message naming queue `q`."""
    from vkmulti.errors import raise_for_result
    raise_for_result(int(result), _text(call), _held_by_caller(q))
    return -1


cdef class QueueLock:
    """The external-synchronisation lock of one VkQueue, shared with native threads.

    Use it as a context manager around any vkQueueSubmit you make yourself on a
    queue vkmulti also submits to.
    """
    cdef vkm_queue q

    def __cinit__(self, uintptr_t queue, uint32_t family, uint32_t index=0):
        if queue == 0:
            raise ValueError("QueueLock needs a non-null VkQueue handle")
        vkm_queue_init(&self.q, <VkQueue>queue, family, index)

    def __dealloc__(self):
        vkm_queue_destroy(&self.q)

    @property
    def handle(self):
        return <uintptr_t>self.q.queue

    @property
    def family(self):
        return self.q.family

    @property
    def index(self):
        return self.q.index

    cdef vkm_queue* ptr(self):
        return &self.q

    def acquire(self, timeout=None):
        """Take the lock, waiting (no GIL, in slices, Ctrl-C honoured) up to `timeout` s
        (None: as long as it takes); vkmulti.TimeoutError after that. The lock is not
        re-entrant: a thread that holds it already gets RuntimeError, not a deadlock. A
        Ctrl-C raised from here leaves the lock free, even one that came as it was taken."""
        cdef uint64_t total = _timeout_ns(timeout)
        cdef double deadline = _time.monotonic() + (total / 1e9 if total != _FOREVER else 1e18)
        cdef uint64_t slice_ns
        cdef int rc
        with nogil:
            rc = vkm_queue_lock(&self.q, 0)
        while rc == ETIMEDOUT:
            PyErr_CheckSignals()
            slice_ns = _slice_before(deadline)
            if slice_ns == 0:
                from vkmulti.errors import TimeoutError as VkmTimeout
                raise VkmTimeout(f"the lock of queue 0x{<uintptr_t>self.q.queue:x} (family {self.q.family}) was "
                                 f"still held by another thread after {total / 1e9:.3f} s")
            with nogil:
                rc = vkm_queue_lock(&self.q, slice_ns)
        if rc == EDEADLK:
            raise RuntimeError(_held_by_caller(&self.q))
        if rc != 0:
            raise OSError(rc, f"taking the lock of queue 0x{<uintptr_t>self.q.queue:x} failed")
        try:   # a Ctrl-C that came while the lock was being taken is raised here, with the lock let go:
            PyErr_CheckSignals()   # raised by the caller's next bytecode, it would leave the lock held
        except BaseException:
            vkm_queue_unlock(&self.q)
            raise
        return True

    def release(self):
        """Give the lock back; RuntimeError when this thread does not hold it."""
        if vkm_queue_unlock(&self.q) != 0:
            raise RuntimeError(f"the lock of queue 0x{<uintptr_t>self.q.queue:x} (family {self.q.family}) "
                               f"is not held by this thread")

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False


cdef class Messenger:
    """Debug-utils messenger whose callback is C; messages are drained from Python."""
    cdef vkm_messenger *m

    def __cinit__(self, uintptr_t instance):
        cdef vkm_error err
        self.m = NULL
        if instance == 0:
            raise ValueError("Messenger needs a non-null VkInstance handle")
        vkm_error_clear(&err)
        check_error(vkm_messenger_create(<VkInstance>instance, &self.m, &err), &err)

    def destroy(self):
        if self.m != NULL:
            vkm_messenger_destroy(self.m)
            self.m = NULL

    def drain(self):
        """Return and forget the pending messages as (severity, text) pairs."""
        cdef int sev[256]
        cdef char *text[256]
        cdef size_t n, i
        out = []
        if self.m == NULL:
            return out
        names = ("verbose", "info", "warning", "error")
        while True:
            n = vkm_messenger_drain(self.m, 256, sev, text)
            for i in range(n):
                out.append((names[sev[i]], (<bytes>text[i]).decode("utf-8", "replace")))
                free(text[i])
            if n < 256:
                return out

    def count(self, str severity not None="error"):
        names = ("verbose", "info", "warning", "error")
        if severity not in names:
            raise ValueError(f"severity must be one of {names}, got {_shown(severity)}")
        if self.m == NULL:
            return 0
        return vkm_messenger_count(self.m, names.index(severity))

include "partition.pxi"
include "cuda.pxi"
include "link.pxi"
include "mirror.pxi"
include "step.pxi"
include "run.pxi"
