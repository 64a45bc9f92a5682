# Bindings of a run of quiet kernel steps (vkm_run.h): one StepRun per device
# and run_quiet_steps over them; included into _native.pyx after step.pxi.

from libc.stdlib cimport calloc
from libc.string cimport memcpy, memset

cdef extern from "vkm_run.h" nogil:
    enum:
        VKM_RUN_MAX_DEPTH
        VKM_RUN_CLOCK_WORDS
        VKM_RUN_DONE
        VKM_RUN_WAITING
        VKM_RUN_NOT_QUIET
        VKM_RUN_FAILED
    ctypedef struct vkm_run_patch:
        uint32_t kernel_op
        uint32_t finish_op
        uint64_t step0
    ctypedef struct vkm_run_capture:
        const volatile uint32_t *src
        uint32_t out
    ctypedef struct vkm_run_template:
        unsigned char *ops
        size_t n
        vkm_run_patch *patches
        uint32_t npatches
        const volatile uint32_t **checks
        uint32_t nchecks
        vkm_run_capture *captures
        uint32_t ncaptures
    ctypedef struct vkm_run_dev:
        const vkm_device *d
        vkm_queue *q
        VkSemaphore timeline
        uint32_t depth
        VkCommandBuffer cmds[8]
        vkm_run_template templates[8]
        uint32_t region0
        uint64_t value0
        uint64_t known
        uint64_t value
        uint64_t checked
        uint32_t *clock
        VkResult result
        uint32_t naps
        vkm_nap nap
    int vkm_run_steps(vkm_run_dev *const *devs, uint32_t ndevs, uint64_t until, uint64_t slice_ns,
                      uint64_t deadline_ns, uint32_t *stalled)

#: The most in-flight regions (command buffers) of a device a StepRun takes.
RUN_MAX_DEPTH = VKM_RUN_MAX_DEPTH
#: What run_quiet_steps stopped at (its first result).
RUN_DONE = VKM_RUN_DONE
RUN_NOT_QUIET = VKM_RUN_NOT_QUIET
RUN_FAILED = VKM_RUN_FAILED
RUN_STALLED = 4
RUN_INTERRUPTED = 5
#: Steps run_quiet_steps submits between two checks for signals (and of its time limit).
RUN_SIGNAL_STEPS = 16
#: The most kernels (clocks) one StepRun keeps.
RUN_MAX_KERNELS = 1 << 16


cdef const volatile uint32_t *_word(object words, object index, Py_ssize_t count, str what) except NULL:
    """The address of words[index] .. words[index + count - 1] of a C-contiguous uint32 array."""
    cdef uint32_t[::1] view = words
    cdef Py_ssize_t i = _operator.index(index)
    if i < 0 or i > view.shape[0] - count:   # (not i + count: it wraps for an index near 2**63)
        raise ValueError(f"{what}: words {i}..{<object>i + count - 1} are outside an array of {view.shape[0]}")
    return <const volatile uint32_t *>&view[i]


cdef class StepRun:
    """One device's plan of a run of quiet steps (vkm_run.h): its command buffers by
    region, one template per step of the rotation, where each template's kernels
    are stamped, which words must read 0 once its step is done, and which clocks to
    keep. Built and used under the device's step lock; it keeps the arrays it reads
    alive, the caller keeps their buffers and the command buffers."""
    cdef vkm_run_dev r
    cdef Device dev
    cdef QueueLock queue
    cdef list keep
    cdef uint32_t nclock
    cdef bint begun

    def __cinit__(self):
        memset(&self.r, 0, sizeof(self.r))
        self.keep = []

    def __init__(self, Device device not None, QueueLock queue not None, uintptr_t timeline, list cmds not None,
                 uint32_t region0, uint64_t value0, uint64_t known, list templates not None, uint32_t kernels,
                 *, bint naps=False, uint64_t pace_ns=0):
        """`templates`: `len(cmds)` tuples (ops: bytes of STEP_OP_BYTES records, patches: [(kernel op
        index, finish op index, step of the run's first step)], checks: [(uint32 array, word index)],
        captures: [(uint32 array, word index, kernel index < kernels)]). `naps`: wait for room by
        reading the timeline between naps (vkm_nap_wait) instead of the driver's blocking wait,
        starting from `pace_ns` per step (0: not known; the `pace_ns` property has what it learnt)."""
        # (snapshots: items are read by index without a bounds check while conversions run caller
        # code, __index__ or a buffer export, that could change the lists)
        cdef tuple cmd_items = tuple(cmds), template_items = tuple(templates), patches, checks, captures
        cdef Py_ssize_t depth = len(cmd_items), t, i
        cdef const char *why = NULL
        cdef vkm_run_template *tp
        cdef bytes ops
        _nonzero(timeline, "timeline")
        device.own(timeline, "timeline")
        if self.begun:   # (a second __init__ would count its patches, checks, captures past their arrays)
            raise RuntimeError("a StepRun is made once")
        self.begun = True
        if kernels > RUN_MAX_KERNELS:
            raise ValueError(f"a run takes at most {RUN_MAX_KERNELS} kernels, got {kernels}")
        if depth < 1 or depth > VKM_RUN_MAX_DEPTH or len(template_items) != depth:
            raise ValueError(f"a run needs 1 to {VKM_RUN_MAX_DEPTH} command buffers and a template each, got "
                             f"{depth} and {len(template_items)}")
        if region0 >= depth:
            raise ValueError(f"region0 {region0} is not one of {depth} regions")
        self.dev, self.queue = device, queue
        self.r.d = device.ptr()
        self.r.q = queue.ptr()
        self.r.timeline = <VkSemaphore>timeline
        self.r.region0 = region0
        self.r.value0 = self.r.value = value0
        self.r.known = self.r.checked = known
        self.r.naps = naps
        self.r.nap.period_ns = pace_ns
        self.nclock = kernels
        self.r.clock = <uint32_t *>calloc(<size_t>kernels * VKM_RUN_CLOCK_WORDS + 1, sizeof(uint32_t))
        if self.r.clock == NULL:
            raise MemoryError()
        for t in range(depth):
            _nonzero(cmd_items[t], f"command buffer {t}")
            self.r.cmds[t] = <VkCommandBuffer><uintptr_t>cmd_items[t]
        for t in range(depth):
            ops, patch_list, check_list, capture_list = template_items[t]
            patches, checks, captures = tuple(patch_list), tuple(check_list), tuple(capture_list)
            tp = &self.r.templates[t]
            if len(ops) == 0 or len(ops) % VKM_STEP_OP_BYTES:
                raise ValueError(f"template {t}: ops must be whole records of {VKM_STEP_OP_BYTES} bytes")
            tp.n = <size_t>(len(ops) // VKM_STEP_OP_BYTES)
            if vkm_step_check_ops(<const char *>ops, tp.n, &why) >= 0:
                raise ValueError(f"template {t}: {why.decode()}")
            tp.ops = <unsigned char *>malloc(len(ops))
            tp.patches = <vkm_run_patch *>calloc(len(patches) + 1, sizeof(vkm_run_patch))
            tp.checks = <const volatile uint32_t **>calloc(len(checks) + 1, sizeof(uint32_t *))
            tp.captures = <vkm_run_capture *>calloc(len(captures) + 1, sizeof(vkm_run_capture))
            if tp.ops == NULL or tp.patches == NULL or tp.checks == NULL or tp.captures == NULL:
                raise MemoryError()
            memcpy(tp.ops, <const char *>ops, len(ops))
            for i in range(len(patches)):
                kop, fop, step0 = patches[i]
                _stamped(ops, kop, 8, t)
                _stamped(ops, fop, 16, t)
                tp.patches[i].kernel_op = <uint32_t>(kop * VKM_STEP_OP_BYTES)
                tp.patches[i].finish_op = <uint32_t>(fop * VKM_STEP_OP_BYTES)
                tp.patches[i].step0 = <uint64_t>step0
                tp.npatches += 1
            for i in range(len(checks)):
                words, index = checks[i]
                tp.checks[i] = _word(words, index, 1, f"template {t} check {i}")
                self.keep.append(memoryview(words))   # (an export: the array cannot be resized under the C side)
                tp.nchecks += 1
            for i in range(len(captures)):
                words, index, out = captures[i]
                if not 0 <= out < kernels:
                    raise ValueError(f"template {t} capture {i}: kernel {out} is not one of {kernels}")
                tp.captures[i].src = _word(words, index, VKM_RUN_CLOCK_WORDS, f"template {t} capture {i}")
                tp.captures[i].out = <uint32_t>out
                self.keep.append(memoryview(words))   # (an export: the array cannot be resized under the C side)
                tp.ncaptures += 1
        self.r.depth = <uint32_t>depth   # (last: a StepRun half made is never run)

    def __dealloc__(self):
        cdef Py_ssize_t t
        for t in range(VKM_RUN_MAX_DEPTH):
            free(self.r.templates[t].ops)
            free(self.r.templates[t].patches)
            free(<void *>self.r.templates[t].checks)
            free(self.r.templates[t].captures)
        free(self.r.clock)

    @property
    def submitted(self):
        """Steps of the run submitted (the last value submitted, less value0)."""
        return self.r.value - self.r.value0

    @property
    def checked(self):
        """Steps up to this timeline value are done and were found quiet (or were known)."""
        return self.r.checked

    @property
    def pace_ns(self):
        """The device's time per step as the run's naps learnt it (0: not known)."""
        return self.r.nap.period_ns

    @property
    def result(self):
        """The VkResult of the call that failed (RUN_FAILED)."""
        return self.r.result

    def clock(self, uint32_t kernel):
        """The clock words (VKM_RUN_CLOCK_WORDS) of `kernel` of the last step found quiet."""
        if kernel >= self.nclock:
            raise ValueError(f"kernel {kernel} is not one of {self.nclock}")
        return tuple(self.r.clock[<size_t>kernel * VKM_RUN_CLOCK_WORDS + i] for i in range(VKM_RUN_CLOCK_WORDS))


cdef int _stamped(bytes ops, object index, Py_ssize_t push, Py_ssize_t t) except -1:
    """Check that record `index` of `ops` is a pass with at least `push` bytes of push constants."""
    cdef Py_ssize_t i = _operator.index(index)
    cdef const unsigned char *p
    cdef uint32_t kind, nbytes
    if i < 0 or (i + 1) * VKM_STEP_OP_BYTES > len(ops):
        raise ValueError(f"template {t}: record {i} is not one of its {len(ops) // VKM_STEP_OP_BYTES}")
    p = <const unsigned char *>(<const char *>ops) + i * VKM_STEP_OP_BYTES
    memcpy(&kind, p, 4)
    memcpy(&nbytes, p + 8, 4)
    if kind != VKM_STEP_OP_PASS or nbytes < push:
        raise ValueError(f"template {t}: record {i} is not a pass with {push} bytes of push constants to stamp")
    return 0


def run_quiet_steps(list runs not None, uint64_t steps, double budget):
    """Submit `steps` quiet steps on every StepRun of `runs` (step by step across them),
    without the GIL but for a check of signals every RUN_SIGNAL_STEPS steps and every
    wait slice. Stops early at a step that was not quiet, a failed call, `budget` s
    after the start (between two steps; RUN_DONE), a wait for room that has not ended
    then (RUN_STALLED: the caller waits as it sees fit, without the device's lock),
    or a signal's exception. Returns (RUN_* result, index in `runs` of the device it
    stopped at or -1, the exception or None)."""
    cdef tuple held = tuple(runs)   # (references of its own: the loop reads the StepRuns without the GIL, and
                                    # another thread may empty `runs` meanwhile)
    cdef Py_ssize_t n = len(held), i
    cdef vkm_run_dev **devs
    cdef uint64_t until, least
    cdef uint32_t stalled = 0
    cdef int rc
    cdef uint64_t slice_ns = _SLICE_NS
    cdef uint64_t deadline_ns
    if n == 0:
        raise ValueError("run_quiet_steps needs at least one StepRun")
    if not budget > 0:
        raise ValueError(f"budget must be > 0 s, got {budget}")
    if budget * 1e9 < slice_ns:
        slice_ns = <uint64_t>(budget * 1e9)
    deadline_ns = vkm_now_ns() + <uint64_t>(budget * 1e9) if budget < 1e9 else 0
    devs = <vkm_run_dev **>malloc(n * sizeof(vkm_run_dev *))
    if devs == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            devs[i] = &(<StepRun?>held[i]).r
            if devs[i].depth == 0:
                raise ValueError(f"runs[{i}] is a StepRun that was not made")
        while True:
            least = _FOREVER
            for i in range(n):
                if devs[i].value - devs[i].value0 < least:
                    least = devs[i].value - devs[i].value0
            if least >= steps:
                return RUN_DONE, -1, None
            until = least + RUN_SIGNAL_STEPS if steps - least > RUN_SIGNAL_STEPS else steps
            with nogil:
                rc = vkm_run_steps(devs, <uint32_t>n, until, slice_ns, deadline_ns, &stalled)
            signalled = None
            try:   # (also before a stop: a signal noted during the call is returned, never raised by the
                   # caller's next bytecode before it settled the steps submitted)
                PyErr_CheckSignals()
            except BaseException as exc:
                signalled = exc
            if rc == VKM_RUN_NOT_QUIET or rc == VKM_RUN_FAILED:
                return rc, stalled, signalled
            if signalled is not None:
                return RUN_INTERRUPTED, -1, signalled
            if deadline_ns and vkm_now_ns() >= deadline_ns:
                return (RUN_STALLED, stalled, None) if rc == VKM_RUN_WAITING else (RUN_DONE, -1, None)
    finally:
        free(devs)
