#!/usr/bin/env python3
"""
test_gateway_streams.py - slow readers cannot take idem-gateway's workers (issue 29): an answer
too large to hold is streamed by a worker, so clients that never read them would hold every
worker.  Passed-through GET streams are capped per client address and at every worker but one
(the one over is 503 server-busy at once, and a keyed request is still answered); a reader that
trickles is cut once it falls under --stream-min-rate, not held for ever.
"""

import os
import socket
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import expect_eq, expect_fresh, test  # noqa: E402
from gateway_harness import Gateway, Upstream, expect  # noqa: E402

BIG = 24 << 20  # over the gateway's 16 MiB in-memory cap: streamed by a worker


def open_stream(gw, path, rcvbuf=None):
    """A GET of `path` (a big passed-through answer) that reads its status line only."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(30)
    s.connect((gw.host, gw.port))
    s.sendall(("GET %s HTTP/1.1\r\nHost: gw\r\nX-Test-Mode: big:%d\r\n\r\n" % (path, BIG)).encode())
    first = b""
    while b"\r\n" not in first:
        piece = s.recv(1)
        if not piece:
            break
        first += piece
    return s, first.decode("latin-1").strip()


@test
def streams_never_read_leave_a_worker_and_the_one_over_is_503(ctx):
    up = ctx["up"]
    gw = Gateway(up, args=["--http-workers", "3"], name="gateway-streams")
    held = []
    try:
        gw.start()
        # Two streams nobody reads hold two of the three workers; the third is refused at once.
        for i in range(2):
            s, status = open_stream(gw, "/v2/files/%d" % i)
            held.append(s)
            expect_eq(status, "HTTP/1.1 200 OK", "stream %d begins" % i)
        t0 = time.monotonic()
        s, status = open_stream(gw, "/v2/files/over")
        held.append(s)
        expect(status.startswith("HTTP/1.1 503"), "the stream over the cap: %r" % status)
        expect(time.monotonic() - t0 < 5, "refused at once, not after a wait")
        # A keyed request still gets a worker, promptly.
        t0 = time.monotonic()
        k = "streams-%s" % uuid.uuid4().hex[:8]
        r = gw.request("POST", "/v1/things", {"n": 1}, key=k, timeout=20)
        expect_fresh(r, 201, "a keyed request beside the streams")
        expect(time.monotonic() - t0 < 5, "answered in %.1f s" % (time.monotonic() - t0))
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
        statuses = []
        for i in range(3):
            s, status = open_stream(gw, "/v2/files/ip-%d" % i)
            held.append(s)
            statuses.append(status.split(" ")[1] if " " in status else status)
        expect_eq(statuses, ["200", "200", "503"], "the third stream of one address")
    finally:
        for s in held:
            s.close()
        gw.close()


@test
def a_trickling_reader_is_cut_at_the_minimum_rate(ctx):
    up = ctx["up"]
    # 1 MB/s: a reader taking 1 KiB every 200 ms falls under it once the 10 s grace is over.
    gw = Gateway(up, args=["--stream-min-rate", "1000000"], name="gateway-streams-rate")
    try:
        gw.start()
        s, status = open_stream(gw, "/v2/files/trickle", rcvbuf=4096)
        expect_eq(status, "HTTP/1.1 200 OK", "the stream begins")
        t0 = time.monotonic()
        got = 0
        # Trickle past the 10 s grace (and a stall's worth), then read what is left at full
        # speed: a stream the gateway cut ends short (what it had sent still sits in the socket
        # buffers, so the end shows only once they are read); one it let run ends whole.
        while time.monotonic() - t0 < 13:
            piece = s.recv(1024)
            if not piece:
                break
            got += len(piece)
            time.sleep(0.2)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            piece = s.recv(1 << 16)
            if not piece:
                break
            got += len(piece)
        s.close()
        expect(got < BIG, "the gateway cut the stream: %d of %d bytes came" % (got, BIG))
        print("     a trickling reader was cut: %d KiB of %d came" % (got >> 10, BIG >> 10))
        # The gateway goes on serving.
        r = gw.request("GET", "/v2/small")
        expect_eq(r.status, 200, "the gateway still answers")
    finally:
        gw.close()


def setup():
    return {"up": Upstream()}


def teardown(ctx):
    if ctx:
        ctx["up"].close()


if __name__ == "__main__":
    harness.run("gateway-streams", setup=setup, teardown=teardown)
