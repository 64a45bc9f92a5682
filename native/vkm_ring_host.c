/* vkm_ring_host.c - the rings whose chunks cross through host-reachable
 * memory: staging (a host-visible buffer on each device and a CPU copy),
 * host shared (one host allocation imported into both devices) and exported
 * (source memory exported as an fd and imported on the destination). One
 * pipeline (run) serves all three; they differ in how the ring's memory is
 * made (vkm_ring_host_memory.c) and in the staging ring's CPU copy.
 */
#include "vkm_ring_host.h"

#include <stdlib.h>
#include <string.h>

#define TRY VKM_TRY
#define OWNER_CMDS 4

/* ---- the backends' hooks ------------------------------------------------------ */

static VkResult check_staging(vkm_link *l, VkDeviceSize *align, vkm_error *err)
{
    return VK_SUCCESS;
}

static VkResult check_shared_host(vkm_link *l, VkDeviceSize *align, vkm_error *err)
{
    const vkm_device *devs[2] = {l->src.dev, l->dst.dev};
    for (int i = 0; i < 2; i++) {
        if (!devs[i]->host_pointer_alignment)
            return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkm_link_create",
                            "VK_EXT_external_memory_host is not enabled on '%s'; a host shared ring needs it on "
                            "both devices (use a staging ring instead)", devs[i]->name);
        if (devs[i]->host_pointer_alignment > *align) *align = devs[i]->host_pointer_alignment;
    }
    return VK_SUCCESS;
}

static VkResult check_exported(vkm_link *l, VkDeviceSize *align, vkm_error *err)
{
    VkExternalMemoryHandleTypeFlagBits type = l->cfg.export_type;
    if (!type) type = l->cfg.export_type = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT;
    if (type != VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT && type != VK_EXTERNAL_MEMORY_HANDLE_TYPE_DMA_BUF_BIT_EXT)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_create",
                        "export_type 0x%x is neither an opaque fd (0x%x) nor a dma-buf (0x%x)", (unsigned)type,
                        (unsigned)VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT,
                        (unsigned)VK_EXTERNAL_MEMORY_HANDLE_TYPE_DMA_BUF_BIT_EXT);
    const vkm_device *devs[2] = {l->src.dev, l->dst.dev};
    for (int i = 0; i < 2; i++) {
        if (!devs[i]->has_external_memory_fd)
            return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkm_link_create",
                            "VK_KHR_external_memory_fd is not enabled on '%s'; an exported ring needs it on both "
                            "devices (use a host shared or staging ring instead)", devs[i]->name);
        if (type == VK_EXTERNAL_MEMORY_HANDLE_TYPE_DMA_BUF_BIT_EXT && !devs[i]->has_external_memory_dma_buf)
            return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkm_link_create",
                            "VK_EXT_external_memory_dma_buf is not enabled on '%s'; export as an opaque fd instead",
                            devs[i]->name);
    }
    return VK_SUCCESS;
}

static VkResult create(vkm_link *l, vkm_error *err)
{
    host_ring *h = calloc(1, sizeof *h);
    if (!h) return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "calloc(host ring)", NULL);
    l->ring = h;
    h->src.owner_family = h->dst.owner_family = VK_QUEUE_FAMILY_IGNORED;
    h->batch_cmds = calloc(l->cfg.slot_count, sizeof(VkCommandBuffer));
    if (!h->batch_cmds) return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "calloc(host ring)", NULL);
    return vkm_host_ring_memory(l, h, err);
}

static void free_end(const vkm_device *d, host_end *e)
{
    if (e->mapped) d->fn.vkUnmapMemory(d->device, e->memory);
    if (e->ring) d->fn.vkDestroyBuffer(d->device, e->ring, NULL);
    if (e->memory) d->fn.vkFreeMemory(d->device, e->memory, NULL);
    if (e->owner_pool) d->fn.vkDestroyCommandPool(d->device, e->owner_pool, NULL);
}

static void destroy(vkm_link *l, int drained)
{
    host_ring *h = l->ring;
    if (!h) return;
    if (h->team_started) vkm_copy_team_stop(&h->team);
    if (drained) {
        free_end(l->src.dev, &h->src);
        free_end(l->dst.dev, &h->dst);
        free(h->host_block); /* after both imports are freed */
    }
    free(h->batch_cmds);
    free(h);
    l->ring = NULL;
}

static int needs_ownership(const vkm_side *s, const vkm_endpoint *e)
{
    return e->owner && e->owner->family != s->queue->family;
}

/* Mid-sized jobs get smaller chunks (about PARTS, at least 2 MiB) so both
 * devices overlap; large ones use whole slots, which costs the fewest submits. */
#define PARTS 16
#define MIN_PART ((VkDeviceSize)2 << 20)

static VkResult shape(vkm_link *l, const vkm_endpoint *src, const vkm_endpoint *dst, VkDeviceSize size,
                      vkm_job_shape *out, vkm_error *err)
{
    VkDeviceSize row = 0, chunk = l->cfg.slot_size;
    VkResult r = vkm_check_rows(l, src, dst, size, &row, err);
    if (r != VK_SUCCESS) return r;
    VkDeviceSize unit = row ? row : 256; /* chunks are whole rows */
    VkDeviceSize part = size / PARTS > MIN_PART ? size / PARTS : MIN_PART;
    if (part < chunk) chunk = part;
    chunk = chunk / unit * unit;
    if (chunk < unit) chunk = unit;
    out->chunk = chunk;
    out->unit = unit;
    /* ownership transfers add a release and an acquire submit on the source, one on the destination */
    out->src_extra = needs_ownership(&l->src, src) ? 2 : 0;
    out->dst_extra = needs_ownership(&l->dst, dst) ? 1 : 0;
    return VK_SUCCESS;
}

/* ---- the pipeline ------------------------------------------------------------- */

/* An ownership-transfer submit on the owner queue of `e` (release before the
 * copies or acquire after them), waiting on (w, wv), signalling `signal`. */
static VkResult owner_submit(vkm_link *l, vkm_side *s, host_end *he, const vkm_endpoint *e, VkDeviceSize size,
                             int side_is_src, int entering, VkSemaphore w, uint64_t wv, uint64_t signal,
                             vkm_error *err)
{
    vkm_device *d = s->dev;
    if (!he->owner_pool || he->owner_family != e->owner->family) {
        if (he->owner_pool) {
            /* the family changed: wait until every owner command buffer is free, then rebuild */
            for (int i = 0; i < OWNER_CMDS; i++)
                if (he->owner_free_at[i]) {
                    VkResult r = vkm_worker_wait(l, s, he->owner_free_at[i], "vkWaitSemaphores(owner)", err);
                    if (r != VK_SUCCESS) return r;
                }
            d->fn.vkDestroyCommandPool(d->device, he->owner_pool, NULL);
            he->owner_pool = VK_NULL_HANDLE;
        }
        VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                      .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT |
                                               VK_COMMAND_POOL_CREATE_TRANSIENT_BIT,
                                      .queueFamilyIndex = e->owner->family};
        TRY(d->fn.vkCreateCommandPool(d->device, &pi, NULL, &he->owner_pool), "vkCreateCommandPool(owner)");
        VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                          .commandPool = he->owner_pool,
                                          .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                          .commandBufferCount = OWNER_CMDS};
        TRY(d->fn.vkAllocateCommandBuffers(d->device, &ai, he->owner_cmds), "vkAllocateCommandBuffers(owner)");
        memset(he->owner_free_at, 0, sizeof(he->owner_free_at));
        he->owner_family = e->owner->family;
    }
    uint32_t i = he->owner_next++ % OWNER_CMDS;
    if (he->owner_free_at[i]) {
        VkResult r = vkm_worker_wait(l, s, he->owner_free_at[i], "vkWaitSemaphores(owner)", err);
        if (r != VK_SUCCESS) return r;
    }
    VkCommandBuffer cmd = he->owner_cmds[i];
    TRY(vkm_begin_commands(d, cmd), "vkBeginCommandBuffer(owner)");
    vkm_endpoint_barrier(d, cmd, e, size, side_is_src, entering, 1, e->owner->family, s->queue->family, 0);
    TRY(d->fn.vkEndCommandBuffer(cmd), "vkEndCommandBuffer(owner)");
    TRY(vkm_submit(s, e->owner, cmd, w, wv, VK_NULL_HANDLE, 0, signal), "vkQueueSubmit(owner)");
    he->owner_free_at[i] = signal;
    return VK_SUCCESS;
}

/* Per-job state of the worker (run). */
typedef struct {
    vkm_job *j;
    uint64_t g0;                 /* ring position of chunk 0 */
    uint64_t sv0;                /* source chunk k signals sv0 + k + 1 */
    uint64_t dv;                 /* last destination value handed out */
    uint32_t ns, nr, nd;         /* chunks whose source copy is submitted / dst copy recorded / dst submitted */
    uint32_t src_owner_family, dst_owner_family;
    VkDeviceSize src_span, dst_span;
    VkSemaphore first_wait;
    uint64_t first_wait_value;
} host_run;

/* Record the copy of chunk `c` between the endpoint and its ring slot on the
 * source (is_src) or destination side, with the ownership / layout barriers
 * of a job's first and last chunk. The destination is overwritten whole: it is
 * taken over without an acquire (contents undefined), only its layout changes. */
static VkResult record_chunk_cmd(vkm_link *l, const host_run *r, int is_src, uint32_t c, VkCommandBuffer *out,
                                 vkm_error *err)
{
    host_ring *h = l->ring;
    vkm_side *X = is_src ? &l->src : &l->dst;
    vkm_device *d = X->dev;
    const vkm_job *j = r->j;
    const vkm_endpoint *e = is_src ? &j->src : &j->dst;
    VkDeviceSize span = is_src ? r->src_span : r->dst_span;
    uint32_t enter_family = is_src ? r->src_owner_family : VK_QUEUE_FAMILY_IGNORED;
    uint32_t leave_family = is_src ? r->src_owner_family : r->dst_owner_family;
    uint32_t s = (uint32_t)((r->g0 + c) % l->cfg.slot_count);
    VkCommandBuffer cmd = X->cmds[s];
    TRY(vkm_begin_commands(d, cmd), is_src ? "vkBeginCommandBuffer(src)" : "vkBeginCommandBuffer(dst)");
    if (c == 0) vkm_endpoint_barrier(d, cmd, e, span, is_src, 1, 0, enter_family, X->queue->family, 0);
    vkm_record_chunk(d, cmd, e, is_src ? h->src.ring : h->dst.ring, s * l->cfg.slot_size, j->starts[c],
                     vkm_chunk_len(j, c), is_src);
    if (is_src) { /* writes made available to the host domain: the CPU copy or the other device reads them */
        VkMemoryBarrier host = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                                .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
        d->fn.vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &host, 0,
                                   NULL, 0, NULL);
    }
    if (c == j->chunks - 1) vkm_endpoint_barrier(d, cmd, e, span, is_src, 0, 0, leave_family, X->queue->family, 0);
    TRY(d->fn.vkEndCommandBuffer(cmd), is_src ? "vkEndCommandBuffer(src)" : "vkEndCommandBuffer(dst)");
    *out = cmd;
    return VK_SUCCESS;
}

/* Record and submit the source copy of chunk r->ns into its ring slot (free). */
static VkResult src_chunk(vkm_link *l, host_run *r, vkm_error *err)
{
    uint32_t c = r->ns;
    VkCommandBuffer cmd;
    VkResult res = record_chunk_cmd(l, r, 1, c, &cmd, err);
    if (res != VK_SUCCESS) return res;
    VkSemaphore w = c == 0 ? r->first_wait : VK_NULL_HANDLE;
    TRY(vkm_submit(&l->src, l->src.queue, cmd, w, r->first_wait_value, VK_NULL_HANDLE, 0, r->sv0 + c + 1),
        "vkQueueSubmit(src)");
    vkm_trace_mark(l->trace, "src_submitted", r->sv0 + c + 1);
    r->ns++;
    return VK_SUCCESS;
}

/* Record (not submit) the destination copy of chunk r->nr. Its slot's command
 * buffer is free: the source copy into the slot waited for the slot's last
 * destination copy. */
static VkResult dst_chunk(vkm_link *l, host_run *r, vkm_error *err)
{
    VkCommandBuffer cmd;
    VkResult res = record_chunk_cmd(l, r, 0, r->nr, &cmd, err);
    if (res != VK_SUCCESS) return res;
    vkm_trace_mark(l->trace, "dst_recorded", r->j->q.dst_base + r->nr + 1);
    r->nr++;
    return VK_SUCCESS;
}

/* The staging ring's crossing: a CPU copy of the chunk in slot `s` from the
 * source's mapped ring to the destination's. */
static void cpu_copy(vkm_link *l, host_ring *h, uint32_t s, VkDeviceSize len)
{
    vkm_device *sd = l->src.dev, *dd = l->dst.dev;
    VkDeviceSize off = s * l->cfg.slot_size;
    if (!h->src.coherent) {
        VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = h->src.memory,
                                  .offset = 0, .size = VK_WHOLE_SIZE};
        sd->fn.vkInvalidateMappedMemoryRanges(sd->device, 1, &mr);
    }
    vkm_copy_team_copy(&h->team, h->dst.mapped + off, h->src.mapped + off, (size_t)len);
    if (!h->dst.coherent) {
        VkMappedMemoryRange mr = {.sType = VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE, .memory = h->dst.memory,
                                  .offset = 0, .size = VK_WHOLE_SIZE};
        dd->fn.vkFlushMappedMemoryRanges(dd->device, 1, &mr);
    }
}

/* Submit, in one call, the recorded destination copies of chunks nd..last-1
 * (their source copies are done); the staging ring copies them across first. */
static VkResult dst_submit(vkm_link *l, host_run *r, uint32_t last, vkm_error *err)
{
    host_ring *h = l->ring;
    vkm_side *D = &l->dst;
    const vkm_job *j = r->j;
    uint32_t K = l->cfg.slot_count, k = r->nd;
    for (uint32_t c = k; c < last; c++) {
        uint32_t s = (uint32_t)((r->g0 + c) % K);
        if (h->src.mapped) cpu_copy(l, h, s, vkm_chunk_len(j, c));
        h->batch_cmds[c - k] = D->cmds[s];
    }
    VkSemaphore w = k == 0 ? j->dst.wait_semaphore : VK_NULL_HANDLE;
    VkResult g = vkm_link_gate(l, D, VKM_GATE_DST, w, j->dst.wait_value, "vkWaitSemaphores(destination wait point)", err);
    if (g != VK_SUCCESS) return g;
    TRY(vkm_submit_batch(D, h->batch_cmds, last - k, w, j->dst.wait_value, r->dv + 1), "vkQueueSubmit(dst)");
    vkm_trace_mark(l->trace, "dst_submitted", r->dv + (last - k));
    for (uint32_t c = k; c < last; c++) l->slot_free_at[(r->g0 + c) % K] = ++r->dv;
    r->nd = last;
    return VK_SUCCESS;
}

/* The worker's loop for one job. Each round takes the most urgent step that
 * can go: destination copies whose source chunk is done (one submit); the
 * recording of the next destination copy (ahead of its source chunk, so it
 * goes out the moment that lands); the next source copy into a free slot;
 * else a wait for the oldest source chunk (or for a slot to be read). */
static VkResult run(vkm_link *l, vkm_job *j, vkm_error *err)
{
    host_ring *h = l->ring;
    vkm_side *S = &l->src, *D = &l->dst;
    uint32_t K = l->cfg.slot_count, N = j->chunks;
    int src_own = needs_ownership(S, &j->src), dst_own = needs_ownership(D, &j->dst);
    host_run r = {.j = j,
                  .g0 = l->chunk_counter,
                  .dv = j->q.dst_base,
                  .src_owner_family = src_own ? j->src.owner->family : VK_QUEUE_FAMILY_IGNORED,
                  .dst_owner_family = dst_own ? j->dst.owner->family : VK_QUEUE_FAMILY_IGNORED,
                  .src_span = j->src.image ? 0 : j->size,
                  .dst_span = j->dst.image ? 0 : j->size,
                  .first_wait = j->src.wait_semaphore,
                  .first_wait_value = j->src.wait_value};
    uint64_t sv = j->q.src_base;
    if (src_own) { /* release from the owner's family (and the wait on the producer) */
        VkResult res = owner_submit(l, S, &h->src, &j->src, r.src_span, 1, 1, r.first_wait, r.first_wait_value,
                                    ++sv, err);
        if (res != VK_SUCCESS) return res;
        r.first_wait = S->timeline;
        r.first_wait_value = sv;
        /* the release runs on the owner's queue, behind the caller's work: the copy queue
         * must not wait for it on the GPU where other links share it (vkm_link_gate) */
        res = vkm_link_gate(l, S, VKM_GATE_SRC, S->timeline, sv, "vkWaitSemaphores(ownership release)", err);
        if (res != VK_SUCCESS) return res;
    }
    r.sv0 = sv;
    while (r.nd < N) {
        VkResult res;
        uint64_t have_s = 0;
        TRY(vkm_timeline_value(S->dev, S->timeline, &have_s), "vkGetSemaphoreCounterValue(src)");
        uint32_t last = r.nd;
        while (last < r.nr && r.sv0 + last + 1 <= have_s) last++;
        if (last > r.nd) { /* 1: every recorded chunk that has landed in the ring */
            res = dst_submit(l, &r, last, err);
        } else if (r.nr == r.nd && r.nr < r.ns) { /* 2: the next destination copy, recorded ahead */
            res = dst_chunk(l, &r, err);
        } else {
            int slot_free = 0;
            if (r.ns < N && r.ns < r.nd + K) {
                uint64_t need = l->slot_free_at[(r.g0 + r.ns) % K], have_d = 0;
                if (need) TRY(vkm_timeline_value(D->dev, D->timeline, &have_d), "vkGetSemaphoreCounterValue(dst)");
                slot_free = have_d >= need;
            }
            if (slot_free) { /* 3: the next source copy */
                res = src_chunk(l, &r, err);
            } else if (r.nr < r.ns) { /* 4: later destination copies, recorded ahead */
                res = dst_chunk(l, &r, err);
            } else if (r.nd < r.ns) { /* 5: wait for the oldest source chunk */
                res = vkm_worker_wait(l, S, r.sv0 + r.nd + 1, "vkWaitSemaphores(src chunk)", err);
            } else { /* 6: wait for the next slot to be read by the destination */
                res = vkm_worker_wait(l, D, l->slot_free_at[(r.g0 + r.ns) % K], "vkWaitSemaphores(ring slot)", err);
            }
        }
        if (res != VK_SUCCESS) return res;
    }
    l->chunk_counter += N;
    sv = r.sv0 + N;
    if (src_own) { /* back to the owner's family */
        VkResult res = owner_submit(l, S, &h->src, &j->src, r.src_span, 1, 0, S->timeline, sv, sv + 1, err);
        if (res != VK_SUCCESS) return res;
    }
    if (dst_own) {
        VkResult res = owner_submit(l, D, &h->dst, &j->dst, r.dst_span, 0, 0, D->timeline, r.dv, r.dv + 1, err);
        if (res != VK_SUCCESS) return res;
    }
    return VK_SUCCESS;
}

#define HOST_RING(kind, label, check_fn)                                                                 \
    const vkm_ring_ops kind = {.name = label,                                                           \
                               .cmds_per_slot = 1,                                                      \
                               .fails_in_flight = 0,                                                    \
                               .polls = 0,                                                              \
                               .check = check_fn,                                                       \
                               .create = create,                                                        \
                               .shape = shape,                                                          \
                               .run = run,                                                              \
                               .watch = NULL,                                                           \
                               .drain = NULL,                                                           \
                               .destroy = destroy};

HOST_RING(vkm_ring_staging, "staging", check_staging)
HOST_RING(vkm_ring_shared_host, "host_shared", check_shared_host)
HOST_RING(vkm_ring_exported, "exported", check_exported)
