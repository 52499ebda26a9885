/* SPDX-License-Identifier: Apache-2.0 */
/*
 * handlers.h - provider-sim's endpoints and the one glue every idempotent POST goes through
 * (idempotent.c): Idempotency-Key, JSON body, validation, the 5xx and latency faults, libidem's
 * record (replay, mismatch, in progress), then the effect, then maybe the lost-response fault.  A
 * handler file only says what its effect is.
 */
#ifndef SIM_HANDLERS_H
#define SIM_HANDLERS_H

#include <stddef.h>

#include <jansson.h>

#include "idem/idem.h"

#include "sim_server.h"
#include "sim.h"

/* What an effect answers: stored with the key and sent, the same for every retry. */
struct exec_result {
    int status;
    char *body; /* new, free() */
    size_t body_len;
    const char *content_type; /* static */
};

/* Checks a parsed body before anything runs; -1 with a sentence in `detail` refuses it (400). */
typedef int (*validate_fn)(const json_t *body, char *detail, size_t cap);

/*
 * Runs the effect in the call's open phase (after EXECUTE) or from its recovery point (after
 * RESUME, no phase open), and fills `out`.  Returns 0, or a negative IDEM_E* (nothing stored).
 */
typedef int (*exec_fn)(struct sim *sim, struct idem_call *call, enum idem_outcome outcome,
                       const json_t *body, const char *key, struct exec_result *out);

void idempotent_post(struct sim *sim, const struct request *rq, struct response *resp,
                     const struct idem_operation *op, const char *route, validate_fn validate,
                     exec_fn exec);

/* Sets `out` to `status` with the compact JSON of `doc` (borrowed). */
void exec_json(struct exec_result *out, int status, const json_t *doc);
/* Sets `out` to a problem; `extra` (borrowed, may be NULL) adds members. */
void exec_problem(struct exec_result *out, int status, const char *code, const char *detail,
                  const json_t *extra);

/* The metadata member of a body: an object (new reference), {} when absent. */
json_t *body_metadata(const json_t *body);

/* The objects, their idempotent POSTs and their GETs (resource.h): charges.c, emails.c. */
struct sim_resource;
extern const struct sim_resource charges_resource, refunds_resource, emails_resource;
void charges_create(struct sim *sim, const struct request *rq, struct response *resp);
void refunds_create(struct sim *sim, const struct request *rq, struct response *resp);
void emails_create(struct sim *sim, const struct request *rq, struct response *resp);

/* ledger.c */
void ledger_get(struct sim *sim, const struct request *rq, struct response *resp);
/* GET /v1/ledger/references?kind=charges|emails[&after=REF][&limit=N]: one page of counts. */
void ledger_references(struct sim *sim, const struct request *rq, struct response *resp);

#endif /* SIM_HANDLERS_H */
