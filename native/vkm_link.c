/* vkm_link.c - the one link (vkm_link.h): sides, jobs, the worker, submit /
 * poll / destroy, failures and stalls. The ring is the backend's (vkm_ring.h). */
#include "vkm_ring.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#define SLICE_NS 100000000ull                    /* worker waits are cut into 100 ms slices */
#define EXIT_RELEASE_NS 1000000000ull            /* at exit: how long a parked link's submitted copies may take */
#define WATCH_NS 50000000ull                     /* an idle worker with a watch looks at in-flight work this often */
#define DEFAULT_STALL_NS (30ull * 1000000000ull) /* this long without progress fails the link (vkm_worker_wait) */

#define TRY VKM_TRY

static const vkm_ring_ops *const ring_kinds[VKM_RING_KINDS] = {
    [VKM_RING_STAGING] = &vkm_ring_staging,
    [VKM_RING_SHARED_HOST] = &vkm_ring_shared_host,
    [VKM_RING_EXPORTED] = &vkm_ring_exported,
    [VKM_RING_CUDA_PEER] = &vkm_ring_cuda_peer,
};

static void free_job(vkm_job *j)
{
    free(j->starts);
    free(j);
}

/* ---- chunk plans ------------------------------------------------------------ */

VkResult vkm_plan_chunks(VkDeviceSize size, VkDeviceSize chunk, VkDeviceSize unit, VkDeviceSize **out,
                         uint32_t *count, vkm_error *err)
{
    *out = NULL;
    *count = 0;
    if (!size || !unit || chunk < unit || chunk % unit)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_plan_chunks",
                        "a job of %llu B cannot be cut into chunks of %llu B in units of %llu B: the job must be "
                        "non-empty and the chunk a positive multiple of the unit",
                        (unsigned long long)size, (unsigned long long)chunk, (unsigned long long)unit);
    /* every step below stays within `size` and `chunk`: no sum can wrap */
    uint64_t n = size / chunk + (size % chunk != 0); /* chunks of at most `chunk` */
    if (n > VKM_MAX_CHUNKS)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_plan_chunks",
                        "a job of %llu B in chunks of at most %llu B is %llu chunks; a job may have at most %u",
                        (unsigned long long)size, (unsigned long long)chunk, (unsigned long long)n, VKM_MAX_CHUNKS);
    VkDeviceSize each = size / n + (size % n != 0);        /* as even as whole units allow: */
    each = each / unit * unit + (each % unit ? unit : 0); /* rounded up, at most `chunk` */
    uint64_t m = size / each + (size % each != 0);
    VkDeviceSize *b = malloc((size_t)(m + 1) * sizeof *b);
    if (!b) return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "malloc(chunk plan)", NULL);
    uint32_t k = 0;
    VkDeviceSize at = 0;
    b[0] = 0;
    while (at < size) {
        at = size - at <= each ? size : at + each;
        b[++k] = at;
    }
    *out = b;
    *count = k;
    return VK_SUCCESS;
}

VkResult vkm_check_rows(const vkm_link *l, const vkm_endpoint *src, const vkm_endpoint *dst, VkDeviceSize size,
                        VkDeviceSize *row, vkm_error *err)
{
    const vkm_endpoint *eps[2] = {src, dst};
    static const char *const names[2] = {"source", "destination"};
    *row = 0;
    for (int i = 0; i < 2; i++) {
        const vkm_endpoint *e = eps[i];
        if (!e->image) {
            if (!e->buffer)
                return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_submit",
                                "the %s names neither a buffer nor an image", names[i]);
            if (e->offset > UINT64_MAX - size)
                return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_submit",
                                "the %s range [%llu, %llu + %llu) wraps past 2^64", names[i],
                                (unsigned long long)e->offset, (unsigned long long)e->offset,
                                (unsigned long long)size);
            continue;
        }
        VkDeviceSize r = (VkDeviceSize)e->width * e->bytes_per_pixel;
        if (r == 0 || e->height == 0)
            return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_submit",
                            "the %s image is %u x %u pixels of %u B: empty", names[i], e->width, e->height,
                            e->bytes_per_pixel);
        if (r > l->cfg.slot_size)
            return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_submit",
                            "the %s image's rows are %llu B, larger than a ring slot (%llu B); raise slot_size",
                            names[i], (unsigned long long)r, (unsigned long long)l->cfg.slot_size);
        if (size % r != 0 || size / r > e->height)
            return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_submit",
                            "%llu B is not a whole number of the %s image's rows (%llu B each, %u rows)",
                            (unsigned long long)size, names[i], (unsigned long long)r, e->height);
        if (*row && r != *row)
            return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_submit",
                            "the source image's rows are %llu B, the destination's %llu B", (unsigned long long)*row,
                            (unsigned long long)r);
        *row = r;
    }
    return VK_SUCCESS;
}

/* ---- sides ------------------------------------------------------------------ */

static VkResult side_init(vkm_link *l, vkm_side *s, vkm_error *err)
{
    vkm_device *d = s->dev;
    VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                  .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT |
                                           VK_COMMAND_POOL_CREATE_TRANSIENT_BIT,
                                  .queueFamilyIndex = s->queue->family};
    TRY(d->fn.vkCreateCommandPool(d->device, &pi, NULL, &s->pool), "vkCreateCommandPool");
    s->cmds = calloc(l->ncmd, sizeof(VkCommandBuffer));
    s->cmd_free_at = calloc(l->ncmd, sizeof(uint64_t));
    if (!s->cmds || !s->cmd_free_at) return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "calloc(command buffers)", NULL);
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = s->pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = l->ncmd};
    VkResult r = d->fn.vkAllocateCommandBuffers(d->device, &ai, s->cmds);
    if (r != VK_SUCCESS) {
        memset(s->cmds, 0, l->ncmd * sizeof(VkCommandBuffer));
        return vkm_fail(err, r, "vkAllocateCommandBuffers", NULL);
    }
    TRY(vkm_create_timeline(d, 0, &s->timeline), "vkCreateSemaphore(timeline)");
    return VK_SUCCESS;
}

/* Vulkan objects only when `drained` (else the GPU may still run them). */
static void side_free(vkm_link *l, vkm_side *s, int drained)
{
    vkm_device *d = s->dev;
    if (drained) {
        if (s->cmds && s->pool && s->cmds[0]) d->fn.vkFreeCommandBuffers(d->device, s->pool, l->ncmd, s->cmds);
        if (s->pool) d->fn.vkDestroyCommandPool(d->device, s->pool, NULL);
        if (s->timeline) d->fn.vkDestroySemaphore(d->device, s->timeline, NULL);
    }
    free(s->cmds);
    free(s->cmd_free_at);
    s->cmds = NULL;
    s->cmd_free_at = NULL;
}

/* ---- the worker ------------------------------------------------------------- */

int vkm_side_held_by_caller(vkm_side *s)
{
    uint64_t v = 0;
    if (!s->gate || vkm_timeline_value(s->dev, s->gate, &v) != VK_SUCCESS) return 0;
    if (v < s->gate_value) return 1;
    s->gate = VK_NULL_HANDLE; /* reached: never read again (the caller may free it once its waits ran) */
    return 0;
}

/* The stall rule: a wait fails the link only after stall_timeout_ns in which
 * nothing it depends on moved. Progress is the side's timeline advancing (the
 * link's earlier copies completing) or the running job's wait point on this
 * side not reached yet: until the caller's GPU work releases the copy, the
 * link waits for a slow source, however long (the caller's own wait has the
 * timeout); the stall clock starts when the point is seen reached. A link being
 * destroyed stops waiting for a point that has not come. */
VkResult vkm_worker_wait(vkm_link *l, vkm_side *s, uint64_t value, const char *where, vkm_error *err)
{
    VkResult r = vkm_spin_wait(s->dev, s->timeline, value, l->cfg.spin_ns);
    uint64_t seen = 0, gate = 0, since = vkm_now_ns();
    int released = !s->gate;
    if (r == VK_TIMEOUT) r = vkm_timeline_value(s->dev, s->timeline, &seen) == VK_SUCCESS ? VK_TIMEOUT : r;
    while (r == VK_TIMEOUT) {
        vkm_thread_checkpoint(); /* the process exiting: park here, outside the driver */
        r = vkm_wait_timeline(s->dev, s->timeline, value, SLICE_NS);
        if (r != VK_TIMEOUT) break;
        uint64_t now = vkm_now_ns(), have = 0;
        if ((r = vkm_timeline_value(s->dev, s->timeline, &have)) != VK_SUCCESS) break;
        if (have > seen) { /* the link's earlier work completed: it moves */
            seen = have;
            since = now;
        }
        if (!released) {
            if ((r = vkm_timeline_value(s->dev, s->gate, &gate)) != VK_SUCCESS) break;
            released = gate >= s->gate_value;
            if (released) s->gate = VK_NULL_HANDLE; /* never read again, as vkm_side_held_by_caller */
            if (!released && __atomic_load_n(&l->q.stopping, __ATOMIC_ACQUIRE)) {
                vkm_fail(err, VKM_ERROR_LINK_STALLED, where,
                         "the %s link from '%s' to '%s' was destroyed while a job still waited for its wait point "
                         "on '%s' (value %llu, at %llu now): the job failed",
                         l->ops->name, l->src.dev->name, l->dst.dev->name, s->dev->name,
                         (unsigned long long)s->gate_value, (unsigned long long)gate);
                return VKM_ERROR_LINK_STALLED;
            }
            since = now; /* waiting for the caller's GPU work: the stall clock runs only once it is done */
        }
        if (now - since >= l->cfg.stall_timeout_ns) {
            r = VK_TIMEOUT;
            break;
        }
        r = VK_TIMEOUT;
    }
    if (r != VK_SUCCESS) vkm_fail(err, r, where, NULL);
    return r;
}

VkResult vkm_link_gate(vkm_link *l, vkm_side *s, int gate, VkSemaphore sem, uint64_t value, const char *where,
                       vkm_error *err)
{
    if (!sem || !(l->cfg.host_gates & gate)) return VK_SUCCESS;
    VkResult r = vkm_spin_wait(s->dev, sem, value, l->cfg.spin_ns);
    uint64_t have = 0;
    int stopped = 0;
    if (r == VK_TIMEOUT) __atomic_store_n(&l->in_gate, 1, __ATOMIC_RELEASE);
    while (r == VK_TIMEOUT) {
        vkm_thread_checkpoint(); /* the process exiting: park here, outside the driver (see release_gates) */
        if ((r = vkm_timeline_value(s->dev, sem, &have)) != VK_SUCCESS) break;
        if (have >= value) break; /* reached (also when the link is being destroyed: the job goes on) */
        if ((stopped = __atomic_load_n(&l->q.stopping, __ATOMIC_ACQUIRE))) break;
        r = vkm_wait_timeline(s->dev, sem, value, SLICE_NS);
    }
    __atomic_store_n(&l->in_gate, 0, __ATOMIC_RELEASE);
    if (stopped)
        return vkm_fail(err, VKM_ERROR_LINK_STALLED, where,
                        "the %s link from '%s' to '%s' was destroyed while a job still waited for its wait point "
                        "on '%s' (value %llu, at %llu now): the job failed",
                        l->ops->name, l->src.dev->name, l->dst.dev->name, s->dev->name, (unsigned long long)value,
                        (unsigned long long)have);
    if (r != VK_SUCCESS) vkm_fail(err, r, where, NULL);
    else vkm_trace_mark(l->trace, gate == VKM_GATE_SRC ? "src_gate_reached" : "dst_gate_reached", value);
    return r;
}

VkResult vkm_take_cmd(vkm_link *l, vkm_side *s, uint32_t i, VkCommandBuffer *cmd, vkm_error *err)
{
    if (s->cmd_free_at[i]) {
        VkResult r = vkm_worker_wait(l, s, s->cmd_free_at[i], "vkWaitSemaphores(command buffer reuse)", err);
        if (r != VK_SUCCESS) return r;
    }
    *cmd = s->cmds[i];
    TRY(vkm_begin_commands(s->dev, *cmd), "vkBeginCommandBuffer");
    return VK_SUCCESS;
}

void vkm_link_fail(vkm_link *l, VkResult r, const vkm_error *why, uint64_t ticket)
{
    uint64_t reached = UINT64_MAX; /* only this job and later ones failed */
    if (l->ops->fails_in_flight && vkm_timeline_value(l->dst.dev, l->dst.timeline, &reached) != VK_SUCCESS)
        reached = 0;
    vkm_jobq_fail(&l->q, r, why, ticket, reached);
    vkm_jobq_release(&l->q, l->src.dev, l->src.timeline, l->src.submitted, l->dst.dev, l->dst.timeline,
                     l->dst.submitted, l->cfg.stall_timeout_ns);
}

/* A bounded wait ran out on the worker: the link is stuck, not merely slow. */
static VkResult stalled(vkm_link *l, vkm_error *e)
{
    const char *where = e->where ? e->where : "a wait of the link's worker";
    return vkm_fail(e, VKM_ERROR_LINK_STALLED, where,
                    "the %s link from '%s' to '%s' stalled: %s did not complete within %.1f s after its wait point "
                    "was reached, with none of the link's work completing (a GPU hung, or work queued ahead of the "
                    "copy that never finishes); the link has failed: destroy the transfer and make a new one",
                    l->ops->name, l->src.dev->name, l->dst.dev->name, where, (double)l->cfg.stall_timeout_ns / 1e9);
}

static int watch(void *arg)
{
    vkm_link *l = arg;
    return l->ops->watch(l);
}

static void *worker(void *arg)
{
    vkm_link *l = arg;
    int failed;
    vkm_jobq_item *it;
    if (l->ops->polls) prctl(PR_SET_TIMERSLACK, 1000UL); /* the worker's short naps between polls stay short */
    while ((it = vkm_jobq_take(&l->q, &failed, WATCH_NS, l->ops->watch ? watch : NULL, l)) != NULL) {
        vkm_job *j = (vkm_job *)it;
        vkm_trace_mark(l->trace, "job_taken", it->ticket);
        vkm_error e;
        vkm_error_clear(&e);
        l->src.gate = j->src.wait_semaphore;
        l->src.gate_value = j->src.wait_value;
        l->dst.gate = j->dst.wait_semaphore;
        l->dst.gate_value = j->dst.wait_value;
        VkResult r = failed ? VK_SUCCESS
                            : vkm_link_gate(l, &l->src, VKM_GATE_SRC, j->src.wait_semaphore, j->src.wait_value,
                                            "vkWaitSemaphores(source wait point)", &e);
        if (!failed && r == VK_SUCCESS) r = l->ops->run(l, j, &e);
        l->src.gate = l->dst.gate = VK_NULL_HANDLE;
        if (r == VK_TIMEOUT) r = stalled(l, &e);
        if (r != VK_SUCCESS) vkm_link_fail(l, r, &e, it->ticket);
        l->progress_at_ns = vkm_now_ns(); /* fresh work: the watch's stall clock starts now */
        vkm_jobq_finish(&l->q, it, l->cfg.spin_ns);
        free_job(j);
    }
    return NULL;
}

/* ---- every live link, for the process exit ---------------------------------- */

static vkm_live_list live_links = VKM_LIVE_LIST_INIT;

/* Raise a side's unreached wait point to its value, through the driver. */
static int release_gate(vkm_side *s)
{
    VkSemaphore gate = __atomic_load_n(&s->gate, __ATOMIC_ACQUIRE);
    uint64_t want = s->gate_value, have = 0;
    if (!gate || s->dev->fn.vkGetSemaphoreCounterValue(s->dev->device, gate, &have) != VK_SUCCESS || have >= want)
        return 0;
    return vkm_signal_timeline_driver(s->dev, gate, want) == VK_SUCCESS;
}

/* From the exiting thread (never a checkpoint: it must not park): once the copies
 * submitted on side `s` are done (bounded), raise its timeline to `target`, the
 * last value the link handed out, so GPU work waiting on the link's points runs. */
static int raise_at_exit(vkm_side *s, uint64_t target)
{
    uint64_t submitted = __atomic_load_n(&s->submitted, __ATOMIC_ACQUIRE), have = 0;
    if (!s->timeline) return 0;
    if (submitted && vkm_wait_timeline(s->dev, s->timeline, submitted, EXIT_RELEASE_NS) != VK_SUCCESS)
        return 0; /* still running: a signal from the host could undercut its own */
    if (vkm_timeline_value(s->dev, s->timeline, &have) != VK_SUCCESS || have >= target) return 0;
    return vkm_signal_timeline_driver(s->dev, s->timeline, target) == VK_SUCCESS;
}

/* At the process exit. A side that waits on the GPU for a job's wait point: the
 * point is raised, so the copies queued behind that wait run out. A side gated on
 * the host (cfg.host_gates) queued no such wait; but where its worker is parked in
 * a gate, the job's copies were never submitted and GPU work of the caller may
 * wait for the link's points: once the link's submitted copies are done, its own
 * timelines are raised to the last values it handed out (vkm_jobq_release). */
static int release_gates(vkm_live *node)
{
    vkm_link *l = (vkm_link *)((char *)node - offsetof(vkm_link, live));
    int n = (l->cfg.host_gates & VKM_GATE_SRC ? 0 : release_gate(&l->src)) +
            (l->cfg.host_gates & VKM_GATE_DST ? 0 : release_gate(&l->dst));
    if (__atomic_load_n(&l->in_gate, __ATOMIC_ACQUIRE)) {
        n += raise_at_exit(&l->src, __atomic_load_n(&l->q.src_value, __ATOMIC_ACQUIRE));
        n += raise_at_exit(&l->dst, __atomic_load_n(&l->q.dst_value, __ATOMIC_ACQUIRE));
    }
    return n;
}

int vkm_links_release_gates(void)
{
    return vkm_exiting() ? vkm_live_each(&live_links, release_gates) : 0;
}

/* ---- the link --------------------------------------------------------------- */

static VkResult check_config(const vkm_device *src, const vkm_queue *src_queue, const vkm_device *dst,
                             const vkm_queue *dst_queue, const vkm_link_config *c, vkm_error *err)
{
    if (!src || !dst || !src_queue || !dst_queue || !c)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_create",
                        "a link needs both devices, both queues and a configuration");
    if (c->ring < 0 || c->ring >= VKM_RING_KINDS)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_create",
                        "ring kind %d is not one of 0 (staging), 1 (host shared), 2 (exported), 3 (CUDA peer)",
                        c->ring);
    if (c->slot_count < 1 || c->slot_count > VKM_MAX_SLOTS)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_create",
                        "slot_count %u is outside 1 ... %u", c->slot_count, VKM_MAX_SLOTS);
    if (c->slot_size < 1)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_create", "slot_size must be positive, got 0");
    return VK_SUCCESS;
}

/* Round slot_size up to `align` and check that the ring fits in 64 bits and
 * in one allocation of either device. */
static VkResult size_ring(vkm_link *l, VkDeviceSize align, vkm_error *err)
{
    VkDeviceSize size = l->cfg.slot_size;
    uint32_t n = l->cfg.slot_count;
    if (align > 1 && size > UINT64_MAX - (align - 1))
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_create",
                        "slot_size %llu B rounded up to a multiple of %llu B is more than 2^64 B",
                        (unsigned long long)size, (unsigned long long)align);
    if (align > 1) size = (size + align - 1) / align * align;
    if (size > UINT64_MAX / n)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_create",
                        "a ring of %u slots of %llu B is more than 2^64 B", n, (unsigned long long)size);
    VkDeviceSize total = size * n;
    const vkm_device *devs[2] = {l->src.dev, l->dst.dev};
    for (int i = 0; i < 2; i++)
        if (devs[i]->max_allocation_size && total > devs[i]->max_allocation_size)
            return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_create",
                            "a ring of %u slots of %llu B (%llu B) is larger than one allocation on '%s' may be "
                            "(maxMemoryAllocationSize %llu B); use fewer or smaller slots",
                            n, (unsigned long long)size, (unsigned long long)total, devs[i]->name,
                            (unsigned long long)devs[i]->max_allocation_size);
    l->cfg.slot_size = size;
    return VK_SUCCESS;
}

VkResult vkm_link_create(vkm_device *src, vkm_queue *src_queue, vkm_device *dst, vkm_queue *dst_queue,
                         const vkm_link_config *config, vkm_link **out, vkm_error *err)
{
    if (!out) return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_create", "no place for the link");
    *out = NULL;
    VkResult r = check_config(src, src_queue, dst, dst_queue, config, err);
    if (r != VK_SUCCESS) return r;
    vkm_link *l = calloc(1, sizeof(*l));
    if (!l) return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "calloc(link)", NULL);
    l->cfg = *config;
    l->cfg.trace_path = NULL; /* the caller's string: only read below */
    if (!l->cfg.stall_timeout_ns) l->cfg.stall_timeout_ns = DEFAULT_STALL_NS;
    l->ops = ring_kinds[config->ring];
    l->src.dev = src;
    l->src.queue = src_queue;
    l->dst.dev = dst;
    l->dst.queue = dst_queue;
    l->progress_at_ns = vkm_now_ns();
    vkm_jobq_init(&l->q);
    VkDeviceSize align = 256; /* buffer-copy offsets; backends may ask for more */
    r = l->ops->check(l, &align, err);
    if (r == VK_SUCCESS) r = size_ring(l, align, err);
    if (r == VK_SUCCESS) {
        l->ncmd = l->cfg.slot_count * l->ops->cmds_per_slot;
        l->slot_free_at = calloc(l->cfg.slot_count, sizeof(uint64_t));
        if (!l->slot_free_at) r = vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "calloc(ring slots)", NULL);
    }
    if (r == VK_SUCCESS) r = side_init(l, &l->src, err);
    if (r == VK_SUCCESS) r = side_init(l, &l->dst, err);
    if (r == VK_SUCCESS) r = l->ops->create(l, err);
    if (r == VK_SUCCESS)
        l->trace = vkm_trace_link(config->trace_path, l->ops->name, l->src.dev, l->src.timeline, l->dst.dev,
                                  l->dst.timeline);
    if (r == VK_SUCCESS) r = vkm_jobq_start(&l->q, worker, l, err);
    if (r != VK_SUCCESS) {
        vkm_link_destroy(l);
        return r;
    }
    vkm_live_add(&live_links, &l->live);
    *out = l;
    return VK_SUCCESS;
}

void vkm_link_destroy(vkm_link *l)
{
    if (!l || vkm_exiting()) return; /* at exit its worker is parked: the process takes the rest */
    vkm_live_remove(&live_links, &l->live);
    vkm_jobq_stop(&l->q);
    /* Wait (bounded) until the GPUs are done with everything this link
     * submitted: every submit, owner-queue ones included, signals its side's
     * timeline, and a failed link's timelines are raised from the host only
     * once that work is done (vkm_jobq_release). */
    int drained = 1;
    vkm_side *sides[2] = {&l->src, &l->dst};
    for (int i = 0; i < 2; i++)
        if (sides[i]->timeline && sides[i]->submitted &&
            vkm_wait_timeline(sides[i]->dev, sides[i]->timeline, sides[i]->submitted, l->cfg.stall_timeout_ns) ==
                VK_TIMEOUT)
            drained = 0;
    if (l->ring && l->ops->drain && !l->ops->drain(l)) drained = 0;
    vkm_trace_close(l->trace); /* its poller reads the semaphores freed below */
    l->trace = NULL;
    /* A GPU still running (or waiting to run) this link's copies, e.g. behind a
     * wait semaphore that never came, keeps its ring, memory, command buffers
     * and semaphores: they are left alive (leaked) rather than freed under it. */
    l->ops->destroy(l, drained);
    side_free(l, &l->src, drained);
    side_free(l, &l->dst, drained);
    free(l->slot_free_at);
    for (vkm_jobq_item *it = vkm_jobq_destroy(&l->q), *next; it; it = next) {
        next = it->next;
        free_job((vkm_job *)it);
    }
    free(l);
}

void vkm_link_last_values(vkm_link *l, uint64_t *src_done, uint64_t *dst_ready)
{
    vkm_jobq_last_values(&l->q, src_done, dst_ready);
}

VkSemaphore vkm_link_src_timeline(const vkm_link *l) { return l->src.timeline; }
VkSemaphore vkm_link_dst_timeline(const vkm_link *l) { return l->dst.timeline; }
VkDeviceSize vkm_link_slot_size(const vkm_link *l) { return l->cfg.slot_size; }
const char *vkm_link_ring_note(const vkm_link *l) { return l->ring_note; }
uint64_t vkm_link_kernel_bytes(const vkm_link *l) { return __atomic_load_n(&l->kernel_bytes, __ATOMIC_RELAXED); }

VkResult vkm_link_submit(vkm_link *l, const vkm_endpoint *src, const vkm_endpoint *dst, VkDeviceSize size,
                         uint64_t *ticket, uint64_t *src_done, uint64_t *dst_ready, vkm_error *err)
{
    if (!src || !dst || !ticket || !src_done || !dst_ready)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_submit", "both endpoints and the outputs are needed");
    if (size == 0) return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_submit", "a transfer of 0 bytes");
    vkm_job_shape shape = {0, 0, 0, 0};
    VkResult r = l->ops->shape(l, src, dst, size, &shape, err);
    if (r != VK_SUCCESS) return r;
    vkm_job *j = calloc(1, sizeof(*j));
    if (!j) return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "calloc(job)", NULL);
    j->src = *src;
    j->dst = *dst;
    j->size = size;
    r = vkm_plan_chunks(size, shape.chunk, shape.unit, &j->starts, &j->chunks, err);
    if (r != VK_SUCCESS) {
        free(j);
        return r;
    }
    /* from here on the worker owns `j` (it may already have freed it) */
    r = vkm_jobq_push(&l->q, &j->q, (uint64_t)j->chunks + shape.src_extra, (uint64_t)j->chunks + shape.dst_extra,
                      ticket, src_done, dst_ready, err);
    if (r != VK_SUCCESS) {
        free_job(j);
        return r;
    }
    vkm_trace_mark(l->trace, "submit", *ticket);
    return VK_SUCCESS;
}

VkResult vkm_link_wait_submitted(vkm_link *l, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns,
                                 vkm_error *err)
{
    return vkm_jobq_wait_submitted(&l->q, ticket, dst_ready, timeout_ns, err);
}

VkResult vkm_link_poll(vkm_link *l, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns, vkm_error *err)
{
    VkResult r = vkm_jobq_poll(&l->q, l->dst.dev, l->dst.timeline, ticket, dst_ready, timeout_ns, l->cfg.spin_ns,
                               err);
    if (r == VK_SUCCESS) vkm_trace_mark(l->trace, "waited", ticket);
    return r;
}
