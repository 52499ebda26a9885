/* SPDX-License-Identifier: Apache-2.0 */
/*
 * error_format.c - the gateway's own errors as Stripe's clients read them (error_format.h).
 *
 * Stripe's SDKs pick the error class from the status (400 and 404: invalid request, or
 * idempotency when the type says so; 401 authentication; 403 permission; 429 rate limit; the rest
 * the API error) and retry by Stripe-Should-Retry, else on 409 and 5xx.  So each problem maps to
 * the status of its class and says whether a retry is worth it: with a record keeping the key a
 * retry can never run twice, so "true" wherever it may succeed; without one, only when nothing
 * was sent or the method is safe.
 */
#include "error_format.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "problem.h"
#include "banned.h"

/* Whether a retry is worth it. */
enum retry {
    RETRY_NO,      /* the same request can only fail the same way */
    RETRY_YES,     /* nothing was done, or a record dedupes it */
    RETRY_IF_SAFE, /* the upstream may have acted: with a record or a safe method only */
    RETRY_UNKNOWN, /* an unknown outcome: by the route's on_unknown (hold: never) */
};

struct style {
    const char *problem; /* the problem's code */
    int status;          /* Stripe's status for it; 0: the problem's own */
    const char *type;    /* Stripe's error type */
    const char *code;    /* Stripe's code; NULL: the problem's code with '_' for '-' */
    enum retry retry;
};

static const struct style styles[] = {
    {"idempotency-key-reused", 400, "idempotency_error", NULL, RETRY_NO},
    {"idempotency-request-in-progress", 409, "idempotency_error", "idempotency_key_in_use",
     RETRY_YES},
    {"idempotency-key-missing", 400, "invalid_request_error", NULL, RETRY_NO},
    {"idempotency-key-invalid", 400, "invalid_request_error", NULL, RETRY_NO},
    {"idempotency-key-unrouted", 400, "invalid_request_error", NULL, RETRY_NO},
    {"unauthorized", 401, "authentication_error", NULL, RETRY_NO},
    {"forbidden", 403, "permission_error", NULL, RETRY_NO},
    {"idempotency-store-unavailable", 0, "api_error", NULL, RETRY_YES},
    {"server-busy", 0, "api_error", NULL, RETRY_YES},
    {"too-many-connections", 0, "api_error", NULL, RETRY_YES},
    {"request-timeout", 0, "api_error", NULL, RETRY_YES},
    {"upstream-unavailable", 0, "api_error", NULL, RETRY_YES},
    {"upstream-timeout", 0, "api_error", NULL, RETRY_IF_SAFE},
    {"upstream-bad-reply", 0, "api_error", NULL, RETRY_IF_SAFE},
    {"internal-error", 0, "api_error", NULL, RETRY_IF_SAFE},
    {"upstream-response-too-large", 0, "api_error", NULL, RETRY_NO},
    {"response-not-stored", 0, "api_error", NULL, RETRY_NO},
    {"outcome-unknown", 0, "api_error", NULL, RETRY_UNKNOWN},
    {"too-many-requests", 429, "rate_limit_error", NULL, RETRY_YES},
    {"stored-bytes-exceeded", 429, "rate_limit_error", NULL, RETRY_YES},
    {"store-full", 0, "api_error", NULL, RETRY_YES},
};

static const struct style *style_of(const char *problem, int status)
{
    /* Any other refusal of the request itself is an invalid request; anything else an API error. */
    static const struct style refused = {NULL, 400, "invalid_request_error", NULL, RETRY_NO};
    static const struct style failed = {NULL, 0, "api_error", NULL, RETRY_IF_SAFE};

    for (size_t i = 0; i < sizeof styles / sizeof styles[0]; i++)
        if (strcmp(styles[i].problem, problem) == 0)
            return &styles[i];
    return status >= 400 && status < 500 ? &refused : &failed;
}

static int safe_method(const char *method)
{
    return method != NULL && (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0 ||
                              strcmp(method, "OPTIONS") == 0);
}

static int retry_worth(enum retry retry, const struct gw_route *r, int keyed, const char *method)
{
    switch (retry) {
    case RETRY_NO:
        return 0;
    case RETRY_YES:
        return 1;
    case RETRY_IF_SAFE:
        return keyed || safe_method(method);
    case RETRY_UNKNOWN:
        return r != NULL && r->unknown != GW_UNKNOWN_HOLD;
    }
    return 0;
}

static void restyle_stripe(const struct gw_route *r, int keyed, const char *method,
                           struct response *resp)
{
    const struct style *st = style_of(resp->problem, resp->status);
    json_t *doc = json_loadb(resp->body ? resp->body : "", resp->body_len, 0, NULL);
    const char *detail = json_string_value(json_object_get(doc, "detail"));
    const char *title = json_string_value(json_object_get(doc, "title"));
    char code[64];
    size_t i;
    json_t *out;

    snprintf(code, sizeof code, "%s", st->code ? st->code : resp->problem);
    for (i = 0; code[i]; i++)
        if (code[i] == '-')
            code[i] = '_';
    out = json_pack("{s:{s:s, s:s, s:s}}", "error", "type", st->type, "code", code, "message",
                    detail  ? detail
                    : title ? title
                            : code);
    if (out == NULL) { /* out of memory: the problem goes as it is */
        json_decref(doc);
        return;
    }
    if (st->status != 0)
        resp->status = st->status;
    response_json(resp, resp->status, out); /* clears resp->problem: restyled once */
    response_set_header(resp, "Stripe-Should-Retry",
                        retry_worth(st->retry, r, keyed, method) ? "true" : "false");
    json_decref(out);
    json_decref(doc);
}

void gw_errors_restyle(enum gw_error_format fmt, const struct gw_route *r, int keyed,
                       const char *method, struct response *resp)
{
    if (resp->problem == NULL)
        return;
    switch (fmt) {
    case GW_ERRORS_PROBLEM:
        return;
    case GW_ERRORS_STRIPE:
        restyle_stripe(r, keyed, method, resp);
        return;
    }
}
