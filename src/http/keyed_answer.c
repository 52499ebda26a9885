/* SPDX-License-Identifier: Apache-2.0 */
/*
 * keyed_answer.c - the one mapping of libidem's outcomes to HTTP (keyed_answer.h), shared by orderd
 * and idem-gateway so that their replays, refusals and requests to retry cannot drift apart.
 */
#include "keyed_answer.h"

#include <stdio.h>

#include "util.h"
#include "banned.h"

void keyed_answer_stored(const struct idem_call *call, struct response *resp)
{
    const void *body;
    size_t len = 0;
    size_t n = idem_call_response_header_count(call);

    resp->status = idem_call_response_status(call);
    body = idem_call_response_body(call, &len);
    response_set_body(resp, body, body ? len : 0);
    for (size_t i = 0; i < n; i++) {
        const struct idem_header *h = idem_call_response_header(call, i);
        /* Added, not set: a header stored twice (Link, Vary) is replayed twice. */
        if (h != NULL && h->name != NULL && h->value != NULL)
            response_add_header(resp, h->name, h->value);
    }
}

void keyed_answer_in_progress(struct response *resp, int retry_after_s, int recovering)
{
    json_t *ext = NULL;
    char ra[16];

    snprintf(ra, sizeof ra, "%d", retry_after_s < 1 ? 1 : retry_after_s);
    response_set_header(resp, "Retry-After", ra);
    if (recovering) {
        ext = xcheck(json_pack("{s:s}", "state", "recovering"));
        response_problem_ext(resp, 409, "idempotency-request-in-progress",
                             "An earlier attempt with this Idempotency-Key is being recovered in "
                             "the background. Retry after the number of seconds in Retry-After "
                             "to get its result.",
                             ext);
        json_decref(ext);
    } else {
        response_problem(resp, 409, "idempotency-request-in-progress",
                         "A request with this Idempotency-Key is still being processed. Retry "
                         "after the number of seconds in Retry-After to get its result.");
    }
    resp->outcome = "in_progress";
}

int keyed_answer_settled(const struct idem_call *call, enum idem_outcome outcome,
                         const struct idem_operation *op, struct response *resp)
{
    char detail[320];
    int64_t hours = op->ttl_ms > 0 ? op->ttl_ms / 3600000 : 24;

    switch (outcome) {
    case IDEM_OUTCOME_REPLAY:
        keyed_answer_stored(call, resp);
        response_set_header(resp, "Idempotent-Replayed", "true");
        resp->outcome = idem_call_waited(call) ? "waited" : "replayed";
        return 1;
    case IDEM_OUTCOME_MISMATCH:
        if (hours >= 1)
            snprintf(detail, sizeof detail,
                     "This Idempotency-Key was already used for a different request to %s. Use "
                     "a new key for a new request (keys are kept %lld hours).",
                     op->name, (long long)hours);
        else
            snprintf(detail, sizeof detail,
                     "This Idempotency-Key was already used for a different request to %s. Use "
                     "a new key for a new request (keys are kept %lld seconds).",
                     op->name, (long long)(op->ttl_ms / 1000));
        response_problem(resp, 422, "idempotency-key-reused", detail);
        resp->outcome = "mismatch";
        return 1;
    case IDEM_OUTCOME_IN_PROGRESS:
        keyed_answer_in_progress(resp, idem_call_retry_after_s(call), idem_call_recovering(call));
        return 1;
    default:
        return 0;
    }
}

int keyed_answer_lookup(struct idem_engine *eng, const struct idem_operation *op,
                        const char *principal, const char *key, const unsigned char fp[IDEM_FP_LEN],
                        struct response *resp)
{
    struct idem_call *call = NULL;
    enum idem_outcome outcome = IDEM_OUTCOME_NONE;
    int answered = 0;

    if (idem_call_lookup(eng, op, principal, key, fp, &call, &outcome) == 0 && call != NULL)
        answered = keyed_answer_settled(call, outcome, op, resp);
    idem_call_end(call);
    return answered;
}

void keyed_answer_unavailable(struct response *resp, const char *detail)
{
    response_set_header(resp, "Retry-After", "1");
    response_problem(resp, 503, "idempotency-store-unavailable", detail);
    resp->outcome = "error";
}

void keyed_answer_fail(struct response *resp, int rc)
{
    if (rc == IDEM_EUNAVAIL || rc == IDEM_EMOVED) {
        /*
         * Not "nothing was done": a COMMIT whose answer was lost may have committed.  (Moved: the
         * principal's bucket is on another cluster, or on its way there; a retry finds it.)
         */
        keyed_answer_unavailable(resp, "The store did not answer in time, so the request did not "
                                       "finish. Retry with the same Idempotency-Key: it runs once, "
                                       "or returns its stored result.");
    } else {
        response_problem(resp, 500, "internal-error",
                         "The request failed and was rolled back; nothing was stored. Retry.");
        resp->outcome = "error";
    }
}

void keyed_answer_outcome_unknown(struct response *resp, int status, const char *detail)
{
    response_set_header(resp, "Retry-After", "1");
    response_problem(resp, status, "outcome-unknown", detail);
    resp->outcome = "unknown";
}
