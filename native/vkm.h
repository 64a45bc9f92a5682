/* vkm.h - the C core of vkmulti. Knows nothing of Python.
 *
 * Every function that can fail returns a VkResult (VK_SUCCESS on success) and,
 * where useful, says where and what through a `vkm_error *err` (vkm_errors.h).
 * The Cython layer turns (result, where, message) into exceptions.
 */
#ifndef VKM_H
#define VKM_H

#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <vulkan/vulkan.h>

#include "vkm_errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device-level function table: loaded once per VkDevice ---------------- */

typedef struct vkm_device_fns {
#define VKM_DEVICE_FN(name) PFN_##name name;
#include "vkm_device_fns.h"
#undef VKM_DEVICE_FN
} vkm_device_fns;

typedef struct vkm_device {
    VkPhysicalDevice physical;
    VkDevice device;
    vkm_device_fns fn;
    VkPhysicalDeviceMemoryProperties memory;
    VkPhysicalDeviceLimits limits;
    VkDeviceSize host_pointer_alignment;   /* 0 when VK_EXT_external_memory_host is off */
    VkDeviceSize max_allocation_size;      /* maxMemoryAllocationSize (Vulkan 1.1) */
    int has_external_memory_host;
    int has_external_memory_fd;
    int has_external_memory_dma_buf;
    char name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE]; /* deviceName, for messages */
    /* Set (atomically, never cleared) once the device returned VK_ERROR_DEVICE_LOST
     * or a test marked it lost (vkmulti.testing.lose_device): every submit and
     * wait below then returns VK_ERROR_DEVICE_LOST without calling the driver. */
    int lost;
} vkm_device;

/* Load the function table of `device`. The extension flags say which
 * extensions the caller enabled on it (their functions are then required). */
VkResult vkm_device_init(vkm_device *d, VkPhysicalDevice physical, VkDevice device,
                         int has_external_memory_host, int has_external_memory_fd,
                         int has_external_memory_dma_buf, vkm_error *err);

/* Mark `d` lost (idempotent, any thread) / whether it is. The submit and wait
 * wrappers below check the flag first and set it when the driver reports the loss. */
void vkm_device_mark_lost(const vkm_device *d);
int vkm_device_is_lost(const vkm_device *d);

/* Index of a memory type allowed by `type_bits` that has all of `required`
 * (and, if possible, all of `preferred`); -1 when none. */
int vkm_find_memory_type(const vkm_device *d, uint32_t type_bits,
                         VkMemoryPropertyFlags required, VkMemoryPropertyFlags preferred);

/* ---- queues: a VkQueue plus the lock Vulkan's external synchronisation needs */

typedef struct vkm_queue {
    VkQueue queue;
    uint32_t family;
    uint32_t index;
    pthread_mutex_t lock;
} vkm_queue;

void vkm_queue_init(vkm_queue *q, VkQueue queue, uint32_t family, uint32_t index);
void vkm_queue_destroy(vkm_queue *q);
/* Take the queue's lock, waiting at most `timeout_ns`: 0, ETIMEDOUT, or EDEADLK when
 * the calling thread holds it already (the lock is not re-entrant). */
int vkm_queue_lock(vkm_queue *q, uint64_t timeout_ns);
/* 0, or EPERM when the calling thread does not hold the lock. */
int vkm_queue_unlock(vkm_queue *q);
/* vkQueueSubmit under the queue's lock; VKM_ERROR_QUEUE_LOCK_HELD (nothing submitted, the
 * lock left as it was) when the calling thread holds that lock already. */
VkResult vkm_queue_submit(const vkm_device *d, vkm_queue *q, uint32_t count,
                          const VkSubmitInfo *submits, VkFence fence);

/* ---- waits (call without the GIL; bounded by timeout_ns) ----------------- */

/* CLOCK_MONOTONIC in nanoseconds: the clock of every deadline and trace in the core. */
uint64_t vkm_now_ns(void);

VkResult vkm_wait_timeline(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t timeout_ns);
/* Poll `sem` for up to `spin_ns` before a blocking wait (a GPU's semaphore
 * wake-up costs tens of microseconds); VK_TIMEOUT: not reached yet. */
VkResult vkm_spin_wait(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t spin_ns);
VkResult vkm_timeline_value(const vkm_device *d, VkSemaphore sem, uint64_t *value);

/* What a napping waiter learnt of one timeline: the last value it saw, when, and
 * how long one value takes to follow the one before (0: not known yet). */
typedef struct vkm_nap {
    uint64_t value;
    uint64_t at_ns;
    uint64_t period_ns;
} vkm_nap;
/* Wait until `sem` reaches `value` by reading its counter between naps, each a share
 * of the time the values still to come are expected to take (nap->period_ns, learnt
 * as it goes), and by a blocking wait once it has napped VKM_NAP_BLOCK_NS: a driver
 * whose blocking wait spins (NVIDIA's) then costs the host CPU only for long waits,
 * and a wake-up is never later than a nap's share of the wait. VK_TIMEOUT after
 * timeout_ns. */
VkResult vkm_nap_wait(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t timeout_ns, vkm_nap *nap);
#define VKM_NAP_BLOCK_NS 2000000u
/* vkSignalSemaphore of timeline `sem` to `value` from the host. */
VkResult vkm_signal_timeline(const vkm_device *d, VkSemaphore sem, uint64_t value);
/* The same through the driver even on a device marked lost (an injected loss: the driver still
 * runs what the device was given, and GPU work may wait for this value). */
VkResult vkm_signal_timeline_driver(const vkm_device *d, VkSemaphore sem, uint64_t value);
VkResult vkm_wait_fence(const vkm_device *d, VkFence fence, uint64_t timeout_ns);
/* vkGetFenceStatus: VK_SUCCESS signalled, VK_NOT_READY not yet. */
VkResult vkm_fence_status(const vkm_device *d, VkFence fence);
/* Wait (bounded) until every queue in `queues` finished what was submitted to
 * it, calling the driver even on a device marked lost: a test's injected loss
 * leaves the driver working, and the work it was given must be done before the
 * lost device's objects are freed. One slice of that wait: an empty submit with a
 * fence on each queue whose `fences[i]` is VK_NULL_HANDLE (its lock waited for at
 * most `timeout_ns`: VK_TIMEOUT while another thread holds it,
 * VKM_ERROR_QUEUE_LOCK_HELD when the calling thread does), then at most `timeout_ns`
 * for all of them. VK_TIMEOUT: work still running, the fences kept in `fences` for
 * the next slice (left alive by a caller that gives up: they may still signal);
 * otherwise they are destroyed and zeroed. A failure to make or submit one returns
 * at once, those already submitted kept. */
VkResult vkm_queues_drain_raw(const vkm_device *d, vkm_queue *const *queues, uint32_t count, VkFence *fences,
                              uint64_t timeout_ns);
VkResult vkm_device_wait_idle(const vkm_device *d);
VkResult vkm_create_timeline(const vkm_device *d, uint64_t initial, VkSemaphore *out);
/* Destroy a timeline of vkm_create_timeline (the caller makes sure no GPU work still uses it). */
void vkm_destroy_timeline(const vkm_device *d, VkSemaphore sem);

/* ---- validation messages: a debug-utils messenger with a C callback ------- */

typedef struct vkm_messenger vkm_messenger;

VkResult vkm_messenger_create(VkInstance instance, vkm_messenger **out, vkm_error *err);
void vkm_messenger_destroy(vkm_messenger *m);
/* Copies out and removes up to `max` pending messages; returns how many. */
size_t vkm_messenger_drain(vkm_messenger *m, size_t max, int *severity, char **text);
uint64_t vkm_messenger_count(vkm_messenger *m, int severity);

#ifdef __cplusplus
}
#endif
#endif
