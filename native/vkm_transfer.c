/* vkm_transfer.c - the cross-device transfer engine (see vkm_transfer.h). */
#include "vkm_transfer.h"
#include "vkm_trace.h"
#include "vkm_jobq.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SLICE_NS 100000000ull /* worker waits are cut into 100 ms slices */

typedef struct vkm_job {
    vkm_jobq_item q; /* ticket; src_base, dst_base: the first timeline value this job signals, minus one */
    vkm_endpoint src, dst;
    VkDeviceSize size;
    uint32_t chunks;
    VkDeviceSize *starts; /* chunk k is [starts[k], starts[k+1]) */
} vkm_job;

static void free_job(vkm_job *j)
{
    free(j->starts);
    free(j);
}

/* A team of helper threads that splits the staging ring's CPU copies: one
 * core copies out of mapped memory at a fraction of what PCIe carries. */
typedef struct vkm_copy_team {
    int helpers;
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t go, done;
    uint64_t generation;
    int remaining, stop;
    uint8_t *dst;
    const uint8_t *src;
    size_t len;
} vkm_copy_team;

static void team_part(const vkm_copy_team *t, int i, size_t *off, size_t *len)
{
    size_t parts = (size_t)t->helpers + 1;
    size_t each = (t->len / parts + 63) & ~(size_t)63;
    size_t start = each * (size_t)i;
    *off = start < t->len ? start : t->len;
    size_t end = start + each < t->len ? start + each : t->len;
    *len = end > *off ? end - *off : 0;
}

static void *team_helper(void *arg)
{
    vkm_copy_team *t = ((void **)arg)[0];
    int i = (int)(intptr_t)((void **)arg)[1];
    free(arg);
    uint64_t seen = 0;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (t->generation == seen && !t->stop)
            pthread_cond_wait(&t->go, &t->lock);
        if (t->stop) break;
        seen = t->generation;
        size_t off, len;
        team_part(t, i, &off, &len);
        pthread_mutex_unlock(&t->lock);
        if (len) memcpy(t->dst + off, t->src + off, len);
        pthread_mutex_lock(&t->lock);
        if (--t->remaining == 0) pthread_cond_signal(&t->done);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

static void team_start(vkm_copy_team *t, int helpers)
{
    memset(t, 0, sizeof(*t));
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    if (helpers <= 0) return;
    t->threads = calloc((size_t)helpers, sizeof(pthread_t));
    if (!t->threads) return;
    for (int i = 0; i < helpers; i++) {
        void **arg = malloc(2 * sizeof(void *));
        if (!arg) break;
        arg[0] = t;
        arg[1] = (void *)(intptr_t)(i + 1);
        if (pthread_create(&t->threads[i], NULL, team_helper, arg) != 0) {
            free(arg);
            break;
        }
        t->helpers++;
    }
}

static void team_copy(vkm_copy_team *t, uint8_t *dst, const uint8_t *src, size_t len)
{
    if (t->helpers == 0 || len < ((size_t)1 << 20)) {
        memcpy(dst, src, len);
        return;
    }
    pthread_mutex_lock(&t->lock);
    t->dst = dst;
    t->src = src;
    t->len = len;
    t->remaining = t->helpers;
    t->generation++;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->lock);
    size_t off, part;
    team_part(t, 0, &off, &part);
    memcpy(dst + off, src + off, part);
    pthread_mutex_lock(&t->lock);
    while (t->remaining > 0)
        pthread_cond_wait(&t->done, &t->lock);
    pthread_mutex_unlock(&t->lock);
}

static void team_stop(vkm_copy_team *t)
{
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->lock);
    for (int i = 0; i < t->helpers; i++)
        pthread_join(t->threads[i], NULL);
    free(t->threads);
    pthread_cond_destroy(&t->done);
    pthread_cond_destroy(&t->go);
    pthread_mutex_destroy(&t->lock);
}

/* One device's end of a link. */
typedef struct vkm_side {
    vkm_device *dev;
    vkm_queue *queue;
    VkCommandPool pool;
    VkCommandBuffer *cmds; /* one per slot */
    VkSemaphore timeline;
    uint64_t submitted;     /* the highest timeline value submitted */
    VkBuffer ring;
    VkDeviceMemory memory;
    uint8_t *mapped;        /* staging rings only */
    int coherent;
    /* ownership-transfer submits on an owner queue: a small pool per family */
    VkCommandPool owner_pool;
    uint32_t owner_family;
    VkCommandBuffer owner_cmds[4];
    uint64_t owner_free_at[4]; /* timeline value after which owner_cmds[i] is free */
    uint32_t owner_next;
} vkm_side;

struct vkm_link {
    vkm_link_config cfg;
    vkm_side src, dst;
    void *host_block; /* shared-host ring */
    uint64_t *slot_free_at; /* dst timeline value after which slot i may be rewritten */
    VkCommandBuffer *batch_cmds; /* scratch for one batch of destination submits */
    uint64_t chunk_counter;
    vkm_copy_team team;
    int team_started;

    vkm_jobq q;
    vkm_trace *trace; /* NULL unless VKMULTI_TRACE is set */
};

/* ---- small helpers ------------------------------------------------------- */

#define TRY VKM_TRY

static VkResult make_pool(vkm_device *d, uint32_t family, VkCommandPool *pool)
{
    VkCommandPoolCreateInfo info = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                    .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT |
                                             VK_COMMAND_POOL_CREATE_TRANSIENT_BIT,
                                    .queueFamilyIndex = family};
    return d->fn.vkCreateCommandPool(d->device, &info, NULL, pool);
}

static VkResult make_cmds(vkm_device *d, VkCommandPool pool, uint32_t n, VkCommandBuffer *out)
{
    VkCommandBufferAllocateInfo info = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                        .commandPool = pool,
                                        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                        .commandBufferCount = n};
    return d->fn.vkAllocateCommandBuffers(d->device, &info, out);
}

static VkResult make_buffer(vkm_device *d, VkDeviceSize size, VkBufferUsageFlags usage,
                            VkExternalMemoryHandleTypeFlags external, VkBuffer *out)
{
    VkExternalMemoryBufferCreateInfo ext = {.sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
                                            .handleTypes = external};
    VkBufferCreateInfo info = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                               .pNext = external ? &ext : NULL,
                               .size = size,
                               .usage = usage,
                               .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    return d->fn.vkCreateBuffer(d->device, &info, NULL, out);
}

static VkDeviceSize round_up(VkDeviceSize v, VkDeviceSize a)
{
    return a ? (v + a - 1) / a * a : v;
}

/* Poll the counter for up to `spin_ns` before a blocking wait: a GPU's
 * semaphore wake-up costs tens of microseconds, a chunk only a few more. */
VkResult vkm_spin_wait(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t spin_ns)
{
    if (!spin_ns) return VK_TIMEOUT;
    uint64_t end = vkm_now_ns() + spin_ns;
    do {
        uint64_t have = 0;
        VkResult r = vkm_timeline_value(d, sem, &have);
        if (r != VK_SUCCESS) return r;
        if (have >= value) return VK_SUCCESS;
        sched_yield();
    } while (vkm_now_ns() < end);
    return VK_TIMEOUT;
}

/* A host-visible buffer of `size` bytes, persistently mapped. */
static VkResult make_staging(vkm_side *s, VkDeviceSize size, VkBufferUsageFlags usage, int readback,
                             const char **call)
{
    vkm_device *d = s->dev;
    TRY(make_buffer(d, size, usage, 0, &s->ring), "vkCreateBuffer(staging)");
    VkMemoryRequirements req;
    d->fn.vkGetBufferMemoryRequirements(d->device, s->ring, &req);
    VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    int type = vkm_find_memory_type(d, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
                                    readback ? want | VK_MEMORY_PROPERTY_HOST_CACHED_BIT : want);
    if (type < 0) {
        if (call) *call = "vkm_find_memory_type(host-visible)";
        return VK_ERROR_FEATURE_NOT_PRESENT;
    }
    s->coherent = (d->memory.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
    VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                  .allocationSize = req.size,
                                  .memoryTypeIndex = (uint32_t)type};
    TRY(d->fn.vkAllocateMemory(d->device, &alloc, NULL, &s->memory), "vkAllocateMemory(staging)");
    TRY(d->fn.vkBindBufferMemory(d->device, s->ring, s->memory, 0), "vkBindBufferMemory(staging)");
    void *p = NULL;
    TRY(d->fn.vkMapMemory(d->device, s->memory, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory(staging)");
    s->mapped = p;
    return VK_SUCCESS;
}

/* Import the host block into side `s` as a buffer. */
static VkResult import_host(vkm_side *s, void *block, VkDeviceSize size, VkBufferUsageFlags usage,
                            const char **call)
{
    vkm_device *d = s->dev;
    const VkExternalMemoryHandleTypeFlagBits type = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
    TRY(make_buffer(d, size, usage, type, &s->ring), "vkCreateBuffer(host import)");
    VkMemoryRequirements req;
    d->fn.vkGetBufferMemoryRequirements(d->device, s->ring, &req);
    VkMemoryHostPointerPropertiesEXT hp = {.sType = VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
    TRY(d->fn.vkGetMemoryHostPointerPropertiesEXT(d->device, type, block, &hp),
        "vkGetMemoryHostPointerPropertiesEXT");
    int mt = vkm_find_memory_type(d, req.memoryTypeBits & hp.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
                                  VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    if (mt < 0) {
        if (call) *call = "vkGetMemoryHostPointerPropertiesEXT(no memory type)";
        return VK_ERROR_FEATURE_NOT_PRESENT;
    }
    VkImportMemoryHostPointerInfoEXT imp = {.sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT,
                                            .handleType = type,
                                            .pHostPointer = block};
    VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                  .pNext = &imp,
                                  .allocationSize = size,
                                  .memoryTypeIndex = (uint32_t)mt};
    TRY(d->fn.vkAllocateMemory(d->device, &alloc, NULL, &s->memory), "vkAllocateMemory(host import)");
    TRY(d->fn.vkBindBufferMemory(d->device, s->ring, s->memory, 0), "vkBindBufferMemory(host import)");
    return VK_SUCCESS;
}

/* Allocate exportable memory on the source, export it, import it on the destination. */
static VkResult export_import(vkm_link *l, VkDeviceSize size, const char **call)
{
    vkm_device *sd = l->src.dev, *dd = l->dst.dev;
    VkExternalMemoryHandleTypeFlagBits type = l->cfg.export_type;
    TRY(make_buffer(sd, size, VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT, type,
                    &l->src.ring), "vkCreateBuffer(export)");
    VkMemoryRequirements req;
    sd->fn.vkGetBufferMemoryRequirements(sd->device, l->src.ring, &req);
    int mt = vkm_find_memory_type(sd, req.memoryTypeBits, 0, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    if (mt < 0) {
        if (call) *call = "vkm_find_memory_type(exportable)";
        return VK_ERROR_FEATURE_NOT_PRESENT;
    }
    VkMemoryDedicatedAllocateInfo ded = {.sType = VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO,
                                         .buffer = l->src.ring};
    VkExportMemoryAllocateInfo exp = {.sType = VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO,
                                      .pNext = &ded,
                                      .handleTypes = type};
    VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                  .pNext = &exp,
                                  .allocationSize = req.size,
                                  .memoryTypeIndex = (uint32_t)mt};
    TRY(sd->fn.vkAllocateMemory(sd->device, &alloc, NULL, &l->src.memory), "vkAllocateMemory(export)");
    TRY(sd->fn.vkBindBufferMemory(sd->device, l->src.ring, l->src.memory, 0), "vkBindBufferMemory(export)");
    VkMemoryGetFdInfoKHR gfd = {.sType = VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR,
                                .memory = l->src.memory,
                                .handleType = type};
    int fd = -1;
    TRY(sd->fn.vkGetMemoryFdKHR(sd->device, &gfd, &fd), "vkGetMemoryFdKHR");

    VkResult r = make_buffer(dd, size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, type,
                             &l->dst.ring);
    if (r != VK_SUCCESS) {
        close(fd);
        if (call) *call = "vkCreateBuffer(import)";
        return r;
    }
    VkMemoryRequirements dreq;
    dd->fn.vkGetBufferMemoryRequirements(dd->device, l->dst.ring, &dreq);
    uint32_t bits = dreq.memoryTypeBits;
    if (type != VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT) {
        VkMemoryFdPropertiesKHR fp = {.sType = VK_STRUCTURE_TYPE_MEMORY_FD_PROPERTIES_KHR};
        r = dd->fn.vkGetMemoryFdPropertiesKHR(dd->device, type, fd, &fp);
        if (r != VK_SUCCESS) {
            close(fd);
            if (call) *call = "vkGetMemoryFdPropertiesKHR";
            return r;
        }
        bits &= fp.memoryTypeBits;
    } else {
        bits &= 1u << mt; /* opaque fd: same driver and device, same memory type */
    }
    int dmt = vkm_find_memory_type(dd, bits, 0, 0);
    if (dmt < 0) {
        close(fd);
        if (call) *call = "vkm_find_memory_type(import)";
        return VK_ERROR_FEATURE_NOT_PRESENT;
    }
    VkMemoryDedicatedAllocateInfo dded = {.sType = VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO,
                                          .buffer = l->dst.ring};
    VkImportMemoryFdInfoKHR imp = {.sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR,
                                   .pNext = &dded,
                                   .handleType = type,
                                   .fd = fd};
    VkMemoryAllocateInfo dalloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                   .pNext = &imp,
                                   .allocationSize = req.size,
                                   .memoryTypeIndex = (uint32_t)dmt};
    r = dd->fn.vkAllocateMemory(dd->device, &dalloc, NULL, &l->dst.memory);
    if (r != VK_SUCCESS) {
        close(fd); /* ownership passes to the driver only on success */
        if (call) *call = "vkAllocateMemory(import fd)";
        return r;
    }
    TRY(dd->fn.vkBindBufferMemory(dd->device, l->dst.ring, l->dst.memory, 0), "vkBindBufferMemory(import)");
    return VK_SUCCESS;
}

static VkResult side_init(vkm_side *s, uint32_t slots, const char **call)
{
    TRY(make_pool(s->dev, s->queue->family, &s->pool), "vkCreateCommandPool");
    s->cmds = calloc(slots, sizeof(VkCommandBuffer));
    if (!s->cmds) return VK_ERROR_OUT_OF_HOST_MEMORY;
    TRY(make_cmds(s->dev, s->pool, slots, s->cmds), "vkAllocateCommandBuffers");
    TRY(vkm_create_timeline(s->dev, 0, &s->timeline), "vkCreateSemaphore(timeline)");
    s->owner_family = VK_QUEUE_FAMILY_IGNORED;
    return VK_SUCCESS;
}

static void side_free(vkm_side *s, uint32_t slots)
{
    vkm_device *d = s->dev;
    if (!d) return;
    if (s->mapped) d->fn.vkUnmapMemory(d->device, s->memory);
    if (s->ring) d->fn.vkDestroyBuffer(d->device, s->ring, NULL);
    if (s->memory) d->fn.vkFreeMemory(d->device, s->memory, NULL);
    if (s->cmds && s->pool && s->cmds[0]) d->fn.vkFreeCommandBuffers(d->device, s->pool, slots, s->cmds);
    free(s->cmds);
    if (s->pool) d->fn.vkDestroyCommandPool(d->device, s->pool, NULL);
    if (s->owner_pool) d->fn.vkDestroyCommandPool(d->device, s->owner_pool, NULL);
    if (s->timeline) d->fn.vkDestroySemaphore(d->device, s->timeline, NULL);
    memset(s, 0, sizeof(*s));
}

static void *worker(void *arg);

VkResult vkm_link_create(vkm_device *src, vkm_queue *src_queue, vkm_device *dst, vkm_queue *dst_queue,
                         const vkm_link_config *config, vkm_link **out, const char **call)
{
    *out = NULL;
    if (!src || !dst || !src_queue || !dst_queue || !config || config->slot_count < 1 || config->slot_size < 1)
        return VK_ERROR_INITIALIZATION_FAILED;
    vkm_link *l = calloc(1, sizeof(*l));
    if (!l) return VK_ERROR_OUT_OF_HOST_MEMORY;
    l->cfg = *config;
    if (!l->cfg.stall_timeout_ns) l->cfg.stall_timeout_ns = 30ull * 1000000000ull;
    /* even chunks. Both PCIe hops run at about the same rate, so the destination
     * trails the source by a chunk and ramps' short end chunks mostly add
     * per-chunk costs: on the H200 pair (bench/link_ab.py, 2026-11-30) 1-3
     * steps made the 4K frame 0.96-1.02x as fast */
    if (l->cfg.ramps < 0) l->cfg.ramps = 0;
    if (!l->cfg.parts) l->cfg.parts = 16;
    l->src.dev = src;
    l->src.queue = src_queue;
    l->dst.dev = dst;
    l->dst.queue = dst_queue;
    vkm_jobq_init(&l->q);

    /* Slots are aligned for host import and for buffer-copy offsets. */
    VkDeviceSize align = 256;
    if (l->cfg.ring == VKM_RING_SHARED_HOST) {
        if (!src->host_pointer_alignment || !dst->host_pointer_alignment) {
            if (call) *call = "VK_EXT_external_memory_host not enabled";
            vkm_link_destroy(l);
            return VK_ERROR_EXTENSION_NOT_PRESENT;
        }
        if (src->host_pointer_alignment > align) align = src->host_pointer_alignment;
        if (dst->host_pointer_alignment > align) align = dst->host_pointer_alignment;
    }
    l->cfg.slot_size = round_up(l->cfg.slot_size, align);
    VkDeviceSize total = l->cfg.slot_size * l->cfg.slot_count;
    uint32_t n = l->cfg.slot_count;
    l->slot_free_at = calloc(n, sizeof(uint64_t));
    l->batch_cmds = calloc(n, sizeof(VkCommandBuffer));
    VkResult r = l->slot_free_at && l->batch_cmds ? VK_SUCCESS : VK_ERROR_OUT_OF_HOST_MEMORY;
    if (r == VK_SUCCESS) r = side_init(&l->src, n, call);
    if (r == VK_SUCCESS) r = side_init(&l->dst, n, call);
    if (r == VK_SUCCESS) {
        switch (l->cfg.ring) {
        case VKM_RING_STAGING:
            r = make_staging(&l->src, total, VK_BUFFER_USAGE_TRANSFER_DST_BIT, 1, call);
            if (r == VK_SUCCESS)
                r = make_staging(&l->dst, total, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, 0, call);
            break;
        case VKM_RING_SHARED_HOST:
            l->host_block = aligned_alloc(align, total);
            if (!l->host_block) {
                r = VK_ERROR_OUT_OF_HOST_MEMORY;
                if (call) *call = "aligned_alloc(shared host ring)";
                break;
            }
            memset(l->host_block, 0, total); /* touch the pages once */
            r = import_host(&l->src, l->host_block, total, VK_BUFFER_USAGE_TRANSFER_DST_BIT, call);
            if (r == VK_SUCCESS)
                r = import_host(&l->dst, l->host_block, total, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, call);
            break;
        case VKM_RING_EXPORTED:
            if (!src->has_external_memory_fd || !dst->has_external_memory_fd) {
                r = VK_ERROR_EXTENSION_NOT_PRESENT;
                if (call) *call = "VK_KHR_external_memory_fd not enabled";
                break;
            }
            r = export_import(l, total, call);
            break;
        default:
            r = VK_ERROR_INITIALIZATION_FAILED;
            if (call) *call = "vkm_link_create(unknown ring kind)";
        }
    }
    if (r == VK_SUCCESS && l->cfg.ring == VKM_RING_STAGING) {
        int helpers = l->cfg.copy_threads >= 0 ? l->cfg.copy_threads : (int)(sysconf(_SC_NPROCESSORS_ONLN) / 4);
        team_start(&l->team, helpers > 7 ? 7 : helpers);
        l->team_started = 1;
    }
    static const char *const ring_names[] = {"staging", "host_shared", "exported"};
    if (r == VK_SUCCESS)
        l->trace = vkm_trace_link(ring_names[l->cfg.ring], l->src.dev, l->src.timeline, l->dst.dev, l->dst.timeline);
    if (r == VK_SUCCESS) r = vkm_jobq_start(&l->q, worker, l, call);
    if (r != VK_SUCCESS) {
        vkm_link_destroy(l);
        return r;
    }
    *out = l;
    return VK_SUCCESS;
}

void vkm_link_destroy(vkm_link *l)
{
    if (!l) return;
    vkm_jobq_stop(&l->q);
    if (l->team_started) team_stop(&l->team);
    /* Wait (bounded) until the GPUs are done with everything this link
     * submitted: every submit, owner-queue ones included, signals its side's
     * timeline, and a failed link's timelines are raised from the host only
     * once that work is done (vkm_jobq_release). */
    int stuck = 0;
    vkm_side *sides[2] = {&l->src, &l->dst};
    for (int i = 0; i < 2; i++)
        if (sides[i]->timeline && sides[i]->submitted &&
            vkm_wait_timeline(sides[i]->dev, sides[i]->timeline, sides[i]->submitted, l->cfg.stall_timeout_ns) !=
                VK_SUCCESS)
            stuck = 1;
    vkm_trace_close(l->trace); /* its poller reads the semaphores freed below */
    l->trace = NULL;
    if (!stuck) {
        side_free(&l->src, l->cfg.slot_count);
        side_free(&l->dst, l->cfg.slot_count);
        free(l->host_block); /* after both imports are freed */
    }
    /* else a GPU still has (or waits to run) this link's copies, e.g. behind a
     * wait semaphore that never came: its ring, memory, command buffers and
     * semaphores are left alive (leaked) rather than freed under them */
    free(l->slot_free_at);
    free(l->batch_cmds);
    for (vkm_jobq_item *it = vkm_jobq_destroy(&l->q), *next; it; it = next) {
        next = it->next;
        free_job((vkm_job *)it);
    }
    free(l);
}

VkSemaphore vkm_link_src_timeline(const vkm_link *l) { return l->src.timeline; }
VkSemaphore vkm_link_dst_timeline(const vkm_link *l) { return l->dst.timeline; }
VkDeviceSize vkm_link_slot_size(const vkm_link *l) { return l->cfg.slot_size; }

static int needs_ownership(const vkm_side *s, const vkm_endpoint *e)
{
    return e->owner && e->owner->family != s->queue->family;
}

/* Chunk boundaries (vkm_transfer.h): `ramps` halving steps at each end, even
 * chunks in between; every inner boundary a multiple of `unit` (an image row). */
VkDeviceSize *vkm_plan_chunks(VkDeviceSize size, VkDeviceSize chunk, VkDeviceSize unit, int ramps,
                              uint32_t *count)
{
    /* ramp chunk i is chunk >> (steps - i), rounded down to whole units; fewer
     * steps when the job is too small for them (the middle needs two chunks) */
    VkDeviceSize r[VKM_MAX_RAMPS], head = 0;
    int steps = ramps < 0 ? 0 : (ramps > VKM_MAX_RAMPS ? VKM_MAX_RAMPS : ramps);
    for (; steps > 0; steps--) {
        head = 0;
        int ok = 1;
        for (int i = 0; i < steps; i++) {
            r[i] = (chunk >> (steps - i)) / unit * unit;
            ok &= r[i] >= unit;
            head += r[i];
        }
        if (ok && size > 2 * chunk + 2 * head) break;
    }
    if (!steps) head = 0;
    VkDeviceSize tail_start = steps ? (size - head) / unit * unit : size;
    VkDeviceSize span = tail_start - head;
    uint64_t mid = (uint64_t)((span + chunk - 1) / chunk);
    VkDeviceSize each = mid ? (span + mid - 1) / mid : 0;
    each = (each + unit - 1) / unit * unit;
    if (each > chunk) each = chunk;
    size_t cap = (size_t)mid + 2 * (size_t)steps + 4;
    VkDeviceSize *b = malloc(cap * sizeof(VkDeviceSize));
    if (!b) return NULL;
    uint32_t n = 0;
    VkDeviceSize at = 0;
    b[n++] = 0;
    for (int i = 0; i < steps; i++) b[n++] = at += r[i];
    while (at < tail_start && n + (size_t)steps + 1 <= cap) {
        at = at + each < tail_start ? at + each : tail_start;
        b[n++] = at;
    }
    /* the tail mirrors the head; the last chunk also takes the remainder */
    for (int i = steps - 1; i > 0; i--) b[n++] = at += r[i];
    if (b[n - 1] != size) b[n++] = size;
    *count = n - 1;
    return b;
}

VkResult vkm_link_submit(vkm_link *l, const vkm_endpoint *src, const vkm_endpoint *dst, VkDeviceSize size,
                         uint64_t *ticket, uint64_t *src_done, uint64_t *dst_ready, const char **call)
{
    if (size == 0) {
        if (call) *call = "vkm_link_submit(size 0)";
        return VK_ERROR_INITIALIZATION_FAILED;
    }
    VkDeviceSize chunk = l->cfg.slot_size, unit = 256;
    const vkm_endpoint *img = src->image ? src : (dst->image ? dst : NULL);
    if (img) { /* chunks are whole rows */
        unit = (VkDeviceSize)img->width * img->bytes_per_pixel;
        if (unit == 0 || unit > chunk) {
            if (call) *call = "vkm_link_submit(image row larger than a ring slot)";
            return VK_ERROR_FORMAT_NOT_SUPPORTED;
        }
    }
    /* Mid-sized jobs get smaller chunks (about `parts`, at least 2 MiB) so both
     * devices overlap; large ones use whole slots, which costs the fewest submits. */
    VkDeviceSize part = size / l->cfg.parts > ((VkDeviceSize)2 << 20) ? size / l->cfg.parts : ((VkDeviceSize)2 << 20);
    if (part < chunk) chunk = part;
    chunk = chunk / unit * unit;
    if (chunk < unit) chunk = unit;
    if (size / chunk >= (VkDeviceSize)UINT32_MAX / 2) {
        if (call) *call = "vkm_link_submit(too many chunks)";
        return VK_ERROR_INITIALIZATION_FAILED;
    }
    vkm_job *j = calloc(1, sizeof(*j));
    if (!j) return VK_ERROR_OUT_OF_HOST_MEMORY;
    j->src = *src;
    j->dst = *dst;
    j->size = size;
    j->starts = vkm_plan_chunks(size, chunk, unit, l->cfg.ramps, &j->chunks);
    if (!j->starts) {
        free(j);
        return VK_ERROR_OUT_OF_HOST_MEMORY;
    }
    /* ownership transfers add a release and an acquire submit on the source, one on the destination */
    uint64_t src_count = j->chunks + (needs_ownership(&l->src, src) ? 2 : 0);
    uint64_t dst_count = j->chunks + (needs_ownership(&l->dst, dst) ? 1 : 0);
    /* from here on the worker owns `j` (it may already have freed it) */
    VkResult r = vkm_jobq_push(&l->q, &j->q, src_count, dst_count, ticket, src_done, dst_ready, call);
    if (r != VK_SUCCESS) {
        free_job(j);
        return r;
    }
    vkm_trace_mark(l->trace, "submit", *ticket);
    return VK_SUCCESS;
}

VkResult vkm_link_wait_submitted(vkm_link *l, uint64_t ticket, uint64_t timeout_ns, const char **call)
{
    return vkm_jobq_wait_submitted(&l->q, ticket, 0, timeout_ns, call);
}

VkResult vkm_link_poll(vkm_link *l, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns, const char **call)
{
    VkResult r = vkm_jobq_poll(&l->q, l->dst.dev, l->dst.timeline, ticket, dst_ready, timeout_ns, l->cfg.spin_ns,
                               call);
    if (r == VK_SUCCESS) vkm_trace_mark(l->trace, "waited", ticket);
    return r;
}

/* ---- the worker ---------------------------------------------------------- */

/* Wait for a timeline value on the worker thread: slices, bounded by the stall timeout. */
VkResult vkm_worker_wait(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t spin_ns, uint64_t stall_ns,
                         const char **call, const char *name)
{
    VkResult r = vkm_spin_wait(d, sem, value, spin_ns);
    for (uint64_t waited = 0; r == VK_TIMEOUT && waited < stall_ns; waited += SLICE_NS)
        r = vkm_wait_timeline(d, sem, value, SLICE_NS);
    if (r != VK_SUCCESS && call) *call = name;
    return r;
}

static VkResult worker_wait(vkm_link *l, vkm_side *s, uint64_t value, const char **call, const char *name)
{
    return vkm_worker_wait(s->dev, s->timeline, value, l->cfg.spin_ns, l->cfg.stall_timeout_ns, call, name);
}

static void image_barrier(vkm_device *d, VkCommandBuffer cmd, const vkm_endpoint *e, VkImageLayout from,
                          VkImageLayout to, VkAccessFlags src_access, VkAccessFlags dst_access,
                          VkPipelineStageFlags src_stage, VkPipelineStageFlags dst_stage, uint32_t src_family,
                          uint32_t dst_family)
{
    VkImageMemoryBarrier b = {
        .sType = VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER,
        .srcAccessMask = src_access,
        .dstAccessMask = dst_access,
        .oldLayout = from,
        .newLayout = to,
        .srcQueueFamilyIndex = src_family,
        .dstQueueFamilyIndex = dst_family,
        .image = e->image,
        .subresourceRange = {VK_IMAGE_ASPECT_COLOR_BIT, e->mip_level, 1, e->array_layer, 1},
    };
    d->fn.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 0, NULL, 0, NULL, 1, &b);
}

static void buffer_barrier(vkm_device *d, VkCommandBuffer cmd, const vkm_endpoint *e, VkDeviceSize size,
                           VkAccessFlags src_access, VkAccessFlags dst_access, VkPipelineStageFlags src_stage,
                           VkPipelineStageFlags dst_stage, uint32_t src_family, uint32_t dst_family)
{
    VkBufferMemoryBarrier b = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_MEMORY_BARRIER,
        .srcAccessMask = src_access,
        .dstAccessMask = dst_access,
        .srcQueueFamilyIndex = src_family,
        .dstQueueFamilyIndex = dst_family,
        .buffer = e->buffer,
        .offset = e->offset,
        .size = size,
    };
    d->fn.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 0, NULL, 1, &b, 0, NULL);
}

/* Record the barrier that takes a resource out of (acquire=0) or back into
 * (acquire=1) the owner's queue family, or plain layout transitions when no
 * ownership transfer is needed. `side_is_src`: reading (1) or writing (0). */
static void ownership_barrier(vkm_device *d, VkCommandBuffer cmd, const vkm_endpoint *e, VkDeviceSize size,
                              int side_is_src, int entering, int on_owner, uint32_t owner_family,
                              uint32_t copy_family)
{
    VkImageLayout xfer = side_is_src ? VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL : VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL;
    VkAccessFlags xacc = side_is_src ? VK_ACCESS_TRANSFER_READ_BIT : VK_ACCESS_TRANSFER_WRITE_BIT;
    VkAccessFlags any = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT;
    int qfot = owner_family != VK_QUEUE_FAMILY_IGNORED && owner_family != copy_family;
    uint32_t sf = VK_QUEUE_FAMILY_IGNORED, df = VK_QUEUE_FAMILY_IGNORED;
    VkAccessFlags sa, da;
    VkPipelineStageFlags ss, ds;
    VkImageLayout from, to;
    if (entering) { /* owner -> copy queue: layout_before -> transfer layout */
        from = side_is_src ? e->layout_before : VK_IMAGE_LAYOUT_UNDEFINED; /* dst is overwritten whole */
        to = xfer;
        if (qfot) { sf = owner_family; df = copy_family; }
        sa = any; ss = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
        da = xacc; ds = VK_PIPELINE_STAGE_TRANSFER_BIT;
        if (qfot && on_owner) { da = 0; ds = VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT; }   /* release half */
        if (qfot && !on_owner) { sa = 0; ss = VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT; }     /* acquire half */
    } else { /* copy queue -> owner: transfer layout -> layout_after */
        from = xfer;
        to = e->layout_after;
        if (qfot) { sf = copy_family; df = owner_family; }
        sa = xacc; ss = VK_PIPELINE_STAGE_TRANSFER_BIT;
        da = any; ds = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
        if (qfot && !on_owner) { da = 0; ds = VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT; }  /* release half */
        if (qfot && on_owner) { sa = 0; ss = VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT; }      /* acquire half */
    }
    if (e->image)
        image_barrier(d, cmd, e, from, to, sa, da, ss, ds, sf, df);
    else
        buffer_barrier(d, cmd, e, size, sa, da, ss, ds, sf, df);
}

VkResult vkm_begin_commands(const vkm_device *d, VkCommandBuffer cmd)
{
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    d->fn.vkResetCommandBuffer(cmd, 0);
    return d->fn.vkBeginCommandBuffer(cmd, &bi);
}

/* Submit `cmd` on `q`, waiting on up to two timeline points, signalling `signal` on `s`. */
static VkResult submit(vkm_side *s, vkm_queue *q, VkCommandBuffer cmd, VkSemaphore w0, uint64_t v0,
                       VkSemaphore w1, uint64_t v1, uint64_t signal)
{
    VkSemaphore waits[2];
    uint64_t wvals[2];
    VkPipelineStageFlags stages[2] = {VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT};
    uint32_t nw = 0;
    if (w0) { waits[nw] = w0; wvals[nw++] = v0; }
    if (w1) { waits[nw] = w1; wvals[nw++] = v1; }
    VkTimelineSemaphoreSubmitInfo tl = {.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                                        .waitSemaphoreValueCount = nw,
                                        .pWaitSemaphoreValues = wvals,
                                        .signalSemaphoreValueCount = 1,
                                        .pSignalSemaphoreValues = &signal};
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                       .pNext = &tl,
                       .waitSemaphoreCount = nw,
                       .pWaitSemaphores = waits,
                       .pWaitDstStageMask = stages,
                       .commandBufferCount = 1,
                       .pCommandBuffers = &cmd,
                       .signalSemaphoreCount = 1,
                       .pSignalSemaphores = &s->timeline};
    VkResult r = vkm_queue_submit(s->dev, q, 1, &si, VK_NULL_HANDLE);
    if (r == VK_SUCCESS && signal > s->submitted) s->submitted = signal;
    return r;
}

/* Submit `n` command buffers as n batches on `q`, batch i signalling `first + i`
 * on `s`'s timeline; the first batch optionally waits on (w, wv). One call. */
static VkResult submit_batch(vkm_side *s, vkm_queue *q, VkCommandBuffer *cmds, uint32_t n, VkSemaphore w,
                             uint64_t wv, uint64_t first)
{
    VkSubmitInfo si[16];
    VkTimelineSemaphoreSubmitInfo tl[16];
    uint64_t values[16];
    VkPipelineStageFlags stage = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
    for (uint32_t done = 0; done < n;) {
        uint32_t m = n - done < 16 ? n - done : 16;
        for (uint32_t i = 0; i < m; i++) {
            int waits = (done + i == 0) && w;
            values[i] = first + done + i;
            tl[i] = (VkTimelineSemaphoreSubmitInfo){.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                                                    .waitSemaphoreValueCount = waits ? 1 : 0,
                                                    .pWaitSemaphoreValues = waits ? &wv : NULL,
                                                    .signalSemaphoreValueCount = 1,
                                                    .pSignalSemaphoreValues = &values[i]};
            si[i] = (VkSubmitInfo){.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                   .pNext = &tl[i],
                                   .waitSemaphoreCount = waits ? 1 : 0,
                                   .pWaitSemaphores = waits ? &w : NULL,
                                   .pWaitDstStageMask = waits ? &stage : NULL,
                                   .commandBufferCount = 1,
                                   .pCommandBuffers = &cmds[done + i],
                                   .signalSemaphoreCount = 1,
                                   .pSignalSemaphores = &s->timeline};
        }
        VkResult r = vkm_queue_submit(s->dev, q, m, si, VK_NULL_HANDLE);
        if (r != VK_SUCCESS) return r;
        if (values[m - 1] > s->submitted) s->submitted = values[m - 1];
        done += m;
    }
    return VK_SUCCESS;
}

/* An ownership-transfer submit on the owner queue of `e` (release before the
 * copies or acquire after them), waiting on (w, wv), signalling `signal`. */
static VkResult owner_submit(vkm_link *l, vkm_side *s, const vkm_endpoint *e, VkDeviceSize size, int side_is_src,
                             int entering, VkSemaphore w, uint64_t wv, uint64_t signal, const char **call)
{
    vkm_device *d = s->dev;
    if (!s->owner_pool || s->owner_family != e->owner->family) {
        if (s->owner_pool) {
            /* the family changed: wait until every owner command buffer is free, then rebuild */
            for (int i = 0; i < 4; i++)
                if (s->owner_free_at[i]) {
                    VkResult r = worker_wait(l, s, s->owner_free_at[i], call, "vkWaitSemaphores(owner)");
                    if (r != VK_SUCCESS) return r;
                }
            d->fn.vkDestroyCommandPool(d->device, s->owner_pool, NULL);
            s->owner_pool = VK_NULL_HANDLE;
        }
        TRY(make_pool(d, e->owner->family, &s->owner_pool), "vkCreateCommandPool(owner)");
        TRY(make_cmds(d, s->owner_pool, 4, s->owner_cmds), "vkAllocateCommandBuffers(owner)");
        memset(s->owner_free_at, 0, sizeof(s->owner_free_at));
        s->owner_family = e->owner->family;
    }
    uint32_t i = s->owner_next++ % 4;
    if (s->owner_free_at[i]) {
        VkResult r = worker_wait(l, s, s->owner_free_at[i], call, "vkWaitSemaphores(owner)");
        if (r != VK_SUCCESS) return r;
    }
    VkCommandBuffer cmd = s->owner_cmds[i];
    TRY(vkm_begin_commands(d, cmd), "vkBeginCommandBuffer(owner)");
    ownership_barrier(d, cmd, e, size, side_is_src, entering, 1, e->owner->family, s->queue->family);
    TRY(d->fn.vkEndCommandBuffer(cmd), "vkEndCommandBuffer(owner)");
    TRY(submit(s, e->owner, cmd, w, wv, VK_NULL_HANDLE, 0, signal), "vkQueueSubmit(owner)");
    s->owner_free_at[i] = signal;
    return VK_SUCCESS;
}

void vkm_record_chunk(const vkm_device *d, VkCommandBuffer cmd, const vkm_endpoint *e, VkBuffer ring,
                      VkDeviceSize ring_offset, VkDeviceSize start, VkDeviceSize len, int to_ring)
{
    if (e->image) {
        VkDeviceSize row = (VkDeviceSize)e->width * e->bytes_per_pixel;
        VkBufferImageCopy region = {
            .bufferOffset = ring_offset,
            .imageSubresource = {VK_IMAGE_ASPECT_COLOR_BIT, e->mip_level, e->array_layer, 1},
            .imageOffset = {0, (int32_t)(start / row), 0},
            .imageExtent = {e->width, (uint32_t)(len / row), 1},
        };
        if (to_ring)
            d->fn.vkCmdCopyImageToBuffer(cmd, e->image, VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL, ring, 1, &region);
        else
            d->fn.vkCmdCopyBufferToImage(cmd, ring, e->image, VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL, 1, &region);
    } else {
        VkBufferCopy region = {.size = len};
        if (to_ring) {
            region.srcOffset = e->offset + start;
            region.dstOffset = ring_offset;
            d->fn.vkCmdCopyBuffer(cmd, e->buffer, ring, 1, &region);
        } else {
            region.srcOffset = ring_offset;
            region.dstOffset = e->offset + start;
            d->fn.vkCmdCopyBuffer(cmd, ring, e->buffer, 1, &region);
        }
    }
}

/* Record the copy of chunk `k` of job `j` between endpoint `e` and ring slot `slot`. */
static void record_copy(vkm_side *s, VkCommandBuffer cmd, const vkm_job *j, const vkm_endpoint *e, uint32_t k,
                        VkDeviceSize slot_offset, int to_ring)
{
    vkm_record_chunk(s->dev, cmd, e, s->ring, slot_offset, j->starts[k], j->starts[k + 1] - j->starts[k], to_ring);
}

static VkDeviceSize chunk_len(const vkm_job *j, uint32_t k)
{
    return j->starts[k + 1] - j->starts[k];
}

/* Per-job state of the host link's worker (run_job). */
typedef struct {
    vkm_job *j;
    uint64_t g0;                 /* ring position of chunk 0 */
    uint64_t sv0;                /* source chunk k signals sv0 + k + 1 */
    uint64_t dv;                 /* last destination value handed out */
    uint32_t ns, nr, nd;         /* chunks whose source copy is submitted / dst copy recorded / dst submitted */
    uint32_t src_owner_family, dst_owner_family;
    VkDeviceSize src_span, dst_span;
    VkSemaphore first_wait;
    uint64_t first_wait_value;
} host_run;

/* Record the copy of chunk `c` between the endpoint and its ring slot on the
 * source (is_src) or destination side, with the ownership / layout barriers
 * of a job's first and last chunk. The destination is overwritten whole: it is
 * taken over without an acquire (contents undefined), only its layout changes. */
static VkResult record_chunk_cmd(vkm_link *l, const host_run *h, int is_src, uint32_t c, VkCommandBuffer *out,
                                 const char **call)
{
    vkm_side *X = is_src ? &l->src : &l->dst;
    vkm_device *d = X->dev;
    const vkm_job *j = h->j;
    const vkm_endpoint *e = is_src ? &j->src : &j->dst;
    VkDeviceSize span = is_src ? h->src_span : h->dst_span;
    uint32_t enter_family = is_src ? h->src_owner_family : VK_QUEUE_FAMILY_IGNORED;
    uint32_t leave_family = is_src ? h->src_owner_family : h->dst_owner_family;
    uint32_t s = (uint32_t)((h->g0 + c) % l->cfg.slot_count);
    VkCommandBuffer cmd = X->cmds[s];
    TRY(vkm_begin_commands(d, cmd), is_src ? "vkBeginCommandBuffer(src)" : "vkBeginCommandBuffer(dst)");
    if (c == 0) ownership_barrier(d, cmd, e, span, is_src, 1, 0, enter_family, X->queue->family);
    record_copy(X, cmd, j, e, c, s * l->cfg.slot_size, is_src);
    if (is_src) { /* writes made available to the host domain: the CPU copy or the other device reads them */
        VkMemoryBarrier host = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                                .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
        d->fn.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &host, 0,
                                   NULL, 0, NULL);
    }
    if (c == j->chunks - 1) ownership_barrier(d, cmd, e, span, is_src, 0, 0, leave_family, X->queue->family);
    TRY(d->fn.vkEndCommandBuffer(cmd), is_src ? "vkEndCommandBuffer(src)" : "vkEndCommandBuffer(dst)");
    *out = cmd;
    return VK_SUCCESS;
}

/* Record and submit the source copy of chunk h->ns into its ring slot (free). */
static VkResult src_chunk(vkm_link *l, host_run *h, const char **call)
{
    uint32_t c = h->ns;
    VkCommandBuffer cmd;
    VkResult r = record_chunk_cmd(l, h, 1, c, &cmd, call);
    if (r != VK_SUCCESS) return r;
    VkSemaphore w = c == 0 ? h->first_wait : VK_NULL_HANDLE;
    TRY(submit(&l->src, l->src.queue, cmd, w, h->first_wait_value, VK_NULL_HANDLE, 0, h->sv0 + c + 1),
        "vkQueueSubmit(src)");
    vkm_trace_mark(l->trace, "src_submitted", h->sv0 + c + 1);
    h->ns++;
    return VK_SUCCESS;
}

/* Record (not submit) the destination copy of chunk h->nr. Its slot's command
 * buffer is free: the source copy into the slot waited for the slot's last
 * destination copy. */
static VkResult dst_chunk(vkm_link *l, host_run *h, const char **call)
{
    VkCommandBuffer cmd;
    VkResult r = record_chunk_cmd(l, h, 0, h->nr, &cmd, call);
    if (r != VK_SUCCESS) return r;
    vkm_trace_mark(l->trace, "dst_recorded", h->j->q.dst_base + h->nr + 1);
    h->nr++;
    return VK_SUCCESS;
}

/* Submit, in one call, the recorded destination copies of chunks nd..last-1
 * (their source copies are done); the staging ring copies them across first. */
static VkResult dst_submit(vkm_link *l, host_run *h, uint32_t last, const char **call)
{
    vkm_side *S = &l->src, *D = &l->dst;
    vkm_device *sd = S->dev, *dd = D->dev;
    const vkm_job *j = h->j;
    uint32_t K = l->cfg.slot_count, k = h->nd;
    VkDeviceSize slot = l->cfg.slot_size;
    for (uint32_t c = k; c < last; c++) {
        uint32_t s = (uint32_t)((h->g0 + c) % K);
        if (l->cfg.ring == VKM_RING_STAGING) {
            if (!S->coherent) {
                VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = S->memory,
                                          .offset = 0, .size = VK_WHOLE_SIZE};
                sd->fn.vkInvalidateMappedMemoryRanges(sd->device, 1, &mr);
            }
            team_copy(&l->team, D->mapped + s * slot, S->mapped + s * slot, (size_t)chunk_len(j, c));
            if (!D->coherent) {
                VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = D->memory,
                                          .offset = 0, .size = VK_WHOLE_SIZE};
                dd->fn.vkFlushMappedMemoryRanges(dd->device, 1, &mr);
            }
        }
        l->batch_cmds[c - k] = D->cmds[s];
    }
    VkSemaphore w = k == 0 ? j->dst.wait_semaphore : VK_NULL_HANDLE;
    TRY(submit_batch(D, D->queue, l->batch_cmds, last - k, w, j->dst.wait_value, h->dv + 1), "vkQueueSubmit(dst)");
    vkm_trace_mark(l->trace, "dst_submitted", h->dv + (last - k));
    for (uint32_t c = k; c < last; c++) l->slot_free_at[(h->g0 + c) % K] = ++h->dv;
    h->nd = last;
    return VK_SUCCESS;
}

/* The worker's loop for one job. Each round takes the most urgent step that
 * can go: destination copies whose source chunk is done (one submit); the
 * recording of the next destination copy (ahead of its source chunk, so it
 * goes out the moment that lands); the next source copy into a free slot;
 * else a wait for the oldest source chunk (or for a slot to be read). */
static VkResult run_job(vkm_link *l, vkm_job *j, const char **call)
{
    vkm_side *S = &l->src, *D = &l->dst;
    vkm_device *sd = S->dev, *dd = D->dev;
    uint32_t K = l->cfg.slot_count, N = j->chunks;
    int src_own = needs_ownership(S, &j->src), dst_own = needs_ownership(D, &j->dst);
    host_run h = {.j = j,
                  .g0 = l->chunk_counter,
                  .dv = j->q.dst_base,
                  .src_owner_family = src_own ? j->src.owner->family : VK_QUEUE_FAMILY_IGNORED,
                  .dst_owner_family = dst_own ? j->dst.owner->family : VK_QUEUE_FAMILY_IGNORED,
                  .src_span = j->src.image ? 0 : j->size,
                  .dst_span = j->dst.image ? 0 : j->size,
                  .first_wait = j->src.wait_semaphore,
                  .first_wait_value = j->src.wait_value};
    uint64_t sv = j->q.src_base;
    if (src_own) { /* release from the owner's family (and the wait on the producer) */
        VkResult r = owner_submit(l, S, &j->src, h.src_span, 1, 1, h.first_wait, h.first_wait_value, ++sv, call);
        if (r != VK_SUCCESS) return r;
        h.first_wait = S->timeline;
        h.first_wait_value = sv;
    }
    h.sv0 = sv;
    while (h.nd < N) {
        VkResult r;
        uint64_t have_s = 0;
        TRY(vkm_timeline_value(sd, S->timeline, &have_s), "vkGetSemaphoreCounterValue(src)");
        uint32_t last = h.nd;
        while (last < h.nr && h.sv0 + last + 1 <= have_s) last++;
        if (last > h.nd) { /* 1: every recorded chunk that has landed in the ring */
            r = dst_submit(l, &h, last, call);
        } else if (h.nr == h.nd && h.nr < h.ns) { /* 2: the next destination copy, recorded ahead */
            r = dst_chunk(l, &h, call);
        } else {
            int slot_free = 0;
            if (h.ns < N && h.ns < h.nd + K) {
                uint64_t need = l->slot_free_at[(h.g0 + h.ns) % K], have_d = 0;
                if (need) TRY(vkm_timeline_value(dd, D->timeline, &have_d), "vkGetSemaphoreCounterValue(dst)");
                slot_free = have_d >= need;
            }
            if (slot_free) { /* 3: the next source copy */
                r = src_chunk(l, &h, call);
            } else if (h.nr < h.ns) { /* 4: later destination copies, recorded ahead */
                r = dst_chunk(l, &h, call);
            } else if (h.nd < h.ns) { /* 5: wait for the oldest source chunk */
                r = worker_wait(l, S, h.sv0 + h.nd + 1, call, "vkWaitSemaphores(src chunk)");
            } else { /* 6: wait for the next slot to be read by the destination */
                r = worker_wait(l, D, l->slot_free_at[(h.g0 + h.ns) % K], call, "vkWaitSemaphores(ring slot)");
            }
        }
        if (r != VK_SUCCESS) return r;
    }
    l->chunk_counter += N;
    sv = h.sv0 + N;
    uint64_t dv = h.dv;
    if (src_own) { /* back to the owner's family */
        VkResult r = owner_submit(l, S, &j->src, h.src_span, 1, 0, S->timeline, sv, sv + 1, call);
        if (r != VK_SUCCESS) return r;
    }
    if (dst_own) {
        VkResult r = owner_submit(l, D, &j->dst, h.dst_span, 0, 0, D->timeline, dv, dv + 1, call);
        if (r != VK_SUCCESS) return r;
    }
    return VK_SUCCESS;
}

static void *worker(void *arg)
{
    vkm_link *l = arg;
    int failed;
    vkm_jobq_item *it;
    while ((it = vkm_jobq_take(&l->q, &failed, 0, NULL, NULL)) != NULL) {
        vkm_job *j = (vkm_job *)it;
        vkm_trace_mark(l->trace, "job_taken", it->ticket);
        const char *call = "?";
        VkResult r = failed ? VK_SUCCESS : run_job(l, j, &call);
        if (r == VK_TIMEOUT) r = VKM_ERROR_LINK_STALLED; /* a bounded wait ran out: stuck, not slow */
        if (r != VK_SUCCESS) { /* no dst_ready bound: only this ticket and later ones failed */
            vkm_jobq_fail(&l->q, r, call, NULL, it->ticket, UINT64_MAX);
            vkm_jobq_release(&l->q, l->src.dev, l->src.timeline, l->src.submitted, l->dst.dev, l->dst.timeline,
                             l->dst.submitted, l->cfg.stall_timeout_ns);
        }
        vkm_jobq_finish(&l->q, it, l->cfg.spin_ns);
        free_job(j);
    }
    return NULL;
}
