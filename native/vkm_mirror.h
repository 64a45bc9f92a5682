/* vkm_mirror.h - a timeline semaphore of one device mirrored on another.
 *
 * Two devices cannot share a semaphore where vkmulti runs (no external
 * semaphore fds on lavapipe, different drivers, ...). A mirror's thread waits
 * (no GIL) for each new value of a timeline semaphore of the source device and
 * signals the same value from the host on a timeline semaphore of the
 * destination device it owns: GPU work there waits on the GPU for work here.
 * A wait on a mirrored value may be queued before the value exists, on any
 * queue, even the only one of a device: a host signal never stands behind it
 * in a queue, so the host never waits for it before submitting. Nothing is
 * pushed per value: the thread follows the source timeline by itself.
 */
#ifndef VKM_MIRROR_H
#define VKM_MIRROR_H

#include "vkm.h"

typedef struct vkm_mirror vkm_mirror;

/* Start mirroring `src_sem` (a timeline semaphore of `src`) on a new timeline
 * semaphore of `dst`, starting at the source's current value. `spin_ns`: poll
 * the source that long before blocking (0 on CPU devices). The source
 * semaphore must outlive the mirror. */
VkResult vkm_mirror_create(vkm_device *src, VkSemaphore src_sem, vkm_device *dst, uint64_t spin_ns,
                           vkm_mirror **out, vkm_error *err);
/* The destination semaphore (its value follows the source's). */
VkSemaphore vkm_mirror_semaphore(const vkm_mirror *m);
/* VK_SUCCESS while it mirrors; else the failure that stopped it (a device the
 * driver reports lost, or vkm_mirror_release), with where and what in *err.
 * After a failure the destination semaphore was raised as far as it goes, so no
 * GPU work waits on it forever. */
VkResult vkm_mirror_status(vkm_mirror *m, vkm_error *err);
/* Let the GPU work waiting on the mirror go now, whatever the source reached:
 * the destination is raised as far as it goes and the mirror stops (its status
 * becomes VK_ERROR_DEVICE_LOST, with `why`). Once its source is marked lost the
 * mirror still follows what the driver runs there (an injected loss) until the
 * driver itself fails or this is called (a failover, once the lost device's
 * work is drained or given up on). Idempotent. */
void vkm_mirror_release(vkm_mirror *m, const char *why);
/* At exit, after vkm_exit_park() (the mirrors' threads parked): raise every live
 * mirror's destination as far as it goes, so that GPU work waiting on a mirror
 * runs out before a driver that tears its devices down at exit waits for it.
 * The number raised. */
int vkm_mirrors_release_all(void);
/* Stop the thread (within a slice) and destroy the destination semaphore; the
 * caller makes sure no GPU work still waits on it. */
void vkm_mirror_destroy(vkm_mirror *m);

#endif
