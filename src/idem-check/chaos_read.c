/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chaos_read.c - what the chaos audit reads from orderd and provider-sim, in answers of bounded
 * size, so that the audit of 100,000 intents needs no more memory per read than that of 300: the
 * user's orders through orderd's cursor pages (GET /api/orders), the ledger's totals
 * (GET /v1/ledger?keys=0, no per-key or per-reference map), and the charges and confirmation
 * emails of each order through provider-sim's per-reference pages (GET /v1/ledger/references,
 * keyset by reference).  Of every page only what the audit needs stays: one struct ck_order per
 * order.  A read that fails says which request, what came back and how large, so a verdict never
 * blames the service for what the checker could not read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chaos.h"
#include "banned.h"

#define READ_TIMEOUT_MS 10000
#define READ_ATTEMPTS 3
#define READ_PAUSE_MS 200
#define PAGES_MAX 10000000L /* a runaway listing stops here */
#define CONFIRMATION "order_confirmation:"

/* `r`, which did not give a 200 with a body within the limit, as a sentence into `why`. */
static void describe_failure(const char *url, const struct ck_response *r, char *why, size_t cap)
{
    char what[600];

    if (r->body.dropped > 0) {
        snprintf(why, cap, "GET %s: an answer of %zu bytes, over idem-check's limit of %zu", url,
                 r->body.sb.len + r->body.dropped, ck_body_limit());
        return;
    }
    ck_response_describe(r, what, sizeof(what));
    if (r->transport_failed)
        snprintf(why, cap, "GET %s: %s", url, what);
    else
        snprintf(why, cap, "GET %s answered %ld (%zu bytes): %s", url, r->status, r->body.sb.len,
                 what);
}

json_t *ck_get_json(struct chaos *cx, const char *url, const char *token, char *why, size_t cap)
{
    struct ck_request rq;
    struct ck_response rs;
    json_t *doc = NULL;
    json_error_t err;
    char who[512];
    int attempt;

    memset(&rq, 0, sizeof(rq));
    rq.method = "GET";
    rq.url = url;
    if (token) {
        snprintf(who, sizeof(who), "Authorization: Bearer %s", token);
        rq.who = who;
    }
    for (attempt = 1; attempt <= READ_ATTEMPTS; attempt++) {
        ck_http_perform(&rq, &rs, 1, READ_TIMEOUT_MS);
        if (rs.body.sb.len + rs.body.dropped > cx->largest_answer)
            cx->largest_answer = rs.body.sb.len + rs.body.dropped;
        if (rs.status == 200 && rs.body.dropped == 0) {
            snprintf(err.text, sizeof(err.text), "an empty body");
            doc = rs.body.sb.buf ? json_loadb(rs.body.sb.buf, rs.body.sb.len, 0, &err) : NULL;
            if (!json_is_object(doc))
                snprintf(why, cap, "GET %s: 200, but %zu bytes that are not a JSON object (%s)",
                         url, rs.body.sb.len, doc ? "another JSON value" : err.text);
            ck_response_release(&rs);
            break;
        }
        describe_failure(url, &rs, why, cap);
        ck_response_release(&rs);
        if (!(rs.transport_failed || rs.status >= 500) || attempt == READ_ATTEMPTS)
            break;
        clock_sleep_ms(READ_PAUSE_MS);
    }
    if (json_is_object(doc))
        return doc;
    json_decref(doc);
    return NULL;
}

static int cmp_order(const void *a, const void *b)
{
    return strcmp(((const struct ck_order *)a)->id, ((const struct ck_order *)b)->id);
}

static int cmp_id(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

struct ck_order *ck_find_order(struct ck_order *rows, size_t n, const char *id)
{
    struct ck_order key;

    if (n == 0 || strlen(id) >= sizeof(key.id))
        return NULL;
    memcpy(key.id, id, strlen(id) + 1);
    return bsearch(&key, rows, n, sizeof(*rows), cmp_order);
}

/* One page of orders into *rows (growing it); its nextCursor into `cursor` ("" at the end).  0
 * or -1 with `why`. */
static int orders_page(struct chaos *cx, int user, const char *url, struct ck_order **rows,
                       size_t *n, size_t *cap, char *cursor, size_t cursor_cap, char *why,
                       size_t why_cap)
{
    json_t *doc = ck_get_json(cx, url, cx->users[user].token, why, why_cap);
    json_t *arr = json_object_get(doc, "orders"), *o;
    char escaped[1024];
    const char *next;
    size_t i;

    if (!json_is_array(arr)) {
        if (doc)
            snprintf(why, why_cap, "GET %s: 200, but no \"orders\" array", url);
        json_decref(doc);
        return -1;
    }
    cx->order_pages++;
    json_array_foreach(arr, i, o)
    {
        const char *id = json_string_value(json_object_get(o, "orderId"));
        const char *status = json_string_value(json_object_get(o, "status"));
        struct ck_order *r;
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 256;
            *rows = xrealloc(*rows, *cap * sizeof(**rows));
        }
        r = &(*rows)[(*n)++];
        memset(r, 0, sizeof(*r));
        r->user = user;
        snprintf(r->id, sizeof(r->id), "%s", id ? id : "");
        r->pending = status && strcmp(status, "pending_payment") == 0;
        r->paid = status && strcmp(status, "paid") == 0;
        r->failed = status && strcmp(status, "payment_failed") == 0;
    }
    next = json_string_value(json_object_get(doc, "nextCursor"));
    if (!next || json_array_size(arr) == 0) {
        cursor[0] = '\0';
    } else if (ck_url_escape(next, escaped, sizeof(escaped)) < 0 || !escaped[0] ||
               strcmp(escaped, cursor) == 0 || strlen(escaped) >= cursor_cap) {
        snprintf(why, why_cap, "GET %s: a nextCursor that does not move on (%zu bytes)", url,
                 strlen(next));
        json_decref(doc);
        return -1;
    } else {
        memcpy(cursor, escaped, strlen(escaped) + 1);
    }
    json_decref(doc);
    return 0;
}

struct ck_order *ck_list_orders(struct chaos *cx, size_t *n_out, char *why, size_t cap)
{
    struct ck_order *rows = NULL;
    size_t n = 0, rows_cap = 0, i;
    long limit = cx->o.page_size < CK_ORDERS_PAGE_MAX ? cx->o.page_size : CK_ORDERS_PAGE_MAX;
    long pages = 0;
    char cursor[1024] = "";
    char url[1200];
    int u;

    for (u = 0; u < cx->n_users; u++) {
        long user_pages = 0;
        cursor[0] = '\0';
        do {
            snprintf(url, sizeof(url), "%s/api/orders?limit=%ld%s%s", cx->inst[0].url, limit,
                     cursor[0] ? "&cursor=" : "", cursor);
            if (orders_page(cx, u, url, &rows, &n, &rows_cap, cursor, sizeof(cursor), why, cap) <
                0) {
                free(rows);
                return NULL;
            }
            user_pages++;
            ck_audit_progress(cx, "audit: the users' orders, page %ld (%zu orders)", ++pages, n);
        } while (cursor[0] && user_pages < PAGES_MAX);
    }
    if (n)
        qsort(rows, n, sizeof(*rows), cmp_order);
    for (i = 0; i < n; i++) /* the orders that were there before the run */
        rows[i].before = cx->n_before > 0 && bsearch(rows[i].id, cx->before_ids, cx->n_before,
                                                     sizeof(*cx->before_ids), cmp_id) != NULL;
    *n_out = n;
    return rows ? rows : xmalloc(1);
}

static long int_at(json_t *doc, const char *a, const char *b)
{
    json_t *x = json_object_get(doc, a);
    return x ? (long)json_integer_value(json_object_get(x, b)) : 0;
}

int ck_read_ledger(struct chaos *cx, struct ck_ledger *l, char *why, size_t cap)
{
    char url[192];
    json_t *doc, *bt, *hooks, *deliv;

    snprintf(url, sizeof(url), "%s/v1/ledger?keys=0", cx->provider_url);
    doc = ck_get_json(cx, url, NULL, why, cap);
    if (!doc)
        return -1;
    memset(l, 0, sizeof(*l));
    l->charges = int_at(doc, "charges", "succeeded");
    bt = json_object_get(json_object_get(doc, "emails"), "byTemplate");
    l->emails = bt ? (long)json_integer_value(json_object_get(bt, "order_confirmation")) : 0;
    l->dups = (long)json_array_size(json_object_get(doc, "duplicates"));
    l->failed5xx = int_at(doc, "requests", "failed5xx");
    l->lost_responses = int_at(doc, "requests", "lostResponses");
    hooks = json_object_get(doc, "webhooks");
    deliv = json_object_get(hooks, "deliveries");
    l->webhooks_configured = json_is_true(json_object_get(hooks, "configured"));
    l->events = (long)json_integer_value(json_object_get(hooks, "events"));
    l->delivered = (long)json_integer_value(json_object_get(deliv, "delivered"));
    l->pending = (long)json_integer_value(json_object_get(deliv, "pending"));
    l->abandoned = (long)json_integer_value(json_object_get(deliv, "abandoned"));
    json_decref(doc);
    return 0;
}

/* The counts of one page's entries into the orders they name; 0, or -1 if it is not a page. */
static int refs_into(json_t *data, int emails, struct ck_order *rows, size_t n)
{
    json_t *item;
    size_t i;

    if (!json_is_array(data))
        return -1;
    json_array_foreach(data, i, item)
    {
        const char *ref = json_string_value(json_object_get(item, "reference"));
        struct ck_order *o;
        if (!ref)
            return -1;
        if (emails && strncmp(ref, CONFIRMATION, strlen(CONFIRMATION)) != 0)
            continue; /* another template's emails */
        o = ck_find_order(rows, n, emails ? ref + strlen(CONFIRMATION) : ref);
        if (!o)
            continue; /* another user's, or from before the run */
        if (emails)
            o->emails = (long)json_integer_value(json_object_get(item, "count"));
        else
            o->charges = (long)json_integer_value(json_object_get(item, "succeeded"));
    }
    return 0;
}

/* Every page of one kind ("charges" or "emails") into `rows`; 0 or -1 with `why`. */
static int read_kind(struct chaos *cx, const char *kind, struct ck_order *rows, size_t n, char *why,
                     size_t cap)
{
    char after[3 * 1024 + 1] = "", next_after[sizeof(after)], url[sizeof(after) + 256];
    long pages = 0;
    int more, have_after = 0;
    json_t *doc;

    do {
        const char *next;
        snprintf(url, sizeof(url), "%s/v1/ledger/references?kind=%s&limit=%ld%s%s",
                 cx->provider_url, kind, cx->o.page_size, have_after ? "&after=" : "", after);
        doc = ck_get_json(cx, url, NULL, why, cap);
        if (!doc)
            return -1;
        if (refs_into(json_object_get(doc, "data"), strcmp(kind, "emails") == 0, rows, n) < 0) {
            snprintf(why, cap, "GET %s: 200, but not a page of references", url);
            json_decref(doc);
            return -1;
        }
        cx->ledger_pages++;
        pages++;
        more = json_is_true(json_object_get(doc, "hasMore"));
        next = json_string_value(json_object_get(doc, "nextAfter"));
        if (more && (!next || ck_url_escape(next, next_after, sizeof(next_after)) < 0 ||
                     (have_after && strcmp(next_after, after) == 0))) {
            snprintf(why, cap, "GET %s: hasMore, but no nextAfter that moves on", url);
            json_decref(doc);
            return -1;
        }
        json_decref(doc);
        if (more) {
            memcpy(after, next_after, strlen(next_after) + 1);
            have_after = 1;
        }
        ck_audit_progress(cx, "audit: the ledger's %s by order, page %ld", kind, pages);
    } while (more && pages < PAGES_MAX);
    return 0;
}

int ck_read_refs(struct chaos *cx, struct ck_order *rows, size_t n, char *why, size_t cap)
{
    size_t i;

    for (i = 0; i < n; i++)
        rows[i].charges = rows[i].emails = 0;
    if (read_kind(cx, "charges", rows, n, why, cap) < 0 ||
        read_kind(cx, "emails", rows, n, why, cap) < 0)
        return -1;
    return 0;
}
