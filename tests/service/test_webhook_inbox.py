# SPDX-License-Identifier: Apache-2.0
"""
test_webhook_inbox.py - orderd's webhook inbox as /metrics shows it
(orderd_webhook_inbox_events_total, docs/orderd.md): counted in the store, in the transaction that
records an event, so it counts each event id once however often it was delivered, survives a
kill -9, and is the same on every instance of one store; whereas orderd_webhooks_total counts
deliveries per process.  The retention sweep deletes old inbox entries and sent emails: the inbox
count stays, the outbox gauge follows the rows.  Also: /metrics stays well-formed Prometheus text
(0.0.4) with the store's figures on it.  idem-check chaos audits the inbox through this counter
(test_chaos.py).
"""

import json
import os
import re
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (ORDERD, Server, db_query, expect, expect_eq, expect_problem, fail,  # noqa: E402
                     fresh_db_per_server, metric_value, new_key, parse_metrics, run, test)
from provider import WEBHOOK_SECRET, paid_pair, sign, wait_until  # noqa: E402

INBOX = "orderd_webhook_inbox_events_total"
OUTBOX = "orderd_outbox_messages"
TYPES = ("charge.succeeded", "refund.succeeded", "other")
RESULTS = ("applied", "ignored", "other")

# Nothing else runs: the webhooks are what settles an order whose charge answer was lost.
NO_WORKERS = ["--reconciler-interval-ms", "0", "--completer-interval-ms", "0",
              "--outbox-interval-ms", "50"]

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE_RE = re.compile(r"^(%s)(?:\{(.*)\})? (\S+)$" % _NAME)
_LABELS_RE = re.compile(r'^[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
                        r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*$')
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}


def expect_exposition(text):
    """
    `text` is well-formed Prometheus text 0.0.4: every line a HELP, a TYPE or a sample; one HELP
    and one TYPE per family, before its samples; a family's samples together; no series twice;
    values that are numbers; the page ends with a newline.
    """
    expect(text.endswith("\n"), "the page ends with a newline")
    types, helps, seen, done = {}, set(), set(), set()
    current = None
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = "line %d %r" % (n, line)
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            expect(name not in helps, "one HELP per family: " + where)
            helps.add(name)
            continue
        if line.startswith("# TYPE "):
            parts = line.split(" ")
            expect(len(parts) == 4 and parts[3] in ("counter", "gauge", "histogram", "summary",
                                                     "untyped"), "a TYPE line: " + where)
            expect(parts[2] not in types, "one TYPE per family: " + where)
            types[parts[2]] = parts[3]
            continue
        expect(not line.startswith("#") and line.strip() == line and line,
               "no stray comment, blank line or white space: " + where)
        m = _SAMPLE_RE.match(line)
        expect(m is not None, "a sample: " + where)
        name, labels, value = m.groups()
        family = name
        for fam, kind in types.items():
            if any(name == fam + s for s in _SUFFIXES.get(kind, ())):
                family = fam
        expect(family in types and family in helps, "HELP and TYPE before the samples: " + where)
        if family != current:
            expect(family not in done, "a family's samples are together: " + where)
            if current is not None:
                done.add(current)
            current = family
        if labels is not None:
            expect(_LABELS_RE.match(labels) is not None, "labels: " + where)
        key = (name, labels)
        expect(key not in seen, "each series once: " + where)
        seen.add(key)
        try:
            float(value)
        except ValueError:
            fail("a number as value: " + where)


def scrape(server):
    r = server.client().get("/metrics")
    expect_eq(r.status, 200, "GET /metrics: " + r.describe(300))
    text = r.body.decode("utf-8")
    expect_exposition(text)
    return parse_metrics(text)


def inbox(samples):
    """{(type, result): value} of the inbox gauge; every one of the fixed series must be there."""
    got = {}
    for name, labels, value in samples:
        if name == INBOX:
            got[(labels.get("type"), labels.get("result"))] = value
    want = {(t, r) for t in TYPES for r in RESULTS}
    expect_eq(set(got), want, "the series of %s (zeros included)" % INBOX)
    return got


def deliver(client, event, copies):
    """`copies` deliveries of one signed event at once; their (status, duplicate) sorted."""
    results = []

    def post():
        r = client.request("POST", "/webhooks/provider", body=event, token=None,
                           headers={"Provider-Signature": sign(event)})
        results.append((r.status, r.json().get("duplicate")))
    threads = [threading.Thread(target=post) for _ in range(copies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    return sorted(results)


@test
def test_inbox_counts_each_event_once_and_survives_a_kill(_):
    prov, s = paid_pair(order_args=NO_WORKERS, name="inbox")
    s2 = None
    with prov, s:
        u = s.new_user("inbox")
        before = inbox(scrape(s))
        if fresh_db_per_server():
            expect(all(v == 0 for v in before.values()), "a fresh inbox is empty: %r" % before)

        # 1. The charge's answer is lost: its webhook (delivered three times) settles the order.
        prov.faults(lost_rate=1, webhook_dup=3)
        expect_problem(u.create_order(new_key("lost")), 503, "outcome-unknown", "lost response")
        prov.faults(lost_rate=0, webhook_dup=2)
        wait_until("three deliveries of the first event",
                   lambda: prov.ledger(keys=False)["webhooks"]["deliveries"]["delivered"] == 3)
        # 2. A plain order, its webhook delivered twice: the checkout settles it, or the webhook
        #    does if it comes first (then the checkout finds the order paid).
        expect_eq(u.create_order(new_key("paid")).status, 201, "an order charged at once")
        wait_until("two deliveries of the second event",
                   lambda: prov.ledger(keys=False)["webhooks"]["deliveries"]["delivered"] == 5)
        # 3. An event of a type orderd does not handle, delivered twice at once: recorded once.
        ping = json.dumps({"id": "evt_ping_" + new_key(), "type": "test.ping",
                           "data": {"object": {}}}).encode()
        expect_eq(deliver(u, ping, 2), [(200, False), (200, True)], "two copies of test.ping")
        # 4. A forged one is refused and recorded nowhere.
        forged = json.dumps({"id": "evt_forged_" + new_key(), "type": "charge.succeeded",
                             "data": {"object": {}}}).encode()
        r = u.request("POST", "/webhooks/provider", body=forged, token=None,
                      headers={"Provider-Signature": sign(forged, secret="not-the-secret")})
        expect_problem(r, 401, "webhook-signature-invalid", "a forged event")

        m = scrape(s)
        got = inbox(m)
        grew = {k: got[k] - before[k] for k in got if got[k] != before[k]}
        # The first charge's event must have been applied; the second's either way.
        second = grew.get(("charge.succeeded", "ignored"), 0)
        expect(second in (0, 1), "at most the second charge's event ignored: %r" % grew)
        expected = {("charge.succeeded", "applied"): 2 - second,
                    ("charge.succeeded", "ignored"): second, ("other", "ignored"): 1}
        expect_eq(grew, {k: v for k, v in expected.items() if v},
                  "the inbox's growth after 3 + 2 + 2 deliveries of 3 events and a forgery")
        per_process = {k: metric_value(m, "orderd_webhooks_total", result=k)
                       for k in ("applied", "ignored", "duplicate", "rejected")}
        expect_eq(per_process, {"applied": 2 - second, "ignored": 1 + second, "duplicate": 4,
                                "rejected": 1},
                  "orderd_webhooks_total counts deliveries, not events")
        want = got

        # kill -9 and a restart on the same store: the counters start again, the inbox does not.
        s.kill9()
        s.start()
        m = scrape(s)
        expect_eq(inbox(m), want, "the inbox after kill -9 and a restart")
        expect_eq(metric_value(m, "orderd_webhooks_total"), 0,
                  "orderd_webhooks_total starts again with the process")

        # Another instance on the same store shows the same inbox.
        s2 = Server(name="inbox-orderd-2", db_uri=s.db_uri,
                    extra_args=["--webhook-secret", WEBHOOK_SECRET] + NO_WORKERS)
        try:
            s2.start()
            expect_eq(inbox(scrape(s2)), want, "the inbox as a second instance sees it")
        finally:
            s2.close()
        print("     inbox growth after 7 deliveries of 3 events (+1 forged): %r"
              % {"%s/%s" % k: v for k, v in grew.items()})


def outbox(samples):
    return {st: metric_value(samples, OUTBOX, status=st) for st in ("pending", "sent", "parked")}


def count_rows(uri, table):
    return int(db_query(uri, "SELECT COUNT(*) FROM " + table)[0][0])


@test
def test_retention_sweeps_old_rows_and_keeps_the_inbox_count(_):
    # The sweeper every second; sent emails kept a minute, inbox entries an hour.
    args = NO_WORKERS + ["--sweep-interval-s", "1", "--outbox-retention-s", "60",
                         "--inbox-retention-s", "3600"]
    prov, s = paid_pair(order_args=args, name="inbox-sweep")
    with prov, s:
        u = s.new_user("sweep")
        prov.faults(webhook_dup=2)
        for i in range(3):
            expect_eq(u.create_order(new_key("sweep%d" % i)).status, 201, "order %d" % i)
        wait_until("three confirmation emails sent", lambda: int(db_query(
            s.db_uri, "SELECT COUNT(*) FROM outbox WHERE status = 'sent'")[0][0]) >= 3)
        wait_until("six webhook deliveries",
                   lambda: prov.ledger(keys=False)["webhooks"]["deliveries"]["delivered"] >= 6)
        # A parked email older than any retention is an operator's to decide: it stays.
        db_query(s.db_uri, "INSERT INTO outbox (id, kind, dedupe_key, recipient, payload, status,"
                 " attempts, next_attempt_ms, created_at, last_error) VALUES (?, 'email', ?,"
                 " 'a@example.com', '{}', 'parked', 10, 0, '2000-01-01T00:00:00.000Z', 'test')",
                 ("obx_parked_" + new_key(), "parked-" + new_key()))
        m = scrape(s)
        expect_eq(metric_value(m, "orderd_store_up"), 1, "orderd_store_up while the store answers")
        before_out, before_in = outbox(m), inbox(m)
        sent, events = count_rows(s.db_uri, "outbox WHERE status = 'sent'"), count_rows(
            s.db_uri, "inbox")
        expect_eq(before_out["sent"], sent, "the outbox gauge counts the sent rows")
        expect_eq(sum(before_in.values()), events, "the inbox count is the inbox's rows")

        # Everything sent or received long ago: the next sweeps delete it, in batches.
        db_query(s.db_uri, "UPDATE outbox SET sent_at = '2000-01-01T00:00:00.000Z', "
                 "next_attempt_ms = 0 WHERE status = 'sent'")
        db_query(s.db_uri, "UPDATE inbox SET received_at = '2000-01-01T00:00:00.000Z'")
        wait_until("the old rows swept", lambda: count_rows(s.db_uri, "inbox") == 0 and count_rows(
            s.db_uri, "outbox WHERE status = 'sent'") == 0)
        expect_eq(count_rows(s.db_uri, "outbox WHERE status = 'parked'"), before_out["parked"],
                  "parked emails are not swept")
        m = scrape(s)
        after_out = outbox(m)
        expect_eq(after_out, dict(before_out, sent=0), "the outbox gauge follows the rows")
        expect_eq(inbox(m), before_in, "the inbox count does not drop with the rows")
        # The sweeper counts a batch once its transaction committed, after the rows are gone.
        wait_until("the sweeper to count what it deleted", lambda: metric_value(
            scrape(s), "orderd_worker_items_total", worker="sweeper") >= sent + events)
        print("     swept %d sent emails and %d inbox events; the inbox count stayed %d"
              % (sent, events, sum(before_in.values())))


@test
def test_inbox_retention_shorter_than_an_hour_is_refused(_):
    # The inbox is the dedupe of provider events: swept before the provider stops redelivering
    # one, a redelivery would be taken as a new event.
    p = subprocess.run([ORDERD, "serve", "--listen", "127.0.0.1:0", "--inbox-retention-s", "60"],
                       capture_output=True, timeout=10)
    expect_eq(p.returncode, 2, "exit status of a usage error")
    expect(b"--inbox-retention-s must be 0 or at least 3600" in p.stderr,
           "the error names the flag and the bound: %r" % p.stderr)


@test
def test_metrics_page_is_well_formed_without_a_provider(ctx):
    # orderd without --provider or --webhook-secret: the inbox gauge is there all the same, zeros.
    with Server(name="inbox-plain") as s:
        got = inbox(scrape(s))
        if fresh_db_per_server():
            expect(all(v == 0 for v in got.values()), "no webhook, no inbox entry: %r" % got)


if __name__ == "__main__":
    run("webhook_inbox")
