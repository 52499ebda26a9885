#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_gateway.py - idem-gateway in front of an upstream that is not idempotent (it executes every
request it gets, and counts): what a user of the gateway relies on.

  - a retry with the same key is answered from the record, byte for byte, and never reaches
    the upstream; a storm of 200 copies executes once;
  - the key reused with another body is 422 and runs nothing; two callers with one key are two
    executions, neither sees the other's answer;
  - refusals before anything is forwarded: no principal (401), no key (400), a bad key (400),
    a body over the cap (413);
  - which answers are stored: 2xx and business 4xx are; 5xx and 429 are not (a retry runs again);
    an answer too large to store is passed on once and a retry is told so (410), never re-run;
  - unknown outcomes: a timeout or a reset after the upstream acted never leads to a second
    execution under `hold` (retries get 503 until resolved), is sent again under `resend`, and
    is settled by asking the upstream under `reconcile` (2xx: its answer; 404: it runs);
    nothing sent (connection refused) releases the key: the retry runs;
  - the gateway killed with SIGKILL mid-request and restarted: the retry is held, not re-run;
  - requests on no route, and keyless requests on an optional route, are passed through as
    they came (path and query undecoded, hop-by-hop headers dropped, X-Forwarded-For added);
  - the sweeper deletes records whose retention ended, and only those;
  - the admin listener's /healthz, /readyz and /metrics.
"""

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.parse
import uuid

import harness
from harness import TestFailure, expect_eq, expect_fresh, expect_problem, expect_replay, test
from gateway_harness import GATEWAY, Gateway, Upstream, expect, is_pattern


def key(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def setup():
    up = Upstream()
    gw = Gateway(up)
    gw.start()
    return {"up": up, "gw": gw}


def teardown(ctx):
    if ctx:
        ctx["gw"].close()
        ctx["up"].close()


# ---- replay, mismatch, scope -------------------------------------------------------------------

@test
def replay_is_byte_identical_and_never_reaches_the_upstream(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key()
    first = gw.request("POST", "/v1/things", {"amount": 5, "currency": "EUR"}, key=k)
    expect_eq(first.status, 201, "first answer")
    expect(first.header("Set-Cookie") is not None, "the first answer carries the upstream's "
           "Set-Cookie: %s" % first.describe())
    # Same request, members in another order and other white space: the same fingerprint.
    again = gw.request("POST", "/v1/things", b'{ "currency":"EUR", "amount":5 }', key=k,
                       headers={"Content-Type": "application/json"})
    expect_eq(again.status, 201, "replay status")
    expect_eq(again.body, first.body, "replay body")
    expect(again.replayed, "the replay says Idempotent-Replayed: true: %s" % again.describe())
    for h in ("Content-Type", "Location", "ETag"):
        expect_eq(again.header(h), first.header(h), "replayed %s" % h)
    expect(again.header("Set-Cookie") is None and again.header("X-Upstream-Request") is None,
           "a replay carries only the stored headers, never Set-Cookie: %s" % again.describe())
    expect_eq(up.executions(k), 1, "executions of the key")


@test
def key_reused_with_another_body_is_422_and_runs_nothing(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key()
    expect_eq(gw.request("POST", "/v1/things", {"n": 1}, key=k).status, 201, "first")
    r = gw.request("POST", "/v1/things", {"n": 2}, key=k)
    expect_problem(r, 422, "idempotency-key-reused", "other body")
    expect_eq(up.executions(k), 1, "executions")


@test
def two_principals_with_one_key_are_two_executions(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key()
    a = gw.request("POST", "/v1/things", {"n": 1}, key=k, principal="alice")
    b = gw.request("POST", "/v1/things", {"n": 1}, key=k, principal="bob")
    expect(a.status == 201 and b.status == 201, "both run: %s / %s" % (a.describe(), b.describe()))
    expect(not b.replayed and a.json()["id"] != b.json()["id"],
           "bob never sees alice's answer: %s / %s" % (a.describe(), b.describe()))
    expect_eq(up.executions(k), 2, "executions")
    again = gw.request("POST", "/v1/things", {"n": 1}, key=k, principal="bob")
    expect_eq(again.body, b.body, "bob's replay is bob's answer")


@test
def storm_of_200_copies_executes_once(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("storm")
    results = []
    lock = threading.Lock()
    start = threading.Barrier(200)

    def one(i):
        start.wait()
        # The first few are slow upstream, so the rest arrive while it runs.
        r = gw.request("POST", "/v1/things", {"storm": True}, key=k,
                       headers={"X-Test-Mode": "slow:300"})
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    expect_eq(len(results), 200, "answers")
    expect_eq(up.executions(k), 1, "executions of 200 concurrent copies")
    ok = [r for r in results if r.status == 201]
    busy = [r for r in results if r.status == 409]
    expect(len(ok) + len(busy) == 200,
           "every copy is the answer or 409 in progress: %s" %
           [r.describe(200) for r in results if r.status not in (201, 409)][:3])
    expect(len(ok) >= 1 and all(r.body == ok[0].body for r in ok), "every 201 is the same answer")
    for r in busy:
        expect_problem(r, 409, "idempotency-request-in-progress", "a copy that waited too long")


REQUEST_LINE = re.compile(r"^(POST|GET) (/\S*) (\d{3}) ([a-z_]+) \d+\.\d{3} (\S+)$")


def request_lines(gw):
    with open(gw.stderr_path, encoding="utf-8", errors="replace") as f:
        return [m.groups() for m in map(REQUEST_LINE.match, f.read().splitlines()) if m]


@test
def request_log_has_each_request_once_without_waiting_for_more_traffic(ctx):
    # The event loops write their request log once per turn (docs/gateway.md, "Logs"): every
    # answered request is there, whole, once the loop has nothing more to do -- no later traffic
    # or stop needed to push it out -- and the last ones are written when the gateway stops.
    up = ctx["up"]
    gw = Gateway(up, name="gateway-log")
    gw.start()
    try:
        k = key("log")
        expect_eq(gw.request("POST", "/v1/things", {"log": 1}, key=k).status, 201, "first")
        results = []
        lock = threading.Lock()

        def one(i):
            if i % 2:
                r = gw.request("POST", "/v1/things", {"log": 1}, key=k)
            else:
                r = gw.request("GET", "/passed/%d" % i)
            with lock:
                results.append(r.status)
        threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        expect_eq(len(results), 40, "answers")
        deadline = time.monotonic() + 5
        while len(request_lines(gw)) < 41 and time.monotonic() < deadline:
            time.sleep(0.02)
        lines = request_lines(gw)
        outcomes = sorted((method, outcome) for method, _, _, outcome, _ in lines)
        expect_eq(outcomes, sorted([("POST", "executed")] + [("POST", "replayed")] * 20 +
                                   [("GET", "passed")] * 20),
                  "one whole line per request, within 5 s of the last answer")
        expect_eq(sorted(p for m, p, _, _, _ in lines if m == "GET"),
                  sorted("/passed/%d" % i for i in range(0, 40, 2)), "the passed paths")
        # One more, then a stop at once: its line is written as the loop ends.
        expect(gw.request("GET", "/last").status < 300, "the last request is answered")
        gw.stop()
        expect(any(p == "/last" for _, p, _, _, _ in request_lines(gw)),
               "the last request's line is in the log after the stop")
    finally:
        gw.close()


@test
def duplicates_wait_on_the_event_loop_not_on_workers(ctx):
    up = ctx["up"]
    # Two worker threads: one forwards the first request (slow upstream), and the 120 copies that
    # arrive meanwhile must wait parked on the loop -- they are all answered "waited" once it
    # completes, instead of queueing behind the two workers and replaying afterwards.
    gw = Gateway(up, args=["--http-workers", "2"])
    try:
        gw.start()
        k = key("parked")
        first = {}
        t = threading.Thread(target=lambda: first.setdefault(
            "r", gw.request("POST", "/v1/things", {"p": 1}, key=k,
                            headers={"X-Test-Mode": "slow:800"})))
        t.start()
        harness.wait_until("the first request to reach the upstream", lambda: up.executions(k))
        results = []
        lock = threading.Lock()

        def dup():
            r = gw.request("POST", "/v1/things", {"p": 1}, key=k)
            with lock:
                results.append(r)

        threads = [threading.Thread(target=dup) for _ in range(120)]
        for d in threads:
            d.start()
        for d in threads:
            d.join(30)
        t.join(30)
        expect(all(r.status == 201 and r.body == first["r"].body for r in results),
               "every copy gets the first answer: %s" %
               [r.describe(150) for r in results if r.status != 201][:2])
        expect_eq(up.executions(k), 1, "executions")
        m = harness.parse_metrics(gw.admin("GET", "/metrics").body.decode())
        waited = harness.metric_value(m, "idem_gateway_requests_total",
                                      operation="things.create", outcome="waited")
        expect(waited >= 100, "copies answered after waiting on the loop: %d of 120" % waited)
    finally:
        gw.close()


def fresh_keys_at_once(gw, keys, mode):
    """Starts one POST per key, all at once, each with X-Test-Mode `mode`: harness.in_thread's
    (thread, box) by key."""
    return {k: harness.in_thread(lambda k=k: gw.request("POST", "/v1/things", {"k": k}, key=k,
                                                        headers={"X-Test-Mode": mode}))
            for k in keys}


def answers_of(started, timeout=60):
    """fresh_keys_at_once's answers, by key (a failure for one that raised or never came)."""
    return {k: harness.joined(t, box, "POST of " + k, timeout) for k, (t, box) in started.items()}


def not_refused(gw, up, results):
    """
    The keys of `results` that were not turned away for want of a worker.  PostgreSQL claims a
    fresh key on a worker, so one that finds none is refused with 503 server-busy, having run
    nowhere; on SQLite none may be.
    """
    kept = []
    for k, r in results.items():
        if r.status == 503 and harness.store_kind(gw.db_uri) == "postgresql":
            expect_problem(r, 503, "server-busy", "no worker free")
            expect_eq(up.executions(k), 0, "executions of a refused " + k)
        else:
            kept.append(k)
    return kept


@test
def fresh_keys_hold_no_worker(ctx):
    up = ctx["up"]
    # One worker and a queue of one: were each fresh key to hold a worker while the upstream
    # thinks, 12 at once would leave 10 of them refused with 503 server-busy.  On SQLite the claim,
    # the forward and the completion all run from the event loop, so every one is executed.
    # (On PostgreSQL a fresh key still takes a worker: docs/gateway.md, "What it costs".)
    gw = Gateway(up, args=["--http-workers", "1", "--http-queue", "1"])
    try:
        gw.start()
        keys = [key("loop-%d" % i) for i in range(12)]
        results = answers_of(fresh_keys_at_once(gw, keys, "slow:400"))
        for k in not_refused(gw, up, results):
            expect_fresh(results[k], 201, "fresh key " + k)
            expect_eq(up.executions(k), 1, "executions of " + k)
            expect_replay(gw.request("POST", "/v1/things", {"k": k}, key=k), results[k],
                          "a retry of " + k)
    finally:
        gw.close()


@test
def an_upstream_answer_is_never_dropped_for_want_of_a_worker(ctx):
    # One worker, busy streaming a passed-through answer, and the queue's one slot taken by a
    # second: fresh keys whose upstream answers 500 (not stored: the record is deleted, which only
    # a worker may do) must still get that answer once a worker is free -- the upstream acted --
    # never 503 server-busy, which would tell the client that nothing happened.
    up = ctx["up"]
    gw = Gateway(up, args=["--http-workers", "1", "--http-queue", "1"])
    try:
        gw.start()
        def streams_upstream():
            with up.lock:
                return sum(1 for r in up.requests if r["method"] == "GET")
        before = streams_upstream()
        streams = [harness.in_thread(
            lambda: stream_through(gw, "bigslow:%d" % (64 << 20), None, 1500))]
        harness.wait_until("the first stream to reach the upstream (it holds the one worker)",
                           lambda: streams_upstream() > before)
        # The second is a keyed answer too large to store: a stream the gateway cannot refuse
        # (the upstream acted), so it waits for the one worker in the queue's one slot.  (A second
        # passed-through GET would be refused at once: every worker but one is taken by streams.)
        second = key("second-stream")
        streams.append(harness.in_thread(
            lambda: stream_through(gw, "bigslow:%d" % (64 << 20), second, 1500)))
        # On SQLite its exchange with the upstream runs from the loop, and only its stream waits
        # for the worker; on PostgreSQL its claim waits for it already, so the upstream sees it
        # once the first stream is over (the checks below hold either way, less tested so).
        harness.wait_until("the second stream to reach the upstream",
                           lambda: up.executions(second) == 1)
        keys = [key("handoff-%d" % i) for i in range(6)]
        results = answers_of(fresh_keys_at_once(gw, keys, "status:500"))
        for t, box in streams:
            harness.joined(t, box, "a slow stream")
        for k in not_refused(gw, up, results):
            r = results[k]
            expect(r.status == 500 and k.encode() in r.body,
                   "the upstream's own 500 relayed: %s" % r.describe(200))
            expect_eq(up.executions(k), 1, "executions of " + k)
    finally:
        gw.close()


# ---- refusals before anything is forwarded -----------------------------------------------------

@test
def refusals_at_the_head_forward_nothing(ctx):
    gw, up = ctx["gw"], ctx["up"]
    before = up.count
    r = gw.request("POST", "/v1/things", {"n": 1}, key=key(), principal=None)
    expect_problem(r, 401, "unauthorized", "no principal")
    r = gw.request("POST", "/v1/things", {"n": 1})
    expect_problem(r, 400, "idempotency-key-missing", "no key")
    r = gw.request("POST", "/v1/things", {"n": 1}, key="")
    expect_problem(r, 400, "idempotency-key-invalid", "empty key")
    r = gw.request("POST", "/v1/things", {"n": 1}, key='"unterminated')
    expect_problem(r, 400, "idempotency-key-invalid", "bad sf-string")
    r = gw.request("POST", "/v1/things", b"x" * (1024 * 1024 + 1), key=key())
    expect_problem(r, 413, "body-too-large", "a body over 1 MiB")
    expect_eq(up.count, before, "upstream executions during the refusals")


# ---- what is stored ------------------------------------------------------------------------------

@test
def server_errors_and_429_are_not_stored_business_4xx_is(ctx):
    gw, up = ctx["gw"], ctx["up"]
    for status, stored in ((500, False), (503, False), (429, False), (404, True), (422, True)):
        k = key("st%d" % status)
        first = gw.request("POST", "/v1/things", {"s": status}, key=k,
                           headers={"X-Test-Mode": "status:%d" % status})
        expect_eq(first.status, status, "upstream status passed on")
        again = gw.request("POST", "/v1/things", {"s": status}, key=k)
        if stored:
            expect(again.replayed and again.status == status and again.body == first.body,
                   "%d is stored and replayed: %s" % (status, again.describe()))
            expect_eq(up.executions(k), 1, "executions after a stored %d" % status)
        else:
            expect(not again.replayed and again.status == 201,
                   "after a %d the retry runs again: %s" % (status, again.describe()))
            expect_eq(up.executions(k), 2, "executions after an unstored %d" % status)


# ---- pass-through ------------------------------------------------------------------------------

@test
def unrouted_and_keyless_requests_pass_through_as_sent(ctx):
    gw, up = ctx["gw"], ctx["up"]
    r = gw.request("POST", "/v2/else/a%20b?x=1&y=%2F", {"z": 1},
                   headers={"Connection": "keep-alive, X-Hop", "X-Hop": "secret",
                            "X-Forwarded-For": "10.0.0.1"})
    expect_eq(r.status, 201, "unrouted POST")
    seen = up.last_request()
    expect_eq(seen["path"], "/v2/else/a%20b?x=1&y=%2F", "target as sent, not decoded")
    hdrs = {k.lower(): v for k, v in seen["headers"].items()}
    expect("x-hop" not in hdrs, "a header named in Connection is not forwarded: %s" % hdrs)
    expect_eq(hdrs.get("x-forwarded-for"), "10.0.0.1, 127.0.0.1", "X-Forwarded-For")
    expect_eq(hdrs.get("x-consumer-id"), "alice", "end-to-end headers go along")
    k = key()
    # A keyed route: the key goes to the upstream too.
    gw.request("POST", "/v1/things", {"n": 1}, key=k)
    expect_eq(up.last_request()["headers"].get("Idempotency-Key"), k,
              "Idempotency-Key forwarded as the client sent it")
    # An optional-key route without a key: forwarded each time, no record.
    before = up.count
    a = gw.request("POST", "/v1/optional", {"n": 1})
    b = gw.request("POST", "/v1/optional", {"n": 1})
    expect(a.status == 201 and b.status == 201 and not b.replayed, "keyless: both run")
    expect_eq(up.count - before, 2, "keyless executions")


@test
def pass_through_failures_are_problems_not_hangs(ctx):
    gw, up = ctx["gw"], ctx["up"]
    r = gw.request("POST", "/v2/else", {"n": 1}, headers={"X-Test-Mode": "reset"})
    expect_problem(r, 502, "upstream-bad-reply", "an unrouted request whose upstream resets")
    r = gw.request("POST", "/v2/else", {"n": 1}, headers={"X-Test-Mode": "hang"})
    expect_problem(r, 504, "upstream-timeout", "an unrouted request whose upstream hangs")
    r = gw.request("POST", "/v2/else", {"n": 1}, headers={"X-Test-Mode": "status:503"})
    expect_eq(r.status, 503, "the upstream's own 503 is passed on")
    # Many in a row reuse the loop's pooled connections and still answer each one right.
    for i in range(50):
        r = gw.request("GET", "/v2/seq/%d" % i)
        expect(r.status == 200 and r.json()["path"] == "/v2/seq/%d" % i,
               "answer %d: %s" % (i, r.describe(200)))


@test
def key_from_the_body(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("body")
    first = gw.request("POST", "/v1/bodykey", {"requestId": k, "amount": 3})
    expect_eq(first.status, 201, "first")
    expect_eq(up.last_request()["headers"].get("Idempotency-Key"), '"%s"' % k,
              "the body's key is forwarded as a header")
    again = gw.request("POST", "/v1/bodykey", {"amount": 3, "requestId": k})
    expect(again.replayed and again.body == first.body, "replayed: %s" % again.describe())
    nested = gw.request("POST", "/v1/bodykey", {"meta": {"requestId": k + "-n"}})
    expect_eq(nested.status, 201, "the second pointer")
    r = gw.request("POST", "/v1/bodykey", {"amount": 3})
    expect_problem(r, 400, "idempotency-key-missing", "no key in the body")
    r = gw.request("POST", "/v1/bodykey", {"requestId": 12})
    expect_problem(r, 400, "idempotency-key-invalid", "a number is not a key")
    expect_eq(up.executions(k), 1, "executions")


# ---- unknown outcomes ----------------------------------------------------------------------------

@test
def hold_after_a_reset_never_runs_twice(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("reset")
    r = gw.request("POST", "/v1/things", {"n": 1}, key=k, headers={"X-Test-Mode": "reset"})
    expect_problem(r, 502, "outcome-unknown", "reset after acting")
    for _ in range(3):
        r = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        expect_problem(r, 503, "outcome-unknown", "a retry of a held key")
        expect(harness.retry_after_seconds(r) >= 1, "Retry-After on the hold")
    expect_eq(up.executions(k), 1, "executions under hold")


@test
def hold_after_a_timeout_never_runs_twice(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("hang")
    r = gw.request("POST", "/v1/things", {"n": 1}, key=k, headers={"X-Test-Mode": "hang"})
    expect_problem(r, 504, "outcome-unknown", "no answer within the upstream timeout")
    r = gw.request("POST", "/v1/things", {"n": 1}, key=k)
    expect_problem(r, 503, "outcome-unknown", "retry")
    expect_eq(up.executions(k), 1, "executions")


@test
def resend_forwards_again_with_the_same_key(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("resend")
    r = gw.request("POST", "/v1/resend", {"n": 1}, key=k, headers={"X-Test-Mode": "reset"})
    expect_problem(r, 502, "outcome-unknown", "reset")
    r = gw.request("POST", "/v1/resend", {"n": 1}, key=k)
    expect_eq(r.status, 201, "the retry is sent again")
    expect_eq(up.executions(k), 2, "sent twice with one key (the upstream dedupes on it)")
    again = gw.request("POST", "/v1/resend", {"n": 1}, key=k)
    expect(again.replayed and again.body == r.body, "then stored: %s" % again.describe())


@test
def reconcile_settles_with_the_upstreams_answer_or_runs(ctx):
    gw, up = ctx["gw"], ctx["up"]
    # It happened: the reconcile query finds it and the record is settled with that answer.
    k = key("rec")
    r = gw.request("POST", "/v1/orders/7/refunds", {"n": 1}, key=k,
                   headers={"X-Test-Mode": "reset"})
    expect_problem(r, 502, "outcome-unknown", "reset")
    lookups = up.lookups
    r = gw.request("POST", "/v1/orders/7/refunds", {"n": 1}, key=k)
    expect(r.status == 200 and r.replayed, "reconciled: %s" % r.describe())
    expect_eq(r.json()["path"], "/v1/orders/7/refunds", "the upstream's own record")
    expect_eq(up.lookups - lookups, 1, "reconcile queries")
    again = gw.request("POST", "/v1/orders/7/refunds", {"n": 1}, key=k)
    expect(again.replayed and again.body == r.body, "then stored: %s" % again.describe())
    expect_eq(up.executions(k), 1, "executions")
    # It did not happen: 404 from the query, and the retry runs.
    k2 = key("rec404")
    r = gw.request("POST", "/v1/orders/8/refunds", {"n": 1}, key=k2,
                   headers={"X-Test-Mode": "drop"})
    expect_problem(r, 502, "outcome-unknown", "dropped before acting")
    r = gw.request("POST", "/v1/orders/8/refunds", {"n": 1}, key=k2)
    expect_eq(r.status, 201, "the retry runs after a 404 from the reconcile query")
    expect_eq(up.executions(k2), 1, "executions")


@test
def nothing_sent_releases_the_key(ctx):
    dead = Upstream()
    port = dead.port
    dead.close()  # nothing listens there now
    gw = Gateway(dead)
    try:
        gw.start()
        k = key("refused")
        r = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        expect_problem(r, 502, "upstream-unavailable", "connection refused")
        r = gw.request("GET", "/v2/unrouted")
        expect_problem(r, 502, "upstream-unavailable", "an unrouted request, connection refused")
        live = Upstream(port)
        try:
            r = gw.request("POST", "/v1/things", {"n": 1}, key=k)
            expect_eq(r.status, 201, "the retry runs once the upstream is back")
            expect_eq(live.executions(k), 1, "executions")
        finally:
            live.close()
    finally:
        gw.close()


@test
def answer_too_large_to_store_is_passed_once_then_410(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("big")
    r = gw.request("POST", "/v1/things", {"n": 1}, key=k, headers={"X-Test-Mode": "big:2000000"})
    expect_eq(r.status, 200, "the first answer is passed on")
    expect(len(r.body) == 2000000 and is_pattern(r.body),
           "its body, byte for byte (%d bytes)" % len(r.body))
    again = gw.request("POST", "/v1/things", {"n": 1}, key=k)
    expect_problem(again, 410, "response-not-stored", "a retry of an unstored answer")
    expect("2000000 bytes" in again.json()["detail"], "the 410 says how large: %s" % again.describe())
    expect_eq(up.executions(k), 1, "executions")


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def stream_through(gw, mode, k, read_kib=None, path="/v1/things"):
    """
    POST with X-Test-Mode `mode` on a raw connection, reading the answer as it comes: (status
    line, headers, body bytes, the gateway's peak RSS in KiB while it streamed).  With `read_kib`,
    stops reading after that much body and closes the connection.  With `k` None, a GET of
    `path` (on no route: passed through) instead.
    """
    import socket as so
    s = so.create_connection((gw.host, gw.port), timeout=30)
    body = b'{"n": 1}'
    if k is None:
        s.sendall(("GET %s HTTP/1.1\r\nHost: gw\r\nX-Test-Mode: %s\r\n\r\n"
                   % (path, mode)).encode())
    else:
        s.sendall(("POST %s HTTP/1.1\r\nHost: gw\r\nX-Consumer-Id: alice\r\n"
                   "Idempotency-Key: %s\r\nX-Test-Mode: %s\r\n"
                   "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                   % (path, k, mode, len(body))).encode() + body)
    f = s.makefile("rb")
    status = f.readline().decode().strip()
    headers = {}
    while True:
        line = f.readline().decode().strip()
        if not line:
            break
        name, value = line.split(":", 1)
        headers[name.strip().lower()] = value.strip()
    out, peak = bytearray(), rss_kib(gw.proc.pid)
    chunked = headers.get("transfer-encoding") == "chunked"
    want = int(headers["content-length"]) if "content-length" in headers else None
    while want is None or len(out) < want:
        if read_kib is not None and len(out) >= read_kib * 1024:
            break
        if chunked:
            size = int(f.readline().strip(), 16)
            if size == 0:
                f.readline()
                break
            piece = f.read(size)
            f.readline()
        else:
            piece = f.read(min(1 << 20, want - len(out)) if want is not None else 1 << 20)
        if not piece:
            break
        out += piece
        peak = max(peak, rss_kib(gw.proc.pid))
    f.close()
    s.close()
    return status, headers, bytes(out), peak


@test
def answers_larger_than_the_store_cap_stream_through_in_bounded_memory(ctx):
    # A response over the store cap is streamed through.  64 MiB, four times the
    # gateway's in-memory cap (upstream.max_response_size, 16 MiB): with Content-Length, and
    # chunked.  Byte for byte, the gateway's memory flat, the record "not stored", the retry 410,
    # one execution each.
    gw, up = ctx["gw"], ctx["up"]
    size = 64 << 20
    for mode in ("big", "bigchunked"):
        k = key(mode)
        before = rss_kib(gw.proc.pid)
        status, headers, body, peak = stream_through(gw, "%s:%d" % (mode, size), k)
        expect_eq(status, "HTTP/1.1 200 OK", "%s: the status line" % mode)
        if mode == "big":
            expect_eq(headers.get("content-length"), str(size), "the length is passed on")
        else:
            expect_eq(headers.get("transfer-encoding"), "chunked", "an unknown length, chunked")
        expect(len(body) == size and is_pattern(body),
               "%s: the whole body, byte for byte (%d of %d bytes)" % (mode, len(body), size))
        expect(peak - before < 24 * 1024,
               "%s: the gateway streamed in bounded memory (RSS %d KiB -> peak %d KiB)"
               % (mode, before, peak))
        again = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        expect_problem(again, 410, "response-not-stored", "%s: a retry" % mode)
        expect_eq(up.executions(k), 1, "%s: executions" % mode)
        print("     %s: %d MiB streamed; gateway RSS %d KiB before, peak %d KiB"
              % (mode, size >> 20, before, peak))
    # Passed through (no route): 40 MiB, over the 16 MiB the loop holds, streamed by a worker.
    before = rss_kib(gw.proc.pid)
    status, headers, body, peak = stream_through(gw, "big:%d" % (40 << 20), None,
                                                 path="/v2/unrouted/file")
    expect_eq(status, "HTTP/1.1 200 OK", "passed through: the status line")
    expect(len(body) == 40 << 20 and is_pattern(body),
           "passed through: the whole body, byte for byte (%d bytes)" % len(body))
    expect(peak - before < 24 * 1024, "passed through: bounded memory (RSS %d -> peak %d KiB)"
           % (before, peak))
    # The connection stays usable after a streamed answer (keep-alive): a plain request works.
    expect_eq(gw.request("POST", "/v1/things", {"n": 2}, key=key()).status, 201, "afterwards")


@test
def a_stream_cut_short_ends_the_connection_never_a_whole_body(ctx):
    gw, up = ctx["gw"], ctx["up"]
    # The upstream resets half way: the client sees fewer bytes than announced, then the close.
    k = key("cut")
    status, headers, body, _ = stream_through(gw, "bigcut:%d" % (8 << 20), k)
    expect_eq(status, "HTTP/1.1 200 OK", "the head went out before the cut")
    expect(len(body) < (8 << 20), "the body is cut short: %d bytes" % len(body))
    expect_problem(gw.request("POST", "/v1/things", {"n": 1}, key=k), 410, "response-not-stored",
                   "the upstream acted: a retry is not run again")
    expect_eq(up.executions(k), 1, "executions")
    # A client that stops reading after 1 MiB and leaves: the gateway goes on serving.
    k = key("leave")
    stream_through(gw, "big:%d" % (32 << 20), k, read_kib=1024)
    expect_eq(gw.request("POST", "/v1/things", {"n": 3}, key=key()).status, 201,
              "the gateway still answers")
    expect_eq(up.executions(k), 1, "executions of the abandoned one")


@test
def a_stop_cuts_a_stream_still_going_when_its_grace_ends(ctx):
    # A stream is a request in flight: SIGTERM lets it go on for the stop's grace (10 s), not for
    # ever.  The upstream sends 64 KiB every 100 ms of 256 MiB (over an hour): the gateway must
    # exit within the grace and a few seconds, the client seeing a body cut short.
    # A fresh key whose upstream answers only after the grace is another matter: the upstream is
    # acting, so the stop waits for its answer (within the upstream's timeout), stores it and
    # answers, as it waits for a worker still in its handler.
    up = ctx["up"]
    gw = Gateway(up, name="gateway-stop", upstream_timeout="15s")
    gw.start()
    try:
        late, streamed = key("late"), key("slow")
        stream = harness.in_thread(
            lambda: stream_through(gw, "bigslow:%d" % (256 << 20), streamed))
        slow = harness.in_thread(lambda: gw.request("POST", "/v1/things", {"late": 1}, key=late,
                                                    headers={"X-Test-Mode": "slow:11500"}))
        harness.wait_until("the stream and the late key to reach the upstream",
                           lambda: up.executions(streamed) == 1 and up.executions(late) == 1,
                           describe=lambda: "stream %d, late key %d" % (
                               up.executions(streamed), up.executions(late)))
        t0 = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        code = gw.proc.wait(30)
        took = time.monotonic() - t0
        _, _, body, _ = harness.joined(*stream, "the stream", 30)
        r = harness.joined(*slow, "the key whose upstream answered past the grace", 30)
        expect(took < 20, "the gateway stopped within its grace of 10 s (%.1f s)" % took)
        expect_eq(code, 0, "exit status of a graceful stop")
        expect(0 < len(body) < (256 << 20), "the client got a body cut short: %d bytes" % len(body))
        expect_fresh(r, 201, "the key whose upstream answered past the grace")
        print("     a stop with a stream in flight: exited after %.1f s, %d KiB sent"
              % (took, len(body) >> 10))
        gw.start()
        expect_replay(gw.request("POST", "/v1/things", {"late": 1}, key=late), r,
                      "the late key after the restart")
        expect_eq(up.executions(late), 1, "executions of the late key")
    finally:
        gw.close()


@test
def a_stop_lets_fresh_keys_in_flight_finish(ctx):
    # SIGTERM while fresh keys wait for a slow upstream: each is parked on the event loop between
    # its steps, and the stop lets them go on within its grace -- every client gets its answer,
    # stored, so after a restart a retry replays it and nothing ran twice.
    up = ctx["up"]
    # An upstream timeout well past the upstream's 1.5 s: what is tested is the stop, and a loaded
    # machine may stretch the exchange past the harness's 3 s.
    gw = Gateway(up, name="gateway-stop-fresh", upstream_timeout="8s")
    gw.start()
    try:
        keys = [key("stop-%d" % i) for i in range(6)]
        started = fresh_keys_at_once(gw, keys, "slow:1500")
        harness.wait_until("every key to reach the upstream",
                           lambda: sum(up.executions(k) for k in keys) == len(keys))
        gw.proc.send_signal(signal.SIGTERM)
        code = gw.proc.wait(30)
        results = answers_of(started, 30)
        expect_eq(code, 0, "exit status of a graceful stop")
        for k in keys:
            expect_fresh(results[k], 201, "%s, answered during the stop" % k)
        gw.start()
        for k in keys:
            expect_replay(gw.request("POST", "/v1/things", {"k": k}, key=k), results[k],
                          "%s after the restart" % k)
            expect_eq(up.executions(k), 1, "executions of " + k)
    finally:
        gw.close()


@test
def kill9_mid_request_then_restart_holds_the_key(ctx):
    up = ctx["up"]
    routes = """
  - match: POST /v1/things
    operation: things.create
    lease: 2s
    wait: 200ms
"""
    gw = Gateway(up, routes=routes, upstream_timeout="1s")
    try:
        gw.start()
        k = key("kill")
        box = {}

        def send():
            try:
                box["r"] = gw.request("POST", "/v1/things", {"n": 1}, key=k,
                                      headers={"X-Test-Mode": "hang"}, timeout=10)
            except Exception as e:  # noqa: BLE001 - the connection dies with the gateway
                box["e"] = e

        t = threading.Thread(target=send)
        t.start()
        harness.wait_until("the upstream to get the request", lambda: up.executions(k))
        expect_eq(up.executions(k), 1, "the upstream got the request")
        gw.kill9()
        t.join(10)
        gw.start()
        # While the dead gateway's lease lasts: 409, then the hold.
        r = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        expect(r.status in (409, 503), "retry during the lease: %s" % r.describe())
        time.sleep(2.2)
        r = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        expect_problem(r, 503, "outcome-unknown", "retry after the lease")
        expect_eq(up.executions(k), 1, "executions after kill -9 and restart")
    finally:
        gw.close()


# ---- operating it --------------------------------------------------------------------------------

def keys_cli(gw, *args):
    p = subprocess.run([GATEWAY, "keys"] + list(args) + ["--config", gw.config_path],
                       capture_output=True, timeout=20)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


@test
def a_held_key_is_shown_and_resolved_by_an_operator(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("held")
    expect_problem(gw.request("POST", "/v1/things", {"n": 1}, key=k,
                              headers={"X-Test-Mode": "reset"}), 502, "outcome-unknown", "reset")
    q = "/records?principal=alice&operation=things.create&key=" + urllib.parse.quote(k)
    shown = gw.admin("GET", q)
    expect_eq(shown.status, 200, "GET /records")
    doc = shown.json()
    expect(doc["state"] == "unknown" and doc["recoveryPoint"] == "unknown" and
           len(doc["fingerprint"]) == 64, "a held record: %s" % doc)
    expect(not doc.get("leaseExpires", "").startswith("1970"), "no lease of 1970: %s" % doc)
    # An operator finds it without knowing its key: the held keys, a page at a time.
    code, out, err = keys_cli(gw, "list", "--state", "unknown", "--limit", "1000")
    expect(code == 0 and k in [r["key"] for r in json.loads(out)["records"]],
           "keys list shows the held key: %d %r %r" % (code, out[:500], err))
    # Each as `keys show` shows it (the page is read in one statement, not a show per record).
    listed = [r for r in json.loads(out)["records"] if r["key"] == k]
    code, out, err = keys_cli(gw, "show", "--principal", "alice", "--operation", "things.create",
                              "--key", k)
    expect(code == 0 and listed == [json.loads(out)],
           "keys list and keys show say the same of it: %r, %r %r" % (listed, out, err))
    # One in flight is listed as such, as GET /records shows it, and not among the held ones.
    k3 = key("inflight")
    hung = harness.in_thread(lambda: gw.request("POST", "/v1/things", {"n": 3}, key=k3,
                                        headers={"X-Test-Mode": "hang"}))
    harness.wait_until("the hung request to reach the upstream", lambda: up.executions(k3) == 1)
    page = gw.admin("GET", "/records/list?state=in-flight&limit=1000").json()["records"]
    one = gw.admin("GET", "/records?principal=alice&operation=things.create&key=" + k3).json()
    expect(one["state"] == "in-flight" and [r for r in page if r["key"] == k3] == [one],
           "GET /records/list?state=in-flight lists it as GET /records shows it: %r %r"
           % (page, one))
    held = gw.admin("GET", "/records/list?state=unknown&limit=1000").json()["records"]
    expect(k3 not in [r["key"] for r in held], "not among the held keys: %r" % held)
    expect_problem(harness.joined(*hung, "the hung request"), 504, "outcome-unknown",
                   "the hung request, once upstream.timeout is over")
    pages, after, seen = 0, None, []
    while pages < 100:  # one record a page: the cursor walks them all, each once
        args = ["list", "--state", "any", "--limit", "1"] + (["--after", after] if after else [])
        code, out, err = keys_cli(gw, *args)
        page = json.loads(out)
        seen += [r["key"] for r in page["records"]]
        pages += 1
        after = page["next"]
        if after is None:
            break
    expect(k in seen and len(seen) == len(set(seen)), "paged: %d pages, %s" % (pages, seen))
    # The operator learnt that it ran, and what it answered: every retry gets that answer.
    decision = {"principal": "alice", "operation": "things.create", "key": k,
                "decision": "executed",
                "response": {"status": 201, "headers": {"Content-Type": "application/json",
                                                        "Set-Cookie": "x=1"},
                             "body": '{"id":"by-hand"}'}}
    r = gw.admin("POST", "/records/resolve", json.dumps(decision))
    expect_eq(r.status, 200, "resolve executed: %s" % r.describe())
    again = gw.request("POST", "/v1/things", {"n": 1}, key=k)
    expect(again.status == 201 and again.replayed and again.body == b'{"id":"by-hand"}',
           "the retry gets the operator's answer: %s" % again.describe())
    expect(again.header("Set-Cookie") is None, "store_headers apply to a resolution too")
    expect_eq(up.executions(k), 1, "executions")
    r = gw.admin("POST", "/records/resolve", json.dumps(decision))
    expect_problem(r, 409, "record-completed", "resolving a completed record")
    code, out, err = keys_cli(gw, "show", "--principal", "alice", "--operation", "things.create",
                              "--key", k)
    shown = json.loads(out) if code == 0 else {}
    expect(shown.get("state") == "completed" and shown["response"]["status"] == 201 and
           shown["recoveryPoint"] == "" and "leaseExpires" not in shown,
           "keys show of the resolved record (no recovery point, no lease): %d %r %r"
           % (code, out, err))

    # It did not run: the CLI releases the key and the retry runs.
    k2 = key("held2")
    expect_problem(gw.request("POST", "/v1/things", {"n": 2}, key=k2,
                              headers={"X-Test-Mode": "reset"}), 502, "outcome-unknown", "reset")
    code, out, err = keys_cli(gw, "resolve", "--principal", "alice", "--operation",
                              "things.create", "--key", k2, "--decision", "not-executed")
    expect_eq((code, out.strip()), (0, "%s: not-executed" % k2), "keys resolve (stderr %r)" % err)
    r = gw.request("POST", "/v1/things", {"n": 2}, key=k2)
    expect(r.status == 201 and not r.replayed, "the retry runs: %s" % r.describe())
    expect_eq(up.executions(k2), 2, "executions: the lost one, and the retry")
    code, out, err = keys_cli(gw, "show", "--principal", "alice", "--operation", "things.create",
                              "--key", "never-used")
    expect(code == 1 and "no record" in err, "keys show of a missing key: %d %r" % (code, err))
    code, out, err = keys_cli(gw, "resolve", "--principal", "alice", "--operation", "nope",
                              "--key", k2, "--decision", "not-executed")
    expect(code == 2 and "no route" in err, "an unknown operation: %d %r" % (code, err))


@test
def the_sweeper_deletes_records_whose_retention_ended(ctx):
    # Retention (docs/gateway.md): a background sweep deletes expired records every
    # --sweep-interval-s; a record still within its retention stays.
    routes = """
  - match: POST /v1/things
    operation: things.create
    retention: 1s
  - match: POST /v1/orders/{id}/refunds
    operation: refunds.create
"""
    with Gateway(ctx["up"], routes=routes, args=["--sweep-interval-s", "1"],
                 name="gateway-sweep") as gw:
        short, kept = key("swept"), key("kept")
        expect_eq(gw.request("POST", "/v1/things", {"n": 1}, key=short).status, 201, "short")
        expect_eq(gw.request("POST", "/v1/orders/o1/refunds", {"n": 1}, key=kept).status, 201,
                  "kept")

        def record(operation, k):
            return gw.admin("GET", "/records?principal=alice&operation=%s&key=%s" % (operation, k))

        def swept():
            with open(gw.stderr_path, "rb") as f:
                return b"sweep: 1 expired records deleted" in f.read()
        harness.wait_until("the sweeper to delete the expired record", swept, timeout_s=20)
        expect_eq(record("things.create", short).status, 404, "the expired record, swept")
        expect_eq(record("refunds.create", kept).status, 200, "the record within retention")


@test
def admin_listener_health_ready_metrics(ctx):
    gw = ctx["gw"]
    expect_eq(gw.admin("GET", "/healthz").status, 200, "/healthz")
    r = gw.admin("GET", "/readyz")
    expect_eq(r.status, 200, "/readyz")
    m = harness.parse_metrics(gw.admin("GET", "/metrics").body.decode())
    expect(harness.metric_value(m, "idem_gateway_requests_total", operation="things.create",
                                outcome="replayed") >= 1, "replays counted")
    expect(harness.metric_value(m, "idem_gateway_requests_total", operation="things.create",
                                outcome="unknown") >= 1, "unknown outcomes counted")
    expect(harness.metric_value(m, "idem_gateway_upstream_seconds_count") >= 1,
           "upstream latency observed")
    expect(harness.metric_value(m, "idem_gateway_replay_cache_lookups_total", result="hit") >= 1,
           "replays answered from memory are counted as hits")
    expect(harness.metric_value(m, "idem_gateway_replay_cache_max_bytes") > 0,
           "the replay cache's bound")
    # Every executed request wrote its claim and its answer: two write commits at least each.
    executed = harness.metric_value(m, "idem_gateway_requests_total", operation="things.create",
                                    outcome="executed")
    writes = harness.metric_value(m, "idem_gateway_store_write_commits_total")
    durable = harness.metric_value(m, "idem_gateway_store_durable_commits_total")
    expect(executed >= 1 and writes >= 2 * executed,
           "store writes counted: %d for %d executed" % (writes, executed))
    expect(1 <= durable <= writes, "durable commits counted: %d for %d writes" % (durable, writes))
    expect(harness.metric_value(m, "idem_gateway_store_durable_commit_seconds_total") > 0,
           "the time of the durable commits")
    # Each durable commit is one round trip at least on PostgreSQL; SQLite has no server.
    trips = harness.metric_value(m, "idem_gateway_store_round_trips_total")
    if harness.store_kind() == "postgresql":
        expect(trips >= durable, "round trips counted: %d for %d commits" % (trips, durable))
    else:
        expect_eq(trips, 0, "no round trips on SQLite")
    r = gw.admin("GET", "/nope")
    expect_problem(r, 404, "not-found", "unknown admin path")
    # The public listener does not serve them: they are the upstream's paths there.
    expect(gw.request("GET", "/metrics").header("X-Upstream-Request") is not None,
           "/metrics on the public listener goes upstream")


@test
def idem_check_conformance_passes_through_the_gateway(ctx):
    up = ctx["up"]
    gw = Gateway(up, principal="authorization: sha256")
    try:
        gw.start()
        p = subprocess.run(
            [os.path.join(harness.BIN, "idem-check"), "conformance", "--url", gw.base_url,
             "--token", "token-one-" + uuid.uuid4().hex, "--token2", "token-two-" + uuid.uuid4().hex,
             "--path", "/v1/things", "--body", '{"amount":5}', "--invalid-body", "{}",
             "--count-url", gw.base_url + "/count", "--json"],
            capture_output=True, timeout=120)
        out = p.stdout.decode()
        expect(p.returncode == 0, "idem-check conformance exited %d:\n%s\n%s" % (
            p.returncode, out, p.stderr.decode()))
        checks = json.loads(out)["checks"]
        verdicts = {c["id"]: c["result"] for c in checks}
        bad = {n: v for n, v in verdicts.items() if v not in ("PASS", "SKIP")}
        expect(not bad, "every check passes (or cannot be provoked): %s" % bad)
        expect(sum(1 for v in verdicts.values() if v == "PASS") >= 10,
               "at least ten checks pass: %s" % verdicts)
    finally:
        gw.close()


@test
def check_config_names_file_and_line(ctx):
    gw = ctx["gw"]
    bad = os.path.join(gw.tmpdir, "bad.yaml")
    with open(bad, "w") as f:
        f.write("upstream:\n  url: http://127.0.0.1:1\nprincipal:\n  header: X\n"
                "routes:\n  - match: POST /x\n    operation: x\n    retention: forever\n")
    p = subprocess.run([GATEWAY, "check-config", "--config", bad], capture_output=True,
                       timeout=10)
    err = p.stderr.decode()
    expect_eq(p.returncode, 2, "exit status of a bad config")
    expect(err.startswith(bad + ":8: ") and "retention" in err and err.count("\n") == 1,
           "one line naming file, line and key: %r" % err)
    p = subprocess.run([GATEWAY, "check-config", "--config", gw.config_path],
                       capture_output=True, timeout=10)
    expect(p.returncode == 0 and b"ok (" in p.stdout, "a good config: %r" % p.stdout)


if __name__ == "__main__":
    harness.run("gateway", setup=setup, teardown=teardown)
