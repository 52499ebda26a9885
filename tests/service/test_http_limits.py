# SPDX-License-Identifier: Apache-2.0
"""
test_http_limits.py - what a hostile or clumsy client gets from orderd's HTTP layer
(src/http/http_server.c): every refusal a problem+json with its code, sent before the server reads
what it does not need, and connections that cannot hold the server hostage.

Most of what is sent here cannot be said with http.client (an oversized or trickling head, a head
without its body, pipelined requests, a client bound to 127.0.0.2), so the tests speak HTTP over
raw sockets and read the answers themselves.  The last test is the slowloris of the issue: 1,000
connections trickling heads and bodies from 127.0.0.2..9 while a legitimate client from 127.0.0.1
places orders; the attacker runs in a forked process so that its work does not slow the
legitimate client's measurements in this one.

The three tests at the end reproduce server bugs found while writing this file (white space
before a header's colon, a control character opening a header value, chunked trailer fields
read from freed memory); they fail until the server is fixed.
"""

import http.client
import io
import math
import multiprocessing
import os
import resource
import select
import selectors
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Response, Server, TestFailure, expect, expect_eq,  # noqa: E402
                     expect_problem, expect_status, fail, new_key, run, test)

# The shared server's deadlines: short, so a test sees them pass in about a second.
HEAD_TIMEOUT_MS = 1000
BODY_TIMEOUT_MS = 1000
IDLE_TIMEOUT_MS = 1000
# How late a deadline may be noticed: the server checks deadlines every 100 ms; the rest is a
# loaded 2-core machine running the tests in parallel.
LATE_S = 1.5

ORDER_BODY = b'{"productId":"p-1024","quantity":2}'


def raise_nofile(want):
    """Raises this process's open-file limit to `want` (as far as the hard limit goes)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


# ---- raw HTTP ---------------------------------------------------------------------------------

class RawConn:
    """One TCP connection to a Server, spoken to byte by byte; reads answers as they come."""

    def __init__(self, server, source=None, timeout=5.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if source is not None:
            self.sock.bind((source, 0))
        self.sock.settimeout(timeout)
        self.sock.connect((server.host, server.port))
        self.buf = b""
        self.eof = False
        self.reset = False
        self.t0 = time.monotonic()

    def send(self, data):
        """Sends everything; False when the server no longer takes bytes (closed or reset)."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def _fill(self, deadline):
        """Reads what is there; False at the deadline or at the end of the stream."""
        if self.eof:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return False
        except ConnectionResetError:
            self.eof = self.reset = True
            return False
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def readable_within(self, seconds):
        """Whether the server sent something (or closed) within `seconds`."""
        if self.buf or self.eof:
            return True
        r, _, _ = select.select([self.sock], [], [], max(0.0, seconds))
        return bool(r)

    def read_response(self, timeout=5.0, what="response"):
        """
        The next response on the connection (a 1xx too), as a harness Response whose `elapsed`
        is the time since the connection opened; fails when none arrives in `timeout`.
        """
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self.buf:
            if not self._fill(deadline):
                fail("%s: no complete response head within %.1f s (%s); got %r" % (
                    what, timeout, "connection closed" if self.eof else "timeout",
                    self.buf[:300]))
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        status_line, _, header_block = head.partition(b"\r\n")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            fail("%s: not an HTTP/1.x status line: %r" % (what, status_line))
        status = int(parts[1])
        headers = http.client.parse_headers(io.BytesIO(header_block + b"\r\n\r\n"))
        length = 0
        if not (100 <= status < 200 or status in (204, 304)):
            cl = headers.get("Content-Length")
            if cl is None or not cl.strip().isdigit():
                fail("%s: a %d without a Content-Length: %r" % (what, status, head))
            length = int(cl)
        self.buf = rest
        while len(self.buf) < length:
            if not self._fill(deadline):
                fail("%s: body cut short (%d of %d bytes)" % (what, len(self.buf), length))
        body, self.buf = self.buf[:length], self.buf[length:]
        resp = Response(status, headers, body, time.monotonic() - self.t0)
        resp.version = parts[0].decode("ascii", "replace")
        return resp

    def closed_within(self, seconds):
        """
        Whether the server closed the connection within `seconds` (bytes it sends meanwhile are
        kept in self.buf).
        """
        deadline = time.monotonic() + seconds
        while not self.eof:
            if not self._fill(deadline) and not self.eof:
                return False
        return True

    def expect_closed(self, seconds, what):
        if not self.closed_within(seconds):
            fail("%s: the server kept the connection open %.1f s after answering" % (what, seconds))
        if self.buf:
            fail("%s: unexpected bytes before the close: %r" % (what, self.buf[:300]))

    def expect_open(self, what):
        """The server has not closed the connection and sent nothing unasked."""
        if self.readable_within(0.1):
            self._fill(time.monotonic() + 0.1)
            fail("%s: the connection should stay open; %s" % (
                what, "it was closed" if self.eof else "got %r" % self.buf[:200]))

    def trickle(self, data, interval, limit_s):
        """
        Sends `data` one byte every `interval` seconds until the server says something (or
        closes), or `limit_s` passes.  Returns the seconds from the first byte to the server's
        first reaction (None: none), and how many bytes went out.
        """
        t_first = time.monotonic()
        sent = 0
        for i in range(len(data)):
            if not self.send(data[i:i + 1]):
                break
            sent += 1
            if self.readable_within(interval):
                return time.monotonic() - t_first, sent
            if time.monotonic() - t_first > limit_s:
                return None, sent
        if self.readable_within(max(0.0, limit_s - (time.monotonic() - t_first))):
            return time.monotonic() - t_first, sent
        return None, sent

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def head_bytes(method, path, headers=(), version="HTTP/1.1"):
    lines = ["%s %s %s" % (method, path, version)] + ["%s: %s" % hv for hv in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def auth_headers(user, **extra):
    hdrs = [("Host", "127.0.0.1"), ("Authorization", "Bearer " + user.token)]
    hdrs += [(k.replace("_", "-"), v) for k, v in extra.items()]
    return hdrs


def exchange(server, data, what, source=None, timeout=5.0):
    """Sends `data` on a new connection and reads one response; returns (conn, response)."""
    c = RawConn(server, source=source)
    c.send(data)
    return c, c.read_response(timeout, what)


def expect_refused_and_closed(server, data, status, code, what, source=None):
    """One request that the server must refuse with `status`/`code` and then close."""
    c, r = exchange(server, data, what, source=source)
    try:
        expect_problem(r, status, code, what)
        expect_eq((r.header("Connection") or "").lower(), "close", what + ": Connection header")
        c.expect_closed(3.0, what)
    finally:
        c.close()
    return r


def healthz(source=None, version="HTTP/1.1", extra=()):
    return head_bytes("GET", "/healthz", [("Host", "127.0.0.1")] + list(extra), version)


# ---- the shared server --------------------------------------------------------------------------

class Ctx:
    """One orderd with short deadlines for most tests; the cap tests start their own."""

    def __init__(self):
        raise_nofile(4096)  # orderd inherits it; the slowloris needs 1,000 descriptors
        self.server = Server(name="orderd-limits", extra_args=[
            "--head-timeout-ms", str(HEAD_TIMEOUT_MS), "--body-timeout-ms", str(BODY_TIMEOUT_MS),
            "--idle-timeout-ms", str(IDLE_TIMEOUT_MS)]).start()
        self.user = self.server.new_user("limits")

    def close(self):
        self.server.close()


# ---- the head: size, malformed, unknown -------------------------------------------------------

@test
def test_one_huge_header_is_431(ctx):
    data = head_bytes("GET", "/healthz", [("Host", "127.0.0.1"), ("X-Huge", "a" * 9000)])
    expect_refused_and_closed(ctx.server, data, 431, "request-header-too-large",
                              "a 9000-byte header field")


@test
def test_101_header_fields_are_431_and_100_are_fine(ctx):
    fields = [("X-Field-%d" % i, "v") for i in range(101)]
    expect_refused_and_closed(ctx.server, head_bytes("GET", "/healthz", fields), 431,
                              "request-header-too-large", "101 small header fields")
    c, r = exchange(ctx.server, head_bytes("GET", "/healthz", fields[:100]), "100 header fields")
    c.close()
    expect_status(r, 200, "100 header fields (the cap, not over it)")


@test
def test_a_header_block_just_under_the_cap_is_served(ctx):
    # 8192 bytes is the default cap; a block of about 7 KiB in 20 fields must pass.
    fields = [("Host", "127.0.0.1")] + [("X-Pad-%02d" % i, "p" * 350) for i in range(20)]
    c, r = exchange(ctx.server, head_bytes("GET", "/healthz", fields), "a 7 KiB head")
    c.close()
    expect_status(r, 200, "a 7 KiB head")


@test
def test_malformed_request_lines_are_400(ctx):
    for line in (b"GET /healthz HTTP/1.x\r\n\r\n",
                 b"GET /heal thz HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"GET /healthz HTTP/1.1 trailing\r\nHost: x\r\n\r\n",
                 b"GET /healthz HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
                 b"GET /a%00b HTTP/1.1\r\nHost: x\r\n\r\n"):
        expect_refused_and_closed(ctx.server, line, 400, "bad-request", "request %r" % line)


def http_counter(server, name):
    c, r = exchange(server, healthz().replace(b"/healthz", b"/metrics"), "GET /metrics")
    c.close()
    expect_status(r, 200, "GET /metrics")
    for line in r.body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    fail("/metrics has no %s" % name)


@test
def test_refusals_are_counted_on_metrics(ctx):
    before = http_counter(ctx.server, "orderd_http_refused_heads_total")
    expect_refused_and_closed(ctx.server, healthz(extra=[("X-Big", "b" * 9000)]), 431,
                              "request-header-too-large", "a 9 KB header")
    expect_refused_and_closed(ctx.server, b"BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 501,
                              "method-not-implemented", "BREW /healthz")
    expect_eq(http_counter(ctx.server, "orderd_http_refused_heads_total") - before, 2,
              "orderd_http_refused_heads_total increase after a 431 and a 501")
    expect(http_counter(ctx.server, "orderd_http_connections") >= 1,
           "orderd_http_connections counts the scrape's own connection")


@test
def test_http_versions_other_than_1_0_and_1_1_are_505(ctx):
    for version in ("HTTP/2.0", "HTTP/1.9", "HTTP/3.7"):
        expect_refused_and_closed(ctx.server, healthz(version=version), 505,
                                  "http-version-not-supported", "GET /healthz " + version)


@test
def test_targets_not_starting_with_a_slash_are_400(ctx):
    for line in (b"GET *healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"):
        expect_refused_and_closed(ctx.server, line, 400, "bad-request", "request %r" % line)


@test
def test_unknown_method_is_501(ctx):
    expect_refused_and_closed(ctx.server, b"BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 501,
                              "method-not-implemented", "BREW /healthz")


@test
def test_content_length_with_chunked_is_400(ctx):
    u = ctx.server.new_user("clte")
    data = head_bytes("POST", "/api/orders", auth_headers(
        u, Content_Type="application/json", Idempotency_Key=new_key("clte"),
        Content_Length=str(len(ORDER_BODY)), Transfer_Encoding="chunked"))
    expect_refused_and_closed(ctx.server, data + b"0\r\n\r\n", 400, "bad-request",
                              "Content-Length and Transfer-Encoding: chunked")
    expect_eq(u.all_orders(), [], "orders after the ambiguous request")


# ---- deadlines ------------------------------------------------------------------------------------

def _expect_408_in_time(c, reacted, timeout_s, what):
    expect(reacted is not None, "%s: no answer within %.1f s of a %.1f s deadline" % (
        what, timeout_s + LATE_S, timeout_s))
    expect(reacted >= timeout_s - 0.15, "%s: answered after %.2f s, before the %.1f s deadline" % (
        what, reacted, timeout_s))
    expect(reacted <= timeout_s + LATE_S, "%s: answered after %.2f s, the deadline is %.1f s" % (
        what, reacted, timeout_s))
    r = c.read_response(2.0, what)
    expect_problem(r, 408, "request-timeout", what)
    c.expect_closed(2.0, what + " (after the 408)")


@test
def test_head_trickling_past_the_head_timeout_is_408_and_closed(ctx):
    c = RawConn(ctx.server)
    try:
        data = head_bytes("GET", "/healthz", [("Host", "127.0.0.1"), ("X-Slow", "s" * 200)])
        reacted, sent = c.trickle(data, 0.1, HEAD_TIMEOUT_MS / 1000.0 + LATE_S)
        expect(sent < len(data), "the whole head went out before the server reacted")
        _expect_408_in_time(c, reacted, HEAD_TIMEOUT_MS / 1000.0, "a head sent a byte per 100 ms")
    finally:
        c.close()


@test
def test_body_trickling_past_the_body_timeout_is_408_and_closed(ctx):
    u = ctx.server.new_user("slowbody")
    c = RawConn(ctx.server)
    try:
        key = new_key("slowbody")
        c.send(head_bytes("POST", "/api/orders", auth_headers(
            u, Content_Type="application/json", Idempotency_Key=key,
            Content_Length=str(len(ORDER_BODY) + 100))))
        reacted, sent = c.trickle(ORDER_BODY + b" " * 100, 0.1,
                                  BODY_TIMEOUT_MS / 1000.0 + LATE_S)
        _expect_408_in_time(c, reacted, BODY_TIMEOUT_MS / 1000.0, "a body sent a byte per 100 ms")
    finally:
        c.close()
    expect_eq(u.all_orders(), [], "orders after the body that never arrived")


@test
def test_idle_keep_alive_connection_is_closed_silently(ctx):
    c = RawConn(ctx.server)
    try:
        c.send(healthz())
        expect_status(c.read_response(3.0, "GET /healthz"), 200, "GET /healthz")
        t0 = time.monotonic()
        closed = c.closed_within(IDLE_TIMEOUT_MS / 1000.0 + LATE_S)
        waited = time.monotonic() - t0
        expect(closed, "an idle keep-alive connection was still open %.1f s after its answer "
               "(--idle-timeout-ms %d)" % (waited, IDLE_TIMEOUT_MS))
        expect(waited >= IDLE_TIMEOUT_MS / 1000.0 - 0.15,
               "closed %.2f s after the answer, before the idle timeout" % waited)
        expect_eq(c.buf, b"", "what the server sent before closing an idle connection")
        expect(not c.reset, "the idle connection was reset instead of closed")
    finally:
        c.close()


@test
def test_new_connection_that_sends_nothing_is_closed_after_the_head_timeout(ctx):
    # A long idle timeout: only the head deadline can close a connection that never spoke.
    s = Server(name="orderd-fresh", extra_args=["--head-timeout-ms", str(HEAD_TIMEOUT_MS),
                                                "--idle-timeout-ms", "60000"]).start()
    c = RawConn(s)
    try:
        t0 = time.monotonic()
        closed = c.closed_within(HEAD_TIMEOUT_MS / 1000.0 + LATE_S)
        waited = time.monotonic() - t0
        expect(closed, "a connection that sent nothing was still open after %.1f s "
               "(--head-timeout-ms %d)" % (waited, HEAD_TIMEOUT_MS))
        expect(waited >= HEAD_TIMEOUT_MS / 1000.0 - 0.15,
               "closed %.2f s after it opened, before the head timeout" % waited)
        expect_eq(c.buf, b"", "what the server sent before closing a silent connection")
    finally:
        c.close()
        s.close()


@test
def test_connection_busy_within_the_deadlines_is_not_cut(ctx):
    # Three requests, each head and body sent in two halves 0.4 s apart, the last 0.6 s after the
    # previous answer: every deadline is reset by progress, nothing is cut.
    c = RawConn(ctx.server)
    try:
        for i in range(3):
            key = new_key("steady")
            head = head_bytes("POST", "/api/orders", auth_headers(
                ctx.user, Content_Type="application/json", Idempotency_Key=key,
                Content_Length=str(len(ORDER_BODY))))
            c.send(head[:20])
            time.sleep(0.4)
            c.send(head[20:] + ORDER_BODY[:10])
            time.sleep(0.4)
            c.send(ORDER_BODY[10:])
            expect_status(c.read_response(5.0, "order %d" % i), 201, "order %d" % i)
            time.sleep(0.6)
        c.expect_open("after three slow but steady requests")
    finally:
        c.close()


# ---- answered at the head, before the body --------------------------------------------------------

def _answered_before_the_body(ctx, head, status, code, what):
    c = RawConn(ctx.server)
    try:
        c.send(head)
        # No byte of the body goes out: the answer must come on the head alone, well before the
        # body deadline would produce a 408.
        r = c.read_response(BODY_TIMEOUT_MS / 1000.0 * 0.8, what)
        expect_problem(r, status, code, what)
        expect_eq((r.header("Connection") or "").lower(), "close", what + ": Connection header")
        c.expect_closed(6.0, what)
    finally:
        c.close()
    return r


@test
def test_unauthenticated_large_post_is_401_before_the_body(ctx):
    head = head_bytes("POST", "/api/orders", [
        ("Host", "127.0.0.1"), ("Content-Type", "application/json"),
        ("Idempotency-Key", new_key("noauth")), ("Content-Length", str(512 * 1024))])
    r = _answered_before_the_body(ctx, head, 401, "unauthorized", "POST of 512 KiB without a token")
    expect_eq(r.header("WWW-Authenticate"), "Bearer", "WWW-Authenticate")


@test
def test_unauthenticated_chunked_post_is_401_before_the_body(ctx):
    head = head_bytes("POST", "/api/orders", [
        ("Host", "127.0.0.1"), ("Content-Type", "application/json"),
        ("Authorization", "Bearer not-a-token"), ("Idempotency-Key", new_key("noauth")),
        ("Transfer-Encoding", "chunked")])
    _answered_before_the_body(ctx, head, 401, "unauthorized", "chunked POST with a bad token")


@test
def test_wrong_content_type_is_415_before_the_body(ctx):
    head = head_bytes("POST", "/api/orders", auth_headers(
        ctx.user, Content_Type="text/plain", Idempotency_Key=new_key("ct"),
        Content_Length=str(512 * 1024)))
    _answered_before_the_body(ctx, head, 415, "unsupported-media-type",
                              "POST of 512 KiB text/plain")


@test
def test_content_length_of_2_mib_is_413_before_the_body(ctx):
    head = head_bytes("POST", "/api/orders", auth_headers(
        ctx.user, Content_Type="application/json", Idempotency_Key=new_key("big"),
        Content_Length=str(2 * 1024 * 1024)))
    _answered_before_the_body(ctx, head, 413, "body-too-large", "POST announcing 2 MiB")


@test
def test_refused_head_then_the_body_the_client_sends_anyway(ctx):
    # A client that sends head and body without waiting (as most do) still reads the 401, not a
    # reset: the server reads and drops the unread body after answering.
    c = RawConn(ctx.server)
    try:
        body = b"x" * (512 * 1024)
        c.send(head_bytes("POST", "/api/orders", [
            ("Host", "127.0.0.1"), ("Content-Type", "application/json"),
            ("Idempotency-Key", new_key("noauth")), ("Content-Length", str(len(body)))]))
        c.send(body)
        r = c.read_response(5.0, "POST of 512 KiB without a token, body sent at once")
        expect_problem(r, 401, "unauthorized", "POST of 512 KiB without a token, body sent")
        c.expect_closed(6.0, "after the 401")
        expect(not c.reset, "the connection was reset after the 401")
    finally:
        c.close()


# ---- connection handling: pipelining, 100-continue, HTTP/1.0 ------------------------------------

@test
def test_three_pipelined_requests_get_three_answers_in_order(ctx):
    c = RawConn(ctx.server)
    try:
        c.send(healthz() * 3)
        for i in range(3):
            r = c.read_response(5.0, "pipelined GET /healthz #%d" % (i + 1))
            expect_status(r, 200, "pipelined GET /healthz #%d" % (i + 1))
            expect_eq(r.json().get("status"), "ok", "pipelined answer #%d" % (i + 1))
        c.expect_open("after three pipelined requests")
        # Distinct answers show the order: three of the user's orders, asked for in one send().
        ids = []
        for i in range(3):
            r = ctx.user.create_order(new_key("pipe"), quantity=i + 1)
            expect_status(r, 201, "order %d" % i)
            ids.append(r.json()["orderId"])
        c.send(b"".join(head_bytes("GET", "/api/orders/" + oid, auth_headers(ctx.user))
                        for oid in ids))
        for i, oid in enumerate(ids):
            r = c.read_response(5.0, "pipelined GET /api/orders/%s" % oid)
            expect_status(r, 200, "pipelined GET #%d" % (i + 1))
            expect_eq(r.json().get("orderId"), oid, "pipelined answer #%d's order" % (i + 1))
            expect_eq(r.json().get("quantity"), i + 1, "pipelined answer #%d's quantity" % (i + 1))
        c.expect_open("after three pipelined GETs")
    finally:
        c.close()


@test
def test_expect_100_continue_gets_continue_then_the_answer(ctx):
    c = RawConn(ctx.server)
    try:
        c.send(head_bytes("POST", "/api/orders", auth_headers(
            ctx.user, Content_Type="application/json", Idempotency_Key=new_key("cont"),
            Expect="100-continue", Content_Length=str(len(ORDER_BODY)))))
        r = c.read_response(BODY_TIMEOUT_MS / 1000.0 * 0.8, "the interim answer")
        expect_eq((r.version, r.status), ("HTTP/1.1", 100), "the interim answer")
        expect_eq(r.body, b"", "the 100's body")
        expect_eq(c.buf, b"", "bytes after 100 Continue before the body was sent")
        c.send(ORDER_BODY)
        r = c.read_response(5.0, "the final answer")
        expect_status(r, 201, "the final answer")
        expect_eq(r.json().get("quantity"), 2, "the order's quantity")
        c.expect_open("after the order")
    finally:
        c.close()


@test
def test_http_1_0_closes_unless_keep_alive(ctx):
    c = RawConn(ctx.server)
    try:
        c.send(healthz(version="HTTP/1.0"))
        r = c.read_response(5.0, "HTTP/1.0 GET /healthz")
        expect_status(r, 200, "HTTP/1.0 GET /healthz")
        c.expect_closed(3.0, "HTTP/1.0 without keep-alive")
    finally:
        c.close()
    c = RawConn(ctx.server)
    try:
        for i in range(2):
            c.send(healthz(version="HTTP/1.0", extra=[("Connection", "keep-alive")]))
            r = c.read_response(5.0, "HTTP/1.0 keep-alive GET #%d" % (i + 1))
            expect_status(r, 200, "HTTP/1.0 keep-alive GET #%d" % (i + 1))
            expect_eq((r.header("Connection") or "").lower(), "keep-alive",
                      "HTTP/1.0 keep-alive GET #%d: Connection header" % (i + 1))
            c.expect_open("HTTP/1.0 with Connection: keep-alive")
    finally:
        c.close()


@test
def test_http_1_1_connection_close_is_honoured(ctx):
    c = RawConn(ctx.server)
    try:
        c.send(healthz(extra=[("Connection", "close")]))
        r = c.read_response(5.0, "GET /healthz, Connection: close")
        expect_status(r, 200, "GET /healthz, Connection: close")
        expect_eq((r.header("Connection") or "").lower(), "close", "Connection header")
        c.expect_closed(3.0, "HTTP/1.1 with Connection: close")
    finally:
        c.close()


# ---- connection caps ------------------------------------------------------------------------------

def _open_served(server, source, what):
    """A connection from `source` whose GET /healthz was answered: the server holds it."""
    c = RawConn(server, source=source)
    c.send(healthz())
    try:
        expect_status(c.read_response(5.0, what), 200, what)
    except TestFailure:
        c.close()
        raise
    return c


def _expect_turned_away(server, source, what):
    c = RawConn(server, source=source)
    try:
        r = c.read_response(5.0, what)  # refused at once, without a request
        expect_problem(r, 503, "too-many-connections", what)
        expect_eq(r.header("Retry-After"), "1", "%s: Retry-After" % what)
        c.expect_closed(3.0, what)
    finally:
        c.close()


def _served_again_after_a_close(server, source, what, within_s=30.0):
    """
    After the client closed one connection, a new one from `source` is served once the server
    has seen the close (polled: a loaded machine may take a moment).
    """
    deadline = time.monotonic() + within_s
    last = None
    while True:
        c = RawConn(server, source=source)
        try:
            c.send(healthz())
            r = c.read_response(5.0, what)
        except TestFailure as e:
            c.close()
            raise e
        if r.status == 200:
            return c
        c.close()
        last = r
        if r.status != 503 or time.monotonic() > deadline:
            fail("%s: not served %.0f s after a connection closed; last answer %s" % (
                what, within_s, last.describe()))
        time.sleep(0.1)


@test
def test_per_address_cap(ctx):
    with Server(name="orderd-per-ip", extra_args=["--max-connections-per-ip", "5"]) as s:
        held = [_open_served(s, "127.0.0.1", "connection %d from 127.0.0.1" % (i + 1))
                for i in range(5)]
        others = []
        try:
            _expect_turned_away(s, "127.0.0.1", "a 6th connection from 127.0.0.1")
            others.append(_open_served(s, "127.0.0.2", "a connection from 127.0.0.2"))
            # The held ones were not disturbed.
            for i, c in enumerate(held):
                c.send(healthz())
                expect_status(c.read_response(5.0, "held #%d" % (i + 1)), 200,
                              "held connection #%d after the refusal" % (i + 1))
            held.pop(0).close()
            others.append(_served_again_after_a_close(
                s, "127.0.0.1", "a new connection from 127.0.0.1 after closing one of the 5"))
            _expect_turned_away(s, "127.0.0.1", "a 6th connection from 127.0.0.1 again")
        finally:
            for c in held + others:
                c.close()


@test
def test_total_cap(ctx):
    with Server(name="orderd-total", extra_args=["--max-connections", "10"]) as s:
        held = [_open_served(s, "127.0.0.%d" % (1 + i % 3), "connection %d" % (i + 1))
                for i in range(10)]
        others = []
        try:
            # The cap is for everyone: another address does not help.
            _expect_turned_away(s, "127.0.0.1", "an 11th connection from 127.0.0.1")
            _expect_turned_away(s, "127.0.0.4", "an 11th connection from 127.0.0.4")
            for i, c in enumerate(held):
                c.send(healthz())
                expect_status(c.read_response(5.0, "held #%d" % (i + 1)), 200,
                              "held connection #%d after the refusals" % (i + 1))
            held.pop().close()
            others.append(_served_again_after_a_close(
                s, "127.0.0.4", "a new connection after closing one of the 10"))
            _expect_turned_away(s, "127.0.0.5", "an 11th connection again")
        finally:
            for c in held + others:
                c.close()


# ---- slowloris --------------------------------------------------------------------------------

SLOW_TIMEOUT_S = 2.0
ATTACKERS = 1000
ATTACK_SOURCES = ["127.0.0.%d" % i for i in range(2, 10)]  # 125 each, under the cap of 256
TRICKLE_S = 0.5
LEGIT_ORDERS = 100
LEGIT_GETS = 100
P99_FACTOR = 5.0
P99_FLOOR_S = 0.25
# An attacker must be gone within its timeout + this.  Its clock starts at connect, the server's
# at the end of the head: in between, 500 body attackers with a real token that the token cache
# does not know yet wait for the store on the workers (seconds under ASan on a loaded machine).
CLOSE_GRACE_S = 4.0


def _attacker(host, port, token, stop, ready, pipe):
    """
    The slowloris, in its own process: ATTACKERS connections, half trickling a head that never
    ends, half a POST whose head is complete (a real token: the worst case) and whose body
    trickles.  A connection the server closes is replaced at once while the attack lasts.  Sends
    back, for every connection, (kind, seconds from its deadline's start to the close or to the
    end of the attack, closed by the server?, first status line seen).
    """
    raise_nofile(ATTACKERS + 512)
    sel = selectors.DefaultSelector()
    conns = {}
    results = []
    connect_errors = []
    head_payload = (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"s" * 4096)
    n = [0]

    def body_head():
        n[0] += 1
        return head_bytes("POST", "/api/orders", [
            ("Host", "127.0.0.1"), ("Authorization", "Bearer " + token),
            ("Content-Type", "application/json"),
            ("Idempotency-Key", "slowloris-%d-%d" % (os.getpid(), n[0])),
            ("Content-Length", "4096")])

    def open_one(kind, src, now):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((src, 0))
            s.settimeout(3.0)
            s.connect((host, port))
            if kind == "head":
                s.sendall(head_payload[:1])
                sent = 1
            else:
                s.sendall(body_head())
                sent = 0
        except OSError as e:
            s.close()
            connect_errors.append("%s from %s: %s" % (kind, src, e))
            return
        s.setblocking(False)
        st = {"sock": s, "kind": kind, "src": src, "start": time.monotonic(), "sent": sent,
              "next": now + TRICKLE_S * (0.5 + (len(conns) % 97) / 97.0), "got": b""}
        conns[s.fileno()] = st
        sel.register(s, selectors.EVENT_READ, st)

    def finish(st, by_server):
        sel.unregister(st["sock"])
        del conns[st["sock"].fileno()]
        st["sock"].close()
        line = st["got"].split(b"\r\n", 1)[0].decode("latin-1", "replace")
        results.append((st["kind"], time.monotonic() - st["start"], by_server, line))

    now = time.monotonic()
    for i in range(ATTACKERS):
        open_one("head" if i % 2 == 0 else "body", ATTACK_SOURCES[i % len(ATTACK_SOURCES)], now)
    ready.set()
    while not stop.is_set():
        for key, _ in sel.select(timeout=0.05):
            st = key.data
            try:
                data = st["sock"].recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            except BlockingIOError:
                continue
            if data:
                st["got"] += data
                continue
            kind, src = st["kind"], st["src"]
            finish(st, True)
            if not stop.is_set():
                open_one(kind, src, time.monotonic())
        now = time.monotonic()
        for st in list(conns.values()):
            if st["next"] > now:
                continue
            st["next"] = now + TRICKLE_S
            payload = head_payload if st["kind"] == "head" else b" " * 4096
            try:
                st["sent"] += st["sock"].send(payload[st["sent"]:st["sent"] + 1])
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                pass
    for st in list(conns.values()):
        finish(st, False)
    pipe.send({"results": results, "connect_errors": connect_errors})
    pipe.close()


def _legit_run(server, user, n_orders, n_gets, what):
    """Orders and GETs over one keep-alive connection from 127.0.0.1; the latencies (s)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30,
                                      source_address=("127.0.0.1", 0))
    lat = []
    bad = []
    ids = []
    try:
        for i in range(max(n_orders, n_gets)):
            for kind in ("order", "get"):
                if kind == "order" and i >= n_orders or kind == "get" and i >= n_gets:
                    continue
                try:
                    if kind == "order":
                        r = user.create_order(new_key("legit"), conn=conn)
                        if r.status == 201:
                            ids.append(r.json()["orderId"])
                    else:
                        path = "/api/orders/%s" % ids[-1] if ids else "/healthz"
                        r = user.get(path, conn=conn)
                except (OSError, http.client.HTTPException) as e:
                    bad.append("%s #%d: %s: %s" % (kind, i, type(e).__name__, e))
                    conn.close()
                    continue
                lat.append(r.elapsed)
                if not 200 <= r.status < 300:
                    bad.append("%s #%d: %s" % (kind, i, r.describe(300)))
    finally:
        conn.close()
    if bad:
        fail("%s: %d of %d legitimate requests failed, e.g.:\n  %s" % (
            what, len(bad), n_orders + n_gets, "\n  ".join(bad[:5])))
    return lat


def _p99(samples):
    s = sorted(samples)
    return s[max(0, int(math.ceil(0.99 * len(s))) - 1)]


@test
def test_slowloris_does_not_starve_legitimate_clients(ctx):
    raise_nofile(4096)
    attack_started = None
    with Server(name="orderd-slowloris", extra_args=[
            "--head-timeout-ms", str(int(SLOW_TIMEOUT_S * 1000)),
            "--body-timeout-ms", str(int(SLOW_TIMEOUT_S * 1000))]) as s:
        user = s.new_user("legit")
        attacker_user = s.new_user("slowloris")
        expect_status(attacker_user.get("/api/orders"), 200, "the attacker's token")
        _legit_run(s, user, 10, 10, "warm-up")
        baseline = _legit_run(s, user, LEGIT_ORDERS, LEGIT_GETS, "without attackers")

        mp = multiprocessing.get_context("fork")
        stop, ready = mp.Event(), mp.Event()
        recv_end, send_end = mp.Pipe(duplex=False)
        proc = mp.Process(target=_attacker, args=(s.host, s.port, attacker_user.token, stop,
                                                  ready, send_end), daemon=True)
        proc.start()
        send_end.close()
        try:
            expect(ready.wait(20), "the attacker did not open its %d connections in 20 s"
                   % ATTACKERS)
            attack_started = time.monotonic()
            time.sleep(TRICKLE_S)  # every attacker has trickled once
            attacked = _legit_run(s, user, LEGIT_ORDERS, LEGIT_GETS, "with 1,000 attackers")
            # Long enough for the first generation to pass its deadline and its grace.
            left = SLOW_TIMEOUT_S + CLOSE_GRACE_S + 0.5 - (time.monotonic() - attack_started)
            if left > 0:
                time.sleep(left)
            attack_s = time.monotonic() - attack_started
            expect_status(user.get("/healthz"), 200, "GET /healthz at the end of the attack")
        finally:
            stop.set()
            report = recv_end.recv() if recv_end.poll(30) else None
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        expect(report is not None, "the attacker process sent no report")
        results, connect_errors = report["results"], report["connect_errors"]

    p99_base, p99_attacked = _p99(baseline), _p99(attacked)
    allowed = max(P99_FACTOR * p99_base, p99_base + P99_FLOOR_S)
    by_server = [r for r in results if r[2]]
    late = [r for r in results if r[1] > SLOW_TIMEOUT_S + CLOSE_GRACE_S]
    bad_answer = [r for r in by_server if r[3] and not r[3].startswith("HTTP/1.1 408 ")]
    print("     slowloris: %d attacker connections over %.1f s (%d closed by the server, %d "
          "with a 408); legitimate p99 %.1f ms without, %.1f ms with (allowed %.1f ms), "
          "max %.1f / %.1f ms" % (
              len(results), attack_s, len(by_server),
              sum(1 for r in by_server if r[3].startswith("HTTP/1.1 408 ")),
              p99_base * 1000, p99_attacked * 1000, allowed * 1000, max(baseline) * 1000,
              max(attacked) * 1000), flush=True)
    expect(not connect_errors, "%d attacker connections could not be opened, e.g. %s" % (
        len(connect_errors), connect_errors[:3]))
    expect(len(results) >= ATTACKERS, "only %d attacker connections reported" % len(results))
    expect(p99_attacked <= allowed,
           "legitimate p99 latency %.1f ms with attackers, %.1f ms without: over the allowed "
           "%.1f ms" % (p99_attacked * 1000, p99_base * 1000, allowed * 1000))
    expect(len(by_server) >= ATTACKERS,
           "the server closed only %d attacker connections in %.1f s (%d were open at once)" % (
               len(by_server), attack_s, ATTACKERS))
    expect(not late, "%d attacker connections outlived their %.1f s deadline by more than %.1f "
           "s, e.g. %s" % (len(late), SLOW_TIMEOUT_S, CLOSE_GRACE_S, late[:3]))
    expect(not bad_answer, "%d attacker connections got something other than a 408 or a bare "
           "close, e.g. %s" % (len(bad_answer), bad_answer[:3]))


# ---- found while writing these tests (they fail until the server is fixed) -----------------------

@test
def test_whitespace_before_a_header_colon_is_400(ctx):
    # RFC 9112 5.1: a server MUST answer 400.  Today "Content-Length : N" is taken as the body's
    # length, so a proxy that reads it as some other field (and forwards the body as a second
    # request) and orderd disagree on where the next request starts: request smuggling.
    second = healthz()
    data = head_bytes("GET", "/healthz", [("Host", "127.0.0.1"),
                                          ("Content-Length ", str(len(second)))]) + second
    expect_refused_and_closed(ctx.server, data, 400, "bad-request",
                              "'Content-Length : N' (white space before the colon)")


@test
def test_control_character_opening_a_header_value_is_400(ctx):
    # RFC 9110 5.5: NUL (and other controls) in a field value must be refused (or replaced by a
    # space).  In the middle of a value they are refused; as the value's first byte they pass,
    # and a handler reading the value as a C string sees it end there.
    for value in (b"a\x00b", b"\x00b", b"\x01b", b"\x7fb"):
        data = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Note: " + value + b"\r\n\r\n"
        expect_refused_and_closed(ctx.server, data, 400, "bad-request",
                                  "a header value %r" % value)


@test
def test_chunked_body_with_trailer_fields_is_served(ctx):
    # Trailer fields after a chunked body go into the buffer that holds the request's head; when
    # it has to grow, the path and header fields the handler reads are freed memory.  Seen from
    # the client: the order is refused with 401 (the Authorization field was overwritten), or, in
    # the ASan build, orderd dies.  Its own server, so that a crash takes no other test with it.
    with Server(name="orderd-trailers") as s:
        u = s.new_user("trailer")
        made = 0
        for size in (10, 100, 1000, 3000, 6000):
            what = "chunked order with a %d-byte trailer field" % size
            chunk = b"%x\r\n" % len(ORDER_BODY) + ORDER_BODY + b"\r\n"
            c = RawConn(s)
            try:
                c.send(head_bytes("POST", "/api/orders", [
                    ("Authorization", "Bearer " + u.token), ("Host", "127.0.0.1"),
                    ("Content-Type", "application/json"), ("Idempotency-Key", new_key("trailer")),
                    ("Transfer-Encoding", "chunked")]) +
                    chunk + b"0\r\nX-Trailer: " + b"t" * size + b"\r\n\r\n")
                r = c.read_response(5.0, what)
            except TestFailure as e:
                fail("%s%s" % (e, "" if s.alive() else "; orderd died:\n" + s.logs()))
            finally:
                c.close()
            expect_status(r, 201, what)
            made += 1
        expect(s.alive(), "orderd died after the trailer fields:\n" + s.logs())
        expect_eq(len(u.all_orders()), made, "orders after the chunked requests with trailers")


if __name__ == "__main__":
    run("test_http_limits", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
