/* vkm_core.c - device function tables, queues with their locks, waits, errors. */
#include "vkm.h"

#include <errno.h>
#include <sched.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static const vkm_result_info results[] = {
#define VKM_RESULT_ROW_(name, what) {#name, (int)(name), what},
    VKM_RESULTS(VKM_RESULT_ROW_)
#undef VKM_RESULT_ROW_
};

const vkm_result_info *vkm_result_table(size_t *count)
{
    *count = sizeof results / sizeof results[0];
    return results;
}

const char *vkm_result_name(VkResult r)
{
    switch ((int)r) { /* a duplicate value is a duplicate case: it does not compile */
#define VKM_RESULT_CASE_(name, what) \
    case (int)(name):                 \
        return #name;
        VKM_RESULTS(VKM_RESULT_CASE_)
#undef VKM_RESULT_CASE_
    default:
        return NULL;
    }
}

void vkm_error_clear(vkm_error *e)
{
    if (!e) return;
    e->where = NULL;
    e->message[0] = 0;
}

VkResult vkm_fail(vkm_error *e, VkResult r, const char *where, const char *fmt, ...)
{
    if (!e) return r;
    e->where = where;
    e->message[0] = 0;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->message, sizeof e->message, fmt, ap);
        va_end(ap);
    }
    return r;
}

uint64_t vkm_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int is_extension_fn(const char *name)
{
    size_t n = strlen(name);
    return (n > 3 && strcmp(name + n - 3, "EXT") == 0) || (n > 3 && strcmp(name + n - 3, "KHR") == 0);
}

VkResult vkm_device_init(vkm_device *d, VkPhysicalDevice physical, VkDevice device,
                         int has_external_memory_host, int has_external_memory_fd,
                         int has_external_memory_dma_buf, vkm_error *err)
{
    memset(d, 0, sizeof(*d));
    d->physical = physical;
    d->device = device;
    d->has_external_memory_host = has_external_memory_host;
    d->has_external_memory_fd = has_external_memory_fd;
    d->has_external_memory_dma_buf = has_external_memory_dma_buf;

#define VKM_DEVICE_FN(name)                                                         \
    d->fn.name = (PFN_##name)vkGetDeviceProcAddr(device, #name);                   \
    if (!d->fn.name && !is_extension_fn(#name))                                     \
        return vkm_fail(err, VK_ERROR_INITIALIZATION_FAILED, "vkGetDeviceProcAddr",  \
                        "the driver does not provide " #name " on this device");
#include "vkm_device_fns.h"
#undef VKM_DEVICE_FN

    vkGetPhysicalDeviceMemoryProperties(physical, &d->memory);
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT host = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES,
                                                 .pNext = has_external_memory_host ? &host : NULL};
    VkPhysicalDeviceProperties2 props = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &m3};
    vkGetPhysicalDeviceProperties2(physical, &props);
    d->limits = props.properties.limits;
    d->max_allocation_size = m3.maxMemoryAllocationSize;
    snprintf(d->name, sizeof d->name, "%s", props.properties.deviceName);
    if (has_external_memory_host && !d->fn.vkGetMemoryHostPointerPropertiesEXT)
        return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkGetDeviceProcAddr",
                        "VK_EXT_external_memory_host was said to be enabled on '%s', but the driver does not provide "
                        "vkGetMemoryHostPointerPropertiesEXT", d->name);
    if (has_external_memory_fd && !(d->fn.vkGetMemoryFdKHR && d->fn.vkGetMemoryFdPropertiesKHR))
        return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkGetDeviceProcAddr",
                        "VK_KHR_external_memory_fd was said to be enabled on '%s', but the driver does not provide "
                        "vkGetMemoryFdKHR", d->name);
    d->host_pointer_alignment = has_external_memory_host ? host.minImportedHostPointerAlignment : 0;
    return VK_SUCCESS;
}

int vkm_find_memory_type(const vkm_device *d, uint32_t type_bits,
                         VkMemoryPropertyFlags required, VkMemoryPropertyFlags preferred)
{
    int fallback = -1;
    for (uint32_t i = 0; i < d->memory.memoryTypeCount; i++) {
        if (!(type_bits & (1u << i)))
            continue;
        VkMemoryPropertyFlags f = d->memory.memoryTypes[i].propertyFlags;
        if ((f & required) != required)
            continue;
        if ((f & preferred) == preferred)
            return (int)i;
        if (fallback < 0)
            fallback = (int)i;
    }
    return fallback;
}

void vkm_queue_init(vkm_queue *q, VkQueue queue, uint32_t family, uint32_t index)
{
    q->queue = queue;
    q->family = family;
    q->index = index;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    /* a thread that takes it twice (a submit under its own `with queue.lock:`) is told so
     * (EDEADLK), and an unlock by a thread that does not hold it is refused (EPERM) */
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&q->lock, &attr);
    pthread_mutexattr_destroy(&attr);
}

int vkm_queue_lock(vkm_queue *q, uint64_t timeout_ns)
{
    int rc = pthread_mutex_trylock(&q->lock);
    if (rc != EBUSY) return rc;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
    /* timed against CLOCK_MONOTONIC, as every wait of the core: a deadline taken from the
     * wall clock would move with it (set back an hour, one slice would last an hour) */
    const clockid_t clock = CLOCK_MONOTONIC;
#else
    const clockid_t clock = CLOCK_REALTIME;   /* (timedlock's clock where clocklock is missing) */
#endif
    struct timespec ts;
    clock_gettime(clock, &ts);
    if (timeout_ns > 100000000000000000ull) timeout_ns = 100000000000000000ull; /* ~3 years: no overflow */
    uint64_t n = (uint64_t)ts.tv_nsec + timeout_ns;
    ts.tv_sec += (time_t)(n / 1000000000ull);
    ts.tv_nsec = (long)(n % 1000000000ull);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
    return pthread_mutex_clocklock(&q->lock, clock, &ts);
#else
    return pthread_mutex_timedlock(&q->lock, &ts);
#endif
}

int vkm_queue_unlock(vkm_queue *q) { return pthread_mutex_unlock(&q->lock); }

void vkm_queue_destroy(vkm_queue *q)
{
    pthread_mutex_destroy(&q->lock);
}

void vkm_device_mark_lost(const vkm_device *d)
{
    /* the flag is the one field of a device that changes after vkm_device_init */
    __atomic_store_n(&((vkm_device *)d)->lost, 1, __ATOMIC_RELEASE);
}

int vkm_device_is_lost(const vkm_device *d)
{
    return __atomic_load_n(&d->lost, __ATOMIC_ACQUIRE);
}

/* The driver's result, with VK_ERROR_DEVICE_LOST remembered on the device. */
static VkResult seen(const vkm_device *d, VkResult r)
{
    if (r == VK_ERROR_DEVICE_LOST) vkm_device_mark_lost(d);
    return r;
}

VkResult vkm_queue_submit(const vkm_device *d, vkm_queue *q, uint32_t count,
                          const VkSubmitInfo *submits, VkFence fence)
{
    if (pthread_mutex_lock(&q->lock) != 0)   /* EDEADLK: this thread holds it (its own `with queue.lock:`) */
        return VKM_ERROR_QUEUE_LOCK_HELD;    /* (going on would release the caller's lock after the submit) */
    /* checked under the queue's lock: once a loss is marked and each queue's lock
     * taken once (vkm_queues_drain_raw), nothing new reaches the driver */
    VkResult r = vkm_device_is_lost(d) ? VK_ERROR_DEVICE_LOST : seen(d, d->fn.vkQueueSubmit(q->queue, count, submits, fence));
    pthread_mutex_unlock(&q->lock);
    return r;
}

VkResult vkm_queues_drain_raw(const vkm_device *d, vkm_queue *const *queues, uint32_t count, VkFence *fences,
                              uint64_t timeout_ns)
{
    VkResult r = VK_SUCCESS;
    for (uint32_t i = 0; i < count; i++) {
        if (fences[i] != VK_NULL_HANDLE) continue;   /* submitted by an earlier slice */
        VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        r = d->fn.vkCreateFence(d->device, &fi, NULL, &fences[i]);
        if (r != VK_SUCCESS) {
            fences[i] = VK_NULL_HANDLE;
            return r;
        }
        int locked = vkm_queue_lock(queues[i], timeout_ns); /* a lock held elsewhere ends the slice */
        if (locked != 0) {
            d->fn.vkDestroyFence(d->device, fences[i], NULL);
            fences[i] = VK_NULL_HANDLE;
            return locked == ETIMEDOUT ? VK_TIMEOUT : VKM_ERROR_QUEUE_LOCK_HELD;
        }
        r = d->fn.vkQueueSubmit(queues[i]->queue, 0, NULL, fences[i]);
        vkm_queue_unlock(queues[i]);
        if (r != VK_SUCCESS) {
            d->fn.vkDestroyFence(d->device, fences[i], NULL);
            fences[i] = VK_NULL_HANDLE;
            return r;
        }
    }
    if (count) r = d->fn.vkWaitForFences(d->device, count, fences, VK_TRUE, timeout_ns);
    if (r == VK_TIMEOUT) return r;   /* the fences stay for the next slice */
    for (uint32_t i = 0; i < count; i++) {
        d->fn.vkDestroyFence(d->device, fences[i], NULL);
        fences[i] = VK_NULL_HANDLE;
    }
    return r;
}

VkResult vkm_wait_timeline(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t timeout_ns)
{
    VkSemaphoreWaitInfo info = {
        .sType = VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
        .semaphoreCount = 1,
        .pSemaphores = &sem,
        .pValues = &value,
    };
    if (vkm_device_is_lost(d)) return VK_ERROR_DEVICE_LOST;
    return seen(d, d->fn.vkWaitSemaphores(d->device, &info, timeout_ns));
}

VkResult vkm_timeline_value(const vkm_device *d, VkSemaphore sem, uint64_t *value)
{
    if (vkm_device_is_lost(d)) return VK_ERROR_DEVICE_LOST;
    return seen(d, d->fn.vkGetSemaphoreCounterValue(d->device, sem, value));
}

VkResult vkm_signal_timeline_driver(const vkm_device *d, VkSemaphore sem, uint64_t value)
{
    VkSemaphoreSignalInfo info = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, .semaphore = sem, .value = value};
    return d->fn.vkSignalSemaphore(d->device, &info);
}

VkResult vkm_signal_timeline(const vkm_device *d, VkSemaphore sem, uint64_t value)
{
    if (vkm_device_is_lost(d)) return VK_ERROR_DEVICE_LOST;
    return seen(d, vkm_signal_timeline_driver(d, sem, value));
}

/* Shortest and longest nap; a wait napping past VKM_NAP_BLOCK_NS blocks in the driver. */
#define NAP_MIN_NS 2000u
#define NAP_MAX_NS 500000u
#define NAP_SLACK_NS 1000u

static void nap_learn(vkm_nap *nap, uint64_t have, uint64_t now)
{
    if (have > nap->value && nap->at_ns) {
        uint64_t sample = (now - nap->at_ns) / (have - nap->value);
        if (sample < 50000000u)   /* (a longer one spans an idle host, not the device's pace) */
            nap->period_ns = nap->period_ns ? (3 * nap->period_ns + sample) / 4 : sample;
    }
    if (have != nap->value || !nap->at_ns) {
        nap->value = have;
        nap->at_ns = now;
    }
}

static void nap_sleep(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
    nanosleep(&ts, NULL);
}

static VkResult nap_wait(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t timeout_ns, vkm_nap *nap)
{
    uint64_t start = vkm_now_ns(), grow = NAP_MIN_NS;
    for (;;) {
        uint64_t have = 0;
        VkResult r = vkm_timeline_value(d, sem, &have);
        if (r != VK_SUCCESS) return r;
        uint64_t now = vkm_now_ns();
        nap_learn(nap, have, now);
        if (have >= value) return VK_SUCCESS;
        uint64_t spent = now - start;
        if (spent >= timeout_ns) return VK_TIMEOUT;
        if (spent >= VKM_NAP_BLOCK_NS)
            return vkm_wait_timeline(d, sem, value, timeout_ns - spent);
        /* until the value is due at the pace learnt (from the last one seen), then an eighth of a
         * step at a time; naps that double while the pace is not known */
        uint64_t ns = grow;
        if (nap->period_ns) {
            uint64_t ahead = value - nap->value;
            uint64_t due = nap->at_ns + (ahead < 4096u ? ahead : 4096u) * nap->period_ns;
            ns = due > now ? due - now : nap->period_ns / 8;
        } else {
            grow *= 2;
        }
        if (ns < NAP_MIN_NS) ns = NAP_MIN_NS;
        if (ns > NAP_MAX_NS) ns = NAP_MAX_NS;
        if (ns > timeout_ns - spent) ns = timeout_ns - spent;
        nap_sleep(ns);
    }
}

VkResult vkm_nap_wait(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t timeout_ns, vkm_nap *nap)
{
#ifdef __linux__
    /* (a nap ends when asked, not up to the thread's timer slack, 50 us by default, later) */
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (slack > (int)NAP_SLACK_NS) prctl(PR_SET_TIMERSLACK, (unsigned long)NAP_SLACK_NS, 0, 0, 0);
    VkResult r = nap_wait(d, sem, value, timeout_ns, nap);
    if (slack > (int)NAP_SLACK_NS) prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
    return r;
#else
    return nap_wait(d, sem, value, timeout_ns, nap);
#endif
}

VkResult vkm_spin_wait(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t spin_ns)
{
    if (!spin_ns) return VK_TIMEOUT;
    uint64_t end = vkm_now_ns() + spin_ns;
    do {
        uint64_t have = 0;
        VkResult r = vkm_timeline_value(d, sem, &have);
        if (r != VK_SUCCESS) return r;
        if (have >= value) return VK_SUCCESS;
        sched_yield();
    } while (vkm_now_ns() < end);
    return VK_TIMEOUT;
}

VkResult vkm_wait_fence(const vkm_device *d, VkFence fence, uint64_t timeout_ns)
{
    if (vkm_device_is_lost(d)) return VK_ERROR_DEVICE_LOST;
    return seen(d, d->fn.vkWaitForFences(d->device, 1, &fence, VK_TRUE, timeout_ns));
}

VkResult vkm_fence_status(const vkm_device *d, VkFence fence)
{
    if (vkm_device_is_lost(d)) return VK_ERROR_DEVICE_LOST;
    return seen(d, d->fn.vkGetFenceStatus(d->device, fence));
}

VkResult vkm_device_wait_idle(const vkm_device *d)
{
    if (vkm_device_is_lost(d)) return VK_ERROR_DEVICE_LOST;
    return seen(d, d->fn.vkDeviceWaitIdle(d->device));
}

VkResult vkm_create_timeline(const vkm_device *d, uint64_t initial, VkSemaphore *out)
{
    VkSemaphoreTypeCreateInfo type = {
        .sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
        .semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE,
        .initialValue = initial,
    };
    VkSemaphoreCreateInfo info = {.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, .pNext = &type};
    return d->fn.vkCreateSemaphore(d->device, &info, NULL, out);
}

void vkm_destroy_timeline(const vkm_device *d, VkSemaphore sem)
{
    if (sem) d->fn.vkDestroySemaphore(d->device, sem, NULL);
}
