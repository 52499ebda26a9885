/* SPDX-License-Identifier: Apache-2.0 */
/*
 * latency.h - the latency percentiles the bench programs print (commit_rate.c, storm.c): the
 * samples are sorted once with latency_sort, then read with latency_at.  Header-only, as each
 * program is one file.
 */
#ifndef IDEM_BENCH_LATENCY_H
#define IDEM_BENCH_LATENCY_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static int latency_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return x < y ? -1 : x > y;
}

static inline void latency_sort(int64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, latency_cmp);
}

/* The p-quantile (0 to 1, nearest rank) of the n sorted samples v; -1 when there are none. */
static inline int64_t latency_at(const int64_t *v, size_t n, double p)
{
    size_t i;

    if (n == 0)
        return -1;
    i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

#endif
