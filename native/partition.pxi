# partition.pxi - included by _native.pyx: the greedy SRU cost partitioner (vkm_partition.h).
from libc.stdint cimport int32_t, int64_t

cdef extern from "vkm_partition.h" nogil:
    enum:
        VKM_PARTITION_OK
        VKM_PARTITION_EINVAL
        VKM_PARTITION_ENOMEM
        VKM_PARTITION_ECOST
        VKM_PARTITION_ETRANSFER
        VKM_PARTITION_EWEIGHT
        VKM_PARTITION_ELINK
        VKM_PARTITION_EPIN
        VKM_PARTITION_EPREVIOUS
        VKM_PARTITION_EDUPKEY
    size_t VKM_PARTITION_MAX_COUNT
    ctypedef struct vkm_partition_input:
        size_t count
        const double *cost
        const int64_t *tie_key
        const double *transfer
        const int32_t *pin
        const int32_t *previous
        int64_t device_count
        const double *weights
        const double *link
        double hysteresis
    int vkm_partition(const vkm_partition_input *input, int32_t *device_out, size_t *bad_index)

import numpy as _np

PARTITION_MAX_COUNT = VKM_PARTITION_MAX_COUNT
_INT32_MAX = 2**31 - 1


def _partition_error(int rc, size_t bad, costs, ids, transfer, pinned, previous, weights, link_costs,
                     device_count):
    """The ValueError for a vkm_partition error code, naming the array, the position and the value."""
    if rc == VKM_PARTITION_ECOST:
        return ValueError(f"costs[{bad}] must be finite and >= 0, got {float(costs[bad])!r}")
    if rc == VKM_PARTITION_ETRANSFER:
        return ValueError(f"transfer[{bad}] must be finite and >= 0, got {float(transfer[bad])!r}")
    if rc == VKM_PARTITION_EWEIGHT:
        return ValueError(f"weights[{bad}] (device {bad}) must be finite and > 0, got {float(weights[bad])!r}")
    if rc == VKM_PARTITION_ELINK:
        return ValueError(f"link_costs[{bad}] (device {bad}) must be finite and >= 0, got {float(link_costs[bad])!r}")
    if rc == VKM_PARTITION_EPIN:
        return IndexError(f"pinned[{bad}] is {int(pinned[bad])}: must be -1 (free) or a device in "
                          f"[0, {device_count})")
    if rc == VKM_PARTITION_EPREVIOUS:
        return IndexError(f"previous[{bad}] is {int(previous[bad])}: must be -1 (none) or a device in "
                          f"[0, {device_count})")
    if rc == VKM_PARTITION_EDUPKEY:
        return ValueError(f"ids[{bad}] is {int(ids[bad])}, the id of an earlier SRU: ids must be distinct")
    return ValueError(f"partition: device_count {device_count}, hysteresis or the number of SRUs is out of range")


def partition(costs, device_count, *, ids=None, transfer=None, pinned=None, previous=None, weights=None,
              link_costs=None, double hysteresis=0.0):
    """Device index (numpy int32) per SRU, in input order; rules in vkm_partition.h.

    costs (float64), ids (distinct int64, or None: input order), transfer
    (float64), pinned (int32: -1 free, else the SRU's device) and previous
    (int32: -1 for none) are per-SRU arrays of one length; weights and
    link_costs (float64) have device_count entries. Arrays are converted with
    numpy.ascontiguousarray; the caller checks dtypes.
    """
    if device_count < 1:
        raise ValueError(f"device_count must be >= 1, got {device_count}")
    cdef int64_t dc = min(device_count, 2**63 - 1)
    cdef const double[::1] c = _np.ascontiguousarray(costs, dtype=_np.float64)
    cdef Py_ssize_t n = c.shape[0]
    if <size_t>n > VKM_PARTITION_MAX_COUNT:
        raise ValueError(f"{n} SRUs: at most {VKM_PARTITION_MAX_COUNT} per call")
    cdef const int64_t[::1] k
    cdef const double[::1] w
    cdef const double[::1] t
    cdef const double[::1] lk
    cdef const int32_t[::1] p
    cdef const int32_t[::1] prev
    cdef vkm_partition_input inp
    inp.count = <size_t>n
    inp.cost = &c[0] if n else NULL
    inp.tie_key = NULL
    inp.device_count = dc
    inp.hysteresis = hysteresis
    inp.weights = NULL
    inp.link = NULL
    inp.transfer = NULL
    inp.pin = NULL
    inp.previous = NULL
    if ids is not None:
        k = _np.ascontiguousarray(ids, dtype=_np.int64)
        if k.shape[0] != n:
            raise ValueError(f"ids has {k.shape[0]} entries for {n} costs")
        if n:
            inp.tie_key = &k[0]
    for name, arr in (("weights", weights), ("link_costs", link_costs)):
        if arr is not None and len(arr) != device_count:
            raise ValueError(f"{name} has {len(arr)} entries for {device_count} devices")
    if (weights is not None or link_costs is not None) and device_count > _INT32_MAX:
        raise ValueError(f"device_count {device_count} with weights or link_costs: at most {_INT32_MAX}")
    if weights is not None:
        w = _np.ascontiguousarray(weights, dtype=_np.float64)
        inp.weights = &w[0]
    if link_costs is not None:
        lk = _np.ascontiguousarray(link_costs, dtype=_np.float64)
        inp.link = &lk[0]
    if transfer is not None:
        t = _np.ascontiguousarray(transfer, dtype=_np.float64)
        if t.shape[0] != n:
            raise ValueError(f"transfer has {t.shape[0]} entries for {n} SRUs")
        if n:
            inp.transfer = &t[0]
    if pinned is not None:
        p = _np.ascontiguousarray(pinned, dtype=_np.int32)
        if p.shape[0] != n:
            raise ValueError(f"pinned has {p.shape[0]} entries for {n} SRUs")
        if n:
            inp.pin = &p[0]
    if previous is not None:
        prev = _np.ascontiguousarray(previous, dtype=_np.int32)
        if prev.shape[0] != n:
            raise ValueError(f"previous has {prev.shape[0]} entries for {n} SRUs")
        if n:
            inp.previous = &prev[0]
    out = _np.zeros(n, dtype=_np.int32)
    cdef int32_t[::1] o = out
    cdef int rc
    cdef size_t bad = 0
    cdef int32_t *op = &o[0] if n else NULL
    with nogil:
        rc = vkm_partition(&inp, op, &bad)
    if rc == VKM_PARTITION_ENOMEM:
        raise MemoryError("vkm_partition: out of host memory")
    if rc != VKM_PARTITION_OK:
        raise _partition_error(rc, bad, costs, ids, transfer, pinned, previous, weights, link_costs, device_count)
    return out
