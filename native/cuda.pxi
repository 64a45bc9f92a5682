# The CUDA driver as vkmulti sees it (vkm_cuda.h); included into _native.pyx.
# The CUDA_PEER link itself is a Link with ring RING_CUDA_PEER (link.pxi).
from libc.stdint cimport uint8_t

cdef extern from "vkm_cuda.h" nogil:
    int vkm_cuda_load(const char *path, const char *visible, char *reason, size_t reason_len)
    int vkm_cuda_device_count()
    int vkm_cuda_device_info(int ordinal, uint8_t *uuid, char *name, size_t name_len)
    int vkm_cuda_device_attributes(int ordinal, int *cc_major, int *cc_minor, int *sm_count)
    int vkm_cuda_peer_check(const uint8_t *uuid_a, const char *name_a, const uint8_t *uuid_b, const char *name_b,
                            char *reason, size_t reason_len)

#: The environment variable naming the CUDA driver library (default libcuda.so.1).
LIBCUDA_ENV = "VKMULTI_LIBCUDA"


cdef int _cuda_load(char *reason, size_t reason_len) except -1:
    """Load the CUDA driver once per process (the environment is read here, in
    Python, and passed down); 1 when usable, else 0 and why in `reason`."""
    path = _os.environ.get(LIBCUDA_ENV) or None
    visible = _os.environ.get("CUDA_VISIBLE_DEVICES")
    cdef bytes p = _os.fsencode(path) if path is not None else None
    cdef bytes v = _os.fsencode(visible) if visible is not None else None
    cdef const char *cp = NULL
    cdef const char *cv = NULL
    cdef int ok
    if p is not None:
        cp = p
    if v is not None:
        cv = v
    with nogil:
        ok = vkm_cuda_load(cp, cv, reason, reason_len)
    return ok


def cuda_status():
    """None when the CUDA driver (libcuda.so.1, or VKMULTI_LIBCUDA) loads and
    initialises, else why not.

    The first call opens the driver and runs cuInit; later calls are free.
    """
    cdef char reason[512]
    reason[0] = 0
    return None if _cuda_load(reason, sizeof(reason)) else _text(reason)


def cuda_devices():
    """The CUDA devices as (ordinal, uuid text, name); empty without CUDA."""
    cdef uint8_t uuid[16]
    cdef char name[256]
    cdef char reason[8]
    cdef int i, n
    _cuda_load(reason, sizeof(reason))
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
    cdef char reason[8]
    _cuda_load(reason, sizeof(reason))
    with nogil:
        ok = vkm_cuda_device_attributes(ordinal, &major, &minor, &sms)
    return (major, minor, sms) if ok else None


def cuda_peer_reason(bytes uuid_a not None, bytes uuid_b not None, str name_a not None="", str name_b not None=""):
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
    if not _cuda_load(reason, sizeof(reason)):
        return _text(reason)
    with nogil:
        ok = vkm_cuda_peer_check(pa, ca, pb, cb, reason, sizeof(reason))
    return None if ok else _text(reason)
