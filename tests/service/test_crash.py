# SPDX-License-Identifier: Apache-2.0
"""
test_crash.py - kill -9 in the middle of the traffic, restart on the same database, retry.

A crash must never lose an acknowledged order nor let a retry create a second one: after the
restart every key, retried with its body, ends with exactly one order, and an order the client
saw acknowledged comes back unchanged (same orderId, byte-identical body).  The second test
crashes the server right after phase 1 committed (ORDERD_TEST_HOOKS=1) and checks that the retry
takes the lease over once it expires and finishes the order phase 1 created, instead of making a
new one.
"""

import http.client
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Server, expect, expect_eq, expect_problem, expect_replay, fail,  # noqa: E402
                     fresh_db_per_server, new_key, retry_after_seconds, run, test,
                     wait_until, wait_order_committed)

WRITERS = 8
STREAM_SECONDS = 1.5
LEASE_MS = 1000
RETRY_DEADLINE_S = 25.0


def retry_until_final(client, key, body, deadline_s=RETRY_DEADLINE_S, headers=None):
    """
    Retries like a well-behaved client: 409 in progress and 503 are retried after Retry-After
    (capped, as the lease here is short), connection errors too.  Returns (final Response, list of
    interim statuses).
    """
    interim = []
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            r = client.post("/api/orders", body, key=key, headers=headers)
        except (OSError, http.client.HTTPException) as e:
            interim.append(type(e).__name__)
            r = None
        if r is not None and r.status not in (409, 503):
            return r, interim
        if r is not None:
            if r.status == 409:
                expect_problem(r, 409, "idempotency-request-in-progress", "retry of %s" % key)
            else:
                expect_problem(r, 503, r.json().get("code"), "retry of %s" % key)
            wait = retry_after_seconds(r, "retry of %s" % key)
            interim.append(r.status)
        else:
            wait = 0.2
        if time.monotonic() > deadline:
            fail("key %s: still no final answer after %.0f s; interim answers %r, last %s" % (
                key, deadline_s, interim, r.describe() if r is not None else "none"))
        time.sleep(min(wait, 0.5))


@test
def test_kill9_mid_stream_loses_nothing_and_duplicates_nothing(_):
    with Server(name="orderd-crash", extra_args=["--lease-ms", str(LEASE_MS)]) as s:
        users = [s.new_user("crash%d" % i) for i in range(WRITERS)]
        sent = []  # (user index, key, body, first Response or exception)
        lock = threading.Lock()
        stop = threading.Event()

        def writer(i):
            u, n = users[i], 0
            while not stop.is_set():
                n += 1
                key = new_key("c%d-%d" % (i, n))
                body = {"productId": "p-1024", "quantity": 1 + (n % 9)}
                try:
                    r = u.post("/api/orders", body, key=key, timeout=10)
                except Exception as e:  # noqa: BLE001 - every failure is "not acknowledged"
                    r = e
                with lock:
                    sent.append((i, key, body, r))
                if not isinstance(r, Exception) or s.alive():
                    continue
                stop.wait(0.05)

        threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(WRITERS)]
        for t in threads:
            t.start()
        time.sleep(STREAM_SECONDS)  # the stream runs this long (at least) before the kill

        def acknowledged():
            with lock:
                return any(not isinstance(r, Exception) and r.status == 201 for *_, r in sent)
        # A slow (sanitized, loaded) build may not have answered anything yet: the kill must come
        # after at least one acknowledged order, or the check of what was acknowledged is vacuous.
        wait_until("an acknowledged order before the kill", acknowledged)
        with lock:
            before_kill = len(sent)
        s.kill9()
        killed_at = time.monotonic()

        def every_writer_refused():
            with lock:
                return {i for i, _, _, r in sent[before_kill:] if isinstance(r, Exception)} == \
                    set(range(WRITERS))
        # The writers go on until each has met the dead server too (a refused or cut request).
        wait_until("every writer to meet the killed server", every_writer_refused)
        stop.set()
        for t in threads:
            t.join(15)
        expect(not any(t.is_alive() for t in threads), "a writer thread hung after the kill")

        acked = {k: r for _, k, _, r in sent if not isinstance(r, Exception) and r.status == 201}
        errors = [r for _, _, _, r in sent if isinstance(r, Exception)]
        others = [r for _, _, _, r in sent if not isinstance(r, Exception) and r.status != 201]
        bad_others = [r for r in others if r.status not in (503,)]
        if bad_others:
            fail("before the kill, a request got neither 201 nor 503: %s"
                 % bad_others[0].describe())
        expect(len(acked) > 0, "no order was acknowledged before the kill (%d sent)" % len(sent))

        s.start()
        restart_s = time.monotonic() - killed_at
        final = {}
        outcomes = {"replayed": 0, "executed": 0, "after_wait": 0}
        for i, key, body, first in sent:
            r, interim = retry_until_final(users[i], key, body)
            if r.status != 201:
                fail("key %s after the restart: expected 201, got %s (interim %r)" % (
                    key, r.describe(), interim))
            if interim:
                outcomes["after_wait"] += 1
            outcomes["replayed" if r.replayed else "executed"] += 1
            if key in acked:
                a = acked[key]
                if not r.replayed or r.body != a.body:
                    fail("acknowledged key %s: expected the stored 201 replayed byte for byte\n"
                         "acknowledged: %s\nafter restart: %s" % (key, a.describe(),
                                                                   r.describe()))
            final[key] = r.json()["orderId"]
        print("     %d writers, %d keys sent in %.1f s: %d acknowledged, %d connection errors, "
              "%d 503; restart took %.2f s; retries: %d replayed, %d executed now, %d after "
              "409/503" % (WRITERS, len(sent), STREAM_SECONDS, len(acked), len(errors),
                           len(others), restart_s, outcomes["replayed"], outcomes["executed"],
                           outcomes["after_wait"]))
        expect_eq(len(set(final.values())), len(final), "distinct orderIds of distinct keys")
        total = 0
        for i, u in enumerate(users):
            listed = [o["orderId"] for o in u.all_orders()]
            mine = {final[k] for j, k, _, _ in sent if j == i}
            if len(listed) != len(set(listed)) or set(listed) != mine:
                fail("user %d: listed %d orders, expected exactly the %d of its keys\n"
                     "extra: %r\nmissing: %r" % (i, len(listed), len(mine),
                                                 sorted(set(listed) - mine),
                                                 sorted(mine - set(listed))))
            total += len(listed)
        expect_eq(total, len(final), "orders in the database vs distinct keys")
        print("     %d orders for %d distinct keys: none lost, none twice" % (total, len(final)))


@test
def test_crash_after_phase1_is_taken_over_after_the_lease(_):
    s = Server(name="orderd-takeover", env={"ORDERD_TEST_HOOKS": "1"},
               extra_args=["--lease-ms", str(LEASE_MS)])
    with s:
        u = s.new_user("takeover")
        key = new_key("takeover")
        body = {"productId": "p-1024", "quantity": 4}
        try:
            r = u.post("/api/orders", body, key=key,
                       headers={"X-Test-Crash": "after-order-created"}, timeout=10)
            fail("X-Test-Crash: after-order-created should drop the connection, got %s"
                 % r.describe())
        except (OSError, http.client.HTTPException) as e:
            dropped = type(e).__name__
        rc = s.wait_exit(10)
        expect(rc is not None, "the server did not exit after X-Test-Crash")
        s.start()
        # Phase 1 committed: the order exists already, before anyone retries.
        before = u.all_orders()
        expect_eq(len(before), 1, "orders right after the restart (phase 1 committed)")
        phase1_id = before[0]["orderId"]
        t0 = time.monotonic()
        r, interim = retry_until_final(u, key, body)
        took = time.monotonic() - t0
        print("     connection dropped (%s), server exit %s; retry: interim %r, final %d after "
              "%.2f s%s" % (dropped, rc, interim, r.status, took,
                            " (replayed)" if r.replayed else ""))
        if r.status != 201:
            fail("retry after the crash: expected 201, got %s (interim %r)" % (r.describe(),
                                                                             interim))
        doc = r.json()
        expect_eq(doc.get("orderId"), phase1_id, "orderId of the recovered order vs phase 1's")
        expect_eq(r.header("Location"), "/api/orders/" + phase1_id, "Location of the recovery")
        expect_eq((doc.get("productId"), doc.get("quantity")), ("p-1024", 4), "recovered order")
        expect_eq([o["orderId"] for o in u.all_orders()], [phase1_id],
                  "orders after the recovery (exactly one)")
        again = u.post("/api/orders", body, key=key)
        expect(again.status == 201 and again.replayed and again.body == r.body,
               "the next retry should replay the recovered 201: %s" % again.describe())
        other = u.post("/api/orders", {"productId": "p-1024", "quantity": 5}, key=key)
        expect_problem(other, 422, "idempotency-key-reused", "other body on the recovered key")


@test
def test_takeover_does_not_take_stock_twice(_):
    # p-limited has 3: phase 1 reserved 2 before the crash; the recovery must not reserve again.
    if not fresh_db_per_server():
        print("     (skipped: needs a fresh database per server, IDEM_TEST_DB_URI with {tmp})")
        return
    s = Server(name="orderd-takeover-stock", env={"ORDERD_TEST_HOOKS": "1"},
               extra_args=["--lease-ms", str(LEASE_MS)])
    with s:
        u = s.new_user("stock")
        key = new_key("stock")
        body = {"productId": "p-limited", "quantity": 2}
        try:
            u.post("/api/orders", body, key=key, headers={"X-Test-Crash": "after-order-created"},
                   timeout=10)
        except (OSError, http.client.HTTPException):
            pass
        expect(s.wait_exit(10) is not None, "the server did not exit after X-Test-Crash")
        s.start()
        r, interim = retry_until_final(u, key, body)
        if r.status != 201:
            fail("recovery of 2 x p-limited: expected 201, got %s (interim %r)" % (
                r.describe(), interim))
        one = u.create_order(new_key(), product="p-limited", quantity=1)
        if one.status != 201:
            fail("1 x p-limited after the recovered 2 of 3: expected 201 (1 left), got %s"
                 % one.describe())
        more = u.create_order(new_key(), product="p-limited", quantity=1)
        expect_problem(more, 409, "out-of-stock", "a 4th p-limited")
        expect_eq(len(u.all_orders()), 2, "orders of p-limited")


@test
def test_sigterm_finishes_the_running_request_then_exits_0(_):
    # Ctrl-C / SIGTERM is the clean way out: the request in flight is answered and stored.
    s = Server(name="orderd-term", env={"ORDERD_TEST_HOOKS": "1"})
    with s:
        u = s.new_user("term")
        key = new_key("term")
        out = {}

        def slow():
            try:
                out["resp"] = u.create_order(key, headers={"X-Test-Delay-Ms": "1500"})
            except Exception as e:  # noqa: BLE001
                out["resp"] = e
        t = threading.Thread(target=slow, daemon=True)
        t.start()
        # In flight: its order is committed (phase 1) and it sleeps before answering.
        wait_order_committed(s, key)
        s.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = s.wait_exit(10)
        took = time.monotonic() - t0
        t.join(10)
        r = out.get("resp")
        expect(rc is not None, "orderd did not exit within 10 s of SIGTERM")
        print("     SIGTERM during a 1.5 s request: exit %d after %.2f s; the request got %s" % (
            rc, took, r.status if hasattr(r, "status") else repr(r)))
        s.start()
        retry = u.create_order(key)
        orders = u.all_orders()
        expect_eq(rc, 0, "exit status after SIGTERM")
        if not hasattr(r, "status") or r.status != 201:
            fail("the request in flight at SIGTERM: expected its 201, got %s (after a restart "
                 "its retry got %s; %d order(s))" % (
                     r.describe() if hasattr(r, "describe") else repr(r), retry.describe(300),
                     len(orders)))
        expect_replay(retry, r, "retry after the restart")
        expect_eq(len(orders), 1, "orders after SIGTERM and a retry")


if __name__ == "__main__":
    run("test_crash")
