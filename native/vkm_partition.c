/* vkm_partition.c - longest-processing-time greedy partitioner (rules in vkm_partition.h).
 *
 * Every time is computed as `load[d] + cost / w[d]`, then `+ x` with the
 * transfer term x = transfer * link computed first, as separate statements:
 * divisions, one product and additions, never an expression a compiler may
 * contract into a multiply-add, so the pure-Python reference reproduces the
 * result bit for bit.
 *
 * Devices 1..D-1 are grouped into classes of equal (weight, link). Inside a
 * class a device's finish time is one non-decreasing function of its load, so
 * the class's best device is the one of least (load, index): the top of a
 * binary heap. Each SRU looks at one heap top per class and at device 0.
 */
#include "vkm_partition.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct item {
    uint64_t key;
    uint32_t idx;
} item;

#define DIGIT_BITS 11
#define DIGITS ((64 + DIGIT_BITS - 1) / DIGIT_BITS)
#define BUCKETS (1u << DIGIT_BITS)

/* Stable LSD radix sort by key ascending, 11-bit digits counted in one pass; a digit
 * equal in every item is skipped. Returns whichever of `a`/`tmp` holds the result. */
static item *radix_sort(item *a, item *tmp, size_t n)
{
    uint32_t (*count)[BUCKETS] = calloc(DIGITS, sizeof *count);
    if (!count)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = a[i].key;
        for (int d = 0; d < DIGITS; d++)
            count[d][(k >> (d * DIGIT_BITS)) & (BUCKETS - 1)]++;
    }
    for (int d = 0; d < DIGITS; d++) {
        const int shift = d * DIGIT_BITS;
        if (count[d][(a[0].key >> shift) & (BUCKETS - 1)] == n)
            continue;
        uint32_t sum = 0;
        for (uint32_t b = 0; b < BUCKETS; b++) {
            uint32_t c = count[d][b];
            count[d][b] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++)
            tmp[count[d][(a[i].key >> shift) & (BUCKETS - 1)]++] = a[i];
        item *t = a;
        a = tmp;
        tmp = t;
    }
    free(count);
    return a;
}

/* Sort keys: ascending cost_bits is descending cost (finite, >= 0, whose IEEE bits
 * order like the values); ascending tie_bits is ascending signed tie key. */
static inline uint64_t cost_bits(double cost)
{
    double c = cost + 0.0; /* -0.0 -> 0.0 */
    uint64_t bits;
    memcpy(&bits, &c, sizeof bits);
    return ~bits;
}

static inline uint64_t tie_bits(int64_t key)
{
    return (uint64_t)key ^ ((uint64_t)1 << 63);
}

/* SRU indices, heaviest cost first, equal costs by ascending tie key: a stable sort by
 * cost of the SRUs already in tie-key order (input order when the keys ascend). */
static int sort_order(const vkm_partition_input *in, uint32_t *order, size_t *bad_index)
{
    const size_t n = in->count;
    item *a = malloc(2 * n * sizeof(item));
    if (!a)
        return VKM_PARTITION_ENOMEM;
    item *b = a + n;
    int ascending = 1;
    if (in->tie_key)
        for (size_t i = 1; i < n && ascending; i++)
            ascending = in->tie_key[i - 1] < in->tie_key[i];
    if (!ascending) {
        for (size_t i = 0; i < n; i++)
            a[i] = (item){tie_bits(in->tie_key[i]), (uint32_t)i};
        const item *by_key = radix_sort(a, b, n);
        if (!by_key) {
            free(a);
            return VKM_PARTITION_ENOMEM;
        }
        for (size_t k = 1; k < n; k++)
            if (by_key[k].key == by_key[k - 1].key) {
                if (bad_index)
                    *bad_index = by_key[k].idx; /* stable: the later of the two input positions */
                free(a);
                return VKM_PARTITION_EDUPKEY;
            }
        uint32_t *tie_order = order; /* borrowed until the cost sort writes it */
        for (size_t k = 0; k < n; k++)
            tie_order[k] = by_key[k].idx;
        for (size_t k = 0; k < n; k++)
            a[k] = (item){cost_bits(in->cost[tie_order[k]]), tie_order[k]};
    } else {
        for (size_t i = 0; i < n; i++)
            a[i] = (item){cost_bits(in->cost[i]), (uint32_t)i};
    }
    const item *sorted = radix_sort(a, b, n);
    if (!sorted) {
        free(a);
        return VKM_PARTITION_ENOMEM;
    }
    for (size_t k = 0; k < n; k++)
        order[k] = sorted[k].idx;
    free(a);
    return VKM_PARTITION_OK;
}

/* The problem after validation: devices possibly renumbered into a compact range. */
typedef struct problem {
    const vkm_partition_input *in;
    size_t n;
    int32_t dc;              /* devices in the compact numbering */
    const int32_t *pin;      /* compact numbering, or NULL */
    const int32_t *previous; /* compact numbering, or NULL */
    double w0;               /* weight of device 0 */
    int groups;              /* classes of devices 1..dc-1 */
    int32_t *group_start;    /* [groups + 1] offsets into group_dev */
    int32_t *group_dev;      /* [dc - 1] devices by class, ascending inside a class */
    double *group_w;         /* [groups] the class's weight (1 without weights) */
    double *group_link;      /* [groups] the class's link factor (1 without link) */
    const uint32_t *order;
} problem;

static inline int pinned(const problem *p, size_t i)
{
    return p->pin && p->pin[i] >= 0;
}

static inline int kept(const problem *p, size_t i)
{
    return !pinned(p, i) && p->previous && p->previous[i] >= 0;
}

/* Finish time of SRU i on a secondary of class g whose load is `load`. */
static inline double secondary_time(const problem *p, int g, double load, size_t i)
{
    const vkm_partition_input *in = p->in;
    double f = load + (in->weights ? in->cost[i] / p->group_w[g] : in->cost[i]);
    if (in->transfer || in->link) {
        double x = in->transfer ? in->transfer[i] : 1.0;
        if (in->link)
            x = x * p->group_link[g];
        f = f + x;
    }
    return f;
}

static inline double primary_time(const problem *p, double load, size_t i)
{
    return load + (p->in->weights ? p->in->cost[i] / p->w0 : p->in->cost[i]);
}

static inline double place(const problem *p, const int *dev_group, double *load, size_t i, int32_t d)
{
    return d == 0 ? primary_time(p, load[0], i)
                  : secondary_time(p, dev_group[d], load[d], i);
}

/* Classes of at most this many devices are scanned for their least-loaded device, larger
 * ones keep a heap. */
#define SMALL_GROUP 16

static inline int heap_less(const double *load, int32_t a, int32_t b)
{
    return load[a] < load[b] || (load[a] == load[b] && a < b);
}

static void sift_down(int32_t *h, int32_t size, int32_t k, const double *load)
{
    const int32_t top = h[k];
    for (;;) {
        int32_t c = 2 * k + 1;
        if (c >= size)
            break;
        if (c + 1 < size && heap_less(load, h[c + 1], h[c]))
            c++;
        if (!heap_less(load, h[c], top))
            break;
        h[k] = h[c];
        k = c;
    }
    h[k] = top;
}

/* One plan into out/load (load zeroed by the caller); heap has dc - 1 entries. */
static double plan(const problem *p, const int *dev_group, int keep_previous, int32_t *out, double *load,
                   int32_t *heap)
{
    const size_t n = p->n;
    const uint32_t *order = p->order;
    if (p->pin) {
        for (size_t k = 0; k < n; k++) {
            size_t i = order[k];
            if (pinned(p, i)) {
                int32_t d = out[i] = p->pin[i];
                load[d] = place(p, dev_group, load, i, d);
            }
        }
    }
    if (keep_previous) {
        for (size_t k = 0; k < n; k++) {
            size_t i = order[k];
            if (kept(p, i)) {
                int32_t d = out[i] = p->previous[i];
                load[d] = place(p, dev_group, load, i, d);
            }
        }
    }
    const int groups = p->groups;
    memcpy(heap, p->group_dev, (size_t)(p->dc - 1) * sizeof(int32_t));
    for (int g = 0; g < groups; g++) {
        int32_t *h = heap + p->group_start[g];
        int32_t size = p->group_start[g + 1] - p->group_start[g];
        for (int32_t k = size > SMALL_GROUP ? size / 2 : 0; k-- > 0;)
            sift_down(h, size, k, load);
    }
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        if (pinned(p, i) || (keep_previous && kept(p, i)))
            continue;
        int best_g = -1;
        int32_t best = 0;
        double best_f = 0.0;
        for (int g = 0; g < groups; g++) {
            const int32_t *h = heap + p->group_start[g];
            const int32_t size = p->group_start[g + 1] - p->group_start[g];
            int32_t d = h[0];
            if (size <= SMALL_GROUP) { /* a scan beats keeping a heap; h ascends, so `<` keeps the lower index */
                double least = load[d];
                for (int32_t j = 1; j < size; j++) {
                    double l = load[h[j]];
                    d = l < least ? h[j] : d;
                    least = l < least ? l : least;
                }
            }
            double f = secondary_time(p, g, load[d], i);
            if (best_g < 0 || f < best_f || (f == best_f && heap_less(load, d, best))) {
                best_g = g;
                best = d;
                best_f = f;
            }
        }
        double f0 = primary_time(p, load[0], i);
        if (best_g < 0 || f0 <= best_f) {
            out[i] = 0;
            load[0] = f0;
        } else {
            out[i] = best;
            load[best] = best_f;
            const int32_t size = p->group_start[best_g + 1] - p->group_start[best_g];
            if (size > SMALL_GROUP)
                sift_down(heap + p->group_start[best_g], size, 0, load);
        }
    }
    double span = 0.0;
    for (int32_t d = 0; d < p->dc; d++)
        if (load[d] > span)
            span = load[d];
    return span;
}

static int check(const vkm_partition_input *in, size_t *bad_index)
{
    const size_t n = in->count;
    const int64_t dc = in->device_count;
    if (dc < 1 || n > VKM_PARTITION_MAX_COUNT || !(in->hysteresis >= 0.0 && in->hysteresis < 1.0))
        return VKM_PARTITION_EINVAL;
    if ((in->weights || in->link) && dc > INT32_MAX)
        return VKM_PARTITION_EINVAL;
    if (n && !in->cost)
        return VKM_PARTITION_EINVAL;
    for (size_t i = 0; i < n; i++) {
        int rc = VKM_PARTITION_OK;
        if (!isfinite(in->cost[i]) || in->cost[i] < 0.0)
            rc = VKM_PARTITION_ECOST;
        else if (in->transfer && (!isfinite(in->transfer[i]) || in->transfer[i] < 0.0))
            rc = VKM_PARTITION_ETRANSFER;
        else if (in->pin && (in->pin[i] < -1 || in->pin[i] >= dc))
            rc = VKM_PARTITION_EPIN;
        else if (in->previous && (in->previous[i] < -1 || in->previous[i] >= dc))
            rc = VKM_PARTITION_EPREVIOUS;
        if (rc != VKM_PARTITION_OK) {
            if (bad_index)
                *bad_index = i;
            return rc;
        }
    }
    for (int64_t d = 0; in->weights && d < dc; d++)
        if (!isfinite(in->weights[d]) || in->weights[d] <= 0.0) {
            if (bad_index)
                *bad_index = (size_t)d;
            return VKM_PARTITION_EWEIGHT;
        }
    for (int64_t d = 1; in->link && d < dc; d++)
        if (!isfinite(in->link[d]) || in->link[d] < 0.0) {
            if (bad_index)
                *bad_index = (size_t)d;
            return VKM_PARTITION_ELINK;
        }
    return VKM_PARTITION_OK;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

typedef struct class_key {
    uint64_t w, l;
    int32_t d;
} class_key;

static int cmp_class(const void *a, const void *b)
{
    const class_key *x = a, *y = b;
    if (x->w != y->w)
        return x->w < y->w ? -1 : 1;
    if (x->l != y->l)
        return x->l < y->l ? -1 : 1;
    return (x->d > y->d) - (x->d < y->d);
}

/* Devices 1..dc-1 into classes of bitwise-equal (weight, link); one class without either. */
static int make_groups(problem *p)
{
    const vkm_partition_input *in = p->in;
    const int32_t m = p->dc - 1;
    p->group_dev = malloc(((size_t)m + 1) * sizeof(int32_t));
    if (!p->group_dev)
        return VKM_PARTITION_ENOMEM;
    if (!in->weights && !in->link) {
        p->groups = m > 0;
        p->group_start = malloc(2 * sizeof(int32_t));
        p->group_w = malloc(sizeof(double));
        p->group_link = malloc(sizeof(double));
        if (!p->group_start || !p->group_w || !p->group_link)
            return VKM_PARTITION_ENOMEM;
        for (int32_t k = 0; k < m; k++)
            p->group_dev[k] = k + 1;
        p->group_start[0] = 0;
        p->group_start[1] = m;
        p->group_w[0] = p->group_link[0] = 1.0;
        return VKM_PARTITION_OK;
    }
    class_key *keys = malloc(((size_t)m + 1) * sizeof(class_key));
    p->group_start = malloc(((size_t)m + 2) * sizeof(int32_t));
    p->group_w = malloc(((size_t)m + 1) * sizeof(double));
    p->group_link = malloc(((size_t)m + 1) * sizeof(double));
    if (!keys || !p->group_start || !p->group_w || !p->group_link) {
        free(keys);
        return VKM_PARTITION_ENOMEM;
    }
    for (int32_t k = 0; k < m; k++) {
        double w = in->weights ? in->weights[k + 1] : 1.0, l = in->link ? in->link[k + 1] : 1.0;
        w += 0.0; /* -0.0 never occurs for weights (> 0); links: -0.0 and 0.0 are one class */
        l += 0.0;
        memcpy(&keys[k].w, &w, sizeof w);
        memcpy(&keys[k].l, &l, sizeof l);
        keys[k].d = k + 1;
    }
    qsort(keys, (size_t)m, sizeof *keys, cmp_class);
    int g = -1;
    for (int32_t k = 0; k < m; k++) {
        if (k == 0 || keys[k].w != keys[k - 1].w || keys[k].l != keys[k - 1].l) {
            g++;
            p->group_start[g] = k;
            memcpy(&p->group_w[g], &keys[k].w, sizeof(double));
            memcpy(&p->group_link[g], &keys[k].l, sizeof(double));
        }
        p->group_dev[k] = keys[k].d;
    }
    p->groups = g + 1;
    p->group_start[p->groups] = m;
    free(keys);
    return VKM_PARTITION_OK;
}

/* Without weights and link every device but 0 is alike, and only the lowest-numbered
 * unused ones are ever chosen: devices >= count + (devices named by pin/previous) + 1
 * that nobody names are dropped, named ones past that are renumbered (order kept). */
typedef struct compact {
    int32_t *pin, *previous; /* renumbered copies, or NULL */
    int32_t *extra;          /* [extras] real index of compact device limit + k */
    int32_t limit, extras;
} compact;

static int compact_devices(const vkm_partition_input *in, problem *p, compact *c)
{
    const size_t n = in->count;
    memset(c, 0, sizeof *c);
    p->pin = in->pin;
    p->previous = in->previous;
    if (in->weights || in->link || in->device_count <= 2 * (int64_t)n + 1) {
        p->dc = (int32_t)in->device_count;
        return VKM_PARTITION_OK;
    }
    int32_t *named = malloc((2 * n + 1) * sizeof(int32_t));
    if (!named)
        return VKM_PARTITION_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (in->pin && in->pin[i] > 0)
            named[k++] = in->pin[i];
        if (in->previous && in->previous[i] > 0)
            named[k++] = in->previous[i];
    }
    qsort(named, k, sizeof(int32_t), cmp_i32);
    size_t distinct = 0;
    for (size_t j = 0; j < k; j++)
        if (!distinct || named[j] != named[distinct - 1])
            named[distinct++] = named[j];
    c->limit = (int32_t)(n + distinct + 1); /* < device_count here */
    size_t first_extra = 0;
    while (first_extra < distinct && named[first_extra] < c->limit)
        first_extra++;
    c->extras = (int32_t)(distinct - first_extra);
    p->dc = c->limit + c->extras;
    if (!c->extras) {
        free(named);
        return VKM_PARTITION_OK;
    }
    c->extra = malloc((size_t)c->extras * sizeof(int32_t));
    c->pin = in->pin ? malloc(n * sizeof(int32_t)) : NULL;
    c->previous = in->previous ? malloc(n * sizeof(int32_t)) : NULL;
    if (!c->extra || (in->pin && !c->pin) || (in->previous && !c->previous)) {
        free(named);
        return VKM_PARTITION_ENOMEM;
    }
    memcpy(c->extra, named + first_extra, (size_t)c->extras * sizeof(int32_t));
    free(named);
    for (int pass = 0; pass < 2; pass++) {
        const int32_t *src = pass ? in->previous : in->pin;
        int32_t *dst = pass ? c->previous : c->pin;
        if (!src)
            continue;
        for (size_t i = 0; i < n; i++) {
            int32_t d = src[i];
            if (d >= c->limit) {
                const int32_t *hit = bsearch(&d, c->extra, (size_t)c->extras, sizeof(int32_t), cmp_i32);
                d = c->limit + (int32_t)(hit - c->extra);
            }
            dst[i] = d;
        }
    }
    p->pin = c->pin;
    p->previous = c->previous;
    return VKM_PARTITION_OK;
}

int vkm_partition(const vkm_partition_input *in, int32_t *device_out, size_t *bad_index)
{
    if (!in)
        return VKM_PARTITION_EINVAL;
    int rc = check(in, bad_index);
    if (rc != VKM_PARTITION_OK)
        return rc;
    const size_t n = in->count;
    if (n && !device_out)
        return VKM_PARTITION_EINVAL;
    if (n == 0)
        return VKM_PARTITION_OK;

    problem p = {.in = in, .n = n};
    p.w0 = in->weights ? in->weights[0] : 1.0;
    compact c;
    uint32_t *order = malloc(n * sizeof(uint32_t));
    int32_t *sticky_out = NULL, *heap = NULL;
    double *loads = NULL;
    int *dev_group = NULL;
    if (!order) {
        rc = VKM_PARTITION_ENOMEM;
        goto done_early;
    }
    rc = sort_order(in, order, bad_index);
    if (rc != VKM_PARTITION_OK)
        goto done_early;
    p.order = order;
    if (in->device_count == 1) {
        for (size_t i = 0; i < n; i++)
            device_out[i] = 0;
        goto done_early;
    }
    rc = compact_devices(in, &p, &c);
    if (rc == VKM_PARTITION_OK)
        rc = make_groups(&p);
    if (rc != VKM_PARTITION_OK)
        goto done;

    int sticky = 0;
    for (size_t i = 0; p.previous && i < n && !sticky; i++)
        sticky = kept(&p, i);

    loads = calloc(2 * (size_t)p.dc, sizeof(double)); /* greedy, sticky */
    heap = malloc((size_t)p.dc * sizeof(int32_t));
    dev_group = malloc((size_t)p.dc * sizeof(int));
    sticky_out = sticky ? malloc(n * sizeof(int32_t)) : NULL;
    if (!loads || !heap || !dev_group || (sticky && !sticky_out)) {
        rc = VKM_PARTITION_ENOMEM;
        goto done;
    }
    dev_group[0] = -1;
    for (int g = 0; g < p.groups; g++)
        for (int32_t k = p.group_start[g]; k < p.group_start[g + 1]; k++)
            dev_group[p.group_dev[k]] = g;

    double greedy_span = plan(&p, dev_group, 0, device_out, loads, heap);
    if (sticky) {
        double sticky_span = plan(&p, dev_group, 1, sticky_out, loads + p.dc, heap);
        if (!(greedy_span < sticky_span * (1.0 - in->hysteresis)))
            memcpy(device_out, sticky_out, n * sizeof(int32_t));
    }
    if (c.extras)
        for (size_t i = 0; i < n; i++)
            if (device_out[i] >= c.limit)
                device_out[i] = c.extra[device_out[i] - c.limit];

done:
    free(c.pin);
    free(c.previous);
    free(c.extra);
    free(p.group_dev);
    free(p.group_start);
    free(p.group_w);
    free(p.group_link);
done_early:
    free(order);
    free(loads);
    free(heap);
    free(dev_group);
    free(sticky_out);
    return rc;
}
