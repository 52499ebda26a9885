/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chaos_report.c - the verdict of a chaos run: a table for people, or one JSON object for
 * machines (--json).  Both carry the same numbers: what was driven, which faults were injected
 * (by kind, per orderd instance), what the audit found, what it read to find it (pages, the
 * largest answer) and idem-check's own peak memory, the figure a long soak is sized by.
 * docs/chaos.md shows both.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <jansson.h>

#include "chaos.h"
#include "banned.h"

static const char *const hook_names[4] = {"applied", "ignored", "duplicate", "rejected"};

/* idem-check's peak resident memory so far, in KiB (Linux's ru_maxrss unit); 0 if unknown.  The
 * services are other processes: this is the checker alone. */
static long peak_rss_kib(void)
{
    struct rusage ru;

    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
}

/* The spread of the per-user figures: intents and new orders per user, at least and at most,
 * and how many users had a problem of their own (an intent lost, an order duplicated). */
struct user_spread {
    long intents_min, intents_max, orders_min, orders_max, with_problems;
};

static void user_spread(const struct chaos *cx, struct user_spread *s)
{
    int i;

    memset(s, 0, sizeof(*s));
    for (i = 0; i < cx->n_users; i++) {
        const struct ck_user *u = &cx->users[i];
        if (i == 0 || u->intents < s->intents_min)
            s->intents_min = u->intents;
        if (i == 0 || u->intents > s->intents_max)
            s->intents_max = u->intents;
        if (i == 0 || u->orders < s->orders_min)
            s->orders_min = u->orders;
        if (i == 0 || u->orders > s->orders_max)
            s->orders_max = u->orders;
        s->with_problems += u->problems > 0;
    }
}

/* The users' row: how many, and the spread of their figures. */
static void print_users(const struct chaos *cx)
{
    struct user_spread us;

    user_spread(cx, &us);
    printf("%-34s %d (%s): intents each %ld..%ld, new orders each %ld..%ld, %ld with a problem\n",
           "users", cx->n_users, cx->o.attach ? "tokens given" : "made by orderd token create",
           us.intents_min, us.intents_max, us.orders_min, us.orders_max, us.with_problems);
}

/* The direct webhook audit's row: orderd's inbox over the run, or why only the indirect ran. */
static void print_inbox(const struct chaos *cx, const struct ck_audit *au)
{
    if (!au->inbox_direct) {
        printf("%-34s not audited directly (%s): checked indirectly only (deliveries "
               "accepted, one email per order)\n",
               "webhook inbox", au->inbox_why);
        return;
    }
    printf("%-34s %ld new entries for %ld events, %ld charge.succeeded for %ld charges: %ld "
           "applied, %ld ignored, %ld undecided",
           "webhook inbox (orderd's store)", au->inbox_entries, au->delta.events,
           au->inbox_charge_events, au->delta.charges, au->inbox_applied, au->inbox_ignored,
           au->inbox_undecided);
    if (cx->inbox_slack_low || cx->inbox_slack_high)
        printf(" (before the run: %ld deliveries pending, %ld events made while it was read)",
               cx->inbox_slack_high, cx->inbox_slack_low);
    putchar('\n');
}

void ck_print_table(struct chaos *cx, const struct ck_audit *au, const struct ck_chaos_verdict *v,
                    double secs, int rc)
{
    const struct ck_proxy *p = &cx->proxy;
    const struct ck_proxy *h = &cx->hook_proxy;
    int i;

    if (cx->o.attach)
        printf("idem-check chaos: attached to %d orderd instance%s, provider-sim %s, proxy %s\n",
               cx->n_inst, cx->n_inst == 1 ? "" : "s",
               cx->provider_url[0] ? cx->provider_url : "not given", cx->proxy_url);
    else
        printf("idem-check chaos: %d orderd instance%s (store %s), provider-sim %s, proxy %s\n",
               cx->n_inst, cx->n_inst == 1 ? "" : "s", cx->db, cx->provider_url, cx->proxy_url);
    for (i = 0; i < cx->n_inst; i++) {
        long conns, refused;
        ck_instance_counts(cx, i, &conns, &refused);
        printf("  orderd %d %-26s kill -9: %ld, connections: %ld (refused %ld)\n", i + 1,
               cx->inst[i].url, atomic_load(&cx->inst[i].kills), conns, refused);
    }
    printf("%-34s %ld of %ld (%ld answered 2xx to a client, %ld finished by the audit)\n",
           "intents started", au->started, cx->o.intents, au->finished_2xx, au->finished_in_audit);
    print_users(cx);
    printf("%-34s %ld\n", "client retries", atomic_load(&cx->retries));
    printf("%-34s %ld\n", "duplicated sends", atomic_load(&cx->dup_sends));
    printf("%-34s %ld\n", "faults: proxy resets", atomic_load(&p->resets));
    printf("%-34s %ld\n", "faults: proxy cut mid-request", atomic_load(&p->cuts));
    printf("%-34s %ld\n", "faults: proxy dropped responses", atomic_load(&p->drops));
    printf("%-34s %ld\n", "faults: orderd down (refused)", atomic_load(&p->upstream_down));
    if (cx->provider_url[0]) {
        printf("%-34s %ld\n", "faults: provider 5xx", au->delta.failed5xx);
        printf("%-34s %ld\n", "faults: provider lost responses", au->delta.lost_responses);
    }
    printf("%-34s %ld\n", "faults: orderd kill -9", atomic_load(&cx->kills));
    ck_haproxy_print_table(cx);
    ck_schedule_print_table(cx);
    ck_shards_print_table(cx);
    printf("%-34s %ld (%ld paid, %ld pending, over all the %s orders)", "orders", au->orders,
           au->paid, au->pending, cx->n_users == 1 ? "user's" : "users'");
    if (au->preexisting)
        printf(", plus %ld from before the run", au->preexisting);
    putchar('\n');
    if (cx->provider_url[0])
        printf("%-34s %ld charges, %ld confirmation emails for the paid orders, %s\n",
               "provider ledger", au->charges, au->emails,
               au->ledger_dups ? "DUPLICATES flagged" : "no duplicate flagged");
    if (cx->webhooks) {
        printf("%-34s %ld events x %ld copies: %ld of %ld deliveries made, %ld pending, %ld "
               "abandoned\n",
               "webhooks", au->delta.events, au->hook_copies, au->delta.delivered,
               au->hooks_expected, au->now.pending, au->delta.abandoned);
        if (cx->hook_proxy_on)
            printf("%-34s %ld deliveries: %ld reset, %ld cut, %ld dropped; %ld orderd down\n",
                   "faults: webhook proxy", atomic_load(&h->requests), atomic_load(&h->resets),
                   atomic_load(&h->cuts), atomic_load(&h->drops), atomic_load(&h->upstream_down));
        print_inbox(cx, au);
        if (au->hook_results_ok)
            printf("%-34s %ld applied, %ld ignored, %ld duplicate, %ld rejected (since each "
                   "instance's last start)\n",
                   "orderd webhook results", au->hook_results[0], au->hook_results[1],
                   au->hook_results[2], au->hook_results[3]);
    } else {
        printf("%-34s off\n", "webhooks");
    }
    printf("%-34s %ld\n", "DUPLICATES found", v->duplicates);
    printf("%-34s %ld\n", "LOST found", v->lost);
    printf("%-34s %ld\n", "UNSETTLED", v->unsettled);
    if (cx->webhooks)
        printf("%-34s %ld\n", "WEBHOOK problems", v->webhooks);
    if (au->problem[0])
        printf("%-34s %s\n", "AUDIT INCOMPLETE", au->problem);
    if (au->note[0])
        printf("%-34s %s\n", "first problem", au->note);
    printf("%-34s %ld pages of orders, %ld ledger pages (page size %ld), largest answer %.1f "
           "KiB; the audit took %.1f s\n",
           "audit reads", cx->order_pages, cx->ledger_pages, cx->o.page_size,
           (double)cx->largest_answer / 1024.0, (double)cx->audit_ms / 1000.0);
    printf("%-34s %.1f MiB\n", "idem-check peak RSS", (double)peak_rss_kib() / 1024.0);
    if (cx->workdir[0])
        printf("%-34s %.1f s, logs in %s\n", "took", secs, cx->workdir);
    else
        printf("%-34s %.1f s\n", "took", secs);
    printf("verdict: %s\n", rc == 0 ? "CLEAN (every intent took effect exactly once)" : "FAILED");
}

static json_t *proxy_json(const struct ck_proxy *p)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "connections",
                     (json_int_t)atomic_load(&p->connections), "requests",
                     (json_int_t)atomic_load(&p->requests), "resets",
                     (json_int_t)atomic_load(&p->resets), "cuts", (json_int_t)atomic_load(&p->cuts),
                     "drops", (json_int_t)atomic_load(&p->drops), "orderdDown",
                     (json_int_t)atomic_load(&p->upstream_down));
}

/* The direct webhook audit: {"direct":false,"reason"} or the inbox's growth over the run. */
static json_t *inbox_json(const struct chaos *cx, const struct ck_audit *au)
{
    if (!au->inbox_direct)
        return json_pack("{s:b, s:s}", "direct", 0, "reason", au->inbox_why);
    return json_pack(
        "{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "direct", 1, "entries",
        (json_int_t)au->inbox_entries, "expectedEntries", (json_int_t)au->delta.events,
        "chargeEvents", (json_int_t)au->inbox_charge_events, "expectedChargeEvents",
        (json_int_t)au->delta.charges, "applied", (json_int_t)au->inbox_applied, "ignored",
        (json_int_t)au->inbox_ignored, "undecided", (json_int_t)au->inbox_undecided,
        "baselinePending", (json_int_t)cx->inbox_slack_high, "baselineNewEvents",
        (json_int_t)cx->inbox_slack_low, "problems", (json_int_t)au->inbox_problems);
}

void ck_print_json(struct chaos *cx, const struct ck_audit *au, const struct ck_chaos_verdict *v,
                   double secs, int rc)
{
    const struct ck_proxy *p = &cx->proxy;
    json_t *doc, *inst = json_array(), *hooks;
    char *s;
    int i, k;

    for (i = 0; i < cx->n_inst; i++) {
        long conns, refused;
        ck_instance_counts(cx, i, &conns, &refused);
        json_array_append_new(inst,
                              json_pack("{s:s, s:I, s:I, s:I}", "url", cx->inst[i].url, "kills",
                                        (json_int_t)atomic_load(&cx->inst[i].kills), "connections",
                                        (json_int_t)conns, "refused", (json_int_t)refused));
    }
    if (cx->webhooks) {
        json_t *res = json_object();
        for (k = 0; k < 4 && au->hook_results_ok; k++)
            json_object_set_new(res, hook_names[k], json_integer(au->hook_results[k]));
        hooks = json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "enabled", 1, "copies",
                          (json_int_t)au->hook_copies, "events", (json_int_t)au->delta.events,
                          "expectedDeliveries", (json_int_t)au->hooks_expected, "delivered",
                          (json_int_t)au->delta.delivered, "pending", (json_int_t)au->now.pending,
                          "abandoned", (json_int_t)au->delta.abandoned, "orderdResults", res);
        if (cx->hook_proxy_on)
            json_object_set_new(hooks, "proxy", proxy_json(&cx->hook_proxy));
        json_object_set_new(hooks, "inbox", inbox_json(cx, au));
    } else {
        hooks = json_pack("{s:b}", "enabled", 0);
    }
    doc = json_pack(
        "{s:s, s:i, s:s, s:b, s:s, s:i, s:o, s:{s:I, s:I, s:I, s:I}, s:I, s:I,"
        " s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:o, s:{s:I, s:I, s:I, s:I},"
        " s:{s:b, s:I, s:I, s:I, s:b}, s:o, s:I, s:I, s:I, s:I, s:s, s:f, s:s}",
        "mode", "chaos", "exitCode", rc, "verdict", rc == 0 ? "clean" : "failed", "attach",
        cx->o.attach, "store", cx->o.attach ? "" : cx->db, "instanceCount", cx->n_inst, "instances",
        inst, "intents", "requested", (json_int_t)cx->o.intents, "started", (json_int_t)au->started,
        "answered2xx", (json_int_t)au->finished_2xx, "finishedByAudit",
        (json_int_t)au->finished_in_audit, "retries", (json_int_t)atomic_load(&cx->retries),
        "duplicatedSends", (json_int_t)atomic_load(&cx->dup_sends), "faults", "proxyResets",
        (json_int_t)atomic_load(&p->resets), "proxyCuts", (json_int_t)atomic_load(&p->cuts),
        "proxyDrops", (json_int_t)atomic_load(&p->drops), "orderdDown",
        (json_int_t)atomic_load(&p->upstream_down), "provider5xx", (json_int_t)au->delta.failed5xx,
        "providerLost", (json_int_t)au->delta.lost_responses, "kills",
        (json_int_t)atomic_load(&cx->kills), "proxy", proxy_json(p), "orders", "total",
        (json_int_t)au->orders, "paid", (json_int_t)au->paid, "pending", (json_int_t)au->pending,
        "preexisting", (json_int_t)au->preexisting, "ledger", "audited", cx->provider_url[0] != 0,
        "charges", (json_int_t)au->charges, "emails", (json_int_t)au->emails, "duplicatesFlagged",
        (json_int_t)au->ledger_dups, "clean",
        cx->provider_url[0] && au->ledger_ok && au->ledger_dups == 0, "webhooks", hooks,
        "duplicates", (json_int_t)v->duplicates, "lost", (json_int_t)v->lost, "unsettled",
        (json_int_t)v->unsettled, "webhookProblems", (json_int_t)v->webhooks, "firstProblem",
        au->note, "seconds", secs, "workdir", cx->workdir);
    if (doc) {
        struct user_spread us;
        user_spread(cx, &us);
        json_object_set_new(
            doc, "users",
            json_pack("{s:i, s:I, s:I, s:I, s:I, s:I}", "count", cx->n_users, "intentsMin",
                      (json_int_t)us.intents_min, "intentsMax", (json_int_t)us.intents_max,
                      "ordersMin", (json_int_t)us.orders_min, "ordersMax",
                      (json_int_t)us.orders_max, "withProblems", (json_int_t)us.with_problems));
        json_object_set_new(
            doc, "audit",
            json_pack("{s:b, s:s, s:I, s:I, s:I, s:I, s:f}", "complete", au->problem[0] == '\0',
                      "problem", au->problem, "pageSize", (json_int_t)cx->o.page_size, "orderPages",
                      (json_int_t)cx->order_pages, "ledgerPages", (json_int_t)cx->ledger_pages,
                      "largestAnswerBytes", (json_int_t)cx->largest_answer, "seconds",
                      (double)cx->audit_ms / 1000.0));
        json_object_set_new(doc, "peakRssKiB", json_integer(peak_rss_kib()));
        json_object_set_new(doc, "haproxy", ck_haproxy_json(cx));
        json_object_set_new(doc, "failovers", ck_schedule_json(cx, CK_FAILOVER));
        json_object_set_new(doc, "moves", ck_schedule_json(cx, CK_MOVE));
        if (cx->shards)
            json_object_set_new(doc, "shards", ck_shards_json(cx));
    }
    s = doc ? json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
    puts(s ? s : "{\"mode\":\"chaos\",\"error\":\"cannot build the report\"}");
    free(s);
    json_decref(doc);
}

/* ---- the audit's progress line (a terminal only) ------------------------------------------- */

#define AUDIT_PROGRESS_MS 200
#define AUDIT_PROGRESS_WIDTH 79

/* One frame of the audit's line: `fmt` padded over the last frame, a newline when `end`. */
static void audit_frame(struct chaos *cx, int end, const char *fmt, va_list ap)
{
    char line[AUDIT_PROGRESS_WIDTH + 1];

    vsnprintf(line, sizeof(line), fmt, ap);
    fprintf(stderr, "\r%-*s%s", AUDIT_PROGRESS_WIDTH, line, end ? "\n" : "");
    fflush(stderr);
    cx->progress_shown = !end;
}

void ck_audit_progress(struct chaos *cx, const char *fmt, ...)
{
    long long now = clock_mono_ms();
    va_list ap;

    if (!cx->tty || (cx->progress_shown && now - cx->progress_ms < AUDIT_PROGRESS_MS))
        return;
    cx->progress_ms = now;
    va_start(ap, fmt);
    audit_frame(cx, 0, fmt, ap);
    va_end(ap);
}

void ck_audit_progress_end(struct chaos *cx, const char *fmt, ...)
{
    va_list ap;

    if (!cx->tty || !cx->progress_shown)
        return;
    va_start(ap, fmt);
    audit_frame(cx, 1, fmt, ap);
    va_end(ap);
}
