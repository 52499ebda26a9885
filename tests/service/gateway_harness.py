# SPDX-License-Identifier: Apache-2.0
"""
gateway_harness.py - what the idem-gateway service tests share: a real `idem-gateway` on a
loopback port with its config in a temp dir and its store (SQLite, or a fresh PostgreSQL database
under with_pg.sh, like orderd's), and a small upstream API that is NOT idempotent and counts
what it executes.

The upstream runs in the test process (a threaded http.server on 127.0.0.1), so a test reads its
counters directly.  Every request it takes is an execution; the request's `X-Test-Mode` header
says how it behaves after executing:

  (none)           200 {"id": "<n>", "key": <Idempotency-Key>, "body": <the body>}, Location
                   (the key read as an sf-string: sf_key)
  slow:MS          sleep MS, then answer as above
  status:CODE      answer CODE with a JSON body (e.g. 500, 404, 422, 429)
  reset            execute, then close the connection with a TCP reset, no answer
  drop             close the connection with a TCP reset WITHOUT executing (the request reached
                   the upstream, nothing happened: what a reconcile query finds as 404)
  hang             execute, then never answer (until the test ends)
  big:N            answer N bytes of body (pattern_bytes(N)), with a Content-Length
  bigchunked:N     the same N bytes, chunked (no Content-Length), 64 KiB a chunk
  bigcut:N         announce N bytes, send half of them, then reset the connection
  bigslow:N        announce N bytes, send 64 KiB of them every 100 ms

HEAD answers 200 with the Content-Length of {"path": <the path>} and no body.
GET /lookup?key=K answers 200 with the first execution of key K (the reconcile query), or 404;
its header fields are kept in `lookup_headers`.
Paths under /v1/dedupe behave like an upstream that dedupes on Idempotency-Key itself (what the
`resend` mode assumes): a key it has seen gets its first answer again, and is not executed again.
A body of exactly {} is refused with 400 and not executed (a validation error).  GET /count
answers {"count": N}, the executions made with the request's Authorization header (what
idem-check conformance's --count-url reads).
"""

import http.client
import http.server
import json
import os
import socket
import socketserver
import struct
import threading
import time

import harness
from harness import BIN, TestFailure, Server

GATEWAY = os.path.join(BIN, "idem-gateway")


_PATTERN = bytes(range(251))


def pattern_piece(offset, n):
    """
    Bytes [offset, offset + n) of the test pattern: not all alike (a shifted or repeated piece
    would show), the same every time.  The upstream sends a large body as such pieces, made as it
    goes: building hundreds of MiB at once holds the GIL for over a second, and every other
    thread of the test (the upstream's other handlers, the test's own clients) stops meanwhile.
    """
    start = offset % len(_PATTERN)
    return (_PATTERN[start:] + _PATTERN * (n // len(_PATTERN) + 1))[:n]


def pattern_bytes(n):
    """The first N bytes of the test pattern (pattern_piece)."""
    return pattern_piece(0, n)


def pattern_pieces(n, piece):
    """The first N bytes of the test pattern, `piece` bytes at a time (the last may be shorter)."""
    for off in range(0, n, piece):
        yield pattern_piece(off, min(piece, n - off))


def is_pattern(data):
    """Whether `data` is the first len(data) bytes of the test pattern, compared a piece at a time
    (no second copy of a large body in memory)."""
    view = memoryview(data)
    return all(view[off:off + len(piece)] == piece
               for off, piece in zip(range(0, len(data), 1 << 20), pattern_pieces(len(data), 1 << 20)))

import re  # noqa: E402

# Either listener may speak HTTPS (listen_tls, admin_listen_tls).
GATEWAY_LISTEN_RE = re.compile(
    r"idem-gateway: listening on https?://(\[[^\]]+\]|[^:/\s]+):(\d+) "
    r"\(admin https?://(\[[^\]]+\]|[^:/\s]+):(\d+)\)")


def sf_key(value):
    """An Idempotency-Key header's key, as an upstream that follows the IETF draft reads it: an
    RFC 8941 sf-string ("k", what the gateway sends) unquoted, anything else as it is."""
    if value is None or len(value) < 2 or value[0] != '"' or value[-1] != '"':
        return value
    return re.sub(r'\\(.)', r'\1', value[1:-1])


# ---- the upstream ------------------------------------------------------------------------------

class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def setup(self):
        super().setup()
        # Headers and body go out in two writes: without this, Nagle holds the second one for
        # the gateway's delayed ACK (40 ms) and every exchange looks slow.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _reset(self):
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status, doc, extra=()):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Set-Cookie", "session=upstream-%s" % doc.get("id", "x"))
        self.send_header("X-Upstream-Request", doc.get("id", "x"))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        up = self.server.upstream
        if self.path == "/count":
            auth = self.headers.get("Authorization")
            with up.lock:
                n = sum(1 for r in up.requests if r["headers"].get("Authorization") == auth)
            self._send(200, {"count": n})
            return
        if self.path.startswith("/lookup?key="):
            key = self.path[len("/lookup?key="):]
            from urllib.parse import unquote
            key = unquote(key)
            with up.lock:
                up.lookups += 1
                up.lookup_headers.append(dict(self.headers.items()))
                first = up.first_by_key.get(key)
            if first is None:
                self._send(404, {"error": "no such request"})
            else:
                self._send(200, first, [("Location", "/v1/things/%s" % first["id"])])
            return
        self._execute(b"")

    def do_HEAD(self):
        """The head a GET of the path would have: its Content-Length, no body."""
        data = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()

    def do_POST(self):
        self._execute(self._body())

    do_PUT = do_POST
    do_PATCH = do_POST
    do_DELETE = do_POST

    def _execute(self, body):
        up = self.server.upstream
        key = sf_key(self.headers.get("Idempotency-Key"))
        mode = self.headers.get("X-Test-Mode") or ""
        if mode == "drop":
            self._reset()
            return
        if body.strip() == b"{}":
            self._send(400, {"error": "validation failed: the body is empty"})
            return
        if self.path.startswith("/v1/dedupe"):
            with up.lock:
                first = up.first_by_key.get(key)
                if first is not None:
                    up.deduped += 1
            if first is not None:
                self._send(201, first, [("Location", "/v1/things/%s" % first["id"])])
                return
        with up.lock:
            up.count += 1
            n = up.count
            up.by_key[key] = up.by_key.get(key, 0) + 1
            up.requests.append({"method": self.command, "path": self.path, "key": key,
                                "headers": dict(self.headers.items()), "body": body})
        try:
            doc_body = json.loads(body) if body else None
        except ValueError:
            doc_body = body.decode("utf-8", "replace")
        doc = {"id": str(n), "key": key, "path": self.path, "body": doc_body}
        with up.lock:
            up.first_by_key.setdefault(key, doc)
        if mode.startswith("slow:"):
            time.sleep(int(mode[5:]) / 1000.0)
        if mode.startswith("status:"):
            # status:409:retry / status:409:after: an error the upstream marks retryable
            # (Stripe-Should-Retry: true, or Retry-After), as Stripe's lock_timeout is.
            parts = mode.split(":")
            extra = {"retry": [("Stripe-Should-Retry", "true")],
                     "after": [("Retry-After", "1")]}.get(parts[2] if len(parts) > 2 else "", [])
            self._send(int(parts[1]), doc, extra)
        elif mode == "reset":
            self._reset()
        elif mode == "hang":
            up.release.wait(60)
            self.close_connection = True
        elif mode.split(":")[0] in ("big", "bigcut", "bigslow"):
            size = int(mode.split(":")[1])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if mode.startswith("bigcut:"):
                for piece in pattern_pieces(size // 2, 1 << 20):
                    self.wfile.write(piece)
                self.wfile.flush()
                self._reset()
                return
            slow = mode.startswith("bigslow:")
            for piece in pattern_pieces(size, 65536 if slow else 1 << 20):
                self.wfile.write(piece)
                if slow:
                    self.wfile.flush()
                    time.sleep(0.1)
        elif mode.startswith("bigchunked:"):
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in pattern_pieces(int(mode[11:]), 65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        else:
            extra = [("Location", "/v1/things/%s" % n), ("ETag", '"v%s"' % n)]
            if self.headers.get("Stripe-Version"):  # as Stripe answers: its version, an id
                extra += [("Stripe-Version", self.headers["Stripe-Version"]),
                          ("Request-Id", "req_%s" % n)]
            self._send(201 if self.command == "POST" else 200, doc, extra)


class _ThreadingServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def handle_error(self, request, client_address):
        # A gateway killed mid-answer leaves a broken pipe here: expected under chaos, not news.
        import sys
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class Upstream:
    """The counting upstream on 127.0.0.1:<free port>."""

    def __init__(self, port=0):
        self.lock = threading.Lock()
        self.count = 0
        self.by_key = {}
        self.first_by_key = {}
        self.requests = []
        self.lookups = 0
        self.lookup_headers = []  # the header fields of each GET /lookup, as received
        self.deduped = 0
        self.release = threading.Event()
        self.httpd = _ThreadingServer(("127.0.0.1", port), _Handler)
        self.httpd.upstream = self
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def executions(self, key):
        with self.lock:
            return self.by_key.get(key, 0)

    def last_request(self):
        with self.lock:
            return self.requests[-1] if self.requests else None

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class HandUpstream:
    """
    An upstream that speaks HTTP/1.1 by hand, on its own socket, so that a test can make it
    misbehave as some upstreams do.  It numbers the connections it accepts (`conns`) and serves
    each on a thread of its own with `self._serve(conn, n)`, which a subclass writes; close()
    closes the listener and every connection still open.
    """

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.lock = threading.Lock()
        self.conns = 0
        self.open = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.conns += 1
                n = self.conns
                self.open.append(c)
            threading.Thread(target=self._serve, args=(c, n), daemon=True).start()

    def _serve(self, c, n):
        raise NotImplementedError

    @staticmethod
    def _past_body(c, buf, length):
        """What follows a body of `length` bytes at the start of `buf` (read from `c` as needed),
        or None when the peer closed first."""
        while len(buf) < length:
            piece = c.recv(65536)
            if not piece:
                return None
            buf += piece
        return buf[length:]

    def close(self):
        self.sock.close()
        with self.lock:
            for c in self.open:
                try:
                    c.close()
                except OSError:
                    pass


# ---- the gateway -------------------------------------------------------------------------------

DEFAULT_ROUTES = """
  - match: POST /v1/things
    operation: things.create
  - match: POST /v1/orders/{id}/refunds
    operation: refunds.create
    on_unknown: {reconcile: "GET /lookup?key={key}"}
  - match: POST /v1/resend
    operation: resend.create
    on_unknown: resend
  - match: POST /v1/bodykey
    operation: bodykey.create
    key: {body: [/requestId, /meta/requestId]}
  - match: POST /v1/optional
    operation: optional.create
    key: {required: false}
"""


class Gateway(Server):
    """
    One idem-gateway in front of `upstream`, its config written from `routes` (YAML text of the
    routes list) and `extra` (more top-level YAML).  Lifecycle as harness.Server.
    """

    program = GATEWAY
    listen_re = GATEWAY_LISTEN_RE

    def __init__(self, upstream, routes=DEFAULT_ROUTES, extra="", principal="header: X-Consumer-Id",
                 upstream_timeout="3s", args=(), name="idem-gateway", listen_port=0, db_uri=None):
        super().__init__(extra_args=args, name=name, db_uri=db_uri)
        self.upstream = upstream
        self.admin_port = None
        self.config_path = os.path.join(self.tmpdir, "gateway.yaml")
        with open(self.config_path, "w") as f:
            f.write("listen: 127.0.0.1:%d\n" % listen_port +
                    "admin_listen: 127.0.0.1:0\n"
                    "store: %s\n"
                    "upstream:\n  url: %s\n  timeout: %s\n"
                    "principal:\n  %s\n"
                    "%s\n"
                    "routes:%s\n" % (json.dumps(self.db_uri), upstream.url, upstream_timeout,
                                     principal, extra, routes))

    def migrate(self):
        self._migrated = True  # the gateway applies libidem's schema itself

    def serve_command(self):
        return [GATEWAY, "serve", "--config", self.config_path] + self.extra_args

    def listening(self, match):
        super().listening(match)
        self.admin_port = int(match.group(4))

    def request(self, method, path, body=None, headers=None, principal="alice", key=None,
                timeout=30):
        """One request on a fresh connection: a harness.Response."""
        h = {}
        if principal is not None:
            h["X-Consumer-Id"] = principal
        if key is not None:
            h["Idempotency-Key"] = key
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        return http_request(self.host, self.port, method, path, body, h, timeout)

    def admin(self, method, path, body=None, timeout=10, headers=None, token=None):
        """A request to the admin listener: a body goes as JSON; `token` as its bearer token."""
        h = {"Content-Type": "application/json"} if body is not None else {}
        if token is not None:
            h["Authorization"] = "Bearer " + token
        h.update(headers or {})
        return http_request(self.host, self.admin_port, method, path, body, h, timeout)


def http_request(host, port, method, path, body, headers, timeout):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.monotonic()
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        return harness.Response(r.status, r.headers, data, time.monotonic() - t0)
    finally:
        conn.close()


def expect(cond, msg):
    if not cond:
        raise TestFailure(msg)
