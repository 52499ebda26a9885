# SPDX-License-Identifier: Apache-2.0
"""
test_conformance.py - `idem-check conformance` (src/idem-check, docs/idem-check.md) against a real
orderd, and against a toy API that ignores Idempotency-Key altogether.

The checker is only worth something if it passes what is right and fails what is wrong: orderd
must come out with every check PASS (the Retry-After check may say SKIP, since orderd waits out
in-progress duplicates within its wait_ms and then no 409 is seen), twice in a row against the same
server (fresh keys per run); a deliberately non-idempotent server must fail the replay and storm
checks and make idem-check exit 1.  The exit codes for bad usage (2) and an unreachable API (3) are
checked too.
"""

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import BIN, Server, expect, expect_eq, fail, run, test  # noqa: E402

IDEM_CHECK = os.path.join(BIN, "idem-check")

EXPECTED_CHECKS = [
    "missing-key", "key-empty", "key-too-long", "key-control-char", "key-unterminated", "key-twice",
    "first-request",
    "replay", "replay-reordered", "different-body", "other-user-scope", "storm",
    "validation-not-stored", "retry-after-409",
]
# What may be SKIP against orderd, and why: orderd answers a same-key duplicate by waiting for
# the first (wait_ms, 2 s) and replaying it, so a storm on a fast server usually sees no 409.
MAY_SKIP = {"retry-after-409"}


def idem_check(args, timeout=60):
    t0 = time.monotonic()
    try:
        p = subprocess.run([IDEM_CHECK] + args, capture_output=True, timeout=timeout)
    except FileNotFoundError:
        fail("%s not found (IDEM_BIN=%s): build the idem-check target" % (IDEM_CHECK, BIN))
    except subprocess.TimeoutExpired:
        fail("`idem-check %s` did not finish in %d s" % (" ".join(args), timeout))
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace")
    print("measured: idem-check %s took %.2f s" % (args[0] if args else "", time.monotonic() - t0),
          flush=True)
    return p.returncode, out, err


def report_of(rc, out, err):
    try:
        doc = json.loads(out)
    except ValueError as e:
        fail("--json output is not JSON (%s), rc %d:\n%s\nstderr: %s" % (e, rc, out, err))
    expect(isinstance(doc.get("checks"), list), "no checks array: %s" % out)
    expect_eq(doc.get("exitCode"), rc, "exitCode member vs the process's exit code")
    return doc


def verdicts(doc):
    return {c["id"]: c for c in doc["checks"]}


def describe(doc):
    return "\n".join("%s %-22s %s" % (c["result"], c["id"], c["evidence"][:300])
                     for c in doc["checks"])


class Ctx:
    def __init__(self):
        self.server = Server(name="orderd-conformance").start()
        self.user1 = self.server.new_user("conf1")
        self.user2 = self.server.new_user("conf2")

    def args(self, base_url=None, count=True):
        base = base_url or self.server.base_url
        a = ["conformance", "--url", base, "--token", self.user1.token, "--token2",
             self.user2.token, "--timeout", "15"]
        if count:
            a += ["--count-url", base + "/api/orders?limit=100"]
        return a

    def close(self):
        self.server.close()


# ---- against orderd ----------------------------------------------------------------------------

@test
def test_orderd_passes_every_check(ctx):
    rc, out, err = idem_check(ctx.args() + ["--json"])
    doc = report_of(rc, out, err)
    got = verdicts(doc)
    expect_eq([c["id"] for c in doc["checks"]], EXPECTED_CHECKS, "the checks, in order")
    bad = [c for c in doc["checks"]
           if c["result"] != "PASS" and not (c["id"] in MAY_SKIP and c["result"] == "SKIP")]
    expect(not bad, "orderd should pass every check:\n%s\nstderr: %s" % (describe(doc), err))
    expect_eq(rc, 0, "exit code with no FAIL")
    expect("; 1 new effect(s) counted" in got["storm"]["evidence"],
           "the storm counted its effects: %s" % got["storm"]["evidence"])
    for c in doc["checks"]:
        print("conformance: %s %s" % (c["result"], c["id"]), flush=True)


@test
def test_rerun_with_table_output(ctx):
    # Fresh keys per run: a second run against the same server, same users, passes again.
    rc, out, err = idem_check(ctx.args())
    expect_eq(rc, 0, "exit code of a second run\n%s\n%s" % (out, err))
    for check in EXPECTED_CHECKS:
        expect(check in out, "table lists %s:\n%s" % (check, out))
    expect("FAIL " not in out, "no FAIL in the table:\n%s" % out)
    expect("0 FAIL" in out, "summary line:\n%s" % out)


@test
def test_usage_and_unreachable(ctx):
    rc, out, _ = idem_check(["--help"])
    expect_eq(rc, 0, "--help")
    for flag in ("--url", "--token", "--token2", "--path", "--body", "--count-url", "--json",
                 "--timeout", "exit codes"):
        expect(flag in out, "--help mentions %s:\n%s" % (flag, out))
    rc, _, err = idem_check(["conformance", "--url", ctx.server.base_url])
    expect_eq(rc, 2, "missing tokens: exit code")
    expect("required" in err, "a clear message: %r" % err)
    rc, _, err = idem_check(["conformance", "--url", "ftp://x", "--token", "a", "--token2", "b"])
    expect_eq(rc, 2, "bad URL scheme: exit code")
    # A port nobody listens on: bind one, then close it.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rc, _, err = idem_check(["conformance", "--url", "http://127.0.0.1:%d" % port, "--token", "a",
                             "--token2", "b"])
    expect_eq(rc, 3, "unreachable API: exit code (stderr %r)" % err)
    expect("cannot be reached" in err, "a clear message: %r" % err)


# ---- against an API that ignores Idempotency-Key ------------------------------------------------

class ToyHandler(http.server.BaseHTTPRequestHandler):
    """Executes every POST (a new order each time), whatever the key; GET lists the orders."""

    protocol_version = "HTTP/1.1"
    orders = []
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def _send(self, status, doc):
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        try:
            req = json.loads(raw or b"null")
        except ValueError:
            req = None
        if not isinstance(req, dict) or "productId" not in req:
            self._send(400, {"error": "invalid body"})
            return
        order = {"orderId": uuid.uuid4().hex, "productId": req["productId"]}
        time.sleep(0.01)  # some work, so that a storm overlaps
        with self.lock:
            self.orders.append(order)
        self._send(201, order)

    def do_GET(self):
        with self.lock:  # a copy under the lock; the answer is sent without it
            orders = list(self.orders)
        self._send(200, {"orders": orders})


class ToyServer(http.server.ThreadingHTTPServer):
    request_queue_size = 256
    daemon_threads = True


@test
def test_non_idempotent_api_fails(ctx):
    toy = ToyServer(("127.0.0.1", 0), ToyHandler)
    t = threading.Thread(target=toy.serve_forever, daemon=True)
    t.start()
    try:
        base = "http://127.0.0.1:%d" % toy.server_address[1]
        rc, out, err = idem_check(ctx.args(base_url=base) + ["--json"])
    finally:
        toy.shutdown()
        toy.server_close()
    doc = report_of(rc, out, err)
    got = verdicts(doc)
    print(describe(doc), flush=True)
    expect_eq(rc, 1, "exit code with FAILs")
    for check in ("missing-key", "key-empty", "replay", "replay-reordered", "different-body",
                  "storm"):
        expect_eq(got[check]["result"], "FAIL", "%s against the toy API (%s)" % (
            check, got[check]["evidence"][:300]))
    expect("; 51 new effect(s) counted" in got["storm"]["evidence"],
           "the storm (50 + 1 follow-up) counted every execution: %s" % got["storm"]["evidence"])
    # What the toy does right is not reported as wrong.
    expect_eq(got["first-request"]["result"], "PASS", "first request")
    expect_eq(got["other-user-scope"]["result"], "PASS", "another user's key executes")


def setup():
    return Ctx()


def teardown(ctx):
    if ctx is not None:
        ctx.close()


if __name__ == "__main__":
    run("test_conformance", setup=setup, teardown=teardown)
