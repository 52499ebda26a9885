/*
 * response.c - building responses and problem documents.  Titles live in one table keyed by the
 * stable code, so the same code always carries the same title wherever it is raised, and a
 * client can switch on `code` alone.
 */
#include "response.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"
#include "banned.h"

static const struct {
    const char *code;
    const char *title;
} titles[] = {
    {"not-found", "Not found"},
    {"method-not-allowed", "Method not allowed"},
    {"unauthorized", "Unauthorized"},
    {"unsupported-media-type", "Unsupported media type"},
    {"body-too-large", "Request body too large"},
    {"idempotency-key-missing", "Idempotency-Key header missing"},
    {"idempotency-key-invalid", "Idempotency-Key header invalid"},
    {"idempotency-key-reused", "Idempotency-Key reused with a different request"},
    {"idempotency-request-in-progress", "A request with this Idempotency-Key is in progress"},
    {"idempotency-store-unavailable", "Idempotency store unavailable"},
    {"invalid-json", "Body is not valid JSON"},
    {"validation-failed", "Validation failed"},
    {"unknown-product", "Unknown product"},
    {"out-of-stock", "Out of stock"},
    {"order-not-found", "Order not found"},
    {"order-not-cancellable", "Order cannot be cancelled"},
    {"internal-error", "Internal server error"},
    {"outcome-unknown", "Outcome of the payment step unknown"},
    {"payment-declined", "Payment declined"},
    {"order-payment-pending", "The order's payment is not settled yet"},
    {"webhook-signature-invalid", "Webhook signature invalid"},
    {"webhook-invalid", "Webhook body invalid"},
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

void response_init(struct response *r)
{
    memset(r, 0, sizeof *r);
    r->status = 500;
    r->operation = "other";
}

void response_clear(struct response *r)
{
    size_t i;

    free(r->body);
    for (i = 0; i < r->nheaders; i++) {
        free(r->headers[i].name);
        free(r->headers[i].value);
    }
    free(r->principal);
    memset(r, 0, sizeof *r);
}

void response_set_header(struct response *r, const char *name, const char *value)
{
    size_t i;

    for (i = 0; i < r->nheaders; i++) {
        if (strcasecmp(r->headers[i].name, name) == 0)
            break;
    }
    if (i == r->nheaders) {
        if (r->nheaders == RESPONSE_MAX_HEADERS)
            die("too many response headers");
        r->headers[i].name = xstrdup(name);
        r->nheaders++;
    } else {
        free(r->headers[i].value);
    }
    r->headers[i].value = xstrdup(value);
}

const char *response_header(const struct response *r, const char *name)
{
    size_t i;

    for (i = 0; i < r->nheaders; i++) {
        if (strcasecmp(r->headers[i].name, name) == 0)
            return r->headers[i].value;
    }
    return NULL;
}

void response_set_body(struct response *r, const void *body, size_t len)
{
    free(r->body);
    r->body = NULL;
    r->body_len = 0;
    if (len > 0) {
        r->body = xmalloc(len);
        memcpy(r->body, body, len);
        r->body_len = len;
    }
}

char *json_text(const json_t *doc, size_t *len)
{
    char *text = xcheck(json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER));

    *len = strlen(text);
    return text;
}

void response_json(struct response *r, int status, const json_t *doc)
{
    free(r->body);
    r->status = status;
    r->body = json_text(doc, &r->body_len);
    response_set_header(r, "Content-Type", CONTENT_TYPE_JSON);
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
    text = json_text(doc, len);
    json_decref(doc);
    return text;
}

void response_problem(struct response *r, int status, const char *code, const char *detail)
{
    response_problem_ext(r, status, code, detail, NULL);
}

void response_problem_ext(struct response *r, int status, const char *code, const char *detail,
                          const json_t *extra)
{
    free(r->body);
    r->status = status;
    r->body = problem_body_ext(status, code, detail, extra, &r->body_len);
    response_set_header(r, "Content-Type", CONTENT_TYPE_PROBLEM);
}
