/* vkm_trace.c - see vkm_trace.h. */
#include "vkm_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRACE_RECORDS (1u << 20) /* 24 MiB; later records are dropped (and counted) */
#define TRACE_WATCHES 8

typedef struct trace_record {
    uint64_t t_ns;
    const char *what;
    uint64_t value;
} trace_record;

struct vkm_trace {
    char label[64];
    char path[512];
    trace_record *records;
    uint64_t next; /* atomic: the next free record */
    int nwatch;
    struct {
        const vkm_device *dev;
        VkSemaphore sem;
        const char *name;
        uint64_t last;
    } watch[TRACE_WATCHES];
    pthread_t poller;
    int started;
    int stop; /* atomic */
};

vkm_trace *vkm_trace_open(const char *path, const char *label)
{
    if (!path || !*path) return NULL;
    vkm_trace *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    t->records = malloc(sizeof(trace_record) * TRACE_RECORDS);
    if (!t->records) {
        free(t);
        return NULL;
    }
    snprintf(t->label, sizeof t->label, "%s", label);
    snprintf(t->path, sizeof t->path, "%s", path);
    return t;
}

void vkm_trace_watch(vkm_trace *t, const vkm_device *d, VkSemaphore sem, const char *name)
{
    if (!t || !sem || t->started || t->nwatch >= TRACE_WATCHES) return;
    t->watch[t->nwatch].dev = d;
    t->watch[t->nwatch].sem = sem;
    t->watch[t->nwatch].name = name;
    t->watch[t->nwatch].last = 0;
    t->nwatch++;
}

void vkm_trace_mark(vkm_trace *t, const char *what, uint64_t value)
{
    if (!t) return;
    uint64_t i = __atomic_fetch_add(&t->next, 1, __ATOMIC_RELAXED);
    if (i >= TRACE_RECORDS) return;
    t->records[i] = (trace_record){vkm_now_ns(), what, value};
}

static void *poll_loop(void *arg)
{
    vkm_trace *t = arg;
    while (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < t->nwatch; i++) {
            uint64_t v = 0;
            if (vkm_timeline_value(t->watch[i].dev, t->watch[i].sem, &v) == VK_SUCCESS && v != t->watch[i].last) {
                t->watch[i].last = v;
                vkm_trace_mark(t, t->watch[i].name, v);
            }
        }
    }
    return NULL;
}

void vkm_trace_start(vkm_trace *t)
{
    if (!t || t->started) return;
    if (t->nwatch && pthread_create(&t->poller, NULL, poll_loop, t) == 0) {
        pthread_setname_np(t->poller, "vkm-trace");
        t->started = 1;
    }
}

vkm_trace *vkm_trace_link(const char *path, const char *label, const vkm_device *src, VkSemaphore src_done,
                          const vkm_device *dst, VkSemaphore dst_ready)
{
    vkm_trace *t = vkm_trace_open(path, label);
    vkm_trace_watch(t, src, src_done, "src_done");
    vkm_trace_watch(t, dst, dst_ready, "dst_ready");
    vkm_trace_start(t);
    return t;
}

void vkm_trace_close(vkm_trace *t)
{
    if (!t) return;
    if (t->started) {
        __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
        pthread_join(t->poller, NULL);
    }
    uint64_t n = t->next < TRACE_RECORDS ? t->next : TRACE_RECORDS;
    FILE *f = fopen(t->path, "a");
    if (f) {
        for (uint64_t i = 0; i < n; i++)
            fprintf(f, "%s,%llu,%s,%llu\n", t->label, (unsigned long long)t->records[i].t_ns, t->records[i].what,
                    (unsigned long long)t->records[i].value);
        if (t->next > TRACE_RECORDS)
            fprintf(f, "%s,0,dropped,%llu\n", t->label, (unsigned long long)(t->next - TRACE_RECORDS));
        fclose(f);
    }
    free(t->records);
    free(t);
}
