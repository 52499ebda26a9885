#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_gateway_conventions.py - idem-gateway speaks its clients' conventions, over real
HTTP on loopback, in front of the counting upstream of gateway_harness.py (which does not dedupe,
so a second execution shows):

  - error_format: stripe: the gateway's own errors are Stripe's envelope, with the status that
    picks a Stripe SDK's error class and a Stripe-Should-Retry that says whether a retry can
    succeed; the upstream's own answers pass untouched; replays keep Request-Id and
    Stripe-Version;
  - an error the upstream marks retryable (Stripe-Should-Retry: true, Retry-After) is not stored:
    the retry runs again (unless the route says store_retryable);
  - scope_headers: the same key and body for two connected accounts are two operations;
  - a gateway restarted after kill -9 answers a retry of a key its earlier process was
    forwarding at once (on_unknown), not after the lease; a second gateway on one SQLite store
    is refused.
"""

import os
import socket
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import expect_eq, expect_fresh, expect_replay, test  # noqa: E402
from gateway_harness import Gateway, Upstream, expect  # noqa: E402

ROUTES = """
  - match: POST /v1/charges
    operation: charges.create
    wait: 200ms
    scope_headers: [Stripe-Account]
  - match: POST /v1/resend
    operation: resend.create
    on_unknown: resend
  - match: POST /v1/stored
    operation: stored.create
    store_retryable: true
"""


def key(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def setup():
    up = Upstream()
    gw = Gateway(up, routes=ROUTES, extra="error_format: stripe\n", upstream_timeout="10s")
    gw.start()
    return {"up": up, "gw": gw}


def teardown(ctx):
    if ctx:
        ctx["gw"].close()
        ctx["up"].close()


def expect_stripe(r, status, etype, code, retry, what):
    """Stripe's envelope of (status, type, code) with Stripe-Should-Retry `retry`."""
    if r.status != status or r.content_type != "application/json":
        harness.fail("%s: expected %d application/json, got %s" % (what, status, r.describe()))
    doc = r.json()
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict) or len(doc) != 1:
        harness.fail("%s: expected {\"error\": {...}}, got %s" % (what, r.describe()))
    expect_eq((err.get("type"), err.get("code")), (etype, code), what + ": type and code")
    expect(isinstance(err.get("message"), str) and err["message"], what + ": a message")
    expect_eq(r.header("Stripe-Should-Retry"), retry, what + ": Stripe-Should-Retry")


@test
def stripe_errors_pick_the_sdk_error_class_and_say_whether_to_retry(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("reuse")
    expect_fresh(gw.request("POST", "/v1/charges", {"amount": 1}, key=k), 201, "first charge")
    expect_stripe(gw.request("POST", "/v1/charges", {"amount": 2}, key=k), 400,
                  "idempotency_error", "idempotency_key_reused", "false", "the key reused")
    expect_stripe(gw.request("POST", "/v1/charges", {"amount": 1}), 400, "invalid_request_error",
                  "idempotency_key_missing", "false", "no key")
    expect_stripe(gw.request("POST", "/v1/charges", {"amount": 1}, key=key(), principal=None), 401,
                  "authentication_error", "unauthorized", "false", "no caller")

    # A duplicate while the first still runs: 409 idempotency_key_in_use, retry.
    k = key("busy")
    first = {}
    t = threading.Thread(target=lambda: first.update(r=gw.request(
        "POST", "/v1/charges", {"amount": 3}, key=k, headers={"X-Test-Mode": "slow:1500"})))
    t.start()
    harness.wait_until("the first request to reach the upstream", lambda: up.executions(k) == 1)
    expect_stripe(gw.request("POST", "/v1/charges", {"amount": 3}, key=k), 409,
                  "idempotency_error", "idempotency_key_in_use", "true", "a duplicate in flight")
    t.join(30)
    expect_fresh(first["r"], 201, "the slow first request")

    # An outcome held for an operator: a retry only meets the same answer, so "false".
    k = key("held")
    expect_stripe(gw.request("POST", "/v1/charges", {"amount": 4}, key=k,
                             headers={"X-Test-Mode": "reset"}),
                  502, "api_error", "outcome_unknown", "false", "an answer lost (hold)")
    expect_stripe(gw.request("POST", "/v1/charges", {"amount": 4}, key=k), 503, "api_error",
                  "outcome_unknown", "false", "its retry (held)")
    # A route that resends: the retry settles it, so "true"; and it does.
    k = key("resend")
    expect_stripe(gw.request("POST", "/v1/resend", {"amount": 5}, key=k,
                             headers={"X-Test-Mode": "reset"}),
                  502, "api_error", "outcome_unknown", "true", "an answer lost (resend)")
    expect_fresh(gw.request("POST", "/v1/resend", {"amount": 5}, key=k), 201, "its retry, resent")

    # The upstream's own error passes as it is (its body, no Stripe-Should-Retry of ours).
    r = gw.request("POST", "/v1/charges", {"amount": 6}, key=key(),
                   headers={"X-Test-Mode": "status:422"})
    expect_eq(r.status, 422, "the upstream's 422")
    expect_eq(r.json().get("path"), "/v1/charges", "the upstream's own body")
    expect(r.header("Stripe-Should-Retry") is None, "no Stripe-Should-Retry added to it")

    # Replays keep what Stripe's clients log: Request-Id and Stripe-Version.
    k = key("ids")
    h = {"Stripe-Version": "2024-06-20"}
    r1 = expect_fresh(gw.request("POST", "/v1/charges", {"amount": 7}, key=k, headers=h), 201,
                      "a charge")
    r2 = expect_replay(gw.request("POST", "/v1/charges", {"amount": 7}, key=k, headers=h), r1)
    expect(r1.header("Request-Id"), "the upstream's Request-Id")
    expect_eq((r2.header("Request-Id"), r2.header("Stripe-Version")),
              (r1.header("Request-Id"), "2024-06-20"), "Request-Id and Stripe-Version replayed")
    print("     STRIPE: reused 400 idempotency_error, in flight 409 idempotency_key_in_use "
          "(retry), held 502/503 (no retry), resend 502 (retry) then 201, upstream 422 untouched")


@test
def an_error_the_upstream_marks_retryable_is_not_stored(ctx):
    gw, up = ctx["gw"], ctx["up"]
    for how, header in (("retry", "Stripe-Should-Retry"), ("after", "Retry-After")):
        k = key(how)
        r = gw.request("POST", "/v1/charges", {"amount": 1}, key=k,
                       headers={"X-Test-Mode": "status:409:" + how})
        expect_eq(r.status, 409, "a lock_timeout with %s" % header)
        expect(r.header(header) is not None, "%s relayed" % header)
        expect_fresh(gw.request("POST", "/v1/charges", {"amount": 1}, key=k), 201,
                     "the retry after a 409 with %s: run again" % header)
        expect_eq(up.executions(k), 2, "executions of a key whose first answer said retry")
    # A route that stores them anyway replays the 409.
    k = key("kept")
    r = gw.request("POST", "/v1/stored", {"amount": 1}, key=k,
                   headers={"X-Test-Mode": "status:409:retry"})
    expect_eq(r.status, 409, "a retryable 409 on a store_retryable route")
    expect_replay(gw.request("POST", "/v1/stored", {"amount": 1}, key=k), r, "its retry")
    expect_eq(up.executions(k), 1, "executions with store_retryable: true")


@test
def scope_headers_make_two_accounts_two_operations(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("acct")
    a1 = expect_fresh(gw.request("POST", "/v1/charges", {"amount": 9}, key=k,
                                 headers={"Stripe-Account": "acct_1"}), 201, "account 1")
    expect_fresh(gw.request("POST", "/v1/charges", {"amount": 9}, key=k,
                            headers={"Stripe-Account": "acct_2"}), 201, "account 2, same key")
    expect_replay(gw.request("POST", "/v1/charges", {"amount": 9}, key=k,
                             headers={"Stripe-Account": "acct_1"}), a1, "account 1 again")
    expect_fresh(gw.request("POST", "/v1/charges", {"amount": 9}, key=k), 201,
                 "no account: a scope of its own")
    expect_eq(up.executions(k), 3, "executions of one key for two accounts and none")
    last = up.last_request()
    expect(last["headers"].get("Stripe-Account") is None, "no header forwarded when none sent")
    raw = (b"POST /v1/charges HTTP/1.1\r\nHost: x\r\nX-Consumer-Id: alice\r\n"
           b"Idempotency-Key: " + key().encode() + b"\r\n"
           b"Stripe-Account: acct_1\r\nStripe-Account: acct_2\r\n"
           b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
    with socket.create_connection((gw.host, gw.port), timeout=10) as sock:
        sock.sendall(raw)
        head = sock.recv(65536).split(b"\r\n", 1)[0]
    expect(b" 400 " in head, "a scope header sent twice: 400, got %r" % head)


@test
def a_restart_answers_a_retry_of_a_forward_it_lost_at_once(ctx):
    up = ctx["up"]
    pg = ctx["gw"].db_uri.startswith("postgres")
    # On PostgreSQL a gateway frees its earlier process's records only under a name of its own.
    gw = Gateway(up, routes=ROUTES, upstream_timeout="10s", name="gateway-restart",
                 extra="error_format: stripe\n" + ("instance: gw-restart\n" if pg else ""))
    try:
        gw.start()
        k = key("crash")
        t = threading.Thread(target=lambda: _swallow(lambda: gw.request(
            "POST", "/v1/charges", {"amount": 1}, key=k, headers={"X-Test-Mode": "hang"},
            timeout=30)), daemon=True)
        t.start()
        harness.wait_until("the request to reach the upstream", lambda: up.executions(k) == 1)
        gw.kill9()
        gw.start()
        t0 = time.monotonic()
        r = gw.request("POST", "/v1/charges", {"amount": 1}, key=k)
        took = time.monotonic() - t0
        expect_eq(r.status, 503, "a retry of the lost forward after the restart (%s)" %
                  r.describe())
        expect_eq(r.json()["error"]["code"], "outcome_unknown", "held: outcome unknown")
        expect(took < 5, "answered in %.2f s, not after the 20 s lease" % took)
        expect_eq(up.executions(k), 1, "executions of the lost forward")
        print("     RESTART: a retry after kill -9 answered 503 outcome_unknown in %.2f s "
              "(lease 20 s)" % took)
    finally:
        gw.close()


@test
def a_second_gateway_on_one_sqlite_store_is_refused(ctx):
    """A restart frees every earlier process's records on SQLite: a live one must not share it."""
    gw = ctx["gw"]
    if gw.db_uri.startswith("postgres"):
        return  # several gateways share PostgreSQL; each frees its own instance's only
    # The same config: the same store, listeners on ports of their own (127.0.0.1:0).
    p = subprocess.run([os.path.join(harness.BIN, "idem-gateway"), "serve", "--config",
                        gw.config_path], capture_output=True, timeout=30)
    err = p.stderr.decode("utf-8", "replace")
    expect(p.returncode != 0, "a second gateway on the same SQLite store exited %d" % p.returncode)
    expect("another idem-gateway serves" in err, "it says why: %s" % err.strip()[-300:])
    # The first serves on.
    expect_fresh(gw.request("POST", "/v1/charges", {"amount": 1}, key=key()), 201,
                 "the first gateway after the refusal")


def _swallow(fn):
    try:
        fn()
    except Exception:  # noqa: BLE001 - the gateway is killed under this request
        pass


if __name__ == "__main__":
    harness.run("gateway-conventions", setup=setup, teardown=teardown)
