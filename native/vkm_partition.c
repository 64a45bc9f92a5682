/* vkm_partition.c - longest-processing-time greedy partitioner (rules in vkm_partition.h).
 *
 * Every time is computed as `load[d] + cost / weight[d]`, then `+ transfer` when
 * d != 0, in that order: a division and additions only, so no multiply-add can
 * be contracted and the pure-Python reference reproduces the result bit for bit.
 */
#include "vkm_partition.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct item {
    uint64_t key;
    uint32_t idx;
} item;

/* Stable LSD radix sort by key ascending, 8-bit digits; digits equal in every item are skipped.
 * Returns whichever of `a`/`tmp` holds the result. */
static item *radix_sort(item *a, item *tmp, size_t n)
{
    uint64_t any = 0, all = ~(uint64_t)0;
    for (size_t i = 0; i < n; i++) {
        any |= a[i].key;
        all &= a[i].key;
    }
    const uint64_t varying = any ^ all;
    for (int shift = 0; shift < 64; shift += 8) {
        if (!((varying >> shift) & 0xFF))
            continue;
        size_t start[256] = {0};
        for (size_t i = 0; i < n; i++)
            start[(a[i].key >> shift) & 0xFF]++;
        size_t sum = 0;
        for (int b = 0; b < 256; b++) {
            size_t c = start[b];
            start[b] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++)
            tmp[start[(a[i].key >> shift) & 0xFF]++] = a[i];
        item *t = a;
        a = tmp;
        tmp = t;
    }
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
 * cost of the SRUs already sorted by tie key. */
static void sort_order(const vkm_partition_input *in, item *buf, uint32_t *order)
{
    const size_t n = in->count;
    item *a = buf, *b = buf + n;
    for (size_t i = 0; i < n; i++)
        a[i] = (item){tie_bits(in->tie_key[i]), (uint32_t)i};
    item *by_key = radix_sort(a, b, n);
    item *other = by_key == a ? b : a;
    for (size_t k = 0; k < n; k++) {
        uint32_t i = by_key[k].idx;
        other[k] = (item){cost_bits(in->cost[i]), i};
    }
    const item *sorted = radix_sort(other, by_key, n);
    for (size_t k = 0; k < n; k++)
        order[k] = sorted[k].idx;
}

static inline int has_previous(const vkm_partition_input *in, size_t i)
{
    return !(in->pinned && in->pinned[i]) && in->previous[i] >= 0 && in->previous[i] < in->device_count;
}

static inline double time_on(const vkm_partition_input *in, const double *w, const double *load,
                             size_t i, int d)
{
    double f = load[d] + in->cost[i] / w[d];
    if (d != 0 && in->transfer)
        f += in->transfer[i];
    return f;
}

/* One plan into out/load (load zeroed by the caller). keep_previous selects the sticky plan. */
static double plan(const vkm_partition_input *in, const double *w, const uint32_t *order,
                   int keep_previous, int32_t *out, double *load)
{
    const size_t n = in->count;
    const int dc = in->device_count;
    if (in->pinned) {
        for (size_t k = 0; k < n; k++) {
            size_t i = order[k];
            if (in->pinned[i]) {
                out[i] = 0;
                load[0] = time_on(in, w, load, i, 0);
            }
        }
    }
    if (keep_previous) {
        for (size_t k = 0; k < n; k++) {
            size_t i = order[k];
            if (has_previous(in, i)) {
                int d = in->previous[i];
                out[i] = d;
                load[d] = time_on(in, w, load, i, d);
            }
        }
    }
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        if ((in->pinned && in->pinned[i]) || (keep_previous && has_previous(in, i)))
            continue;
        int best = 0;
        double best_finish = time_on(in, w, load, i, 0);
        for (int d = 1; d < dc; d++) {
            double f = time_on(in, w, load, i, d);
            if (f < best_finish) {
                best_finish = f;
                best = d;
            }
        }
        out[i] = best;
        load[best] = best_finish;
    }
    double span = 0.0;
    for (int d = 0; d < dc; d++)
        if (load[d] > span)
            span = load[d];
    return span;
}

static int valid(const vkm_partition_input *in)
{
    if (!in || in->device_count < 1 || in->count > UINT32_MAX)
        return 0;
    if (!(in->hysteresis >= 0.0 && in->hysteresis < 1.0))
        return 0;
    if (in->count && (!in->cost || !in->tie_key))
        return 0;
    for (size_t i = 0; i < in->count; i++) {
        if (!isfinite(in->cost[i]) || in->cost[i] < 0.0)
            return 0;
        if (in->transfer && (!isfinite(in->transfer[i]) || in->transfer[i] < 0.0))
            return 0;
    }
    if (in->weights)
        for (int d = 0; d < in->device_count; d++)
            if (!isfinite(in->weights[d]) || in->weights[d] <= 0.0)
                return 0;
    return 1;
}

int vkm_partition(const vkm_partition_input *in, int32_t *device_out)
{
    if (!valid(in) || (in->count && !device_out))
        return VKM_PARTITION_EINVAL;
    const size_t n = in->count;
    const int dc = in->device_count;
    if (dc == 1 || n == 0) {
        for (size_t i = 0; i < n; i++)
            device_out[i] = 0;
        return VKM_PARTITION_OK;
    }

    int sticky = 0;
    if (in->previous)
        for (size_t i = 0; i < n && !sticky; i++)
            sticky = has_previous(in, i);

    item *items = malloc(2 * n * sizeof(item));
    uint32_t *order = malloc(n * sizeof(uint32_t));
    double *loads = calloc(3 * (size_t)dc, sizeof(double)); /* weights, greedy, sticky */
    int32_t *sticky_out = sticky ? malloc(n * sizeof(int32_t)) : NULL;
    if (!items || !order || !loads || (sticky && !sticky_out)) {
        free(items);
        free(order);
        free(loads);
        free(sticky_out);
        return VKM_PARTITION_ENOMEM;
    }

    sort_order(in, items, order);
    free(items);

    double *w = loads;
    for (int d = 0; d < dc; d++)
        w[d] = in->weights ? in->weights[d] : 1.0;

    double greedy_span = plan(in, w, order, 0, device_out, loads + dc);
    if (sticky) {
        double sticky_span = plan(in, w, order, 1, sticky_out, loads + 2 * dc);
        if (!(greedy_span < sticky_span * (1.0 - in->hysteresis)))
            memcpy(device_out, sticky_out, n * sizeof(int32_t));
    }

    free(order);
    free(loads);
    free(sticky_out);
    return VKM_PARTITION_OK;
}
