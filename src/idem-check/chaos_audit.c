/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chaos_audit.c - the exactly-once audit of a chaos run, from the outside: orderd's HTTP API (the
 * user's orders, a replay of every intent's key) and provider-sim's ledger (charges, confirmation
 * emails, webhook events and deliveries).  Everything is measured against what was there before
 * the run, so the audit also holds for services that were running already (--attach), as long as
 * nothing else uses the run's user or the provider meanwhile.  orderd's webhook inbox, where it
 * exposes it (the orderd_webhook_inbox_events_total counter, kept in its store), is audited
 * against the ledger's events directly.  docs/chaos.md says why each check is sound.  What it
 * reads of orderd and provider-sim comes in pages of bounded size (chaos_read.c), and a read it
 * cannot make leaves the audit incomplete, never the orders unsettled.  Also here: the intents'
 * POST through libidem-client, shared with the drive.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <idem/client.h>
#include <jansson.h>
#include <openssl/sha.h>

#include "chaos.h"
#include "banned.h"

#define CHAOS_BODY "{\"productId\":\"p-1024\",\"quantity\":1}"

/* ---- the intents' requests ------------------------------------------------------------------ */

static void on_attempt(const struct idem_client_attempt *a, void *arg)
{
    struct ck_sender *s = arg;
    struct chaos *cx = s->cx;
    if (a->outcome == IDEM_CLIENT_OUTCOME_NONE)
        atomic_fetch_add(&cx->retries, 1);
    /* how long a failover or a move left the clients without a 2xx, and each cluster's users */
    ck_schedule_attempt(cx, a->status, a->replayed);
    ck_shards_attempt(cx, s->user, a->status, a->replayed);
}

struct idem_client *ck_open_client(struct chaos *cx, struct ck_sender *sender, int64_t max_time_ms)
{
    struct idem_client_options co;
    struct idem_client *c = NULL;
    memset(&co, 0, sizeof(co));
    co.max_attempts = 1000;
    co.max_time_ms = max_time_ms;
    co.base_delay_ms = 50;
    co.max_delay_ms = 1000;
    co.connect_timeout_ms = 2000;
    co.attempt_timeout_ms = 10000;
    co.user_agent = "idem-check-chaos";
    (void)cx;
    if (sender) {
        co.on_attempt = on_attempt;
        co.on_attempt_arg = sender;
    }
    if (idem_client_open(&co, &c) != 0)
        return NULL;
    return c;
}

/* The orderId of an order document, into `out` ("" if none). */
static void order_id_of(const void *body, size_t len, char *out, size_t cap)
{
    json_t *doc = json_loadb(body, len, 0, NULL);
    const char *id = doc ? json_string_value(json_object_get(doc, "orderId")) : NULL;
    snprintf(out, cap, "%s", id ? id : "");
    json_decref(doc);
}

void ck_send_intent(struct idem_client *c, const char *base, const char *auth, const char *key,
                    struct ck_seen *s, char *order_id, size_t cap)
{
    char url[160];
    /* One connection per attempt, so that the proxy's per-connection fate is per attempt. */
    const char *headers[2] = {auth, "Connection: close"};
    struct idem_client_request req;
    struct idem_client_response *resp = NULL;
    enum idem_client_outcome outcome;

    snprintf(url, sizeof(url), "%s/api/orders", base);
    memset(&req, 0, sizeof(req));
    req.method = "POST";
    req.url = url;
    req.headers = headers;
    req.nheaders = 2;
    req.body = CHAOS_BODY;
    req.body_len = strlen(CHAOS_BODY);
    req.key = key;
    memset(s, 0, sizeof(*s));
    if (order_id && cap)
        order_id[0] = '\0';
    if (idem_client_send(c, &req, &resp, &outcome) != 0 || !resp)
        return;
    s->status = idem_client_response_status(resp);
    if (s->status >= 200 && s->status < 300) {
        size_t len = 0;
        const void *b = idem_client_response_body(resp, &len);
        s->len = len;
        SHA256(b ? b : (const void *)"", len, s->digest);
        if (order_id && cap && b)
            order_id_of(b, len, order_id, cap);
    }
    idem_client_response_free(resp);
}

/* ---- the provider's faults and orderd's metrics --------------------------------------------- */

int ck_provider_faults(struct chaos *cx, double fail_rate, double lost_rate, long webhook_dup)
{
    char url[192], body[160];
    struct ck_request rq;
    struct ck_response rs;
    json_t *doc = json_object();
    char *text;
    int ok;

    if (fail_rate >= 0)
        json_object_set_new(doc, "fail_rate", json_real(fail_rate));
    if (lost_rate >= 0)
        json_object_set_new(doc, "lost_rate", json_real(lost_rate));
    if (webhook_dup > 0)
        json_object_set_new(doc, "webhook_dup", json_integer(webhook_dup));
    text = json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(doc);
    if (!text)
        return -1;
    snprintf(body, sizeof(body), "%s", text);
    free(text);
    snprintf(url, sizeof(url), "%s/v1/faults", cx->provider_url);
    memset(&rq, 0, sizeof(rq));
    memset(&rs, 0, sizeof(rs));
    rq.method = "POST";
    rq.url = url;
    rq.body = body;
    rq.body_len = strlen(body);
    ck_http_perform(&rq, &rs, 1, 10000);
    ok = rs.status == 200;
    ck_response_release(&rs);
    return ok ? 0 : -1;
}

/* GET /v1/faults: the settings a run changes, so that --attach can put them back.  0, or -1
 * with `why`. */
static int read_faults(struct chaos *cx, char *why, size_t cap)
{
    char url[192];
    json_t *doc;
    snprintf(url, sizeof(url), "%s/v1/faults", cx->provider_url);
    doc = ck_get_json(cx, url, NULL, why, cap);
    if (!doc)
        return -1;
    cx->saved_fail = json_number_value(json_object_get(doc, "fail_rate"));
    cx->saved_lost = json_number_value(json_object_get(doc, "lost_rate"));
    cx->saved_dup = (long)json_integer_value(json_object_get(doc, "webhook_dup"));
    json_decref(doc);
    cx->saved_ok = 1;
    return 0;
}

/* GET <instance i>/metrics: the page (new, free()), or NULL with the reason in `why`. */
static char *get_metrics(const struct chaos *cx, int i, char *why, size_t cap)
{
    char url[160];
    struct ck_request rq;
    struct ck_response rs;
    char *page = NULL;

    memset(&rq, 0, sizeof(rq));
    memset(&rs, 0, sizeof(rs));
    snprintf(url, sizeof(url), "%s/metrics", cx->inst[i].url);
    rq.method = "GET";
    rq.url = url;
    ck_http_perform(&rq, &rs, 1, 10000);
    if (rs.status == 200 && rs.body.sb.buf) {
        page = strbuf_detach(&rs.body.sb, NULL); /* taken over from the response */
    } else {
        snprintf(why, cap, "GET %s answered %ld", url, rs.status);
    }
    ck_response_release(&rs);
    return page;
}

/* orderd_webhooks_total{result=...} of every instance, summed into `out` (applied, ignored,
 * duplicate, rejected); 0 if every instance answered. */
static int read_webhook_metrics(struct chaos *cx, long out[4])
{
    static const char *const names[4] = {"applied", "ignored", "duplicate", "rejected"};
    char why[256];
    int i, k, rc = 0;

    memset(out, 0, 4 * sizeof(long));
    for (i = 0; i < cx->n_inst; i++) {
        char *page = get_metrics(cx, i, why, sizeof(why));
        if (!page) {
            rc = -1;
            continue;
        }
        for (k = 0; k < 4; k++) {
            char needle[96];
            const char *p;
            snprintf(needle, sizeof(needle), "orderd_webhooks_total{result=\"%s\"} ", names[k]);
            p = strstr(page, needle);
            if (p)
                out[k] += strtol(p + strlen(needle), NULL, 10);
        }
        free(page);
    }
    return rc;
}

#define INBOX_METRIC "orderd_webhook_inbox_events_total{"

/* Index of the value of label `name` (in the braces of one sample) in `names`; the last entry
 * ("other") when the label is absent or its value unknown. */
static int inbox_label(const char *labels, size_t len, const char *name, const char *const *names,
                       int n)
{
    char needle[32];
    const char *p, *end = labels + len;
    int i;

    snprintf(needle, sizeof(needle), "%s=\"", name);
    for (p = labels; p < end; p++) {
        size_t nl = strlen(needle);
        if ((p == labels || p[-1] == ',' || p[-1] == '{') && (size_t)(end - p) > nl &&
            memcmp(p, needle, nl) == 0) {
            p += nl;
            for (i = 0; i < n - 1; i++) {
                size_t vl = strlen(names[i]);
                if ((size_t)(end - p) > vl && memcmp(p, names[i], vl) == 0 && p[vl] == '"')
                    return i;
            }
            return n - 1;
        }
    }
    return n - 1;
}

/*
 * The samples of orderd_webhook_inbox_events_total on a /metrics page into `out` (out->ok: at
 * least one was there).  Types and results orderd may add later fall into "other", as orderd does.
 */
static void parse_inbox(const char *page, struct ck_inbox *out)
{
    static const char *const types[CK_INBOX_TYPES] = {"charge.succeeded", "refund.succeeded",
                                                      "other"};
    static const char *const results[CK_INBOX_RESULTS] = {"applied", "ignored", "other"};
    const char *line = page;

    memset(out, 0, sizeof(*out));
    while (line && *line) {
        const char *eol = strchr(line, '\n');
        const char *close;
        size_t n = eol ? (size_t)(eol - line) : strlen(line);
        if (n > strlen(INBOX_METRIC) && memcmp(line, INBOX_METRIC, strlen(INBOX_METRIC)) == 0 &&
            (close = memchr(line, '}', n)) != NULL && close[1] == ' ') {
            int t = inbox_label(line, (size_t)(close - line), "type", types, CK_INBOX_TYPES);
            int r = inbox_label(line, (size_t)(close - line), "result", results, CK_INBOX_RESULTS);
            out->n[t][r] += strtol(close + 2, NULL, 10);
            out->ok = 1;
        }
        line = eol ? eol + 1 : NULL;
    }
}

/*
 * orderd's inbox gauge into `out`: from the first instance when attached (the one the user
 * named first), else from the first instance that shows it (they all read the same store).
 * 0, or -1 with the reason in `why`.
 */
static int read_inbox(struct chaos *cx, struct ck_inbox *out, char *why, size_t cap)
{
    int i, n = cx->o.attach ? 1 : cx->n_inst;

    memset(out, 0, sizeof(*out));
    snprintf(why, cap, "no orderd instance");
    for (i = 0; i < n; i++) {
        char *page = get_metrics(cx, i, why, cap);
        if (!page)
            continue;
        parse_inbox(page, out);
        free(page);
        if (out->ok)
            return 0;
        snprintf(why, cap, "%s/metrics has no orderd_webhook_inbox_events_total", cx->inst[i].url);
    }
    return -1;
}

/*
 * The ledger before the run and, when webhooks are on and orderd shows its inbox, the inbox with
 * it.  They are read as ledger, inbox, ledger again, until no event was made in between and no
 * delivery was pending (at most 5 s; a quiet provider passes at once): then every event of the
 * ledger was in the inbox when it was read, and the run's growth of one must equal the other's.
 * Otherwise the audit allows for the difference: events made while the inbox was read (they may
 * be in it already) and deliveries pending (they may add to it during the run).
 */
static int read_baseline(struct chaos *cx, char *why, size_t cap)
{
    long long give_up = clock_mono_ms() + 5000;
    struct ck_ledger again;
    int hooks;

    for (;;) {
        if (ck_read_ledger(cx, &cx->ledger_before, why, cap) < 0)
            return -1;
        hooks = cx->o.attach ? cx->ledger_before.webhooks_configured : cx->webhooks;
        if (!hooks || read_inbox(cx, &cx->inbox_before, cx->inbox_before_why,
                                 sizeof(cx->inbox_before_why)) < 0)
            return 0;
        if (ck_read_ledger(cx, &again, why, cap) < 0)
            return -1;
        cx->inbox_slack_low = again.events - cx->ledger_before.events;
        cx->inbox_slack_high = cx->ledger_before.pending;
        if ((cx->inbox_slack_low == 0 && cx->inbox_slack_high == 0) || clock_mono_ms() > give_up)
            return 0;
        clock_sleep_ms(100);
    }
}

int ck_audit_before(struct chaos *cx, char *why, size_t cap)
{
    struct ck_order *rows;
    size_t n = 0, i;

    rows = ck_list_orders(cx, &n, why, cap);
    if (!rows)
        return -1;
    cx->before_ids = xmalloc((n ? n : 1) * sizeof(*cx->before_ids));
    cx->n_before = n;
    cx->paid_before = 0;
    for (i = 0; i < n; i++) {
        memcpy(cx->before_ids[i], rows[i].id, sizeof(cx->before_ids[i]));
        cx->paid_before += rows[i].paid;
    }
    free(rows);
    if (!cx->provider_url[0])
        return 0;
    if (read_baseline(cx, why, cap) < 0)
        return -1;
    cx->ledger_before_ok = 1;
    if (cx->o.attach) {
        if (read_faults(cx, why, cap) < 0)
            return -1;
        /* Attached: webhooks are whatever provider-sim was started with. */
        cx->webhooks = cx->ledger_before.webhooks_configured;
    }
    return 0;
}

/* Whether two senders saw the same answer: status, length and SHA-256 of the body. */
static int same_seen(const struct ck_seen *a, const struct ck_seen *b)
{
    return a->status == b->status && a->len == b->len &&
           memcmp(a->digest, b->digest, sizeof(a->digest)) == 0;
}

/* The first read problem of this pass of the audit (later ones follow from it). */
static void set_problem(struct ck_audit *au, const char *why)
{
    if (!au->problem[0])
        snprintf(au->problem, sizeof(au->problem), "%s", why);
}

static void ledger_delta(const struct ck_ledger *now, const struct ck_ledger *before,
                         struct ck_ledger *d)
{
    d->charges = now->charges - before->charges;
    d->emails = now->emails - before->emails;
    d->dups = now->dups - before->dups;
    d->failed5xx = now->failed5xx - before->failed5xx;
    d->lost_responses = now->lost_responses - before->lost_responses;
    d->events = now->events - before->events;
    d->delivered = now->delivered - before->delivered;
    d->pending = now->pending;
    d->abandoned = now->abandoned - before->abandoned;
    d->webhooks_configured = now->webhooks_configured;
}

/* Webhook deliveries every delivered event must have had: the provider's webhook_dup. */
static long hook_copies(const struct chaos *cx)
{
    if (cx->o.attach && !cx->o.webhook_dup_set)
        return cx->saved_dup > 0 ? cx->saved_dup : 1;
    return cx->o.webhook_dup;
}

/* The replay's threads take intents in turn, like the drive's clients. */
struct replay {
    struct chaos *cx;
    atomic_long next, done;
};

#define REPLAY_THREADS_MAX 8

static void *replay_main(void *arg)
{
    struct replay *rp = arg;
    struct chaos *cx = rp->cx;
    struct idem_client *c = ck_open_client(cx, NULL, 60000);

    for (;;) {
        long k = atomic_fetch_add(&rp->next, 1);
        struct ck_intent *it;
        if (k >= cx->o.intents)
            break;
        it = &cx->in[k];
        if (it->started && c)
            ck_send_intent(c, cx->inst[k % cx->n_inst].url, cx->users[it->user].auth, it->key,
                           &it->r, it->order_id, sizeof(it->order_id));
        atomic_fetch_add(&rp->done, 1);
    }
    idem_client_close(c);
    return NULL;
}

/*
 * 1. Replay every started intent straight to orderd (the instances in turn), from up to 8
 *    threads, then judge the answers in intent order (so the first problem named is the same
 *    whatever the threads did).
 */
static void replay_intents(struct chaos *cx, struct ck_audit *au)
{
    struct replay rp;
    pthread_t th[REPLAY_THREADS_MAX];
    int started[REPLAY_THREADS_MAX];
    long n = cx->o.clients < REPLAY_THREADS_MAX ? cx->o.clients : REPLAY_THREADS_MAX, k;

    memset(&rp, 0, sizeof(rp));
    rp.cx = cx;
    for (k = 0; k < n; k++)
        started[k] = pthread_create(&th[k], NULL, replay_main, &rp) == 0;
    if (n > 0 && !started[0])
        replay_main(&rp); /* no thread at all: do it here */
    while (atomic_load(&rp.done) < cx->o.intents) {
        ck_audit_progress(cx, "audit: replaying the intents, %ld/%ld", atomic_load(&rp.done),
                          cx->o.intents);
        clock_sleep_ms(100);
    }
    for (k = 0; k < n; k++)
        if (started[k])
            pthread_join(th[k], NULL);

    for (k = 0; k < cx->o.intents; k++) {
        struct ck_intent *it = &cx->in[k];
        int a2 = it->a.status >= 200 && it->a.status < 300;
        int b2 = it->b.status >= 200 && it->b.status < 300;
        if (!it->started)
            continue;
        au->started++;
        cx->users[it->user].intents++;
        au->seen_2xx += a2 + b2;
        if (a2 || b2)
            au->finished_2xx++;
        if (it->r.status < 200 || it->r.status >= 300) {
            au->lost++;
            cx->users[it->user].problems++;
            if (!au->note[0])
                snprintf(au->note, sizeof(au->note), "intent %s: replay answered %d", it->key,
                         it->r.status);
            continue;
        }
        if (!a2 && !b2)
            au->finished_in_audit++;
        if ((a2 && !same_seen(&it->a, &it->r)) || (b2 && !same_seen(&it->b, &it->r))) {
            au->not_durable++;
            cx->users[it->user].problems++;
            if (!au->note[0])
                snprintf(au->note, sizeof(au->note),
                         "intent %s: a client saw a 2xx the replay does not repeat", it->key);
        }
        if (a2 && b2 && !same_seen(&it->a, &it->b)) {
            au->dup_mismatch++;
            cx->users[it->user].problems++;
        }
    }
}

/*
 * The provider's effects for each order of this run, from the ledger's per-reference pages
 * (ck_read_refs): a paid order must have exactly one successful charge and one
 * order_confirmation email; more is a duplicate, fewer is unsettled, and so is a charge for an
 * order that says its payment failed.  Fills the per-run sums and the extra / missing counts of
 * `au`; 0, or -1 with au->problem if the ledger cannot be read.
 */
static int per_order(struct chaos *cx, struct ck_order *rows, size_t n, struct ck_audit *au)
{
    char why[sizeof(au->problem)];
    size_t i;

    if (ck_read_refs(cx, rows, n, why, sizeof(why)) < 0) {
        set_problem(au, why);
        return -1;
    }
    au->charges = au->emails = 0;
    au->extra_charges = au->missing_charges = au->extra_emails = au->missing_emails = 0;
    au->charged_unpaid = 0;
    for (i = 0; i < n; i++) {
        long c = rows[i].charges, e = rows[i].emails;
        if (rows[i].before)
            continue;
        au->charges += c;
        au->emails += e;
        if (rows[i].paid) {
            au->extra_charges += c > 1 ? c - 1 : 0;
            au->missing_charges += c < 1;
            au->extra_emails += e > 1 ? e - 1 : 0;
            au->missing_emails += e < 1;
        } else if (rows[i].failed && c > 0) {
            au->charged_unpaid++;
        }
    }
    return 0;
}

/* The first order of the run whose ledger entries are wrong, as the note (per_order ran last). */
static void note_per_order(const struct ck_order *rows, size_t n, struct ck_audit *au)
{
    size_t i;

    for (i = 0; i < n && !au->note[0]; i++) {
        if (rows[i].before)
            continue;
        if (rows[i].paid && (rows[i].charges != 1 || rows[i].emails != 1))
            snprintf(au->note, sizeof(au->note),
                     "paid order %s: %ld charges, %ld confirmation emails in the ledger",
                     rows[i].id, rows[i].charges, rows[i].emails);
        else if (rows[i].failed && rows[i].charges > 0)
            snprintf(au->note, sizeof(au->note), "order %s says payment_failed, but was charged",
                     rows[i].id);
    }
}

/* Whether the workers are done: nothing pending, every paid order has its charge and its email,
 * every webhook delivery made.  The cheap global counts first, the per-order check last. */
static int settled(struct chaos *cx, struct ck_order *rows, size_t n, struct ck_audit *au)
{
    if (!rows || au->pending > 0)
        return 0;
    if (!cx->provider_url[0])
        return 1;
    if (!au->ledger_ok || au->delta.charges < au->paid_delta || au->delta.emails < au->paid_delta)
        return 0;
    if (cx->webhooks &&
        (au->now.pending > 0 || au->delta.delivered < au->delta.events * hook_copies(cx)))
        return 0;
    if (per_order(cx, rows, n, au) < 0)
        return 0;
    au->refs_ok = 1;
    return au->missing_charges == 0 && au->missing_emails == 0;
}

/* The inbox's growth over the run into `au` (sets inbox_direct). */
static void inbox_growth(const struct ck_inbox *before, const struct ck_inbox *after,
                         struct ck_audit *au)
{
    int t, r;

    au->inbox_direct = 1;
    for (t = 0; t < CK_INBOX_TYPES; t++)
        for (r = 0; r < CK_INBOX_RESULTS; r++) {
            long d = after->n[t][r] - before->n[t][r];
            if (d < 0) /* rows are never deleted, nor their result changed once committed */
                au->inbox_problems -= d;
            au->inbox_entries += d;
            au->inbox_charge_events += t == 0 ? d : 0;
            au->inbox_charge_applied += t == 0 && r == 0 ? d : 0;
            au->inbox_applied += r == 0 ? d : 0;
            au->inbox_ignored += r == 1 ? d : 0;
            au->inbox_undecided += r == 2 ? d : 0;
        }
}

/* How far `n` lies outside [lo, hi]. */
static long outside(long n, long lo, long hi)
{
    return n < lo ? lo - n : n > hi ? n - hi : 0;
}

/*
 * The direct webhook audit, on orderd's own inbox (one row per event id, its primary key): the
 * run's new rows must be exactly the provider's new events — one per new charge, never more, so
 * no event id was recorded twice or made up, and none answered 2xx without being recorded — each
 * with its result decided (applied or ignored) in the transaction that recorded it, and no more
 * charge events applied than orders of the user became paid (applying one moves one order from
 * pending_payment to paid).  Slack only for a provider that was not quiet before the run.
 */
static void audit_inbox(const struct chaos *cx, struct ck_audit *au)
{
    long lo = cx->inbox_slack_low, hi = cx->inbox_slack_high;
    long bad = outside(au->inbox_entries, au->delta.events - lo, au->delta.events + hi) +
               outside(au->inbox_charge_events, au->delta.charges - lo, au->delta.charges + hi) +
               au->inbox_undecided +
               (au->inbox_charge_applied > au->paid_delta + hi
                    ? au->inbox_charge_applied - au->paid_delta - hi
                    : 0);

    au->inbox_problems += bad;
    if (!au->note[0] && au->inbox_problems)
        snprintf(au->note, sizeof(au->note),
                 "webhook inbox: %ld new entries (%ld charge.succeeded, %ld applied, %ld "
                 "undecided) for %ld new events, %ld new charges, %ld newly paid orders",
                 au->inbox_entries, au->inbox_charge_events, au->inbox_charge_applied,
                 au->inbox_undecided, au->delta.events, au->delta.charges, au->paid_delta);
}

void ck_audit(struct chaos *cx, struct ck_audit *au)
{
    struct ck_order *rows = NULL;
    size_t n_rows = 0, i;
    long long t0 = clock_mono_ms(), grace_end;
    char why[sizeof(au->problem)];
    long k;

    replay_intents(cx, au);

    /* 2. The grace period: until no order is pending, every newly paid order has its charge and
     *    its confirmation email, and every webhook delivery was made (or time is up).  What a
     *    pass could not read is its problem; only the last pass's counts. */
    grace_end = clock_mono_ms() + cx->o.grace_s * 1000;
    for (;;) {
        au->problem[0] = '\0';
        au->refs_ok = 0;
        free(rows);
        rows = ck_list_orders(cx, &n_rows, why, sizeof(why));
        if (!rows)
            set_problem(au, why);
        au->list_ok = rows != NULL;
        au->paid = au->pending = 0;
        for (i = 0; rows && i < n_rows; i++) {
            au->paid += rows[i].paid;
            au->pending += rows[i].pending;
        }
        au->paid_delta = au->paid - cx->paid_before;
        if (cx->provider_url[0]) {
            au->ledger_ok =
                cx->ledger_before_ok && ck_read_ledger(cx, &au->now, why, sizeof(why)) == 0;
            if (au->ledger_ok)
                ledger_delta(&au->now, &cx->ledger_before, &au->delta);
            else
                set_problem(au, why);
        }
        if (settled(cx, rows, n_rows, au) || clock_mono_ms() > grace_end)
            break;
        ck_audit_progress(
            cx, "audit: settling, %ld orders pending, %ld of %ld charges (%llds left)", au->pending,
            au->delta.charges, au->paid_delta, (grace_end - clock_mono_ms()) / 1000);
        clock_sleep_ms(n_rows > 2000 ? 1000 : 250);
    }
    if (cx->webhooks) {
        struct ck_inbox after;
        char why[sizeof(au->inbox_why)];
        au->hook_results_ok = read_webhook_metrics(cx, au->hook_results) == 0;
        if (!cx->inbox_before.ok)
            snprintf(au->inbox_why, sizeof(au->inbox_why), "%s", cx->inbox_before_why);
        else if (read_inbox(cx, &after, why, sizeof(why)) == 0)
            inbox_growth(&cx->inbox_before, &after, au);
        else
            snprintf(au->inbox_why, sizeof(au->inbox_why), "after the run: %.140s", why);
    }
    if (!rows) { /* nothing to match the intents against: the audit is incomplete */
        if (!au->note[0])
            snprintf(au->note, sizeof(au->note), "audit incomplete: %.480s", au->problem);
        goto out;
    }

    /* 3. Match: each started intent's order must be listed, once, among its own user's; every
     *    listed order that was not there before the run must belong to exactly one intent of
     *    its user, else it is a second execution of some intent. */
    for (k = 0; k < cx->o.intents; k++) {
        struct ck_intent *it = &cx->in[k];
        struct ck_order *hit;
        if (!it->started || !it->order_id[0])
            continue;
        hit = ck_find_order(rows, n_rows, it->order_id);
        if (!hit || hit->before || hit->user != it->user) {
            au->lost++;
            cx->users[it->user].problems++;
            if (!au->note[0])
                snprintf(au->note, sizeof(au->note), "order %s is not listed%s", it->order_id,
                         !hit          ? ""
                         : hit->before ? " as new"
                                       : " among its user's orders");
        } else if (hit->matched++) {
            au->dup_orders++; /* two intents, one order: cannot happen with fresh keys */
            cx->users[it->user].problems++;
            if (!au->note[0])
                snprintf(au->note, sizeof(au->note), "order %s is named by two intents",
                         it->order_id);
        }
    }
    for (i = 0; i < n_rows; i++) {
        if (rows[i].before) {
            au->preexisting++;
            continue;
        }
        cx->users[rows[i].user].orders++;
        if (!rows[i].matched) {
            au->dup_orders++;
            cx->users[rows[i].user].problems++;
            if (!au->note[0])
                snprintf(au->note, sizeof(au->note), "order %s belongs to no intent", rows[i].id);
        }
    }
    au->orders = (long)n_rows - au->preexisting;
    au->unsettled = au->pending;

    /* 4. The provider: one charge and one confirmation email per paid order of this run, no new
     *    duplicate flagged, and (webhooks on) one event per charge, every copy of it accepted. */
    if (!cx->provider_url[0])
        goto out;
    if (au->ledger_ok && !au->refs_ok) {
        au->problem[0] = '\0'; /* the orders and the totals were read: only the pages are left */
        au->refs_ok = per_order(cx, rows, n_rows, au) == 0;
    }
    if (!au->ledger_ok || !au->refs_ok) {
        /* Not read is not unsettled: the verdict fails as incomplete, naming the read. */
        au->ledger_ok = 0;
        if (!au->note[0])
            snprintf(au->note, sizeof(au->note), "audit incomplete: %.480s", au->problem);
        goto out;
    }
    note_per_order(rows, n_rows, au);
    au->ledger_dups = au->delta.dups > 0 ? au->delta.dups : 0;
    au->unsettled += au->missing_charges + au->missing_emails + au->charged_unpaid;
    if (!au->note[0] && au->ledger_dups)
        snprintf(au->note, sizeof(au->note), "the provider's ledger flags %ld new duplicates",
                 au->ledger_dups);
    if (cx->webhooks) {
        long want = au->delta.events * hook_copies(cx);
        long diff = au->delta.events - au->delta.charges;
        au->hook_copies = hook_copies(cx);
        au->hooks_expected = want;
        au->hooks_problems = (diff < 0 ? -diff : diff) + au->now.pending + au->delta.abandoned +
                             (au->delta.delivered < want ? want - au->delta.delivered : 0);
        if (!au->note[0] && au->hooks_problems)
            snprintf(au->note, sizeof(au->note),
                     "webhooks: %ld events for %ld charges, %ld of %ld deliveries made, %ld "
                     "pending, %ld abandoned",
                     au->delta.events, au->delta.charges, au->delta.delivered, want,
                     au->now.pending, au->delta.abandoned);
        if (au->inbox_direct)
            audit_inbox(cx, au);
    }
out:
    free(rows);
    cx->audit_ms = clock_mono_ms() - t0;
    ck_audit_progress_end(cx, "audit: %ld pages of orders, %ld ledger pages read in %.1f s",
                          cx->order_pages, cx->ledger_pages, (double)cx->audit_ms / 1000.0);
}

void ck_verdict_of(const struct chaos *cx, const struct ck_audit *au, struct ck_chaos_verdict *v)
{
    (void)cx;
    v->duplicates =
        au->dup_orders + au->dup_mismatch + au->ledger_dups + au->extra_charges + au->extra_emails;
    v->lost = au->lost + au->not_durable;
    v->unsettled = au->unsettled;
    v->webhooks = au->hooks_problems + au->inbox_problems;
}
