/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idempotent.c - the glue of every idempotent POST of provider-sim (handlers.h).  The order of
 * the checks is the one docs/http-api.md gives orderd: key, JSON, validation (400s, never stored),
 * then the record.  The faults sit where a real provider's failures sit: a 5xx fault answers before
 * anything runs (nothing is stored, a retry runs afresh), the latency fault delays the request,
 * and the lost-response fault strikes after the effect committed, so the client cannot tell
 * whether it happened - exactly the case its reconciler must settle by asking.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"

#include "faults.h"
#include "keyed_answer.h"
#include "handlers.h"
#include "sim_server.h"
#include "sim.h"
#include "sim_util.h"
#include "webhook_sender.h"
#include "jdoc.h"
#include "banned.h"

void exec_json(struct exec_result *out, int status, const json_t *doc)
{
    free(out->body);
    out->status = status;
    out->body = jdoc_text(doc, &out->body_len);
    out->content_type = "application/json";
}

void exec_problem(struct exec_result *out, int status, const char *code, const char *detail,
                  const json_t *extra)
{
    free(out->body);
    out->status = status;
    out->body = problem_body_ext(status, code, detail, extra, &out->body_len);
    out->content_type = "application/problem+json";
}

json_t *body_metadata(const json_t *body)
{
    json_t *m = json_object_get(body, "metadata");

    return json_is_object(m) ? json_incref(m) : xcheck(json_object());
}

static int read_key(const struct request *rq, struct response *resp, char key[IDEM_KEY_MAX + 1])
{
    const char *value = NULL, *why = NULL;
    char detail[256];
    size_t len = 0;
    int count = request_header_count(rq, "Idempotency-Key", &value, &len);

    if (count == 0) {
        response_problem(resp, 400, "idempotency-key-missing",
                         "This endpoint needs an Idempotency-Key header.");
        return -1;
    }
    if (count > 1) {
        response_problem(resp, 400, "idempotency-key-invalid",
                         "Idempotency-Key was sent more than once.");
        return -1;
    }
    if (idem_key_parse(value, len, key, &why) != 0) {
        snprintf(detail, sizeof detail, "Idempotency-Key is invalid: %s.", why ? why : "invalid");
        response_problem(resp, 400, "idempotency-key-invalid", detail);
        return -1;
    }
    return 0;
}

void idempotent_post(struct sim *sim, const struct request *rq, struct response *resp,
                     const struct idem_operation *op, const char *route, validate_fn validate,
                     exec_fn exec)
{
    struct sim_counters *c = &sim->counters;
    struct fault_settings fs;
    struct idem_call *call = NULL;
    struct exec_result res;
    enum idem_outcome outcome = IDEM_OUTCOME_NONE;
    unsigned char fp[IDEM_FP_LEN];
    char key[IDEM_KEY_MAX + 1];
    char detail[320];
    json_error_t jerr;
    json_t *body = NULL;
    const char *why = NULL;
    struct idem_header hdr;
    char ra[16];
    int rc;

    memset(&res, 0, sizeof res);
    atomic_fetch_add(&c->posts, 1);
    if (read_key(rq, resp, key) != 0)
        goto out;
    if (rq->body_len == 0) {
        response_problem(resp, 400, "invalid-json", "A JSON body is required.");
        goto out;
    }
    body = jdoc_load(rq->body, rq->body_len, JSON_REJECT_DUPLICATES, &jerr);
    if (body == NULL || !json_is_object(body)) {
        snprintf(detail, sizeof detail, "The body must be a JSON object: %s.",
                 body ? "not an object" : jerr.text);
        response_problem(resp, 400, "invalid-json", detail);
        goto out;
    }
    if (validate(body, detail, sizeof detail) != 0) {
        response_problem(resp, 400, "validation-failed", detail);
        goto out;
    }
    rc = idem_fingerprint("POST", route, NULL, 0, rq->body, rq->body_len, fp, &why);
    if (rc < 0) {
        snprintf(detail, sizeof detail, "The body must be JSON: %s.", why ? why : "invalid");
        response_problem(resp, 400, "invalid-json", detail);
        goto out;
    }

    faults_get(&sim->faults, &fs);
    clock_sleep_ms(faults_latency(&fs));
    if (faults_roll(fs.fail_rate)) {
        atomic_fetch_add(&c->failed, 1);
        response_set_header(resp, "Retry-After", "1");
        response_problem(resp, 503, "provider-unavailable",
                         "Injected fault (fail_rate): nothing was done. Retry with the same key.");
        goto out;
    }

    rc = idem_call_begin(sim->engine, op, SIM_PRINCIPAL, key, fp, &call, &outcome);
    if (rc < 0) {
        log_msg(&sim_log, "error", "%s: cannot begin: %s", op->name, idem_err_name(rc));
        response_set_header(resp, "Retry-After", "1");
        response_problem(resp, 503, "provider-unavailable",
                         "The provider's store is busy; nothing was done. Retry.");
        goto out;
    }
    switch (outcome) {
    case IDEM_OUTCOME_REPLAY:
        atomic_fetch_add(&c->replayed, 1);
        keyed_answer_stored(call, resp);
        response_set_header(resp, "Idempotent-Replayed", "true");
        break;
    case IDEM_OUTCOME_MISMATCH:
        atomic_fetch_add(&c->conflicts, 1);
        response_problem(resp, 422, "idempotency-key-reused",
                         "This Idempotency-Key was used for a different request.");
        goto out;
    case IDEM_OUTCOME_IN_PROGRESS:
        atomic_fetch_add(&c->conflicts, 1);
        snprintf(ra, sizeof ra, "%d", idem_call_retry_after_s(call));
        response_set_header(resp, "Retry-After", ra);
        response_problem(resp, 409, "idempotency-request-in-progress",
                         "A request with this Idempotency-Key is still being processed.");
        goto out;
    case IDEM_OUTCOME_EXECUTE:
    case IDEM_OUTCOME_RESUME:
        rc = exec(sim, call, outcome, body, key, &res);
        if (rc == 0 && idem_call_tx(call) == NULL)
            rc = idem_call_phase_begin(call);
        if (rc == 0) {
            hdr.name = "Content-Type";
            hdr.value = res.content_type;
            rc = idem_call_complete(call, res.status, &hdr, 1, res.body, res.body_len);
        }
        if (rc < 0) {
            log_msg(&sim_log, "error", "%s: %s: %s", op->name, idem_err_name(rc),
                    idem_call_errmsg(call));
            idem_call_abort(call);
            response_problem(resp, 500, "internal-error",
                             "The request failed and was rolled back. Retry.");
            goto out;
        }
        atomic_fetch_add(&c->executed, 1);
        webhooks_notify(sim->webhooks);
        keyed_answer_stored(call, resp);
        break;
    case IDEM_OUTCOME_NONE:
    default:
        response_problem(resp, 500, "internal-error", "Unexpected engine outcome.");
        goto out;
    }
    /* Only an answer that carries an outcome can be lost: the effect (or replay) stands. */
    if (faults_roll(fs.lost_rate)) {
        atomic_fetch_add(&c->lost, 1);
        resp->drop = 1;
    }
out:
    free(res.body);
    json_decref(body);
    idem_call_end(call);
}
