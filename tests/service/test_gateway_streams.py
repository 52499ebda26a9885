#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_gateway_streams.py - slow readers cannot take idem-gateway's workers: an answer too large
to hold is streamed by the event loop, never by a worker, so clients that never read theirs hold
no thread and keyed requests are answered beside them.  Passed-through GET streams are capped per
client address and in all (the one over is 503 server-busy at once); streams that cannot be
refused (a POST's, a keyed one's) go out over the caps; a reader that trickles is cut once it
falls under --stream-min-rate, not held for ever; a reader whose upstream is the slow side is
not.
"""

import http.client
import io
import os
import re
import socket
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import expect_eq, expect_fresh, expect_problem, retry_after_seconds, test  # noqa: E402
from gateway_harness import DEFAULT_ROUTES, Gateway, Upstream, expect, is_pattern  # noqa: E402

BIG = 24 << 20  # over the gateway's 16 MiB in-memory cap: a passed-through answer is streamed
KEYED_BIG = 2 << 20  # over a route's 1 MiB max_stored_body: a keyed answer is streamed
SLOW = 8 << 20  # bigslow: 64 KiB every 100 ms, about 13 s


def key(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def send(gw, method, path, mode, k=None, rcvbuf=None):
    """A raw connection that has sent one request with X-Test-Mode `mode` (keyed with `k`)."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(30)
    s.connect((gw.host, gw.port))
    body = b'{"n": 1}' if k is not None else b""
    head = "%s %s HTTP/1.1\r\nHost: gw\r\nX-Test-Mode: %s\r\n" % (method, path, mode)
    if k is not None:
        head += ("X-Consumer-Id: alice\r\nIdempotency-Key: %s\r\n"
                 "Content-Type: application/json\r\nContent-Length: %d\r\n" % (k, len(body)))
    s.sendall((head + "\r\n").encode() + body)
    return s


def read_head(s):
    """(status code, header fields, the body bytes that came with the head)."""
    buf = b""
    for _ in range(64):  # a head is at most a few KiB
        if b"\r\n\r\n" in buf:
            break
        piece = s.recv(4096)
        if not piece:
            break
        buf += piece
    head, _, rest = buf.partition(b"\r\n\r\n")
    status_line, _, fields = head.partition(b"\r\n")
    parts = status_line.decode("latin-1").split(" ")
    expect(len(parts) >= 2 and parts[1].isdigit(), "a status line: %r" % buf[:200])
    return int(parts[1]), http.client.parse_headers(io.BytesIO(fields + b"\r\n\r\n")), rest


def read_body(s, got, want, timeout_s=60):
    """The body after `got`, read at full speed up to `want` bytes, the close or the deadline."""
    out = bytearray(got)
    deadline = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        piece = s.recv(1 << 20)
        if not piece:
            break
        out += piece
    return bytes(out)


def read_response(s):
    """A small answer, whole: a harness.Response."""
    t0 = time.monotonic()
    status, headers, rest = read_head(s)
    body = read_body(s, rest, int(headers.get("Content-Length") or 0), 10)
    return harness.Response(status, headers, body, time.monotonic() - t0)


def expect_whole(s, rest, headers, size, what):
    expect_eq(headers.get("Content-Length"), str(size), what + ": Content-Length")
    body = read_body(s, rest, size)
    expect(len(body) == size and is_pattern(body),
           "%s: the upstream's %d bytes, byte for byte (%d came)" % (what, size, len(body)))


def expect_busy(r, what):
    expect_problem(r, 503, "server-busy", what)
    expect_eq(retry_after_seconds(r, what), 1, what + ": Retry-After")


def request_line(gw, path):
    """The gateway's request log line for `path`: (status, outcome, duration in s), or None."""
    pattern = re.compile(r"^[A-Z]+ %s (\d{3}) ([a-z_]+) (\d+\.\d{3}) " % re.escape(path))
    with open(gw.stderr_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = pattern.match(line)
            if m:
                return int(m.group(1)), m.group(2), float(m.group(3)) / 1000.0
    return None


@test
def streams_nobody_reads_are_capped_and_keyed_requests_go_on(ctx):
    # The review's attack: five clients each open a passed-through 24 MiB answer and never read.
    # With --max-streams 2, two stream; the others are refused at once.
    up = ctx["up"]
    gw = Gateway(up, args=["--http-workers", "3", "--max-streams", "2"], name="gateway-streams")
    held = []
    try:
        gw.start()
        for i in range(5):
            t0 = time.monotonic()
            s = send(gw, "GET", "/v2/files/%d" % i, "big:%d" % BIG)
            held.append(s)
            if i < 2:
                expect_eq(read_head(s)[0], 200, "stream %d begins" % i)
            else:
                expect_busy(read_response(s), "stream %d, over --max-streams" % i)
                expect(time.monotonic() - t0 < 5, "refused at once, not after a wait")
        # A keyed request is answered promptly on either store.
        t0 = time.monotonic()
        r = gw.request("POST", "/v1/things", {"n": 1}, key=key("streams"), timeout=20)
        expect_fresh(r, 201, "a keyed request beside the streams")
        expect(time.monotonic() - t0 < 5, "answered in %.1f s" % (time.monotonic() - t0))
        # A keyed answer too large to store is never refused (the upstream acted): it counts over
        # the cap and streams at once; its record says so, so a retry is told so.
        k = key("streams-big")
        s = send(gw, "POST", "/v1/things", "big:%d" % KEYED_BIG, k=k)
        held.append(s)
        harness.wait_until("the keyed request to reach the upstream", lambda: up.executions(k) == 1)
        t0 = time.monotonic()
        r = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        expect_problem(r, 410, "response-not-stored", "a retry of the streamed keyed answer")
        expect(time.monotonic() - t0 < 5, "told in %.1f s" % (time.monotonic() - t0))
        status, headers, rest = read_head(s)
        expect_eq(status, 200, "a keyed answer streamed over the cap")
        expect_whole(s, rest, headers, KEYED_BIG, "the keyed streamed answer")
        expect_eq(up.executions(k), 1, "executions of the streamed keyed request")
    finally:
        for s in held:
            s.close()
        gw.close()


EXPORT_ROUTES = DEFAULT_ROUTES + """
  - match: POST /v1/exports
    operation: exports.create
    store_statuses: [201]
"""


@test
def streams_hold_no_worker(ctx):
    # Streams are written by the event loop: a worker that settled a keyed request whose answer
    # streams is free as soon as the head is handed over.  With two workers, four clients that
    # never read their keyed 24 MiB exports (answers the route does not store: settled on a
    # worker) and two that never read passed-through POST exports all get their heads at once,
    # and a keyed request that needs a worker (its 500 is not stored: settled there) and its
    # retry are still answered within a few seconds.
    up = ctx["up"]
    gw = Gateway(up, routes=EXPORT_ROUTES, args=["--http-workers", "2"],
                 name="gateway-post-streams")
    held = []
    try:
        gw.start()
        for i in range(4):
            held.append(send(gw, "POST", "/v1/exports", "big:%d" % BIG, k=key("export-%d" % i),
                             rcvbuf=4096))
        for i in range(2):
            held.append(send(gw, "POST", "/v2/exports/%d" % i, "big:%d" % BIG, rcvbuf=4096))
        harness.wait_until("the six exports to reach the upstream", lambda: sum(
            1 for r in list(up.requests) if "/exports" in r["path"]) == 6)
        k = key("beside")
        for what in ("a keyed request beside the streams", "its retry"):
            t0 = time.monotonic()
            r = gw.request("POST", "/v1/things", {"n": 1}, key=k, timeout=10,
                           headers={"X-Test-Mode": "status:500"})
            expect_eq(r.status, 500, what)
            expect(time.monotonic() - t0 < 3, "%s answered in %.1f s"
                   % (what, time.monotonic() - t0))
        expect_eq(up.executions(k), 2, "a 500 is not stored: the retry runs again")
        for i, s in enumerate(held):
            s.settimeout(5)
            expect_eq(read_head(s)[0], 200, "stream %d begun, holding no worker" % i)
        r = gw.request("GET", "/v2/small")
        expect_eq(r.status, 200, "the gateway still answers")
    finally:
        for s in held:
            s.close()
        gw.close()


@test
def one_client_holds_at_most_streams_per_ip(ctx):
    up = ctx["up"]
    gw = Gateway(up, args=["--streams-per-ip", "2"], name="gateway-streams-ip")
    held = []
    try:
        gw.start()
        streams = []
        for i in range(2):
            s = send(gw, "GET", "/v2/files/ip-%d" % i, "big:%d" % BIG)
            held.append(s)
            status, headers, rest = read_head(s)
            expect_eq(status, 200, "stream %d of one address" % i)
            streams.append((s, headers, rest))
        s = send(gw, "GET", "/v2/files/ip-over", "big:%d" % BIG)
        held.append(s)
        expect_busy(read_response(s), "the third stream of one address")
        # The two it holds are whole.
        for i, (s, headers, rest) in enumerate(streams):
            expect_whole(s, rest, headers, BIG, "stream %d of one address" % i)

        # Their slots are given back once they end: the next one streams (the end is noted on
        # the gateway's event loop just after the client has the last byte).
        def next_stream():
            s = send(gw, "GET", "/v2/files/ip-next", "big:%d" % BIG)
            held.append(s)
            status, headers, rest = read_head(s)
            return (s, headers, rest) if status == 200 else None
        s, headers, rest = harness.wait_until("a stream once the others ended", next_stream, 10)
        expect_whole(s, rest, headers, BIG, "a stream once the others ended")
    finally:
        for s in held:
            s.close()
        gw.close()


@test
def a_trickling_reader_is_cut_at_the_minimum_rate(ctx):
    # The default --stream-min-rate (16 KiB/s): a reader taking 1 KiB every 200 ms (5 KiB/s) is
    # cut once the gateway has waited 10 s for it, not held while each stall stays short of the
    # 30 s write timeout.  What sits in the socket buffers is not counted as read.  Beside it, a
    # reader at about 64 KiB/s is waited for as long as it reads.
    up = ctx["up"]
    gw = Gateway(up, name="gateway-streams-rate")
    path = "/v2/files/trickle"
    try:
        gw.start()
        steady = send(gw, "GET", "/v2/files/steady", "big:%d" % BIG)
        expect_eq(read_head(steady)[0], 200, "the steady stream begins")

        def read_steadily():
            n, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < 14:
                piece = steady.recv(4096)
                if not piece:
                    return n, "cut"
                n += len(piece)
                time.sleep(1 / 16.0)  # the client's own pace
            return n, "going"
        steady_reader = harness.in_thread(read_steadily)

        s = send(gw, "GET", path, "big:%d" % BIG, rcvbuf=4096)
        status, headers, rest = read_head(s)
        expect_eq(status, 200, "the stream begins")
        got = [len(rest)]

        def trickle_until_cut():
            piece = s.recv(1024)
            got[0] += len(piece)
            return request_line(gw, path)
        status, outcome, seconds = harness.wait_until(
            "the gateway to cut the trickling reader", trickle_until_cut, timeout_s=25,
            pause_s=0.2)
        print("     a trickling reader was cut after %.1f s (%d KiB read)"
              % (seconds, got[0] >> 10))
        expect(10.0 <= seconds < 15.0,
               "cut after the 10 s the gateway may wait for it, within slack: %.1f s" % seconds)
        # What was sent before the cut is still in the socket buffers; then the body ends short.
        body = read_body(s, b"", BIG)
        expect(got[0] + len(body) < BIG,
               "the body ends short: %d of %d bytes" % (got[0] + len(body), BIG))
        s.close()
        n, state = harness.joined(*steady_reader, what="the steady reader", timeout=30)
        ended = request_line(gw, "/v2/files/steady")
        expect(state == "going" and ended is None,
               "a reader at about 64 KiB/s is not cut: %s after %d KiB, the gateway's log: %r"
               % (state, n >> 10, ended))
        steady.close()
        r = gw.request("GET", "/v2/small")
        expect_eq(r.status, 200, "the gateway still answers")
    finally:
        gw.close()


@test
def a_reader_behind_a_slow_upstream_is_not_cut(ctx):
    # Only the time the gateway waits for the client counts against its rate: a keyed answer
    # the upstream sends at 640 KiB/s, under a minimum rate of 1 MB/s, goes out whole to a client
    # that reads at once, even past a pause (once streamed, a keyed answer is not kept: cut, it
    # would be lost).
    up = ctx["up"]
    gw = Gateway(up, args=["--stream-min-rate", "1000000"], name="gateway-streams-slow")
    try:
        gw.start()
        t0 = time.monotonic()
        s = send(gw, "POST", "/v1/things", "bigslow:%d" % SLOW, k=key("slow"), rcvbuf=4096)
        status, headers, rest = read_head(s)
        expect_eq(status, 200, "the stream begins")
        body = bytearray(rest)
        for pause_at in (4.0, 60.0):
            while len(body) < SLOW and time.monotonic() - t0 < pause_at:
                piece = s.recv(1 << 16)
                if not piece:
                    break
                body += piece
            if pause_at < 60:
                # The client stops reading for a while (its own doing, not a wait for the
                # gateway): the gateway's buffers fill and it waits for the client past 10 s.
                time.sleep(7.5)
        s.close()
        expect(len(body) == SLOW and is_pattern(body),
               "the whole answer, byte for byte: %d of %d bytes" % (len(body), SLOW))
        print("     a reader behind a slow upstream got it all in %.1f s"
              % (time.monotonic() - t0))
    finally:
        gw.close()


def setup():
    return {"up": Upstream()}


def teardown(ctx):
    if ctx:
        ctx["up"].close()


if __name__ == "__main__":
    harness.run("gateway-streams", setup=setup, teardown=teardown)
