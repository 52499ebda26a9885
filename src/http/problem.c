/* SPDX-License-Identifier: Apache-2.0 */
/*
 * problem.c - building problem documents (problem.h).  One table holds the titles of both
 * services' codes (docs/http-api.md, docs/provider-sim.md): a code raised by both, such as
 * "not-found", has one title; a code only one service raises costs the other nothing.
 */
#include "problem.h"

#include <stdio.h>
#include <string.h>

#include "util.h"
#include "jdoc.h"
#include "banned.h"

static const struct {
    const char *code;
    const char *title;
} titles[] = {
    /* Both services. */
    {"not-found", "Not found"},
    {"method-not-allowed", "Method not allowed"},
    {"body-too-large", "Request body too large"},
    {"idempotency-key-missing", "Idempotency-Key header missing"},
    {"idempotency-key-invalid", "Idempotency-Key header invalid"},
    {"idempotency-key-reused", "Idempotency-Key reused with a different request"},
    {"idempotency-request-in-progress", "A request with this Idempotency-Key is in progress"},
    {"invalid-json", "Body is not valid JSON"},
    {"validation-failed", "Validation failed"},
    {"internal-error", "Internal server error"},
    /* The HTTP layer (http_server.c, request_parser.c), for every program on it. */
    {"bad-request", "Malformed HTTP request"},
    {"method-not-implemented", "Method not implemented"},
    {"http-version-not-supported", "HTTP version not supported"},
    {"request-header-too-large", "Request header fields too large"},
    {"request-timeout", "Request not received in time"},
    {"too-many-connections", "Too many connections"},
    {"server-busy", "Server busy"},
    /* orderd. */
    {"unauthorized", "Unauthorized"},
    {"unsupported-media-type", "Unsupported media type"},
    {"idempotency-store-unavailable", "Idempotency store unavailable"},
    {"unknown-product", "Unknown product"},
    {"out-of-stock", "Out of stock"},
    {"order-exists", "Order already exists"},
    {"order-not-found", "Order not found"},
    {"order-not-cancellable", "Order cannot be cancelled"},
    {"outcome-unknown", "Outcome of an earlier attempt unknown"},
    {"payment-declined", "Payment declined"},
    {"order-payment-pending", "The order's payment is not settled yet"},
    {"webhook-signature-invalid", "Webhook signature invalid"},
    {"webhook-invalid", "Webhook body invalid"},
    /* provider-sim. */
    {"provider-unavailable", "Provider unavailable"},
    {"card-declined", "Card declined"},
    {"charge-not-found", "Charge not found"},
    {"charge-not-refundable", "Charge cannot be refunded"},
    {"charge-already-refunded", "Charge already refunded"},
    /* idem-gateway (docs/gateway.md). */
    {"idempotency-key-unrouted", "Idempotency-Key sent where no route keeps records"},
    {"upstream-unavailable", "Upstream unavailable"},
    {"upstream-timeout", "Upstream did not answer in time"},
    {"upstream-bad-reply", "Upstream gave no valid answer"},
    {"upstream-response-too-large", "Upstream answer too large"},
    {"response-not-stored", "Response was not stored"},
    {"record-completed", "Record already completed"},
    /* provider-sim. */
    {"forbidden", "Forbidden"},
};

static const char *title_of(const char *code)
{
    size_t i;

    for (i = 0; i < sizeof titles / sizeof titles[0]; i++) {
        if (strcmp(titles[i].code, code) == 0)
            return titles[i].title;
    }
    return "Error";
}

char *problem_body(int status, const char *code, const char *detail, size_t *len)
{
    return problem_body_ext(status, code, detail, NULL, len);
}

char *problem_body_ext(int status, const char *code, const char *detail, const json_t *extra,
                       size_t *len)
{
    json_t *doc = xcheck(json_object());
    const char *name;
    json_t *value;
    char type[128];
    char *text;

    snprintf(type, sizeof type, "/problems/%s", code);
    json_object_set_new(doc, "type", xcheck(json_string(type)));
    json_object_set_new(doc, "title", xcheck(json_string(title_of(code))));
    json_object_set_new(doc, "status", xcheck(json_integer(status)));
    /* A detail quoting client input may not be UTF-8; say so rather than fail. */
    if (json_object_set_new(doc, "detail", json_string(detail)) != 0)
        json_object_set_new(doc, "detail", xcheck(json_string(title_of(code))));
    json_object_set_new(doc, "code", xcheck(json_string(code)));
    if (extra != NULL)
        json_object_foreach((json_t *)extra, name, value) json_object_set(doc, name, value);
    text = jdoc_text(doc, len);
    json_decref(doc);
    return text;
}
