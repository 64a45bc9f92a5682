/* mock_libcuda.c - a stand-in for libcuda.so.1 on machines without NVIDIA GPUs.
 *
 * Enough of the CUDA driver API for vkmulti's CUDA_PEER link to run for real
 * on lavapipe: "device memory" is host memory, imported Vulkan memory is the
 * exported memfd mapped with mmap, each stream is a thread running its queue
 * of copies and event operations in order. It checks what the real driver
 * would refuse (wrong context, memory of the wrong device in a local copy,
 * bad descriptors, unbalanced retains, pops without pushes, imports destroyed
 * while mapped) and counts live objects, so a test can see leaks.
 *
 * Environment: MOCK_CUDA_DEVICES (default 2); MOCK_CUDA_FAIL=name:n makes the
 * n-th call of cu<name> return CUDA_ERROR_INVALID_VALUE; MOCK_CUDA_STREAM_FAULT=n
 * makes the n-th stream copy fail the stream with CUDA_ERROR_ILLEGAL_ADDRESS
 * (mock_cuda_configure() changes both at run time).
 * Timeline semaphore import is not supported (lavapipe cannot export them).
 *
 * Build: cc -shared -fPIC -O1 -o libcuda_mock.so mock_libcuda.c -lpthread
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    OK = 0, E_INVALID_VALUE = 1, E_NOT_INITIALIZED = 3, E_INVALID_DEVICE = 101, E_INVALID_CONTEXT = 201,
    E_INVALID_HANDLE = 400, E_NOT_READY = 600, E_ILLEGAL_ADDRESS = 700, E_PEER_ENABLED = 704,
    E_NOT_SUPPORTED = 801,
};

#define MAXDEV 8
typedef struct ctx {
    int device;
    int refs;
    int peer[MAXDEV];
    CUresult sticky; /* a fault on the GPU poisons the whole context, as in CUDA */
} ctx_t;

typedef struct region {
    char *base;
    size_t size;
    int device;
    int kind; /* 1 cuMemAlloc, 2 mapped import */
    struct ext_mem *owner;
    struct region *next;
} region_t;

typedef struct ext_mem {
    int fd;
    char *map, *data;
    size_t file, size;
    int device;
    int mapped; /* live mapped buffers */
} ext_mem_t;

typedef struct event {
    ctx_t *ctx;
    uint64_t recorded, completed;
} event_t;

typedef struct op {
    int kind; /* 1 copy, 2 record, 3 wait */
    char *dst;
    const char *src;
    size_t n;
    event_t *ev;
    uint64_t gen;
    struct op *next;
} op_t;

typedef struct stream {
    ctx_t *ctx;
    pthread_t thread;
    op_t *head, *tail;
    int busy, stop;
    CUresult error;
} stream_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int initialised, ndev = 2;
static ctx_t ctxs[MAXDEV];
static region_t *regions;
static long live_streams, live_events, live_ext_mem, live_allocs, live_mapped, violations;
static long copies, stream_fault_at = -1;
static char last_violation[256];
static __thread ctx_t *stack[16];
static __thread int depth;

static void violation(const char *what)
{
    pthread_mutex_lock(&lock);
    violations++;
    snprintf(last_violation, sizeof last_violation, "%s", what);
    pthread_mutex_unlock(&lock);
}

static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;
static long fail_counts[64];
static const char *fail_names[64];
static char fail_spec[128];
static int fail_spec_set;

static int fail_now(const char *name)
{
    pthread_mutex_t *mp = &fail_lock;
    long *counts = fail_counts;
    const char **names = fail_names;
    const char *spec = fail_spec_set ? fail_spec : getenv("MOCK_CUDA_FAIL");
    if (!spec || !*spec) return 0;
    const char *colon = strchr(spec, ':');
    size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
    if (strlen(name) != len || strncmp(spec, name, len) != 0) return 0;
    long at = colon ? atol(colon + 1) : 1;
    pthread_mutex_lock(mp);
    int i = 0;
    while (i < 63 && names[i] && strcmp(names[i], name) != 0) i++;
    names[i] = name;
    long n = ++counts[i];
    pthread_mutex_unlock(mp);
    return n == at;
}

#define FAILPOINT(name) if (fail_now(name)) return E_INVALID_VALUE

static int trace(void)
{
    static int t = -1;
    if (t < 0) t = getenv("MOCK_CUDA_TRACE") != NULL;
    return t;
}

static ctx_t *current(void) { return depth ? stack[depth - 1] : NULL; }

/* which device's memory is [p, p+n)?  -1: none known */
static int device_of(CUdeviceptr p, size_t n)
{
    int dev = -1;
    pthread_mutex_lock(&lock);
    for (region_t *r = regions; r; r = r->next)
        if ((char *)(uintptr_t)p >= r->base && (char *)(uintptr_t)p + n <= r->base + r->size) {
            dev = r->device;
            break;
        }
    pthread_mutex_unlock(&lock);
    return dev;
}

CUresult cuInit(unsigned int flags)
{
    FAILPOINT("cuInit");
    if (flags != 0) return E_INVALID_VALUE;
    const char *n = getenv("MOCK_CUDA_DEVICES");
    if (n) ndev = atoi(n) < 0 ? 0 : (atoi(n) > MAXDEV ? MAXDEV : atoi(n));
    const char *f = getenv("MOCK_CUDA_STREAM_FAULT");
    if (f) stream_fault_at = atol(f);
    for (int i = 0; i < MAXDEV; i++) ctxs[i].device = i;
    initialised = 1;
    return OK;
}

CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }

CUresult cuGetErrorName(CUresult e, const char **s)
{
    switch (e) {
    case OK: *s = "CUDA_SUCCESS"; return OK;
    case E_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
    case E_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return OK;
    case E_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; return OK;
    case E_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; return OK;
    case E_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; return OK;
    case E_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; return OK;
    default: *s = NULL; return E_INVALID_VALUE;
    }
}

CUresult cuGetErrorString(CUresult e, const char **s)
{
    *s = e == E_INVALID_VALUE ? "invalid argument (mock)" : "mock error";
    return OK;
}

CUresult cuDeviceGetCount(int *n) { if (!initialised) return E_NOT_INITIALIZED; *n = ndev; return OK; }

CUresult cuDeviceGet(CUdevice *d, int i) { if (i < 0 || i >= ndev) return E_INVALID_DEVICE; *d = i; return OK; }

CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    snprintf(name, (size_t)len, "Mock CUDA GPU %d", d);
    return OK;
}

CUresult cuDeviceGetUuid_v2(char uuid[16], CUdevice d)
{
    if (d < 0 || d >= ndev) return E_INVALID_DEVICE;
    for (int i = 0; i < 16; i++) uuid[i] = (char)(0xc0 + d);
    return OK;
}

/* an H100/H200-like device: compute capability 9.0, 132 multiprocessors */
CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d)
{
    if (d < 0 || d >= ndev) return E_INVALID_DEVICE;
    switch (attribute) {
    case 75: *v = 9; return OK;   /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *v = 0; return OK;   /* COMPUTE_CAPABILITY_MINOR */
    case 16: *v = 132; return OK; /* MULTIPROCESSOR_COUNT */
    default: return E_INVALID_VALUE;
    }
}

CUresult cuDeviceCanAccessPeer(int *can, CUdevice a, CUdevice b)
{
    if (a < 0 || a >= ndev || b < 0 || b >= ndev) return E_INVALID_DEVICE;
    *can = a != b;
    return OK;
}

CUresult cuDevicePrimaryCtxRetain(ctx_t **c, CUdevice d)
{
    FAILPOINT("cuDevicePrimaryCtxRetain");
    if (d < 0 || d >= ndev) return E_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    ctxs[d].refs++;
    pthread_mutex_unlock(&lock);
    *c = &ctxs[d];
    return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    if (d < 0 || d >= ndev) return E_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    int bad = ctxs[d].refs <= 0;
    if (!bad) ctxs[d].refs--;
    pthread_mutex_unlock(&lock);
    if (bad) violation("cuDevicePrimaryCtxRelease without a retain");
    return bad ? E_INVALID_CONTEXT : OK;
}

CUresult cuCtxPushCurrent_v2(ctx_t *c)
{
    if (!c || c->refs <= 0) { violation("cuCtxPushCurrent of a context not retained"); return E_INVALID_CONTEXT; }
    if (depth == 16) { violation("context stack overflow (pushes without pops)"); return E_INVALID_VALUE; }
    stack[depth++] = c;
    return OK;
}

CUresult cuCtxPopCurrent_v2(ctx_t **c)
{
    if (!depth) { violation("cuCtxPopCurrent on an empty stack"); return E_INVALID_CONTEXT; }
    *c = stack[--depth];
    return OK;
}

CUresult cuCtxEnablePeerAccess(ctx_t *peer, unsigned int flags)
{
    ctx_t *c = current();
    if (!c) return E_INVALID_CONTEXT;
    if (flags || !peer || peer == c) return E_INVALID_VALUE;
    if (c->peer[peer->device]) return E_PEER_ENABLED;
    c->peer[peer->device] = 1;
    return OK;
}

typedef struct {
    int type;
    union { int fd; struct { void *handle; const void *name; } win32; const void *obj; } handle;
    unsigned long long size;
    unsigned int flags;
    unsigned int reserved[16];
} mem_desc_t;

typedef struct {
    unsigned long long offset, size;
    unsigned int flags;
    unsigned int reserved[16];
} buf_desc_t;

static int all_zero(const unsigned int *r, int n)
{
    for (int i = 0; i < n; i++) if (r[i]) return 0;
    return 1;
}

CUresult cuImportExternalMemory(ext_mem_t **out, const mem_desc_t *d)
{
    FAILPOINT("cuImportExternalMemory");
    ctx_t *c = current();
    if (!c) return E_INVALID_CONTEXT;
    if (d->type != 1 || d->flags != 1 || !d->size || !all_zero(d->reserved, 16)) {
        violation("cuImportExternalMemory: unexpected descriptor (type, dedicated flag, size, reserved)");
        return E_INVALID_VALUE;
    }
    struct stat st;
    if (fstat(d->handle.fd, &st) != 0) return E_INVALID_HANDLE;
    /* lavapipe's exported memfd starts with Mesa's os_memory_fd header: the
     * data lies at header.offset (memory without such a header starts at 0) */
    struct { size_t size, offset; unsigned char uuid[16]; } header;
    size_t offset = 0, file = (size_t)st.st_size;
    if (pread(d->handle.fd, &header, sizeof header, 0) == (ssize_t)sizeof header && header.offset >= sizeof header &&
        header.offset < file && header.size <= file)
        offset = header.offset;
    if (file < offset + d->size) return E_INVALID_HANDLE;
    char *map = mmap(NULL, file, PROT_READ | PROT_WRITE, MAP_SHARED, d->handle.fd, 0);
    if (map == MAP_FAILED) return E_INVALID_HANDLE;
    if (trace()) fprintf(stderr, "mock: import fd %d file %zu offset %zu size %llu header size %zu\n", d->handle.fd, file, offset, d->size, header.size);
    ext_mem_t *m = calloc(1, sizeof *m);
    m->fd = d->handle.fd; /* the driver owns the fd now */
    m->map = map;
    m->file = file;
    m->data = map + offset;
    m->size = d->size;
    m->device = c->device;
    pthread_mutex_lock(&lock);
    live_ext_mem++;
    pthread_mutex_unlock(&lock);
    *out = m;
    return OK;
}

CUresult cuExternalMemoryGetMappedBuffer(CUdeviceptr *p, ext_mem_t *m, const buf_desc_t *d)
{
    FAILPOINT("cuExternalMemoryGetMappedBuffer");
    if (!current() || current()->device != m->device) { violation("mapped buffer outside the importing context"); return E_INVALID_CONTEXT; }
    if (d->flags || !d->size || d->offset + d->size > m->size || !all_zero(d->reserved, 16)) return E_INVALID_VALUE;
    region_t *r = calloc(1, sizeof *r);
    r->base = m->data + d->offset;
    r->size = d->size;
    r->device = m->device;
    r->kind = 2;
    r->owner = m;
    pthread_mutex_lock(&lock);
    r->next = regions;
    regions = r;
    m->mapped++;
    live_mapped++;
    pthread_mutex_unlock(&lock);
    *p = (CUdeviceptr)(uintptr_t)r->base;
    return OK;
}

CUresult cuDestroyExternalMemory(ext_mem_t *m)
{
    if (!m) return E_INVALID_HANDLE;
    if (m->mapped) violation("cuDestroyExternalMemory while buffers are still mapped (cuMemFree them first)");
    munmap(m->map, m->file);
    close(m->fd);
    free(m);
    pthread_mutex_lock(&lock);
    live_ext_mem--;
    pthread_mutex_unlock(&lock);
    return OK;
}

CUresult cuImportExternalSemaphore(void **out, const void *desc) { return E_NOT_SUPPORTED; }
CUresult cuSignalExternalSemaphoresAsync(const void *s, const void *p, unsigned int n, void *st) { return E_NOT_SUPPORTED; }
CUresult cuWaitExternalSemaphoresAsync(const void *s, const void *p, unsigned int n, void *st) { return E_NOT_SUPPORTED; }
CUresult cuDestroyExternalSemaphore(void *s) { return E_INVALID_HANDLE; }

/* Virtual memory management: no exportable device memory here, so the link
 * must fall back to its bounce ring (and say so). */
CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int option) { *g = 2 << 20; return OK; }
CUresult cuMemCreate(unsigned long long *h, size_t n, const void *prop, unsigned long long flags)
{
    return E_NOT_SUPPORTED;
}
CUresult cuMemRelease(unsigned long long h) { violation("cuMemRelease without cuMemCreate"); return E_INVALID_VALUE; }
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t a, CUdeviceptr addr, unsigned long long f)
{
    violation("cuMemAddressReserve without cuMemCreate");
    return E_INVALID_VALUE;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t n) { violation("cuMemAddressFree without reserve"); return E_INVALID_VALUE; }
CUresult cuMemMap(CUdeviceptr p, size_t n, size_t o, unsigned long long h, unsigned long long f) { return E_INVALID_VALUE; }
CUresult cuMemUnmap(CUdeviceptr p, size_t n) { violation("cuMemUnmap without cuMemMap"); return E_INVALID_VALUE; }
CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const void *d, size_t count) { return E_INVALID_VALUE; }
CUresult cuMemExportToShareableHandle(void *out, unsigned long long h, int type, unsigned long long f)
{
    return E_INVALID_VALUE;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    FAILPOINT("cuMemAlloc");
    ctx_t *c = current();
    if (!c) return E_INVALID_CONTEXT;
    region_t *r = calloc(1, sizeof *r);
    r->base = malloc(n ? n : 1);
    r->size = n;
    r->device = c->device;
    r->kind = 1;
    pthread_mutex_lock(&lock);
    r->next = regions;
    regions = r;
    live_allocs++;
    pthread_mutex_unlock(&lock);
    *p = (CUdeviceptr)(uintptr_t)r->base;
    return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    region_t **pp = &regions;
    while (*pp && (*pp)->base != (char *)(uintptr_t)p) pp = &(*pp)->next;
    region_t *r = *pp;
    if (r) {
        *pp = r->next;
        if (r->kind == 1) { free(r->base); live_allocs--; }
        else { r->owner->mapped--; live_mapped--; }
    }
    pthread_mutex_unlock(&lock);
    if (!r) { violation("cuMemFree of an unknown pointer"); return E_INVALID_VALUE; }
    free(r);
    return OK;
}

static void *stream_main(void *arg)
{
    stream_t *s = arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&changed, &lock);
        if (!s->head) break;
        op_t *o = s->head;
        if (o->kind == 3 && o->ev->completed < o->gen && !s->error) { /* event wait: block the stream */
            pthread_cond_wait(&changed, &lock);
            continue;
        }
        s->busy = 1;
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        if (s->error) {
            /* a failed stream runs nothing more */
        } else if (o->kind == 1) {
            long k = ++copies;
            if (k == stream_fault_at) {
                s->error = s->ctx->sticky = E_ILLEGAL_ADDRESS;
            } else {
                pthread_mutex_unlock(&lock);
                if (trace()) fprintf(stderr, "mock: copy %zu B %p -> %p first byte %d\n", o->n, (void *)o->src, (void *)o->dst, o->n ? (unsigned char)o->src[0] : -1);
                memcpy(o->dst, o->src, o->n);
                pthread_mutex_lock(&lock);
            }
        } else if (o->kind == 2) {
            if (o->gen > o->ev->completed) o->ev->completed = o->gen;
        }
        s->busy = 0;
        free(o);
        pthread_cond_broadcast(&changed);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void enqueue(stream_t *s, op_t *o)
{
    pthread_mutex_lock(&lock);
    if (s->tail) s->tail->next = o; else s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

CUresult cuStreamCreate(stream_t **out, unsigned int flags)
{
    FAILPOINT("cuStreamCreate");
    ctx_t *c = current();
    if (!c) return E_INVALID_CONTEXT;
    if (flags != 1) violation("stream not created non-blocking");
    stream_t *s = calloc(1, sizeof *s);
    s->ctx = c;
    pthread_create(&s->thread, NULL, stream_main, s);
    pthread_mutex_lock(&lock);
    live_streams++;
    pthread_mutex_unlock(&lock);
    *out = s;
    return OK;
}

CUresult cuStreamDestroy_v2(stream_t *s)
{
    pthread_mutex_lock(&lock);
    int pending = s->head != NULL || s->busy;
    s->stop = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    if (pending && !s->error) violation("cuStreamDestroy with work pending");
    pthread_mutex_lock(&lock);
    while (s->head && !s->error) pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
    pthread_join(s->thread, NULL);
    for (op_t *o = s->head; o;) { op_t *n = o->next; free(o); o = n; }
    free(s);
    pthread_mutex_lock(&lock);
    live_streams--;
    pthread_mutex_unlock(&lock);
    return OK;
}

CUresult cuStreamQuery(stream_t *s)
{
    pthread_mutex_lock(&lock);
    CUresult r = s->error ? s->error : (s->head || s->busy ? E_NOT_READY : OK);
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuStreamWaitEvent(stream_t *s, event_t *e, unsigned int flags)
{
    FAILPOINT("cuStreamWaitEvent");
    if (!s || !e || flags) return E_INVALID_VALUE;
    if (s->error) return s->error;
    pthread_mutex_lock(&lock);
    uint64_t gen = e->recorded;
    pthread_mutex_unlock(&lock);
    if (!gen) return OK;
    op_t *o = calloc(1, sizeof *o);
    o->kind = 3;
    o->ev = e;
    o->gen = gen;
    enqueue(s, o);
    return OK;
}

CUresult cuEventCreate(event_t **out, unsigned int flags)
{
    ctx_t *c = current();
    if (!c) return E_INVALID_CONTEXT;
    if (flags != 2) violation("event not created with CU_EVENT_DISABLE_TIMING");
    event_t *e = calloc(1, sizeof *e);
    e->ctx = c;
    pthread_mutex_lock(&lock);
    live_events++;
    pthread_mutex_unlock(&lock);
    *out = e;
    return OK;
}

CUresult cuEventRecord(event_t *e, stream_t *s)
{
    FAILPOINT("cuEventRecord");
    if (!e || !s) return E_INVALID_HANDLE;
    if (e->ctx != s->ctx) { violation("cuEventRecord: event and stream of different contexts"); return E_INVALID_HANDLE; }
    if (s->error) return s->error;
    op_t *o = calloc(1, sizeof *o);
    o->kind = 2;
    o->ev = e;
    pthread_mutex_lock(&lock);
    o->gen = ++e->recorded;
    pthread_mutex_unlock(&lock);
    enqueue(s, o);
    return OK;
}

CUresult cuEventQuery(event_t *e)
{
    pthread_mutex_lock(&lock);
    CUresult r = e->ctx->sticky ? e->ctx->sticky : (e->completed >= e->recorded ? OK : E_NOT_READY);
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuEventDestroy_v2(event_t *e)
{
    free(e);
    pthread_mutex_lock(&lock);
    live_events--;
    pthread_mutex_unlock(&lock);
    return OK;
}

static CUresult copy(stream_t *s, CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    if (s->error) return s->error;
    op_t *o = calloc(1, sizeof *o);
    o->kind = 1;
    o->dst = (char *)(uintptr_t)dst;
    o->src = (const char *)(uintptr_t)src;
    o->n = n;
    enqueue(s, o);
    return OK;
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, ctx_t *dctx, CUdeviceptr src, ctx_t *sctx, size_t n, stream_t *s)
{
    FAILPOINT("cuMemcpyPeerAsync");
    int dd = device_of(dst, n), sd = device_of(src, n);
    if (dd < 0 || sd < 0 || dd != dctx->device || sd != sctx->device) {
        violation("cuMemcpyPeerAsync: a pointer is not memory of the context given for it");
        return E_INVALID_VALUE;
    }
    if (s->ctx != sctx && s->ctx != dctx) violation("cuMemcpyPeerAsync on a stream of neither context");
    return copy(s, dst, src, n);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, stream_t *s)
{
    FAILPOINT("cuMemcpyDtoDAsync");
    int dd = device_of(dst, n), sd = device_of(src, n);
    if (dd < 0 || sd < 0 || dd != s->ctx->device || sd != s->ctx->device) {
        violation("cuMemcpyDtoDAsync: not a local copy on the stream's device");
        return E_INVALID_VALUE;
    }
    return copy(s, dst, src, n);
}

/* for tests (ctypes): replace MOCK_CUDA_FAIL / MOCK_CUDA_STREAM_FAULT and restart their counts */
void mock_cuda_configure(const char *fail, long stream_fault)
{
    pthread_mutex_lock(&fail_lock);
    snprintf(fail_spec, sizeof fail_spec, "%s", fail ? fail : "");
    fail_spec_set = 1;
    memset(fail_counts, 0, sizeof fail_counts);
    memset(fail_names, 0, sizeof fail_names);
    pthread_mutex_unlock(&fail_lock);
    pthread_mutex_lock(&lock);
    stream_fault_at = stream_fault;
    copies = 0;
    pthread_mutex_unlock(&lock);
}

/* for tests (ctypes): live objects and the last misuse seen */
const char *mock_cuda_report(void)
{
    static char out[512];
    int refs = 0;
    for (int i = 0; i < MAXDEV; i++) refs += ctxs[i].refs;
    pthread_mutex_lock(&lock);
    snprintf(out, sizeof out,
             "streams=%ld events=%ld ext_mem=%ld allocs=%ld mapped=%ld ctx_refs=%d violations=%ld%s%s",
             live_streams, live_events, live_ext_mem, live_allocs, live_mapped, refs, violations,
             violations ? " last=" : "", violations ? last_violation : "");
    pthread_mutex_unlock(&lock);
    return out;
}
