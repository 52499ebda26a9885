/* SPDX-License-Identifier: Apache-2.0 */
/*
 * resource.h - the read side of provider-sim's objects (charges, refunds, emails): one object by
 * id, and the lists a client's reconciler asks for (by Idempotency-Key, by a filter, the latest).
 * Each object's file describes its table with a struct sim_resource; resource.c answers the GETs.
 */
#ifndef SIM_RESOURCE_H
#define SIM_RESOURCE_H

#include <stdint.h>

#include <jansson.h>

#include "idem/idem.h"

#include "sim_server.h"
#include "sim.h"

struct sim_resource {
    const char *path;  /* "/v1/charges": the collection; "/v1/charges/{id}" one object */
    const char *table; /* with an id, an idem_key and a created_ms column */
    const char *cols;  /* the columns `row` reads, in its order */
    json_t *(*row)(const struct idem_rows *rows, int r); /* the object of row r (new) */
    const char *missing_code;                            /* the 404's problem code */
    const char *filter_param;  /* a ?query parameter lists filter on, or NULL */
    const char *filter_column; /* ...and the column it matches */
    /* POST to the collection: the object's idempotent create. */
    void (*create)(struct sim *sim, const struct request *rq, struct response *resp);
};

/* GET path/{id}: the object, or a 404 problem; 503 if the store does not answer. */
void resource_get(struct sim *sim, const struct sim_resource *res, struct response *resp,
                  const char *id);

/*
 * GET path: {"object":"list","data":[...]}: the objects of ?idempotency_key=K (oldest first),
 * else of the filter parameter, else the 100 latest (newest first).
 */
void resource_list(struct sim *sim, const struct sim_resource *res, const struct request *rq,
                   struct response *resp);

/* The metadata object stored as `text` (new; {} when absent or not an object). */
json_t *resource_metadata(const char *text);
/* Cell (r, c) as an integer; 0 when it is not one. */
int64_t resource_int(const struct idem_rows *rows, int r, int c);

#endif /* SIM_RESOURCE_H */
