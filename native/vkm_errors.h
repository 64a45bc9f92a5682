/* vkm_errors.h - the native core's own result codes, and how a failure is told.
 *
 * Every core function that can fail returns a VkResult: one of Vulkan's codes
 * or one of vkmulti's below. vkmulti's are defined here and nowhere else, with
 * distinct values in a range Vulkan leaves unused (vkm_result_name's switch
 * does not compile if two collide); vkmulti/errors.py maps each to a typed
 * Python error and tests/test_native_errors.py checks the two tables agree.
 *
 * A failure also fills a vkm_error: `where` names the call or step that failed
 * and `message` says, separately and in words, what happened ("VK_EXT_external_
 * memory_host is not enabled on 'llvmpipe'"). Python composes the two.
 */
#ifndef VKM_ERRORS_H
#define VKM_ERRORS_H

#include <stddef.h>
#include <vulkan/vulkan.h>

#define VKM_ERROR_INVALID_ARGUMENT ((VkResult)-1000990000)
#define VKM_ERROR_LINK_STALLED ((VkResult)-1000990001)
#define VKM_ERROR_CUDA ((VkResult)-1000990002)
#define VKM_ERROR_UNSUPPORTED ((VkResult)-1000990003)
#define VKM_ERROR_QUEUE_LOCK_HELD ((VkResult)-1000990004)

/* Every code above, X(name, what it means): the table Python checks against. */
#define VKM_RESULTS(X)                                                                                  \
    X(VKM_ERROR_INVALID_ARGUMENT, "an argument is out of range or inconsistent")                     \
    X(VKM_ERROR_LINK_STALLED, "a link's worker waited past its stall timeout; the link failed")      \
    X(VKM_ERROR_CUDA, "a CUDA driver call or a CUDA stream failed; the link failed")                 \
    X(VKM_ERROR_UNSUPPORTED, "the device, its enabled extensions or the CUDA driver lack what is needed") \
    X(VKM_ERROR_QUEUE_LOCK_HELD, "the calling thread holds the queue's lock already (it is not re-entrant)")

typedef struct vkm_result_info {
    const char *name;
    int value;
    const char *what;
} vkm_result_info;

/* Every vkmulti code, in the order above; `count` receives how many. */
const vkm_result_info *vkm_result_table(size_t *count);
/* The name of a vkmulti code, or NULL for any other VkResult. */
const char *vkm_result_name(VkResult r);

#define VKM_MESSAGE_SIZE 512

typedef struct vkm_error {
    const char *where;              /* the call or step that failed (a static string); NULL: none yet */
    char message[VKM_MESSAGE_SIZE]; /* what happened, in words; "" when `where` says enough */
} vkm_error;

void vkm_error_clear(vkm_error *e);
/* Fill `e` (it may be NULL) with `where` and the printf-style message (fmt
 * may be NULL: no message), and return `r`. */
VkResult vkm_fail(vkm_error *e, VkResult r, const char *where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Return the VkResult of `expr` when it fails, naming `where_` through the
 * enclosing function's `vkm_error *err`. */
#define VKM_TRY(expr, where_)                                                  \
    do {                                                                       \
        VkResult r_ = (expr);                                                  \
        if (r_ != VK_SUCCESS) return vkm_fail(err, r_, (where_), NULL);        \
    } while (0)

#endif
