/* SPDX-License-Identifier: Apache-2.0 */
/*
 * records.c - showing and resolving gateway records (records.h), through libidem only: the
 * resolution is a recovery (idem_call_recover) that either completes the record or forgets it,
 * fenced like any request, so it cannot race a gateway that is forwarding the same key.
 */
#include "records.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ascii.h"
#include "strbuf.h"
#include "util.h"
#include "banned.h"

static json_t *iso_time(int64_t ms)
{
    char ts[ISO8601_LEN + 1];
    iso8601_ms(ms, ts);
    return xcheck(json_string(ts));
}

/* records_show's document of a record that was found, from what the store tells of it. */
static json_t *record_doc(const char *principal, const char *operation, const char *key,
                          const struct idem_record_info *info)
{
    /* A processing record nobody holds is one whose forward ended without an answer. */
    const char *state = info->completed ? "completed" : info->lease_live ? "in-flight" : "unknown";
    json_t *d;

    /* A completed record's last recovery point is history, not where it stands. */
    d = xcheck(json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "principal", principal, "operation",
                         operation, "key", key, "state", state, "recoveryPoint",
                         info->completed ? "" : info->recovery_point, "fingerprint",
                         info->fingerprint_hex));
    json_object_set_new(d, "created", iso_time(info->created_ms));
    json_object_set_new(d, "expires", iso_time(info->expires_ms));
    if (info->completed)
        json_object_set_new(d, "response",
                            xcheck(json_pack("{s:i,s:I}", "status", info->response_status, "bytes",
                                             (json_int_t)info->response_body_len)));
    else if (info->lease_expires_ms > 0) /* a held record may have no lease at all */
        json_object_set_new(d, "leaseExpires", iso_time(info->lease_expires_ms));
    return d;
}

int records_show(struct idem_engine *eng, const char *principal, const char *operation,
                 const char *key, json_t **doc)
{
    struct idem_record_info info;
    int rc;

    *doc = NULL;
    rc = idem_record_inspect(eng, principal, operation, key, &info);
    if (rc < 0)
        return rc;
    if (!info.found)
        return 0;
    *doc = record_doc(principal, operation, key, &info);
    return 1;
}

/* The cursor of a page's last record: "operation\x1fprincipal\x1fkey" in hex (URL-safe). */
static json_t *cursor_of(const struct idem_record_id *id)
{
    struct strbuf raw = STRBUF_INIT, hex = STRBUF_INIT;
    json_t *out;

    strbuf_addf(&raw, "%s\x1f%s\x1f%s", id->operation, id->principal, id->key);
    for (size_t i = 0; i < raw.len; i++)
        strbuf_addf(&hex, "%02x", (unsigned char)raw.buf[i]);
    out = xcheck(json_string(hex.buf ? hex.buf : ""));
    strbuf_release(&raw);
    strbuf_release(&hex);
    return out;
}

/* Copies one part of a scope into `out` (IDEM_SCOPE_PART_MAX + 1 bytes): 0, or -1 if too long. */
static int scope_part(char *out, const char *part)
{
    size_t n = strlen(part);

    if (n > IDEM_SCOPE_PART_MAX)
        return -1;
    memcpy(out, part, n + 1);
    return 0;
}

static int cursor_parse(const char *text, struct idem_record_id *id)
{
    char raw[3 * (IDEM_SCOPE_PART_MAX + 1)];
    size_t n = strlen(text), len = n / 2;
    char *a, *b;

    if (n % 2 != 0 || len >= sizeof raw)
        return -1;
    for (size_t i = 0; i < len; i++) {
        int hi = hex_value(text[2 * i]), lo = hex_value(text[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        raw[i] = (char)(hi * 16 + lo);
    }
    raw[len] = '\0';
    a = memchr(raw, '\x1f', len);
    b = a ? memchr(a + 1, '\x1f', len - (size_t)(a + 1 - raw)) : NULL;
    if (!a || !b || strlen(raw) != len)
        return -1;
    *a = *b = '\0';
    return scope_part(id->operation, raw) || scope_part(id->principal, a + 1) ||
                   scope_part(id->key, b + 1)
               ? -1
               : 0;
}

/*
 * The cursor of a page's last record, `cluster` its store's index among several: with one
 * store, its cursor_of(); else "<cluster>." before it, the clusters listed one after another.
 */
static json_t *cursor_at(size_t cluster, size_t nstores, const struct idem_record_id *id)
{
    json_t *hex = cursor_of(id), *out;
    struct strbuf buf = STRBUF_INIT;

    if (nstores == 1)
        return hex;
    strbuf_addf(&buf, "%zu.%s", cluster, json_string_value(hex));
    out = xcheck(json_string(buf.buf));
    json_decref(hex);
    strbuf_release(&buf);
    return out;
}

/* Reads `after` into *cluster and `cursor` (*has_cursor 0 for none): 0, or -1 when malformed. */
static int after_parse(const char *after, size_t nstores, size_t *cluster,
                       struct idem_record_id *cursor, int *has_cursor)
{
    const char *dot = after ? strchr(after, '.') : NULL;
    char *end = NULL;
    unsigned long long c = 0;

    *cluster = 0;
    *has_cursor = 0;
    if (!after || !after[0])
        return 0;
    if (dot) {
        if (nstores == 1 || dot == after)
            return -1;
        c = strtoull(after, &end, 10);
        if (end != dot || c >= nstores)
            return -1;
        after = dot + 1;
    }
    *cluster = (size_t)c;
    if (cursor_parse(after, cursor) != 0)
        return -1;
    *has_cursor = 1;
    return 0;
}

int records_list(struct idem_store *const *stores, size_t nstores, const char *state,
                 const char *operation, const char *after, int limit, json_t **doc)
{
    struct idem_record_id cursor;
    struct idem_record_listed *recs;
    json_t *list, *next = NULL;
    size_t cluster = 0;
    int has_cursor = 0, got = 0;

    *doc = NULL;
    if (strcmp(state, "unknown") != 0 && strcmp(state, "in-flight") != 0 &&
        strcmp(state, "any") != 0)
        return IDEM_EINVAL;
    if (nstores < 1 || after_parse(after, nstores, &cluster, &cursor, &has_cursor) != 0)
        return IDEM_EINVAL;
    if (limit < 1 || limit > 1000)
        return IDEM_EINVAL;
    recs = xcalloc((size_t)limit, sizeof *recs);
    list = xcheck(json_array());
    /* One cluster after another, each read in cursor order; a page may span two. */
    for (; cluster < nstores && got < limit; cluster++, has_cursor = 0) {
        /* The page and what each record holds in one statement, not one more per record. */
        int n = idem_store_records_unfinished(stores[cluster], operation,
                                              has_cursor ? &cursor : NULL, recs, limit - got);
        if (n < 0) {
            json_decref(list);
            free(recs);
            return n;
        }
        for (int i = 0; i < n; i++) {
            const struct idem_record_id *id = &recs[i].id;
            json_t *rec = record_doc(id->principal, id->operation, id->key, &recs[i].info);

            if (strcmp(state, "any") == 0 ||
                strcmp(json_string_value(json_object_get(rec, "state")), state) == 0)
                json_array_append(list, rec);
            json_decref(rec);
        }
        got += n;
        if (got == limit)
            next = cursor_at(cluster, nstores, &recs[n - 1].id);
    }
    *doc = xcheck(json_pack("{s:o,s:o}", "records", list, "next", next ? next : json_null()));
    free(recs);
    return 0;
}

enum records_result records_resolve(struct idem_engine *eng, const struct idem_operation *op,
                                    const char *principal, const char *key,
                                    const struct records_decision *d, char *err, size_t errlen)
{
    struct idem_call *call = NULL;
    enum idem_outcome outcome = IDEM_OUTCOME_NONE;
    enum records_result res = RECORDS_FAILED;
    int rc;

    rc = idem_call_recover(eng, op, principal, key, &call, &outcome);
    if (rc < 0) {
        snprintf(err, errlen, "the store: %s", idem_strerror(rc));
        return RECORDS_FAILED;
    }
    switch (outcome) {
    case IDEM_OUTCOME_NONE:
        res = RECORDS_NOT_FOUND;
        break;
    case IDEM_OUTCOME_REPLAY:
        res = RECORDS_COMPLETED;
        break;
    case IDEM_OUTCOME_IN_PROGRESS:
        res = RECORDS_IN_FLIGHT;
        break;
    case IDEM_OUTCOME_RESUME:
        if (d->executed)
            rc = idem_call_complete(call, d->status, d->headers, d->nheaders, d->body, d->body_len);
        else
            rc = idem_call_forget(call);
        if (rc == 0) {
            res = RECORDS_RESOLVED;
        } else {
            snprintf(err, errlen, "%s", idem_call_errmsg(call));
            res = rc == IDEM_ELEASE ? RECORDS_IN_FLIGHT : RECORDS_FAILED;
        }
        break;
    default:
        snprintf(err, errlen, "unexpected engine outcome %d", (int)outcome);
        break;
    }
    idem_call_end(call);
    return res;
}

const struct idem_operation *records_find_op(const struct gw_config *cfg,
                                             const struct idem_operation *ops, const char *name)
{
    for (size_t i = 0; i < cfg->nroutes; i++)
        if (strcmp(cfg->routes[i].operation, name) == 0)
            return &ops[i];
    return NULL;
}
