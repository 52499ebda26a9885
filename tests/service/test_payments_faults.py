# SPDX-License-Identifier: Apache-2.0
"""
test_payments_faults.py - the fault run: 500 orders while the provider loses 20% of its
responses after charging, answers 10% of its POSTs with a 5xx, adds latency, and delivers every
webhook twice.  Clients retry with the same keys (a 503 outcome-unknown, a 409 and a dropped
connection are all retried).  Once the workers have run, the provider's ledger must show exactly
500 charges (one per order, none twice), 500 confirmation emails, nothing flagged as a duplicate,
and every order must be paid, its record completed (a last retry of each key is a replay).
One client in five is impatient: it sends once and never retries, so what it started is left to
the workers (completer, reconciler) and the webhooks.  The counts of the run are printed.
"""

import http.client
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (db_query, expect, expect_eq, fail, metric_value, new_key,  # noqa: E402
                     parse_metrics, run, test)
from provider import paid_pair, retry_until_final, wait_until  # noqa: E402

ORDERS = 500
CLIENTS = 16
RUN_DEADLINE_S = 75.0
IMPATIENT_EVERY = 5


def unfinished_records(server):
    """Idempotency records still processing, read from the server's store (a test's back door)."""
    return int(db_query(server.db_uri, "SELECT COUNT(*) FROM idem_records WHERE status = 0")[0][0])


@test
def test_500_orders_through_a_faulty_provider_charge_and_email_exactly_once(_):
    prov, s = paid_pair(
        provider_args=["--lost-rate", "0.2", "--fail-rate", "0.1", "--latency-ms", "2",
                       "--latency-jitter-ms", "8", "--webhook-dup", "2"],
        order_args=["--completer-interval-ms", "200", "--reconciler-interval-ms", "200",
                    "--reconcile-after-ms", "500", "--outbox-interval-ms", "50",
                    "--outbox-max-attempts", "40",
                    # 30 % of deliveries fail: a 2 s cap keeps an unlucky email's 7th try
                    # inside the drain wait (60 s cap: ~11 % of runs had one email still due).
                    "--outbox-backoff-max-ms", "2000", "--wait-ms", "200", "--db-pool", "32"],
        name="faults")
    with prov, s:
        users = [s.new_user("fault%d" % i) for i in range(CLIENTS)]
        plan = [(i % CLIENTS, new_key("o%d" % i), 1 + i % 5) for i in range(ORDERS)]
        impatient = {key for i, (_, key, _) in enumerate(plan) if i % IMPATIENT_EVERY == 0}
        gave_up = set()
        finals = {}
        interims = {"503-outcome-unknown": 0, "409": 0, "409-recovering": 0, "errors": 0,
                    "other": 0}
        lock = threading.Lock()
        errors = []
        t0 = time.monotonic()

        def client(ci):
            try:
                for uidx, key, qty in plan:
                    if uidx != ci:
                        continue
                    if key in impatient:
                        try:
                            r = users[ci].create_order(key, quantity=qty, timeout=10)
                        except (OSError, http.client.HTTPException):
                            r = None
                        with lock:
                            if r is not None and r.status == 201:
                                finals[key] = r
                            else:
                                gave_up.add(key)
                        continue
                    r, interim = retry_until_final(
                        users[ci], "POST", "/api/orders", {"productId": "p-1024", "quantity": qty},
                        key=key, deadline_s=RUN_DEADLINE_S, pause_s=0.02)
                    with lock:
                        finals[key] = r
                        for it in interim:
                            if it in interims:
                                interims[it] += 1
                            elif isinstance(it, str) and not it.startswith("503"):
                                interims["errors"] += 1
                            else:
                                interims["other"] += 1
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(e)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(RUN_DEADLINE_S + 15)
        took = time.monotonic() - t0
        if errors:
            fail("a client failed: %s" % errors[0])
        expect_eq(len(finals) + len(gave_up), ORDERS, "orders with a final answer or given up")
        bad = [r for r in finals.values() if r.status != 201]
        if bad:
            fail("%d orders did not end in 201, e.g. %s" % (len(bad), bad[0].describe()))

        # Settled by the workers alone: every order paid, every record completed, every email sent.
        def unpaid():
            orders = [o for u in users for o in u.all_orders()]
            return [o for o in orders if o["status"] != "paid"], len(orders)

        def state():
            bad, n = unpaid()
            m = parse_metrics(users[0].get("/metrics").body.decode())
            return ("%d orders, %d not paid (e.g. %r); %d records processing; outbox %s; "
                    "worker items %s; provider %r\n%s" % (
                        n, len(bad), bad[:3], unfinished_records(s),
                        {st: metric_value(m, "orderd_outbox_messages", status=st)
                         for st in ("pending", "sent", "parked")},
                        {w: metric_value(m, "orderd_worker_items_total", worker=w)
                         for w in ("completer", "reconciler", "outbox")},
                        prov.ledger(keys=False), s.logs()))
        wait_until("every order paid", lambda: unpaid() == ([], ORDERS), timeout_s=60,
                   pause_s=0.5, describe=state)
        wait_until("every idempotency record completed", lambda: unfinished_records(s) == 0,
                   timeout_s=60, pause_s=0.5, describe=state)
        wait_until("%d confirmation emails" % ORDERS,
                   lambda: prov.ledger(keys=False)["emails"]["byTemplate"].get(
                       "order_confirmation", 0) >= ORDERS, timeout_s=60, pause_s=0.5,
                   describe=state)
        wait_until("the outbox to drain",
                   lambda: metric_value(parse_metrics(users[0].get("/metrics").body.decode()),
                                        "orderd_outbox_messages", status="sent") >= ORDERS,
                   timeout_s=60, pause_s=0.5, describe=state)
        # A quiet period, not a wait: anything still in flight would show as an extra effect now.
        time.sleep(1.0)
        led = prov.ledger()
        if not led["clean"]:
            fail("the ledger flags duplicates: %r" % led["duplicates"][:10])
        charges = led["charges"]
        order_ids = {o["orderId"] for u in users for o in u.all_orders()}
        expect_eq(len(order_ids), ORDERS, "distinct orders")
        keys = {"order-%s-charge" % oid for oid in order_ids}
        expect_eq(charges["succeeded"], ORDERS, "charges made by the provider")
        expect_eq(set(charges["byKey"]), keys, "charge keys vs the orders' derived keys")
        expect(all(n == 1 for n in charges["byKey"].values()), "a key charged twice")
        expect_eq(led["emails"]["byTemplate"].get("order_confirmation"), ORDERS,
                  "confirmation emails")
        expect_eq(led["emails"]["total"], ORDERS, "emails in total")
        for key, r in finals.items():
            doc = r.json()
            expect(doc["status"] == "paid" and doc.get("chargeId"), "order %s: %r" % (key, doc))
        replays = 0
        for uidx, key, qty in plan:
            again = users[uidx].create_order(key, quantity=qty)
            first = finals.get(key)
            if again.status != 201 or not again.replayed or (first and again.body != first.body):
                fail("key %s after the run: expected the stored 201 replayed, got %s "
                     "(first final: %s)" % (key, again.describe(),
                                            first.describe() if first else "gave up"))
            replays += 1

        m = parse_metrics(users[0].get("/metrics").body.decode())
        rq = led["requests"]
        hooks = led["webhooks"]
        print("     %d orders, %d clients, %.1f s; %d of the %d impatient orders were given up "
              "after one unanswered try; in the end all paid, %d keys replay their 201" % (
                  ORDERS, CLIENTS, took, len(gave_up), len(impatient), replays))
        print("     provider: %d POSTs -> %d executed, %d replayed, %d lost responses, %d 5xx, "
              "%d in-progress/reused" % (rq["posts"], rq["executed"], rq["replayed"],
                                         rq["lostResponses"], rq["failed5xx"], rq["conflicts"]))
        print("     ledger: %d charges (%d keys, max %d per key), %d confirmation emails, "
              "%d refunds, duplicates flagged: %d" % (
                  charges["succeeded"], len(charges["byKey"]), max(charges["byKey"].values()),
                  led["emails"]["byTemplate"].get("order_confirmation", 0),
                  led["refunds"]["total"], len(led["duplicates"])))
        print("     clients saw: %d x 503 outcome-unknown, %d x 409 in progress, %d x 409 "
              "recovering, %d connection errors, %d other" % (
                  interims["503-outcome-unknown"], interims["409"], interims["409-recovering"],
                  interims["errors"], interims["other"]))
        print("     orderd: charge calls ok/refused/unknown %d/%d/%d, lookups %d, email calls "
              "ok/unknown %d/%d; completer settled %d, reconciler %d, outbox sent %d; webhooks "
              "%d events x2: applied %d, ignored %d, duplicate %d" % (
                  metric_value(m, "orderd_provider_calls_total", call="charge", outcome="ok"),
                  metric_value(m, "orderd_provider_calls_total", call="charge",
                               outcome="refused"),
                  metric_value(m, "orderd_provider_calls_total", call="charge",
                               outcome="unknown"),
                  metric_value(m, "orderd_provider_calls_total", call="lookup"),
                  metric_value(m, "orderd_provider_calls_total", call="email", outcome="ok"),
                  metric_value(m, "orderd_provider_calls_total", call="email", outcome="unknown"),
                  metric_value(m, "orderd_worker_items_total", worker="completer"),
                  metric_value(m, "orderd_worker_items_total", worker="reconciler"),
                  metric_value(m, "orderd_worker_items_total", worker="outbox"),
                  hooks["events"],
                  metric_value(m, "orderd_webhooks_total", result="applied"),
                  metric_value(m, "orderd_webhooks_total", result="ignored"),
                  metric_value(m, "orderd_webhooks_total", result="duplicate")))


if __name__ == "__main__":
    run("test_payments_faults")
