/* vkm_commands.c - recording and submitting a link's copies (see vkm_ring.h). */
#include "vkm_kcopy.h"
#include "vkm_ring.h"

VkResult vkm_make_buffer(const vkm_device *d, VkDeviceSize size, VkBufferUsageFlags usage,
                         VkExternalMemoryHandleTypeFlags external, VkBuffer *out)
{
    VkExternalMemoryBufferCreateInfo ext = {.sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
                                            .handleTypes = external};
    VkBufferCreateInfo info = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                               .pNext = external ? &ext : NULL,
                               .size = size,
                               .usage = usage,
                               .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = d->fn.vkCreateBuffer(d->device, &info, NULL, out);
    if (r != VK_SUCCESS) *out = VK_NULL_HANDLE;
    return r;
}

VkResult vkm_begin_commands(const vkm_device *d, VkCommandBuffer cmd)
{
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    d->fn.vkResetCommandBuffer(cmd, 0);
    return d->fn.vkBeginCommandBuffer(cmd, &bi);
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

void vkm_endpoint_barrier(const vkm_device *d, VkCommandBuffer cmd, const vkm_endpoint *e, VkDeviceSize size,
                          int is_src, int entering, int on_owner, uint32_t owner_family, uint32_t copy_family,
                          int flags)
{
    int kstages = (flags & VKM_BARRIER_KERNEL_STAGES) != 0;
    VkImageLayout xfer = (flags & VKM_BARRIER_KERNEL_LAYOUT) ? VKM_KCOPY_IMAGE_LAYOUT
                         : is_src                           ? VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL
                                                            : VK_IMAGE_LAYOUT_TRANSFER_DST_OPTIMAL;
    VkAccessFlags xacc = is_src ? VK_ACCESS_TRANSFER_READ_BIT : VK_ACCESS_TRANSFER_WRITE_BIT;
    if (kstages) xacc |= is_src ? VK_ACCESS_SHADER_READ_BIT : VK_ACCESS_SHADER_WRITE_BIT;
    VkPipelineStageFlags xstage = kstages ? VKM_KCOPY_STAGES : VK_PIPELINE_STAGE_TRANSFER_BIT;
    VkAccessFlags any = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT;
    int qfot = owner_family != VK_QUEUE_FAMILY_IGNORED && owner_family != copy_family;
    uint32_t sf = VK_QUEUE_FAMILY_IGNORED, df = VK_QUEUE_FAMILY_IGNORED;
    VkAccessFlags sa, da;
    VkPipelineStageFlags ss, ds;
    VkImageLayout from, to;
    if (entering) { /* owner -> copy queue: layout_before -> the copy's layout */
        from = is_src ? e->layout_before : VK_IMAGE_LAYOUT_UNDEFINED; /* dst is overwritten whole */
        to = xfer;
        if (qfot) { sf = owner_family; df = copy_family; }
        sa = any; ss = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
        da = xacc; ds = xstage;
        if (qfot && on_owner) { da = 0; ds = VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT; } /* release half */
        if (qfot && !on_owner) { sa = 0; ss = VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT; }   /* acquire half */
    } else { /* copy queue -> owner: the copy's layout -> layout_after */
        from = xfer;
        to = e->layout_after;
        if (qfot) { sf = copy_family; df = owner_family; }
        sa = xacc; ss = xstage;
        da = any; ds = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
        if (qfot && !on_owner) { da = 0; ds = VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT; } /* release half */
        if (qfot && on_owner) { sa = 0; ss = VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT; }     /* acquire half */
    }
    if (e->image) {
        VkImageMemoryBarrier b = {
            .sType = VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER,
            .srcAccessMask = sa,
            .dstAccessMask = da,
            .oldLayout = from,
            .newLayout = to,
            .srcQueueFamilyIndex = sf,
            .dstQueueFamilyIndex = df,
            .image = e->image,
            .subresourceRange = {VK_IMAGE_ASPECT_COLOR_BIT, e->mip_level, 1, e->array_layer, 1},
        };
        d->fn.vkCmdPipelineBarrier(cmd, ss, ds, 0, 0, NULL, 0, NULL, 1, &b);
    } else {
        VkBufferMemoryBarrier b = {
            .sType = VK_STRUCTURE_TYPE_BUFFER_MEMORY_BARRIER,
            .srcAccessMask = sa,
            .dstAccessMask = da,
            .srcQueueFamilyIndex = sf,
            .dstQueueFamilyIndex = df,
            .buffer = e->buffer,
            .offset = e->offset,
            .size = size,
        };
        d->fn.vkCmdPipelineBarrier(cmd, ss, ds, 0, 0, NULL, 1, &b, 0, NULL);
    }
}

VkResult vkm_submit(vkm_side *s, vkm_queue *q, VkCommandBuffer cmd, VkSemaphore w0, uint64_t v0, VkSemaphore w1,
                    uint64_t v1, uint64_t signal)
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

VkResult vkm_submit_batch(vkm_side *s, VkCommandBuffer *cmds, uint32_t n, VkSemaphore w, uint64_t wv,
                          uint64_t first)
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
        VkResult r = vkm_queue_submit(s->dev, s->queue, m, si, VK_NULL_HANDLE);
        if (r != VK_SUCCESS) return r;
        if (values[m - 1] > s->submitted) s->submitted = values[m - 1];
        done += m;
    }
    return VK_SUCCESS;
}
