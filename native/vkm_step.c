/* vkm_step.c - recording and submitting a kernel runtime's step (see vkm_step.h). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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

VkResult vkm_set_make(const vkm_device *d, VkDescriptorPool pool, VkDescriptorSetLayout layout, uint32_t n,
                      const uint32_t *types, const VkBuffer *buffers, const VkDeviceSize *offsets,
                      const VkDeviceSize *ranges, VkDescriptorSet *out)
{
    VkDescriptorBufferInfo infos[VKM_SET_MAX_BINDINGS];
    VkWriteDescriptorSet writes[VKM_SET_MAX_BINDINGS];
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                      .descriptorPool = pool, .descriptorSetCount = 1, .pSetLayouts = &layout};
    VkDescriptorSet set = VK_NULL_HANDLE;
    VkResult r;
    if (n > VKM_SET_MAX_BINDINGS) return VK_ERROR_INITIALIZATION_FAILED;   /* (the binding checks first) */
    r = d->fn.vkAllocateDescriptorSets(d->device, &ai, &set);
    if (r != VK_SUCCESS) return r;
    for (uint32_t i = 0; i < n; i++) {
        infos[i] = (VkDescriptorBufferInfo){.buffer = buffers[i], .offset = offsets[i], .range = ranges[i]};
        writes[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set,
                                           .dstBinding = i, .descriptorCount = 1,
                                           .descriptorType = (VkDescriptorType)types[i], .pBufferInfo = &infos[i]};
    }
    if (n) d->fn.vkUpdateDescriptorSets(d->device, n, writes, 0, NULL);
    *out = set;
    return VK_SUCCESS;
}

VkResult vkm_set_free(const vkm_device *d, VkDescriptorPool pool, VkDescriptorSet set)
{
    return d->fn.vkFreeDescriptorSets(d->device, pool, 1, &set);
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

_Static_assert(sizeof(vkm_step_op) == VKM_STEP_OP_BYTES, "vkm_step_op must have no padding");
_Static_assert(offsetof(vkm_step_op, pipeline) == 48, "vkm_step_op's layout is step_recorder.py's");

static const char *check_op(const vkm_step_op *op)
{
    switch (op->kind) {
    case VKM_STEP_OP_PASS:
        if (!op->layout) return "a pass needs a non-null pipeline layout";
        if (!op->set) return "a pass needs a non-null descriptor set";
        if (op->noffsets > VKM_STEP_MAX_OFFSETS) return "a pass has at most VKM_STEP_MAX_OFFSETS (4) dynamic offsets";
        if (op->nbytes > VKM_STEP_MAX_PUSH || op->nbytes % 4)
            return "a pass's push constants must be a multiple of 4 bytes, at most 128";
        if (op->buffer && op->offset % 4) return "an indirect dispatch's offset must be a multiple of 4";
        return NULL;
    case VKM_STEP_OP_BARRIER:
    case VKM_STEP_OP_HOST_BARRIER:
        return NULL;
    case VKM_STEP_OP_UPDATE:
        if (!op->buffer) return "an update needs a non-null buffer";
        if (op->nbytes == 0 || op->nbytes > VKM_STEP_MAX_PUSH || op->nbytes % 4 || op->offset % 4)
            return "an update needs 4 to 128 bytes, a multiple of 4, at an offset that is one";
        return NULL;
    case VKM_STEP_OP_COPY:
        if (!op->buffer || !op->dst) return "a copy needs non-null src and dst buffers";
        if (op->size == 0) return "a copy's size must be > 0";
        return NULL;
    default:
        return "unknown operation kind";
    }
}

long vkm_step_check_ops(const void *ops, size_t n, const char **why)
{
    const unsigned char *p = ops;
    vkm_step_op op;
    for (size_t i = 0; i < n; i++) {
        memcpy(&op, p + i * VKM_STEP_OP_BYTES, sizeof op);
        const char *bad = check_op(&op);
        if (bad) {
            *why = bad;
            return (long)i;
        }
    }
    *why = NULL;
    return -1;
}

VkResult vkm_step_record(const vkm_device *d, VkCommandBuffer cmd, const void *ops, size_t n)
{
    const unsigned char *p = ops;
    VkPipeline bound = VK_NULL_HANDLE;
    vkm_step_op op;
    VkResult r = vkm_step_begin(d, cmd);
    if (r != VK_SUCCESS) {
        d->fn.vkResetCommandBuffer(cmd, 0);
        return r;
    }
    for (size_t i = 0; i < n; i++) {
        memcpy(&op, p + i * VKM_STEP_OP_BYTES, sizeof op);
        switch (op.kind) {
        case VKM_STEP_OP_PASS:
            if (op.pipeline && (VkPipeline)(uintptr_t)op.pipeline != bound) {
                bound = (VkPipeline)(uintptr_t)op.pipeline;
                vkm_step_bind_pipeline(d, cmd, bound);
            }
            vkm_step_pass(d, cmd, (VkPipelineLayout)(uintptr_t)op.layout, (VkDescriptorSet)(uintptr_t)op.set,
                          op.noffsets, op.offsets, op.nbytes, op.data, op.groups[0], op.groups[1], op.groups[2],
                          (VkBuffer)(uintptr_t)op.buffer, op.offset);
            break;
        case VKM_STEP_OP_BARRIER:
        case VKM_STEP_OP_HOST_BARRIER:
            vkm_step_barrier(d, cmd, op.kind == VKM_STEP_OP_HOST_BARRIER);
            break;
        case VKM_STEP_OP_UPDATE:
            vkm_step_update(d, cmd, (VkBuffer)(uintptr_t)op.buffer, op.offset, op.nbytes, op.data);
            break;
        case VKM_STEP_OP_COPY:
            vkm_step_copy(d, cmd, (VkBuffer)(uintptr_t)op.buffer, (VkBuffer)(uintptr_t)op.dst, op.offset,
                          op.dst_offset, op.size);
            break;
        default:   /* (checked before: never) */
            break;
        }
    }
    r = vkm_step_end(d, cmd);
    if (r != VK_SUCCESS) d->fn.vkResetCommandBuffer(cmd, 0);
    return r;
}
