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
 *
 * vkm_step_record records a whole step in one call: a command buffer reset and
 * begun, a list of operations (vkm_step_op: passes, barriers, small updates,
 * copies) in order, and ended; the caller (step.pxi) checks every operation
 * first, so the recording itself cannot fail half way on a bad argument.
 */
#ifndef VKM_STEP_H
#define VKM_STEP_H

#include "vkm.h"

#define VKM_STEP_MAX_OFFSETS 4    /* dynamic offsets of one pass's set */
#define VKM_STEP_MAX_PUSH 128     /* push-constant bytes of one pass (Vulkan's guaranteed minimum) */

/* Kinds of vkm_step_op. */
enum {
    VKM_STEP_OP_PASS = 0,          /* vkm_step_pass (a pipeline bound first unless it is the bound one) */
    VKM_STEP_OP_BARRIER = 1,       /* vkm_step_barrier(host=0) */
    VKM_STEP_OP_HOST_BARRIER = 2,  /* vkm_step_barrier(host=1) */
    VKM_STEP_OP_UPDATE = 3,        /* vkm_step_update of `nbytes` of `data` into `buffer` at `offset` */
    VKM_STEP_OP_COPY = 4,          /* vkm_step_copy of `size` bytes, `buffer`+`offset` to `dst`+`dst_offset` */
    VKM_STEP_OP_KINDS = 5
};

/* One operation of a recorded step: a fixed-size record, packed little-endian by
 * step_recorder.py (struct "<4I4I4I8Q128s"; VKM_STEP_OP_BYTES bytes, no padding). */
typedef struct vkm_step_op {
    uint32_t kind;
    uint32_t noffsets;                   /* pass: dynamic offsets of its set */
    uint32_t nbytes;                     /* pass: push-constant bytes (0: none); update: data bytes */
    uint32_t reserved;                   /* 0 */
    uint32_t groups[3];                  /* pass: vkCmdDispatch's workgroup counts (no indirect buffer) */
    uint32_t reserved2;                  /* 0 */
    uint32_t offsets[VKM_STEP_MAX_OFFSETS];
    uint64_t pipeline;                   /* pass: bound first unless it is bound already; 0: the bound one */
    uint64_t layout;                     /* pass */
    uint64_t set;                        /* pass: descriptor set 0 */
    uint64_t buffer;                     /* pass: indirect buffer (0: direct); update: its buffer; copy: source */
    uint64_t offset;                     /* pass: indirect offset; update: buffer offset; copy: source offset */
    uint64_t dst;                        /* copy: destination buffer */
    uint64_t dst_offset;                 /* copy */
    uint64_t size;                       /* copy: bytes (> 0) */
    uint8_t data[VKM_STEP_MAX_PUSH];     /* pass: push constants; update: the bytes */
} vkm_step_op;

#define VKM_STEP_OP_BYTES 240

/* The first operation of `ops` (`n` records of VKM_STEP_OP_BYTES bytes, any alignment)
 * that is not well formed, with a static text saying why in *why; -1 (and NULL): all are. */
long vkm_step_check_ops(const void *ops, size_t n, const char **why);
/* Reset and begin `cmd`, record the `n` operations (checked by vkm_step_check_ops), end it.
 * A failed begin or end leaves the command buffer reset (nothing of it can run). */
VkResult vkm_step_record(const vkm_device *d, VkCommandBuffer cmd, const void *ops, size_t n);

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
#define VKM_SET_MAX_BINDINGS 64   /* bindings of one descriptor set made by vkm_set_make */

/* One descriptor set of `layout` from `pool` (vkAllocateDescriptorSets), its bindings 0..n-1
 * written as buffers: types[i] (a buffer descriptor type), buffers[i], offsets[i], ranges[i]
 * (vkUpdateDescriptorSets), into *out. VK_ERROR_OUT_OF_POOL_MEMORY and VK_ERROR_FRAGMENTED_POOL
 * pass through (the caller tries another pool); nothing is allocated on an error. */
VkResult vkm_set_make(const vkm_device *d, VkDescriptorPool pool, VkDescriptorSetLayout layout, uint32_t n,
                      const uint32_t *types, const VkBuffer *buffers, const VkDeviceSize *offsets,
                      const VkDeviceSize *ranges, VkDescriptorSet *out);
/* vkFreeDescriptorSets of one set of `pool` (a pool made with the free flag). */
VkResult vkm_set_free(const vkm_device *d, VkDescriptorPool pool, VkDescriptorSet set);

/* vkQueueSubmit of `cmd` that waits (all commands) for timeline points (sems[i], values[i])
 * and signals timeline `signal` to `value`. */
VkResult vkm_step_submit(const vkm_device *d, vkm_queue *q, VkCommandBuffer cmd, uint32_t nwaits,
                         const VkSemaphore *sems, const uint64_t *values, VkSemaphore signal, uint64_t value);

#endif
