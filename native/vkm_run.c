/* vkm_run.c - a run of quiet kernel steps without the interpreter (see vkm_run.h). */
#include <string.h>
#include <time.h>

#include "vkm_run.h"
#include "vkm_step.h"

#define DATA_OFFSET (VKM_STEP_OP_BYTES - VKM_STEP_MAX_PUSH)   /* a record's push constants */

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void put_u64(unsigned char *at, uint64_t v)
{
    uint32_t w[2] = {(uint32_t)v, (uint32_t)(v >> 32)};
    memcpy(at, w, sizeof w);
}

/* The step of the run `i` (0-based) on `r` has room once the step that used its
 * command buffer and regions last is done and, unless the host reads it back,
 * was quiet. VK_SUCCESS: room; VK_TIMEOUT: not done within slice_ns; VK_INCOMPLETE:
 * not quiet; an error otherwise. */
static VkResult room(vkm_run_dev *r, uint64_t i, uint64_t slice_ns)
{
    uint64_t v = r->value0 + 1 + i;
    if (v <= r->depth) return VK_SUCCESS;
    uint64_t need = v - r->depth;
    if (need <= r->known || need <= r->checked) return VK_SUCCESS;
    /* (no spin first: the steps queued behind this one keep the device busy while the host sleeps) */
    VkResult res = r->naps ? vkm_nap_wait(r->d, r->timeline, need, slice_ns, &r->nap)
                           : vkm_wait_timeline(r->d, r->timeline, need, slice_ns);
    if (res != VK_SUCCESS) return res;
    const vkm_run_template *t = &r->templates[i % r->depth];
    for (uint32_t c = 0; c < t->nchecks; c++)
        if (*t->checks[c]) return VK_INCOMPLETE;
    for (uint32_t c = 0; c < t->ncaptures; c++)
        for (uint32_t w = 0; w < VKM_RUN_CLOCK_WORDS; w++)
            r->clock[t->captures[c].out * VKM_RUN_CLOCK_WORDS + w] = t->captures[c].src[w];
    r->checked = need;
    return VK_SUCCESS;
}

static VkResult submit(vkm_run_dev *r, uint64_t i)
{
    vkm_run_template *t = &r->templates[i % r->depth];
    uint64_t clock = now_us();
    for (uint32_t p = 0; p < t->npatches; p++) {
        const vkm_run_patch *pt = &t->patches[p];
        uint64_t step = pt->step0 + i;
        put_u64(t->ops + pt->kernel_op + DATA_OFFSET, step);                 /* the kernel's words 0-1 */
        put_u64(t->ops + pt->finish_op + DATA_OFFSET, clock);                /* the finish pass's 0-1 */
        put_u64(t->ops + pt->finish_op + DATA_OFFSET + 8, step);             /* and 2-3 */
    }
    VkCommandBuffer cmd = r->cmds[(r->region0 + i) % r->depth];
    VkResult res = vkm_step_record(r->d, cmd, t->ops, t->n);
    if (res != VK_SUCCESS) return res;
    uint64_t v = r->value0 + 1 + i;
    res = vkm_step_submit(r->d, r->q, cmd, 0, NULL, NULL, r->timeline, v);
    if (res == VK_SUCCESS) r->value = v;
    return res;
}

int vkm_run_steps(vkm_run_dev *const *devs, uint32_t ndevs, uint64_t until, uint64_t slice_ns, uint64_t deadline_ns,
                  uint32_t *stalled)
{
    for (int first = 1;; first = 0) {
        uint64_t i = UINT64_MAX;   /* the next step: the least any device has to submit */
        for (uint32_t k = 0; k < ndevs; k++) {
            uint64_t next = devs[k]->value - devs[k]->value0;
            if (next < i) i = next;
        }
        if (i >= until) return VKM_RUN_DONE;
        if (!first && deadline_ns && vkm_now_ns() >= deadline_ns) return VKM_RUN_DONE;   /* (budget spent: between steps) */
        for (uint32_t k = 0; k < ndevs; k++) {   /* room on every device first: a stall submits nothing */
            vkm_run_dev *r = devs[k];
            if (r->value - r->value0 > i) continue;
            VkResult res = room(r, i, slice_ns);
            if (res == VK_SUCCESS) continue;
            *stalled = k;
            if (res == VK_TIMEOUT) return VKM_RUN_WAITING;
            if (res == VK_INCOMPLETE) return VKM_RUN_NOT_QUIET;
            r->result = res;
            return VKM_RUN_FAILED;
        }
        for (uint32_t k = 0; k < ndevs; k++) {
            vkm_run_dev *r = devs[k];
            if (r->value - r->value0 > i) continue;
            VkResult res = submit(r, i);
            if (res != VK_SUCCESS) {
                *stalled = k;
                r->result = res;
                return VKM_RUN_FAILED;
            }
        }
    }
}
