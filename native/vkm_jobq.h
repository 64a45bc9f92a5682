/* vkm_jobq.h - the job queue every link runs on (vkm_link.c).
 *
 * Callers queue jobs and get a ticket plus the timeline values the job will
 * signal; one worker thread per link takes jobs in order, submits their GPU
 * work and reports each job as fully submitted (or failed). Failures are
 * sticky: the failing ticket and every later one report the error, and so
 * does any job whose dst_ready value lies above the value reached when the
 * link failed. Jobs embed a vkm_jobq_item as their first member.
 */
#ifndef VKM_JOBQ_H
#define VKM_JOBQ_H

#include "vkm.h"

typedef struct vkm_jobq_item {
    struct vkm_jobq_item *next;
    uint64_t ticket;
    uint64_t src_base, dst_base; /* the last timeline values handed out before this job */
} vkm_jobq_item;

typedef struct vkm_jobq {
    pthread_mutex_t lock;
    pthread_cond_t wake;     /* a job was queued / stop requested */
    pthread_cond_t progress; /* a job was fully submitted, or the link failed */
    vkm_jobq_item *head, *tail;
    int stopping;
    uint64_t next_ticket;      /* last ticket handed out */
    uint64_t submitted_ticket; /* last ticket fully submitted (stored atomically: spinning waiters read it) */
    uint64_t src_value, dst_value; /* last timeline values handed out */
    VkResult error;            /* sticky (stored atomically, as submitted_ticket) */
    const char *error_where;
    uint64_t failed_ticket;    /* tickets from this one on failed ... */
    uint64_t fail_dst_value;   /* ... and so did every job whose dst_ready is above this */
    char message[VKM_MESSAGE_SIZE]; /* the failure in words (may be empty) */
    pthread_t worker;          /* the link's worker (vkm_jobq_start) */
    int worker_started;
} vkm_jobq;

void vkm_jobq_init(vkm_jobq *q);
/* The jobs still queued (caller frees them), after the worker stopped. */
vkm_jobq_item *vkm_jobq_destroy(vkm_jobq *q);

/* Queue `it`: assign its ticket and reserve `src_count`/`dst_count` timeline
 * values (it->src_base/dst_base + 1 ... + count). Once queued, the worker may
 * run and free `it` at any moment, so the ticket and the last reserved values
 * come back through *ticket, *src_last, *dst_last (read under the lock); the
 * caller must not touch `it` after a successful push. The link's error if failed. */
VkResult vkm_jobq_push(vkm_jobq *q, vkm_jobq_item *it, uint64_t src_count, uint64_t dst_count, uint64_t *ticket,
                       uint64_t *src_last, uint64_t *dst_last, vkm_error *err);
/* Start the link's worker thread, `worker(arg)`. */
VkResult vkm_jobq_start(vkm_jobq *q, void *(*worker)(void *), void *arg, vkm_error *err);
/* Ask the worker to stop once the queue is empty (vkm_jobq_take then returns
 * NULL) and join it; nothing when it was never started. */
void vkm_jobq_stop(vkm_jobq *q);

/* The last timeline values handed out (under the lock). */
void vkm_jobq_last_values(vkm_jobq *q, uint64_t *src_last, uint64_t *dst_last);

/* Wait up to `timeout_ns` until job `ticket` (dst_ready value `dst_ready`)
 * is fully submitted: VK_SUCCESS, VK_TIMEOUT, or the job's error;
 * VKM_ERROR_INVALID_ARGUMENT at once for a ticket never issued or a dst_ready
 * that ticket cannot have. */
VkResult vkm_jobq_wait_submitted(vkm_jobq *q, uint64_t ticket, uint64_t dst_ready, uint64_t timeout_ns,
                                 vkm_error *err);
/* Wait up to `timeout_ns` until job `ticket` is complete: submitted, then
 * `sem` (the destination timeline on `d`) at `dst_ready`; each of the two is
 * polled for up to `spin_ns` before blocking. VK_SUCCESS, VK_TIMEOUT or the
 * job's error. */
VkResult vkm_jobq_poll(vkm_jobq *q, const vkm_device *d, VkSemaphore sem, uint64_t ticket, uint64_t dst_ready,
                       uint64_t timeout_ns, uint64_t spin_ns, vkm_error *err);

/* Worker: the next job (still queued), or NULL once stopping with the queue
 * empty; *failed tells whether the link has already failed (skip the job).
 * While idle it calls `watch(arg)` (lock released) every `watch_ns` as long
 * as the previous call returned nonzero (work in flight); watch may be NULL. */
vkm_jobq_item *vkm_jobq_take(vkm_jobq *q, int *failed, uint64_t watch_ns, int (*watch)(void *), void *arg);
/* Record the link's failure `r` (the first one only; `why` says where and
 * what, may be NULL) and wake every waiter. */
void vkm_jobq_fail(vkm_jobq *q, VkResult r, const vkm_error *why, uint64_t ticket, uint64_t fail_dst_value);
/* After a failed job: once each GPU has reached what was submitted to it
 * (bounded wait), bring both timelines up to the last values handed out, so
 * GPU work waiting on a point of a failed or skipped job is not left waiting
 * forever (callers' waits still report the failure). */
void vkm_jobq_release(vkm_jobq *q, const vkm_device *src, VkSemaphore src_sem, uint64_t src_submitted,
                      const vkm_device *dst, VkSemaphore dst_sem, uint64_t dst_submitted, uint64_t timeout_ns);
/* Worker: job `it`, the head, is fully submitted (or failed): dequeue it (the
 * caller frees it), wake waiters, then stay awake `spin_ns` for the next job
 * (a caller that waits for one transfer and submits the next finds the worker
 * awake; a condition-variable wake-up costs ~10 us). */
void vkm_jobq_finish(vkm_jobq *q, vkm_jobq_item *it, uint64_t spin_ns);

/* ---- process exit ----------------------------------------------------------
 * Library destructors run at exit() while native threads may still be inside
 * the driver (a link waiting on a semaphore that never comes), and crash them.
 * vkm_exit_park() (the module's atexit hook, before the interpreter finalizes)
 * makes every native thread stop at its next check point - between two wait
 * slices, or when it wakes idle - and stay parked outside the driver until the
 * process ends; from then on destroying a link or mirror leaves it to the exit.
 * Threads count themselves "busy" while they may call the driver. */

/* A native thread is about to start (busy from now); vkm_thread_done() when it ends. */
void vkm_thread_start(void);
void vkm_thread_done(void);
/* The calling native thread leaves (`idle` 1) or re-enters (0) a state where it
 * makes no driver calls; on re-entry after vkm_exit_park() it parks, unlocking
 * `held` (may be NULL) first. */
void vkm_thread_idle(int idle, pthread_mutex_t *held);
/* In a native thread between driver calls: park if the process is exiting. */
void vkm_thread_checkpoint(void);
/* Whether vkm_exit_park() was called. */
int vkm_exiting(void);
/* Park every native thread; 1 when none is busy within `timeout_ns`, else 0. */
int vkm_exit_park(uint64_t timeout_ns);

/* The live objects of one kind (links, mirrors) that the exit must reach after
 * vkm_exit_park(): an intrusive list under its own lock. */
typedef struct vkm_live {
    struct vkm_live *prev, *next;
} vkm_live;
typedef struct vkm_live_list {
    pthread_mutex_t lock;
    vkm_live *head;
} vkm_live_list;
#define VKM_LIVE_LIST_INIT {PTHREAD_MUTEX_INITIALIZER, NULL}
void vkm_live_add(vkm_live_list *list, vkm_live *node);
/* Idempotent; a node never added is left alone. */
void vkm_live_remove(vkm_live_list *list, vkm_live *node);
/* Call `fn(node)` on every node under the list's lock; the sum of what it returned. */
int vkm_live_each(vkm_live_list *list, int (*fn)(vkm_live *node));

#endif
