/* vkm_step.h - recording and submitting one step of a kernel runtime's device
 * (src/vkmulti/kernels/engine/step_recorder.py decides what a step records;
 * these record it through the device's function table, one call per pass).
 *
 * Every pass of a step is the same shape: bind a compute pipeline's descriptor
 * set 0 with its dynamic offsets, push constants, dispatch (directly or from a
 * buffer). Barriers are global memory barriers (everything before, for
 * everything after; `host`: and for host reads). The recording functions
 * return nothing (Vulkan's vkCmd* do not fail); the caller checks its
 * arguments. vkm_step_submit goes through vkm_queue_submit (the queue's lock,
 * the device's lost flag).
 */
#ifndef VKM_STEP_H
#define VKM_STEP_H

#include "vkm.h"

#define VKM_STEP_MAX_OFFSETS 4    /* dynamic offsets of one pass's set */
#define VKM_STEP_MAX_PUSH 128     /* push-constant bytes of one pass (Vulkan's guaranteed minimum) */

/* vkResetCommandBuffer + vkBeginCommandBuffer (one-time submit). */
VkResult vkm_step_begin(const vkm_device *d, VkCommandBuffer cmd);
VkResult vkm_step_end(const vkm_device *d, VkCommandBuffer cmd);
/* End and reset a command buffer being recorded: nothing recorded in it can run. */
void vkm_step_abandon(const vkm_device *d, VkCommandBuffer cmd);
void vkm_step_barrier(const vkm_device *d, VkCommandBuffer cmd, int host);
void vkm_step_bind_pipeline(const vkm_device *d, VkCommandBuffer cmd, VkPipeline pipeline);
/* One pass: set 0 of `layout` with `noffsets` dynamic offsets, `push_bytes` of push
 * constants (0: none), then vkCmdDispatch(gx, gy, gz), or, with `indirect` not
 * null, vkCmdDispatchIndirect(indirect, indirect_offset). */
void vkm_step_pass(const vkm_device *d, VkCommandBuffer cmd, VkPipelineLayout layout, VkDescriptorSet set,
                   uint32_t noffsets, const uint32_t *offsets, uint32_t push_bytes, const void *push,
                   uint32_t gx, uint32_t gy, uint32_t gz, VkBuffer indirect, VkDeviceSize indirect_offset);
void vkm_step_copy(const vkm_device *d, VkCommandBuffer cmd, VkBuffer src, VkBuffer dst, VkDeviceSize src_offset,
                   VkDeviceSize dst_offset, VkDeviceSize size);
/* vkCmdUpdateBuffer: `size` a multiple of 4, at most 65536. */
void vkm_step_update(const vkm_device *d, VkCommandBuffer cmd, VkBuffer buffer, VkDeviceSize offset,
                     VkDeviceSize size, const void *data);
/* vkQueueSubmit of `cmd` that waits (all commands) for timeline points (sems[i], values[i])
 * and signals timeline `signal` to `value`. */
VkResult vkm_step_submit(const vkm_device *d, vkm_queue *q, VkCommandBuffer cmd, uint32_t nwaits,
                         const VkSemaphore *sems, const uint64_t *values, VkSemaphore signal, uint64_t value);

#endif
