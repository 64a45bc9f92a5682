/* vkm_kcopy.h - device-local copies by compute shaders ("kernels").
 *
 * On NVIDIA (H200, driver 580) vkCmdCopyBuffer moves device memory at about
 * 390 GB/s on a universal queue and vkCmdCopyImageToBuffer/BufferToImage at
 * about 81 GB/s, while shader cores reach the memory's bandwidth
 * (bench/RESULTS.md). A vkm_kcopy holds, for one device and queue family, the
 * pipelines of the kernels in native/shaders and one descriptor set per
 * command buffer of its user, and records chunk copies between an endpoint and
 * a ring buffer. Kernels copy bits, never convert: images are read and written
 * through a UINT view of their texel size (4, 8 or 16 bytes).
 */
#ifndef VKM_KCOPY_H
#define VKM_KCOPY_H

#include "vkm_link.h"

typedef struct vkm_kcopy vkm_kcopy;

/* Pipelines for `d` on queue family `family` and `sets` descriptor sets (one
 * per command buffer the caller records with). VKM_ERROR_UNSUPPORTED when the
 * family has no compute. */
VkResult vkm_kcopy_create(const vkm_device *d, uint32_t family, uint32_t sets, vkm_kcopy **out, vkm_error *err);
void vkm_kcopy_destroy(vkm_kcopy *k);

/* Whether kernels can copy endpoint `e` in chunks of up to `max_chunk` bytes:
 * a buffer made with STORAGE_BUFFER usage (e->kernel != 0), or an image with
 * e->kernel_view, a view of the UINT format e->kernel of its texel size (the
 * image made with STORAGE usage and, unless that is its own format,
 * MUTABLE_FORMAT). */
int vkm_kcopy_serves(const vkm_kcopy *k, const vkm_endpoint *e, VkDeviceSize max_chunk);

/* The layout, stages and accesses a kernel-served endpoint is used with. */
#define VKM_KCOPY_IMAGE_LAYOUT VK_IMAGE_LAYOUT_GENERAL
#define VKM_KCOPY_STAGES (VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT)

/* Record the copy of bytes [start, start+len) of endpoint `e` (one it
 * serves) to (to_ring) or from `ring` at `ring_offset` with descriptor set
 * `set` (ring_offset a multiple of 256). Images: whole rows, the image in
 * VKM_KCOPY_IMAGE_LAYOUT. Buffers: the 16-byte-aligned body by kernel, the
 * rest (and chunks the kernel cannot address) by vkCmdCopyBuffer. Returns the
 * bytes the kernel moved. */
VkDeviceSize vkm_kcopy_record(vkm_kcopy *k, VkCommandBuffer cmd, uint32_t set, const vkm_endpoint *e,
                              VkBuffer ring, VkDeviceSize ring_offset, VkDeviceSize start, VkDeviceSize len,
                              int to_ring);

#endif
