/* vkm_copy_team.c - see vkm_copy_team.h. */
#include "vkm_copy_team.h"

#include <stdlib.h>
#include <string.h>

static void team_part(const vkm_copy_team *t, int i, size_t *off, size_t *len)
{
    size_t parts = (size_t)t->helpers + 1;
    /* len / parts rounded up, then to whole cache lines: the parts cover all of len (rounding
     * len / parts down lost the last len % parts bytes where it was a multiple of 64) */
    size_t each = (t->len / parts + (t->len % parts != 0) + 63) & ~(size_t)63;
    size_t start = each * (size_t)i;
    *off = start < t->len ? start : t->len;
    size_t end = start + each < t->len ? start + each : t->len;
    *len = end > *off ? end - *off : 0;
}

static void *team_helper(void *arg)
{
    vkm_copy_team *t = ((void **)arg)[0];
    int i = (int)(intptr_t)((void **)arg)[1];
    free(arg);
    uint64_t seen = 0;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (t->generation == seen && !t->stop)
            pthread_cond_wait(&t->go, &t->lock);
        if (t->stop) break;
        seen = t->generation;
        size_t off, len;
        team_part(t, i, &off, &len);
        pthread_mutex_unlock(&t->lock);
        if (len) memcpy(t->dst + off, t->src + off, len);
        pthread_mutex_lock(&t->lock);
        if (--t->remaining == 0) pthread_cond_signal(&t->done);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

void vkm_copy_team_start(vkm_copy_team *t, int helpers)
{
    memset(t, 0, sizeof(*t));
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    if (helpers <= 0) return;
    t->threads = calloc((size_t)helpers, sizeof(pthread_t));
    if (!t->threads) return;
    for (int i = 0; i < helpers; i++) {
        void **arg = malloc(2 * sizeof(void *));
        if (!arg) break;
        arg[0] = t;
        arg[1] = (void *)(intptr_t)(i + 1);
        if (pthread_create(&t->threads[i], NULL, team_helper, arg) != 0) {
            free(arg);
            break;
        }
        pthread_setname_np(t->threads[i], "vkm-copy");
        t->helpers++;
    }
}

void vkm_copy_team_copy(vkm_copy_team *t, uint8_t *dst, const uint8_t *src, size_t len)
{
    if (t->helpers == 0 || len < ((size_t)1 << 20)) {
        memcpy(dst, src, len);
        return;
    }
    pthread_mutex_lock(&t->lock);
    t->dst = dst;
    t->src = src;
    t->len = len;
    t->remaining = t->helpers;
    t->generation++;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->lock);
    size_t off, part;
    team_part(t, 0, &off, &part);
    memcpy(dst + off, src + off, part);
    pthread_mutex_lock(&t->lock);
    while (t->remaining > 0)
        pthread_cond_wait(&t->done, &t->lock);
    pthread_mutex_unlock(&t->lock);
}

void vkm_copy_team_stop(vkm_copy_team *t)
{
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->lock);
    for (int i = 0; i < t->helpers; i++)
        pthread_join(t->threads[i], NULL);
    free(t->threads);
    pthread_cond_destroy(&t->done);
    pthread_cond_destroy(&t->go);
    pthread_mutex_destroy(&t->lock);
}
