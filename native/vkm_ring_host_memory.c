/* vkm_ring_host_memory.c - the memory of the staging, host shared and
 * exported rings (see vkm_ring_host.h). */
#include "vkm_ring_host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TRY VKM_TRY
#define MAX_COPY_HELPERS 7

/* A host-visible buffer of `size` bytes on `d`, persistently mapped. */
static VkResult make_staging(const vkm_device *d, host_end *e, VkDeviceSize size, VkBufferUsageFlags usage,
                             int readback, vkm_error *err)
{
    TRY(vkm_make_buffer(d, size, usage, 0, &e->ring), "vkCreateBuffer(staging ring)");
    VkMemoryRequirements req;
    d->fn.vkGetBufferMemoryRequirements(d->device, e->ring, &req);
    VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    int type = vkm_find_memory_type(d, req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
                                    readback ? want | VK_MEMORY_PROPERTY_HOST_CACHED_BIT : want);
    if (type < 0)
        return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkm_find_memory_type",
                        "'%s' has no host-visible memory type for a staging buffer", d->name);
    e->coherent = (d->memory.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
    VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                  .allocationSize = req.size,
                                  .memoryTypeIndex = (uint32_t)type};
    TRY(d->fn.vkAllocateMemory(d->device, &alloc, NULL, &e->memory), "vkAllocateMemory(staging ring)");
    TRY(d->fn.vkBindBufferMemory(d->device, e->ring, e->memory, 0), "vkBindBufferMemory(staging ring)");
    void *p = NULL;
    TRY(d->fn.vkMapMemory(d->device, e->memory, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory(staging ring)");
    e->mapped = p;
    return VK_SUCCESS;
}

/* Whether every memory type of `d` is host-visible: a CPU device (lavapipe),
 * whose "device memory" is host memory that the kernel backs page by page on
 * first touch. */
static int all_host_visible(const vkm_device *d)
{
    if (!d->memory.memoryTypeCount) return 0;
    for (uint32_t i = 0; i < d->memory.memoryTypeCount; i++)
        if (!(d->memory.memoryTypes[i].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) return 0;
    return 1;
}

/* On a CPU device, touch every page of a ring's memory once at creation
 * (`write`: zero it, else read one byte a page), so that the first transfer
 * does not pay the page faults (on a VM ~3-5 ms per MiB first written). The
 * memory is mapped only for this (a staging ring's, `mapped`, stays mapped).
 * Nothing on a GPU, whose memory is resident from its allocation. Best effort:
 * a mapping that fails leaves the pages to be touched by the first copy. */
static void touch_ring(const vkm_device *d, VkDeviceMemory memory, uint8_t *mapped, VkDeviceSize size, int write)
{
    if (!all_host_visible(d) || !size) return;
    void *p = mapped;
    if (!p && d->fn.vkMapMemory(d->device, memory, 0, VK_WHOLE_SIZE, 0, &p) != VK_SUCCESS) return;
    if (write) {
        memset(p, 0, (size_t)size);
    } else {
        volatile const uint8_t *b = p;
        uint8_t sum = 0;
        for (VkDeviceSize at = 0; at < size; at += 4096) sum ^= b[at];
        (void)sum;
    }
    if (!mapped) d->fn.vkUnmapMemory(d->device, memory);
}

/* Import the host block into `d` as a buffer. */
static VkResult import_host(const vkm_device *d, host_end *e, void *block, VkDeviceSize size,
                            VkBufferUsageFlags usage, vkm_error *err)
{
    const VkExternalMemoryHandleTypeFlagBits type = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
    TRY(vkm_make_buffer(d, size, usage, type, &e->ring), "vkCreateBuffer(host import)");
    VkMemoryRequirements req;
    d->fn.vkGetBufferMemoryRequirements(d->device, e->ring, &req);
    VkMemoryHostPointerPropertiesEXT hp = {.sType = VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT};
    TRY(d->fn.vkGetMemoryHostPointerPropertiesEXT(d->device, type, block, &hp),
        "vkGetMemoryHostPointerPropertiesEXT");
    int mt = vkm_find_memory_type(d, req.memoryTypeBits & hp.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
                                  VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    if (mt < 0)
        return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkGetMemoryHostPointerPropertiesEXT",
                        "'%s' can import host memory into no memory type its buffers may use", d->name);
    VkImportMemoryHostPointerInfoEXT imp = {.sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT,
                                            .handleType = type,
                                            .pHostPointer = block};
    VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                  .pNext = &imp,
                                  .allocationSize = size,
                                  .memoryTypeIndex = (uint32_t)mt};
    TRY(d->fn.vkAllocateMemory(d->device, &alloc, NULL, &e->memory), "vkAllocateMemory(host import)");
    TRY(d->fn.vkBindBufferMemory(d->device, e->ring, e->memory, 0), "vkBindBufferMemory(host import)");
    return VK_SUCCESS;
}

/* Allocate exportable memory on the source, export it, import it on the destination. */
static VkResult export_import(vkm_link *l, host_ring *h, VkDeviceSize size, vkm_error *err)
{
    const vkm_device *sd = l->src.dev, *dd = l->dst.dev;
    VkExternalMemoryHandleTypeFlagBits type = l->cfg.export_type;
    TRY(vkm_make_buffer(sd, size, VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT, type,
                        &h->src.ring),
        "vkCreateBuffer(export)");
    VkMemoryRequirements req;
    sd->fn.vkGetBufferMemoryRequirements(sd->device, h->src.ring, &req);
    int mt = vkm_find_memory_type(sd, req.memoryTypeBits, 0, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    if (mt < 0)
        return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkm_find_memory_type",
                        "'%s' has no memory type an exportable buffer may use", sd->name);
    VkMemoryDedicatedAllocateInfo ded = {.sType = VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO,
                                         .buffer = h->src.ring};
    VkExportMemoryAllocateInfo exp = {.sType = VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO,
                                      .pNext = &ded,
                                      .handleTypes = type};
    VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                  .pNext = &exp,
                                  .allocationSize = req.size,
                                  .memoryTypeIndex = (uint32_t)mt};
    TRY(sd->fn.vkAllocateMemory(sd->device, &alloc, NULL, &h->src.memory), "vkAllocateMemory(export)");
    TRY(sd->fn.vkBindBufferMemory(sd->device, h->src.ring, h->src.memory, 0), "vkBindBufferMemory(export)");
    VkMemoryGetFdInfoKHR gfd = {.sType = VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR,
                                .memory = h->src.memory,
                                .handleType = type};
    int fd = -1;
    TRY(sd->fn.vkGetMemoryFdKHR(sd->device, &gfd, &fd), "vkGetMemoryFdKHR");

    VkResult r = vkm_make_buffer(dd, size, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, type,
                                 &h->dst.ring);
    if (r != VK_SUCCESS) {
        close(fd);
        return vkm_fail(err, r, "vkCreateBuffer(import)", NULL);
    }
    VkMemoryRequirements dreq;
    dd->fn.vkGetBufferMemoryRequirements(dd->device, h->dst.ring, &dreq);
    uint32_t bits = dreq.memoryTypeBits;
    if (type != VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT) {
        VkMemoryFdPropertiesKHR fp = {.sType = VK_STRUCTURE_TYPE_MEMORY_FD_PROPERTIES_KHR};
        r = dd->fn.vkGetMemoryFdPropertiesKHR(dd->device, type, fd, &fp);
        if (r != VK_SUCCESS) {
            close(fd);
            return vkm_fail(err, r, "vkGetMemoryFdPropertiesKHR", NULL);
        }
        bits &= fp.memoryTypeBits;
    } else {
        bits &= 1u << mt; /* opaque fd: same driver and device, same memory type */
    }
    int dmt = vkm_find_memory_type(dd, bits, 0, 0);
    if (dmt < 0) {
        close(fd);
        return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkm_find_memory_type",
                        "'%s' cannot import the memory '%s' exported into any memory type its buffers may use",
                        dd->name, sd->name);
    }
    VkMemoryDedicatedAllocateInfo dded = {.sType = VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO,
                                          .buffer = h->dst.ring};
    VkImportMemoryFdInfoKHR imp = {.sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR,
                                   .pNext = &dded,
                                   .handleType = type,
                                   .fd = fd};
    VkMemoryAllocateInfo dalloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                   .pNext = &imp,
                                   .allocationSize = req.size,
                                   .memoryTypeIndex = (uint32_t)dmt};
    r = dd->fn.vkAllocateMemory(dd->device, &dalloc, NULL, &h->dst.memory);
    if (r != VK_SUCCESS) {
        close(fd); /* ownership passes to the driver only on success */
        h->dst.memory = VK_NULL_HANDLE;
        return vkm_fail(err, r, "vkAllocateMemory(import fd)", NULL);
    }
    TRY(dd->fn.vkBindBufferMemory(dd->device, h->dst.ring, h->dst.memory, 0), "vkBindBufferMemory(import)");
    return VK_SUCCESS;
}

VkResult vkm_host_ring_memory(vkm_link *l, host_ring *h, vkm_error *err)
{
    VkDeviceSize slot = l->cfg.slot_size, total = slot * l->cfg.slot_count;
    const vkm_device *sd = l->src.dev, *dd = l->dst.dev;
    unsigned long long n = l->cfg.slot_count, b = (unsigned long long)slot;
    VkResult r;
    switch (l->cfg.ring) {
    case VKM_RING_STAGING: {
        r = make_staging(sd, &h->src, total, VK_BUFFER_USAGE_TRANSFER_DST_BIT, 1, err);
        if (r == VK_SUCCESS) r = make_staging(dd, &h->dst, total, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, 0, err);
        if (r != VK_SUCCESS) return r;
        touch_ring(sd, h->src.memory, h->src.mapped, total, 1);
        touch_ring(dd, h->dst.memory, h->dst.mapped, total, 1);
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        int helpers = cpus > 0 ? (int)(cpus / 4) : 0; /* a quarter of the CPUs copy */
        vkm_copy_team_start(&h->team, helpers > MAX_COPY_HELPERS ? MAX_COPY_HELPERS : helpers);
        h->team_started = 1;
        snprintf(l->ring_note, sizeof l->ring_note,
                 "staging ring: %llu x %llu B host-visible buffers on each device, chunks crossed by a CPU copy on "
                 "%d thread(s)", n, b, h->team.helpers + 1);
        return VK_SUCCESS;
    }
    case VKM_RING_SHARED_HOST: {
        VkDeviceSize align = sd->host_pointer_alignment > dd->host_pointer_alignment ? sd->host_pointer_alignment
                                                                                     : dd->host_pointer_alignment;
        if (align < 256) align = 256;
        h->host_block = aligned_alloc((size_t)align, (size_t)total); /* total is a multiple of align */
        if (!h->host_block) return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "aligned_alloc(host shared ring)", NULL);
        memset(h->host_block, 0, (size_t)total); /* touch the pages once */
        r = import_host(sd, &h->src, h->host_block, total, VK_BUFFER_USAGE_TRANSFER_DST_BIT, err);
        if (r == VK_SUCCESS)
            r = import_host(dd, &h->dst, h->host_block, total, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, err);
        if (r != VK_SUCCESS) return r;
        snprintf(l->ring_note, sizeof l->ring_note,
                 "host shared ring: %llu x %llu B of host memory imported into both devices, no CPU copy", n, b);
        return VK_SUCCESS;
    }
    case VKM_RING_EXPORTED:
        r = export_import(l, h, total, err);
        if (r != VK_SUCCESS) return r;
        touch_ring(sd, h->src.memory, NULL, total, 1); /* the pages themselves */
        touch_ring(dd, h->dst.memory, NULL, total, 0); /* the importer's mapping of them */
        snprintf(l->ring_note, sizeof l->ring_note,
                 "exported ring: %llu x %llu B of memory of '%.64s' exported as %s and imported on '%.64s', no CPU copy", n,
                 b, sd->name, l->cfg.export_type == VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT ? "an opaque fd"
                                                                                               : "a dma-buf",
                 dd->name);
        return VK_SUCCESS;
    default:
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_create", "ring kind %d is not a host ring",
                        l->cfg.ring);
    }
}
