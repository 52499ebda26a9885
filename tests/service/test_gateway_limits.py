#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_gateway_limits.py - one caller cannot make idem-gateway keep without bound, over real HTTP on
loopback, in front of the counting upstream of gateway_harness.py:

  - keyed requests one principal runs at once are capped (429 too-many-requests, Retry-After),
    and another principal is not held back;
  - new keys one principal starts a second are capped, while retries of its keys still replay;
  - the bytes one principal's records hold are capped (429 stored-bytes-exceeded), counted again
    from the store after a restart;
  - the bytes every principal's records hold together are capped (507 store-full);
  - each refusal is a problem+json, nothing reaches the upstream, and /metrics counts it.
"""

import os
import sys
import threading
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import (expect_eq, expect_problem, expect_replay, metric_value,  # noqa: E402
                     parse_metrics, retry_after_seconds, test)
from gateway_harness import Gateway, Upstream, expect  # noqa: E402

ROUTES = """
  - match: POST /v1/things
    operation: things.create
"""


def key(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def limited(gw, reason):
    samples = parse_metrics(gw.admin("GET", "/metrics").body.decode())
    return metric_value(samples, "idem_gateway_limited_total", reason=reason) or 0


def expect_ok(r, what):
    expect(200 <= r.status < 300, "%s: %s" % (what, r.describe(300)))


def expect_refused(gw, up, principal, status, code, what):
    k = key("refused")
    r = gw.request("POST", "/v1/things", {"n": 1}, key=k, principal=principal)
    expect_problem(r, status, code, what)
    expect(retry_after_seconds(r, what) >= 1, "%s: a Retry-After" % what)
    expect_eq(up.executions(k), 0, "%s: executions" % what)
    return r


def with_gateway(extra, fn, up=None):
    own = up is None
    up = up or Upstream()
    gw = Gateway(up, routes=ROUTES, extra=extra, name="gateway-limits")
    try:
        gw.start()
        fn(gw, up)
    finally:
        gw.close()
        if own:
            up.close()


@test
def keys_in_flight_are_capped_per_principal(ctx):
    def run(gw, up):
        held = [key("held") for _ in range(2)]
        threads = [threading.Thread(target=gw.request, args=("POST", "/v1/things", {"n": i}),
                                    kwargs={"key": k, "principal": "mallory", "timeout": 30,
                                            "headers": {"X-Test-Mode": "hang"}}, daemon=True)
                   for i, k in enumerate(held)]
        for t in threads:
            t.start()
        harness.wait_until("two keyed requests running upstream",
                           lambda: all(up.executions(k) == 1 for k in held))
        expect_refused(gw, up, "mallory", 429, "too-many-requests", "a third one of mallory's")
        expect_ok(gw.request("POST", "/v1/things", {"n": 1}, key=key("alice"), principal="alice"),
                  "alice beside mallory's")
        expect(limited(gw, "keys_in_flight") >= 1, "counted in /metrics")
        up.release.set()  # the held ones end (502 outcome-unknown): mallory may go on
        for t in threads:
            t.join(30)
        expect_ok(gw.request("POST", "/v1/things", {"n": 2}, key=key("after"),
                             principal="mallory"), "mallory's once they ended")
    with_gateway("principal_limits:\n  keys_in_flight: 2\n", run)


@test
def new_keys_a_second_are_capped_per_principal(ctx):
    def run(gw, up):
        first = key("rate")
        r0 = gw.request("POST", "/v1/things", {"n": 0}, key=first, principal="mallory")
        expect_ok(r0, "mallory's first key")
        refused = None
        for i in range(40):
            r = gw.request("POST", "/v1/things", {"n": i}, key=key("rate"), principal="mallory")
            if r.status == 429:
                refused = r
                break
            expect_ok(r, "mallory's key %d" % i)
        expect(refused is not None, "mallory is refused within 40 new keys at 2 a second")
        expect_problem(refused, 429, "too-many-requests", "over the rate")
        expect(retry_after_seconds(refused, "over the rate") >= 1, "a Retry-After")
        # A retry of a key it has is not a new key: replayed, never refused.
        expect_replay(gw.request("POST", "/v1/things", {"n": 0}, key=first, principal="mallory"),
                      r0, "a retry of mallory's first key")
        expect_ok(gw.request("POST", "/v1/things", {"n": 1}, key=key("alice"), principal="alice"),
                  "alice beside mallory")
        expect(limited(gw, "new_keys_rate") >= 1, "counted in /metrics")
    with_gateway("principal_limits:\n  new_keys_per_second: 2\n", run)


@test
def stored_bytes_are_capped_per_principal_across_a_restart(ctx):
    up = Upstream()
    extra = "principal_limits:\n  stored_bytes: 20KiB\n"
    gw = Gateway(up, routes=ROUTES, extra=extra, name="gateway-limits-stored")
    try:
        gw.start()
        stored = 0
        for i in range(10):
            r = gw.request("POST", "/v1/things", {"n": i}, key=key("big"), principal="mallory",
                           headers={"X-Test-Mode": "big:8192"})
            if r.status == 429:
                break
            expect_ok(r, "mallory's answer %d" % i)
            stored += 1
        expect(2 <= stored <= 3, "8 KiB answers stored before 20 KiB are held: %d" % stored)
        r = expect_refused(gw, up, "mallory", 429, "stored-bytes-exceeded", "mallory, full")
        expect(retry_after_seconds(r, "mallory, full") > 60,
               "Retry-After: when mallory's records expire, not at once")
        expect_ok(gw.request("POST", "/v1/things", {"n": 1}, key=key("alice"), principal="alice"),
                  "alice beside mallory")
        expect(limited(gw, "stored_bytes") >= 1, "counted in /metrics")
        # The store still holds mallory's records: a restart counts them again.
        gw.restart()
        expect_refused(gw, up, "mallory", 429, "stored-bytes-exceeded", "mallory after a restart")
    finally:
        gw.close()
        up.close()


@test
def the_stored_bytes_of_all_principals_have_a_budget(ctx):
    def run(gw, up):
        full = None
        for i in range(12):
            r = gw.request("POST", "/v1/things", {"n": i}, key=key("budget"),
                           principal="caller-%d" % i, headers={"X-Test-Mode": "big:8192"})
            if r.status == 507:
                full = i
                break
            expect_ok(r, "caller %d's answer" % i)
        expect(full is not None and 3 <= full <= 4, "the budget is met after 3-4 answers: %s"
               % full)
        expect_refused(gw, up, "someone-new", 507, "store-full", "a new caller, the store full")
        expect(limited(gw, "store_budget") >= 1, "counted in /metrics")
        samples = parse_metrics(gw.admin("GET", "/metrics").body.decode())
        expect(metric_value(samples, "idem_gateway_stored_bytes") >= 30 * 1024,
               "idem_gateway_stored_bytes")
    with_gateway("max_stored_bytes: 30KiB\n", run)


if __name__ == "__main__":
    harness.run("gateway-limits")
