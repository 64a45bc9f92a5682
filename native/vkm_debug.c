/* vkm_debug.c - a debug-utils messenger whose C callback queues messages.
 * A C callback (not a Python one) so that validation messages raised on the
 * native hand-off threads never need the GIL. */
#include "vkm.h"

#include <stdlib.h>
#include <string.h>

#define VKM_MAX_PENDING 4096

struct vkm_messenger {
    VkInstance instance;
    VkDebugUtilsMessengerEXT handle;
    PFN_vkDestroyDebugUtilsMessengerEXT destroy;
    pthread_mutex_t lock;
    size_t head, count;
    int severity[VKM_MAX_PENDING];
    char *text[VKM_MAX_PENDING];
    uint64_t totals[4]; /* verbose, info, warning, error */
};

static int severity_index(VkDebugUtilsMessageSeverityFlagBitsEXT s)
{
    if (s & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) return 3;
    if (s & VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) return 2;
    if (s & VK_DEBUG_UTILS_MESSAGE_SEVERITY_INFO_BIT_EXT) return 1;
    return 0;
}

static VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                 VkDebugUtilsMessageTypeFlagsEXT types,
                                                 const VkDebugUtilsMessengerCallbackDataEXT *data,
                                                 void *user)
{
    vkm_messenger *m = user;
    int s = severity_index(severity);
    const char *msg = data && data->pMessage ? data->pMessage : "";
    char *copy = strdup(msg);
    pthread_mutex_lock(&m->lock);
    m->totals[s]++;
    if (m->count == VKM_MAX_PENDING) { /* drop the oldest */
        free(m->text[m->head]);
        m->head = (m->head + 1) % VKM_MAX_PENDING;
        m->count--;
    }
    size_t slot = (m->head + m->count) % VKM_MAX_PENDING;
    m->severity[slot] = s;
    m->text[slot] = copy;
    m->count++;
    pthread_mutex_unlock(&m->lock);
    return VK_FALSE;
}

VkResult vkm_messenger_create(VkInstance instance, vkm_messenger **out, vkm_error *err)
{
    *out = NULL;
    PFN_vkCreateDebugUtilsMessengerEXT create =
        (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT");
    PFN_vkDestroyDebugUtilsMessengerEXT destroy =
        (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT");
    if (!create || !destroy)
        return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkGetInstanceProcAddr(vkCreateDebugUtilsMessengerEXT)",
                        "VK_EXT_debug_utils is not enabled on this instance");
    vkm_messenger *m = calloc(1, sizeof(*m));
    if (!m) return VK_ERROR_OUT_OF_HOST_MEMORY;
    pthread_mutex_init(&m->lock, NULL);
    m->instance = instance;
    m->destroy = destroy;
    VkDebugUtilsMessengerCreateInfoEXT info = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        .pfnUserCallback = on_message,
        .pUserData = m,
    };
    VkResult r = create(instance, &info, NULL, &m->handle);
    if (r != VK_SUCCESS) {
        vkm_fail(err, r, "vkCreateDebugUtilsMessengerEXT", NULL);
        pthread_mutex_destroy(&m->lock);
        free(m);
        return r;
    }
    *out = m;
    return VK_SUCCESS;
}

void vkm_messenger_destroy(vkm_messenger *m)
{
    if (!m) return;
    m->destroy(m->instance, m->handle, NULL);
    for (size_t i = 0; i < m->count; i++)
        free(m->text[(m->head + i) % VKM_MAX_PENDING]);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

size_t vkm_messenger_drain(vkm_messenger *m, size_t max, int *severity, char **text)
{
    pthread_mutex_lock(&m->lock);
    size_t n = m->count < max ? m->count : max;
    for (size_t i = 0; i < n; i++) {
        severity[i] = m->severity[m->head];
        text[i] = m->text[m->head];
        m->head = (m->head + 1) % VKM_MAX_PENDING;
    }
    m->count -= n;
    pthread_mutex_unlock(&m->lock);
    return n;
}

uint64_t vkm_messenger_count(vkm_messenger *m, int severity)
{
    pthread_mutex_lock(&m->lock);
    uint64_t n = (severity >= 0 && severity < 4) ? m->totals[severity] : 0;
    pthread_mutex_unlock(&m->lock);
    return n;
}
