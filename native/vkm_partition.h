/* vkm_partition.h - greedy cost partitioner of scene-render-units (SRUs).
 *
 * Plain C11, no Vulkan, no Python. See vkm_partition() for the rules.
 */
#ifndef VKM_PARTITION_H
#define VKM_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    VKM_PARTITION_OK = 0,
    VKM_PARTITION_EINVAL = -1,  /* an argument is out of range (see vkm_partition_input) */
    VKM_PARTITION_ENOMEM = -2,
};

typedef struct vkm_partition_input {
    size_t count;              /* number of SRUs */
    const double *cost;        /* [count] finite, >= 0: work on a device of weight 1 */
    const int64_t *tie_key;    /* [count] distinct: equal costs are taken in ascending key order */
    const double *transfer;    /* [count] finite, >= 0, or NULL (all 0): paid on any device != 0 */
    const uint8_t *pinned;     /* [count] or NULL: nonzero keeps the SRU on device 0 */
    const int32_t *previous;   /* [count] or NULL: last frame's device, -1 (or out of range) for none */
    int device_count;          /* >= 1 */
    const double *weights;     /* [device_count] finite, > 0, or NULL (all 1): relative speed */
    double hysteresis;         /* [0, 1): how much better a re-plan must be to drop `previous` */
} vkm_partition_input;

/* Assign every SRU a device; device_out[i] is SRU i's device (input order).
 *
 * Time of SRU i on device d: cost[i] / weights[d], plus transfer[i] if d != 0.
 * Order: cost descending, then tie_key ascending.
 * Greedy plan: pinned SRUs go to device 0 (in order, adding to its load); then
 *   each other SRU, in order, goes to the device where it would finish first
 *   (load[d] + time), ties to the lowest index, so device 0 wins ties.
 * Sticky plan (only when `previous` is given): pinned SRUs as above; then every
 *   unpinned SRU whose previous device is in [0, device_count) keeps it (in
 *   order); then the rest are placed greedily.
 * The greedy plan is returned only if its makespan < sticky makespan * (1 - hysteresis);
 * otherwise the sticky plan is.
 */
int vkm_partition(const vkm_partition_input *in, int32_t *device_out);

#ifdef __cplusplus
}
#endif

#endif /* VKM_PARTITION_H */
