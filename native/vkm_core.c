/* vkm_core.c - device function tables, queues with their locks, waits. */
#include "vkm.h"

#include <string.h>
#include <time.h>

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
                         int has_external_memory_dma_buf, const char **call)
{
    memset(d, 0, sizeof(*d));
    d->physical = physical;
    d->device = device;
    d->has_external_memory_host = has_external_memory_host;
    d->has_external_memory_fd = has_external_memory_fd;
    d->has_external_memory_dma_buf = has_external_memory_dma_buf;

#define VKM_DEVICE_FN(name)                                                         \
    d->fn.name = (PFN_##name)vkGetDeviceProcAddr(device, #name);                   \
    if (!d->fn.name && !is_extension_fn(#name)) {                                   \
        if (call) *call = "vkGetDeviceProcAddr(" #name ")";                         \
        return VK_ERROR_INITIALIZATION_FAILED;                                      \
    }
#include "vkm_device_fns.h"
#undef VKM_DEVICE_FN

    if (has_external_memory_host && !d->fn.vkGetMemoryHostPointerPropertiesEXT) {
        if (call) *call = "vkGetDeviceProcAddr(vkGetMemoryHostPointerPropertiesEXT)";
        return VK_ERROR_EXTENSION_NOT_PRESENT;
    }
    if (has_external_memory_fd && !(d->fn.vkGetMemoryFdKHR && d->fn.vkGetMemoryFdPropertiesKHR)) {
        if (call) *call = "vkGetDeviceProcAddr(vkGetMemoryFdKHR)";
        return VK_ERROR_EXTENSION_NOT_PRESENT;
    }

    vkGetPhysicalDeviceMemoryProperties(physical, &d->memory);
    VkPhysicalDeviceExternalMemoryHostPropertiesEXT host = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT};
    VkPhysicalDeviceProperties2 props = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                         .pNext = has_external_memory_host ? &host : NULL};
    vkGetPhysicalDeviceProperties2(physical, &props);
    d->limits = props.properties.limits;
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
    pthread_mutex_init(&q->lock, NULL);
}

void vkm_queue_destroy(vkm_queue *q)
{
    pthread_mutex_destroy(&q->lock);
}

VkResult vkm_queue_submit(const vkm_device *d, vkm_queue *q, uint32_t count,
                          const VkSubmitInfo *submits, VkFence fence)
{
    pthread_mutex_lock(&q->lock);
    VkResult r = d->fn.vkQueueSubmit(q->queue, count, submits, fence);
    pthread_mutex_unlock(&q->lock);
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
    return d->fn.vkWaitSemaphores(d->device, &info, timeout_ns);
}

VkResult vkm_timeline_value(const vkm_device *d, VkSemaphore sem, uint64_t *value)
{
    return d->fn.vkGetSemaphoreCounterValue(d->device, sem, value);
}

VkResult vkm_wait_fence(const vkm_device *d, VkFence fence, uint64_t timeout_ns)
{
    return d->fn.vkWaitForFences(d->device, 1, &fence, VK_TRUE, timeout_ns);
}

VkResult vkm_device_wait_idle(const vkm_device *d)
{
    return d->fn.vkDeviceWaitIdle(d->device);
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
