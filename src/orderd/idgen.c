/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idgen.c - time-ordered order ids (see idgen.h).  The layout follows UUIDv7's idea: time
 * first, then a counter, then randomness.
 */
#include "idgen.h"

#include <stdio.h>
#include <string.h>

#include "util.h"
#include "banned.h"

void idgen_init(struct idgen *g)
{
    memset(g, 0, sizeof *g);
    if (pthread_mutex_init(&g->mu, NULL) != 0)
        die("pthread_mutex_init failed");
}

void idgen_destroy(struct idgen *g)
{
    pthread_mutex_destroy(&g->mu);
}

void idgen_next(struct idgen *g, char id[ORDER_ID_LEN + 1], int64_t *ms)
{
    unsigned char rnd[8];
    char rnd_hex[2 * sizeof rnd + 1];
    int64_t now = clock_wall_ms();
    unsigned seq;

    random_bytes(rnd, sizeof rnd);
    hex_encode(rnd, sizeof rnd, rnd_hex);

    pthread_mutex_lock(&g->mu);
    if (now > g->last_ms) {
        g->last_ms = now;
        g->seq = 0;
    } else if (++g->seq > 0xffff) {
        /* 65536 orders in one millisecond: borrow the next millisecond. */
        g->last_ms++;
        g->seq = 0;
    }
    now = g->last_ms;
    seq = g->seq;
    pthread_mutex_unlock(&g->mu);

    snprintf(id, ORDER_ID_LEN + 1, "ord_%012llx%04x%s", (unsigned long long)now & 0xffffffffffffULL,
             seq, rnd_hex);
    *ms = now;
}
