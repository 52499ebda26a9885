/* SPDX-License-Identifier: Apache-2.0 */
/*
 * conformance.c - the checklist of `idem-check conformance`: the HTTP semantics of
 * docs/http-api.md, checked from the outside against any API that takes an Idempotency-Key.
 * It assumes nothing beyond the endpoint, one valid body and two callers (bearer tokens, or the
 * header an idem-gateway takes its principal from); every key is
 * fresh and random, so a run can be repeated against the same server.  Each check records what
 * it expected and the response it rests on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check.h"
#include "banned.h"

/* Everything the checks share: the options, the keys of this run and what was seen. */
struct run {
    const struct ck_conformance_options *opt;
    struct ck_report *rep;
    char *target;    /* url + path */
    char *key_first; /* the key of the first request, its replays and user 2's */
    int have_first;
    struct ck_response first;
    size_t seen_409;
    size_t seen_409_without_retry_after;
    char first_409_evidence[400];
    char first_409_bad_evidence[400];
};

/* Every response passes here so that the Retry-After check covers all 409s of the run. */
static void note(struct run *run, const struct ck_response *r)
{
    char ra[64];
    if (r->status != 409)
        return;
    run->seen_409++;
    if (run->seen_409 == 1)
        ck_response_describe(r, run->first_409_evidence, sizeof(run->first_409_evidence));
    if (!ck_response_header(r, "Retry-After", ra, sizeof(ra)) || ra[0] == '\0') {
        if (run->seen_409_without_retry_after++ == 0)
            ck_response_describe(r, run->first_409_bad_evidence,
                                 sizeof(run->first_409_bad_evidence));
    }
}

static void post(struct run *run, const char *who, const char *body, const char *key_line,
                 const char *extra_line, struct ck_response *out)
{
    struct ck_request req = {.method = "POST",
                             .url = run->target,
                             .who = who,
                             .body = body,
                             .body_len = body ? strlen(body) : 0};
    if (key_line)
        req.headers[req.n_headers++] = key_line;
    if (extra_line)
        req.headers[req.n_headers++] = extra_line;
    ck_http_perform(&req, out, 1, run->opt->timeout_ms);
    note(run, out);
}

static char *key_line(const char *key)
{
    size_t n = strlen("Idempotency-Key: ") + strlen(key) + 1;
    char *line = xmalloc(n);
    snprintf(line, n, "Idempotency-Key: %s", key);
    return line;
}

static int is_2xx(const struct ck_response *r)
{
    return r->status >= 200 && r->status < 300;
}

/* ---- bodies derived from --body ------------------------------------------------------------ */

static json_t *reversed(const json_t *v)
{
    if (json_is_object(v)) {
        const char **keys;
        size_t n = json_object_size(v), i = 0;
        const char *k;
        json_t *m;
        json_t *out = json_object();
        keys = xmalloc((n ? n : 1) * sizeof(*keys));
        json_object_foreach((json_t *)v, k, m) keys[i++] = k;
        while (i > 0) {
            i--;
            json_object_set_new(out, keys[i], reversed(json_object_get(v, keys[i])));
        }
        free(keys);
        return out;
    }
    if (json_is_array(v)) {
        json_t *out = json_array();
        for (size_t i = 0; i < json_array_size(v); i++)
            json_array_append_new(out, reversed(json_array_get(v, i)));
        return out;
    }
    return json_deep_copy(v);
}

/* The same JSON value written differently: members in reverse order, indented.  New, or NULL. */
static char *reordered_body(const char *body)
{
    json_t *v = json_loads(body, JSON_DECODE_ANY, NULL);
    json_t *r = v ? reversed(v) : NULL;
    char *text = r ? json_dumps(r, JSON_INDENT(3) | JSON_ENCODE_ANY) : NULL;
    char *out = NULL;

    if (text) {
        size_t n = strlen(text) + 3;
        out = xmalloc(n);
        snprintf(out, n, " %s\n", text);
    }
    free(text);
    json_decref(r);
    json_decref(v);
    return out;
}

/* Another request: --body with one more member, idemCheckNonce.  NULL unless an object. */
static char *different_body(const char *body)
{
    json_t *v = json_loads(body, 0, NULL);
    char *nonce = ck_random_key();
    char *out = NULL;

    if (json_is_object(v)) {
        json_object_set_new(v, "idemCheckNonce", json_string(nonce));
        out = json_dumps(v, JSON_COMPACT);
    }
    free(nonce);
    json_decref(v);
    return out;
}

/* ---- counting effects through --count-url ------------------------------------------------- */

/*
 * The count of effects in a --count-url answer: the response itself if it is an array or a
 * number, else its first member (in document order) that is an array, else its first that is a
 * number.  New reference, or NULL with `why` set.
 */
static json_t *fetch_count(struct run *run, char *why, size_t cap)
{
    struct ck_request req = {.method = "GET", .url = run->opt->count_url, .who = run->opt->who};
    struct ck_response r;
    json_t *doc = NULL, *found = NULL;

    ck_http_perform(&req, &r, 1, run->opt->timeout_ms);
    if (r.status != 200) {
        char ev[400];
        ck_response_describe(&r, ev, sizeof(ev));
        snprintf(why, cap, "GET --count-url: %s", ev);
        goto out;
    }
    doc = json_loadb(r.body.sb.buf ? r.body.sb.buf : "", r.body.sb.len, JSON_DECODE_ANY, NULL);
    if (json_is_array(doc) || json_is_number(doc)) {
        found = json_incref(doc);
    } else if (json_is_object(doc)) {
        const char *k;
        json_t *m;
        json_object_foreach(doc, k, m) if (!found && json_is_array(m)) found = json_incref(m);
        json_object_foreach(doc, k, m) if (!found && json_is_number(m)) found = json_incref(m);
    }
    if (!found)
        snprintf(why, cap, "GET --count-url: no array or number in the JSON answer");
out:
    json_decref(doc);
    ck_response_release(&r);
    return found;
}

/*
 * New effects between two counts: the difference of two numbers, or the elements of `after` that
 * are equal to none of `before` (so a paginated, newest-first list still counts right).
 */
static long effects_between(const json_t *before, const json_t *after)
{
    long n = 0;
    if (json_is_number(before) && json_is_number(after))
        return (long)(json_number_value(after) - json_number_value(before));
    if (!json_is_array(before) || !json_is_array(after))
        return -1000000;
    for (size_t i = 0; i < json_array_size(after); i++) {
        int old = 0;
        for (size_t j = 0; !old && j < json_array_size(before); j++)
            old = json_equal(json_array_get(after, i), json_array_get(before, j));
        n += !old;
    }
    return n;
}

/* ---- the checks -------------------------------------------------------------------------- */

static void check_invalid_key(struct run *run, const char *id, const char *title, const char *line1,
                              const char *line2)
{
    struct ck_response r;
    char ev[400];

    post(run, run->opt->who, run->opt->body, line1, line2, &r);
    ck_response_describe(&r, ev, sizeof(ev));
    ck_report_add(run->rep, id, title, r.status == 400 ? CK_PASS : CK_FAIL, "%s%s", ev,
                  is_2xx(&r) ? " (executed with an invalid key)" : "");
    ck_response_release(&r);
}

static void check_invalid_keys(struct run *run)
{
    char long_key[256 + 32];
    char *fresh = ck_random_key();
    char ctl_line[128];
    char *dup1 = key_line(fresh);
    char *other = ck_random_key();
    char *dup2 = key_line(other);

    /* curl sends "Name;" as a header with an empty value. */
    check_invalid_key(run, "key-empty", "empty Idempotency-Key -> 400", "Idempotency-Key;", NULL);
    snprintf(long_key, sizeof(long_key), "Idempotency-Key: ");
    {
        size_t at = strlen(long_key);
        for (size_t i = 0; i < 256; i++)
            long_key[at + i] = (char)('a' + (int)(i % 26));
        long_key[at + 256] = '\0';
    }
    check_invalid_key(run, "key-too-long", "256-character Idempotency-Key -> 400", long_key, NULL);
    snprintf(ctl_line, sizeof(ctl_line), "Idempotency-Key: %.20s\x01x", fresh);
    /* Most HTTP parsers refuse a control byte in any header, so this 400 may say nothing of the
     * API's own key check; the unterminated quote below is a header every parser passes on. */
    check_invalid_key(run, "key-control-char",
                      "Idempotency-Key with a control character -> 400 (from any layer)", ctl_line,
                      NULL);
    snprintf(ctl_line, sizeof(ctl_line), "Idempotency-Key: \"%.20s", fresh);
    check_invalid_key(run, "key-unterminated",
                      "Idempotency-Key \"k (a quote not closed; valid HTTP) -> 400 from the API",
                      ctl_line, NULL);
    check_invalid_key(run, "key-twice", "two Idempotency-Key headers -> 400", dup1, dup2);
    free(dup1);
    free(dup2);
    free(fresh);
    free(other);
}

static void check_first(struct run *run)
{
    char *line = key_line(run->key_first);
    char ev[400];

    post(run, run->opt->who, run->opt->body, line, NULL, &run->first);
    ck_response_describe(&run->first, ev, sizeof(ev));
    run->have_first = is_2xx(&run->first);
    ck_report_add(run->rep, "first-request", "valid body with a fresh key -> 2xx",
                  run->have_first ? CK_PASS : CK_FAIL, "%s", ev);
    free(line);
}

/* A replay of the first request: same status and body; the marker missing is only a WARN. */
static void judge_replay(struct run *run, const char *id, const char *title, const char *body)
{
    struct ck_response r;
    char *line;
    char ev[400];

    if (!run->have_first) {
        ck_report_add(run->rep, id, title, CK_SKIP, "the first request did not succeed");
        return;
    }
    line = key_line(run->key_first);
    post(run, run->opt->who, body, line, NULL, &r);
    ck_response_describe(&r, ev, sizeof(ev));
    if (!ck_response_same(&r, &run->first))
        ck_report_add(run->rep, id, title, CK_FAIL,
                      "status or body differs from the first response (HTTP %ld, %zu bytes): %s",
                      run->first.status, run->first.body.sb.len, ev);
    else if (!ck_response_replayed(&r))
        ck_report_add(run->rep, id, title, CK_WARN,
                      "byte-identical, but no 'Idempotent-Replayed: true': %s", ev);
    else
        ck_report_add(run->rep, id, title, CK_PASS, "%s", ev);
    ck_response_release(&r);
    free(line);
}

static void check_different_body(struct run *run)
{
    static const char title[] = "same key, different body -> 422, not executed";
    char *body = different_body(run->opt->body);
    char *line = key_line(run->key_first);
    struct ck_response r;
    char ev[400];

    if (!run->have_first || !body) {
        ck_report_add(run->rep, "different-body", title, CK_SKIP, "%s",
                      body ? "the first request did not succeed" : "--body is not a JSON object");
        goto out;
    }
    post(run, run->opt->who, body, line, NULL, &r);
    ck_response_describe(&r, ev, sizeof(ev));
    if (r.status == 422)
        ck_report_add(run->rep, "different-body", title, CK_PASS, "%s", ev);
    else if (r.status >= 400 && r.status < 500)
        ck_report_add(run->rep, "different-body", title, CK_WARN, "refused, but not with 422: %s",
                      ev);
    else
        ck_report_add(run->rep, "different-body", title, CK_FAIL, "%s%s", ev,
                      is_2xx(&r) ? " (answered a different request under a used key)" : "");
    ck_response_release(&r);
out:
    free(body);
    free(line);
}

static void check_other_scope(struct run *run)
{
    static const char title[] = "user 2, user 1's key -> executes for user 2, no replay";
    char *line = key_line(run->key_first);
    struct ck_response r;
    char ev[400];

    if (!run->have_first) {
        ck_report_add(run->rep, "other-user-scope", title, CK_SKIP,
                      "the first request did not succeed");
        free(line);
        return;
    }
    post(run, run->opt->who2, run->opt->body, line, NULL, &r);
    ck_response_describe(&r, ev, sizeof(ev));
    if (!is_2xx(&r))
        ck_report_add(run->rep, "other-user-scope", title, CK_FAIL, "%s", ev);
    else if (ck_response_same(&r, &run->first))
        ck_report_add(run->rep, "other-user-scope", title, CK_FAIL,
                      "user 1's response came back to user 2: %s", ev);
    else if (ck_response_replayed(&r))
        ck_report_add(run->rep, "other-user-scope", title, CK_FAIL,
                      "marked as a replay on its first use by user 2: %s", ev);
    else
        ck_report_add(run->rep, "other-user-scope", title, CK_PASS, "%s", ev);
    ck_response_release(&r);
    free(line);
}

/* The same key once more after the storm, waiting out 409s: the stored answer, if any. */
static void after_storm(struct run *run, const char *line, struct ck_response *r)
{
    for (int attempt = 0; attempt < 6; attempt++) {
        char ra[32];
        long wait_ms = 500;
        post(run, run->opt->who, run->opt->body, line, NULL, r);
        if (r->status != 409)
            return;
        if (ck_response_header(r, "Retry-After", ra, sizeof(ra)) && atol(ra) > 0)
            wait_ms = atol(ra) > 3 ? 3000 : atol(ra) * 1000;
        ck_response_release(r);
        clock_sleep_ms(wait_ms);
    }
}

static void check_storm(struct run *run)
{
    static const char title[] = "parallel same-key requests -> one execution, others replay or 409";
    size_t n = (size_t)run->opt->storm;
    struct ck_request *reqs = xmalloc(n * sizeof(*reqs));
    struct ck_response *rs = xmalloc(n * sizeof(*rs));
    char *key = ck_random_key();
    char *line = key_line(key);
    json_t *before = NULL, *after = NULL;
    const struct ck_response *winner = NULL;
    struct ck_response again;
    size_t n2xx = 0, n409 = 0, n409_bad = 0, unmarked = 0, distinct = 0, other = 0;
    char why[512] = "", ev[400], odd[400] = "",
         counted[200] = "effects not counted (no --count-url)";
    enum ck_verdict v = CK_PASS;
    long effects = 0;
    int sent = 0;

    memset(&again, 0, sizeof(again));
    if (run->opt->count_url) {
        before = fetch_count(run, why, sizeof(why));
        if (!before) {
            ck_report_add(run->rep, "storm", title, CK_FAIL, "%s", why);
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) {
        reqs[i] = (struct ck_request){.method = "POST",
                                      .url = run->target,
                                      .who = run->opt->who,
                                      .body = run->opt->body,
                                      .body_len = strlen(run->opt->body)};
        reqs[i].headers[reqs[i].n_headers++] = line;
    }
    ck_http_perform(reqs, rs, n, run->opt->timeout_ms);
    sent = 1;
    for (size_t i = 0; i < n; i++) {
        char ra[32];
        note(run, &rs[i]);
        if (is_2xx(&rs[i])) {
            n2xx++;
            unmarked += !ck_response_replayed(&rs[i]);
            if (!winner)
                winner = &rs[i];
            else if (!ck_response_same(winner, &rs[i]))
                distinct++;
        } else if (rs[i].status == 409) {
            n409++;
            n409_bad += !ck_response_header(&rs[i], "Retry-After", ra, sizeof(ra));
        } else if (other++ == 0) {
            ck_response_describe(&rs[i], odd, sizeof(odd));
        }
    }
    after_storm(run, line, &again);
    if (!winner && is_2xx(&again))
        winner = &again;
    if (run->opt->count_url) {
        after = fetch_count(run, why, sizeof(why));
        effects = after ? effects_between(before, after) : 0;
        if (!after)
            snprintf(counted, sizeof(counted), "%.190s", why);
        else
            snprintf(counted, sizeof(counted),
                     "%ld new effect(s) counted for the %zu same-key requests (expected 1)",
                     effects, n + 1);
    }
    ck_response_describe(winner ? winner : &again, ev, sizeof(ev));

    if (distinct || other || n409_bad || !winner || !ck_response_same(winner, &again) ||
        (run->opt->count_url && (!after || effects != 1)))
        v = CK_FAIL;
    else if (unmarked > 1)
        v = CK_WARN;
    ck_report_add(
        run->rep, "storm", title, v,
        "%zu sent: %zu 2xx (%zu unmarked, %zu differing from the first), %zu 409 "
        "(%zu without Retry-After), %zu other%s%s; then the same key once more: HTTP %ld%s; %s; "
        "first 2xx: %s",
        n, n2xx, unmarked, distinct, n409, n409_bad, other, other ? ": " : "", odd, again.status,
        winner && ck_response_same(winner, &again) ? " (same answer)" : " (differs)", counted, ev);
out:
    for (size_t i = 0; sent && i < n; i++)
        ck_response_release(&rs[i]);
    ck_response_release(&again);
    json_decref(before);
    json_decref(after);
    free(reqs);
    free(rs);
    free(line);
    free(key);
}

static void check_validation_not_stored(struct run *run)
{
    static const char title[] = "invalid body -> 4xx, not stored: valid body, same key -> 2xx";
    char *key = ck_random_key();
    char *line = key_line(key);
    struct ck_response bad, good;
    char ev1[400], ev2[400];

    post(run, run->opt->who, run->opt->invalid_body, line, NULL, &bad);
    ck_response_describe(&bad, ev1, sizeof(ev1));
    if (bad.status < 400 || bad.status >= 500) {
        ck_report_add(run->rep, "validation-not-stored", title, is_2xx(&bad) ? CK_SKIP : CK_FAIL,
                      "the invalid body (--invalid-body) was not refused with a 4xx: %s", ev1);
        ck_response_release(&bad);
        goto out;
    }
    post(run, run->opt->who, run->opt->body, line, NULL, &good);
    ck_response_describe(&good, ev2, sizeof(ev2));
    if (is_2xx(&good) && !ck_response_replayed(&good))
        ck_report_add(run->rep, "validation-not-stored", title, CK_PASS, "invalid: %s; valid: %s",
                      ev1, ev2);
    else
        ck_report_add(run->rep, "validation-not-stored", title, CK_FAIL,
                      "invalid: %s; valid, same key: %s%s", ev1, ev2,
                      ck_response_same(&bad, &good) ? " (the validation error was replayed)" : "");
    ck_response_release(&bad);
    ck_response_release(&good);
out:
    free(line);
    free(key);
}

static void check_retry_after(struct run *run)
{
    static const char title[] = "every 409 carries Retry-After";
    if (run->seen_409 == 0)
        ck_report_add(run->rep, "retry-after-409", title, CK_SKIP, "no 409 was seen in this run");
    else if (run->seen_409_without_retry_after)
        ck_report_add(run->rep, "retry-after-409", title, CK_FAIL,
                      "%zu of %zu 409s without Retry-After, e.g. %s",
                      run->seen_409_without_retry_after, run->seen_409,
                      run->first_409_bad_evidence);
    else
        ck_report_add(run->rep, "retry-after-409", title, CK_PASS, "%zu 409(s), all with it: %s",
                      run->seen_409, run->first_409_evidence);
}

int ck_conformance_run(const struct ck_conformance_options *opt, struct ck_report *rep, char *why,
                       size_t why_cap)
{
    struct run run;
    struct ck_response r;
    size_t n;
    char ev[400];
    int rc = 0;

    memset(&run, 0, sizeof(run));
    run.opt = opt;
    run.rep = rep;
    n = strlen(opt->url) + strlen(opt->path) + 1;
    run.target = xmalloc(n);
    snprintf(run.target, n, "%.*s%s",
             (int)(strlen(opt->url) - (opt->url[0] && opt->url[strlen(opt->url) - 1] == '/')),
             opt->url, opt->path);
    run.key_first = ck_random_key();

    /* The first exchange is also the reachability probe: no answer at all is exit 3. */
    post(&run, opt->who, opt->body, NULL, NULL, &r);
    if (r.transport_failed) {
        snprintf(why, why_cap, "POST %s: %s", run.target, r.error);
        ck_response_release(&r);
        rc = CK_EXIT_UNREACHABLE;
        goto out;
    }
    ck_response_describe(&r, ev, sizeof(ev));
    if (r.status == 401 || r.status == 403) {
        /* Every later check would be judged on refusals: say what is wrong instead. */
        ck_report_add(rep, "caller", "the API accepts user 1 as a caller", CK_FAIL,
                      "%s: check --token / --header (for an idem-gateway, the header or token its "
                      "principal is read from); no other check was run",
                      ev);
        ck_response_release(&r);
        goto out;
    }
    ck_report_add(rep, "missing-key", "POST without Idempotency-Key -> 400",
                  r.status == 400 ? CK_PASS : CK_FAIL, "%s%s", ev,
                  is_2xx(&r) ? " (executed without a key)" : "");
    ck_response_release(&r);

    check_invalid_keys(&run);
    check_first(&run);
    judge_replay(&run, "replay", "same key, same bytes -> same status and body, replay marker",
                 opt->body);
    {
        char *body = reordered_body(opt->body);
        if (body)
            judge_replay(&run, "replay-reordered",
                         "same key, JSON reordered and re-spaced -> still a replay", body);
        else
            ck_report_add(rep, "replay-reordered",
                          "same key, JSON reordered and re-spaced -> still a replay", CK_SKIP,
                          "--body is not JSON");
        free(body);
    }
    check_different_body(&run);
    check_other_scope(&run);
    check_storm(&run);
    check_validation_not_stored(&run);
    check_retry_after(&run);
out:
    ck_response_release(&run.first);
    free(run.key_first);
    free(run.target);
    return rc;
}
