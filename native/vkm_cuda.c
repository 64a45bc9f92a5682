/* vkm_cuda.c - the CUDA_PEER link (see vkm_cuda.h).
 *
 * Per chunk g of the link (slot s = g % K, K slots in each ring), with a
 * landing ring on the destination:
 *
 *   Vulkan, source queue:  endpoint -> src ring[s] (Vulkan memory imported into
 *                          CUDA), release to VK_QUEUE_FAMILY_EXTERNAL, signal src_done
 *   CUDA, source stream:   peer copy src ring[s] -> dst ring[s] (CUDA memory on the
 *                          destination, imported into Vulkan) over NVLink; record copied[s]
 *   Vulkan, dest queue:    acquire from EXTERNAL; dst ring[s] -> endpoint; signal dst_ready
 *
 * Without a landing ring (the drivers refuse CUDA memory in Vulkan) the peer
 * copy goes to a CUDA bounce ring and a CUDA local copy on the destination
 * (its own stream, event landed[s]) moves it into a Vulkan-made dst ring.
 *
 * The worker thread orders the APIs: it polls src_done and CUDA's events and
 * queues each step the moment its inputs are ready (run_job). Ordering them on
 * the GPUs instead, with timeline semaphores imported into CUDA, was built and
 * measured on two H200s (NVIDIA 580): each cross-API hand-off took 150-220 us,
 * CUDA saw Vulkan's signals only at the end of a vkQueueSubmit batch, and CUDA
 * work on a GPU took turns with that GPU's Vulkan work, so 256 MiB moved at
 * 54 GB/s against 258 GB/s this way. The device-local copies at either end are
 * compute kernels (vkm_kcopy.h) where the endpoint allows: with them 256 MiB
 * moves at 306-328 GB/s, a 4K RGBA16F frame in ~0.31 ms (bench/RESULTS.md).
 */
#include "vkm_cuda.h"
#include "vkm_trace.h"
#include "vkm_kcopy.h"
#include "vkm_jobq.h"

#include <dlfcn.h>
#include <sched.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WATCH_NS 50000000ull             /* the idle worker looks at in-flight work this often */
#define MAX_CUDA_DEVICES 64
#define MIN_CHUNK ((VkDeviceSize)2 << 20) /* smaller chunks cost more in submits than they gain */
#define TARGET_CHUNKS 8                  /* a job is cut into about this many chunks (pipeline depth) */
/* even chunks: ramps' smaller first and last chunks start NVLink sooner, but
 * each chunk costs the worker host work; on the H200 pair (bench/link_ab.py,
 * 2026-11-30) ramps of 1/2/3 steps made the 4K frame 0.93-1.07x, 1080p
 * 0.81-0.99x and 256 MiB 0.94-0.99x as fast as even chunks */
#define DEFAULT_RAMPS 0
/* most source chunks per submit once the first two are out: unbounded. Each
 * vkQueueSubmit costs more than the rounds it would shorten; on the H200 pair
 * (bench/link_ab.py, 2026-11-30) batches of 2 / 1 made the 4K frame 0.67x /
 * 0.78x and 256 MiB 0.87x / 0.88x as fast */
#define DEFAULT_SRC_BATCH UINT32_MAX
#define SLOT_ALIGN 256
#define RING_USAGE (VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)

/* ---- the driver, loaded once per process --------------------------------- */

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static vkm_cuda_api cu;
static int cu_ok;
static char cu_reason[512];
static int cu_count;
static struct {
    vkm_CUdevice dev;
    uint8_t uuid[16];
    char name[128];
    int cc_major, cc_minor, sm_count; /* 0 when the driver does not say */
} cu_devs[MAX_CUDA_DEVICES];
/* cuDeviceGetAttribute: looked up on its own so a driver without it still serves CUDA_PEER */
static vkm_CUresult (*cu_get_attribute)(int *value, int attribute, vkm_CUdevice dev);
#define CU_ATTR_MULTIPROCESSOR_COUNT 16
#define CU_ATTR_COMPUTE_CAPABILITY_MAJOR 75
#define CU_ATTR_COMPUTE_CAPABILITY_MINOR 76

static const char *cu_text(vkm_CUresult r, char *buf, size_t n)
{
    const char *name = NULL, *desc = NULL;
    if (cu.cuGetErrorName && cu.cuGetErrorName(r, &name) != VKM_CUDA_SUCCESS) name = NULL;
    if (cu.cuGetErrorString && cu.cuGetErrorString(r, &desc) != VKM_CUDA_SUCCESS) desc = NULL;
    snprintf(buf, n, "%s (%d)%s%s", name ? name : "CUresult", (int)r, desc ? ": " : "", desc ? desc : "");
    return buf;
}

static void cu_load(void)
{
    const char *path = getenv("VKMULTI_LIBCUDA");
    if (!path || !*path) path = "libcuda.so.1";
    dlerror();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(cu_reason, sizeof cu_reason, "the NVIDIA CUDA driver (%s) could not be loaded: %s", path,
                 e ? e : "not found");
        return;
    }
    /* never dlclose'd: the driver does not support being unloaded */
#define VKM_CUDA_LOAD(field, symbol, fallback, params)                                                  \
    *(void **)&cu.field = dlsym(lib, #symbol);                                                          \
    if (!cu.field && strcmp(#fallback, "none") != 0) *(void **)&cu.field = dlsym(lib, #fallback);       \
    if (!cu.field) {                                                                                    \
        snprintf(cu_reason, sizeof cu_reason,                                                           \
                 "%s has no %s: the NVIDIA driver is too old for CUDA_PEER (Vulkan memory interop "    \
                 "and exportable CUDA memory need a CUDA 11.2 or newer driver)", path, #symbol);              \
        return;                                                                                         \
    }
    VKM_CUDA_FUNCTIONS(VKM_CUDA_LOAD)
#undef VKM_CUDA_LOAD
    *(void **)&cu_get_attribute = dlsym(lib, "cuDeviceGetAttribute");
    char t[256];
    vkm_CUresult r = cu.cuInit(0);
    if (r != VKM_CUDA_SUCCESS) {
        snprintf(cu_reason, sizeof cu_reason, "cuInit failed: %s", cu_text(r, t, sizeof t));
        return;
    }
    int n = 0;
    r = cu.cuDeviceGetCount(&n);
    if (r != VKM_CUDA_SUCCESS) {
        snprintf(cu_reason, sizeof cu_reason, "cuDeviceGetCount failed: %s", cu_text(r, t, sizeof t));
        return;
    }
    if (n > MAX_CUDA_DEVICES) n = MAX_CUDA_DEVICES;
    for (int i = 0; i < n; i++) {
        vkm_CUuuid u;
        r = cu.cuDeviceGet(&cu_devs[i].dev, i);
        if (r == VKM_CUDA_SUCCESS) r = cu.cuDeviceGetUuid(&u, cu_devs[i].dev);
        if (r != VKM_CUDA_SUCCESS) {
            snprintf(cu_reason, sizeof cu_reason, "cuDeviceGet/cuDeviceGetUuid(%d) failed: %s", i,
                     cu_text(r, t, sizeof t));
            return;
        }
        memcpy(cu_devs[i].uuid, u.bytes, 16);
        if (cu.cuDeviceGetName(cu_devs[i].name, (int)sizeof cu_devs[i].name, cu_devs[i].dev) != VKM_CUDA_SUCCESS)
            snprintf(cu_devs[i].name, sizeof cu_devs[i].name, "CUDA device %d", i);
        cu_devs[i].name[sizeof cu_devs[i].name - 1] = 0;
        if (cu_get_attribute) {
            int v[3] = {0, 0, 0};
            if (cu_get_attribute(&v[0], CU_ATTR_COMPUTE_CAPABILITY_MAJOR, cu_devs[i].dev) == VKM_CUDA_SUCCESS &&
                cu_get_attribute(&v[1], CU_ATTR_COMPUTE_CAPABILITY_MINOR, cu_devs[i].dev) == VKM_CUDA_SUCCESS) {
                cu_devs[i].cc_major = v[0];
                cu_devs[i].cc_minor = v[1];
            }
            if (cu_get_attribute(&v[2], CU_ATTR_MULTIPROCESSOR_COUNT, cu_devs[i].dev) == VKM_CUDA_SUCCESS)
                cu_devs[i].sm_count = v[2];
        }
    }
    cu_count = n;
    cu_ok = 1;
}

int vkm_cuda_available(char *reason, size_t reason_len)
{
    pthread_once(&cu_once, cu_load);
    if (!cu_ok && reason && reason_len) snprintf(reason, reason_len, "%s", cu_reason);
    return cu_ok;
}

int vkm_cuda_device_count(void)
{
    return vkm_cuda_available(NULL, 0) ? cu_count : 0;
}

int vkm_cuda_device_info(int ordinal, uint8_t uuid[16], char *name, size_t name_len)
{
    if (!vkm_cuda_available(NULL, 0) || ordinal < 0 || ordinal >= cu_count) return 0;
    if (uuid) memcpy(uuid, cu_devs[ordinal].uuid, 16);
    if (name && name_len) snprintf(name, name_len, "%s", cu_devs[ordinal].name);
    return 1;
}

int vkm_cuda_device_attributes(int ordinal, int *cc_major, int *cc_minor, int *sm_count)
{
    if (!vkm_cuda_available(NULL, 0) || ordinal < 0 || ordinal >= cu_count) return 0;
    *cc_major = cu_devs[ordinal].cc_major;
    *cc_minor = cu_devs[ordinal].cc_minor;
    *sm_count = cu_devs[ordinal].sm_count;
    return 1;
}

static void uuid_text(const uint8_t u[16], char out[37])
{
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static int cu_find(const uint8_t uuid[16])
{
    for (int i = 0; i < cu_count; i++)
        if (memcmp(cu_devs[i].uuid, uuid, 16) == 0) return i;
    return -1;
}

/* Distinct CUDA devices ia, ib with peer access both ways? */
static int peer_ok(int ia, int ib, const char *name_a, const char *name_b, char *reason, size_t reason_len)
{
    if (ia == ib) {
        snprintf(reason, reason_len, "'%s' and '%s' are the same CUDA device (%d); CUDA_PEER needs two GPUs",
                 name_a, name_b, ia);
        return 0;
    }
    int ab = 0, ba = 0;
    char t[256];
    vkm_CUresult r = cu.cuDeviceCanAccessPeer(&ab, cu_devs[ia].dev, cu_devs[ib].dev);
    if (r == VKM_CUDA_SUCCESS) r = cu.cuDeviceCanAccessPeer(&ba, cu_devs[ib].dev, cu_devs[ia].dev);
    if (r != VKM_CUDA_SUCCESS) {
        snprintf(reason, reason_len, "cuDeviceCanAccessPeer failed: %s", cu_text(r, t, sizeof t));
        return 0;
    }
    if (!ab || !ba) {
        snprintf(reason, reason_len,
                 "CUDA reports no peer access between '%s' (CUDA device %d) and '%s' (CUDA device %d): no NVLink "
                 "or PCIe peer-to-peer path",
                 name_a, ia, name_b, ib);
        return 0;
    }
    return 1;
}

int vkm_cuda_peer_check(const uint8_t uuid_a[16], const char *name_a, const uint8_t uuid_b[16],
                        const char *name_b, char *reason, size_t reason_len)
{
    char tmp[8];
    if (!reason || !reason_len) {
        reason = tmp;
        reason_len = sizeof tmp;
    }
    reason[0] = 0;
    if (!vkm_cuda_available(reason, reason_len)) return 0;
    const uint8_t *uuids[2] = {uuid_a, uuid_b};
    const char *names[2] = {name_a ? name_a : "the source device", name_b ? name_b : "the destination device"};
    int idx[2];
    for (int k = 0; k < 2; k++) {
        idx[k] = cu_find(uuids[k]);
        if (idx[k] < 0) {
            char u[37], seen[256] = "";
            uuid_text(uuids[k], u);
            for (int i = 0; i < cu_count && strlen(seen) < sizeof seen - 40; i++) {
                size_t len = strlen(seen);
                snprintf(seen + len, sizeof seen - len, "%s'%s'", i ? ", " : "", cu_devs[i].name);
            }
            const char *vis = getenv("CUDA_VISIBLE_DEVICES");
            snprintf(reason, reason_len,
                     "'%s' (deviceUUID %s) is not a CUDA device (CUDA sees %d: %s)%s%s", names[k], u, cu_count,
                     cu_count ? seen : "none", vis ? "; CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "");
            return 0;
        }
    }
    return peer_ok(idx[0], idx[1], names[0], names[1], reason, reason_len);
}

/* ---- the link -------------------------------------------------------------- */

typedef struct cu_job {
    vkm_jobq_item q; /* ticket; src_base, dst_base: the first timeline value the job signals, minus one */
    vkm_endpoint src, dst;
    VkDeviceSize size;
    VkDeviceSize *starts;         /* chunk c is [starts[c], starts[c + 1]) (vkm_plan_chunks) */
    uint32_t chunks;
    int src_k, dst_k;             /* endpoint copied by compute kernels (vkm_kcopy.h) */
} cu_job;

static void free_job(cu_job *j)
{
    free(j->starts);
    free(j);
}

/* One device's end: its Vulkan objects and their CUDA imports. */
typedef struct cu_side {
    vkm_device *dev;
    vkm_queue *queue;
    VkCommandPool pool;
    VkCommandBuffer *cmds;      /* ncmd */
    uint64_t *cmd_free_at;      /* `timeline` value after which cmds[i] may be re-recorded */
    VkSemaphore timeline;       /* signalled by this side's Vulkan copies: src_done / dst_ready */
    vkm_kcopy *kc;              /* compute-kernel copies; NULL: copy commands only */
    uint64_t submitted;         /* highest `timeline` value submitted to the queue */
    VkBuffer ring;
    VkDeviceMemory memory;
    int cu_index;
    vkm_CUcontext ctx;
    int ctx_retained;
    vkm_CUstream stream;
    vkm_CUexternalMemory ext_mem;
    vkm_CUdeviceptr ring_ptr;
    vkm_CUevent *events;        /* K; source: copied[s], destination: landed[s] */
    /* destination with a landing ring: the ring is CUDA memory imported into Vulkan */
    vkm_CUmemGenericAllocationHandle vmm;
    size_t vmm_size;
    int vmm_reserved, vmm_mapped;
} cu_side;

typedef struct cu_submit {
    VkSemaphore waits[1]; /* the endpoint's own wait (first chunk) */
    uint64_t wait_values[1];
    VkPipelineStageFlags stages[1];
    uint32_t nwait;
    VkCommandBuffer cmd;
    uint64_t signal;
    VkTimelineSemaphoreSubmitInfo tl;
} cu_submit;

struct vkm_cuda_link {
    vkm_cuda_link_config cfg;
    uint32_t K, ncmd;
    VkDeviceSize ring_bytes;
    cu_side src, dst;
    vkm_CUdeviceptr bounce;
    uint64_t *slot_free_at;  /* dst_ready value after which dst ring slot s may be rewritten */
    uint64_t chunk_counter;
    cu_submit *batch;        /* K: source submits being gathered */
    cu_submit *dst_recorded; /* ncmd: destination submits recorded ahead, by command buffer */
    VkSubmitInfo *infos;     /* K */
    /* the idle worker's watch over in-flight work */
    uint64_t seen_dst;
    struct timespec progress_at;

    vkm_jobq q;
    vkm_trace *trace;        /* NULL unless VKMULTI_TRACE is set */
    int landing;             /* 1: the peer copy lands in the destination ring itself (no bounce ring) */
    char ring_note[320];
    uint64_t kernel_bytes;   /* moved by compute kernels (both sides) */
};

#define TRY VKM_TRY

/* A failed CUDA call inside a push/pop pair: note it and leave through `out`. */
#define CU_GO(expr, name)                                                      \
    do {                                                                       \
        vkm_CUresult cr_ = (expr);                                             \
        if (cr_ != VKM_CUDA_SUCCESS) {                                         \
            r = cu_fail(msg, msgn, name, cr_);                                 \
            if (call) *call = name;                                            \
            goto out;                                                          \
        }                                                                      \
    } while (0)

static VkResult cu_fail(char *msg, size_t msgn, const char *what, vkm_CUresult cr)
{
    char t[256];
    if (msg && msgn) snprintf(msg, msgn, "%s failed: %s", what, cu_text(cr, t, sizeof t));
    return VKM_ERROR_CUDA;
}

static VkResult cu_push(vkm_CUcontext ctx, const char **call, char *msg, size_t msgn)
{
    vkm_CUresult cr = cu.cuCtxPushCurrent(ctx);
    if (cr == VKM_CUDA_SUCCESS) return VK_SUCCESS;
    if (call) *call = "cuCtxPushCurrent";
    return cu_fail(msg, msgn, "cuCtxPushCurrent", cr);
}

static void cu_pop(void)
{
    vkm_CUcontext popped;
    cu.cuCtxPopCurrent(&popped);
}

static uint64_t elapsed_ns(const struct timespec *a, const struct timespec *b)
{
    int64_t ns = (int64_t)(b->tv_sec - a->tv_sec) * 1000000000ll + (b->tv_nsec - a->tv_nsec);
    return ns > 0 ? (uint64_t)ns : 0;
}

static void now(struct timespec *t)
{
    clock_gettime(CLOCK_MONOTONIC, t);
}

/* VK_SUCCESS while neither CUDA stream has failed; else the stream's error. */
static VkResult stream_errors(vkm_cuda_link *l, const char **call, char *msg, size_t msgn)
{
    cu_side *sides[2] = {&l->src, &l->dst};
    for (int i = 0; i < 2; i++) {
        VkResult r = cu_push(sides[i]->ctx, call, msg, msgn);
        if (r != VK_SUCCESS) return r;
        vkm_CUresult cr = cu.cuStreamQuery(sides[i]->stream);
        cu_pop();
        if (cr != VKM_CUDA_SUCCESS && cr != VKM_CUDA_ERROR_NOT_READY) {
            char t[256];
            if (msg && msgn)
                snprintf(msg, msgn, "the CUDA stream on the %s GPU failed: %s", i ? "destination" : "source",
                         cu_text(cr, t, sizeof t));
            if (call) *call = "cuStreamQuery";
            return VKM_ERROR_CUDA;
        }
    }
    return VK_SUCCESS;
}

/* VK_SUCCESS when `ev` (recorded in side `s`'s context) has completed, VK_NOT_READY
 * while it has not, else the CUDA failure. */
static VkResult event_state(cu_side *s, vkm_CUevent ev, const char **call, char *msg, size_t msgn)
{
    VkResult r = cu_push(s->ctx, call, msg, msgn);
    if (r != VK_SUCCESS) return r;
    vkm_CUresult cr = cu.cuEventQuery(ev);
    cu_pop();
    if (cr == VKM_CUDA_SUCCESS) return VK_SUCCESS;
    if (cr == VKM_CUDA_ERROR_NOT_READY) return VK_NOT_READY;
    if (call) *call = "cuEventQuery";
    return cu_fail(msg, msgn, "cuEventQuery", cr);
}

/* ---- Vulkan objects -------------------------------------------------------- */

static void device_identity(VkPhysicalDevice pd, uint8_t uuid[16], char *name, size_t name_len)
{
    VkPhysicalDeviceIDProperties id = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
    VkPhysicalDeviceProperties2 p = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &id};
    vkGetPhysicalDeviceProperties2(pd, &p);
    memcpy(uuid, id.deviceUUID, 16);
    snprintf(name, name_len, "%s", p.properties.deviceName);
}

static int buffer_exportable(VkPhysicalDevice pd)
{
    VkPhysicalDeviceExternalBufferInfo info = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_BUFFER_INFO,
        .usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
        .handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT,
    };
    VkExternalBufferProperties props = {.sType = VK_STRUCTURE_TYPE_EXTERNAL_BUFFER_PROPERTIES};
    vkGetPhysicalDeviceExternalBufferProperties(pd, &info, &props);
    return (props.externalMemoryProperties.externalMemoryFeatures & VK_EXTERNAL_MEMORY_FEATURE_EXPORTABLE_BIT) != 0;
}

static VkResult make_timeline(vkm_device *d, VkSemaphore *out)
{
    VkSemaphoreTypeCreateInfo type = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
                                      .semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE,
                                      .initialValue = 0};
    VkSemaphoreCreateInfo info = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, .pNext = &type};
    return d->fn.vkCreateSemaphore(d->device, &info, NULL, out);
}

/* The side's ring buffer, of memory shared with CUDA through an opaque fd. */
static VkResult make_ring_buffer(vkm_cuda_link *l, cu_side *s)
{
    VkExternalMemoryBufferCreateInfo ext = {.sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
                                            .handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT};
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                             .pNext = &ext,
                             .size = l->ring_bytes,
                             .usage = RING_USAGE,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = s->dev->fn.vkCreateBuffer(s->dev->device, &bi, NULL, &s->ring);
    if (r != VK_SUCCESS) s->ring = VK_NULL_HANDLE;
    return r;
}

/* The side's ring: one dedicated, exportable, device-local buffer, imported into
 * CUDA on the same GPU and mapped once. */
static VkResult make_ring(vkm_cuda_link *l, cu_side *s, const char **call, char *msg, size_t msgn)
{
    vkm_device *d = s->dev;
    const VkExternalMemoryHandleTypeFlagBits type = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
    TRY(make_ring_buffer(l, s), "vkCreateBuffer(CUDA ring)");
    VkMemoryRequirements req;
    d->fn.vkGetBufferMemoryRequirements(d->device, s->ring, &req);
    int mt = vkm_find_memory_type(d, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
    if (mt < 0) {
        if (call) *call = "vkm_find_memory_type(device-local, exportable)";
        return VK_ERROR_FEATURE_NOT_PRESENT;
    }
    VkMemoryDedicatedAllocateInfo ded = {.sType = VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO,
                                         .buffer = s->ring};
    VkExportMemoryAllocateInfo exp = {.sType = VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO,
                                      .pNext = &ded,
                                      .handleTypes = type};
    VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                  .pNext = &exp,
                                  .allocationSize = req.size,
                                  .memoryTypeIndex = (uint32_t)mt};
    TRY(d->fn.vkAllocateMemory(d->device, &alloc, NULL, &s->memory), "vkAllocateMemory(CUDA ring)");
    TRY(d->fn.vkBindBufferMemory(d->device, s->ring, s->memory, 0), "vkBindBufferMemory(CUDA ring)");
    VkMemoryGetFdInfoKHR gfd = {.sType = VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR,
                                .memory = s->memory,
                                .handleType = type};
    int fd = -1;
    TRY(d->fn.vkGetMemoryFdKHR(d->device, &gfd, &fd), "vkGetMemoryFdKHR(CUDA ring)");

    vkm_CUDA_EXTERNAL_MEMORY_HANDLE_DESC desc;
    memset(&desc, 0, sizeof desc);
    desc.type = VKM_CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
    desc.handle.fd = fd;
    desc.size = req.size; /* the whole allocation, as Vulkan made it */
    desc.flags = VKM_CUDA_EXTERNAL_MEMORY_DEDICATED;
    VkResult r = cu_push(s->ctx, call, msg, msgn);
    if (r != VK_SUCCESS) {
        close(fd);
        return r;
    }
    vkm_CUresult cr = cu.cuImportExternalMemory(&s->ext_mem, &desc);
    if (cr != VKM_CUDA_SUCCESS) {
        close(fd); /* ownership passes to CUDA only on success */
        s->ext_mem = NULL;
        r = cu_fail(msg, msgn, "cuImportExternalMemory(opaque fd)", cr);
        if (call) *call = "cuImportExternalMemory";
        goto out;
    }
    vkm_CUDA_EXTERNAL_MEMORY_BUFFER_DESC bd;
    memset(&bd, 0, sizeof bd);
    bd.offset = 0;
    bd.size = l->ring_bytes;
    CU_GO(cu.cuExternalMemoryGetMappedBuffer(&s->ring_ptr, s->ext_mem, &bd), "cuExternalMemoryGetMappedBuffer");
out:
    cu_pop();
    return r;
}

static VkResult make_cmds(cu_side *s, uint32_t n, const char **call)
{
    vkm_device *d = s->dev;
    VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                  .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                  .queueFamilyIndex = s->queue->family};
    TRY(d->fn.vkCreateCommandPool(d->device, &pi, NULL, &s->pool), "vkCreateCommandPool");
    s->cmds = calloc(n, sizeof(VkCommandBuffer));
    s->cmd_free_at = calloc(n, sizeof(uint64_t));
    if (!s->cmds || !s->cmd_free_at) {
        if (call) *call = "calloc(command buffers)";
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    }
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = s->pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = n};
    TRY(d->fn.vkAllocateCommandBuffers(d->device, &ai, s->cmds), "vkAllocateCommandBuffers");
    return VK_SUCCESS;
}

/* Streams and events of a side, in its context. */
static VkResult make_stream(cu_side *s, uint32_t K, const char **call, char *msg, size_t msgn)
{
    s->events = calloc(K, sizeof(vkm_CUevent));
    if (!s->events) {
        if (call) *call = "calloc(events)";
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    }
    VkResult r = cu_push(s->ctx, call, msg, msgn);
    if (r != VK_SUCCESS) return r;
    CU_GO(cu.cuStreamCreate(&s->stream, VKM_CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    for (uint32_t i = 0; i < K; i++)
        CU_GO(cu.cuEventCreate(&s->events[i], VKM_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
out:
    cu_pop();
    return r;
}

static VkResult enable_peer(vkm_CUcontext from, vkm_CUcontext to, const char **call, char *msg, size_t msgn)
{
    VkResult r = cu_push(from, call, msg, msgn);
    if (r != VK_SUCCESS) return r;
    vkm_CUresult cr = cu.cuCtxEnablePeerAccess(to, 0);
    cu_pop();
    if (cr == VKM_CUDA_SUCCESS || cr == VKM_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return VK_SUCCESS;
    if (call) *call = "cuCtxEnablePeerAccess";
    return cu_fail(msg, msgn, "cuCtxEnablePeerAccess", cr);
}

/* Undo make_landing (Vulkan's import first, then CUDA's allocation). */
static void free_landing(cu_side *s)
{
    vkm_device *d = s->dev;
    if (s->ring) d->fn.vkDestroyBuffer(d->device, s->ring, NULL);
    if (s->memory) d->fn.vkFreeMemory(d->device, s->memory, NULL);
    s->ring = VK_NULL_HANDLE;
    s->memory = VK_NULL_HANDLE;
    if (s->vmm_reserved && cu_push(s->ctx, NULL, NULL, 0) == VK_SUCCESS) {
        if (s->vmm_mapped) cu.cuMemUnmap(s->ring_ptr, s->vmm_size);
        cu.cuMemAddressFree(s->ring_ptr, s->vmm_size);
        cu_pop();
    }
    if (s->vmm) cu.cuMemRelease(s->vmm);
    s->vmm = 0;
    s->vmm_mapped = s->vmm_reserved = 0;
    s->ring_ptr = 0;
}

/* The destination's landing ring: device memory CUDA allocates on the
 * destination GPU (readable and writable by both GPUs), exported as a POSIX fd
 * and imported into Vulkan there. The peer copy writes it directly, with no
 * bounce ring and no CUDA work on the destination GPU: CUDA's local copy there
 * would take turns on the GPU with the destination's Vulkan copies. On
 * failure everything is undone and the reason is in `msg`. */
static VkResult make_landing(vkm_cuda_link *l, cu_side *s, const char **call, char *msg, size_t msgn)
{
    vkm_device *d = s->dev;
    vkm_CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = VKM_CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = VKM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = VKM_CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = cu_devs[s->cu_index].dev;
    vkm_CUmemAccessDesc access[2];
    memset(access, 0, sizeof access);
    access[0].location = prop.location;
    access[1].location.type = VKM_CU_MEM_LOCATION_TYPE_DEVICE;
    access[1].location.id = cu_devs[l->src.cu_index].dev;
    access[0].flags = access[1].flags = VKM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    int fd = -1;
    VkResult r = cu_push(s->ctx, call, msg, msgn);
    if (r != VK_SUCCESS) return r;
    size_t gran = 0;
    CU_GO(cu.cuMemGetAllocationGranularity(&gran, &prop, VKM_CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    if (!gran) gran = 2 << 20;
    s->vmm_size = ((size_t)l->ring_bytes + gran - 1) / gran * gran;
    CU_GO(cu.cuMemCreate(&s->vmm, s->vmm_size, &prop, 0), "cuMemCreate(landing ring)");
    CU_GO(cu.cuMemAddressReserve(&s->ring_ptr, s->vmm_size, 0, 0, 0), "cuMemAddressReserve");
    s->vmm_reserved = 1;
    CU_GO(cu.cuMemMap(s->ring_ptr, s->vmm_size, 0, s->vmm, 0), "cuMemMap");
    s->vmm_mapped = 1;
    CU_GO(cu.cuMemSetAccess(s->ring_ptr, s->vmm_size, access, 2), "cuMemSetAccess(both GPUs)");
    CU_GO(cu.cuMemExportToShareableHandle(&fd, s->vmm, VKM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle(POSIX fd)");
out:
    cu_pop();
    const VkExternalMemoryHandleTypeFlagBits type = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
    if (r == VK_SUCCESS) {
        r = make_ring_buffer(l, s);
        if (r != VK_SUCCESS) snprintf(msg, msgn, "vkCreateBuffer(landing ring) failed: VkResult %d", (int)r);
    }
    if (r == VK_SUCCESS) {
        VkMemoryRequirements req;
        d->fn.vkGetBufferMemoryRequirements(d->device, s->ring, &req);
        int mt = vkm_find_memory_type(d, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
        if (mt < 0 || req.size > s->vmm_size) {
            snprintf(msg, msgn, "the landing ring's buffer needs %llu B of memory types 0x%x; CUDA exported %zu B",
                     (unsigned long long)req.size, req.memoryTypeBits, s->vmm_size);
            r = VK_ERROR_FEATURE_NOT_PRESENT;
        } else {
            VkImportMemoryFdInfoKHR imp = {.sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR,
                                           .handleType = type,
                                           .fd = fd};
            VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                          .pNext = &imp,
                                          .allocationSize = s->vmm_size,
                                          .memoryTypeIndex = (uint32_t)mt};
            r = d->fn.vkAllocateMemory(d->device, &alloc, NULL, &s->memory);
            if (r == VK_SUCCESS) {
                fd = -1; /* Vulkan owns it now */
                r = d->fn.vkBindBufferMemory(d->device, s->ring, s->memory, 0);
                if (r != VK_SUCCESS) snprintf(msg, msgn, "vkBindBufferMemory(landing ring) failed: VkResult %d", (int)r);
            } else {
                s->memory = VK_NULL_HANDLE;
                snprintf(msg, msgn, "Vulkan cannot import CUDA's exported memory (vkAllocateMemory with "
                         "VkImportMemoryFdInfoKHR: VkResult %d)", (int)r);
            }
        }
        if (r != VK_SUCCESS && call) *call = "vkAllocateMemory(landing ring)";
    }
    if (fd >= 0) close(fd);
    if (r != VK_SUCCESS) free_landing(s);
    return r;
}

static VkResult link_setup(vkm_cuda_link *l, const char **call, char *msg, size_t msgn)
{
    cu_side *sides[2] = {&l->src, &l->dst};
    for (int i = 0; i < 2; i++) {
        cu_side *s = sides[i];
        vkm_CUresult cr = cu.cuDevicePrimaryCtxRetain(&s->ctx, cu_devs[s->cu_index].dev);
        if (cr != VKM_CUDA_SUCCESS) {
            if (call) *call = "cuDevicePrimaryCtxRetain";
            return cu_fail(msg, msgn, "cuDevicePrimaryCtxRetain", cr);
        }
        s->ctx_retained = 1;
    }
    VkResult r = enable_peer(l->src.ctx, l->dst.ctx, call, msg, msgn);
    if (r == VK_SUCCESS) r = enable_peer(l->dst.ctx, l->src.ctx, call, msg, msgn);
    for (int i = 0; i < 2 && r == VK_SUCCESS; i++) {
        r = make_cmds(sides[i], l->ncmd, call);
        if (r == VK_SUCCESS) r = make_stream(sides[i], l->K, call, msg, msgn);
        if (r == VK_SUCCESS) {
            /* without kernels (no compute on the family, pipelines refused) copy commands do it all */
            VkResult kr = vkm_kcopy_create(sides[i]->dev, sides[i]->queue->family, l->ncmd, &sides[i]->kc, NULL);
            if (kr == VK_ERROR_OUT_OF_HOST_MEMORY) r = kr;
        }
    }
    if (r == VK_SUCCESS) r = make_ring(l, &l->src, call, msg, msgn);
    if (r == VK_SUCCESS) TRY(make_timeline(l->src.dev, &l->src.timeline), "vkCreateSemaphore(timeline)");
    if (r == VK_SUCCESS) TRY(make_timeline(l->dst.dev, &l->dst.timeline), "vkCreateSemaphore(timeline)");
    if (r != VK_SUCCESS) return r;
    /* the destination ring: a landing ring; else (the drivers refuse) Vulkan
     * memory imported into CUDA, fed by a CUDA bounce ring and a local copy */
    char why[256] = "";
    const char *c = NULL;
    if (l->cfg.no_landing) {
        snprintf(why, sizeof why, "not asked for");
        r = VK_ERROR_FEATURE_NOT_PRESENT;
    } else {
        r = make_landing(l, &l->dst, &c, why, sizeof why);
    }
    if (r == VK_SUCCESS) {
        l->landing = 1;
        snprintf(l->ring_note, sizeof l->ring_note,
                 "landing ring: CUDA memory on the destination GPU imported into Vulkan; one NVLink copy per chunk, "
                 "no CUDA work on the destination GPU");
        return VK_SUCCESS;
    }
    if (r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_DEVICE_LOST) {
        if (call) *call = c;
        snprintf(msg, msgn, "%s", why);
        return r;
    }
    if (!why[0]) snprintf(why, sizeof why, "%s failed (VkResult %d)", c ? c : "?", (int)r);
    snprintf(l->ring_note, sizeof l->ring_note,
             "bounce ring: NVLink copy into CUDA memory, then a local copy into Vulkan memory (no landing ring: %s)",
             why);
    r = make_ring(l, &l->dst, call, msg, msgn);
    if (r != VK_SUCCESS) return r;
    r = cu_push(l->dst.ctx, call, msg, msgn);
    if (r != VK_SUCCESS) return r;
    CU_GO(cu.cuMemAlloc(&l->bounce, (size_t)l->ring_bytes), "cuMemAlloc(bounce ring)");
out:
    cu_pop();
    return r;
}

static void *cu_worker(void *arg);

VkResult vkm_cuda_link_create(vkm_device *src, vkm_queue *src_queue, vkm_device *dst, vkm_queue *dst_queue,
                              const vkm_cuda_link_config *config, vkm_cuda_link **out, const char **call,
                              char *msg, size_t msgn)
{
    char scratch[8];
    if (!msg || !msgn) {
        msg = scratch;
        msgn = sizeof scratch;
    }
    msg[0] = 0;
    if (out) *out = NULL;
    if (!out || !src || !dst || !src_queue || !dst_queue || !config || config->slot_count < 1 ||
        config->slot_size < 1 || config->slot_count > 4096 || config->slot_size > ((VkDeviceSize)1 << 40)) {
        if (call) *call = "vkm_cuda_link_create(arguments)";
        return VK_ERROR_INITIALIZATION_FAILED;
    }
    if (src->device == dst->device) {
        snprintf(msg, msgn, "source and destination are the same VkDevice; CUDA_PEER moves data between two GPUs");
        return VKM_ERROR_CUDA_UNSUPPORTED;
    }
    if (!vkm_cuda_available(msg, msgn)) return VKM_ERROR_CUDA_UNSUPPORTED;
    vkm_device *devs[2] = {src, dst};
    uint8_t uuid[2][16];
    char name[2][VK_MAX_PHYSICAL_DEVICE_NAME_SIZE];
    for (int i = 0; i < 2; i++) {
        device_identity(devs[i]->physical, uuid[i], name[i], sizeof name[i]);
        if (!devs[i]->has_external_memory_fd || !devs[i]->fn.vkGetMemoryFdKHR) {
            snprintf(msg, msgn, "VK_KHR_external_memory_fd is not enabled on '%s'", name[i]);
            return VKM_ERROR_CUDA_UNSUPPORTED;
        }
        if (!buffer_exportable(devs[i]->physical)) {
            snprintf(msg, msgn, "'%s' cannot export buffer memory as an opaque fd", name[i]);
            return VKM_ERROR_CUDA_UNSUPPORTED;
        }
    }
    int ordinal[2] = {config->cuda_ordinals[0], config->cuda_ordinals[1]};
    if (ordinal[0] < 0 || ordinal[1] < 0) { /* the usual way: by deviceUUID */
        if (!vkm_cuda_peer_check(uuid[0], name[0], uuid[1], name[1], msg, msgn)) return VKM_ERROR_CUDA_UNSUPPORTED;
        ordinal[0] = cu_find(uuid[0]);
        ordinal[1] = cu_find(uuid[1]);
    } else {
        if (ordinal[0] >= cu_count || ordinal[1] >= cu_count) {
            snprintf(msg, msgn, "CUDA devices %d and %d were asked for; CUDA sees %d", ordinal[0], ordinal[1],
                     cu_count);
            return VKM_ERROR_CUDA_UNSUPPORTED;
        }
        if (!peer_ok(ordinal[0], ordinal[1], name[0], name[1], msg, msgn)) return VKM_ERROR_CUDA_UNSUPPORTED;
    }

    vkm_cuda_link *l = calloc(1, sizeof(*l));
    if (!l) return VK_ERROR_OUT_OF_HOST_MEMORY;
    l->cfg = *config;
    if (!l->cfg.stall_timeout_ns) l->cfg.stall_timeout_ns = 30ull * 1000000000ull;
    if (l->cfg.ramps < 0) l->cfg.ramps = DEFAULT_RAMPS;
    if (!l->cfg.src_batch) l->cfg.src_batch = DEFAULT_SRC_BATCH;
    l->cfg.slot_size = (l->cfg.slot_size + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
    l->K = l->cfg.slot_count;
    l->ncmd = 2 * l->K; /* the worker may record a whole ring ahead of the GPU */
    l->ring_bytes = l->cfg.slot_size * l->K;
    l->src.dev = src;
    l->src.queue = src_queue;
    l->src.cu_index = ordinal[0];
    l->dst.dev = dst;
    l->dst.queue = dst_queue;
    l->dst.cu_index = ordinal[1];
    vkm_jobq_init(&l->q);
    l->slot_free_at = calloc(l->K, sizeof(uint64_t));
    l->batch = calloc(l->K, sizeof(cu_submit));
    l->dst_recorded = calloc(2 * l->K, sizeof(cu_submit));
    l->infos = calloc(l->K, sizeof(VkSubmitInfo));
    VkResult r = VK_SUCCESS;
    if (!l->slot_free_at || !l->batch || !l->dst_recorded || !l->infos) {
        r = VK_ERROR_OUT_OF_HOST_MEMORY;
        if (call) *call = "calloc(CUDA link)";
    }
    if (r == VK_SUCCESS) r = link_setup(l, call, msg, msgn);
    if (r == VK_SUCCESS)
        l->trace = vkm_trace_link("cuda_peer", l->src.dev, l->src.timeline, l->dst.dev, l->dst.timeline);
    if (r == VK_SUCCESS) r = vkm_jobq_start(&l->q, cu_worker, l, call);
    if (r != VK_SUCCESS) {
        vkm_cuda_link_destroy(l);
        return r;
    }
    *out = l;
    return VK_SUCCESS;
}

/* Wait (bounded) until both GPUs and both streams are done with everything
 * submitted: 1 when they are, 0 when something is still running. */
static int drain(vkm_cuda_link *l)
{
    int ok = 1;
    cu_side *sides[2] = {&l->src, &l->dst};
    for (int i = 0; i < 2; i++) {
        cu_side *s = sides[i];
        if (s->timeline && s->submitted &&
            vkm_wait_timeline(s->dev, s->timeline, s->submitted, l->cfg.stall_timeout_ns) == VK_TIMEOUT)
            ok = 0;
    }
    for (int i = 0; i < 2; i++) {
        cu_side *s = sides[i];
        if (!s->stream || cu_push(s->ctx, NULL, NULL, 0) != VK_SUCCESS) continue;
        struct timespec t0, t;
        now(&t0);
        for (;;) {
            vkm_CUresult cr = cu.cuStreamQuery(s->stream);
            if (cr != VKM_CUDA_ERROR_NOT_READY) break; /* done, or the context is dead */
            now(&t);
            if (elapsed_ns(&t0, &t) >= l->cfg.stall_timeout_ns) {
                ok = 0;
                break;
            }
            struct timespec nap = {0, 100000};
            nanosleep(&nap, NULL);
        }
        cu_pop();
    }
    return ok;
}

static void free_cuda(cu_side *s, uint32_t K, vkm_CUdeviceptr *bounce)
{
    if (!s->ctx_retained) return;
    if (cu_push(s->ctx, NULL, NULL, 0) == VK_SUCCESS) {
        for (uint32_t i = 0; s->events && i < K; i++)
            if (s->events[i]) {
                cu.cuEventDestroy(s->events[i]);
                s->events[i] = NULL;
            }
        if (s->stream) cu.cuStreamDestroy(s->stream);
        if (bounce && *bounce) cu.cuMemFree(*bounce);
        if (s->ring_ptr) cu.cuMemFree(s->ring_ptr);
        if (s->ext_mem) cu.cuDestroyExternalMemory(s->ext_mem);
        cu_pop();
    }
    s->stream = NULL;
    s->ring_ptr = 0;
    s->ext_mem = NULL;
    if (bounce) *bounce = 0;
    cu.cuDevicePrimaryCtxRelease(cu_devs[s->cu_index].dev);
    s->ctx_retained = 0;
}

static void free_vulkan(cu_side *s, uint32_t ncmd)
{
    vkm_device *d = s->dev;
    if (!d) return;
    if (s->cmds && s->pool && s->cmds[0]) d->fn.vkFreeCommandBuffers(d->device, s->pool, ncmd, s->cmds);
    if (s->pool) d->fn.vkDestroyCommandPool(d->device, s->pool, NULL);
    if (s->ring) d->fn.vkDestroyBuffer(d->device, s->ring, NULL);
    if (s->memory) d->fn.vkFreeMemory(d->device, s->memory, NULL);
    if (s->timeline) d->fn.vkDestroySemaphore(d->device, s->timeline, NULL);
}

void vkm_cuda_link_destroy(vkm_cuda_link *l)
{
    if (!l) return;
    vkm_jobq_stop(&l->q);
    int drained = drain(l);
    vkm_trace_close(l->trace); /* its poller reads the semaphores freed below */
    l->trace = NULL;
    if (drained) {
        /* CUDA's imports go before the Vulkan memory and semaphores they map */
        vkm_kcopy_destroy(l->src.kc);
        vkm_kcopy_destroy(l->dst.kc);
        free_cuda(&l->src, l->K, NULL);
        if (l->landing) free_landing(&l->dst); /* Vulkan's import, then CUDA's memory */
        free_cuda(&l->dst, l->K, &l->bounce);
        free_vulkan(&l->src, l->ncmd);
        free_vulkan(&l->dst, l->ncmd);
    }
    /* else a GPU is stuck on this link's work: its memory, semaphores and CUDA
     * objects are left alive (leaked) rather than freed under a running copy */
    free(l->src.cmds);
    free(l->src.cmd_free_at);
    free(l->src.events);
    free(l->dst.cmds);
    free(l->dst.cmd_free_at);
    free(l->dst.events);
    free(l->slot_free_at);
    free(l->batch);
    free(l->dst_recorded);
    free(l->infos);
    for (vkm_jobq_item *it = vkm_jobq_destroy(&l->q), *next; it; it = next) {
        next = it->next;
        free_job((cu_job *)it);
    }
    free(l);
}

VkSemaphore vkm_cuda_link_src_timeline(const vkm_cuda_link *l) { return l->src.timeline; }
VkSemaphore vkm_cuda_link_dst_timeline(const vkm_cuda_link *l) { return l->dst.timeline; }
VkDeviceSize vkm_cuda_link_slot_size(const vkm_cuda_link *l) { return l->cfg.slot_size; }
const char *vkm_cuda_link_ring_note(const vkm_cuda_link *l) { return l->ring_note; }
uint64_t vkm_cuda_link_kernel_bytes(const vkm_cuda_link *l) { return __atomic_load_n(&l->kernel_bytes, __ATOMIC_RELAXED); }
const char *vkm_cuda_link_message(const vkm_cuda_link *l) { return l->q.message; }

/* ---- jobs ------------------------------------------------------------------ */

VkResult vkm_cuda_link_submit(vkm_cuda_link *l, const vkm_endpoint *src, const vkm_endpoint *dst,
                              VkDeviceSize size, uint64_t *ticket, uint64_t *src_done, uint64_t *dst_ready,
                              const char **call)
{
    if (size == 0) {
        if (call) *call = "vkm_cuda_link_submit(size 0)";
        return VK_ERROR_INITIALIZATION_FAILED;
    }
    if ((src->owner && src->owner->family != l->src.queue->family) ||
        (dst->owner && dst->owner->family != l->dst.queue->family)) {
        if (call) *call = "vkm_cuda_link_submit(endpoint owned by another queue family than the link's queue)";
        return VK_ERROR_FEATURE_NOT_PRESENT;
    }
    /* about TARGET_CHUNKS chunks per job, none under MIN_CHUNK, none over a slot */
    VkDeviceSize chunk = (size + TARGET_CHUNKS - 1) / TARGET_CHUNKS;
    if (chunk < MIN_CHUNK) chunk = MIN_CHUNK;
    chunk = (chunk + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
    if (chunk > l->cfg.slot_size) chunk = l->cfg.slot_size;
    const vkm_endpoint *imgs[2] = {src, dst};
    VkDeviceSize row = 0;
    for (int i = 0; i < 2; i++) {
        const vkm_endpoint *e = imgs[i];
        if (!e->image) continue;
        VkDeviceSize r = (VkDeviceSize)e->width * e->bytes_per_pixel;
        if (r == 0 || r > l->cfg.slot_size || size % r != 0 || size / r > e->height || (row && r != row)) {
            if (call) *call = "vkm_cuda_link_submit(image rows do not fit the size or a ring slot)";
            return VK_ERROR_FORMAT_NOT_SUPPORTED;
        }
        row = r;
    }
    if (row) { /* chunks are whole rows */
        chunk = chunk / row * row;
        if (chunk < row) chunk = row;
    }
    if ((size + chunk - 1) / chunk >= (VkDeviceSize)UINT32_MAX / 2) {
        if (call) *call = "vkm_cuda_link_submit(too many chunks)";
        return VK_ERROR_INITIALIZATION_FAILED;
    }
    cu_job *j = calloc(1, sizeof(*j));
    if (!j) return VK_ERROR_OUT_OF_HOST_MEMORY;
    j->src = *src;
    j->dst = *dst;
    j->size = size;
    j->starts = vkm_plan_chunks(size, chunk, row ? row : SLOT_ALIGN, l->cfg.ramps, &j->chunks);
    if (!j->starts) {
        free(j);
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    }

    /* from here on the worker owns `j` (it may already have freed it) */
    VkResult r = vkm_jobq_push(&l->q, &j->q, j->chunks, j->chunks, ticket, src_done, dst_ready, call);
    if (r != VK_SUCCESS) {
        free_job(j);
        return r;
    }
    vkm_trace_mark(l->trace, "submit", *ticket);
    return VK_SUCCESS;
}

VkResult vkm_cuda_link_wait_submitted(vkm_cuda_link *l, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns,
                                      const char **call)
{
    return vkm_jobq_wait_submitted(&l->q, ticket, dst_ready, timeout_ns, call);
}

VkResult vkm_cuda_link_poll(vkm_cuda_link *l, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns,
                            const char **call)
{
    VkResult r = vkm_jobq_poll(&l->q, l->dst.dev, l->dst.timeline, ticket, dst_ready, timeout_ns, l->cfg.spin_ns,
                               call);
    if (r == VK_SUCCESS) vkm_trace_mark(l->trace, "waited", ticket);
    return r;
}

/* ---- the worker ------------------------------------------------------------ */

/* The link failed at `ticket` (UINT64_MAX: in flight, no job of its own); so
 * did every job whose dst_ready lies above the value reached now. Once the
 * GPUs finished what they were given, GPU waiters on those points are released. */
static void fail(vkm_cuda_link *l, VkResult r, const char *call, const char *msg, uint64_t ticket)
{
    uint64_t v = 0;
    if (vkm_timeline_value(l->dst.dev, l->dst.timeline, &v) != VK_SUCCESS) v = 0;
    vkm_jobq_fail(&l->q, r, call ? call : "CUDA_PEER link", msg, ticket, v);
    vkm_jobq_release(&l->q, l->src.dev, l->src.timeline, l->src.submitted, l->dst.dev, l->dst.timeline,
                     l->dst.submitted, l->cfg.stall_timeout_ns);
}

/* The endpoint goes into (entering) or out of the copy: layouts, and ordering
 * against whatever else touches it. The destination is overwritten whole, so
 * its old contents are discarded (UNDEFINED). */
static void endpoint_barrier(vkm_device *d, VkCommandBuffer cmd, const vkm_endpoint *e, VkDeviceSize size,
                             int is_src, int entering, int kernel)
{
    VkAccessFlags any = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT;
    VkAccessFlags xacc = is_src ? VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_SHADER_READ_BIT
                                : VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    VkImageLayout xfer = kernel ? VKM_KCOPY_IMAGE_LAYOUT
                                : is_src ? VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL : VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL;
    VkPipelineStageFlags ss = entering ? VK_PIPELINE_STAGE_ALL_COMMANDS_BIT : VKM_KCOPY_STAGES;
    VkPipelineStageFlags ds = entering ? VKM_KCOPY_STAGES : VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
    if (e->image) {
        VkImageMemoryBarrier b = {
            .sType = VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER,
            .srcAccessMask = entering ? any : xacc,
            .dstAccessMask = entering ? xacc : any,
            .oldLayout = entering ? (is_src ? e->layout_before : VK_IMAGE_LAYOUT_UNDEFINED) : xfer,
            .newLayout = entering ? xfer : e->layout_after,
            .srcQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED,
            .dstQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED,
            .image = e->image,
            .subresourceRange = {VK_IMAGE_ASPECT_COLOR_BIT, e->mip_level, 1, e->array_layer, 1},
        };
        d->fn.vkCmdPipelineBarrier(cmd, ss, ds, 0, 0, NULL, 0, NULL, 1, &b);
    } else {
        VkBufferMemoryBarrier b = {
            .sType = VK_STRUCTURE_TYPE_BUFFER_MEMORY_BARRIER,
            .srcAccessMask = entering ? any : xacc,
            .dstAccessMask = entering ? xacc : any,
            .srcQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED,
            .dstQueueFamilyIndex = VK_QUEUE_FAMILY_IGNORED,
            .buffer = e->buffer,
            .offset = e->offset,
            .size = size,
        };
        d->fn.vkCmdPipelineBarrier(cmd, ss, ds, 0, 0, NULL, 1, &b, 0, NULL);
    }
}

/* The ring slot goes to CUDA (release to the external queue family, after the
 * copy or kernel wrote it) or comes from CUDA (acquire, before it is read). */
static void ring_barrier(cu_side *s, VkCommandBuffer cmd, VkDeviceSize offset, VkDeviceSize size, int release)
{
    uint32_t family = s->queue->family;
    VkBufferMemoryBarrier b = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_MEMORY_BARRIER,
        .srcAccessMask = release ? VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT : 0,
        .dstAccessMask = release ? 0 : VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_SHADER_READ_BIT,
        .srcQueueFamilyIndex = release ? family : VK_QUEUE_FAMILY_EXTERNAL,
        .dstQueueFamilyIndex = release ? VK_QUEUE_FAMILY_EXTERNAL : family,
        .buffer = s->ring,
        .offset = offset,
        .size = size,
    };
    s->dev->fn.vkCmdPipelineBarrier(cmd, release ? VKM_KCOPY_STAGES : VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT,
                                    release ? VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT : VKM_KCOPY_STAGES,
                                    0, 0, NULL, 1, &b, 0, NULL);
}

static VkDeviceSize chunk_len(const cu_job *j, uint32_t c)
{
    return j->starts[c + 1] - j->starts[c];
}

/* Copy chunk `c` of the job between endpoint `e` and the side's ring at `slot_offset`. */
static void record_copy(vkm_cuda_link *l, cu_side *s, VkCommandBuffer cmd, uint32_t set, const cu_job *j,
                        uint32_t c, VkDeviceSize slot_offset, int to_ring)
{
    const vkm_endpoint *e = to_ring ? &j->src : &j->dst;
    if (to_ring ? j->src_k : j->dst_k) {
        VkDeviceSize n = vkm_kcopy_record(s->kc, cmd, set, e, s->ring, slot_offset, j->starts[c], chunk_len(j, c),
                                          to_ring);
        __atomic_fetch_add(&l->kernel_bytes, n, __ATOMIC_RELAXED);
    } else {
        vkm_record_chunk(s->dev, cmd, e, s->ring, slot_offset, j->starts[c], chunk_len(j, c), to_ring);
    }
}

static void add_wait(cu_submit *b, VkSemaphore sem, uint64_t value)
{
    b->waits[b->nwait] = sem;
    b->wait_values[b->nwait] = value;
    b->stages[b->nwait] = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
    b->nwait++;
}

static void submit_info(cu_submit *b, cu_side *s, VkSubmitInfo *si)
{
    b->tl = (VkTimelineSemaphoreSubmitInfo){.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                                            .waitSemaphoreValueCount = b->nwait,
                                            .pWaitSemaphoreValues = b->wait_values,
                                            .signalSemaphoreValueCount = 1,
                                            .pSignalSemaphoreValues = &b->signal};
    *si = (VkSubmitInfo){.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                         .pNext = &b->tl,
                         .waitSemaphoreCount = b->nwait,
                         .pWaitSemaphores = b->waits,
                         .pWaitDstStageMask = b->stages,
                         .commandBufferCount = 1,
                         .pCommandBuffers = &b->cmd,
                         .signalSemaphoreCount = 1,
                         .pSignalSemaphores = &s->timeline};
}

/* Command buffer `i` of side `s`, free to record once the GPU is done with its last use. */
static VkResult take_cmd(vkm_cuda_link *l, cu_side *s, uint32_t i, VkCommandBuffer *cmd, const char **call)
{
    if (s->cmd_free_at[i]) {
        VkResult r = vkm_worker_wait(s->dev, s->timeline, s->cmd_free_at[i], l->cfg.spin_ns,
                                     l->cfg.stall_timeout_ns, call, "vkWaitSemaphores(command buffer reuse)");
        if (r != VK_SUCCESS) return r;
    }
    *cmd = s->cmds[i];
    TRY(vkm_begin_commands(s->dev, *cmd), "vkBeginCommandBuffer");
    return VK_SUCCESS;
}

/* CUDA's NVLink copy of chunk `c` (global `g`, slot `s`), on the source
 * stream, once the worker has seen the Vulkan copy into src ring[s] done:
 * into dst ring[s] itself (landing ring; the worker has seen the Vulkan copy
 * that last read it done), or into bounce[s] after chunk g-K left it (an event
 * of the destination stream). Event copied[s] then frees src ring[s] and, with
 * a landing ring, says the chunk has landed. */
static VkResult peer_copy(vkm_cuda_link *l, const cu_job *j, uint32_t c, uint64_t g, uint32_t s,
                          const char **call, char *msg, size_t msgn)
{
    cu_side *S = &l->src, *D = &l->dst;
    VkDeviceSize off = (VkDeviceSize)s * l->cfg.slot_size;
    VkResult r = cu_push(S->ctx, call, msg, msgn);
    if (r != VK_SUCCESS) return r;
    if (!l->landing && g >= l->K)
        CU_GO(cu.cuStreamWaitEvent(S->stream, D->events[s], 0), "cuStreamWaitEvent(bounce slot)");
    CU_GO(cu.cuMemcpyPeerAsync((l->landing ? D->ring_ptr : l->bounce) + off, D->ctx, S->ring_ptr + off, S->ctx,
                               (size_t)chunk_len(j, c), S->stream),
          "cuMemcpyPeerAsync");
    CU_GO(cu.cuEventRecord(S->events[s], S->stream), "cuEventRecord(peer copy)");
out:
    cu_pop();
    return r;
}

/* Bounce ring, destination stream: after the peer copy (event copied[s]),
 * copy bounce[s] -> dst ring[s] (the worker has seen the Vulkan copy that last
 * read it done); event landed[s] then tells the worker. */
static VkResult cuda_local_copy(vkm_cuda_link *l, const cu_job *j, uint32_t c, uint32_t s, const char **call,
                                char *msg, size_t msgn)
{
    cu_side *S = &l->src, *D = &l->dst;
    VkDeviceSize off = (VkDeviceSize)s * l->cfg.slot_size;
    VkResult r = cu_push(D->ctx, call, msg, msgn);
    if (r != VK_SUCCESS) return r;
    CU_GO(cu.cuStreamWaitEvent(D->stream, S->events[s], 0), "cuStreamWaitEvent(peer copy)");
    CU_GO(cu.cuMemcpyDtoDAsync(D->ring_ptr + off, l->bounce + off, (size_t)chunk_len(j, c), D->stream),
          "cuMemcpyDtoDAsync");
    CU_GO(cu.cuEventRecord(D->events[s], D->stream), "cuEventRecord(local copy)");
out:
    cu_pop();
    return r;
}

/* Record the source copy of chunk `c` (global `g`) into its ring slot and
 * describe its submit in batch entry `i`. */
static VkResult prep_src(vkm_cuda_link *l, const cu_job *j, uint32_t c, uint64_t g, uint32_t i, const char **call)
{
    cu_side *S = &l->src;
    vkm_device *sd = S->dev;
    uint32_t K = l->K, s = (uint32_t)(g % K), ci = (uint32_t)(g % l->ncmd);
    VkDeviceSize off = s * l->cfg.slot_size, span = j->src.image ? 0 : j->size;
    VkCommandBuffer cmd;
    VkResult r = take_cmd(l, S, ci, &cmd, call);
    if (r != VK_SUCCESS) return r;
    if (c == 0) endpoint_barrier(sd, cmd, &j->src, span, 1, 1, j->src_k);
    record_copy(l, S, cmd, ci, j, c, off, 1);
    ring_barrier(S, cmd, off, chunk_len(j, c), 1);
    if (c == j->chunks - 1) endpoint_barrier(sd, cmd, &j->src, span, 1, 0, j->src_k);
    TRY(sd->fn.vkEndCommandBuffer(cmd), "vkEndCommandBuffer(source)");
    cu_submit *b = &l->batch[i];
    b->nwait = 0;
    if (c == 0 && j->src.wait_semaphore) add_wait(b, j->src.wait_semaphore, j->src.wait_value);
    b->cmd = cmd;
    b->signal = j->q.src_base + c + 1;
    submit_info(b, S, &l->infos[i]);
    S->cmd_free_at[ci] = b->signal;
    return VK_SUCCESS;
}

/* Record the destination copy of chunk `c` out of its ring slot, signalling
 * dst_ready `value`, into dst_recorded[g % ncmd] (submitted once it lands). */
static VkResult prep_dst(vkm_cuda_link *l, const cu_job *j, uint32_t c, uint64_t g, uint64_t value,
                         const char **call)
{
    cu_side *D = &l->dst;
    vkm_device *dd = D->dev;
    uint32_t s = (uint32_t)(g % l->K), ci = (uint32_t)(g % l->ncmd);
    VkDeviceSize off = s * l->cfg.slot_size, span = j->dst.image ? 0 : j->size;
    VkCommandBuffer cmd;
    VkResult r = take_cmd(l, D, ci, &cmd, call);
    if (r != VK_SUCCESS) return r;
    ring_barrier(D, cmd, off, chunk_len(j, c), 0);
    if (c == 0) endpoint_barrier(dd, cmd, &j->dst, span, 0, 1, j->dst_k);
    record_copy(l, D, cmd, ci, j, c, off, 0);
    if (c == j->chunks - 1) endpoint_barrier(dd, cmd, &j->dst, span, 0, 0, j->dst_k);
    TRY(dd->fn.vkEndCommandBuffer(cmd), "vkEndCommandBuffer(destination)");
    cu_submit *b = &l->dst_recorded[ci];
    b->nwait = 0;
    if (c == 0 && j->dst.wait_semaphore) add_wait(b, j->dst.wait_semaphore, j->dst.wait_value);
    b->cmd = cmd;
    b->signal = value;
    D->cmd_free_at[ci] = value;
    vkm_trace_mark(l->trace, "dst_recorded", value);
    l->slot_free_at[s] = value;
    return VK_SUCCESS;
}

/* Queue CUDA's copies of the chunks below `submitted` whose source copy the
 * source GPU has finished, while their destination ring slots are free. */
static VkResult queue_cuda(vkm_cuda_link *l, const cu_job *j, uint64_t g0, uint32_t submitted, uint32_t *np,
                           uint32_t nd, int *moved, const char **call, char *msg, size_t msgn)
{
    cu_side *S = &l->src, *D = &l->dst;
    if (*np >= submitted) return VK_SUCCESS;
    uint64_t have_s = 0, have_d = 0;
    TRY(vkm_timeline_value(S->dev, S->timeline, &have_s), "vkGetSemaphoreCounterValue(src_done)");
    TRY(vkm_timeline_value(D->dev, D->timeline, &have_d), "vkGetSemaphoreCounterValue(dst_ready)");
    while (*np < submitted && j->q.src_base + *np + 1 <= have_s && *np < nd + l->K) {
        uint64_t g = g0 + *np;
        uint32_t s = (uint32_t)(g % l->K);
        if (l->slot_free_at[s] > have_d) break; /* the destination copy of chunk g-K still reads it */
        VkResult r = peer_copy(l, j, *np, g, s, call, msg, msgn);
        if (r == VK_SUCCESS && !l->landing) r = cuda_local_copy(l, j, *np, s, call, msg, msgn);
        if (r != VK_SUCCESS) return r;
        vkm_trace_mark(l->trace, "cuda_queued", g + 1);
        (*np)++;
        *moved = 1;
    }
    return VK_SUCCESS;
}

/* The worker polls the source timeline and CUDA's events and queues each next
 * step the moment its inputs are ready. Source copies run up to a ring ahead;
 * CUDA's copy of a chunk goes out once its source copy is seen done and the
 * destination ring slot has been read; the destination copies of every chunk
 * that has landed go out in one submit. */
static VkResult run_job(vkm_cuda_link *l, cu_job *j, const char **call, char *msg, size_t msgn)
{
    cu_side *S = &l->src, *D = &l->dst;
    uint32_t K = l->K, N = j->chunks;
    uint64_t g0 = l->chunk_counter, dv = j->q.dst_base;
    uint32_t ns = 0, np = 0, nd = 0; /* chunks whose source copy / CUDA copies / destination copy are queued */
    uint32_t nr = 0;                 /* destination copies recorded (nd <= nr <= np) */
    struct timespec idle_t0 = {0, 0}, t;
    int idle = 0;
    unsigned idle_rounds = 0;
    while (nd < N) {
        int moved = 0;
        VkResult r;
        /* 1: source copies into ring slots CUDA has finished reading */
        uint32_t n = 0;
        while (ns < N && ns < np + K) {
            uint64_t g = g0 + ns;
            if (g >= K) {
                r = event_state(S, S->events[g % K], call, msg, msgn);
                if (r == VK_NOT_READY) break;
                if (r != VK_SUCCESS) return r;
            }
            r = prep_src(l, j, ns, g, n, call);
            if (r != VK_SUCCESS) return r;
            n++;
            ns++;
            if (ns <= 2) break; /* the first two chunks go at once, alone: the GPUs start sooner */
            if (n >= l->cfg.src_batch) break; /* shorter rounds (a knob for benches; see DEFAULT_SRC_BATCH) */
            /* recording costs microseconds a chunk: hand finished chunks to CUDA in between */
            r = queue_cuda(l, j, g0, ns - n, &np, nd, &moved, call, msg, msgn);
            if (r != VK_SUCCESS) return r;
        }
        if (n) {
            TRY(vkm_queue_submit(S->dev, S->queue, n, l->infos, VK_NULL_HANDLE), "vkQueueSubmit(source)");
            S->submitted = j->q.src_base + ns;
            vkm_trace_mark(l->trace, "src_submitted", S->submitted);
            moved = 1;
        }
        /* 2: CUDA's copies of chunks the source GPU has written, into free destination slots */
        r = queue_cuda(l, j, g0, ns, &np, nd, &moved, call, msg, msgn);
        if (r != VK_SUCCESS) return r;
        /* 3: destination copies of every chunk CUDA has landed, one submit */
        n = 0;
        while (nd < np) {
            uint64_t g = g0 + nd;
            cu_side *X = l->landing ? S : D; /* the side whose event says the chunk has landed */
            r = event_state(X, X->events[g % K], call, msg, msgn);
            if (r == VK_NOT_READY) break;
            if (r != VK_SUCCESS) return r;
            if (nr == nd) { /* not recorded ahead: record now */
                /* NVLink is the bottleneck: keep CUDA's stream fed before each recording */
                r = queue_cuda(l, j, g0, ns, &np, nd, &moved, call, msg, msgn);
                if (r == VK_SUCCESS) r = prep_dst(l, j, nd, g, j->q.dst_base + nd + 1, call);
                if (r != VK_SUCCESS) return r;
                nr++;
            }
            submit_info(&l->dst_recorded[g % l->ncmd], D, &l->infos[n]);
            dv = j->q.dst_base + nd + 1;
            n++;
            nd++;
        }
        if (n) {
            TRY(vkm_queue_submit(D->dev, D->queue, n, l->infos, VK_NULL_HANDLE), "vkQueueSubmit(destination)");
            D->submitted = dv;
            vkm_trace_mark(l->trace, "dst_submitted", dv);
            moved = 1;
        }
        if (moved) {
            idle = 0;
            continue;
        }
        /* nothing could move. Record the next destination copy ahead while CUDA
         * copies (if its command buffer is free), so that it goes out the moment
         * its chunk lands; else poll for the spin time, then nap; bounded by the
         * stall timeout */
        if (nr < np) {
            uint64_t g = g0 + nr, have_d = 0;
            uint64_t free_at = D->cmd_free_at[g % l->ncmd];
            TRY(vkm_timeline_value(D->dev, D->timeline, &have_d), "vkGetSemaphoreCounterValue(dst_ready)");
            if (have_d >= free_at) {
                r = prep_dst(l, j, nr, g, j->q.dst_base + nr + 1, call);
                if (r != VK_SUCCESS) return r;
                nr++;
                continue;
            }
        }
        now(&t);
        if (!idle) {
            idle = 1;
            idle_t0 = t;
            idle_rounds = 0;
        }
        uint64_t waited = elapsed_ns(&idle_t0, &t);
        if (++idle_rounds % 1024 == 0) { /* a failed stream never completes its events */
            r = stream_errors(l, call, msg, msgn);
            if (r != VK_SUCCESS) return r;
        }
        if (waited >= l->cfg.stall_timeout_ns) {
            if (msg && msgn)
                snprintf(msg, msgn, "no progress for %.1f s (source copies queued %u, CUDA copies %u, destination "
                         "copies %u of %u chunks)", l->cfg.stall_timeout_ns / 1e9, ns, np, nd, N);
            if (call) *call = "CUDA_PEER worker";
            return VKM_ERROR_CUDA;
        }
        if (waited < l->cfg.spin_ns) {
            sched_yield();
        } else if (np < ns && nd == np) { /* only a Vulkan copy can unblock: block on its semaphore */
            uint64_t have_s = 0;
            TRY(vkm_timeline_value(S->dev, S->timeline, &have_s), "vkGetSemaphoreCounterValue(src_done)");
            if (have_s >= j->q.src_base + np + 1) /* source done: the destination still reads chunk np's slot */
                r = vkm_wait_timeline(D->dev, D->timeline, l->slot_free_at[(g0 + np) % K], 1000000);
            else
                r = vkm_wait_timeline(S->dev, S->timeline, j->q.src_base + np + 1, 1000000);
            if (r != VK_SUCCESS && r != VK_TIMEOUT) {
                if (call) *call = "vkWaitSemaphores(src_done/dst_ready)";
                return r;
            }
        } else {
            struct timespec nap = {0, 10000};
            nanosleep(&nap, NULL);
        }
    }
    l->chunk_counter += N;
    return VK_SUCCESS;
}

/* The idle worker's look at in-flight work (vkm_jobq_take's watch): CUDA
 * stream errors and stalls fail the link. Nonzero while work is in flight. */
static int watch(void *arg)
{
    vkm_cuda_link *l = arg;
    struct timespec t;
    now(&t);
    uint64_t v = 0;
    VkResult r = vkm_timeline_value(l->dst.dev, l->dst.timeline, &v);
    if (r != VK_SUCCESS) {
        fail(l, r, "vkGetSemaphoreCounterValue(dst_ready)", "", UINT64_MAX);
        return 0;
    }
    if (v != l->seen_dst) {
        l->seen_dst = v;
        l->progress_at = t;
    }
    if (v >= l->dst.submitted) return 0;
    char msg[512];
    const char *call = NULL;
    r = stream_errors(l, &call, msg, sizeof msg);
    if (r != VK_SUCCESS) {
        fail(l, r, call, msg, UINT64_MAX);
        return 0;
    }
    if (elapsed_ns(&l->progress_at, &t) >= l->cfg.stall_timeout_ns) {
        snprintf(msg, sizeof msg, "stalled: dst_ready stayed at %llu (work submitted up to %llu) for %.1f s",
                 (unsigned long long)v, (unsigned long long)l->dst.submitted, l->cfg.stall_timeout_ns / 1e9);
        fail(l, VKM_ERROR_CUDA, "CUDA_PEER watchdog", msg, UINT64_MAX); /* bounded by the stall timeout */
        return 0;
    }
    return 1;
}

static void *cu_worker(void *arg)
{
    vkm_cuda_link *l = arg;
    char msg[512];
    int failed;
    vkm_jobq_item *it;
    prctl(PR_SET_TIMERSLACK, 1000UL); /* the worker's short naps between polls stay short */
    while ((it = vkm_jobq_take(&l->q, &failed, WATCH_NS, watch, l)) != NULL) {
        cu_job *j = (cu_job *)it;
        vkm_trace_mark(l->trace, "job_taken", it->ticket);
        const char *call = "?";
        msg[0] = 0;
        j->src_k = vkm_kcopy_serves(l->src.kc, &j->src, l->cfg.slot_size);
        j->dst_k = vkm_kcopy_serves(l->dst.kc, &j->dst, l->cfg.slot_size);
        VkResult r = failed ? VK_SUCCESS : run_job(l, j, &call, msg, sizeof msg);
        if (r == VK_TIMEOUT) { /* a bounded wait ran out: the link is stuck, not merely slow to answer */
            snprintf(msg, sizeof msg, "stalled: %s did not complete within %.1f s", call,
                     l->cfg.stall_timeout_ns / 1e9);
            r = VKM_ERROR_CUDA;
        }
        if (r != VK_SUCCESS) fail(l, r, call, msg, it->ticket);
        now(&l->progress_at); /* fresh work: the stall clock starts now */
        vkm_jobq_finish(&l->q, it, l->cfg.spin_ns);
        free_job(j);
    }
    return NULL;
}
