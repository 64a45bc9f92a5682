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
    VKM_PARTITION_EINVAL = -1,    /* count, device_count or hysteresis out of range, or a NULL array */
    VKM_PARTITION_ENOMEM = -2,
    VKM_PARTITION_ECOST = -3,     /* cost[*bad_index] is negative or not finite */
    VKM_PARTITION_ETRANSFER = -4, /* transfer[*bad_index] is negative or not finite */
    VKM_PARTITION_EWEIGHT = -5,   /* weights[*bad_index] is not finite and > 0 */
    VKM_PARTITION_ELINK = -6,     /* link[*bad_index] is negative or not finite */
    VKM_PARTITION_EPIN = -7,      /* pin[*bad_index] is not -1 and not in [0, device_count) */
    VKM_PARTITION_EPREVIOUS = -8, /* previous[*bad_index] is not -1 and not in [0, device_count) */
    VKM_PARTITION_EDUPKEY = -9,   /* tie_key[*bad_index] equals an earlier SRU's key */
};

/* Largest number of SRUs one call takes. */
#define VKM_PARTITION_MAX_COUNT ((size_t)1 << 28)

typedef struct vkm_partition_input {
    size_t count;              /* number of SRUs, <= VKM_PARTITION_MAX_COUNT */
    const double *cost;        /* [count] finite, >= 0: work on a device of weight 1 */
    const int64_t *tie_key;    /* [count] distinct, or NULL (= input position): equal costs go in
                                * ascending key order */
    const double *transfer;    /* [count] finite, >= 0, or NULL: paid on any device != 0 (see link) */
    const int32_t *pin;        /* [count] or NULL: -1 free, else the device the SRU must render on */
    const int32_t *previous;   /* [count] or NULL: last frame's device, -1 for none */
    int64_t device_count;      /* >= 1; no array of this size is made unless weights or link is given */
    const double *weights;     /* [device_count] finite, > 0, or NULL (all 1): relative speed */
    const double *link;        /* [device_count] finite, >= 0, or NULL: cost factor of moving a result
                                * from device d to device 0 (link[0] is not used) */
    double hysteresis;         /* [0, 1): how much better a re-plan must be to drop `previous` */
} vkm_partition_input;

/* Assign every SRU a device; device_out[i] is SRU i's device (input order).
 *
 * Time of SRU i on device d: cost[i] / weights[d], plus on d != 0 the transfer
 * term x = transfer[i] * link[d] (without link: x = transfer[i]; with link but
 * no transfer: x = link[d]). Computed as `(load[d] + cost / w) + x`, x first,
 * so no step can be fused into a multiply-add.
 * Order: cost descending, then tie_key ascending.
 * Greedy plan: pinned SRUs go to their devices (in order, adding to the load);
 *   then each other SRU, in order, goes to the device where it would finish
 *   first. Ties: device 0 wins any tie; between other devices the one with the
 *   smaller load so far, then the lower index.
 * Sticky plan (only when `previous` names a device for some unpinned SRU):
 *   pinned SRUs as above; then every unpinned SRU with a previous device keeps
 *   it (in order); then the rest are placed greedily.
 * The greedy plan is returned only if its makespan < sticky makespan * (1 - hysteresis);
 * otherwise the sticky plan is.
 *
 * Time O(n log n + n * G * log D) for n SRUs, D devices and G distinct
 * (weight, link) pairs among devices 1..D-1; without weights and link the
 * devices are all alike (G = 1) and memory is O(n), whatever device_count is.
 * On an error code other than EINVAL/ENOMEM, *bad_index (if not NULL) is
 * the offending SRU position (device index for EWEIGHT/ELINK).
 */
int vkm_partition(const vkm_partition_input *in, int32_t *device_out, size_t *bad_index);

#ifdef __cplusplus
}
#endif

#endif /* VKM_PARTITION_H */
