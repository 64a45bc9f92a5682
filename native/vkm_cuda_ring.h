/* vkm_cuda_ring.h - the CUDA_PEER ring: Vulkan memory shared with CUDA on two GPUs.
 *
 * Per ring slot s (K slots in each ring):
 *   source GPU S:      src ring[s], device-local Vulkan memory exported as an
 *                      opaque fd and imported into CUDA on S
 *   destination GPU D: dst ring[s], a landing ring (CUDA memory on D exported
 *                      to Vulkan: the NVLink copy writes it directly) or, where
 *                      the drivers refuse that, Vulkan memory imported into
 *                      CUDA plus a CUDA bounce ring on D that the peer copy
 *                      lands in and a CUDA local copy moves on from
 * Each side has a CUDA stream and an event per slot (source: copied[s],
 * destination: landed[s]). vkm_cuda_ring.c makes and frees it all;
 * vkm_cuda_link.c moves chunks through it.
 */
#ifndef VKM_CUDA_RING_H
#define VKM_CUDA_RING_H

#include "vkm_cuda.h"
#include "vkm_kcopy.h"
#include "vkm_ring.h"

/* One GPU's end: its Vulkan ring and their CUDA views. */
typedef struct cu_end {
    VkBuffer ring;
    VkDeviceMemory memory;
    vkm_kcopy *kc;              /* compute-kernel copies; NULL: copy commands only */
    int cu_index;               /* CUDA ordinal */
    vkm_CUcontext ctx;
    int ctx_retained;
    vkm_CUstream stream;
    vkm_CUexternalMemory ext_mem;
    vkm_CUdeviceptr ring_ptr;
    vkm_CUevent *events;        /* K; source: copied[s], destination: landed[s] */
    /* destination with a landing ring: the ring is CUDA memory imported into Vulkan */
    vkm_CUmemGenericAllocationHandle vmm;
    size_t vmm_size;
    int vmm_reserved, vmm_mapped;
} cu_end;

/* A Vulkan submit described ahead of time (the worker gathers several into one call). */
typedef struct cu_submit {
    VkSemaphore waits[1]; /* the endpoint's own wait (first chunk) */
    uint64_t wait_values[1];
    VkPipelineStageFlags stages[1];
    uint32_t nwait;
    VkCommandBuffer cmd;
    uint64_t signal;
    VkTimelineSemaphoreSubmitInfo tl;
} cu_submit;

typedef struct cuda_ring {
    cu_end src, dst;
    uint32_t K;
    VkDeviceSize ring_bytes;
    vkm_CUdeviceptr bounce;  /* bounce ring on the destination (no landing ring) */
    int landing;             /* 1: the peer copy lands in the destination ring itself */
    cu_submit *batch;        /* K: source submits being gathered */
    cu_submit *dst_recorded; /* ncmd: destination submits recorded ahead, by command buffer */
    VkSubmitInfo *infos;     /* K */
} cuda_ring;

/* Make the ring of link l (CUDA ordinals in c->src/dst.cu_index): contexts,
 * peer access, streams and events, kernels, the source ring, then a landing
 * ring or (why not: in l->ring_note) the bounce ring. */
VkResult vkm_cuda_ring_make(vkm_link *l, cuda_ring *c, vkm_error *err);
/* Wait (bounded by the stall timeout) until both CUDA streams are idle: 1 when they are. */
int vkm_cuda_ring_drain(vkm_link *l, cuda_ring *c);
/* CUDA's imports before the memory they map; only host memory unless `drained`. */
void vkm_cuda_ring_free(vkm_link *l, cuda_ring *c, int drained);

/* Make `ctx` current on this thread (pop it with vkm_cuda_pop). */
VkResult vkm_cuda_push(vkm_CUcontext ctx, vkm_error *err);
void vkm_cuda_pop(void);

/* A failed CUDA call inside a push/pop pair: note it and leave through `out`. */
#define VKM_CU_GO(expr, name)                                                  \
    do {                                                                       \
        vkm_CUresult cr_ = (expr);                                             \
        if (cr_ != VKM_CUDA_SUCCESS) {                                         \
            r = vkm_cuda_fail(err, name, cr_);                                 \
            goto out;                                                          \
        }                                                                      \
    } while (0)

#endif
