/* vkm_link.h - the cross-device transfer engine: one link interface, pluggable rings.
 *
 * A link moves bytes from one device to another through a ring of slots. What
 * the ring is, and how a chunk crosses from one device to the other, is the
 * link's ring backend (vkm_ring.h):
 *   - VKM_RING_STAGING:     a host-visible buffer on each device + a CPU copy
 *   - VKM_RING_SHARED_HOST: one host allocation imported into both devices
 *                           (VK_EXT_external_memory_host), no CPU copy
 *   - VKM_RING_EXPORTED:    memory allocated on the source, exported as an fd
 *                           (opaque fd or dma-buf) and imported on the destination
 *   - VKM_RING_CUDA_PEER:   Vulkan memory shared with CUDA on each GPU, moved
 *                           between them by CUDA peer copies (NVLink)
 * Everything else is the link's, whatever the ring: a native worker thread
 * takes jobs in order, cuts each into chunks, keeps the source copies up to
 * `slot_count` chunks ahead and submits each destination copy once its chunk
 * has crossed (no GIL, no queue-idle waits). Every chunk signals a timeline
 * semaphore on its device: the last source value is "src_done", the last
 * destination value "dst_ready".
 */
#ifndef VKM_LINK_H
#define VKM_LINK_H

#include "vkm.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { VKM_RING_STAGING = 0, VKM_RING_SHARED_HOST = 1, VKM_RING_EXPORTED = 2, VKM_RING_CUDA_PEER = 3, VKM_RING_KINDS };

#define VKM_MAX_SLOTS 4096                       /* the deepest ring a link accepts */
#define VKM_MAX_CHUNKS ((uint32_t)1 << 24)       /* the most chunks one job is cut into */

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
    VkDeviceSize slot_size;         /* bytes per slot (rounded up to the ring's alignment) */
    uint32_t slot_count;            /* ring depth, 1 ... VKM_MAX_SLOTS */
    uint64_t stall_timeout_ns;      /* this long without progress once the job's wait points are reached fails the link; 0: 30 s */
    uint64_t spin_ns;               /* poll semaphores this long before blocking (0 on CPU devices) */
    const char *trace_path;         /* append a timeline of the link's work here (vkm_trace.h); NULL: off */
    VkExternalMemoryHandleTypeFlagBits export_type; /* VKM_RING_EXPORTED: opaque fd or dma-buf */
    /* VKM_RING_CUDA_PEER tuning (tests, diagnostics) */
    int cuda_ordinals[2];           /* CUDA devices of source and destination; -1: match by deviceUUID */
    int cuda_bounce_ring;           /* 1: always the bounce ring, never the landing ring */
    /* VKM_GATE_SRC | VKM_GATE_DST: the sides whose queue other work shares (the
     * links of the other direction, a caller's own submits): a job's wait point
     * there is waited for on the worker before its copies are submitted, never
     * on the GPU (vkm_link_gate) */
    int host_gates;
} vkm_link_config;

#define VKM_GATE_SRC 1
#define VKM_GATE_DST 2

/* Make a link from `src` to `dst` (its worker starts at once). The queues are
 * the ones the link copies on; CUDA_PEER wants them of a universal family. */
VkResult vkm_link_create(vkm_device *src, vkm_queue *src_queue, vkm_device *dst, vkm_queue *dst_queue,
                         const vkm_link_config *config, vkm_link **out, vkm_error *err);
/* Finishes every queued job, waits (bounded by the stall timeout) for the
 * GPUs, frees everything; what a GPU still runs on is left alive (leaked). */
void vkm_link_destroy(vkm_link *link);
/* At exit, after vkm_exit_park(): raise every live link's running job's wait
 * points that have not come (the caller's semaphores, to the values the job
 * waits for) so that the GPU work queued behind them runs out; a driver that
 * tears its devices down at exit (NVIDIA's) waits for that work, and the
 * process hung. The number raised. */
int vkm_links_release_gates(void);

VkSemaphore vkm_link_src_timeline(const vkm_link *link);
VkSemaphore vkm_link_dst_timeline(const vkm_link *link);
VkDeviceSize vkm_link_slot_size(const vkm_link *link);
/* How the ring is made (and, where a fallback was taken, why). */
const char *vkm_link_ring_note(const vkm_link *link);
/* Bytes the link's compute kernels have copied (vkm_kcopy.h); the rest went by copy commands. */
uint64_t vkm_link_kernel_bytes(const vkm_link *link);

/* The last timeline values handed out so far (the src_done and dst_ready of
 * the latest job): once both are reached, the GPUs are done with every job. */
void vkm_link_last_values(vkm_link *link, uint64_t *src_done, uint64_t *dst_ready);

/* Queue a job of `size` bytes. Fills the ticket and the timeline values that
 * mean "source released" and "destination ready". Thread-safe. */
VkResult vkm_link_submit(vkm_link *link, const vkm_endpoint *src, const vkm_endpoint *dst, VkDeviceSize size,
                         uint64_t *ticket, uint64_t *src_done, uint64_t *dst_ready, vkm_error *err);
/* Wait up to `timeout_ns` for job `ticket` (whose dst_ready value is given):
 * VK_SUCCESS when complete, VK_TIMEOUT when not yet, else the job's error;
 * VKM_ERROR_INVALID_ARGUMENT for a ticket (or dst_ready) the link never issued. */
VkResult vkm_link_poll(vkm_link *link, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns, vkm_error *err);
/* Wait up to `timeout_ns` until the worker has submitted all of job `ticket`'s
 * GPU work: VK_SUCCESS, VK_TIMEOUT, or the job's error. A submit of yours on a
 * queue the link also uses may wait on dst_ready only after this: an in-order
 * queue cannot run a wait that stands before its signal. */
VkResult vkm_link_wait_submitted(vkm_link *link, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns,
                                 vkm_error *err);

/* Chunk boundaries for a job of `size` bytes in even chunks of at most
 * `chunk` bytes, every inner boundary a multiple of `unit` (`chunk` a positive
 * multiple of `unit`): a malloc'd array of *count + 1 offsets (0 ... size) in
 * *out. VKM_ERROR_INVALID_ARGUMENT for a bad shape or more than VKM_MAX_CHUNKS
 * chunks; any size up to 2^64 - 1 is safe. */
VkResult vkm_plan_chunks(VkDeviceSize size, VkDeviceSize chunk, VkDeviceSize unit, VkDeviceSize **out,
                         uint32_t *count, vkm_error *err);

#ifdef __cplusplus
}
#endif
#endif
