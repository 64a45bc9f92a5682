/* vkm_ring.h - inside a link: what the link gives every ring backend, and
 * what a backend provides (vkm_ring_ops).
 *
 * The link (vkm_link.c) owns the two sides (device, queue, command pool and
 * buffers, timeline semaphore), the job queue and its worker thread, job
 * chunking, submit / poll / destroy, failure and stall handling and the trace.
 * A ring backend owns the ring's memory and the per-job pipeline that moves
 * chunks through it. A new way of moving bytes is a new vkm_ring_ops:
 *   staging, host shared, exported memory   vkm_ring_host.c (one pipeline,
 *                                            three kinds of ring memory)
 *   CUDA peer                                vkm_cuda_link.c, vkm_cuda_ring.c
 */
#ifndef VKM_RING_H
#define VKM_RING_H

#include "vkm_jobq.h"
#include "vkm_link.h"
#include "vkm_trace.h"

/* A queued job: chunk c is [starts[c], starts[c + 1]). */
typedef struct vkm_job {
    vkm_jobq_item q; /* ticket; src_base, dst_base: the first timeline value this job signals, minus one */
    vkm_endpoint src, dst;
    VkDeviceSize size;
    uint32_t chunks;
    VkDeviceSize *starts;
    int src_kernel, dst_kernel; /* the backend copies that endpoint by compute kernels (vkm_kcopy.h) */
} vkm_job;

static inline VkDeviceSize vkm_chunk_len(const vkm_job *j, uint32_t c)
{
    return j->starts[c + 1] - j->starts[c];
}

/* One device's end of a link. */
typedef struct vkm_side {
    vkm_device *dev;
    vkm_queue *queue;
    VkCommandPool pool;
    VkCommandBuffer *cmds;  /* ncmd (the link's) */
    uint64_t *cmd_free_at;  /* timeline value after which cmds[i] may be re-recorded (0: free) */
    VkSemaphore timeline;   /* signalled by this side's copies: src_done / dst_ready */
    uint64_t submitted;     /* the highest timeline value submitted */
    VkSemaphore gate;       /* the running job's wait point on this side (the caller's GPU work), or none */
    uint64_t gate_value;
} vkm_side;

/* How a job is cut, as a backend wants it. */
typedef struct vkm_job_shape {
    VkDeviceSize chunk;   /* the largest chunk (a multiple of unit) */
    VkDeviceSize unit;    /* every inner chunk boundary is a multiple of this (an image row) */
    uint32_t src_extra;   /* timeline values a job signals besides one per chunk, source side */
    uint32_t dst_extra;   /* ... destination side */
} vkm_job_shape;

typedef struct vkm_ring_ops {
    const char *name;         /* the ring kind, in traces */
    uint32_t cmds_per_slot;   /* command buffers per side and ring slot */
    int fails_in_flight;      /* a failure can break jobs already submitted, not only this one and later */
    int polls;                /* the worker polls with short naps (a 1 us timer slack) */
    /* Check that the pair can have this ring (no device objects made yet; the
     * backend's state may be) and give the slot alignment; the link rounds
     * slot_size up to it. */
    VkResult (*check)(vkm_link *l, VkDeviceSize *align, vkm_error *err);
    /* Make the ring (l->ring), once the sides exist; on failure `destroy`
     * still runs and frees what was made. */
    VkResult (*create)(vkm_link *l, vkm_error *err);
    /* Check a job's endpoints and say how to cut it. */
    VkResult (*shape)(vkm_link *l, const vkm_endpoint *src, const vkm_endpoint *dst, VkDeviceSize size,
                      vkm_job_shape *out, vkm_error *err);
    /* The worker: all of job j's GPU work submitted (VK_TIMEOUT: a bounded wait ran out). */
    VkResult (*run)(vkm_link *l, vkm_job *j, vkm_error *err);
    /* While idle, a look at work in flight (NULL: none): nonzero while some is;
     * a problem found fails the link (vkm_link_fail). */
    int (*watch)(vkm_link *l);
    /* Wait (bounded by the stall timeout) for the ring's own work outside the
     * two timelines (NULL: none): 1 when done. */
    int (*drain)(vkm_link *l);
    /* Free the ring: GPU and driver objects only when `drained` (else they
     * may still be in use and are left alive), host memory always. */
    void (*destroy)(vkm_link *l, int drained);
} vkm_ring_ops;

extern const vkm_ring_ops vkm_ring_staging, vkm_ring_shared_host, vkm_ring_exported, vkm_ring_cuda_peer;

struct vkm_link {
    vkm_link_config cfg;     /* slot_size rounded up, stall_timeout_ns filled in */
    const vkm_ring_ops *ops;
    void *ring;              /* the backend's state */
    vkm_side src, dst;
    uint32_t ncmd;           /* command buffers per side */
    uint64_t *slot_free_at;  /* slot_count: dst_ready value after which a ring slot may be rewritten */
    uint64_t chunk_counter;  /* chunks moved so far: chunk c of a job uses slot (counter + c) % slot_count */
    vkm_jobq q;
    vkm_trace *trace;        /* NULL unless a trace path was given */
    char ring_note[320];     /* how the ring is made (vkm_link_ring_note) */
    uint64_t kernel_bytes;   /* atomic: bytes moved by compute kernels */
    /* the idle worker's watch over work in flight (ops->watch) */
    uint64_t seen_dst;
    uint64_t progress_at_ns;
    int in_gate;   /* atomic: the worker waits on the host for a job's wait point (vkm_link_gate) */
    vkm_live live; /* in the list of live links (vkm_links_release_gates) */
};

/* ---- for backends (vkm_link.c) ------------------------------------------- */

/* The link failed with `r` at `ticket` (UINT64_MAX: work in flight, no job of
 * its own): wake every waiter, and once the GPUs are done with what they were
 * given, release GPU waiters on the points of failed jobs. */
void vkm_link_fail(vkm_link *l, VkResult r, const vkm_error *why, uint64_t ticket);
/* On the worker: wait until side `s`'s timeline reaches `value`, polling
 * spin_ns first, then in slices; VK_TIMEOUT after the stall timeout. Any
 * failure names the wait (`where`). */
VkResult vkm_worker_wait(vkm_link *l, vkm_side *s, uint64_t value, const char *where, vkm_error *err);
/* Where the link's config asks for it (VKM_GATE_SRC / VKM_GATE_DST in
 * host_gates), wait on the worker until a job's wait point (`sem`, `value`)
 * on side `s` is reached before the link submits work that waits on it: on a
 * queue that other work also uses, a submit waiting on the GPU for a point
 * produced outside the link holds up every later submit there (an in-order
 * queue), among them a copy that point's producer may itself wait for. No
 * stall timeout (the caller's GPU work, however slow); a link being destroyed
 * stops waiting. Nothing to wait for (no gate, no `sem`): VK_SUCCESS at once. */
VkResult vkm_link_gate(vkm_link *l, vkm_side *s, int gate, VkSemaphore sem, uint64_t value, const char *where,
                       vkm_error *err);
/* Nonzero while the running job's wait point on side `s` is not reached: the
 * link waits for the caller's GPU work there, which is never a stall. */
int vkm_side_held_by_caller(vkm_side *s);
/* Command buffer `i` of side `s`, reset and begun, once the GPU is done with
 * its last use (cmd_free_at[i], waited for on the worker). */
VkResult vkm_take_cmd(vkm_link *l, vkm_side *s, uint32_t i, VkCommandBuffer *cmd, vkm_error *err);

/* For `shape`: check the image endpoints of a job of `size` bytes (whole rows
 * of at most a slot, within the image, the same rows on both sides) and that
 * buffer endpoints name a buffer; *row: the image row in bytes, 0 for none. */
VkResult vkm_check_rows(const vkm_link *l, const vkm_endpoint *src, const vkm_endpoint *dst, VkDeviceSize size,
                        VkDeviceSize *row, vkm_error *err);

/* ---- recording and submitting (vkm_commands.c) --------------------------- */

VkResult vkm_make_buffer(const vkm_device *d, VkDeviceSize size, VkBufferUsageFlags usage,
                         VkExternalMemoryHandleTypeFlags external, VkBuffer *out);
/* Reset and begin a one-time-submit command buffer. */
VkResult vkm_begin_commands(const vkm_device *d, VkCommandBuffer cmd);
/* Record the copy of bytes [start, start+len) of endpoint `e` to (to_ring) or
 * from `ring` at `ring_offset`; image endpoints move whole rows. */
void vkm_record_chunk(const vkm_device *d, VkCommandBuffer cmd, const vkm_endpoint *e, VkBuffer ring,
                      VkDeviceSize ring_offset, VkDeviceSize start, VkDeviceSize len, int to_ring);

enum {
    VKM_BARRIER_KERNEL_STAGES = 1, /* the copy may also be a compute kernel (vkm_kcopy.h): its stages and accesses */
    VKM_BARRIER_KERNEL_LAYOUT = 2, /* the image is copied by a kernel: VKM_KCOPY_IMAGE_LAYOUT, not a transfer layout */
};
/* The barrier that takes endpoint `e` into the copy (entering) or out of it:
 * its layouts (the destination is overwritten whole: from UNDEFINED) and,
 * when `owner_family` is a family other than `copy_family`, the half of the
 * queue family ownership transfer recorded on the owner's queue (on_owner)
 * or on the copy queue. `is_src`: the endpoint is read (1) or written (0). */
void vkm_endpoint_barrier(const vkm_device *d, VkCommandBuffer cmd, const vkm_endpoint *e, VkDeviceSize size,
                          int is_src, int entering, int on_owner, uint32_t owner_family, uint32_t copy_family,
                          int flags);
/* Submit `cmd` on `q`, waiting on up to two timeline points (a NULL semaphore:
 * none), signalling `signal` on side `s`'s timeline (s->submitted follows). */
VkResult vkm_submit(vkm_side *s, vkm_queue *q, VkCommandBuffer cmd, VkSemaphore w0, uint64_t v0, VkSemaphore w1,
                    uint64_t v1, uint64_t signal);
/* Submit `n` command buffers in one call as n batches on side `s`'s queue,
 * batch i signalling `first + i`; the first optionally waits on (w, wv). */
VkResult vkm_submit_batch(vkm_side *s, VkCommandBuffer *cmds, uint32_t n, VkSemaphore w, uint64_t wv,
                          uint64_t first);

#endif
