/* SPDX-License-Identifier: Apache-2.0 */
/*
 * records.h - an operator's view of the gateway's records, shared by the admin listener
 * (GET /records, POST /records/resolve) and the command line (`idem-gateway keys show|resolve`):
 * show one record, and resolve one whose outcome is unknown by saying what really happened.
 */
#ifndef IDEM_GATEWAY_RECORDS_H
#define IDEM_GATEWAY_RECORDS_H

#include <stddef.h>

#include <jansson.h>

#include "idem/idem.h"

#include "config.h"

/*
 * The record of (principal, operation, key) as a JSON object: state ("completed", "in-flight",
 * "unknown"), recoveryPoint, fingerprint, created, expires, and leaseExpires or response
 * {status, bytes}.  Returns 1 with *doc (new), 0 when there is no record, or a negative IDEM_E*
 * code.
 */
int records_show(struct idem_engine *eng, const char *principal, const char *operation,
                 const char *key, json_t **doc);

/*
 * The statuses a resolution may store, for the admin API and the CLI alike: a 5xx says "nothing
 * happened, retry", so it is never stored; a 1xx is no final answer (every retry would get a bare
 * "100 Continue" and wait for one that never comes).
 */
#define RECORDS_STATUS_MIN 200
#define RECORDS_STATUS_MAX 499

/* What an operator says happened to a request whose outcome was unknown. */
struct records_decision {
    int executed; /* 1: it ran upstream, store `status` etc.; 0: it did not, release the key */
    int status;
    const struct idem_header *headers;
    size_t nheaders;
    const char *body;
    size_t body_len;
};

/*
 * A page of the records not completed, for an operator looking for held keys: those whose state
 * (as records_show says it) is `state` ("unknown", "in-flight", or "any" for both), of
 * `operation` (NULL: every one), after the opaque `after` cursor (NULL or "": from the first), at
 * most `limit` looked at, read from the stores `stores` (the engine's, or a shard set's clusters,
 * one after another) in one statement each.  *doc: {"records": [records_show's documents],
 * "next": a cursor for the next page, or null after the last}.  Returns 0, IDEM_EINVAL for a bad
 * state or cursor, or a store error.
 */
int records_list(struct idem_store *const *stores, size_t nstores, const char *state,
                 const char *operation, const char *after, int limit, json_t **doc);

enum records_result {
    RECORDS_RESOLVED,
    RECORDS_NOT_FOUND, /* no record */
    RECORDS_COMPLETED, /* it has an answer already: nothing to resolve */
    RECORDS_IN_FLIGHT, /* a gateway is forwarding it right now: its lease is live */
    RECORDS_FAILED,    /* the store failed: `err` says how */
};

/*
 * Resolves the held record of (principal, op, key): stores the decision's response (a retry is
 * then answered with it) or deletes the record (a retry runs).  `err` gets a sentence on
 * RECORDS_FAILED.
 */
enum records_result records_resolve(struct idem_engine *eng, const struct idem_operation *op,
                                    const char *principal, const char *key,
                                    const struct records_decision *d, char *err, size_t errlen);

/* The operation of the route named `name` in `ops` (one per route of `cfg`), or NULL. */
const struct idem_operation *records_find_op(const struct gw_config *cfg,
                                             const struct idem_operation *ops, const char *name);

#endif /* IDEM_GATEWAY_RECORDS_H */
