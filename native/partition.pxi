# partition.pxi - included by _native.pyx: the greedy SRU cost partitioner (vkm_partition.h).
from libc.stdint cimport int32_t, int64_t, uint8_t

cdef extern from "vkm_partition.h" nogil:
    enum:
        VKM_PARTITION_OK
        VKM_PARTITION_EINVAL
        VKM_PARTITION_ENOMEM
    ctypedef struct vkm_partition_input:
        size_t count
        const double *cost
        const int64_t *tie_key
        const double *transfer
        const uint8_t *pinned
        const int32_t *previous
        int device_count
        const double *weights
        double hysteresis
    int vkm_partition(const vkm_partition_input *input, int32_t *device_out)

import numpy as _np


def partition(cost, tie_key, int device_count, weights=None, transfer=None, pinned=None,
              previous=None, double hysteresis=0.0):
    """Device index (numpy int32) per SRU, in input order; rules in vkm_partition.h.

    cost, tie_key (distinct int64), transfer, pinned (bool) and previous (int, -1
    for none) are per-SRU arrays of one length; weights has device_count entries.
    """
    if device_count < 1:
        raise ValueError(f"device_count must be >= 1, got {device_count}")
    cdef const double[::1] c = _np.ascontiguousarray(cost, dtype=_np.float64)
    cdef const int64_t[::1] k = _np.ascontiguousarray(tie_key, dtype=_np.int64)
    cdef Py_ssize_t n = c.shape[0]
    if k.shape[0] != n:
        raise ValueError(f"tie_key has {k.shape[0]} entries for {n} costs")
    out = _np.zeros(n, dtype=_np.int32)
    if n == 0:
        return out
    cdef int32_t[::1] o = out
    cdef const double[::1] w
    cdef const double[::1] t
    cdef const uint8_t[::1] p
    cdef const int32_t[::1] prev
    cdef vkm_partition_input inp
    inp.count = <size_t>n
    inp.cost = &c[0]
    inp.tie_key = &k[0]
    inp.device_count = device_count
    inp.hysteresis = hysteresis
    inp.weights = NULL
    inp.transfer = NULL
    inp.pinned = NULL
    inp.previous = NULL
    if weights is not None:
        w = _np.ascontiguousarray(weights, dtype=_np.float64)
        if w.shape[0] != device_count:
            raise ValueError(f"weights has {w.shape[0]} entries for {device_count} devices")
        inp.weights = &w[0]
    if transfer is not None:
        t = _np.ascontiguousarray(transfer, dtype=_np.float64)
        if t.shape[0] != n:
            raise ValueError(f"transfer has {t.shape[0]} entries for {n} SRUs")
        inp.transfer = &t[0]
    if pinned is not None:
        p = _np.ascontiguousarray(pinned, dtype=_np.bool_).view(_np.uint8)
        if p.shape[0] != n:
            raise ValueError(f"pinned has {p.shape[0]} entries for {n} SRUs")
        inp.pinned = &p[0]
    if previous is not None:
        prev = _np.ascontiguousarray(previous, dtype=_np.int32)
        if prev.shape[0] != n:
            raise ValueError(f"previous has {prev.shape[0]} entries for {n} SRUs")
        inp.previous = &prev[0]
    cdef int rc
    with nogil:
        rc = vkm_partition(&inp, &o[0])
    if rc == VKM_PARTITION_ENOMEM:
        raise MemoryError("vkm_partition: out of host memory")
    if rc != VKM_PARTITION_OK:
        raise ValueError("partition: a cost or transfer is negative or not finite, a weight is not "
                         "positive and finite, or hysteresis is outside [0, 1)")
    return out
