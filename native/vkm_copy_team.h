/* vkm_copy_team.h - helper threads that split one large memcpy.
 *
 * The staging ring's CPU copy out of mapped memory runs on one core at a
 * fraction of what PCIe carries; a team of helpers copies parts of it at once.
 */
#ifndef VKM_COPY_TEAM_H
#define VKM_COPY_TEAM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct vkm_copy_team {
    int helpers;
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t go, done;
    uint64_t generation;
    int remaining, stop;
    uint8_t *dst;
    const uint8_t *src;
    size_t len;
} vkm_copy_team;

/* Start up to `helpers` threads (fewer if some cannot be made; 0: copies run on the caller alone). */
void vkm_copy_team_start(vkm_copy_team *t, int helpers);
/* memcpy(dst, src, len), split across the caller and the helpers (small copies: the caller alone). */
void vkm_copy_team_copy(vkm_copy_team *t, uint8_t *dst, const uint8_t *src, size_t len);
/* Stop and join the helpers. */
void vkm_copy_team_stop(vkm_copy_team *t);

#endif
