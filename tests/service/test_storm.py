# SPDX-License-Identifier: Apache-2.0
"""
test_storm.py - many requests at the same instant.

The database's unique constraint, not read-then-insert, must decide who owns a key: a storm of
identical retries makes exactly one order, and a storm of distinct keys makes exactly one order
each.  Every request gets its own connection, opened before a barrier releases them together.
"""

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Server, db_query, expect, expect_eq, expect_problem, fail,  # noqa: E402
                     fresh_db_per_server, metric_value, new_key, parse_metrics,
                     retry_after_seconds, run, store_kind, test, wait_until)

SAME_KEY_REQUESTS = 120
DISTINCT_KEYS = 100


def storm(client, bodies_and_keys, path="/api/orders"):
    """
    Sends every (key, body) at once, one thread and one connection each.  Returns a list of
    (key, body, Response or exception) in the same order.
    """
    n = len(bodies_and_keys)
    barrier = threading.Barrier(n)
    results = [None] * n

    def worker(i, key, body):
        conn = None
        try:
            conn = client.connect(timeout=60)
        except Exception as e:  # noqa: BLE001
            results[i] = e
        try:
            barrier.wait(30)
        except threading.BrokenBarrierError:
            pass
        if conn is None:
            return
        try:
            results[i] = client.post(path, body, key=key, conn=conn)
        except Exception as e:  # noqa: BLE001
            results[i] = e
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(i, k, b), daemon=True)
               for i, (k, b) in enumerate(bodies_and_keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return [(k, b, results[i]) for i, (k, b) in enumerate(bodies_and_keys)]


def create_counters(server):
    r = server.client().get("/metrics")
    if r.status != 200:
        fail("GET /metrics: %s" % r.describe())
    samples = parse_metrics(r.body.decode("utf-8", "replace"))
    return {o: metric_value(samples, "orderd_requests_total", operation="orders.create",
                            outcome=o)
            for o in ("executed", "replayed", "waited", "in_progress", "mismatch", "error")}


def store_commits(server):
    """(write transactions committed, durable commits that carried them) from /metrics."""
    r = server.client().get("/metrics")
    if r.status != 200:
        fail("GET /metrics: %s" % r.describe())
    samples = parse_metrics(r.body.decode("utf-8", "replace"))
    return (metric_value(samples, "orderd_store_write_commits_total"),
            metric_value(samples, "orderd_store_durable_commits_total"))


def counters_moved(before, after):
    return {k: after[k] - before[k] for k in before}


@test
def test_same_key_storm_makes_exactly_one_order(server):
    u = server.new_user("storm")
    key = new_key("storm")
    body = {"productId": "p-1024", "quantity": 3}
    before = create_counters(server)
    t0 = time.monotonic()
    results = storm(u, [(key, body)] * SAME_KEY_REQUESTS)
    took = time.monotonic() - t0
    moved = counters_moved(before, create_counters(server))
    executed, replayed, in_progress, bad = [], [], [], []
    for _, _, r in results:
        if isinstance(r, Exception) or r is None:
            bad.append("no response: %r" % (r,))
        elif r.status == 201 and not r.replayed:
            executed.append(r)
        elif r.status == 201:
            replayed.append(r)
        elif r.status == 409:
            try:
                expect_problem(r, 409, "idempotency-request-in-progress", "409 in the storm")
                retry_after_seconds(r, "409 in the storm")
                in_progress.append(r)
            except AssertionError as e:
                bad.append(str(e))
        else:
            bad.append(r.describe(400))
    print("     same-key storm: %d requests in %.2f s -> %d executed, %d replayed, "
          "%d in-progress (409), %d other" % (len(results), took, len(executed), len(replayed),
                                             len(in_progress), len(bad)))
    if bad:
        fail("%d unexpected responses, first: %s" % (len(bad), bad[0]))
    expect_eq(len(executed), 1, "responses that executed (201 without Idempotent-Replayed)")
    first = executed[0]
    doc = first.json()
    for r in replayed:
        if r.body != first.body:
            fail("a replay differs from the executed 201\nexecuted: %r\nreplay: %r" % (
                first.body, r.body))
        for h in ("Location", "Content-Type"):
            if r.header(h) != first.header(h):
                fail("a replay has %s %r, the executed 201 had %r" % (h, r.header(h),
                                                                     first.header(h)))
    orders = u.all_orders()
    expect_eq([o.get("orderId") for o in orders], [doc["orderId"]],
              "the user's orders after %d identical requests" % len(results))
    # The metrics tell the same story as the responses.
    print("     metrics moved: %r" % moved)
    expect_eq(moved["executed"], 1, "outcome=executed increase")
    expect_eq(moved["replayed"] + moved["waited"], len(replayed),
              "outcome=replayed + outcome=waited increase vs replays seen")
    expect_eq(moved["in_progress"], len(in_progress), "outcome=in_progress increase")
    # And afterwards, the key still replays that one order.
    again = u.post("/api/orders", body, key=key)
    expect(again.status == 201 and again.replayed and again.body == first.body,
           "retry after the storm should replay the order: %s" % again.describe())


@test
def test_distinct_key_storm_makes_one_order_each(server):
    u = server.new_user("storm")
    work = [(new_key("d%03d" % i), {"productId": "p-2048", "quantity": 1 + i % 7})
            for i in range(DISTINCT_KEYS)]
    commits_before = store_commits(server)
    t0 = time.monotonic()
    results = storm(u, work)
    took = time.monotonic() - t0
    writes, durable = (a - b for a, b in zip(store_commits(server), commits_before))
    print("     store: %d write transactions committed in %d durable commits" % (writes, durable))
    expect(writes >= DISTINCT_KEYS, "each created order committed a write transaction (%d)" % writes)
    # Concurrent orders share durable commits: SQLite's group commit, PostgreSQL's batches of
    # requests per transaction (the store's runner, fed by the event loop).
    expect(0 < durable < writes, "%s shares durable commits among %d concurrent orders "
           "(%d transactions in %d commits)" % (store_kind(), DISTINCT_KEYS, writes, durable))
    by_key, busy, bad = {}, [], []
    for key, body, r in results:
        if isinstance(r, Exception) or r is None:
            bad.append("%s: no response: %r" % (key, r))
        elif r.status == 201 and not r.replayed:
            by_key[key] = r
        elif r.status == 503:
            # "Store busy" is a legitimate answer; a client retries it after Retry-After.
            try:
                expect_problem(r, 503, "idempotency-store-unavailable", "503 in the storm")
                retry_after_seconds(r, "503 in the storm")
                busy.append((key, body))
            except AssertionError as e:
                bad.append(str(e))
        else:
            bad.append("%s: %s" % (key, r.describe(400)))
    print("     distinct-key storm: %d requests in %.2f s -> %d created, %d busy (503), %d other"
          % (len(results), took, len(by_key), len(busy), len(bad)))
    if bad:
        fail("%d unexpected responses, first: %s" % (len(bad), bad[0]))
    for key, body in busy:
        deadline = time.monotonic() + 30  # a client's retries of "store busy", paced 0.25 s
        while True:
            r = u.post("/api/orders", body, key=key)
            if r.status != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        if r.status != 201 or r.replayed:
            fail("retry of a 503'd key %s: expected a fresh 201, got %s" % (key, r.describe()))
        by_key[key] = r
    ids = {k: r.json()["orderId"] for k, r in by_key.items()}
    expect_eq(len(set(ids.values())), DISTINCT_KEYS, "distinct orderIds in the responses")
    for key, body in work:
        doc = by_key[key].json()
        if doc.get("quantity") != body["quantity"] or doc.get("productId") != body["productId"]:
            fail("key %s got an order for another body: sent %r, got %r" % (key, body, doc))
    listed = [o.get("orderId") for o in u.all_orders()]
    expect_eq(len(listed), DISTINCT_KEYS, "orders listed after %d distinct keys" % DISTINCT_KEYS)
    expect_eq(set(listed), set(ids.values()), "listed orderIds vs the acknowledged ones")
    # Orders made in the same millisecond must still page without gaps or repeats.
    paged = u.all_orders(limit=7)
    ids_paged = [o["orderId"] for o in paged]
    dups = len(ids_paged) - len(set(ids_paged))
    if dups or set(ids_paged) != set(listed):
        fail("pages of 7 over %d orders created at once: %d listed, %d repeated, missing %r"
             % (DISTINCT_KEYS, len(ids_paged), dups, sorted(set(listed) - set(ids_paged))[:5]))
    stamps = [o["createdAt"] for o in paged]
    expect(stamps == sorted(stamps, reverse=True),
           "pages of 7 are not newest first: %r" % stamps)


@test
def test_same_key_two_bodies_storm_executes_one(server):
    u = server.new_user("storm")
    key = new_key("mixed")
    a = {"productId": "p-1024", "quantity": 1}
    b = {"productId": "p-1024", "quantity": 2}
    results = storm(u, [(key, a if i % 2 else b) for i in range(60)])
    executed, replays, reused, in_progress, bad = [], [], [], [], []
    for _, body, r in results:
        if isinstance(r, Exception) or r is None:
            bad.append("no response: %r" % (r,))
        elif r.status == 201 and not r.replayed:
            executed.append((body, r))
        elif r.status == 201:
            replays.append((body, r))
        elif r.status == 422:
            reused.append((body, r))
        elif r.status == 409:
            in_progress.append((body, r))
        else:
            bad.append(r.describe(400))
    print("     two-body storm: %d executed, %d replayed, %d reused (422), %d in progress, "
          "%d other" % (len(executed), len(replays), len(reused), len(in_progress), len(bad)))
    if bad:
        fail("%d unexpected responses, first: %s" % (len(bad), bad[0]))
    expect_eq(len(executed), 1, "requests that executed")
    winner_body, winner = executed[0]
    for body, r in replays:
        if body != winner_body or r.body != winner.body:
            fail("a %r request got a replay of the %r order: %s" % (body, winner_body,
                                                                    r.describe()))
    for body, r in reused:
        expect_problem(r, 422, "idempotency-key-reused", "422 in the two-body storm")
        if body == winner_body:
            fail("a request with the winning body got 422: %s" % r.describe())
    for body, r in in_progress:
        expect_problem(r, 409, "idempotency-request-in-progress", "409 in the two-body storm")
    expect_eq(len(u.all_orders()), 1, "orders after the two-body storm")


@test
def test_cancel_storm_with_distinct_keys_all_get_the_cancelled_order(server):
    u = server.new_user("cancel")
    r = u.post("/api/orders", {"productId": "p-1024", "quantity": 1}, key=new_key())
    if r.status != 201:
        fail("create: %s" % r.describe())
    oid = r.json()["orderId"]
    results = storm(u, [(new_key("cx"), {}) for _ in range(50)],
                    path="/api/orders/%s/cancel" % oid)
    statuses = {}
    bodies = set()
    for _, _, r in results:
        st = r.status if hasattr(r, "status") else repr(r)
        statuses[st] = statuses.get(st, 0) + 1
        if getattr(r, "status", None) == 200:
            bodies.add(r.body)
    print("     50 concurrent cancels of one order: %r, %d distinct bodies" % (statuses,
                                                                             len(bodies)))
    bad = [r for _, _, r in results if getattr(r, "status", None) != 200]
    if bad:
        fail("a concurrent cancel did not get 200: %s" % (
            bad[0].describe() if hasattr(bad[0], "describe") else repr(bad[0])))
    docs = [json.loads(b) for b in bodies]
    if any(d != docs[0] for d in docs) or docs[0].get("status") != "cancelled":
        fail("concurrent cancels answered different bodies: %r" % docs)


@test
def test_limited_stock_is_never_oversold(server):
    # p-limited starts with 3 in a fresh catalog; 20 buyers of 1 each arrive at once.
    fresh = fresh_db_per_server()
    buyers = [server.new_user("buyer") for _ in range(20)]
    n = len(buyers)
    barrier = threading.Barrier(n)
    results = [None] * n

    def buy(i):
        c = buyers[i]
        conn = c.connect(timeout=60)
        barrier.wait(30)
        try:
            results[i] = c.post("/api/orders", {"productId": "p-limited", "quantity": 1},
                                key=new_key("buy"), conn=conn)
        except Exception as e:  # noqa: BLE001
            results[i] = e
        finally:
            conn.close()

    threads = [threading.Thread(target=buy, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    created = [r for r in results if getattr(r, "status", None) == 201]
    refused = [r for r in results if getattr(r, "status", None) == 409]
    other = [r for r in results if getattr(r, "status", None) not in (201, 409)]
    print("     20 buyers of p-limited at once: %d created, %d out-of-stock, %d other" % (
        len(created), len(refused), len(other)))
    if other:
        fail("a buyer got neither 201 nor 409: %r" % (other[0],))
    for r in refused:
        expect_problem(r, 409, "out-of-stock", "refused buyer")
    if fresh:
        expect_eq(len(created), 3, "p-limited orders (stock 3)")
    else:
        expect(len(created) <= 3, "p-limited oversold: %d orders for a stock of 3" % len(created))
    listed = sum(len(c.all_orders()) for c in buyers)
    expect_eq(listed, len(created), "p-limited orders listed across the buyers")


@test
def test_a_new_price_reaches_the_orders_that_follow_it(server):
    # On PostgreSQL orderd sends an order of a product it sold before without waiting for the
    # database, at the price it last sold at; the database checks that price.  A price changed
    # behind its back must still be what every later order pays and answers.
    db_query(server.db_uri, "INSERT INTO products (id, name, unit_price, currency, stock)"
                            " VALUES ('p-repriced', 'Repriced', 500, 'EUR', 1000)")
    u = server.new_user("repriced")
    first = u.create_order(new_key("repriced"), product="p-repriced", quantity=1)
    expect_eq(first.status, 201, "the first order of p-repriced: %s" % first.describe())
    expect_eq(first.json()["unitPrice"], 500, "the first order's price")
    db_query(server.db_uri, "UPDATE products SET unit_price = 700 WHERE id = 'p-repriced'")
    # Orders of another product meanwhile keep the store's threads busy, so the new price's
    # first orders queue into batches with theirs rather than find a thread idle and run alone.
    stop, flooded = threading.Event(), []

    def flood():
        c = server.new_user("flood")
        conn = c.connect(timeout=60)
        try:
            deadline = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < deadline:
                flooded.append(c.create_order(new_key("flood"), conn=conn).status)
        finally:
            conn.close()

    flooders = [threading.Thread(target=flood, daemon=True) for _ in range(8)]
    for t in flooders:
        t.start()
    try:
        wait_until("the flood's first orders", lambda: len(flooded) >= 50)
        body = {"productId": "p-repriced", "quantity": 2}
        results = storm(u, [(new_key("repriced"), body) for _ in range(DISTINCT_KEYS // 4)])
    finally:
        stop.set()
        for t in flooders:
            t.join(60)
    expect_eq(set(flooded), {201}, "the statuses of the flood's orders")
    for key, _, r in results:
        if getattr(r, "status", None) != 201:
            fail("order %s after the new price: %r" % (key, getattr(r, "describe", lambda: r)()))
        doc = r.json()
        expect_eq((doc["unitPrice"], doc["amount"]), (700, 1400), "the answer of order %s" % key)
    rows = db_query(server.db_uri, "SELECT unit_price, amount, count(*) FROM orders"
                                   " WHERE product_id = 'p-repriced' GROUP BY unit_price, amount"
                                   " ORDER BY unit_price")
    expect_eq(rows, [["500", "500", "1"], ["700", "1400", str(len(results))]],
              "the orders of p-repriced by (unit price, amount)")
    expect_eq(int(db_query(server.db_uri, "SELECT stock FROM products WHERE id = 'p-repriced'")
                  [0][0]), 1000 - 1 - 2 * len(results), "the stock of p-repriced")


if __name__ == "__main__":
    run("test_storm", setup=lambda: Server(name="orderd-storm").start(),
        teardown=lambda s: s and s.close())
