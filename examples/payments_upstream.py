#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
payments_upstream.py - a tiny payments API that is NOT idempotent, for `make run-gateway`: every
POST /v1/payments creates a new payment, however many times the same request is sent.  Put
idem-gateway in front of it and retries with one Idempotency-Key create one payment.

  python3 examples/payments_upstream.py --port 9000

  POST /v1/payments {"amount": 500, "currency": "EUR"}  -> 201 {"id": "pay_1", ...}
                    (an amount that is not a positive integer -> 400, nothing made)
  GET  /v1/payments                                    -> every payment made
  GET  /v1/payments?requestKey=K                       -> the payment made under key K, or 404
                                                          (what a `reconcile` query asks)
Python's standard library only; listens on 127.0.0.1.
"""

import argparse
import http.server
import json
import socketserver
import threading
import urllib.parse


class Payments:
    def __init__(self):
        self.lock = threading.Lock()
        self.items = []


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        print("upstream: %s %s" % (self.command, self.path), flush=True)

    def send_json(self, status, doc, location=None):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if location:
            self.send_header("Location", location)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        u = urllib.parse.urlsplit(self.path)
        if u.path != "/v1/payments":
            return self.send_json(404, {"error": "not found"})
        key = urllib.parse.parse_qs(u.query).get("requestKey", [None])[0]
        with self.server.payments.lock:
            items = list(self.server.payments.items)
        if key is None:
            return self.send_json(200, {"data": items})
        for p in items:
            if p["requestKey"] == key:
                return self.send_json(200, p, "/v1/payments/" + p["id"])
        return self.send_json(404, {"error": "no payment for this key"})

    def do_POST(self):
        if self.path != "/v1/payments":
            return self.send_json(404, {"error": "not found"})
        n = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(n) or b"{}")
        except ValueError:
            return self.send_json(400, {"error": "body is not JSON"})
        amount = body.get("amount") if isinstance(body, dict) else None
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            return self.send_json(400, {"error": "amount must be a positive integer"})
        key = (self.headers.get("Idempotency-Key") or "").strip('"')
        with self.server.payments.lock:
            pid = "pay_%d" % (len(self.server.payments.items) + 1)
            p = {"id": pid, "amount": body.get("amount"), "currency": body.get("currency"),
                 "requestKey": key}
            self.server.payments.items.append(p)
        self.send_json(201, p, "/v1/payments/" + pid)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser(description="a payments API that is not idempotent")
    ap.add_argument("--port", type=int, default=9000)
    args = ap.parse_args()
    srv = Server(("127.0.0.1", args.port), Handler)
    srv.payments = Payments()
    print("upstream: listening on http://127.0.0.1:%d" % args.port, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
