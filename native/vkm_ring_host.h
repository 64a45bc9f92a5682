/* vkm_ring_host.h - the state of the staging, host shared and exported rings
 * (vkm_ring_host.c runs them, vkm_ring_host_memory.c makes their memory). */
#ifndef VKM_RING_HOST_H
#define VKM_RING_HOST_H

#include "vkm_copy_team.h"
#include "vkm_ring.h"

/* One device's end of the ring. */
typedef struct host_end {
    VkBuffer ring;
    VkDeviceMemory memory;
    uint8_t *mapped; /* staging rings only */
    int coherent;
    /* ownership-transfer submits on an owner queue: a small pool per family */
    VkCommandPool owner_pool;
    uint32_t owner_family;
    VkCommandBuffer owner_cmds[4];
    uint64_t owner_free_at[4]; /* timeline value after which owner_cmds[i] is free */
    uint32_t owner_next;
} host_end;

typedef struct host_ring {
    host_end src, dst;
    void *host_block;            /* host shared: the allocation both devices import */
    VkCommandBuffer *batch_cmds; /* scratch for one batch of destination submits */
    vkm_copy_team team;          /* staging: the CPU copy's helpers */
    int team_started;
} host_ring;

/* Make the ring's memory for l's kind (staging, host shared or exported) and
 * say so in l->ring_note. */
VkResult vkm_host_ring_memory(vkm_link *l, host_ring *h, vkm_error *err);

#endif
