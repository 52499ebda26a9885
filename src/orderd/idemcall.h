/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idemcall.h - the engine's outcomes as HTTP.  An idempotent handler validates its request,
 * then hands idemcall_handle() a function that runs the operation's phases; this file claims or
 * finds the record and answers every other outcome the same way for every operation: replay
 * the stored response, 422 for a reused key, 409 while the first request runs, 503 when the
 * store cannot be reached.  What a handler completes is stored, and exactly the stored bytes
 * are sent.
 */
#ifndef ORDERD_IDEMCALL_H
#define ORDERD_IDEMCALL_H

#include <jansson.h>

#include "idem/idem.h"

#include "keyed_answer.h" /* keyed_answer_unavailable(), _in_progress(), _fail() */

struct call_ctx;
struct response;

/*
 * Runs an operation that owns its record: `outcome` is IDEM_OUTCOME_EXECUTE (the first phase is
 * open) or IDEM_OUTCOME_RESUME (no phase is open; see idem_call_recovery_point()).  Returns 0
 * once it completed the call (idemcall_complete_*), or a negative IDEM_E* after which the open
 * phase is aborted and nothing is stored.  It may set resp->outcome or response headers that
 * are sent but not stored (Idempotent-Replayed for a late retry).
 *
 * IDEMCALL_ANSWERED means: the answer is already in `resp` and must not be stored (an unknown
 * outcome, 503 outcome-unknown; a transient refusal); the call is aborted, so its lease is
 * released and a retry goes on from the recovery point (or, before any commit, runs afresh).
 */
#define IDEMCALL_ANSWERED 1
/*
 * IDEMCALL_DEFERRED means: idemcall_commit_deferred() took the call; its answer is sent from the
 * thread that makes the commit durable.  Touch neither the call nor `resp` after it.
 */
#define IDEMCALL_DEFERRED 2

typedef int (*idemcall_run_fn)(const struct call_ctx *cx, struct idem_call *call,
                               enum idem_outcome outcome, void *arg, struct response *resp);

/*
 * The replay cache's answer for (cx->principal, op, cx->key, cx->fp), without the store and
 * without waiting (an event-loop thread may call it): 1 when it answered into `resp` (a replay or
 * a reused key), 0 when only idemcall_handle() can tell.
 */
int idemcall_lookup(const struct call_ctx *cx, const struct idem_operation *op,
                    struct response *resp);

/*
 * Commits the staged response of the open phase, as idem_call_commit(), without waiting for the
 * commit to be durable where the server and the store allow it: the stored response (or the
 * failure) is written into `resp` and handed to the HTTP layer (http_server_complete) by the
 * thread that makes the batch durable, and this worker is free at once.  Returns
 * IDEMCALL_DEFERRED then; otherwise it commits synchronously and returns idem_call_commit()'s
 * code.
 */
int idemcall_commit_deferred(const struct call_ctx *cx, struct idem_call *call,
                             struct response *resp);

/* Begins the call for (cx->principal, op, cx->key, cx->fp) and answers it into `resp`. */
void idemcall_handle(const struct call_ctx *cx, const struct idem_operation *op,
                     idemcall_run_fn run, void *arg, struct response *resp);

/* Completes the call with `status`, application/json `doc` and an optional Location. */
int idemcall_complete_json(struct idem_call *call, int status, const json_t *doc,
                           const char *location);

/*
 * Stages the same response in the open phase without committing (idem_call_stage): the handler
 * runs its last statements, then commits with idem_call_commit().
 */
int idemcall_stage_json(struct idem_call *call, int status, const json_t *doc,
                        const char *location);

/* Completes the call with a stored business problem (422 unknown-product, 409 out-of-stock...). */
int idemcall_complete_problem(struct idem_call *call, int status, const char *code,
                              const char *detail);

/* The same problem staged in the open phase without committing (idem_call_stage). */
int idemcall_stage_problem(struct idem_call *call, int status, const char *code,
                           const char *detail);

/* The same with extension members (borrowed, may be NULL): "orderId" of a declined payment. */
int idemcall_complete_problem_ext(struct idem_call *call, int status, const char *code,
                                  const char *detail, const json_t *extra);

/*
 * 503 outcome-unknown with Retry-After: an external step (the provider) gave no answer; nothing
 * is stored, the record keeps its recovery point, and a retry, the completer or the reconciler
 * settles it.  Returns IDEMCALL_ANSWERED for the run function to return.
 */
int idemcall_outcome_unknown(struct response *resp, const char *detail);

#endif /* ORDERD_IDEMCALL_H */
