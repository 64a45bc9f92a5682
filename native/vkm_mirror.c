/* vkm_mirror.c - see vkm_mirror.h. */
#include "vkm_mirror.h"
#include "vkm_jobq.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define SLICE_NS 20000000ull /* the thread looks at its stop flag this often while the source is idle */
#define RELEASE_VALUE (UINT64_MAX >> 1)

struct vkm_mirror {
    vkm_device *src, *dst;
    VkSemaphore src_sem, dst_sem;
    uint64_t start; /* the source's value when the mirror was made (the destination's first) */
    uint64_t spin_ns;
    pthread_t thread;
    int started;
    int stop;             /* atomic */
    pthread_mutex_t lock; /* the failure below, and every signal of the destination */
    int released;         /* the destination was raised as far as it goes: no more signals */
    VkResult error;
    vkm_error why;
    vkm_live live; /* in the list of live mirrors (vkm_mirrors_release_all) */
};

static vkm_live_list live_mirrors = VKM_LIVE_LIST_INIT;

/* Raise the destination as far as it goes, once (m->lock held): GPU work waiting on the
 * mirror goes (it cannot be told otherwise). Through vkmulti: fails on a lost destination. */
static void release_locked(vkm_mirror *m)
{
    if (m->released) return;
    m->released = 1;
    vkm_signal_timeline(m->dst, m->dst_sem, RELEASE_VALUE);
}

static void failed(vkm_mirror *m, VkResult r, const char *where)
{
    pthread_mutex_lock(&m->lock);
    if (m->error == VK_SUCCESS) {
        m->error = r;
        vkm_fail(&m->why, r, where, "the timeline mirror from '%s' to '%s' stopped", m->src->name, m->dst->name);
    }
    release_locked(m);
    pthread_mutex_unlock(&m->lock);
}

static void *follow(void *arg);

static void *follow_thread(void *arg)
{
    follow(arg);
    vkm_thread_done();
    return NULL;
}

/* Signal the destination through the driver even once it is marked lost: work submitted there
 * before the mark (which an injected loss drains) still waits for these values, and they are the
 * source's real progress; a driver that lost the device answers for itself. */
static VkResult signal_dst(vkm_mirror *m, uint64_t value)
{
    return vkm_signal_timeline_driver(m->dst, m->dst_sem, value);
}

/* Wait up to a slice for the source to reach `value` and read where it is. Once the source is
 * marked lost, through the driver (as signal_dst): an injected loss leaves the driver running
 * what the device was given (vkmulti.testing.lose_device drains it), and GPU work of the
 * destination waiting on the mirror then reads what that work writes (a survivor's step reading
 * a lost device's outbox in place), so a value is mirrored only once the source really reached
 * it. A device really lost answers VK_ERROR_DEVICE_LOST here (the mirror fails and lets its
 * waiters go); one whose driver never answers again is let go by vkm_mirror_release. */
static VkResult wait_src(vkm_mirror *m, uint64_t value, uint64_t *have)
{
    VkResult r;
    if (!vkm_device_is_lost(m->src)) {
        r = vkm_spin_wait(m->src, m->src_sem, value, m->spin_ns);
        if (r == VK_TIMEOUT) r = vkm_wait_timeline(m->src, m->src_sem, value, SLICE_NS);
        if (r == VK_SUCCESS) r = vkm_timeline_value(m->src, m->src_sem, have);
        if (r != VK_ERROR_DEVICE_LOST || !vkm_device_is_lost(m->src)) return r;
    }
    VkSemaphoreWaitInfo info = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, .semaphoreCount = 1,
                                .pSemaphores = &m->src_sem, .pValues = &value};
    r = m->src->fn.vkWaitSemaphores(m->src->device, &info, SLICE_NS);
    if (r == VK_SUCCESS) r = m->src->fn.vkGetSemaphoreCounterValue(m->src->device, m->src_sem, have);
    return r;
}

static void *follow(void *arg)
{
    vkm_mirror *m = arg;
    uint64_t have = m->start;
    uint64_t next = m->start + 1; /* the destination starts at the value the source had at creation */
    VkResult r;
    while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE)) {
        vkm_thread_checkpoint(); /* the process exiting: park here, outside the driver */
        r = wait_src(m, next, &have);
        if (r == VK_TIMEOUT) continue;
        if (r != VK_SUCCESS) {
            failed(m, r, "vkWaitSemaphores(mirror source)");
            return NULL;
        }
        /* every value in turn, not the latest alone: validation layers before 2024 (1.3.239 on
         * Debian 12) keep a signal that passes waits on lower values pending, and call the next one
         * an error (a signal at the value of each wait is what they track right); a stop or the
         * exit ends the walk at once: a source that jumped far (a host signal) is not walked to
         * its end under the lock first (destroy and release waited for it, the exit hung) */
        pthread_mutex_lock(&m->lock);
        for (; next <= have && r == VK_SUCCESS && !m->released && !__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE) &&
               !vkm_exiting();
             next++)
            r = signal_dst(m, next);
        int released = m->released;
        pthread_mutex_unlock(&m->lock);
        if (released) return NULL; /* (vkm_mirror_release: its waiters went) */
        if (r != VK_SUCCESS) {
            failed(m, r, "vkSignalSemaphore(mirror)");
            return NULL;
        }
    }
    return NULL;
}

VkResult vkm_mirror_create(vkm_device *src, VkSemaphore src_sem, vkm_device *dst, uint64_t spin_ns,
                           vkm_mirror **out, vkm_error *err)
{
    if (!out) return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_mirror_create", "no place for the mirror");
    *out = NULL;
    if (!src || !dst || !src_sem || src == dst)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_mirror_create",
                        "a mirror needs a source semaphore and two distinct devices");
    uint64_t start = 0;
    VkResult r = vkm_timeline_value(src, src_sem, &start);
    if (r != VK_SUCCESS) return vkm_fail(err, r, "vkGetSemaphoreCounterValue(mirror source)", NULL);
    vkm_mirror *m = calloc(1, sizeof *m);
    if (!m) return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "calloc(mirror)", NULL);
    m->src = src;
    m->dst = dst;
    m->src_sem = src_sem;
    m->start = start;
    m->spin_ns = spin_ns;
    vkm_error_clear(&m->why);
    pthread_mutex_init(&m->lock, NULL);
    r = vkm_create_timeline(dst, start, &m->dst_sem);
    if (r != VK_SUCCESS) {
        vkm_mirror_destroy(m);
        return vkm_fail(err, r, "vkCreateSemaphore(mirror)", NULL);
    }
    vkm_thread_start();
    if (pthread_create(&m->thread, NULL, follow_thread, m) != 0) {
        vkm_thread_done();
        vkm_mirror_destroy(m);
        return vkm_fail(err, VK_ERROR_INITIALIZATION_FAILED, "pthread_create",
                        "the timeline mirror's thread could not be started");
    }
    pthread_setname_np(m->thread, "vkm-mirror");
    m->started = 1;
    vkm_live_add(&live_mirrors, &m->live);
    *out = m;
    return VK_SUCCESS;
}

VkSemaphore vkm_mirror_semaphore(const vkm_mirror *m) { return m->dst_sem; }

void vkm_mirror_release(vkm_mirror *m, const char *why)
{
    __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE); /* first: a thread walking values stops and lets the lock go */
    pthread_mutex_lock(&m->lock);
    if (m->error == VK_SUCCESS) {
        m->error = VK_ERROR_DEVICE_LOST;
        vkm_fail(&m->why, VK_ERROR_DEVICE_LOST, "vkm_mirror_release", "the timeline mirror from '%s' to '%s' was "
                 "released: %s", m->src->name, m->dst->name, why ? why : "its source is lost");
    }
    release_locked(m);
    pthread_mutex_unlock(&m->lock); /* (its thread leaves within a slice) */
}

static int release_at_exit(vkm_live *node)
{
    vkm_mirror *m = (vkm_mirror *)((char *)node - offsetof(vkm_mirror, live));
    int n = 0;
    pthread_mutex_lock(&m->lock);
    if (!m->released) { /* through the driver, as the thread's own signals: a device marked lost still runs */
        m->released = 1;
        n = signal_dst(m, RELEASE_VALUE) == VK_SUCCESS;
    }
    pthread_mutex_unlock(&m->lock);
    return n;
}

int vkm_mirrors_release_all(void)
{
    return vkm_exiting() ? vkm_live_each(&live_mirrors, release_at_exit) : 0;
}

VkResult vkm_mirror_status(vkm_mirror *m, vkm_error *err)
{
    pthread_mutex_lock(&m->lock);
    VkResult r = m->error;
    if (r != VK_SUCCESS && err) *err = m->why;
    pthread_mutex_unlock(&m->lock);
    return r;
}

void vkm_mirror_destroy(vkm_mirror *m)
{
    if (!m || vkm_exiting()) return; /* at exit its thread is parked: the process takes the rest */
    vkm_live_remove(&live_mirrors, &m->live);
    if (m->started) {
        __atomic_store_n(&m->stop, 1, __ATOMIC_RELEASE);
        pthread_join(m->thread, NULL);
    }
    if (m->dst_sem) m->dst->fn.vkDestroySemaphore(m->dst->device, m->dst_sem, NULL);
    pthread_mutex_destroy(&m->lock);
    free(m);
}
