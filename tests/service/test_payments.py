# SPDX-License-Identifier: Apache-2.0
"""
test_payments.py - external side effects that happen exactly once, over real HTTP
between a real orderd and a real provider-sim:

- an order is charged once and confirmed by one email; a declined card is a stored 402 that
  gives the stock back;
- an unknown outcome (lost response, 5xx, provider down) is 503 outcome-unknown, never stored;
  the retry, the completer or the reconciler settles it against the one charge;
- kill -9 after the provider charged but before orderd committed: after the restart, a retry or
  the completer settles the order against the one existing charge;
- webhooks delivered three times are applied once; a bad signature is 401 and applies nothing;
- cancelling twice, the provider down during the first, refunds exactly once;
- the "profile changed" email goes out only when something changed; a parked email comes back
  with `orderd outbox retry`;
- every payment, refund, outbox and inbox row names its user (NULL only for an event that names
  none);
- provider-sim reads back every object it made, by id, by key and by filter.

Every test starts its own provider-sim and orderd (fresh databases), so they do not interfere.
"""

import http.client
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (ORDERD, Server, charge_key, db_query, expect, expect_eq,  # noqa: E402
                     expect_problem, expect_replay, fail, fresh_db_per_server, metric_value,
                     metrics, new_key, order_of, parse_metrics, retry_after_seconds, run,
                     test)
from provider import (WEBHOOK_SECRET, Provider, paid_pair, retry_until_final, sign,  # noqa: E402
                      wait_until)

FAST = ["--completer-interval-ms", "100", "--reconciler-interval-ms", "100",
        "--reconcile-after-ms", "300", "--outbox-interval-ms", "50"]


def record_status(server, key):
    """The idempotency record of `key` in the server's store: processing, completed or None."""
    rows = db_query(server.db_uri, "SELECT status FROM idem_records WHERE idem_key = ?", (key,))
    return {"0": "processing", "1": "completed"}.get(rows[0][0]) if rows else None


def emails_of(prov, template):
    return prov.ledger(keys=False)["emails"]["byTemplate"].get(template, 0)


def expect_clean(prov, what):
    led = prov.ledger(keys=False)
    if not led["clean"]:
        fail("%s: the provider's ledger flags duplicate effects: %r" % (what, led["duplicates"]))
    return led


@test
def test_order_is_charged_once_and_confirmed_by_one_email(_):
    prov, s = paid_pair(order_args=FAST, name="charge")
    with prov, s:
        u = s.new_user("buyer")
        k = new_key("order")
        first = u.create_order(k, quantity=3)
        expect_eq(first.status, 201, "create with a provider: " + first.describe())
        doc = first.json()
        expect_eq(doc["status"], "paid", "status of a charged order")
        expect_eq(doc["amount"], 3 * 1999, "amount")
        charges = prov.charges_by_key(charge_key(doc["orderId"]))
        expect_eq(len(charges), 1, "charges of the order's derived key")
        expect_eq(doc.get("chargeId"), charges[0]["id"], "chargeId vs the provider's charge")
        expect_eq((charges[0]["amount"], charges[0]["status"]), (3 * 1999, "succeeded"),
                  "the charge")
        expect_replay(u.create_order(k, quantity=3), first, "retry of the paid order")
        expect_eq(order_of(u, doc["orderId"]), doc, "GET of the paid order")
        wait_until("the confirmation email", lambda: emails_of(prov, "order_confirmation") == 1)
        led = expect_clean(prov, "one order")
        expect_eq((led["charges"]["succeeded"], led["emails"]["total"]), (1, 1),
                  "charges and emails after one order and its retry")
        m = metrics(u)
        expect(metric_value(m, "orderd_provider_calls_total", call="charge", outcome="ok") == 1,
               "one charge call to the provider")
        # The relay counts a message after its "sent" commit, a moment after the provider has it.
        sent = wait_until("the outbox relay's count of sent messages",
                          lambda: metric_value(metrics(u), "orderd_worker_items_total",
                                               worker="outbox") or None)
        expect(sent == 1, "the outbox relay sent one message (counted %r)" % sent)


@test
def test_provider_replays_its_own_answer_byte_for_byte(_):
    """provider-sim's own idempotency: a retried charge gets the first answer's status, bytes and
    Content-Type (a 201 charge, and a 402 problem), marked replayed, and no second charge."""
    with Provider(name="prov-replay") as prov:
        for source, status, ctype in (("tok_ok", 201, "application/json"),
                                      ("tok_declined", 402, "application/problem+json")):
            key = new_key("prov-" + source)
            body = json.dumps({"amount": 1250, "currency": "EUR", "source": source}).encode()
            answers = []
            for _ in range(2):
                conn = http.client.HTTPConnection("127.0.0.1", prov.port, timeout=30)
                try:
                    conn.request("POST", "/v1/charges", body=body, headers={
                        "Content-Type": "application/json", "Idempotency-Key": key})
                    r = conn.getresponse()
                    answers.append((r.status, r.getheader("Content-Type"),
                                    r.getheader("Idempotent-Replayed"), r.read()))
                finally:
                    conn.close()
            (s1, ct1, rep1, b1), (s2, ct2, rep2, b2) = answers
            expect_eq(s1, status, "the first %s charge's status" % source)
            expect_eq(ct1, ctype, "the first %s answer's Content-Type" % source)
            expect(rep1 is None, "the first answer is not marked replayed")
            expect_eq((s2, ct2, b2), (s1, ct1, b1), "the retry of %s: the first answer" % source)
            expect_eq(rep2, "true", "the retry of %s is marked replayed" % source)
            expect_eq(len(prov.charges_by_key(key)), 1, "one charge for key %s" % key)


@test
def test_declined_card_is_a_stored_402_and_gives_the_stock_back(_):
    prov, s = paid_pair(order_args=FAST, name="declined")
    with prov, s:
        u = s.new_user("declined")
        k = new_key("declined")
        body = {"productId": "p-limited", "quantity": 3, "paymentSource": "tok_declined"}
        r = u.post("/api/orders", body, key=k)
        doc = expect_problem(r, 402, "payment-declined", "tok_declined")
        oid = doc.get("orderId")
        expect(isinstance(oid, str) and oid.startswith("ord_"), "402 names the order: %r" % doc)
        expect_replay(u.post("/api/orders", body, key=k), r, "retry of the declined order")
        expect_eq(order_of(u, oid)["status"], "payment_failed", "declined order's status")
        led = prov.ledger()
        expect_eq((led["charges"]["succeeded"], led["charges"]["failed"]), (0, 1),
                  "charges after one decline and its retry")
        if fresh_db_per_server():
            # All 3 of p-limited were reserved, then released: they can be bought now.
            ok = u.create_order(new_key(), product="p-limited", quantity=3)
            expect_eq(ok.status, 201, "3 x p-limited after the declined 3: " + ok.describe())
        want = 1 if fresh_db_per_server() else 0
        if want:
            wait_until("the confirmation of the p-limited order",
                       lambda: emails_of(prov, "order_confirmation") >= 1)
        time.sleep(0.3)  # a quiet period: nothing more is sent for the declined order
        expect_eq(emails_of(prov, "order_confirmation"), want,
                  "confirmation emails (none for the declined order)")


def unknown_payments(server):
    r = server.client().get("/metrics")
    return metric_value(parse_metrics(r.body.decode()), "orderd_payments_unknown", kind="charge")


@test
def test_unknown_outcome_is_503_not_stored_and_the_retry_charges_once(_):
    prov, s = paid_pair(order_args=["--reconciler-interval-ms", "0", "--completer-interval-ms",
                                    "0"], name="unknown")
    with prov, s:
        u = s.new_user("unknown")
        # 1. The charge happened, its answer was lost (and its webhook is held back, or it would
        #    settle the order before the second attempt).
        prov.faults(lost_rate=1, webhook_delay_ms=60000)
        k = new_key("lost")
        r = u.create_order(k)
        expect_problem(r, 503, "outcome-unknown", "lost response")
        retry_after_seconds(r, "outcome-unknown")
        again = u.create_order(k)
        expect_problem(again, 503, "outcome-unknown", "lost again (not a stored answer)")
        expect(not again.replayed, "a 503 outcome-unknown must not be replayed")
        orders = u.all_orders()
        expect_eq([o["status"] for o in orders], ["pending_payment"],
                  "the order exists and waits for its payment")
        expect_eq(unknown_payments(s), 1, "orderd_payments_unknown while it is unknown")
        prov.faults(lost_rate=0)
        final, interim = retry_until_final(u, "POST", "/api/orders",
                                           {"productId": "p-1024", "quantity": 2}, key=k)
        expect_eq(final.status, 201, "retry once the provider answers: " + final.describe())
        expect_eq(unknown_payments(s), 0, "orderd_payments_unknown once it is paid")
        oid = final.json()["orderId"]
        expect_eq(oid, orders[0]["orderId"], "the retry finishes the same order")
        charges = prov.charges_by_key(charge_key(oid))
        expect_eq(len(charges), 1, "charges after 3 attempts with one key")
        expect_eq(final.json()["chargeId"], charges[0]["id"], "chargeId")
        # 2. A 5xx: nothing happened at the provider; the retry charges.
        prov.faults(fail_rate=1)
        k2 = new_key("5xx")
        expect_problem(u.create_order(k2), 503, "outcome-unknown", "provider 5xx")
        pending = [o for o in u.all_orders() if o["status"] == "pending_payment"]
        expect_eq(len(pending), 1, "pending orders after the 5xx")
        expect_eq(prov.charges_by_key(charge_key(pending[0]["orderId"])), [],
                  "no charge after a 5xx")
        prov.faults(fail_rate=0)
        final2, _ = retry_until_final(u, "POST", "/api/orders",
                                      {"productId": "p-1024", "quantity": 2}, key=k2)
        expect_eq(final2.status, 201, "retry after the 5xx")
        expect_eq(len(prov.charges_by_key(charge_key(final2.json()["orderId"]))), 1,
                  "charges after the 5xx and the retry")
        led = expect_clean(prov, "unknown outcomes")
        print("     lost response: %d interim answers before 201; provider: %d lost, %d 5xx, "
              "%d charges" % (len(interim), led["requests"]["lostResponses"],
                              led["requests"]["failed5xx"], led["charges"]["succeeded"]))


@test
def test_reconciler_settles_an_unknown_outcome_nobody_retries(_):
    prov, s = paid_pair(order_args=FAST, name="reconcile")
    with prov, s:
        u = s.new_user("reconcile")
        # Keep the webhook out of the way: the reconciler must find the charge by asking.
        prov.faults(lost_rate=1, webhook_delay_ms=60000)
        k = new_key("reconcile")
        first = u.create_order(k)
        expect_problem(first, 503, "outcome-unknown", "lost response")
        prov.faults(lost_rate=0)
        oid = u.all_orders()[0]["orderId"]
        wait_until("the reconciler to settle the order",
                   lambda: order_of(u, oid)["status"] == "paid")
        m = metrics(u)
        expect(metric_value(m, "orderd_worker_items_total", worker="reconciler") >= 1,
               "the reconciler settled it")
        expect(metric_value(m, "orderd_provider_calls_total", call="lookup", outcome="ok") >= 1,
               "the reconciler asked the provider by key")
        r = u.create_order(k)
        expect_eq((r.status, r.replayed), (201, True),
                  "the client's retry replays what the reconciler stored: " + r.describe())
        expect_eq(len(prov.charges_by_key(charge_key(oid))), 1, "charges")
        wait_until("one confirmation email", lambda: emails_of(prov, "order_confirmation") == 1)
        expect_clean(prov, "reconciled order")


@test
def test_a_retry_while_a_worker_recovers_gets_409_recovering(_):
    prov, s = paid_pair(order_args=FAST + ["--wait-ms", "100"], name="recovering")
    with prov, s:
        u = s.new_user("recovering")
        prov.faults(fail_rate=1)
        k = new_key("recovering")
        body = {"productId": "p-1024", "quantity": 1}
        expect_problem(u.post("/api/orders", body, key=k), 503, "outcome-unknown", "5xx")
        # The reconciler will find no charge and make it, slowly, holding the record's lease.
        prov.faults(fail_rate=0, latency_ms=2500)

        def reconciler_holds_the_lease():
            # A recovery worker's lease owner is "<engine owner>/r<n>" (lib/engine.c); before it
            # takes the record, a retry of ours would settle the order itself.
            rows = db_query(s.db_uri, "SELECT lease_owner FROM idem_records WHERE idem_key = ? "
                            "AND status = 0", (k,))
            return bool(rows) and (rows[0][0] or "").rsplit("/", 1)[-1].startswith("r")
        wait_until("the reconciler to take the record's lease", reconciler_holds_the_lease,
                   pause_s=0.05)
        seen = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            r = u.post("/api/orders", body, key=k)
            if r.status == 409:
                doc = expect_problem(r, 409, "idempotency-request-in-progress", "during recovery")
                if doc.get("state") == "recovering":
                    seen = r
                    break
            elif r.status != 503:
                break
            time.sleep(0.1)
        prov.faults(latency_ms=0)
        if seen is None:
            fail("no 409 with \"state\": \"recovering\" while the reconciler held the record; "
                 "last answer %s" % r.describe())
        retry_after_seconds(seen, "409 recovering")
        final, _ = retry_until_final(u, "POST", "/api/orders", body, key=k)
        expect_eq(final.status, 201, "after the recovery")
        expect_eq(len(prov.charges_by_key(charge_key(final.json()["orderId"]))), 1, "charges")


@test
def test_kill9_after_the_charge_settles_against_the_one_charge(_):
    prov, s = paid_pair(order_args=FAST + ["--lease-ms", "1000"],
                        env={"ORDERD_TEST_HOOKS": "1"}, name="crash")
    with prov, s:
        u = s.new_user("crash")
        body = {"productId": "p-1024", "quantity": 2}
        outcomes = []
        for how in ("retry", "completer"):
            k = new_key(how)
            try:
                r = u.post("/api/orders", body, key=k, headers={"X-Test-Crash": "after-charge"})
                fail("X-Test-Crash: after-charge should drop the connection, got " + r.describe())
            except (OSError, http.client.HTTPException):
                pass
            expect_eq(s.wait_exit(10), 137, "orderd's exit status at the crash hook")
            # As after kill -9, nothing happened after the hook: no thread of the dying process
            # finished the record.  (The provider's webhook may have settled the order already,
            # while orderd waited for the charge's answer.)
            expect_eq(record_status(s, k), "processing", "%s: the record after the crash" % how)
            charged = prov.ledger()["charges"]["succeeded"]
            s.start()  # same database, same port: the provider's webhooks find it again
            if how == "retry":
                final, interim = retry_until_final(u, "POST", "/api/orders", body, key=k)
            else:
                # Nobody retries: the restarted orderd's completer finishes the record (after the
                # webhook, maybe) once the dead one's lease expired, which may be before this line
                # runs: the wait is for the record, finished, and this process's completer count.
                def completed():
                    done = metric_value(metrics(u), "orderd_worker_items_total",
                                        worker="completer")
                    return record_status(s, k) == "completed" and done >= 1

                wait_until("the completer to finish the record", completed,
                           describe=lambda: "record %s, completer items %g" % (
                               record_status(s, k), metric_value(
                                   metrics(u), "orderd_worker_items_total", worker="completer")))
                final, interim = u.post("/api/orders", body, key=k), []
                expect(final.replayed, "after the completer, the retry is a replay: " +
                       final.describe())
            expect_eq(final.status, 201, "%s after the crash: %s" % (how, final.describe()))
            doc = final.json()
            charges = prov.charges_by_key(charge_key(doc["orderId"]))
            expect_eq(len(charges), 1, "%s: charges for the crashed order" % how)
            expect_eq(doc.get("chargeId"), charges[0]["id"],
                      "%s: the order is settled against the charge made before the crash" % how)
            expect_eq(doc["status"], "paid", "%s: status" % how)
            outcomes.append("%s: provider had charged (%d charges), orderd settled the order "
                            "against it%s" % (how, charged, " (interim %r)" % interim[:4]
                                              if interim else ""))
        orders = u.all_orders()
        expect_eq(len(orders), 2, "orders after two crashes")
        wait_until("two confirmation emails", lambda: emails_of(prov, "order_confirmation") == 2)
        expect_clean(prov, "crash after charge")
        print("     kill -9 after the charge, restart; " + "; ".join(outcomes))


@test
def test_webhooks_delivered_three_times_are_applied_once(_):
    # No reconciler, no completer: the webhook is what settles the order whose answer was lost.
    prov, s = paid_pair(order_args=["--reconciler-interval-ms", "0", "--completer-interval-ms",
                                    "0", "--outbox-interval-ms", "50"], name="dup")
    with prov, s:
        u = s.new_user("dup")
        prov.faults(lost_rate=1, webhook_dup=3)
        k = new_key("dup")
        expect_problem(u.create_order(k), 503, "outcome-unknown", "lost response")
        prov.faults(lost_rate=0)
        wait_until("three deliveries of charge.succeeded",
                   lambda: prov.ledger(keys=False)["webhooks"]["deliveries"]["delivered"] == 3)
        m = metrics(u)
        applied = metric_value(m, "orderd_webhooks_total", result="applied")
        dups = metric_value(m, "orderd_webhooks_total", result="duplicate")
        expect_eq((applied, dups), (1, 2), "webhooks (applied, duplicate) after 3 deliveries")
        oid = u.all_orders()[0]["orderId"]
        doc = order_of(u, oid)
        charges = prov.charges_by_key(charge_key(oid))
        expect_eq((doc["status"], doc.get("chargeId")), ("paid", charges[0]["id"]),
                  "the order the webhook settled")
        final, _ = retry_until_final(u, "POST", "/api/orders",
                                     {"productId": "p-1024", "quantity": 2}, key=k)
        expect_eq((final.status, final.json()["chargeId"]), (201, charges[0]["id"]),
                  "the client's retry")
        wait_until("one confirmation email", lambda: emails_of(prov, "order_confirmation") == 1)
        time.sleep(0.3)  # a quiet period: no second confirmation follows
        expect_eq(emails_of(prov, "order_confirmation"), 1, "confirmation emails")

        # The same event, signed, three times at once: one inbox row, two duplicates.
        event = json.dumps({"id": "evt_test_" + new_key(), "type": "test.ping",
                            "data": {"object": {}}}).encode()
        results = []

        def deliver():
            r = u.request("POST", "/webhooks/provider", body=event, token=None,
                          headers={"Provider-Signature": sign(event)})
            results.append((r.status, r.json().get("duplicate")))
        threads = [threading.Thread(target=deliver) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        expect_eq(sorted(results), [(200, False), (200, True), (200, True)],
                  "three concurrent deliveries of one event")
        print("     lost charge answer, 3 deliveries: applied %d, duplicates %d; 3 concurrent "
              "copies of one event: %r" % (applied, dups, sorted(results)))


@test
def test_bad_signature_is_401_and_applies_nothing(_):
    prov, s = paid_pair(order_args=["--reconciler-interval-ms", "0", "--completer-interval-ms",
                                    "0"], name="badsig")
    with prov, s:
        u = s.new_user("badsig")
        prov.faults(fail_rate=1)  # the charge never happens: the order waits for its payment
        expect_problem(u.create_order(new_key()), 503, "outcome-unknown", "5xx")
        prov.faults(fail_rate=0)
        oid = u.all_orders()[0]["orderId"]
        event = json.dumps({
            "id": "evt_forged_" + new_key(), "type": "charge.succeeded",
            "data": {"object": {"id": "ch_forged", "object": "charge", "status": "succeeded",
                                "idempotency_key": charge_key(oid),
                                "metadata": {"orderId": oid}}}}).encode()

        def post(headers):
            return u.request("POST", "/webhooks/provider", body=event, token=None,
                             headers=headers)
        cases = [
            ("wrong secret", {"Provider-Signature": sign(event, secret="not-the-secret")}),
            ("stale timestamp", {"Provider-Signature": sign(event, t=time.time() - 3600)}),
            ("no signature", {}),
            ("tampered body", {"Provider-Signature": sign(event + b" ")}),
            ("garbage", {"Provider-Signature": "t=1,v1=zz"}),
        ]
        for what, headers in cases:
            expect_problem(post(headers), 401, "webhook-signature-invalid", what)
            expect_eq(order_of(u, oid)["status"], "pending_payment", "order after " + what)
        m = metrics(u)
        expect_eq(metric_value(m, "orderd_webhooks_total", result="rejected"), len(cases),
                  "rejected webhooks")
        # Nothing was recorded either: the same event, signed right, is applied (not a duplicate).
        ok = post({"Provider-Signature": sign(event)})
        expect_eq((ok.status, ok.json().get("result")), (200, "applied"),
                  "the event correctly signed: " + ok.describe())
        expect_eq(order_of(u, oid)["status"], "paid", "order after the valid webhook")


@test
def test_cancel_twice_with_the_provider_down_refunds_once(_):
    prov, s = paid_pair(order_args=FAST, name="refund")
    with prov, s:
        u = s.new_user("refund")
        created = u.create_order(new_key("order"))
        expect_eq(created.status, 201, "paid order")
        oid = created.json()["orderId"]
        prov.stop()  # the provider is down
        k1 = new_key("cancel1")
        first = u.cancel(oid, k1)
        expect_problem(first, 503, "outcome-unknown", "cancel while the provider is down")
        doc = order_of(u, oid)
        expect_eq((doc["status"], doc.get("refundStatus")), ("cancelled", "requested"),
                  "order after the first cancel")
        prov.start()  # back, on the same port
        k2 = new_key("cancel2")
        second, _ = retry_until_final(u, "POST", "/api/orders/%s/cancel" % oid, key=k2)
        expect_eq(second.status, 200, "second cancel: " + second.describe())
        expect_eq(second.json().get("refundStatus"), "refunded", "refund after the second cancel")
        again, _ = retry_until_final(u, "POST", "/api/orders/%s/cancel" % oid, key=k1)
        expect_eq((again.status, again.json().get("refundStatus")), (200, "refunded"),
                  "retry of the first cancel")
        third = u.cancel(oid, new_key("cancel3"))
        expect_eq((third.status, third.json().get("refundStatus")), (200, "refunded"),
                  "a third cancel")
        # A quiet period (the refund was made before the second cancel answered): the workers and
        # the refund webhook get time to make a second refund, which must not come.
        time.sleep(0.5)
        led = expect_clean(prov, "cancel twice")
        expect_eq((led["refunds"]["total"], led["refunds"]["amount"]), (1, 2 * 1999),
                  "refunds after three cancels, the provider down during the first")
        print("     first cancel 503 (provider down), second 200 refunded; provider: %d refund "
              "of %d" % (led["refunds"]["total"], led["refunds"]["amount"]))


@test
def test_cancel_of_an_unsettled_order_is_refused_and_not_stored(_):
    prov, s = paid_pair(order_args=["--reconciler-interval-ms", "0", "--completer-interval-ms",
                                    "0"], name="pending")
    with prov, s:
        u = s.new_user("pending")
        prov.faults(fail_rate=1)
        k = new_key("order")
        expect_problem(u.create_order(k), 503, "outcome-unknown", "5xx")
        oid = u.all_orders()[0]["orderId"]
        kc = new_key("cancel")
        r = u.cancel(oid, kc)
        expect_problem(r, 409, "order-payment-pending", "cancel of a pending order")
        retry_after_seconds(r, "order-payment-pending")
        prov.faults(fail_rate=0)
        final, _ = retry_until_final(u, "POST", "/api/orders",
                                     {"productId": "p-1024", "quantity": 2}, key=k)
        expect_eq(final.status, 201, "the order once the provider is back")
        c = u.cancel(oid, kc)
        expect_eq((c.status, c.replayed, c.json().get("refundStatus")), (200, False, "refunded"),
                  "the same cancel key runs now (the 409 was not stored)")


@test
def test_profile_email_only_when_something_changed(_):
    prov, s = paid_pair(order_args=FAST, name="profile")
    with prov, s:
        u = s.new_user("profile")
        body = {"name": "Ada", "email": "ada@example.com"}
        k = new_key("p")
        first = u.put("/api/me/profile", body, key=k)
        expect_eq((first.status, first.json()["changed"]), (200, True), "first PUT")
        expect_replay(u.put("/api/me/profile", body, key=k), first, "retry of the first PUT")
        same = u.put("/api/me/profile", body, key=new_key("p"))
        expect_eq(same.json()["changed"], False, "same profile, new key")
        same2 = u.put("/api/me/profile", body)
        expect_eq(same2.json()["changed"], False, "same profile, no key")
        other = u.put("/api/me/profile", {"name": "Ada", "email": "ada@example.org"})
        expect_eq(other.json()["changed"], True, "new email")
        # The new address is told, and the old one too (a stolen token must not silence it).
        wait_until("three profile emails", lambda: emails_of(prov, "profile_changed") == 3)
        time.sleep(0.3)  # a quiet period: no fourth email follows
        expect_eq(emails_of(prov, "profile_changed"), 3,
                  "profile emails for 2 changes in 5 PUTs, the second to both addresses")
        _, lst = prov.call("GET", "/v1/emails")
        tos = sorted(e["to"] for e in lst["data"] if e["template"] == "profile_changed")
        expect_eq(tos, ["ada@example.com", "ada@example.com", "ada@example.org"],
                  "recipients of the profile emails")
        # The confirmation of an order goes to the profile's address.
        u.create_order(new_key())
        wait_until("the confirmation", lambda: emails_of(prov, "order_confirmation") == 1)
        _, lst = prov.call("GET", "/v1/emails")
        conf = [e for e in lst["data"] if e["template"] == "order_confirmation"]
        expect_eq(conf[0]["to"], "ada@example.org", "recipient of the confirmation")


@test
def test_every_per_user_row_names_its_user(_):
    # On a shard set a move of a user's bucket selects the user's rows by their user_id
    # (docs/orderd.md): each row an order, a cancel, a profile change or a webhook makes names it.
    prov, s = paid_pair(order_args=FAST, name="owner")
    with prov, s:
        u = s.new_user("owner")
        expect_eq(u.put("/api/me/profile", {"name": "Ann", "email": "ann@example.com"}).status,
                  200, "profile PUT")
        created = u.create_order(new_key("order"))
        expect_eq(created.status, 201, "paid order")
        oid = created.json()["orderId"]
        expect_eq(u.cancel(oid, new_key("cancel")).json().get("refundStatus"), "refunded",
                  "cancel")
        user = db_query(s.db_uri, "SELECT user_id FROM orders WHERE id = ?", (oid,))[0][0]
        ping = json.dumps({"id": "evt_ping_" + new_key(), "type": "test.ping",
                           "data": {"object": {}}}).encode()
        r = u.request("POST", "/webhooks/provider", body=ping, token=None,
                      headers={"Provider-Signature": sign(ping)})
        expect_eq(r.status, 200, "a webhook that names no user")
        wait_until("the charge's and the refund's webhooks", lambda: int(db_query(
            s.db_uri, "SELECT COUNT(*) FROM inbox WHERE type IN ('charge.succeeded', "
            "'refund.succeeded')")[0][0]) == 2)
        for table in ("payments", "refunds"):
            expect_eq(db_query(s.db_uri, "SELECT user_id FROM %s WHERE order_id = ?" % table,
                               (oid,)), [[user]], "user_id of the order's row in " + table)
        rows = db_query(s.db_uri, "SELECT kind, COALESCE(user_id, 'NULL') FROM outbox")
        expect_eq(sorted(rows), [["order_confirmation", user], ["profile_changed", user]],
                  "user_id of the outbox rows")
        rows = db_query(s.db_uri, "SELECT type, COALESCE(user_id, 'NULL') FROM inbox")
        expect_eq(sorted(rows),
                  [["charge.succeeded", user], ["refund.succeeded", user], ["test.ping", "NULL"]],
                  "user_id of the inbox rows (NULL when the event names no user)")


def outbox_cli(server, *args):
    p = subprocess.run([ORDERD, "outbox"] + list(args) + ["--db", server.db_uri],
                       capture_output=True, timeout=30)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


@test
def test_outbox_parks_a_failing_email_and_retry_sends_it_once(_):
    prov, s = paid_pair(order_args=FAST + ["--outbox-max-attempts", "2"], name="outbox")
    with prov, s:
        u = s.new_user("outbox")
        prov.faults(fail_rate=1)
        expect_eq(u.put("/api/me/profile", {"name": "Bo", "email": "bo@example.com"}).status, 200,
                  "profile PUT")

        def parked():
            rc, out, _ = outbox_cli(s, "list", "--status", "parked")
            lines = [ln for ln in out.splitlines() if ln.startswith("obx_")]
            return lines[0].split()[0] if rc == 0 and lines else None
        msg = wait_until("the email to be parked after 2 failures", parked)
        expect_eq(emails_of(prov, "profile_changed"), 0, "emails sent while the provider fails")
        prov.faults(fail_rate=0)
        time.sleep(0.3)  # a quiet period (the relay runs every 50 ms): the parked email stays
        expect_eq(emails_of(prov, "profile_changed"), 0, "a parked email is not retried by itself")
        rc, out, err = outbox_cli(s, "retry", msg)
        expect_eq(rc, 0, "orderd outbox retry %s: %s %s" % (msg, out, err))
        wait_until("the retried email", lambda: emails_of(prov, "profile_changed") == 1)
        rc, out, err = outbox_cli(s, "retry", msg)
        expect_eq(rc, 1, "retry of a sent message: %s %s" % (out, err))
        expect("sent already" in err, "retry of a sent message says so: %r" % err)
        rc, out, err = outbox_cli(s, "retry", "obx_nosuchmessage")
        expect_eq(rc, 1, "retry of an unknown message")
        rc, out, err = outbox_cli(s, "list")
        expect(rc == 0 and msg in out and " sent " in out, "list shows the sent message: " + out)
        rc, out, err = outbox_cli(s, "bogus")
        expect_eq(rc, 2, "unknown outbox subcommand")
        time.sleep(0.3)  # a quiet period: the retried email is not sent twice
        expect_eq(emails_of(prov, "profile_changed"), 1, "emails in the end")


@test
def test_sqlite_sync_normal_is_refused_with_a_provider(_):
    # Phase 1 must be on disk before the charge: normal does not fsync every commit, and a lost
    # phase 1 would be run again with a new order id, so a second charge.
    p = subprocess.run([ORDERD, "serve", "--listen", "127.0.0.1:0", "--sqlite-sync", "normal",
                        "--provider", "http://127.0.0.1:1"], capture_output=True, timeout=10)
    expect_eq(p.returncode, 2, "exit status of serve --sqlite-sync normal --provider")
    expect(b"--sqlite-sync normal cannot be used with --provider" in p.stderr,
           "the refusal says why: %r" % p.stderr)


@test
def test_provider_refuses_json_nested_too_deep_before_parsing_it(_):
    # 65 levels is one too many; 100,000 would cost a recursive parser its
    # stack.  Both are a plain 400 invalid-json that says why, and the provider stays up.
    with Provider(name="deep") as prov:
        for depth in (65, 100000):
            body = '{"amount":' + "[" * depth + "]" * depth + "}"
            status, doc = raw_post(prov, "/v1/charges", body, new_key("deep"))
            expect(status == 400 and doc.get("code") == "invalid-json" and
                   "nested more than 64" in doc.get("detail", ""),
                   "depth %d: %s %r" % (depth, status, doc))
        status, _ = prov.call("GET", "/healthz")
        expect_eq(status, 200, "provider-sim after the deep bodies")


@test
def test_outbox_list_escapes_what_users_and_providers_wrote(_):
    # a recipient or a provider's error text with ESC or a newline must not
    # drive the operator's terminal or forge a line of `orderd outbox list`.
    s = Server(name="outbox-esc")
    with s:
        db_query(s.db_uri, "INSERT INTO outbox (id, kind, dedupe_key, recipient, payload, status,"
                 " attempts, next_attempt_ms, last_error, created_at) VALUES"
                 " ('ob_esc', 'email', 'esc-1', ?, '{}', 'parked', 5, 0, ?, 'now')",
                 ("evil\x1b[2J@example.org", "provider said\nob_fake sent 0"))
        code, out, err = outbox_cli(s, "list")
        expect_eq(code, 0, "outbox list (stderr %r)" % err)
        expect("\x1b" not in out and "\x1b" not in err, "no raw ESC in the output: %r" % out)
        lines = [ln for ln in out.splitlines() if "ob_esc" in ln or "ob_fake" in ln]
        expect(len(lines) == 1 and "\\x1B[2J" in lines[0] and "\\x0Aob_fake" in lines[0],
               "one line, escaped: %r" % out)


def sweep_record(server, key):
    """Ages the record of `key` past its retention; the sweeper (1 s) then deletes it."""
    db_query(server.db_uri, "UPDATE idem_records SET expires_ms = 1, lease_expires_ms = 0"
             " WHERE idem_key = ?", (key,))
    wait_until("the record of %s swept" % key, lambda: db_query(
        server.db_uri, "SELECT count(*) FROM idem_records WHERE idem_key = ?",
        (key,))[0][0] == "0")


@test
def test_order_whose_record_was_swept_while_unpaid_still_ends_paid(_):
    # The provider refuses every charge (503, nothing done), so the order waits
    # with its payment unknown; its record is then swept.  Before, the reconciler only looked the
    # charge up, found none, and flagged the order again for ever, and a late retry was stored
    # as 200 with the unpaid order.  Now both roll forward: the charge is made with the order's
    # derived key, once.
    args = ["--completer-interval-ms", "0", "--reconciler-interval-ms", "100",
            "--outbox-interval-ms", "50", "--sweep-interval-s", "1"]
    prov, s = paid_pair(order_args=args + ["--reconcile-after-ms", "300"], name="orphan")
    with prov, s:
        u = s.new_user("orphan")
        prov.faults(fail_rate=1.0)
        k = new_key("orphan")
        r = u.create_order(k)
        expect_problem(r, 503, "outcome-unknown", "the charge refused by a failing provider")
        oid = db_query(s.db_uri, "SELECT id FROM orders WHERE idem_key = ?", (k,))[0][0]
        sweep_record(s, k)
        prov.faults(fail_rate=0.0)
        wait_until("the reconciler to settle %s" % oid,
                   lambda: order_of(u, oid)["status"] == "paid")
        expect_eq(len(prov.charges_by_key(charge_key(oid))), 1, "charges of the order's key")
        expect_eq(metric_value(metrics(u), "orderd_orphan_payments_total", result="paid"), 1,
                  "orphan payments settled")
        # A retry now finds the paid order.
        late = u.create_order(k)
        expect(late.status in (200, 201) and late.json()["status"] == "paid",
               "a late retry: %s" % late.describe())
    # The same with the client's late retry first: it settles the charge itself, and its answer
    # (stored) is the paid order, not the unpaid one.
    prov, s = paid_pair(order_args=args + ["--reconcile-after-ms", "600000"], name="orphan-late")
    with prov, s:
        u = s.new_user("orphan-late")
        prov.faults(fail_rate=1.0)
        k = new_key("late")
        expect_problem(u.create_order(k), 503, "outcome-unknown", "the charge refused")
        oid = db_query(s.db_uri, "SELECT id FROM orders WHERE idem_key = ?", (k,))[0][0]
        sweep_record(s, k)
        prov.faults(fail_rate=0.0)
        late = u.create_order(k)
        expect(late.status in (200, 201) and late.json().get("status") == "paid" and
               late.json().get("orderId") == oid, "the late retry pays: %s" % late.describe())
        again = u.create_order(k)
        expect(again.replayed and again.body == late.body, "then replayed: %s" % again.describe())
        expect_eq(len(prov.charges_by_key(charge_key(oid))), 1, "charges of the order's key")
        expect_clean(prov, "orphan orders")


@test
def test_provider_reads_back_each_object_by_id_key_and_filter(_):
    """What a client's reconciler asks provider-sim: every object it made (charge, refund, email)
    by its id, by its Idempotency-Key and (refunds) by their charge; a 404 with the object's own
    code for an unknown id; 405 for a method the path does not take."""
    with Provider(name="prov-reads") as prov:
        made = {}
        for path, body in (("/v1/charges", {"amount": 900, "currency": "EUR", "source": "tok_ok"}),
                           ("/v1/emails", {"to": "a@example.com", "subject": "s", "template": "t"})):
            key = new_key("read")
            status, doc = prov.call("POST", path, body, {"Idempotency-Key": key})
            expect_eq(status, 201, "POST %s: %r" % (path, doc))
            made[path] = (doc, key)
        charge = made["/v1/charges"][0]
        key = new_key("read-refund")
        status, doc = prov.call("POST", "/v1/refunds", {"charge": charge["id"], "amount": 400},
                                {"Idempotency-Key": key})
        expect_eq(status, 201, "POST /v1/refunds: %r" % doc)
        made["/v1/refunds"] = (doc, key)
        for path, (doc, key) in made.items():
            status, got = prov.call("GET", "%s/%s" % (path, doc["id"]))
            expect_eq((status, got), (200, doc), "GET %s/%s" % (path, doc["id"]))
            status, got = prov.call("GET", "%s?idempotency_key=%s" % (path, key))
            expect_eq((status, got["data"]), (200, [doc]), "GET %s by its key" % path)
            status, got = prov.call("GET", path)
            expect(status == 200 and doc in got["data"], "GET %s lists it: %r" % (path, got))
            status, got = prov.call("PUT", "%s/%s" % (path, doc["id"]))
            expect_eq(status, 405, "PUT %s/%s" % (path, doc["id"]))
        status, got = prov.call("GET", "/v1/refunds?charge=" + charge["id"])
        expect_eq((status, got["data"]), (200, [made["/v1/refunds"][0]]), "refunds of the charge")
        for path, code in (("/v1/charges", "charge-not-found"), ("/v1/refunds", "not-found"),
                           ("/v1/emails", "email-not-found")):
            status, got = prov.call("GET", path + "/nope")
            expect_eq((status, got.get("code")), (404, code), "GET %s/nope" % path)


def faults_from(prov, source, body=None):
    """GET (or POST `body` to) /v1/faults from the client address `source`: (status, doc)."""
    conn = http.client.HTTPConnection("127.0.0.1", prov.port, timeout=30,
                                      source_address=(source, 0))
    try:
        if body is None:
            conn.request("GET", "/v1/faults")
        else:
            conn.request("POST", "/v1/faults", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


@test
def test_provider_faults_only_from_the_clients_it_names(_):
    # /v1/faults is a test harness's switch, not anyone's.  Loopback (any
    # 127.x) by default; --faults-from narrows it (here to 127.0.0.1, so 127.0.0.2 is refused).
    with Provider(name="faults-default") as prov:
        expect_eq(faults_from(prov, "127.0.0.2")[0], 200, "127.0.0.2, loopback by default")
    with Provider(args=["--faults-from", "127.0.0.1"], name="faults-narrow") as prov:
        status, doc = faults_from(prov, "127.0.0.2", {"fail_rate": 1.0})
        expect(status == 403 and doc.get("code") == "forbidden", "POST from 127.0.0.2: %s %r"
               % (status, doc))
        expect_eq(faults_from(prov, "127.0.0.2")[0], 403, "GET from 127.0.0.2")
        status, doc = faults_from(prov, "127.0.0.1")
        expect(status == 200 and doc.get("fail_rate") == 0, "127.0.0.1 may, and nothing "
               "changed: %s %r" % (status, doc))


def raw_post(prov, path, body, key):
    conn = http.client.HTTPConnection("127.0.0.1", prov.port, timeout=30)
    try:
        conn.request("POST", path, body=body.encode(),
                     headers={"Content-Type": "application/json", "Idempotency-Key": key})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


if __name__ == "__main__":
    run("test_payments")
