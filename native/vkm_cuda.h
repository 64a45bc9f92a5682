/* vkm_cuda.h - the CUDA driver as the CUDA_PEER ring uses it (vkm_cuda_driver.c).
 *
 * No build-time CUDA dependency: the driver library (libcuda.so.1, or the file
 * Python passes down from the environment variable VKMULTI_LIBCUDA) is opened
 * at run time and the few driver-API types this needs are declared below
 * (layouts as in cuda.h of CUDA 11.2 to 13; tests/test_cuda_peer.py checks
 * them against a cuda.h when one is installed). With VKM_CUDA_API_ONLY defined
 * only that part is seen. The ring itself: vkm_cuda_ring.h.
 */
#ifndef VKM_CUDA_H
#define VKM_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* ---- the CUDA driver API subset (prefixed; values and layouts of cuda.h) -- */

enum {
    VKM_CUDA_SUCCESS = 0,
    VKM_CUDA_ERROR_NOT_READY = 600,
    VKM_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    VKM_CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD = 1,
    VKM_CUDA_EXTERNAL_MEMORY_DEDICATED = 0x1,
    VKM_CU_STREAM_NON_BLOCKING = 0x1,
    VKM_CU_EVENT_DISABLE_TIMING = 0x2,
    VKM_CU_MEM_ALLOCATION_TYPE_PINNED = 0x1,
    VKM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
    VKM_CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
    VKM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3,
    VKM_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
};

#ifdef VKM_CUDA_TYPES_FROM_CUDA_H
/* signature check only (tests): the same names bound to cuda.h's types */
typedef CUresult vkm_CUresult;
typedef CUdevice vkm_CUdevice;
typedef CUdeviceptr vkm_CUdeviceptr;
typedef CUcontext vkm_CUcontext;
typedef CUstream vkm_CUstream;
typedef CUevent vkm_CUevent;
typedef CUexternalMemory vkm_CUexternalMemory;
typedef CUuuid vkm_CUuuid;
typedef CUDA_EXTERNAL_MEMORY_HANDLE_DESC vkm_CUDA_EXTERNAL_MEMORY_HANDLE_DESC;
typedef CUDA_EXTERNAL_MEMORY_BUFFER_DESC vkm_CUDA_EXTERNAL_MEMORY_BUFFER_DESC;
typedef CUmemGenericAllocationHandle vkm_CUmemGenericAllocationHandle;
typedef CUmemLocation vkm_CUmemLocation;
typedef CUmemAllocationProp vkm_CUmemAllocationProp;
typedef CUmemAccessDesc vkm_CUmemAccessDesc;
typedef CUmemAllocationHandleType vkm_CUmemAllocationHandleType;
typedef CUmemAllocationGranularity_flags vkm_CUmemAllocationGranularity_flags;
#else
typedef int vkm_CUresult;
typedef int vkm_CUdevice;
typedef unsigned long long vkm_CUdeviceptr;
typedef struct vkm_CUctx_st *vkm_CUcontext;
typedef struct vkm_CUstream_st *vkm_CUstream;
typedef struct vkm_CUevent_st *vkm_CUevent;
typedef struct vkm_CUextMemory_st *vkm_CUexternalMemory;
typedef struct vkm_CUuuid {
    char bytes[16];
} vkm_CUuuid;

typedef struct vkm_CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
    int type; /* CUexternalMemoryHandleType */
    union {
        int fd;
        struct {
            void *handle;
            const void *name;
        } win32;
        const void *nvSciBufObject;
    } handle;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} vkm_CUDA_EXTERNAL_MEMORY_HANDLE_DESC;

typedef struct vkm_CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
    unsigned long long offset;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} vkm_CUDA_EXTERNAL_MEMORY_BUFFER_DESC;

/* virtual memory management (CUDA 10.2+): memory CUDA allocates and exports */
typedef unsigned long long vkm_CUmemGenericAllocationHandle;
typedef int vkm_CUmemAllocationHandleType;
typedef int vkm_CUmemAllocationGranularity_flags;
typedef struct vkm_CUmemLocation {
    int type; /* CUmemLocationType */
    int id;
} vkm_CUmemLocation;
typedef struct vkm_CUmemAllocationProp {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    vkm_CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} vkm_CUmemAllocationProp;
typedef struct vkm_CUmemAccessDesc {
    vkm_CUmemLocation location;
    int flags; /* CUmemAccess_flags */
} vkm_CUmemAccessDesc;
#endif

/* The driver functions used, as X(field, symbol, fallback symbol or `none`, (parameters)).
 * Every one returns CUresult. The symbols are the ones cuda.h binds the plain
 * names to (cuMemAlloc -> cuMemAlloc_v2 ...), never the per-thread-stream ones. */
#define VKM_CUDA_FUNCTIONS(X)                                                                              \
    X(cuInit, cuInit, none, (unsigned int flags))                                                        \
    X(cuDriverGetVersion, cuDriverGetVersion, none, (int *version))                                      \
    X(cuGetErrorName, cuGetErrorName, none, (vkm_CUresult error, const char **text))                     \
    X(cuGetErrorString, cuGetErrorString, none, (vkm_CUresult error, const char **text))                 \
    X(cuDeviceGetCount, cuDeviceGetCount, none, (int *count))                                            \
    X(cuDeviceGet, cuDeviceGet, none, (vkm_CUdevice * device, int ordinal))                              \
    X(cuDeviceGetName, cuDeviceGetName, none, (char *name, int len, vkm_CUdevice dev))                   \
    X(cuDeviceGetUuid, cuDeviceGetUuid_v2, cuDeviceGetUuid, (vkm_CUuuid * uuid, vkm_CUdevice dev))     \
    X(cuDeviceCanAccessPeer, cuDeviceCanAccessPeer, none,                                               \
      (int *can, vkm_CUdevice dev, vkm_CUdevice peer))                                                     \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, none, (vkm_CUcontext * ctx, vkm_CUdevice dev)) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease,             \
      (vkm_CUdevice dev))                                                                                  \
    X(cuCtxPushCurrent, cuCtxPushCurrent_v2, none, (vkm_CUcontext ctx))                                  \
    X(cuCtxPopCurrent, cuCtxPopCurrent_v2, none, (vkm_CUcontext * ctx))                                  \
    X(cuCtxEnablePeerAccess, cuCtxEnablePeerAccess, none, (vkm_CUcontext peer, unsigned int flags))      \
    X(cuImportExternalMemory, cuImportExternalMemory, none,                                             \
      (vkm_CUexternalMemory * out, const vkm_CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc))                      \
    X(cuExternalMemoryGetMappedBuffer, cuExternalMemoryGetMappedBuffer, none,                           \
      (vkm_CUdeviceptr * ptr, vkm_CUexternalMemory mem, const vkm_CUDA_EXTERNAL_MEMORY_BUFFER_DESC *desc)) \
    X(cuDestroyExternalMemory, cuDestroyExternalMemory, none, (vkm_CUexternalMemory mem))               \
    X(cuMemAlloc, cuMemAlloc_v2, none, (vkm_CUdeviceptr * ptr, size_t size))                             \
    X(cuMemFree, cuMemFree_v2, none, (vkm_CUdeviceptr ptr))                                              \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, none,                               \
      (size_t *granularity, const vkm_CUmemAllocationProp *prop, vkm_CUmemAllocationGranularity_flags option)) \
    X(cuMemCreate, cuMemCreate, none,                                                                   \
      (vkm_CUmemGenericAllocationHandle * handle, size_t size, const vkm_CUmemAllocationProp *prop,        \
       unsigned long long flags))                                                                          \
    X(cuMemRelease, cuMemRelease, none, (vkm_CUmemGenericAllocationHandle handle))                      \
    X(cuMemAddressReserve, cuMemAddressReserve, none,                                                   \
      (vkm_CUdeviceptr * ptr, size_t size, size_t alignment, vkm_CUdeviceptr addr, unsigned long long flags)) \
    X(cuMemAddressFree, cuMemAddressFree, none, (vkm_CUdeviceptr ptr, size_t size))                     \
    X(cuMemMap, cuMemMap, none,                                                                         \
      (vkm_CUdeviceptr ptr, size_t size, size_t offset, vkm_CUmemGenericAllocationHandle handle,           \
       unsigned long long flags))                                                                          \
    X(cuMemUnmap, cuMemUnmap, none, (vkm_CUdeviceptr ptr, size_t size))                                 \
    X(cuMemSetAccess, cuMemSetAccess, none,                                                             \
      (vkm_CUdeviceptr ptr, size_t size, const vkm_CUmemAccessDesc *desc, size_t count))                  \
    X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, none,                                 \
      (void *shareable, vkm_CUmemGenericAllocationHandle handle, vkm_CUmemAllocationHandleType type,       \
       unsigned long long flags))                                                                          \
    X(cuMemcpyPeerAsync, cuMemcpyPeerAsync, none,                                                       \
      (vkm_CUdeviceptr dst, vkm_CUcontext dst_ctx, vkm_CUdeviceptr src, vkm_CUcontext src_ctx,             \
       size_t size, vkm_CUstream stream))                                                                  \
    X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2, none,                                                     \
      (vkm_CUdeviceptr dst, vkm_CUdeviceptr src, size_t size, vkm_CUstream stream))                        \
    X(cuStreamCreate, cuStreamCreate, none, (vkm_CUstream * stream, unsigned int flags))                 \
    X(cuStreamDestroy, cuStreamDestroy_v2, none, (vkm_CUstream stream))                                  \
    X(cuStreamQuery, cuStreamQuery, none, (vkm_CUstream stream))                                         \
    X(cuStreamWaitEvent, cuStreamWaitEvent, none, (vkm_CUstream stream, vkm_CUevent event, unsigned int flags)) \
    X(cuEventCreate, cuEventCreate, none, (vkm_CUevent * event, unsigned int flags))                     \
    X(cuEventRecord, cuEventRecord, none, (vkm_CUevent event, vkm_CUstream stream))                      \
    X(cuEventQuery, cuEventQuery, none, (vkm_CUevent event))                                             \
    X(cuEventDestroy, cuEventDestroy_v2, none, (vkm_CUevent event))

typedef struct vkm_cuda_api {
#define VKM_CUDA_FIELD(field, symbol, fallback, params) vkm_CUresult(*field) params;
    VKM_CUDA_FUNCTIONS(VKM_CUDA_FIELD)
#undef VKM_CUDA_FIELD
} vkm_cuda_api;

#ifndef VKM_CUDA_API_ONLY

#include "vkm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Load the driver from `path` (NULL or "": libcuda.so.1) and run cuInit, once
 * per process (the first call's path counts: the driver cannot be unloaded).
 * `visible` is CUDA_VISIBLE_DEVICES as CUDA sees it (NULL: unset), quoted when
 * a device is missing. 1 when CUDA is usable, else 0 and why in `reason`. */
int vkm_cuda_load(const char *path, const char *visible, char *reason, size_t reason_len);
/* As vkm_cuda_load's answer, without loading: 0 and why until it was loaded. */
int vkm_cuda_available(char *reason, size_t reason_len);
/* CUDA devices (0 when CUDA is unavailable) and what is known of device i. */
int vkm_cuda_device_count(void);
int vkm_cuda_device_info(int ordinal, uint8_t uuid[16], char *name, size_t name_len);
/* Compute capability and multiprocessor count of CUDA device `ordinal` (zeros where the
 * driver did not say); 0 for an unknown ordinal or without CUDA. */
int vkm_cuda_device_attributes(int ordinal, int *cc_major, int *cc_minor, int *sm_count);
/* 1 when the two devices (Vulkan deviceUUIDs; names for the text, may be
 * NULL) are distinct CUDA devices with peer access both ways; else 0 and the
 * reason. */
int vkm_cuda_peer_check(const uint8_t uuid_a[16], const char *name_a, const uint8_t uuid_b[16],
                        const char *name_b, char *reason, size_t reason_len);

/* ---- for the CUDA_PEER ring ------------------------------------------------ */

extern vkm_cuda_api vkm_cu;            /* the driver's functions, once loaded */
/* The CUDA device of ordinal i (0 <= i < vkm_cuda_device_count()). */
vkm_CUdevice vkm_cuda_device(int ordinal);
/* The ordinal of the CUDA device with this UUID, or -1. */
int vkm_cuda_find(const uint8_t uuid[16]);
/* 1 when CUDA devices ia and ib are distinct with peer access both ways, else 0 and why. */
int vkm_cuda_peer_ok(int ia, int ib, const char *name_a, const char *name_b, char *reason, size_t reason_len);
/* "CUDA_ERROR_X (n): description" of a CUresult, into buf. */
const char *vkm_cuda_text(vkm_CUresult r, char *buf, size_t n);
/* The failure of CUDA call `where` with `cr` into `err`: VKM_ERROR_CUDA. */
VkResult vkm_cuda_fail(vkm_error *err, const char *where, vkm_CUresult cr);

#ifdef __cplusplus
}
#endif

#endif /* VKM_CUDA_API_ONLY */
#endif
