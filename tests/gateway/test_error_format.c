/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_error_format.c - the gateway's own errors as Stripe's SDKs read them (error_format.c):
 * the status that picks the SDK's error class, the envelope, Stripe-Should-Retry by whether a
 * retry can succeed, and the upstream's answers left alone.
 */
#include "error_format.h"

#include <jansson.h>
#include <string.h>

#include "t.h"

const char program_name[] = "gateway_test_error_format";

/* `code` at `status` as the gateway writes it, restyled for a route of mode `unknown`. */
static void styled(const char *code, int status, enum gw_unknown_mode unknown, int keyed,
                   const char *method, struct response *out)
{
    struct gw_route r;

    memset(&r, 0, sizeof r);
    r.unknown = unknown;
    response_init(out);
    response_problem(out, status, code, "what happened");
    gw_errors_restyle(GW_ERRORS_STRIPE, &r, keyed, method, out);
}

static const char *member(const json_t *o, const char *name)
{
    const char *s = json_string_value(json_object_get(o, name));
    return s ? s : "";
}

/* 1 when `resp` is Stripe's envelope of (status, type, code) and says `retry`. */
static int is_stripe(const struct response *resp, int status, const char *type, const char *code,
                     const char *retry)
{
    json_t *doc = json_loadb(resp->body, resp->body_len, 0, NULL);
    json_t *e = json_object_get(doc, "error");
    const char *ct = response_header(resp, "Content-Type");
    const char *sr = response_header(resp, "Stripe-Should-Retry");
    int ok = resp->status == status && e != NULL && json_object_size(doc) == 1 &&
             strcmp(member(e, "type"), type) == 0 && strcmp(member(e, "code"), code) == 0 &&
             strcmp(member(e, "message"), "what happened") == 0 && ct != NULL &&
             strcmp(ct, "application/json") == 0 && sr != NULL && strcmp(sr, retry) == 0 &&
             resp->problem == NULL;

    if (!ok)
        fprintf(stderr, "got %d %.*s (Stripe-Should-Retry %s), expected %d %s %s %s\n",
                resp->status, (int)resp->body_len, resp->body, sr ? sr : "-", status, type, code,
                retry);
    json_decref(doc);
    return ok;
}

#define CHECK_STYLE(code, status, unknown, keyed, method, want_status, type, want_code, retry)     \
    do {                                                                                           \
        struct response r_;                                                                        \
        styled((code), (status), (unknown), (keyed), (method), &r_);                               \
        CHECK(is_stripe(&r_, (want_status), (type), (want_code), (retry)));                        \
        response_release(&r_);                                                                     \
    } while (0)

static void test_classes(void)
{
    /* The SDK's class comes from the status: 400 + idempotency_error is StripeIdempotencyError. */
    CHECK_STYLE("idempotency-key-reused", 422, GW_UNKNOWN_HOLD, 1, "POST", 400, "idempotency_error",
                "idempotency_key_reused", "false");
    CHECK_STYLE("idempotency-request-in-progress", 409, GW_UNKNOWN_HOLD, 1, "POST", 409,
                "idempotency_error", "idempotency_key_in_use", "true");
    CHECK_STYLE("idempotency-key-missing", 400, GW_UNKNOWN_HOLD, 0, "POST", 400,
                "invalid_request_error", "idempotency_key_missing", "false");
    CHECK_STYLE("unauthorized", 401, GW_UNKNOWN_HOLD, 0, "POST", 401, "authentication_error",
                "unauthorized", "false");
    /* Refusals of the request itself are invalid requests, whatever the HTTP status. */
    CHECK_STYLE("body-too-large", 413, GW_UNKNOWN_HOLD, 0, "POST", 400, "invalid_request_error",
                "body_too_large", "false");
    CHECK_STYLE("method-override-refused", 400, GW_UNKNOWN_HOLD, 0, "POST", 400,
                "invalid_request_error", "method_override_refused", "false");
}

static void test_should_retry(void)
{
    /* Nothing was done: a retry may succeed. */
    CHECK_STYLE("idempotency-store-unavailable", 503, GW_UNKNOWN_HOLD, 1, "POST", 503, "api_error",
                "idempotency_store_unavailable", "true");
    CHECK_STYLE("upstream-unavailable", 502, GW_UNKNOWN_HOLD, 0, "POST", 502, "api_error",
                "upstream_unavailable", "true");
    /* An outcome held for an operator: retrying only meets the same 503. */
    CHECK_STYLE("outcome-unknown", 503, GW_UNKNOWN_HOLD, 1, "POST", 503, "api_error",
                "outcome_unknown", "false");
    CHECK_STYLE("outcome-unknown", 504, GW_UNKNOWN_HOLD, 1, "POST", 504, "api_error",
                "outcome_unknown", "false");
    /* ...but a route that resends or asks the upstream settles it on the retry. */
    CHECK_STYLE("outcome-unknown", 502, GW_UNKNOWN_RESEND, 1, "POST", 502, "api_error",
                "outcome_unknown", "true");
    CHECK_STYLE("outcome-unknown", 503, GW_UNKNOWN_RECONCILE, 1, "POST", 503, "api_error",
                "outcome_unknown", "true");
    /* The upstream may have acted: a record dedupes the retry, a safe method is harmless. */
    CHECK_STYLE("upstream-timeout", 504, GW_UNKNOWN_HOLD, 1, "POST", 504, "api_error",
                "upstream_timeout", "true");
    CHECK_STYLE("upstream-timeout", 504, GW_UNKNOWN_HOLD, 0, "POST", 504, "api_error",
                "upstream_timeout", "false");
    CHECK_STYLE("upstream-timeout", 504, GW_UNKNOWN_HOLD, 0, "GET", 504, "api_error",
                "upstream_timeout", "true");
    CHECK_STYLE("response-not-stored", 410, GW_UNKNOWN_HOLD, 1, "POST", 410, "api_error",
                "response_not_stored", "false");
}

static void test_left_alone(void)
{
    struct response r;

    /* The default format: the problem as it is. */
    response_init(&r);
    response_problem(&r, 422, "idempotency-key-reused", "what happened");
    gw_errors_restyle(GW_ERRORS_PROBLEM, NULL, 1, "POST", &r);
    CHECK_INT(r.status, 422);
    CHECK_STR(response_header(&r, "Content-Type"), "application/problem+json");
    CHECK(response_header(&r, "Stripe-Should-Retry") == NULL);
    response_release(&r);

    /* Anything but the gateway's own problem (an upstream's body, even problem+json). */
    response_init(&r);
    r.status = 409;
    response_set_header(&r, "Content-Type", "application/problem+json");
    response_set_body(&r, "{\"type\":\"x\"}", 12);
    gw_errors_restyle(GW_ERRORS_STRIPE, NULL, 1, "POST", &r);
    CHECK_INT(r.status, 409);
    CHECK_INT(r.body_len, 12);
    CHECK(response_header(&r, "Stripe-Should-Retry") == NULL);
    response_release(&r);

    /* No route (the server's own refusal before one was found). */
    response_init(&r);
    response_problem(&r, 431, "request-header-too-large", "what happened");
    gw_errors_restyle(GW_ERRORS_STRIPE, NULL, 0, NULL, &r);
    CHECK(is_stripe(&r, 400, "invalid_request_error", "request_header_too_large", "false"));
    response_release(&r);
}

int main(void)
{
    test_classes();
    test_should_retry();
    test_left_alone();
    return t_done();
}
