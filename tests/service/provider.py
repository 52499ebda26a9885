# SPDX-License-Identifier: Apache-2.0
"""
provider.py - provider-sim for the service tests: start it on a loopback port with its own SQLite
file, change its faults at run time, read its ledger, stop it, kill it, bring it back on the same
port (orderd was told that URL at start).  Also the pieces a payment test needs on orderd's side:
a port that is known before orderd starts (so provider-sim can be told where to send webhooks),
webhook signing, and a client that retries like a well-behaved one.

Python's standard library only, like harness.py.
"""

import hashlib
import hmac
import http.client
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time

from harness import BIN, Server, TestFailure, _tail, free_port, wait_until  # noqa: F401 - re-exported for the tests

PROVIDER_SIM = os.path.join(BIN, "provider-sim")
START_TIMEOUT_S = 15.0
LISTEN_RE = re.compile(r"provider-sim: listening on https?://([^:/\s]+):(\d+)")
WEBHOOK_SECRET = "whsec_test_" + "0123456789abcdef"

_live = []


def sign(body, secret=WEBHOOK_SECRET, t=None):
    """The Provider-Signature header value for `body` (bytes): t=<unix>,v1=<hex HMAC-SHA256>."""
    t = int(time.time()) if t is None else int(t)
    mac = hmac.new(secret.encode(), b"%d." % t + body, hashlib.sha256).hexdigest()
    return "t=%d,v1=%s" % (t, mac)


class Provider:
    """One provider-sim process on 127.0.0.1, its database and logs in a temp dir."""

    def __init__(self, args=(), webhook_url=None, secret=WEBHOOK_SECRET, name="provider-sim",
                 ca_file=None):
        self.name = name
        self.ca_file = ca_file  # with --tls-cert: what the tests' own calls trust
        self.tmpdir = tempfile.mkdtemp(prefix="idem-prov-")
        self.db = "sqlite:%s/provider.db" % self.tmpdir
        self.args = list(args)
        self.webhook_url = webhook_url
        self.secret = secret
        self.proc = None
        self.port = None
        self.generation = 0
        self.stdout_path = self.stderr_path = None
        _live.append(self)

    @property
    def url(self):
        scheme = "https" if "--tls-cert" in self.args else "http"
        return "%s://127.0.0.1:%d" % (scheme, self.port)

    def start(self, port=None):
        """Starts it; on the same port as before when it ran already (port 0 the first time)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("provider-sim already running")
        port = port if port is not None else (self.port or 0)
        self.generation += 1
        self.stdout_path = os.path.join(self.tmpdir, "%s.%d.stdout" % (self.name, self.generation))
        self.stderr_path = os.path.join(self.tmpdir, "%s.%d.stderr" % (self.name, self.generation))
        cmd = [PROVIDER_SIM, "--listen", "127.0.0.1:%d" % port, "--db", self.db]
        if self.webhook_url:
            cmd += ["--webhook-url", self.webhook_url, "--webhook-secret", self.secret,
                    "--webhook-backoff-max-ms", "500"]
        cmd += self.args
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with open(self.stdout_path, "wb") as out, open(self.stderr_path, "ab") as err:
                try:
                    self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                                 stderr=err)
                except FileNotFoundError:
                    raise TestFailure("cannot start %s (IDEM_BIN=%s)" % (PROVIDER_SIM, BIN))
            while True:
                m = LISTEN_RE.search(_tail(self.stdout_path, 1 << 16))
                if m:
                    self.port = int(m.group(2))
                    return self
                rc = self.proc.poll()
                if rc is not None:
                    break
                if time.monotonic() > deadline:
                    self.kill9()
                    raise TestFailure("provider-sim did not start listening\n%s" % self.logs())
                time.sleep(0.02)
            # A port just given up may take a moment to be free again: retry until the deadline.
            if port == 0 or time.monotonic() > deadline:
                raise TestFailure("`%s` exited with %d before listening\n%s" % (
                    " ".join(cmd), rc, self.logs()))
            time.sleep(0.2)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.proc.returncode if self.proc else None

    def kill9(self):
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def close(self):
        self.stop()
        if self in _live:
            _live.remove(self)
        if os.environ.get("IDEM_TEST_KEEP") == "1":
            sys.stderr.write("provider.py: kept %s\n" % self.tmpdir)
        else:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def logs(self):
        return "stderr of %s:\n%s" % (self.name, _tail(self.stderr_path or "", 3000))

    def __enter__(self):
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- its API --

    def connection(self, timeout=30):
        if "--tls-cert" not in self.args:
            return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        ctx = ssl.create_default_context(cafile=self.ca_file)
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=ctx)

    def call(self, method, path, body=None, headers=None, timeout=30):
        conn = self.connection(timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            hdrs = {"Content-Type": "application/json"} if data is not None else {}
            hdrs.update(headers or {})
            conn.request(method, path, body=data, headers=hdrs)
            r = conn.getresponse()
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None)
        finally:
            conn.close()

    def faults(self, **settings):
        status, doc = self.call("POST", "/v1/faults", settings)
        if status != 200:
            raise TestFailure("POST /v1/faults %r: %d %r" % (settings, status, doc))
        return doc

    def ledger(self, keys=True):
        status, doc = self.call("GET", "/v1/ledger" + ("" if keys else "?keys=0"))
        if status != 200:
            raise TestFailure("GET /v1/ledger: %d %r" % (status, doc))
        return doc

    def charges_by_key(self, key):
        status, doc = self.call("GET", "/v1/charges?idempotency_key=" + key)
        if status != 200:
            raise TestFailure("GET /v1/charges?idempotency_key=%s: %d %r" % (key, status, doc))
        return doc["data"]


def _cleanup():
    for p in list(_live):
        try:
            p.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


import atexit  # noqa: E402

atexit.register(_cleanup)


def paid_pair(order_args=(), provider_args=(), env=None, name="pay"):
    """
    provider-sim and an orderd that charges through it and receives its webhooks, each knowing the
    other's URL: orderd's port is chosen first and kept across restarts.  Returns (provider,
    server); start order: provider, then server.
    """
    port = free_port()
    prov = Provider(args=provider_args,
                    webhook_url="http://127.0.0.1:%d/webhooks/provider" % port,
                    name=name + "-provider-sim")
    prov.start()
    server = Server(name=name + "-orderd", env=env, extra_args=[
        "--listen", "127.0.0.1:%d" % port, "--provider", prov.url,
        "--webhook-secret", WEBHOOK_SECRET] + list(order_args))
    return prov, server


def retry_until_final(client, method, path, body=None, key=None, deadline_s=60.0, pause_s=0.05,
                      headers=None, timeout=10):
    """
    Sends the same request (same key) until the answer is final: 409 in progress, 503 and
    connection errors are retried after a short pause (the tests keep it short; a real client
    honours Retry-After).  Returns (Response, [interim statuses or error names]).
    """
    interim = []
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            r = client.request(method, path, json_body=body, key=key, headers=headers,
                               timeout=timeout)
        except (OSError, http.client.HTTPException) as e:
            interim.append(type(e).__name__)
            r = None
        if r is not None and r.status not in (409, 503):
            return r, interim
        if r is not None and r.status == 409:
            code = r.json().get("code")
            if code != "idempotency-request-in-progress":
                return r, interim
            interim.append("409-recovering" if r.json().get("state") == "recovering" else 409)
        elif r is not None:
            interim.append("503-" + str(r.json().get("code")))
        if time.monotonic() > deadline:
            raise TestFailure("%s %s key %s: no final answer in %.0f s; interim %r; last %s" % (
                method, path, key, deadline_s, interim[-20:],
                r.describe() if r is not None else "none"))
        time.sleep(pause_s)


