# Declarations mirroring vkm.h (and the few Vulkan types it uses).
from libc.stdint cimport uint32_t, uint64_t, int32_t, uintptr_t

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_lock(pthread_mutex_t *m)
    int pthread_mutex_unlock(pthread_mutex_t *m)

cdef extern from "vkm.h" nogil:
    ctypedef int32_t VkResult

    ctypedef struct vkm_error:
        const char *where
        char message[512]
    void vkm_error_clear(vkm_error *e)

    ctypedef struct vkm_result_info:
        const char *name
        int value
        const char *what
    const vkm_result_info *vkm_result_table(size_t *count)

    ctypedef void* VkInstance
    ctypedef void* VkPhysicalDevice
    ctypedef void* VkDevice
    ctypedef void* VkQueue
    ctypedef void* VkSemaphore
    ctypedef void* VkFence
    ctypedef uint64_t VkDeviceSize

    enum:
        VK_SUCCESS
        VK_NOT_READY
        VK_TIMEOUT
        VK_ERROR_DEVICE_LOST

    ctypedef struct vkm_device:
        VkPhysicalDevice physical
        VkDevice device
        VkDeviceSize host_pointer_alignment
        int has_external_memory_host
        int has_external_memory_fd
        int has_external_memory_dma_buf
        char name[256]
        int lost

    void vkm_device_mark_lost(const vkm_device *d)
    int vkm_device_is_lost(const vkm_device *d)
    VkResult vkm_device_init(vkm_device *d, VkPhysicalDevice physical, VkDevice device,
                             int has_external_memory_host, int has_external_memory_fd,
                             int has_external_memory_dma_buf, vkm_error *err)

    ctypedef struct vkm_queue:
        VkQueue queue
        uint32_t family
        uint32_t index
        pthread_mutex_t lock

    void vkm_queue_init(vkm_queue *q, VkQueue queue, uint32_t family, uint32_t index)
    void vkm_queue_destroy(vkm_queue *q)
    int vkm_queue_lock(vkm_queue *q, uint64_t timeout_ns)
    int vkm_queue_unlock(vkm_queue *q)

    VkResult vkm_wait_timeline(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t timeout_ns)
    VkResult vkm_timeline_value(const vkm_device *d, VkSemaphore sem, uint64_t *value)
    ctypedef struct vkm_nap:
        uint64_t value
        uint64_t at_ns
        uint64_t period_ns
    VkResult vkm_nap_wait(const vkm_device *d, VkSemaphore sem, uint64_t value, uint64_t timeout_ns, vkm_nap *nap)
    VkResult vkm_wait_fence(const vkm_device *d, VkFence fence, uint64_t timeout_ns)
    VkResult vkm_fence_status(const vkm_device *d, VkFence fence)
    VkResult vkm_queues_drain_raw(const vkm_device *d, vkm_queue **queues, uint32_t count, VkFence *fences,
                                  uint64_t timeout_ns)
    VkResult vkm_device_wait_idle(const vkm_device *d)
    VkResult vkm_create_timeline(const vkm_device *d, uint64_t initial, VkSemaphore *out)
    void vkm_destroy_timeline(const vkm_device *d, VkSemaphore sem)

    ctypedef struct vkm_messenger:
        pass
    VkResult vkm_messenger_create(VkInstance instance, vkm_messenger **out, vkm_error *err)
    void vkm_messenger_destroy(vkm_messenger *m)
    size_t vkm_messenger_drain(vkm_messenger *m, size_t max, int *severity, char **text)
    uint64_t vkm_messenger_count(vkm_messenger *m, int severity)


cdef int check(VkResult result, const char *call) except -1
cdef int check_error(VkResult result, const vkm_error *err) except -1
cdef class Device:
    cdef vkm_device dev
    cdef bint alive
    cdef set timelines
    cdef vkm_device* ptr(self) except NULL
    cdef int own(self, uintptr_t semaphore, str label) except -1
