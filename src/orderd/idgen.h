/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idgen.h - order ids: "ord_" and 32 hex digits.  The first 12 digits are the creation time in
 * milliseconds, the next 4 a sequence within that millisecond, the last 16 random: ids created
 * by one process sort in creation order, so "newest first" holds even for two orders created in
 * the same millisecond, while the random half keeps ids unguessable.
 */
#ifndef ORDERD_IDGEN_H
#define ORDERD_IDGEN_H

#include <pthread.h>
#include <stdint.h>

#define ORDER_ID_LEN 36 /* "ord_" + 32 hex */

struct idgen {
    pthread_mutex_t mu;
    int64_t last_ms;
    unsigned seq;
};

void idgen_init(struct idgen *g);
void idgen_destroy(struct idgen *g);

/*
 * Writes a new order id into `id` and the millisecond it was created at into *ms (never less
 * than the previous one: a clock that steps back does not reorder a process's orders).
 */
void idgen_next(struct idgen *g, char id[ORDER_ID_LEN + 1], int64_t *ms);

#endif /* ORDERD_IDGEN_H */
