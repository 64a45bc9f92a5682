/* vkm_step.c - recording and submitting a kernel runtime's step (see vkm_step.h). */
#include <stdlib.h>

#include "vkm_step.h"

VkResult vkm_step_begin(const vkm_device *d, VkCommandBuffer cmd)
{
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    VkResult r = d->fn.vkResetCommandBuffer(cmd, 0);
    return r != VK_SUCCESS ? r : d->fn.vkBeginCommandBuffer(cmd, &bi);
}

VkResult vkm_step_end(const vkm_device *d, VkCommandBuffer cmd)
{
    return d->fn.vkEndCommandBuffer(cmd);
}

void vkm_step_abandon(const vkm_device *d, VkCommandBuffer cmd)
{
    d->fn.vkEndCommandBuffer(cmd); /* (recording -> executable; a failed end leaves it invalid: reset either way) */
    d->fn.vkResetCommandBuffer(cmd, 0);
}

void vkm_step_barrier(const vkm_device *d, VkCommandBuffer cmd, int host)
{
    VkAccessFlags any = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT;
    VkMemoryBarrier b = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                         .srcAccessMask = any,
                         .dstAccessMask = host ? any | VK_ACCESS_HOST_READ_BIT : any};
    VkPipelineStageFlags all = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
    d->fn.vkCmdPipelineBarrier(cmd, all, host ? all | VK_PIPELINE_STAGE_HOST_BIT : all, 0, 1, &b, 0, NULL, 0, NULL);
}

void vkm_step_bind_pipeline(const vkm_device *d, VkCommandBuffer cmd, VkPipeline pipeline)
{
    d->fn.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
}

void vkm_step_pass(const vkm_device *d, VkCommandBuffer cmd, VkPipelineLayout layout, VkDescriptorSet set,
                   uint32_t noffsets, const uint32_t *offsets, uint32_t push_bytes, const void *push,
                   uint32_t gx, uint32_t gy, uint32_t gz, VkBuffer indirect, VkDeviceSize indirect_offset)
{
    d->fn.vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, &set, noffsets,
                                  noffsets ? offsets : NULL);
    if (push_bytes)
        d->fn.vkCmdPushConstants(cmd, layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
    if (indirect)
        d->fn.vkCmdDispatchIndirect(cmd, indirect, indirect_offset);
    else
        d->fn.vkCmdDispatch(cmd, gx, gy, gz);
}

void vkm_step_copy(const vkm_device *d, VkCommandBuffer cmd, VkBuffer src, VkBuffer dst, VkDeviceSize src_offset,
                   VkDeviceSize dst_offset, VkDeviceSize size)
{
    VkBufferCopy region = {.srcOffset = src_offset, .dstOffset = dst_offset, .size = size};
    d->fn.vkCmdCopyBuffer(cmd, src, dst, 1, &region);
}

void vkm_step_update(const vkm_device *d, VkCommandBuffer cmd, VkBuffer buffer, VkDeviceSize offset,
                     VkDeviceSize size, const void *data)
{
    d->fn.vkCmdUpdateBuffer(cmd, buffer, offset, size, data);
}

VkResult vkm_step_submit(const vkm_device *d, vkm_queue *q, VkCommandBuffer cmd, uint32_t nwaits,
                         const VkSemaphore *sems, const uint64_t *values, VkSemaphore signal, uint64_t value)
{
    VkPipelineStageFlags stack[16];
    VkPipelineStageFlags *stages = stack;
    if (nwaits > 16) {
        stages = malloc(nwaits * sizeof *stages);
        if (stages == NULL) return VK_ERROR_OUT_OF_HOST_MEMORY;
    }
    for (uint32_t i = 0; i < nwaits; i++) stages[i] = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
    VkTimelineSemaphoreSubmitInfo tl = {.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                                        .waitSemaphoreValueCount = nwaits,
                                        .pWaitSemaphoreValues = nwaits ? values : NULL,
                                        .signalSemaphoreValueCount = 1,
                                        .pSignalSemaphoreValues = &value};
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                       .pNext = &tl,
                       .waitSemaphoreCount = nwaits,
                       .pWaitSemaphores = nwaits ? sems : NULL,
                       .pWaitDstStageMask = nwaits ? stages : NULL,
                       .commandBufferCount = 1,
                       .pCommandBuffers = &cmd,
                       .signalSemaphoreCount = 1,
                       .pSignalSemaphores = &signal};
    VkResult r = vkm_queue_submit(d, q, 1, &si, VK_NULL_HANDLE);
    if (stages != stack) free(stages);
    return r;
}
