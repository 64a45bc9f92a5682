/* vkm_transfer.h - the cross-device transfer engine ("links").
 *
 * A link moves bytes from one device to another through a ring of slots:
 *   - VKM_RING_STAGING:     a host-visible buffer on each device + CPU copy
 *   - VKM_RING_SHARED_HOST: one host allocation imported into both devices
 *                           (VK_EXT_external_memory_host), no CPU copy
 *   - VKM_RING_EXPORTED:    memory allocated on the source, exported as an fd
 *                           (opaque fd or dma-buf) and imported on the destination
 * A native worker thread per link chunks each job, keeps the source copies up
 * to `slot_count` chunks ahead, waits for each source chunk on the host (no
 * GIL, no queue-idle waits) and submits the destination copy. Every chunk
 * signals a timeline semaphore on its device: the last source value is
 * "src_done", the last destination value is "dst_ready".
 */
#ifndef VKM_TRANSFER_H
#define VKM_TRANSFER_H

#include "vkm.h"

enum { VKM_RING_STAGING = 0, VKM_RING_SHARED_HOST = 1, VKM_RING_EXPORTED = 2 };

/* A link whose worker waited longer than its stall timeout for a GPU (or for
 * a caller's wait semaphore): the job and every later one fail with this. */
#define VKM_ERROR_LINK_STALLED ((VkResult)-1000990001)

typedef struct vkm_endpoint {
    /* a buffer (image == VK_NULL_HANDLE) ... */
    VkBuffer buffer;
    VkDeviceSize offset;
    /* ... or a whole 2D colour image (mip 0, one layer) */
    VkImage image;
    uint32_t width, height, bytes_per_pixel;
    uint32_t mip_level, array_layer;
    VkImageLayout layout_before, layout_after;
    /* the queue that owns the resource when it is not the link's copy queue
     * family (queue family ownership transfer); NULL: no transfer */
    vkm_queue *owner;
    /* optional timeline wait before the resource is touched */
    VkSemaphore wait_semaphore;
    uint64_t wait_value;
    /* compute-shader copies (vkm_kcopy.h): images, the VkFormat of a UINT view
     * of their texel size they allow for storage; buffers, nonzero when made
     * with STORAGE_BUFFER usage; 0: copy commands only */
    uint32_t kernel;
    VkImageView kernel_view; /* images: a 2D view of that format (the image's owner keeps it) */
} vkm_endpoint;

typedef struct vkm_link vkm_link;

typedef struct vkm_link_config {
    int ring;                       /* VKM_RING_* */
    VkDeviceSize slot_size;         /* bytes per slot (rounded up to alignment) */
    uint32_t slot_count;            /* ring depth */
    VkExternalMemoryHandleTypeFlagBits export_type; /* for VKM_RING_EXPORTED */
    uint64_t stall_timeout_ns;      /* a single GPU wait longer than this fails the job */
    uint64_t spin_ns;               /* poll semaphores this long before blocking (0 on CPU devices) */
    int copy_threads;               /* staging: helper threads for the CPU copy; -1: a quarter of the CPUs (max 7) */
    int ramps;                      /* vkm_plan_chunks' ramp steps at each end of a job; -1: the default (0) */
    uint32_t parts;                 /* jobs under parts x slot_size go in about this many chunks; 0: 16 */
} vkm_link_config;

VkResult vkm_link_create(vkm_device *src, vkm_queue *src_queue, vkm_device *dst, vkm_queue *dst_queue,
                         const vkm_link_config *config, vkm_link **out, const char **call);
/* Finishes every queued job, waits for the GPUs, frees everything. */
void vkm_link_destroy(vkm_link *link);

VkSemaphore vkm_link_src_timeline(const vkm_link *link);
VkSemaphore vkm_link_dst_timeline(const vkm_link *link);
VkDeviceSize vkm_link_slot_size(const vkm_link *link);

/* Queue a job of `size` bytes. Fills the ticket and the timeline values that
 * mean "source released" and "destination ready". Thread-safe. */
VkResult vkm_link_submit(vkm_link *link, const vkm_endpoint *src, const vkm_endpoint *dst, VkDeviceSize size,
                         uint64_t *ticket, uint64_t *src_done, uint64_t *dst_ready, const char **call);

/* Wait up to `timeout_ns` for job `ticket` (whose dst_ready value is given):
 * VK_SUCCESS when complete, VK_TIMEOUT when not yet, else the job's error. */
VkResult vkm_link_poll(vkm_link *link, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns,
                       const char **call);

/* Shared by the link kinds (vkm_transfer.c, vkm_cuda.c). */
/* Poll `sem` for up to `spin_ns` before a blocking wait; VK_TIMEOUT: not reached yet. */
VkResult vkm_spin_wait(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t spin_ns);
/* Chunk boundaries for a job of `size` bytes in chunks of at most `chunk`,
 * multiples of `unit`. `ramps` n > 0: chunks of chunk/2^n, ..., chunk/2 open
 * and (mirrored) close larger jobs, so the pipeline fills and drains sooner
 * (fewer steps where the job is too small); 0: even chunks. malloc'd array of
 * *count + 1 offsets (0 ... size); NULL when out of memory. */
#define VKM_MAX_RAMPS 4
VkDeviceSize *vkm_plan_chunks(VkDeviceSize size, VkDeviceSize chunk, VkDeviceSize unit, int ramps,
                              uint32_t *count);
/* On a link's worker: wait until `sem` reaches `value`, polling `spin_ns`
 * first, then in slices; VK_TIMEOUT after `stall_ns` (a stuck link). On any
 * failure `*call` names the wait (`name`). */
VkResult vkm_worker_wait(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t spin_ns, uint64_t stall_ns,
                         const char **call, const char *name);
/* Reset and begin a one-time-submit command buffer. */
VkResult vkm_begin_commands(const vkm_device *d, VkCommandBuffer cmd);
/* Record the copy of bytes [start, start+len) of endpoint `e` to (to_ring) or
 * from `ring` at `ring_offset`; image endpoints move whole rows. */
void vkm_record_chunk(const vkm_device *d, VkCommandBuffer cmd, const vkm_endpoint *e, VkBuffer ring,
                      VkDeviceSize ring_offset, VkDeviceSize start, VkDeviceSize len, int to_ring);

/* Wait up to `timeout_ns` until the worker has submitted all of job `ticket`'s
 * GPU work: VK_SUCCESS, VK_TIMEOUT, or the job's error. A submit of yours on a
 * queue the link also uses may wait on dst_ready only after this: an in-order
 * queue cannot run a wait that stands before its signal. */
VkResult vkm_link_wait_submitted(vkm_link *link, uint64_t ticket, uint64_t timeout_ns, const char **call);

#endif
