/* vkm_jobq.c - see vkm_jobq.h. */
#include "vkm_jobq.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- process exit (see vkm_jobq.h) ---- */

static int exiting;            /* set once, by vkm_exit_park */
static int busy;               /* native threads that may be calling the driver */
static __thread int native;    /* this thread is one of ours (only those park) */

static void park(pthread_mutex_t *held)
{
    __atomic_sub_fetch(&busy, 1, __ATOMIC_SEQ_CST);
    if (held) pthread_mutex_unlock(held);
    for (;;) pause(); /* until the process ends */
}

void vkm_thread_start(void) { __atomic_add_fetch(&busy, 1, __ATOMIC_SEQ_CST); }

void vkm_thread_done(void) { __atomic_sub_fetch(&busy, 1, __ATOMIC_SEQ_CST); }

int vkm_exiting(void) { return __atomic_load_n(&exiting, __ATOMIC_SEQ_CST); }

void vkm_thread_idle(int idle, pthread_mutex_t *held)
{
    native = 1;
    if (idle) {
        __atomic_sub_fetch(&busy, 1, __ATOMIC_SEQ_CST);
        return;
    }
    __atomic_add_fetch(&busy, 1, __ATOMIC_SEQ_CST); /* before the look at `exiting`: one of the two sees the other */
    if (vkm_exiting()) park(held);
}

void vkm_thread_checkpoint(void)
{
    native = 1;
    if (vkm_exiting()) park(NULL);
}

int vkm_exit_park(uint64_t timeout_ns)
{
    __atomic_store_n(&exiting, 1, __ATOMIC_SEQ_CST);
    if (native) return 0; /* (never from a native thread) */
    uint64_t t0 = vkm_now_ns();
    while (__atomic_load_n(&busy, __ATOMIC_SEQ_CST) > 0) {
        if (vkm_now_ns() - t0 >= timeout_ns) return 0;
        usleep(1000);
    }
    return 1;
}

void vkm_live_add(vkm_live_list *list, vkm_live *node)
{
    pthread_mutex_lock(&list->lock);
    node->prev = NULL;
    node->next = list->head;
    if (list->head) list->head->prev = node;
    list->head = node;
    pthread_mutex_unlock(&list->lock);
}

void vkm_live_remove(vkm_live_list *list, vkm_live *node)
{
    pthread_mutex_lock(&list->lock);
    if (node->prev) node->prev->next = node->next;
    else if (list->head == node) list->head = node->next;
    if (node->next) node->next->prev = node->prev;
    node->prev = node->next = NULL;
    pthread_mutex_unlock(&list->lock);
}

int vkm_live_each(vkm_live_list *list, int (*fn)(vkm_live *node))
{
    int n = 0;
    pthread_mutex_lock(&list->lock);
    for (vkm_live *node = list->head; node; node = node->next) n += fn(node);
    pthread_mutex_unlock(&list->lock);
    return n;
}

/* An absolute CLOCK_MONOTONIC deadline `ns` from now, for pthread_cond_timedwait
 * on the queue's condition variables (made on that clock: a step of the wall
 * clock neither stretches nor cuts a wait). */
static struct timespec deadline_in(uint64_t ns)
{
    struct timespec ts;
    if (ns > 100000000000000000ull) ns = 100000000000000000ull; /* "forever": ~3 years, no overflow below */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t n = (uint64_t)ts.tv_nsec + ns;
    ts.tv_sec += (time_t)(n / 1000000000ull);
    ts.tv_nsec = (long)(n % 1000000000ull);
    return ts;
}

/* The link's failure into `err`; call with the lock held. */
static VkResult told(const vkm_jobq *q, vkm_error *err)
{
    if (err) {
        err->where = q->error_where;
        memcpy(err->message, q->message, sizeof err->message);
    }
    return q->error;
}

void vkm_jobq_init(vkm_jobq *q)
{
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&q->wake, &attr);
    pthread_cond_init(&q->progress, &attr);
    pthread_condattr_destroy(&attr);
}

vkm_jobq_item *vkm_jobq_destroy(vkm_jobq *q)
{
    vkm_jobq_item *rest = q->head;
    q->head = q->tail = NULL;
    pthread_cond_destroy(&q->progress);
    pthread_cond_destroy(&q->wake);
    pthread_mutex_destroy(&q->lock);
    return rest;
}

VkResult vkm_jobq_push(vkm_jobq *q, vkm_jobq_item *it, uint64_t src_count, uint64_t dst_count, uint64_t *ticket,
                       uint64_t *src_last, uint64_t *dst_last, vkm_error *err)
{
    pthread_mutex_lock(&q->lock);
    if (q->error != VK_SUCCESS) {
        VkResult e = told(q, err);
        pthread_mutex_unlock(&q->lock);
        return e;
    }
    it->next = NULL;
    it->ticket = ++q->next_ticket;
    it->src_base = q->src_value;
    it->dst_base = q->dst_value;
    q->src_value += src_count;
    q->dst_value += dst_count;
    *ticket = it->ticket;
    *src_last = q->src_value;
    *dst_last = q->dst_value;
    if (q->tail) q->tail->next = it; else __atomic_store_n(&q->head, it, __ATOMIC_RELEASE);
    q->tail = it;
    pthread_mutex_unlock(&q->lock);
    /* after the unlock: a sleeping worker wakes to a free lock instead of
     * blocking on ours (a second futex round trip on the caller's path); it
     * re-checks q->head under the lock, so no wake-up is lost */
    pthread_cond_signal(&q->wake);
    return VK_SUCCESS;
}

VkResult vkm_jobq_start(vkm_jobq *q, void *(*worker)(void *), void *arg, vkm_error *err)
{
    vkm_thread_start();
    if (pthread_create(&q->worker, NULL, worker, arg) != 0) {
        vkm_thread_done();
        return vkm_fail(err, VK_ERROR_INITIALIZATION_FAILED, "pthread_create", "the link's worker thread could not "
                        "be started");
    }
    pthread_setname_np(q->worker, "vkm-link"); /* the library's threads are told apart by name */
    q->worker_started = 1;
    return VK_SUCCESS;
}

void vkm_jobq_stop(vkm_jobq *q)
{
    if (!q->worker_started || vkm_exiting()) return; /* (a parked worker is never joined) */
    pthread_mutex_lock(&q->lock);
    __atomic_store_n(&q->stopping, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&q->wake);
    pthread_mutex_unlock(&q->lock);
    pthread_join(q->worker, NULL);
    q->worker_started = 0;
}

void vkm_jobq_last_values(vkm_jobq *q, uint64_t *src_last, uint64_t *dst_last)
{
    pthread_mutex_lock(&q->lock);
    *src_last = q->src_value;
    *dst_last = q->dst_value;
    pthread_mutex_unlock(&q->lock);
}

/* Call with the lock held. */
static VkResult failure(const vkm_jobq *q, uint64_t ticket, uint64_t dst_ready, vkm_error *err)
{
    if (q->error != VK_SUCCESS && (ticket >= q->failed_ticket || dst_ready > q->fail_dst_value))
        return told(q, err);
    return VK_SUCCESS;
}

/* VKM_ERROR_INVALID_ARGUMENT unless `ticket` was handed out and `dst_ready` is a value
 * it can have: every job reserves at least one destination value, so ticket t's lies in
 * [t, dst_value - (next_ticket - t)]. Without this check a wait for a ticket never
 * issued would block until its timeout, and one for ticket 0 would report it done.
 * Call with the lock held. */
static VkResult unissued(const vkm_jobq *q, uint64_t ticket, uint64_t dst_ready, vkm_error *err)
{
    if (ticket == 0 || ticket > q->next_ticket)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_poll",
                        "ticket %llu was never issued by this link (its tickets so far: 1 ... %llu)",
                        (unsigned long long)ticket, (unsigned long long)q->next_ticket);
    uint64_t top = q->dst_value - (q->next_ticket - ticket);
    if (dst_ready < ticket || dst_ready > top)
        return vkm_fail(err, VKM_ERROR_INVALID_ARGUMENT, "vkm_link_poll",
                        "dst_ready %llu was never issued with ticket %llu (its value lies in [%llu, %llu]): "
                        "pass the values submit() returned",
                        (unsigned long long)dst_ready, (unsigned long long)ticket, (unsigned long long)ticket,
                        (unsigned long long)top);
    return VK_SUCCESS;
}

VkResult vkm_jobq_wait_submitted(vkm_jobq *q, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns,
                                 vkm_error *err)
{
    pthread_mutex_lock(&q->lock);
    VkResult r = unissued(q, ticket, dst_ready, err);
    if (r != VK_SUCCESS) {
        pthread_mutex_unlock(&q->lock);
        return r;
    }
    r = failure(q, ticket, dst_ready, err);
    if (r == VK_SUCCESS && q->submitted_ticket < ticket) {
        struct timespec ts = deadline_in(timeout_ns);
        while (q->submitted_ticket < ticket && q->error == VK_SUCCESS)
            if (pthread_cond_timedwait(&q->progress, &q->lock, &ts) == ETIMEDOUT) break;
        r = failure(q, ticket, dst_ready, err);
        if (r == VK_SUCCESS && q->submitted_ticket < ticket) r = VK_TIMEOUT;
    }
    pthread_mutex_unlock(&q->lock);
    return r;
}

/* Poll (no lock) for up to `spin_ns` until job `ticket` is submitted or the
 * link failed; the caller then takes the locked path, which decides. A
 * condition-variable wake-up costs tens of microseconds on a GPU host: this
 * keeps a waiter that came early off it, as the timeline spin below does. */
static void spin_submitted(const vkm_jobq *q, uint64_t ticket, uint64_t spin_ns)
{
    if (!spin_ns) return;
    uint64_t end = vkm_now_ns() + spin_ns;
    while (__atomic_load_n(&q->submitted_ticket, __ATOMIC_ACQUIRE) < ticket &&
           __atomic_load_n(&q->error, __ATOMIC_ACQUIRE) == VK_SUCCESS && vkm_now_ns() < end)
        sched_yield();
}

VkResult vkm_jobq_poll(vkm_jobq *q, const vkm_device *d, VkSemaphore sem, uint64_t ticket, uint64_t dst_ready,
                       uint64_t timeout_ns, uint64_t spin_ns, vkm_error *err)
{
    uint64_t t0 = vkm_now_ns();
    spin_submitted(q, ticket, timeout_ns < spin_ns ? timeout_ns : spin_ns);
    uint64_t spent = vkm_now_ns() - t0;
    VkResult r = vkm_jobq_wait_submitted(q, ticket, dst_ready, spent < timeout_ns ? timeout_ns - spent : 0, err);
    if (r != VK_SUCCESS) return r;
    spent = vkm_now_ns() - t0;
    uint64_t left = spent < timeout_ns ? timeout_ns - spent : 0;
    r = vkm_spin_wait(d, sem, dst_ready, left < spin_ns ? left : spin_ns);
    if (r == VK_TIMEOUT) {
        spent = vkm_now_ns() - t0;
        r = vkm_wait_timeline(d, sem, dst_ready, spent < timeout_ns ? timeout_ns - spent : 0);
    }
    if (r != VK_SUCCESS) return r == VK_TIMEOUT ? r : vkm_fail(err, r, "vkWaitSemaphores(dst_ready)", NULL);
    /* a job that failed after dst_ready was reached is still reported */
    pthread_mutex_lock(&q->lock);
    r = failure(q, ticket, dst_ready, err);
    pthread_mutex_unlock(&q->lock);
    return r;
}

vkm_jobq_item *vkm_jobq_take(vkm_jobq *q, int *failed, uint64_t watch_ns, int (*watch)(void *), void *arg)
{
    int watching = watch != NULL;
    pthread_mutex_lock(&q->lock);
    while (!q->head && !q->stopping) {
        vkm_thread_idle(1, NULL);
        if (watching && q->error == VK_SUCCESS) {
            struct timespec ts = deadline_in(watch_ns);
            pthread_cond_timedwait(&q->wake, &q->lock, &ts);
            vkm_thread_idle(0, &q->lock);
            if (q->head || q->stopping) break;
            pthread_mutex_unlock(&q->lock);
            watching = watch(arg);
            pthread_mutex_lock(&q->lock);
        } else {
            pthread_cond_wait(&q->wake, &q->lock);
            vkm_thread_idle(0, &q->lock);
        }
    }
    vkm_jobq_item *it = q->head; /* NULL: stopping and drained */
    *failed = q->error != VK_SUCCESS;
    pthread_mutex_unlock(&q->lock);
    if (!it) vkm_thread_done(); /* the worker returns */
    return it;
}

void vkm_jobq_fail(vkm_jobq *q, VkResult r, const vkm_error *why, uint64_t ticket, uint64_t fail_dst_value)
{
    pthread_mutex_lock(&q->lock);
    if (q->error == VK_SUCCESS) {
        __atomic_store_n(&q->error, r, __ATOMIC_RELEASE);
        q->error_where = why && why->where ? why->where : "transfer link";
        q->failed_ticket = ticket;
        q->fail_dst_value = fail_dst_value;
        snprintf(q->message, sizeof q->message, "%s", why ? why->message : "");
    }
    pthread_mutex_unlock(&q->lock);
    pthread_cond_broadcast(&q->progress);
}

#define RELEASE_SLICE_NS 100000000ull

static void release_timeline(const vkm_device *d, VkSemaphore sem, uint64_t submitted, uint64_t target,
                             uint64_t timeout_ns)
{
    uint64_t have = 0;
    VkResult r = VK_SUCCESS;
    if (!sem) return;
    for (uint64_t waited = 0; submitted; waited += RELEASE_SLICE_NS) { /* slices: an exit parks the worker */
        vkm_thread_checkpoint();
        r = vkm_wait_timeline(d, sem, submitted, RELEASE_SLICE_NS);
        if (r != VK_TIMEOUT || waited >= timeout_ns) break;
    }
    if (r != VK_SUCCESS) return; /* still running: a signal from the host could undercut its own */
    if (vkm_timeline_value(d, sem, &have) != VK_SUCCESS || have >= target) return;
    VkSemaphoreSignalInfo si = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, .semaphore = sem, .value = target};
    d->fn.vkSignalSemaphore(d->device, &si);
}

void vkm_jobq_release(vkm_jobq *q, const vkm_device *src, VkSemaphore src_sem, uint64_t src_submitted,
                      const vkm_device *dst, VkSemaphore dst_sem, uint64_t dst_submitted, uint64_t timeout_ns)
{
    pthread_mutex_lock(&q->lock);
    uint64_t src_target = q->src_value, dst_target = q->dst_value;
    pthread_mutex_unlock(&q->lock);
    release_timeline(src, src_sem, src_submitted, src_target, timeout_ns);
    release_timeline(dst, dst_sem, dst_submitted, dst_target, timeout_ns);
}

void vkm_jobq_finish(vkm_jobq *q, vkm_jobq_item *it, uint64_t spin_ns)
{
    pthread_mutex_lock(&q->lock);
    __atomic_store_n(&q->submitted_ticket, it->ticket, __ATOMIC_RELEASE);
    __atomic_store_n(&q->head, it->next, __ATOMIC_RELEASE);
    if (!q->head) q->tail = NULL;
    pthread_mutex_unlock(&q->lock);
    pthread_cond_broadcast(&q->progress); /* after the unlock, as in vkm_jobq_push */
    if (!spin_ns) return;
    uint64_t t0 = vkm_now_ns();
    while (!__atomic_load_n(&q->head, __ATOMIC_ACQUIRE) && !__atomic_load_n(&q->stopping, __ATOMIC_ACQUIRE) &&
           vkm_now_ns() - t0 < spin_ns)
        sched_yield();
}
