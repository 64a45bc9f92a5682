/* vkm_cuda_ring.c - making and freeing the CUDA_PEER ring (see vkm_cuda_ring.h). */
#include "vkm_cuda_ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TRY VKM_TRY
#define CU_GO VKM_CU_GO
#define RING_USAGE \
    (VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)

VkResult vkm_cuda_push(vkm_CUcontext ctx, vkm_error *err)
{
    vkm_CUresult cr = vkm_cu.cuCtxPushCurrent(ctx);
    return cr == VKM_CUDA_SUCCESS ? VK_SUCCESS : vkm_cuda_fail(err, "cuCtxPushCurrent", cr);
}

void vkm_cuda_pop(void)
{
    vkm_CUcontext popped;
    vkm_cu.cuCtxPopCurrent(&popped);
}

/* The end's ring buffer, of memory shared with CUDA through an opaque fd. */
static VkResult make_ring_buffer(const vkm_device *d, cuda_ring *c, cu_end *e)
{
    return vkm_make_buffer(d, c->ring_bytes, RING_USAGE, VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT, &e->ring);
}

/* The end's ring: one dedicated, exportable, device-local buffer, imported
 * into CUDA on the same GPU and mapped once. */
static VkResult make_ring(const vkm_device *d, cuda_ring *c, cu_end *e, vkm_error *err)
{
    const VkExternalMemoryHandleTypeFlagBits type = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
    TRY(make_ring_buffer(d, c, e), "vkCreateBuffer(CUDA ring)");
    VkMemoryRequirements req;
    d->fn.vkGetBufferMemoryRequirements(d->device, e->ring, &req);
    int mt = vkm_find_memory_type(d, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
    if (mt < 0)
        return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkm_find_memory_type",
                        "'%s' has no device-local memory type an exportable buffer may use", d->name);
    VkMemoryDedicatedAllocateInfo ded = {.sType = VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO,
                                         .buffer = e->ring};
    VkExportMemoryAllocateInfo exp = {.sType = VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO,
                                      .pNext = &ded,
                                      .handleTypes = type};
    VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                  .pNext = &exp,
                                  .allocationSize = req.size,
                                  .memoryTypeIndex = (uint32_t)mt};
    TRY(d->fn.vkAllocateMemory(d->device, &alloc, NULL, &e->memory), "vkAllocateMemory(CUDA ring)");
    TRY(d->fn.vkBindBufferMemory(d->device, e->ring, e->memory, 0), "vkBindBufferMemory(CUDA ring)");
    VkMemoryGetFdInfoKHR gfd = {.sType = VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR,
                                .memory = e->memory,
                                .handleType = type};
    int fd = -1;
    TRY(d->fn.vkGetMemoryFdKHR(d->device, &gfd, &fd), "vkGetMemoryFdKHR(CUDA ring)");

    vkm_CUDA_EXTERNAL_MEMORY_HANDLE_DESC desc;
    memset(&desc, 0, sizeof desc);
    desc.type = VKM_CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
    desc.handle.fd = fd;
    desc.size = req.size; /* the whole allocation, as Vulkan made it */
    desc.flags = VKM_CUDA_EXTERNAL_MEMORY_DEDICATED;
    VkResult r = vkm_cuda_push(e->ctx, err);
    if (r != VK_SUCCESS) {
        close(fd);
        return r;
    }
    vkm_CUresult cr = vkm_cu.cuImportExternalMemory(&e->ext_mem, &desc);
    if (cr != VKM_CUDA_SUCCESS) {
        close(fd); /* ownership passes to CUDA only on success */
        e->ext_mem = NULL;
        r = vkm_cuda_fail(err, "cuImportExternalMemory", cr);
        goto out;
    }
    vkm_CUDA_EXTERNAL_MEMORY_BUFFER_DESC bd;
    memset(&bd, 0, sizeof bd);
    bd.offset = 0;
    bd.size = c->ring_bytes;
    CU_GO(vkm_cu.cuExternalMemoryGetMappedBuffer(&e->ring_ptr, e->ext_mem, &bd), "cuExternalMemoryGetMappedBuffer");
out:
    vkm_cuda_pop();
    return r;
}

/* The end's stream and events, in its context. */
static VkResult make_stream(cu_end *e, uint32_t K, vkm_error *err)
{
    e->events = calloc(K, sizeof(vkm_CUevent));
    if (!e->events) return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "calloc(CUDA events)", NULL);
    VkResult r = vkm_cuda_push(e->ctx, err);
    if (r != VK_SUCCESS) return r;
    CU_GO(vkm_cu.cuStreamCreate(&e->stream, VKM_CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    for (uint32_t i = 0; i < K; i++)
        CU_GO(vkm_cu.cuEventCreate(&e->events[i], VKM_CU_EVENT_DISABLE_TIMING), "cuEventCreate");
out:
    vkm_cuda_pop();
    return r;
}

static VkResult enable_peer(vkm_CUcontext from, vkm_CUcontext to, vkm_error *err)
{
    VkResult r = vkm_cuda_push(from, err);
    if (r != VK_SUCCESS) return r;
    vkm_CUresult cr = vkm_cu.cuCtxEnablePeerAccess(to, 0);
    vkm_cuda_pop();
    if (cr == VKM_CUDA_SUCCESS || cr == VKM_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return VK_SUCCESS;
    return vkm_cuda_fail(err, "cuCtxEnablePeerAccess", cr);
}

/* Undo make_landing (Vulkan's import first, then CUDA's allocation). */
static void free_landing(const vkm_device *d, cu_end *e)
{
    if (e->ring) d->fn.vkDestroyBuffer(d->device, e->ring, NULL);
    if (e->memory) d->fn.vkFreeMemory(d->device, e->memory, NULL);
    e->ring = VK_NULL_HANDLE;
    e->memory = VK_NULL_HANDLE;
    if (e->vmm_reserved && vkm_cuda_push(e->ctx, NULL) == VK_SUCCESS) {
        if (e->vmm_mapped) vkm_cu.cuMemUnmap(e->ring_ptr, e->vmm_size);
        vkm_cu.cuMemAddressFree(e->ring_ptr, e->vmm_size);
        vkm_cuda_pop();
    }
    if (e->vmm) vkm_cu.cuMemRelease(e->vmm);
    e->vmm = 0;
    e->vmm_mapped = e->vmm_reserved = 0;
    e->ring_ptr = 0;
}

/* The destination's landing ring: device memory CUDA allocates on the
 * destination GPU (readable and writable by both GPUs), exported as a POSIX fd
 * and imported into Vulkan there. The peer copy writes it directly, with no
 * bounce ring and no CUDA work on the destination GPU: CUDA's local copy there
 * would take turns on the GPU with the destination's Vulkan copies. On
 * failure everything is undone and `err` says why. */
static VkResult make_landing(const vkm_device *d, cuda_ring *c, cu_end *e, vkm_error *err)
{
    vkm_CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = VKM_CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = VKM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = VKM_CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = vkm_cuda_device(e->cu_index);
    vkm_CUmemAccessDesc access[2];
    memset(access, 0, sizeof access);
    access[0].location = prop.location;
    access[1].location.type = VKM_CU_MEM_LOCATION_TYPE_DEVICE;
    access[1].location.id = vkm_cuda_device(c->src.cu_index);
    access[0].flags = access[1].flags = VKM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    int fd = -1;
    VkResult r = vkm_cuda_push(e->ctx, err);
    if (r != VK_SUCCESS) return r;
    size_t gran = 0;
    CU_GO(vkm_cu.cuMemGetAllocationGranularity(&gran, &prop, VKM_CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    if (!gran) gran = 2 << 20;
    e->vmm_size = ((size_t)c->ring_bytes + gran - 1) / gran * gran;
    CU_GO(vkm_cu.cuMemCreate(&e->vmm, e->vmm_size, &prop, 0), "cuMemCreate(landing ring)");
    CU_GO(vkm_cu.cuMemAddressReserve(&e->ring_ptr, e->vmm_size, 0, 0, 0), "cuMemAddressReserve");
    e->vmm_reserved = 1;
    CU_GO(vkm_cu.cuMemMap(e->ring_ptr, e->vmm_size, 0, e->vmm, 0), "cuMemMap");
    e->vmm_mapped = 1;
    CU_GO(vkm_cu.cuMemSetAccess(e->ring_ptr, e->vmm_size, access, 2), "cuMemSetAccess(both GPUs)");
    CU_GO(vkm_cu.cuMemExportToShareableHandle(&fd, e->vmm, VKM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle(POSIX fd)");
out:
    vkm_cuda_pop();
    if (r == VK_SUCCESS) {
        r = make_ring_buffer(d, c, e);
        if (r != VK_SUCCESS) vkm_fail(err, r, "vkCreateBuffer(landing ring)", NULL);
    }
    if (r == VK_SUCCESS) {
        VkMemoryRequirements req;
        d->fn.vkGetBufferMemoryRequirements(d->device, e->ring, &req);
        int mt = vkm_find_memory_type(d, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
        if (mt < 0 || req.size > e->vmm_size) {
            r = vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkGetBufferMemoryRequirements(landing ring)",
                         "the landing ring's buffer needs %llu B of memory types 0x%x; CUDA exported %zu B",
                         (unsigned long long)req.size, req.memoryTypeBits, e->vmm_size);
        } else {
            VkImportMemoryFdInfoKHR imp = {.sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR,
                                           .handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT,
                                           .fd = fd};
            VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                          .pNext = &imp,
                                          .allocationSize = e->vmm_size,
                                          .memoryTypeIndex = (uint32_t)mt};
            r = d->fn.vkAllocateMemory(d->device, &alloc, NULL, &e->memory);
            if (r == VK_SUCCESS) {
                fd = -1; /* Vulkan owns it now */
                r = d->fn.vkBindBufferMemory(d->device, e->ring, e->memory, 0);
                if (r != VK_SUCCESS) vkm_fail(err, r, "vkBindBufferMemory(landing ring)", NULL);
            } else {
                e->memory = VK_NULL_HANDLE;
                vkm_fail(err, r, "vkAllocateMemory(landing ring)",
                         "Vulkan cannot import the memory CUDA exported (vkAllocateMemory with "
                         "VkImportMemoryFdInfoKHR returned VkResult %d)", (int)r);
            }
        }
    }
    if (fd >= 0) close(fd);
    if (r != VK_SUCCESS) free_landing(d, e);
    return r;
}

VkResult vkm_cuda_ring_make(vkm_link *l, cuda_ring *c, vkm_error *err)
{
    cu_end *ends[2] = {&c->src, &c->dst};
    vkm_side *sides[2] = {&l->src, &l->dst};
    for (int i = 0; i < 2; i++) {
        vkm_CUresult cr = vkm_cu.cuDevicePrimaryCtxRetain(&ends[i]->ctx, vkm_cuda_device(ends[i]->cu_index));
        if (cr != VKM_CUDA_SUCCESS) return vkm_cuda_fail(err, "cuDevicePrimaryCtxRetain", cr);
        ends[i]->ctx_retained = 1;
    }
    VkResult r = enable_peer(c->src.ctx, c->dst.ctx, err);
    if (r == VK_SUCCESS) r = enable_peer(c->dst.ctx, c->src.ctx, err);
    for (int i = 0; i < 2 && r == VK_SUCCESS; i++) {
        r = make_stream(ends[i], c->K, err);
        if (r == VK_SUCCESS) {
            /* without kernels (no compute on the family, pipelines refused) copy commands do it all */
            VkResult kr = vkm_kcopy_create(sides[i]->dev, sides[i]->queue->family, l->ncmd, &ends[i]->kc, NULL);
            if (kr == VK_ERROR_OUT_OF_HOST_MEMORY) r = vkm_fail(err, kr, "vkm_kcopy_create", NULL);
        }
    }
    if (r == VK_SUCCESS) r = make_ring(l->src.dev, c, &c->src, err);
    if (r != VK_SUCCESS) return r;
    /* the destination ring: a landing ring; else (the drivers refuse) Vulkan
     * memory imported into CUDA, fed by a CUDA bounce ring and a local copy */
    vkm_error why;
    vkm_error_clear(&why);
    if (l->cfg.cuda_bounce_ring)
        r = vkm_fail(&why, VKM_ERROR_UNSUPPORTED, "vkm_link_create", "the bounce ring was asked for");
    else
        r = make_landing(l->dst.dev, c, &c->dst, &why);
    if (r == VK_SUCCESS) {
        c->landing = 1;
        snprintf(l->ring_note, sizeof l->ring_note,
                 "landing ring: CUDA memory on the destination GPU imported into Vulkan; one NVLink copy per chunk, "
                 "no CUDA work on the destination GPU");
        return VK_SUCCESS;
    }
    if (r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_DEVICE_LOST) {
        if (err) *err = why;
        return r;
    }
    if (!why.message[0])
        snprintf(why.message, sizeof why.message, "%s returned VkResult %d", why.where ? why.where : "?", (int)r);
    snprintf(l->ring_note, sizeof l->ring_note,
             "bounce ring: NVLink copy into CUDA memory, then a local copy into Vulkan memory (no landing ring: %.200s)",
             why.message);
    r = make_ring(l->dst.dev, c, &c->dst, err);
    if (r != VK_SUCCESS) return r;
    r = vkm_cuda_push(c->dst.ctx, err);
    if (r != VK_SUCCESS) return r;
    CU_GO(vkm_cu.cuMemAlloc(&c->bounce, (size_t)c->ring_bytes), "cuMemAlloc(bounce ring)");
out:
    vkm_cuda_pop();
    return r;
}

int vkm_cuda_ring_drain(vkm_link *l, cuda_ring *c)
{
    int ok = 1;
    cu_end *ends[2] = {&c->src, &c->dst};
    for (int i = 0; i < 2; i++) {
        cu_end *e = ends[i];
        if (!e->stream || vkm_cuda_push(e->ctx, NULL) != VK_SUCCESS) continue;
        uint64_t t0 = vkm_now_ns();
        for (;;) {
            vkm_CUresult cr = vkm_cu.cuStreamQuery(e->stream);
            if (cr != VKM_CUDA_ERROR_NOT_READY) break; /* done, or the context is dead */
            if (vkm_now_ns() - t0 >= l->cfg.stall_timeout_ns) {
                ok = 0;
                break;
            }
            struct timespec nap = {0, 100000};
            nanosleep(&nap, NULL);
        }
        vkm_cuda_pop();
    }
    return ok;
}

static void free_cuda(cu_end *e, uint32_t K, vkm_CUdeviceptr *bounce)
{
    if (!e->ctx_retained) return;
    if (vkm_cuda_push(e->ctx, NULL) == VK_SUCCESS) {
        for (uint32_t i = 0; e->events && i < K; i++)
            if (e->events[i]) {
                vkm_cu.cuEventDestroy(e->events[i]);
                e->events[i] = NULL;
            }
        if (e->stream) vkm_cu.cuStreamDestroy(e->stream);
        if (bounce && *bounce) vkm_cu.cuMemFree(*bounce);
        if (e->ring_ptr) vkm_cu.cuMemFree(e->ring_ptr);
        if (e->ext_mem) vkm_cu.cuDestroyExternalMemory(e->ext_mem);
        vkm_cuda_pop();
    }
    e->stream = NULL;
    e->ring_ptr = 0;
    e->ext_mem = NULL;
    if (bounce) *bounce = 0;
    vkm_cu.cuDevicePrimaryCtxRelease(vkm_cuda_device(e->cu_index));
    e->ctx_retained = 0;
}

static void free_ring_memory(const vkm_device *d, cu_end *e)
{
    if (e->ring) d->fn.vkDestroyBuffer(d->device, e->ring, NULL);
    if (e->memory) d->fn.vkFreeMemory(d->device, e->memory, NULL);
}

void vkm_cuda_ring_free(vkm_link *l, cuda_ring *c, int drained)
{
    if (drained) {
        /* CUDA's imports go before the Vulkan memory they map */
        vkm_kcopy_destroy(c->src.kc);
        vkm_kcopy_destroy(c->dst.kc);
        free_cuda(&c->src, c->K, NULL);
        if (c->landing) free_landing(l->dst.dev, &c->dst); /* Vulkan's import, then CUDA's memory */
        free_cuda(&c->dst, c->K, &c->bounce);
        free_ring_memory(l->src.dev, &c->src);
        free_ring_memory(l->dst.dev, &c->dst);
    }
    /* else a GPU is stuck on this link's work: its memory and CUDA objects are
     * left alive (leaked) rather than freed under a running copy */
    free(c->src.events);
    free(c->dst.events);
}
