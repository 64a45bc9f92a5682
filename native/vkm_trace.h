/* vkm_trace.h - a timeline of a link's work, for finding where time goes.
 *
 * Off unless the link is given a file to trace into (Python passes the
 * environment variable VKMULTI_TRACE down). Then a poller thread (a whole CPU core while the link lives: a
 * diagnostic, not for production) spins on the link's timeline semaphores and
 * records every value change with CLOCK_MONOTONIC nanoseconds, the worker adds
 * marks of its own (job taken, batch submitted ...), and when the link is
 * destroyed the lines "label,t_ns,what,value" are appended to the file.
 * Every function accepts a NULL trace and then does nothing.
 */
#ifndef VKM_TRACE_H
#define VKM_TRACE_H

#include "vkm.h"

typedef struct vkm_trace vkm_trace;

/* A trace for one link (`label` names it in the file) appended to `path`, or
 * NULL when `path` is NULL or empty (tracing off). */
vkm_trace *vkm_trace_open(const char *path, const char *label);
/* Watch `sem` (a timeline of `d`) under `name` (a static string). Before vkm_trace_start. */
void vkm_trace_watch(vkm_trace *t, const vkm_device *d, VkSemaphore sem, const char *name);
void vkm_trace_start(vkm_trace *t);
/* A link's trace (or NULL): `label`, watching its two timelines as src_done and
 * dst_ready, started. */
vkm_trace *vkm_trace_link(const char *path, const char *label, const vkm_device *src, VkSemaphore src_done,
                          const vkm_device *dst, VkSemaphore dst_ready);
/* Record a host event now; `what` is a static string. Thread-safe, lock-free. */
void vkm_trace_mark(vkm_trace *t, const char *what, uint64_t value);
/* Stop the poller, write the records, free the trace. */
void vkm_trace_close(vkm_trace *t);

#endif
