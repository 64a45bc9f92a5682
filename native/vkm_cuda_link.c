/* vkm_cuda_link.c - the CUDA_PEER ring backend: moving chunks through the
 * CUDA ring (vkm_cuda_ring.h) over NVLink.
 *
 * Per chunk g of the link (slot s = g % K), with a landing ring:
 *
 *   Vulkan, source queue:  endpoint -> src ring[s] (Vulkan memory imported into
 *                          CUDA), release to VK_QUEUE_FAMILY_EXTERNAL, signal src_done
 *   CUDA, source stream:   peer copy src ring[s] -> dst ring[s] (CUDA memory on the
 *                          destination, imported into Vulkan) over NVLink; record copied[s]
 *   Vulkan, dest queue:    acquire from EXTERNAL; dst ring[s] -> endpoint; signal dst_ready
 *
 * Without a landing ring the peer copy goes to the CUDA bounce ring and a
 * CUDA local copy on the destination (its own stream, event landed[s]) moves
 * it into the Vulkan-made dst ring.
 *
 * The worker thread orders the APIs: it polls src_done and CUDA's events and
 * queues each step the moment its inputs are ready (run). Ordering them on
 * the GPUs instead, with timeline semaphores imported into CUDA, was built and
 * measured on two H200s (NVIDIA 580): each cross-API hand-off took 150-220 us,
 * CUDA saw Vulkan's signals only at the end of a vkQueueSubmit batch, and CUDA
 * work on a GPU took turns with that GPU's Vulkan work, so 256 MiB moved at
 * 54 GB/s against 258 GB/s this way. The device-local copies at either end are
 * compute kernels (vkm_kcopy.h) where the endpoint allows: with them 256 MiB
 * moves at 306-328 GB/s, a 4K RGBA16F frame in ~0.31 ms (bench/RESULTS.md).
 * Chunks are even (bench/probes/link_ab.py on the H200 pair, 2026-11-30: smaller
 * first and last chunks made the 4K frame 0.93-1.07x as fast) and every
 * source chunk ready goes in one submit (batches of 1-2 made it 0.67-0.78x).
 */
#include "vkm_cuda_ring.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIN_CHUNK ((VkDeviceSize)2 << 20) /* smaller chunks cost more in submits than they gain */
#define TARGET_CHUNKS 8                  /* a job is cut into about this many chunks (pipeline depth) */
#define SLOT_ALIGN 256
#define MAX_SLOT ((VkDeviceSize)1 << 40)

#define TRY VKM_TRY
#define CU_GO VKM_CU_GO

/* ---- the backend's hooks ------------------------------------------------------ */

static void device_identity(VkPhysicalDevice pd, uint8_t uuid[16])
{
    VkPhysicalDeviceIDProperties id = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
    VkPhysicalDeviceProperties2 p = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &id};
    vkGetPhysicalDeviceProperties2(pd, &p);
    memcpy(uuid, id.deviceUUID, 16);
}

static int buffer_exportable(VkPhysicalDevice pd)
{
    VkPhysicalDeviceExternalBufferInfo info = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_BUFFER_INFO,
        .usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
        .handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT,
    };
    VkExternalBufferProperties props = {.sType = VK_STRUCTURE_TYPE_EXTERNAL_BUFFER_PROPERTIES};
    vkGetPhysicalDeviceExternalBufferProperties(pd, &info, &props);
    return (props.externalMemoryProperties.externalMemoryFeatures & VK_EXTERNAL_MEMORY_FEATURE_EXPORTABLE_BIT) != 0;
}

static VkResult unsupported(vkm_link *l, vkm_error *err, const char *why)
{
    return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkm_link_create", "CUDA_PEER is not possible from '%s' to '%s': %s",
                    l->src.dev->name, l->dst.dev->name, why);
}

/* The pair can have a CUDA ring: two distinct CUDA devices with peer access,
 * both exporting memory as opaque fds. Picks the CUDA ordinals. */
static VkResult check(vkm_link *l, VkDeviceSize *align, vkm_error *err)
{
    char why[400];
    vkm_device *devs[2] = {l->src.dev, l->dst.dev};
    if (l->cfg.slot_size > MAX_SLOT)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_create",
                        "CUDA_PEER slots are at most %llu B, got %llu B", (unsigned long long)MAX_SLOT,
                        (unsigned long long)l->cfg.slot_size);
    if (devs[0]->device == devs[1]->device)
        return unsupported(l, err, "source and destination are the same VkDevice; CUDA_PEER moves data between "
                                   "two GPUs");
    if (!vkm_cuda_available(why, sizeof why)) return unsupported(l, err, why);
    uint8_t uuid[2][16];
    for (int i = 0; i < 2; i++) {
        device_identity(devs[i]->physical, uuid[i]);
        if (!devs[i]->has_external_memory_fd || !devs[i]->fn.vkGetMemoryFdKHR) {
            snprintf(why, sizeof why, "VK_KHR_external_memory_fd is not enabled on '%s'", devs[i]->name);
            return unsupported(l, err, why);
        }
        if (!buffer_exportable(devs[i]->physical)) {
            snprintf(why, sizeof why, "'%s' cannot export buffer memory as an opaque fd", devs[i]->name);
            return unsupported(l, err, why);
        }
    }
    int ordinal[2] = {l->cfg.cuda_ordinals[0], l->cfg.cuda_ordinals[1]};
    if (ordinal[0] < 0 || ordinal[1] < 0) { /* the usual way: by deviceUUID */
        if (!vkm_cuda_peer_check(uuid[0], devs[0]->name, uuid[1], devs[1]->name, why, sizeof why))
            return unsupported(l, err, why);
        ordinal[0] = vkm_cuda_find(uuid[0]);
        ordinal[1] = vkm_cuda_find(uuid[1]);
    } else {
        int n = vkm_cuda_device_count();
        if (ordinal[0] >= n || ordinal[1] >= n) {
            snprintf(why, sizeof why, "CUDA devices %d and %d were asked for; CUDA sees %d", ordinal[0], ordinal[1],
                     n);
            return unsupported(l, err, why);
        }
        if (!vkm_cuda_peer_ok(ordinal[0], ordinal[1], devs[0]->name, devs[1]->name, why, sizeof why))
            return unsupported(l, err, why);
    }
    cuda_ring *c = calloc(1, sizeof *c);
    if (!c) return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "calloc(CUDA ring)", NULL);
    c->src.cu_index = ordinal[0];
    c->dst.cu_index = ordinal[1];
    l->ring = c;
    *align = SLOT_ALIGN;
    return VK_SUCCESS;
}

static VkResult create(vkm_link *l, vkm_error *err)
{
    cuda_ring *c = l->ring;
    c->K = l->cfg.slot_count;
    c->ring_bytes = l->cfg.slot_size * c->K;
    c->batch = calloc(c->K, sizeof(cu_submit));
    c->dst_recorded = calloc(l->ncmd, sizeof(cu_submit));
    c->infos = calloc(c->K, sizeof(VkSubmitInfo));
    if (!c->batch || !c->dst_recorded || !c->infos)
        return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "calloc(CUDA ring)", NULL);
    return vkm_cuda_ring_make(l, c, err);
}

static int drain(vkm_link *l)
{
    return vkm_cuda_ring_drain(l, l->ring);
}

static void destroy(vkm_link *l, int drained)
{
    cuda_ring *c = l->ring;
    if (!c) return;
    vkm_cuda_ring_free(l, c, drained);
    free(c->batch);
    free(c->dst_recorded);
    free(c->infos);
    free(c);
    l->ring = NULL;
}

/* About TARGET_CHUNKS chunks per job, none under MIN_CHUNK, none over a slot;
 * endpoints owned by another queue family than the link's are refused (no
 * ownership transfer is made). */
static VkResult shape(vkm_link *l, const vkm_endpoint *src, const vkm_endpoint *dst, VkDeviceSize size,
                      vkm_job_shape *out, vkm_error *err)
{
    const vkm_endpoint *eps[2] = {src, dst};
    const vkm_side *sides[2] = {&l->src, &l->dst};
    static const char *const names[2] = {"source", "destination"};
    for (int i = 0; i < 2; i++)
        if (eps[i]->owner && eps[i]->owner->family != sides[i]->queue->family)
            return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_submit",
                            "the %s is owned by queue family %u, but this CUDA_PEER link copies on family %u; pass a "
                            "queue of the owner's (universal) family", names[i], eps[i]->owner->family,
                            sides[i]->queue->family);
    VkDeviceSize row = 0;
    VkResult r = vkm_check_rows(l, src, dst, size, &row, err);
    if (r != VK_SUCCESS) return r;
    VkDeviceSize chunk = size / TARGET_CHUNKS + (size % TARGET_CHUNKS != 0);
    if (chunk < MIN_CHUNK) chunk = MIN_CHUNK;
    chunk = chunk / SLOT_ALIGN * SLOT_ALIGN + (chunk % SLOT_ALIGN ? SLOT_ALIGN : 0);
    if (chunk > l->cfg.slot_size) chunk = l->cfg.slot_size;
    if (row) { /* chunks are whole rows */
        chunk = chunk / row * row;
        if (chunk < row) chunk = row;
    }
    out->chunk = chunk;
    out->unit = row ? row : SLOT_ALIGN;
    out->src_extra = out->dst_extra = 0;
    return VK_SUCCESS;
}

/* ---- CUDA state --------------------------------------------------------------- */

/* VK_SUCCESS while neither CUDA stream has failed; else the stream's error. */
static VkResult stream_errors(vkm_link *l, cuda_ring *c, vkm_error *err)
{
    cu_end *ends[2] = {&c->src, &c->dst};
    const vkm_device *devs[2] = {l->src.dev, l->dst.dev};
    for (int i = 0; i < 2; i++) {
        VkResult r = vkm_cuda_push(ends[i]->ctx, err);
        if (r != VK_SUCCESS) return r;
        vkm_CUresult cr = vkm_cu.cuStreamQuery(ends[i]->stream);
        vkm_cuda_pop();
        if (cr != VKM_CUDA_SUCCESS && cr != VKM_CUDA_ERROR_NOT_READY) {
            char t[256];
            return vkm_fail(err, VKM_ERROR_CUDA, "cuStreamQuery", "the CUDA stream on the %s GPU ('%s') failed: %s",
                            i ? "destination" : "source", devs[i]->name, vkm_cuda_text(cr, t, sizeof t));
        }
    }
    return VK_SUCCESS;
}

/* VK_SUCCESS when `ev` (recorded in end `e`'s context) has completed, VK_NOT_READY
 * while it has not, else the CUDA failure. */
static VkResult event_state(cu_end *e, vkm_CUevent ev, vkm_error *err)
{
    VkResult r = vkm_cuda_push(e->ctx, err);
    if (r != VK_SUCCESS) return r;
    vkm_CUresult cr = vkm_cu.cuEventQuery(ev);
    vkm_cuda_pop();
    if (cr == VKM_CUDA_SUCCESS) return VK_SUCCESS;
    if (cr == VKM_CUDA_ERROR_NOT_READY) return VK_NOT_READY;
    return vkm_cuda_fail(err, "cuEventQuery", cr);
}

/* ---- recording ---------------------------------------------------------------- */

/* The ring slot goes to CUDA (release to the external queue family, after the
 * copy or kernel wrote it) or comes from CUDA (acquire, before it is read). */
static void ring_barrier(vkm_side *s, cu_end *e, VkCommandBuffer cmd, VkDeviceSize offset, VkDeviceSize size,
                         int release)
{
    uint32_t family = s->queue->family;
    VkBufferMemoryBarrier b = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_MEMORY_BARRIER,
        .srcAccessMask = release ? VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT : 0,
        .dstAccessMask = release ? 0 : VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_SHADER_READ_BIT,
        .srcQueueFamilyIndex = release ? family : VK_QUEUE_FAMILY_EXTERNAL,
        .dstQueueFamilyIndex = release ? VK_QUEUE_FAMILY_EXTERNAL : family,
        .buffer = e->ring,
        .offset = offset,
        .size = size,
    };
    s->dev->fn.vkCmdPipelineBarrier(cmd, release ? VKM_KCOPY_STAGES : VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT,
                                    release ? VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT : VKM_KCOPY_STAGES, 0, 0, NULL, 1,
                                    &b, 0, NULL);
}

/* The endpoint into (entering) or out of the copy: layouts, and ordering
 * against whatever else touches it; the link's queue owns it. */
static void endpoint_barrier(const vkm_side *s, VkCommandBuffer cmd, const vkm_endpoint *e, VkDeviceSize size,
                             int is_src, int entering, int kernel)
{
    vkm_endpoint_barrier(s->dev, cmd, e, size, is_src, entering, 0, VK_QUEUE_FAMILY_IGNORED, s->queue->family,
                         VKM_BARRIER_KERNEL_STAGES | (kernel ? VKM_BARRIER_KERNEL_LAYOUT : 0));
}

/* Copy chunk `c` of the job between endpoint `ep` and the end's ring at `slot_offset`. */
static void record_copy(vkm_link *l, vkm_side *s, cu_end *e, VkCommandBuffer cmd, uint32_t set, const vkm_job *j,
                        uint32_t c, VkDeviceSize slot_offset, int to_ring)
{
    const vkm_endpoint *ep = to_ring ? &j->src : &j->dst;
    if (to_ring ? j->src_kernel : j->dst_kernel) {
        VkDeviceSize n = vkm_kcopy_record(e->kc, cmd, set, ep, e->ring, slot_offset, j->starts[c],
                                          vkm_chunk_len(j, c), to_ring);
        __atomic_fetch_add(&l->kernel_bytes, n, __ATOMIC_RELAXED);
    } else {
        vkm_record_chunk(s->dev, cmd, ep, e->ring, slot_offset, j->starts[c], vkm_chunk_len(j, c), to_ring);
    }
}

static void add_wait(cu_submit *b, VkSemaphore sem, uint64_t value)
{
    b->waits[b->nwait] = sem;
    b->wait_values[b->nwait] = value;
    b->stages[b->nwait] = VK_PIPELINE_STAGE_ALL_COMMANDS_BIT;
    b->nwait++;
}

static void submit_info(cu_submit *b, vkm_side *s, VkSubmitInfo *si)
{
    b->tl = (VkTimelineSemaphoreSubmitInfo){.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                                            .waitSemaphoreValueCount = b->nwait,
                                            .pWaitSemaphoreValues = b->wait_values,
                                            .signalSemaphoreValueCount = 1,
                                            .pSignalSemaphoreValues = &b->signal};
    *si = (VkSubmitInfo){.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                         .pNext = &b->tl,
                         .waitSemaphoreCount = b->nwait,
                         .pWaitSemaphores = b->waits,
                         .pWaitDstStageMask = b->stages,
                         .commandBufferCount = 1,
                         .pCommandBuffers = &b->cmd,
                         .signalSemaphoreCount = 1,
                         .pSignalSemaphores = &s->timeline};
}

/* Record the source copy of chunk `c` (global `g`) into its ring slot and
 * describe its submit in batch entry `i`. */
static VkResult prep_src(vkm_link *l, cuda_ring *cr, const vkm_job *j, uint32_t c, uint64_t g, uint32_t i,
                         vkm_error *err)
{
    vkm_side *S = &l->src;
    uint32_t s = (uint32_t)(g % cr->K), ci = (uint32_t)(g % l->ncmd);
    VkDeviceSize off = s * l->cfg.slot_size, span = j->src.image ? 0 : j->size;
    VkCommandBuffer cmd;
    VkResult r = vkm_take_cmd(l, S, ci, &cmd, err);
    if (r != VK_SUCCESS) return r;
    if (c == 0) endpoint_barrier(S, cmd, &j->src, span, 1, 1, j->src_kernel);
    record_copy(l, S, &cr->src, cmd, ci, j, c, off, 1);
    ring_barrier(S, &cr->src, cmd, off, vkm_chunk_len(j, c), 1);
    if (c == j->chunks - 1) endpoint_barrier(S, cmd, &j->src, span, 1, 0, j->src_kernel);
    TRY(S->dev->fn.vkEndCommandBuffer(cmd), "vkEndCommandBuffer(source)");
    cu_submit *b = &cr->batch[i];
    b->nwait = 0;
    if (c == 0 && j->src.wait_semaphore) add_wait(b, j->src.wait_semaphore, j->src.wait_value);
    b->cmd = cmd;
    b->signal = j->q.src_base + c + 1;
    submit_info(b, S, &cr->infos[i]);
    S->cmd_free_at[ci] = b->signal;
    return VK_SUCCESS;
}

/* Record the destination copy of chunk `c` out of its ring slot, signalling
 * dst_ready `value`, into dst_recorded[g % ncmd] (submitted once it lands). */
static VkResult prep_dst(vkm_link *l, cuda_ring *cr, const vkm_job *j, uint32_t c, uint64_t g, uint64_t value,
                         vkm_error *err)
{
    vkm_side *D = &l->dst;
    uint32_t s = (uint32_t)(g % cr->K), ci = (uint32_t)(g % l->ncmd);
    VkDeviceSize off = s * l->cfg.slot_size, span = j->dst.image ? 0 : j->size;
    VkCommandBuffer cmd;
    VkResult r = vkm_take_cmd(l, D, ci, &cmd, err);
    if (r != VK_SUCCESS) return r;
    ring_barrier(D, &cr->dst, cmd, off, vkm_chunk_len(j, c), 0);
    if (c == 0) endpoint_barrier(D, cmd, &j->dst, span, 0, 1, j->dst_kernel);
    record_copy(l, D, &cr->dst, cmd, ci, j, c, off, 0);
    if (c == j->chunks - 1) endpoint_barrier(D, cmd, &j->dst, span, 0, 0, j->dst_kernel);
    TRY(D->dev->fn.vkEndCommandBuffer(cmd), "vkEndCommandBuffer(destination)");
    cu_submit *b = &cr->dst_recorded[ci];
    b->nwait = 0;
    if (c == 0 && j->dst.wait_semaphore) {
        r = vkm_link_gate(l, D, VKM_GATE_DST, j->dst.wait_semaphore, j->dst.wait_value,
                          "vkWaitSemaphores(destination wait point)", err);
        if (r != VK_SUCCESS) return r;
        add_wait(b, j->dst.wait_semaphore, j->dst.wait_value);
    }
    b->cmd = cmd;
    b->signal = value;
    D->cmd_free_at[ci] = value;
    vkm_trace_mark(l->trace, "dst_recorded", value);
    l->slot_free_at[s] = value;
    return VK_SUCCESS;
}

/* ---- CUDA's copies ------------------------------------------------------------ */

/* CUDA's NVLink copy of chunk `c` (global `g`, slot `s`), on the source
 * stream, once the worker has seen the Vulkan copy into src ring[s] done:
 * into dst ring[s] itself (landing ring; the worker has seen the Vulkan copy
 * that last read it done), or into bounce[s] after chunk g-K left it (an event
 * of the destination stream). Event copied[s] then frees src ring[s] and, with
 * a landing ring, says the chunk has landed. */
static VkResult peer_copy(vkm_link *l, cuda_ring *cr, const vkm_job *j, uint32_t c, uint64_t g, uint32_t s,
                          vkm_error *err)
{
    cu_end *S = &cr->src, *D = &cr->dst;
    VkDeviceSize off = (VkDeviceSize)s * l->cfg.slot_size;
    VkResult r = vkm_cuda_push(S->ctx, err);
    if (r != VK_SUCCESS) return r;
    if (!cr->landing && g >= cr->K)
        CU_GO(vkm_cu.cuStreamWaitEvent(S->stream, D->events[s], 0), "cuStreamWaitEvent(bounce slot)");
    CU_GO(vkm_cu.cuMemcpyPeerAsync((cr->landing ? D->ring_ptr : cr->bounce) + off, D->ctx, S->ring_ptr + off, S->ctx,
                                   (size_t)vkm_chunk_len(j, c), S->stream),
          "cuMemcpyPeerAsync");
    CU_GO(vkm_cu.cuEventRecord(S->events[s], S->stream), "cuEventRecord(peer copy)");
out:
    vkm_cuda_pop();
    return r;
}

/* Bounce ring, destination stream: after the peer copy (event copied[s]),
 * copy bounce[s] -> dst ring[s] (the worker has seen the Vulkan copy that last
 * read it done); event landed[s] then tells the worker. */
static VkResult cuda_local_copy(vkm_link *l, cuda_ring *cr, const vkm_job *j, uint32_t c, uint32_t s,
                                vkm_error *err)
{
    cu_end *S = &cr->src, *D = &cr->dst;
    VkDeviceSize off = (VkDeviceSize)s * l->cfg.slot_size;
    VkResult r = vkm_cuda_push(D->ctx, err);
    if (r != VK_SUCCESS) return r;
    CU_GO(vkm_cu.cuStreamWaitEvent(D->stream, S->events[s], 0), "cuStreamWaitEvent(peer copy)");
    CU_GO(vkm_cu.cuMemcpyDtoDAsync(D->ring_ptr + off, cr->bounce + off, (size_t)vkm_chunk_len(j, c), D->stream),
          "cuMemcpyDtoDAsync");
    CU_GO(vkm_cu.cuEventRecord(D->events[s], D->stream), "cuEventRecord(local copy)");
out:
    vkm_cuda_pop();
    return r;
}

/* Queue CUDA's copies of the chunks below `submitted` whose source copy the
 * source GPU has finished, while their destination ring slots are free. */
static VkResult queue_cuda(vkm_link *l, cuda_ring *cr, const vkm_job *j, uint64_t g0, uint32_t submitted,
                           uint32_t *np, uint32_t nd, int *moved, vkm_error *err)
{
    vkm_side *S = &l->src, *D = &l->dst;
    if (*np >= submitted) return VK_SUCCESS;
    uint64_t have_s = 0, have_d = 0;
    TRY(vkm_timeline_value(S->dev, S->timeline, &have_s), "vkGetSemaphoreCounterValue(src_done)");
    TRY(vkm_timeline_value(D->dev, D->timeline, &have_d), "vkGetSemaphoreCounterValue(dst_ready)");
    while (*np < submitted && j->q.src_base + *np + 1 <= have_s && *np < nd + cr->K) {
        uint64_t g = g0 + *np;
        uint32_t s = (uint32_t)(g % cr->K);
        if (l->slot_free_at[s] > have_d) break; /* the destination copy of chunk g-K still reads it */
        VkResult r = peer_copy(l, cr, j, *np, g, s, err);
        if (r == VK_SUCCESS && !cr->landing) r = cuda_local_copy(l, cr, j, *np, s, err);
        if (r != VK_SUCCESS) return r;
        vkm_trace_mark(l->trace, "cuda_queued", g + 1);
        (*np)++;
        *moved = 1;
    }
    return VK_SUCCESS;
}

/* ---- the worker --------------------------------------------------------------- */

/* The worker polls the source timeline and CUDA's events and queues each next
 * step the moment its inputs are ready. Source copies run up to a ring ahead;
 * CUDA's copy of a chunk goes out once its source copy is seen done and the
 * destination ring slot has been read; the destination copies of every chunk
 * that has landed go out in one submit. */
static VkResult run(vkm_link *l, vkm_job *j, vkm_error *err)
{
    cuda_ring *cr = l->ring;
    vkm_side *S = &l->src, *D = &l->dst;
    uint32_t K = cr->K, N = j->chunks;
    uint64_t g0 = l->chunk_counter, dv = j->q.dst_base;
    uint32_t ns = 0, np = 0, nd = 0; /* chunks whose source copy / CUDA copies / destination copy are queued */
    uint32_t nr = 0;                 /* destination copies recorded (nd <= nr <= np) */
    uint64_t idle_t0 = 0;
    int idle = 0;
    unsigned idle_rounds = 0;
    j->src_kernel = vkm_kcopy_serves(cr->src.kc, &j->src, l->cfg.slot_size);
    j->dst_kernel = vkm_kcopy_serves(cr->dst.kc, &j->dst, l->cfg.slot_size);
    while (nd < N) {
        int moved = 0;
        VkResult r;
        /* 1: source copies into ring slots CUDA has finished reading */
        uint32_t n = 0;
        while (ns < N && ns < np + K) {
            uint64_t g = g0 + ns;
            if (g >= K) {
                r = event_state(&cr->src, cr->src.events[g % K], err);
                if (r == VK_NOT_READY) break;
                if (r != VK_SUCCESS) return r;
            }
            r = prep_src(l, cr, j, ns, g, n, err);
            if (r != VK_SUCCESS) return r;
            n++;
            ns++;
            if (ns <= 2) break; /* the first two chunks go at once, alone: the GPUs start sooner */
            /* recording costs microseconds a chunk: hand finished chunks to CUDA in between */
            r = queue_cuda(l, cr, j, g0, ns - n, &np, nd, &moved, err);
            if (r != VK_SUCCESS) return r;
        }
        if (n) {
            TRY(vkm_queue_submit(S->dev, S->queue, n, cr->infos, VK_NULL_HANDLE), "vkQueueSubmit(source)");
            S->submitted = j->q.src_base + ns;
            vkm_trace_mark(l->trace, "src_submitted", S->submitted);
            moved = 1;
        }
        /* 2: CUDA's copies of chunks the source GPU has written, into free destination slots */
        r = queue_cuda(l, cr, j, g0, ns, &np, nd, &moved, err);
        if (r != VK_SUCCESS) return r;
        /* 3: destination copies of every chunk CUDA has landed, one submit */
        n = 0;
        while (nd < np) {
            uint64_t g = g0 + nd;
            cu_end *X = cr->landing ? &cr->src : &cr->dst; /* the end whose event says the chunk has landed */
            r = event_state(X, X->events[g % K], err);
            if (r == VK_NOT_READY) break;
            if (r != VK_SUCCESS) return r;
            if (nr == nd) { /* not recorded ahead: record now */
                /* NVLink is the bottleneck: keep CUDA's stream fed before each recording */
                r = queue_cuda(l, cr, j, g0, ns, &np, nd, &moved, err);
                if (r == VK_SUCCESS) r = prep_dst(l, cr, j, nd, g, j->q.dst_base + nd + 1, err);
                if (r != VK_SUCCESS) return r;
                nr++;
            }
            submit_info(&cr->dst_recorded[g % l->ncmd], D, &cr->infos[n]);
            dv = j->q.dst_base + nd + 1;
            n++;
            nd++;
        }
        if (n) {
            TRY(vkm_queue_submit(D->dev, D->queue, n, cr->infos, VK_NULL_HANDLE), "vkQueueSubmit(destination)");
            D->submitted = dv;
            vkm_trace_mark(l->trace, "dst_submitted", dv);
            moved = 1;
        }
        if (moved) {
            idle = 0;
            continue;
        }
        /* nothing could move. Record the next destination copy ahead while CUDA
         * copies (if its command buffer is free), so that it goes out the moment
         * its chunk lands; else poll for the spin time, then nap; bounded by the
         * stall timeout */
        if (nr < np) {
            uint64_t g = g0 + nr, have_d = 0;
            uint64_t free_at = D->cmd_free_at[g % l->ncmd];
            TRY(vkm_timeline_value(D->dev, D->timeline, &have_d), "vkGetSemaphoreCounterValue(dst_ready)");
            if (have_d >= free_at) {
                r = prep_dst(l, cr, j, nr, g, j->q.dst_base + nr + 1, err);
                if (r != VK_SUCCESS) return r;
                nr++;
                continue;
            }
        }
        uint64_t t = vkm_now_ns();
        if (!idle) {
            idle = 1;
            idle_t0 = t;
            idle_rounds = 0;
        }
        if ((idle_rounds & 63) == 0 && (vkm_side_held_by_caller(S) || vkm_side_held_by_caller(D)))
            idle_t0 = t; /* a slow source (or destination) is waited for, not a stall */
        uint64_t waited = t - idle_t0;
        if (++idle_rounds % 1024 == 0) { /* a failed stream never completes its events */
            r = stream_errors(l, cr, err);
            if (r != VK_SUCCESS) return r;
        }
        if (waited >= l->cfg.stall_timeout_ns)
            return vkm_fail(err, VKM_ERROR_LINK_STALLED, "CUDA_PEER worker",
                            "the cuda_peer link from '%s' to '%s' stalled: no progress for %.1f s (source copies "
                            "queued %u, CUDA copies %u, destination copies %u of %u chunks); the link has failed: "
                            "destroy the transfer and make a new one", S->dev->name, D->dev->name,
                            (double)l->cfg.stall_timeout_ns / 1e9, ns, np, nd, N);
        if (waited < l->cfg.spin_ns) {
            sched_yield();
        } else if (np < ns && nd == np) { /* only a Vulkan copy can unblock: block on its semaphore */
            uint64_t have_s = 0;
            TRY(vkm_timeline_value(S->dev, S->timeline, &have_s), "vkGetSemaphoreCounterValue(src_done)");
            if (have_s >= j->q.src_base + np + 1) /* source done: the destination still reads chunk np's slot */
                r = vkm_wait_timeline(D->dev, D->timeline, l->slot_free_at[(g0 + np) % K], 1000000);
            else
                r = vkm_wait_timeline(S->dev, S->timeline, j->q.src_base + np + 1, 1000000);
            if (r != VK_SUCCESS && r != VK_TIMEOUT) return vkm_fail(err, r, "vkWaitSemaphores(src_done/dst_ready)", NULL);
        } else {
            struct timespec nap = {0, 10000};
            nanosleep(&nap, NULL);
        }
    }
    l->chunk_counter += N;
    return VK_SUCCESS;
}

/* The idle worker's look at in-flight work: CUDA stream errors and stalls
 * fail the link. Nonzero while work is in flight. */
static int watch(vkm_link *l)
{
    cuda_ring *cr = l->ring;
    uint64_t t = vkm_now_ns(), v = 0;
    vkm_error e;
    vkm_error_clear(&e);
    VkResult r = vkm_timeline_value(l->dst.dev, l->dst.timeline, &v);
    if (r != VK_SUCCESS) {
        vkm_link_fail(l, vkm_fail(&e, r, "vkGetSemaphoreCounterValue(dst_ready)", NULL), &e, UINT64_MAX);
        return 0;
    }
    if (v != l->seen_dst) {
        l->seen_dst = v;
        l->progress_at_ns = t;
    }
    if (v >= l->dst.submitted) return 0;
    r = stream_errors(l, cr, &e);
    if (r != VK_SUCCESS) {
        vkm_link_fail(l, r, &e, UINT64_MAX);
        return 0;
    }
    if (t - l->progress_at_ns >= l->cfg.stall_timeout_ns) { /* bounded by the stall timeout */
        vkm_fail(&e, VKM_ERROR_LINK_STALLED, "CUDA_PEER watchdog",
                 "the cuda_peer link from '%s' to '%s' stalled: dst_ready stayed at %llu (work submitted up to %llu) "
                 "for %.1f s; the link has failed: destroy the transfer and make a new one", l->src.dev->name,
                 l->dst.dev->name, (unsigned long long)v, (unsigned long long)l->dst.submitted,
                 (double)l->cfg.stall_timeout_ns / 1e9);
        vkm_link_fail(l, VKM_ERROR_LINK_STALLED, &e, UINT64_MAX);
        return 0;
    }
    return 1;
}

const vkm_ring_ops vkm_ring_cuda_peer = {
    .name = "cuda_peer",
    .cmds_per_slot = 2, /* the worker may record a whole ring ahead of the GPU */
    .fails_in_flight = 1,
    .polls = 1,
    .check = check,
    .create = create,
    .shape = shape,
    .run = run,
    .watch = watch,
    .drain = drain,
    .destroy = destroy,
};
