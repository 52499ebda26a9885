# SPDX-License-Identifier: Apache-2.0
"""
test_replay_cache.py - replays answered from memory: libidem's replay cache and orderd's bearer
token cache (docs/libidem.md, docs/orderd.md).

A completed record is immutable until retention deletes it, so orderd answers its replays, and
the refusal of the same key with another body, without touching the store.  These tests show it
from outside: the answer is the stored one byte for byte, with Idempotent-Replayed, even when the
record has been removed behind the server's back (only memory can have answered) or while the
store is locked; and a record read after a restart is cached too.  Runs on both stores.
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Server, db_query, expect, expect_eq, expect_fresh,  # noqa: E402
                     expect_problem, expect_replay, expect_status, metric_value, new_key,
                     parse_metrics, run, store_locked, test, wait_until, wait_order_committed)

TOKEN_CACHE_TTL_S = 5.0  # AUTH_CACHE_TTL_MS in src/orderd/auth.h


class Ctx:
    def __init__(self):
        self.server = Server(name="orderd-cache").start()

    def close(self):
        self.server.close()


def forget_record(server, key):
    """Deletes the idempotency record of `key` from the store, as if retention had run."""
    rows = db_query(server.db_uri, "DELETE FROM idem_records WHERE idem_key = ? RETURNING idem_key",
                    (key,))
    expect_eq(len(rows), 1, "records deleted for %s" % key)


@test
def test_cached_replay_is_byte_identical_with_the_marker(ctx):
    u = ctx.server.new_user()
    k = new_key("cache")
    first = expect_fresh(u.create_order(k, quantity=3), 201, "first request")
    for i in range(3):
        expect_replay(u.create_order(k, quantity=3), first, "replay %d" % (i + 1))
    # The record is gone from the store: only the cache can still give the stored 201 (without
    # it the order row would answer, with 200).
    forget_record(ctx.server, k)
    r = expect_replay(u.create_order(k, quantity=3), first, "replay after the record was deleted")
    expect_eq(r.header("Location"), first.header("Location"), "Location of the cached replay")
    expect_eq(len(u.all_orders()), 1, "orders of the user")


@test
def test_different_body_under_a_cached_key_is_422(ctx):
    u = ctx.server.new_user()
    k = new_key("cache-mismatch")
    first = expect_fresh(u.create_order(k, quantity=2), 201, "first request")
    expect_replay(u.create_order(k, quantity=2), first, "replay")
    expect_problem(u.create_order(k, quantity=5), 422, "idempotency-key-reused",
                   "another body under the cached key")
    expect_problem(u.post("/api/orders", {"productId": "p-1024", "quantity": 2, "x": 1}, key=k),
                   422, "idempotency-key-reused", "an extra member under the cached key")
    # Key order and white space do not change the fingerprint: still the replay.
    r = u.request("POST", "/api/orders", body='{ "quantity": 2, "productId": "p-1024" }', key=k)
    expect_replay(r, first, "the same body written differently")
    expect_eq(len(u.all_orders()), 1, "orders of the user")


@test
def test_cached_answers_need_no_store(ctx):
    # While another process holds the store's lock (PostgreSQL: idem_records, so every record read
    # would wait and end in 503), a cached key is still answered at once: replay and refusal.
    u = ctx.server.new_user()
    k = new_key("cache-locked")
    first = expect_fresh(u.create_order(k), 201, "first request")
    with store_locked(ctx.server.db_uri):
        t0 = time.monotonic()
        expect_replay(u.create_order(k), first, "replay while the store is locked")
        expect_problem(u.create_order(k, quantity=9), 422, "idempotency-key-reused",
                       "another body while the store is locked")
        took = time.monotonic() - t0
    expect(took < 2.0, "cached answers took %.2f s with the store locked: they waited for it"
           % took)


@test
def test_a_record_read_after_a_restart_is_cached(ctx):
    # A fresh process has an empty cache: its first replay reads the record from the store and
    # keeps it, so the next one needs the store no more.
    with Server(name="orderd-cache-restart") as s:
        u = s.new_user()
        k = new_key("cache-restart")
        first = expect_fresh(u.create_order(k, quantity=4), 201, "first request")
        s.restart()
        expect_replay(u.create_order(k, quantity=4), first, "replay read from the store")
        forget_record(s, k)
        expect_replay(u.create_order(k, quantity=4), first, "replay once the record was deleted")
        expect_problem(u.create_order(k, quantity=1), 422, "idempotency-key-reused",
                       "another body once the record was deleted")


def http_connections(server):
    r = server.client().get("/metrics")
    expect_eq(r.status, 200, "GET /metrics")
    return metric_value(parse_metrics(r.body.decode()), "orderd_http_connections")


def cache_metrics(server):
    r = server.client().get("/metrics")
    expect_eq(r.status, 200, "GET /metrics")
    m = parse_metrics(r.body.decode())
    return {k: metric_value(m, "orderd_replay_cache_lookups_total", result=k)
            for k in ("hit", "miss")}, metric_value(m, "orderd_replay_cache_max_bytes")


@test
def test_metrics_count_hits_and_misses(ctx):
    # orderd_replay_cache_lookups_total: each replay from memory is a hit; a first request misses
    # (once on the event loop, once more on its worker), so an operator can watch the hit ratio
    # (docs/ops.md).
    u = ctx.server.new_user()
    before, bound = cache_metrics(ctx.server)
    k = new_key("cache-metrics")
    first = expect_fresh(u.create_order(k), 201, "first request")
    for i in range(4):
        expect_replay(u.create_order(k), first, "replay %d" % (i + 1))
    after, _ = cache_metrics(ctx.server)
    grew = {r: after[r] - before[r] for r in after}
    expect(grew["hit"] == 4 and 1 <= grew["miss"] <= 2,
           "lookups of one first request and four replays: %r" % grew)
    expect_eq(bound, 8 << 20, "the cache's bound, --replay-cache-mb 8 by default")


@test
def test_cache_off_asks_the_store(ctx):
    # --replay-cache-mb 0: every replay reads the record, so a record deleted behind the server's
    # back is a new request, which the order row answers (200, the existing order).
    with Server(name="orderd-cache-off", extra_args=["--replay-cache-mb", "0"]) as s:
        u = s.new_user()
        k = new_key("cache-off")
        first = expect_fresh(u.create_order(k), 201, "first request")
        expect_replay(u.create_order(k), first, "replay")
        forget_record(s, k)
        late = expect_status(u.create_order(k), 200, "retry after the record was deleted")
        expect_eq(late.json(), first.json(), "the order of the retry")
        counts, bound = cache_metrics(s)
        expect_eq((counts, bound), ({"hit": 0, "miss": 0}, 0), "no cache, nothing counted")


@test
def test_a_revoked_token_is_honoured_for_at_most_the_token_cache_ttl(ctx):
    u = ctx.server.new_user()
    expect_fresh(u.create_order(new_key("tok")), 201, "an order (the token is now cached)")
    db_query(ctx.server.db_uri, "DELETE FROM tokens WHERE user_id = "
             "(SELECT id FROM users WHERE name = ?)", (u.user,))
    # The token was cached before the DELETE: a request SENT more than the TTL (and a little)
    # after it must be refused, however long the answer takes to come.
    t0 = time.monotonic()
    while True:
        t_sent = time.monotonic()
        r = u.get("/api/orders")
        if r.status == 401:
            break
        expect_status(r, 200, "GET /api/orders with a revoked token")
        if t_sent - t0 > TOKEN_CACHE_TTL_S + 0.5:
            expect_status(r, 401, "GET /api/orders sent %.1f s after the token was revoked"
                          % (t_sent - t0))
        time.sleep(0.25)
    expect_problem(r, 401, "unauthorized", "the revoked token")



@test
def test_cached_replays_need_no_worker(ctx):
    # One worker thread, held by a slow order: a retry whose answer is in memory is still
    # answered at once, on the event loop, while a fresh order waits for the worker.
    s = Server(name="orderd-one-worker", extra_args=["--http-workers", "1"],
               env={"ORDERD_TEST_HOOKS": "1"}).start()
    try:
        u = s.new_user()
        k = new_key("loop")
        first = expect_fresh(u.create_order(k), 201, "first request")
        slow = {}
        slow_key = new_key("slow")

        def hold_the_worker():
            slow["r"] = u.create_order(slow_key, headers={"X-Test-Delay-Ms": "3000"})

        t = threading.Thread(target=hold_the_worker, daemon=True)
        t.start()
        wait_order_committed(s, slow_key, lambda: bool(slow))  # it holds the only worker
        expect(not slow, "the slow order was answered before the replay: %r" % slow)
        r = expect_replay(u.create_order(k), first, "replay while the only worker is busy")
        expect(r.elapsed < 1.5, "the replay waited %.2f s for the busy worker" % r.elapsed)
        expect_problem(u.create_order(k, quantity=9), 422, "idempotency-key-reused",
                       "other body while the only worker is busy")
        t.join(10)
        expect_status(slow.get("r"), 201, "the slow order")
    finally:
        s.close()


@test
def test_duplicates_of_a_running_request_hold_no_worker(ctx):
    # Two worker threads; the first request of a key holds one of them for 3 s.  Its ten
    # duplicates wait on the event loop (libidem's watch), not on workers, so an unrelated request
    # still gets the other worker at once; when the first completes, all ten get its response
    # (they may wait 10 s, --wait-ms, before a 409).
    s = Server(name="orderd-parked", extra_args=["--http-workers", "2", "--wait-ms", "10000"],
               env={"ORDERD_TEST_HOOKS": "1"}).start()
    try:
        u = s.new_user()
        k = new_key("parked")
        out = {}

        def first():
            out["first"] = u.create_order(k, headers={"X-Test-Delay-Ms": "3000"})

        def dup(i):
            out[i] = u.create_order(k)

        threads = [threading.Thread(target=first, daemon=True)]
        threads[0].start()
        # The duplicates go once the first holds its worker (its phase 1 committed, then the
        # hook's 3 s delay), and the list once all ten are connected (orderd_http_connections:
        # the first, ten duplicates and the scrape itself).
        wait_order_committed(s, k, lambda: "first" in out)
        expect("first" not in out, "the first request was answered before its duplicates went: "
               "%r" % out.get("first"))
        for i in range(10):
            threads.append(threading.Thread(target=dup, args=(i,), daemon=True))
            threads[-1].start()
        wait_until("the ten duplicates to be connected", lambda: http_connections(s) >= 12,
                   pause_s=0.02, describe=lambda: "%g connections" % http_connections(s))
        r = expect_status(u.get("/api/orders"), 200, "a list while ten duplicates wait")
        # The first holds its worker for most of 3 s still: a list that waited for a worker
        # would take over a second.
        expect(r.elapsed < 1.0, "the list waited %.2f s for a worker" % r.elapsed)
        for t in threads:
            t.join(15)
        first_r = expect_fresh(out.get("first"), 201, "the slow first request")
        for i in range(10):
            expect_replay(out.get(i), first_r, "duplicate %d" % i)
        expect_eq(len(u.all_orders()), 1, "orders of the key")
    finally:
        s.close()


if __name__ == "__main__":
    run("test_replay_cache", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
