# SPDX-License-Identifier: Apache-2.0
"""
stripe_upstream.py - a small Stripe-shaped API for the gateway's client tests
(test_gateway_clients.py): what Stripe's SDKs talk to, WITHOUT Stripe's own idempotency.  Every
POST it takes makes a new object, whatever its Idempotency-Key says, so each execution shows in
its ledger and a second charge for one intent is plain to see.

  POST /v1/charges    form-encoded (as the SDKs send) or JSON params: amount (an integer, required),
                      currency (required), description, metadata[...]; 200 {"id": "ch_...",
                      "object": "charge", "amount": ..., ...}
  POST /v1/customers  email, name, description, metadata[...]; 200 {"id": "cus_...", ...}
  GET  /v1/charges/ID, /v1/customers/ID   the object, or 404 (the same account's only)

Every request needs `Authorization: Bearer sk_test_...`: otherwise 401 with Stripe's envelope
{"error": {"type": "invalid_request_error", ...}}.  Answers carry `Request-Id: req_...`,
`Stripe-Version` (the request's, echoed, else DEFAULT_VERSION) and the request's
`Idempotency-Key` and `Stripe-Account` as Stripe does.  Errors are Stripe's envelope.

Knobs, in the params (so an SDK sends them as it sends any metadata):

  metadata[lock_timeout]=N  the first N attempts with this Idempotency-Key (read as an RFC 8941
                            sf-string, as the gateway forwards it, or as sent) answer
                            409 {"error": {"type": "api_error", "code": "lock_timeout"}} with
                            `Stripe-Should-Retry: true`, and create nothing (Stripe's answer to a
                            request that met a lock: "send it again").
  metadata[slow_ms]=N       the object is created at once, then the answer waits N ms (holding
                            no lock: other requests go on meanwhile): an answer that comes after
                            the client's timeout, or after the gateway died.
  metadata[hold]=NAME       the object is created at once, then the answer waits until the test
                            calls release(NAME) (at most HOLD_MAX_S): a request in flight for as
                            long as the test needs, whatever the machine's load.

The upstream runs in the test's process (a threaded http.server on 127.0.0.1:<free port>); the
test reads its ledger directly: `entries(pred)`, `count(pred)`, and `wait_for(what, pred,
timeout)`, which polls with a deadline.  Python's standard library only.
"""

import http.server
import json
import re
import socket
import socketserver
import sys
import threading
import time
import urllib.parse
import uuid

try:
    from harness import TestFailure  # a failed wait is a test's failure, said as one
except ImportError:  # run on its own
    TestFailure = AssertionError

DEFAULT_VERSION = "2025-01-27.acacia"
HOLD_MAX_S = 30.0

_LOCAL_RE = re.compile(r"^/v1/(charges|customers)/([A-Za-z0-9_]+)$")


def sf_key(value):
    """An Idempotency-Key as sent on: an RFC 8941 sf-string ("k", what the gateway forwards)
    unquoted, anything else as it is."""
    if value is None or len(value) < 2 or value[0] != '"' or value[-1] != '"':
        return value
    return re.sub(r'\\(.)', r'\1', value[1:-1])


def _flatten(prefix, value, out):
    """JSON params as Stripe's form encoding names them: metadata[k], items[0][price]..."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten("%s[%s]" % (prefix, k) if prefix else str(k), v, out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _flatten("%s[%d]" % (prefix, i), v, out)
    elif value is None:
        out[prefix] = ""
    elif isinstance(value, bool):
        out[prefix] = "true" if value else "false"
    else:
        out[prefix] = str(value)


def parse_params(content_type, body):
    """A request body's params as a flat {"amount": "500", "metadata[order]": "o-1"} dict, from
    a form (what the SDKs send) or JSON; None if it is neither."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    text = body.decode("utf-8", "replace")
    if ctype == "application/json" or ctype.endswith("+json"):
        try:
            doc = json.loads(text) if text.strip() else {}
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        out = {}
        _flatten("", doc, out)
        return out
    return dict(urllib.parse.parse_qsl(text, keep_blank_values=True))


def metadata_of(params):
    return {k[len("metadata["):-1]: v for k, v in params.items()
            if k.startswith("metadata[") and k.endswith("]")}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _answer(self, status, doc, extra=()):
        data = json.dumps(doc, indent=2).encode()
        up = self.server.upstream
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Request-Id", "req_%s" % uuid.uuid4().hex[:14])
        self.send_header("Stripe-Version", self.headers.get("Stripe-Version") or DEFAULT_VERSION)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Cache-Control", "no-cache, no-store")
        self.send_header("Set-Cookie", "__stripe_orig_props=%d; path=/" % up.port)
        if self.headers.get("Idempotency-Key") is not None:
            self.send_header("Idempotency-Key", self.headers["Idempotency-Key"])
        if self.headers.get("Stripe-Account") is not None:
            self.send_header("Stripe-Account", self.headers["Stripe-Account"])
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        return data

    def _error(self, status, etype, message, code=None, param=None, extra=()):
        err = {"type": etype, "message": message}
        if code is not None:
            err["code"] = code
        if param is not None:
            err["param"] = param
        return self._answer(status, {"error": err}, extra)

    def _api_key(self):
        auth = (self.headers.get("Authorization") or "").strip()
        scheme, _, cred = auth.partition(" ")
        cred = cred.strip()
        if scheme.lower() != "bearer" or not cred.startswith("sk_test_") or len(cred) < 12:
            return None
        return cred

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def do_GET(self):
        up = self.server.upstream
        key = self._api_key()
        if key is None:
            self._error(401, "invalid_request_error", "Invalid API Key provided.")
            return
        m = _LOCAL_RE.match(urllib.parse.urlsplit(self.path).path)
        obj = None
        if m:
            with up.lock:
                e = up.by_id.get(m.group(2))
                if e is not None and e["api_key"] == key and \
                        e["account"] == self.headers.get("Stripe-Account"):
                    obj = e["object"]
        if obj is None:
            self._error(404, "invalid_request_error", "No such object: %s" % self.path,
                        code="resource_missing")
        else:
            self._answer(200, obj)

    def do_POST(self):
        up = self.server.upstream
        body = self._body()
        path = urllib.parse.urlsplit(self.path).path
        raw_key = self.headers.get("Idempotency-Key")
        key = sf_key(raw_key)
        api_key = self._api_key()
        params = parse_params(self.headers.get("Content-Type"), body)
        meta = metadata_of(params or {})
        seen = {"time": time.monotonic(), "path": self.path, "api_key": api_key,
                "account": self.headers.get("Stripe-Account"), "idempotency_key": raw_key,
                "key": key, "params": params, "status": None, "object_id": None,
                "stripe_version": self.headers.get("Stripe-Version")}
        with up.lock:
            up.requests.append(seen)
        if api_key is None:
            seen["status"] = 401
            self._error(401, "invalid_request_error",
                        "Invalid API Key provided: a Bearer sk_test_... key is required.")
            return
        if path not in ("/v1/charges", "/v1/customers"):
            seen["status"] = 404
            self._error(404, "invalid_request_error", "Unrecognized request URL (POST: %s)." %
                        path)
            return
        if params is None:
            seen["status"] = 400
            self._error(400, "invalid_request_error", "The body is not a form nor JSON.")
            return
        lock_n = meta.get("lock_timeout")
        if lock_n is not None and lock_n.isdigit():
            with up.lock:
                attempts = up.lock_attempts.get(key, 0) + 1
                up.lock_attempts[key] = attempts
            if attempts <= int(lock_n):
                seen["status"] = 409
                up.note_change()
                self._error(409, "api_error", "This object cannot be accessed right now because "
                            "another API request or Stripe process is currently accessing it.",
                            code="lock_timeout", extra=[("Stripe-Should-Retry", "true")])
                return
        if path == "/v1/charges":
            amount = params.get("amount", "")
            if not amount.isdigit():
                seen["status"] = 400
                self._error(400, "invalid_request_error", "Missing required param: amount.",
                            code="parameter_missing", param="amount")
                return
            if not params.get("currency"):
                seen["status"] = 400
                self._error(400, "invalid_request_error", "Missing required param: currency.",
                            code="parameter_missing", param="currency")
                return
            obj = {"id": "ch_%s" % uuid.uuid4().hex[:24], "object": "charge",
                   "amount": int(amount), "amount_captured": int(amount),
                   "currency": params["currency"].lower(),
                   "description": params.get("description"), "metadata": meta,
                   "captured": True, "paid": True, "status": "succeeded", "livemode": False,
                   "created": int(time.time())}
        else:
            obj = {"id": "cus_%s" % uuid.uuid4().hex[:14], "object": "customer",
                   "email": params.get("email"), "name": params.get("name"),
                   "description": params.get("description"), "metadata": meta,
                   "livemode": False, "created": int(time.time())}
        entry = {"id": obj["id"], "object": obj, "path": path, "api_key": api_key,
                 "account": self.headers.get("Stripe-Account"), "idempotency_key": raw_key,
                 "key": key, "params": params, "intent": meta.get("intent"),
                 "stripe_version": self.headers.get("Stripe-Version"),
                 "time": time.monotonic()}
        with up.lock:
            up.ledger.append(entry)
            up.by_id[obj["id"]] = entry
        seen["status"] = 200
        seen["object_id"] = obj["id"]
        up.note_change()
        slow = meta.get("slow_ms")
        if slow is not None and slow.isdigit():
            time.sleep(int(slow) / 1000.0)  # no lock held: other requests go on
        if meta.get("hold"):
            up.hold_event(meta["hold"]).wait(HOLD_MAX_S)  # nor here
        self._answer(200, obj)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def handle_error(self, request, client_address):
        # A gateway that gave up on a slow answer, or was killed, leaves a broken pipe here.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError, OSError)):
            return
        super().handle_error(request, client_address)


class StripeUpstream:
    """The Stripe-shaped API on 127.0.0.1:<free port>, with its ledger of what it executed."""

    def __init__(self, port=0):
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.ledger = []         # one entry per object made: what a second charge would show
        self.by_id = {}
        self.requests = []       # every POST, whatever came of it (401, 409 lock_timeout...)
        self.lock_attempts = {}  # Idempotency-Key (unquoted) -> attempts seen
        self.holds = {}          # metadata[hold] name -> threading.Event
        self.httpd = _Server(("127.0.0.1", port), _Handler)
        self.httpd.upstream = self
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def note_change(self):
        with self.changed:
            self.changed.notify_all()

    def hold_event(self, name):
        with self.lock:
            ev = self.holds.get(name)
            if ev is None:
                ev = self.holds[name] = threading.Event()
            return ev

    def release(self, name):
        """Lets the answers held under metadata[hold]=name go (and any later one at once)."""
        self.hold_event(name).set()

    def entries(self, pred=None):
        """Ledger entries (copies of the list, not of the entries) that pred accepts."""
        with self.lock:
            return [e for e in self.ledger if pred is None or pred(e)]

    def count(self, pred=None):
        return len(self.entries(pred))

    def received(self, pred=None):
        """Every POST received (ledger or not) that pred accepts."""
        with self.lock:
            return [r for r in self.requests if pred is None or pred(r)]

    def by_intent(self, intent):
        return self.entries(lambda e: e["intent"] == intent)

    def wait_for(self, what, pred, timeout=10.0):
        """
        Waits until pred(self) is true (it is called with the upstream; the lock is NOT held, so
        it may call entries() and the like); returns what it returned.  Raises
        TestFailure naming `what` once `timeout` seconds passed without.
        """
        deadline = time.monotonic() + timeout
        while True:
            got = pred(self)
            if got:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                raise TestFailure("timed out after %.1f s waiting for %s (ledger: %d entries, "
                                     "%d requests)" % (timeout, what, len(self.ledger),
                                                       len(self.requests)))
            with self.changed:
                self.changed.wait(min(left, 0.05))

    def close(self):
        with self.lock:
            holds = list(self.holds.values())
        for ev in holds:
            ev.set()
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="a Stripe-shaped, non-idempotent API")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    up = StripeUpstream(a.port)
    print("stripe_upstream: listening on %s" % up.url, flush=True)
    try:
        up.thread.join()
    except KeyboardInterrupt:
        up.close()
