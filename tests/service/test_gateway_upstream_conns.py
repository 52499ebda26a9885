#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_gateway_upstream_conns.py - with its default config, idem-gateway never gives a keyed request
(and so never stores for it) an answer the upstream meant for something else, over real HTTP on
loopback, in front of an upstream that misbehaves on its connections as some do:

  - one sends an unasked second answer some time after the first: it arrives after any check the
    gateway could make before reusing the connection;
  - one answers before reading the body, then takes the body for the next request on the
    connection and answers that too.

Keyed requests go on connections of their own by default (upstream.keyed_connections: fresh), so
each gets the answer to itself, and its retry replays that answer.  Requests passed through keep
sharing pooled connections.
"""

import json
import os
import socket
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import expect_eq, expect_replay, test  # noqa: E402
from gateway_harness import DEFAULT_ROUTES, Gateway, HandUpstream, expect  # noqa: E402

# The unasked answer goes out once the next request's bytes arrive, or after this long.
LATE_S = 1.0


def key(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


class StrayUpstream(HandUpstream):
    """
    An upstream speaking HTTP/1.1 by hand.  Every request is answered 200 {"conn": C, "path": P,
    "key": K} (C numbers its connections, K is the Idempotency-Key it got).  After a request with
    `X-Mode: late` it sends an unasked answer {"stray": "late"} as soon as more bytes come on the
    connection (before answering them), or LATE_S after its answer.  A request with `X-Mode: early`
    is answered as soon as its head is in; its body is read as the start of the next request,
    which is answered {"stray": "early"} whatever it is.
    """

    def __init__(self):
        super().__init__()
        self.strays = 0  # unasked answers sent

    @staticmethod
    def _answer(doc):
        body = json.dumps(doc).encode()
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % len(body)) + body

    def _stray(self, c, why):
        with self.lock:
            self.strays += 1
        c.sendall(self._answer({"stray": why}))

    def _serve(self, c, n):
        buf, late, early = b"", False, False
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    c.settimeout(LATE_S if late else None)
                    try:
                        piece = c.recv(65536)
                    except socket.timeout:
                        piece = None
                    if late:  # more bytes came, or it is time: the unasked answer goes first
                        late = False
                        self._stray(c, "late")
                    if piece is None:
                        continue
                    if not piece:
                        return
                    buf += piece
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                fields = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    fields[name.strip().lower()] = value.strip()
                if early:  # the body of the request before, taken for a request
                    early = False
                    self._stray(c, "early")
                    continue
                mode = fields.get("x-mode", "")
                answer = self._answer({"conn": n, "path": lines[0].split(" ")[1],
                                       "key": fields.get("idempotency-key")})
                length = int(fields.get("content-length", "0"))
                if mode == "early":
                    c.sendall(answer)  # the body stays unread: it starts the next "request"
                    early = True
                    continue
                buf = self._past_body(c, buf, length)
                if buf is None:
                    return
                c.sendall(answer)
                late = mode == "late"
        except OSError:
            return
        finally:
            c.close()


def expect_own_answer(gw, k, body, what, mode=None):
    headers = {"X-Mode": mode} if mode else None
    r = gw.request("POST", "/v1/things", body, key=k, headers=headers)
    expect_eq(r.status, 200, "%s: %s" % (what, r.describe(200)))
    expect("stray" not in r.json(), "%s: got an answer meant for nothing: %s" % (what, r.body))
    expect_eq(r.json()["key"], k, "%s: the answer to its own key" % what)
    expect_replay(gw.request("POST", "/v1/things", body, key=k, headers=headers), r,
                  "%s, replayed" % what)
    return r


def with_gateway(fn):
    up = StrayUpstream()
    gw = Gateway(up, routes=DEFAULT_ROUTES, name="gateway-conns", args=["--http-threads", "1"])
    try:
        gw.start()
        fn(gw, up)
    finally:
        gw.close()
        up.close()


@test
def a_late_unasked_answer_never_reaches_a_keyed_request(ctx):
    def run(gw, up):
        for i in range(3):
            expect_own_answer(gw, key("late"), {"n": i}, "keyed request %d" % i, mode="late")
            # The one after it: on a pooled connection it would be written on the one the
            # upstream is about to send its unasked answer on, and take that answer for its own.
            expect_own_answer(gw, key("next"), {"n": i}, "the keyed request after %d" % i)
        # The upstream did send its unasked answers: the check above is not vacuous.
        harness.wait_until("the upstream's unasked answers", lambda: up.strays >= 3)
    with_gateway(run)


@test
def an_answer_before_the_body_never_reaches_the_next_keyed_request(ctx):
    def run(gw, up):
        for i in range(3):
            hidden = "POST /hidden HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            k = key("early")
            r = gw.request("POST", "/v1/things", hidden, key=k,
                           headers={"Content-Type": "text/plain", "X-Mode": "early"})
            expect_eq(r.json().get("key"), k, "the early answer is the request's own")
            expect_own_answer(gw, key("next"), {"n": i}, "the keyed request after %d" % i)
        harness.wait_until("the upstream's answers to the bodies", lambda: up.strays >= 1)
    with_gateway(run)


@test
def requests_passed_through_still_share_connections(ctx):
    def run(gw, up):
        a = gw.request("POST", "/v2/one", {"n": 1}).json()["conn"]
        b = gw.request("POST", "/v2/two", {"n": 2}).json()["conn"]
        expect_eq(a, b, "two requests passed through, one upstream connection")
        c = gw.request("POST", "/v1/things", {"n": 3}, key=key("own")).json()["conn"]
        d = gw.request("POST", "/v1/things", {"n": 4}, key=key("own")).json()["conn"]
        expect(len({a, c, d}) == 3, "each keyed request on a connection of its own: %r"
               % ([a, c, d],))
    with_gateway(run)


if __name__ == "__main__":
    harness.run("gateway-upstream-conns")
