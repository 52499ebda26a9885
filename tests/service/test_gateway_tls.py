#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_gateway_tls.py - idem-gateway in front of an HTTPS upstream (`upstream.url: https://...`),
over real TLS on loopback, with certificates a throw-away CA makes (tls_ca.py):

  - a keyed POST executes once and its retry replays; requests passed through work too, and a
    retry of an unknown outcome is resent over TLS from a worker; answers too large to hold are
    streamed from the TLS connection, keyed or not;
  - an upstream whose certificate is signed by a CA the gateway does not trust, has expired, or
    names another host is refused before anything is sent: the upstream counts no request, the
    client is told to retry (Retry-After), no record is kept (`keys list --state any`), and the
    log says why;
  - mutual TLS: accepted with the gateway's client certificate, refused (nothing sent) without;
  - SNI: the upstream sees the name the gateway verifies, and the same name as Host;
  - sessions: later connections resume the first one's session instead of a full handshake;
  - check-config reads the TLS files as serve does (a key that is not the certificate's);

and the gateway's own listener over TLS (`listen_tls`): keyed requests and keep-alive over HTTPS
with ALPN http/1.1; a plain-HTTP request on the TLS port answered 400 tls-required and closed; a
handshake stalled half-way cut by the head deadline, counted meanwhile against its address's
connection limit; SIGHUP reads a new certificate (RSA after ECDSA) for new connections while a
request runs and an older connection goes on; the admin listener over TLS when given a
certificate (`admin_listen_tls`), the public one plain, and SIGHUP reading its certificate again.

docs/gateway.md's "In front of a remote API" example is run as written (its openssl command, its
config with free ports, its request twice, then without ca_file).

The upstream is gateway_harness's counting upstream, its sockets wrapped with Python's ssl on the
handler's thread (so a failed handshake costs only its own connection).
"""

import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import TestFailure, expect_eq, test  # noqa: E402
import gateway_harness  # noqa: E402
from gateway_harness import GATEWAY, Gateway, expect  # noqa: E402
from tls_ca import TlsCa  # noqa: E402


def key(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


class _TlsServer(gateway_harness._ThreadingServer):
    """The counting upstream's server, each connection's handshake on the handler's thread."""

    def finish_request(self, request, client_address):
        up = self.upstream
        try:
            tls = self.tls_context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            with up.lock:
                up.handshake_failures.append(str(e))
            return
        with up.lock:
            up.handshakes += 1
            up.resumed += 1 if tls.session_reused else 0
            up.client_certs.append(tls.getpeercert())
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()


class TlsUpstream(gateway_harness.Upstream):
    """The counting upstream over HTTPS with `leaf`'s certificate; `client_ca`: mTLS required."""

    def __init__(self, leaf, client_ca=None):
        self.lock = threading.Lock()
        self.count = 0
        self.by_key = {}
        self.first_by_key = {}
        self.requests = []
        self.lookups = 0
        self.lookup_headers = []
        self.deduped = 0
        self.release = threading.Event()
        self.handshakes = 0
        self.resumed = 0
        self.handshake_failures = []
        self.client_certs = []
        self.sni = []
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(leaf.chain, leaf.key)
        ctx.options |= getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)
        if client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(client_ca)

        def on_sni(sock, name, c):
            with self.lock:
                self.sni.append(name)
        ctx.sni_callback = on_sni
        self.httpd = _TlsServer(("127.0.0.1", 0), gateway_harness._Handler)
        self.httpd.upstream = self
        self.httpd.tls_context = ctx
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return "https://127.0.0.1:%d" % self.port


class Setup:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="idem-tls-")
        self.ca = TlsCa(self.dir)
        self.rogue = TlsCa(self.dir, name="rogue")
        self.good = self.ca.server("good")
        self.named = self.ca.server("named", hosts=["api.test"])
        self.other = self.ca.server("other", hosts=["example.org"])
        self.expired = self.ca.server("expired", expired=True)
        self.untrusted = self.rogue.server("untrusted")
        self.client = self.ca.client("gateway")
        self.edge = self.ca.server("edge")
        self.edge2 = self.ca.server("edge2", rsa=True)


def tls_gateway(up, tls_lines, name, upstream_extra=""):
    """A gateway in front of `up`, with `tls_lines` (YAML under upstream.tls)."""
    gw = Gateway(up, name=name)
    with open(gw.config_path) as f:
        text = f.read()
    block = "  tls:\n" + "".join("    %s\n" % line for line in tls_lines) if tls_lines else ""
    block += upstream_extra
    text = text.replace("  timeout: 3s\n", "  timeout: 3s\n" + block, 1)
    with open(gw.config_path, "w") as f:
        f.write(text)
    return gw


def with_upstream(leaf, tls_lines, fn, client_ca=None, name="gateway-tls", upstream_extra=""):
    up = TlsUpstream(leaf, client_ca)
    gw = tls_gateway(up, tls_lines, name, upstream_extra)
    try:
        gw.start()
        fn(gw, up)
    finally:
        gw.close()
        up.close()


def stderr_of(gw):
    with open(gw.stderr_path, errors="replace") as f:
        return f.read()


def held_keys(gw):
    p = subprocess.run([GATEWAY, "keys", "list", "--state", "any", "--limit", "1000", "--config",
                        gw.config_path], capture_output=True, timeout=20)
    expect(p.returncode == 0, "keys list: %d %r" % (p.returncode, p.stderr))
    return [r["key"] for r in json.loads(p.stdout)["records"]]


def expect_refused(gw, up, why, what, rounds=1):
    """A keyed POST is not sent: Retry-After, no execution, no record, `why` in the log."""
    for _ in range(rounds - 1):
        expect_refused(gw, up, why, what)
    k = key("refused")
    r = gw.request("POST", "/v1/things", {"n": 1}, key=k)
    expect(r.status in (502, 503) and r.headers.get("Retry-After") is not None and
           r.headers.get("Content-Type", "").startswith("application/problem+json"),
           "%s: a retryable problem: %s" % (what, r.describe()))
    expect("nothing was sent" in r.json().get("detail", ""), "%s: %s" % (what, r.describe()))
    expect_eq(up.count, 0, "%s: requests the upstream executed" % what)
    expect(k not in held_keys(gw), "%s: no record is kept for the key" % what)
    # A request passed through is refused the same way.
    r = gw.request("GET", "/count")
    expect(r.status in (502, 503) and r.headers.get("Retry-After") is not None,
           "%s: passed through: %s" % (what, r.describe()))
    expect_eq(up.count, 0, "%s: requests the upstream executed" % what)
    harness.wait_until("%s: the log to say why" % what, lambda: why in stderr_of(gw))


@test
def a_keyed_post_runs_once_over_tls_and_replays(ctx):
    def run(gw, up):
        k = key("once")
        a = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        expect_eq(a.status, 201, "first answer: %s" % a.describe())
        b = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        expect_eq(b.status, 201, "the retry: %s" % b.describe())
        expect_eq(b.headers.get("Idempotent-Replayed"), "true", "the retry is a replay")
        expect_eq(a.body, b.body, "the replay's body")
        expect_eq(up.executions(k), 1, "executions")
        r = gw.request("POST", "/v2/free", {"n": 2})
        expect_eq(r.status, 201, "a request passed through: %s" % r.describe())
        # An unknown outcome, resent from a worker (upstream_exchange) over TLS.
        k2 = key("resend")
        r = gw.request("POST", "/v1/resend", {"n": 3}, key=k2, headers={"X-Test-Mode": "reset"})
        expect_eq(r.status, 502, "a reset after executing: %s" % r.describe())
        r = gw.request("POST", "/v1/resend", {"n": 3}, key=k2)
        expect_eq(r.status, 201, "the resent retry: %s" % r.describe())
        expect_eq(up.executions(k2), 2, "executions of the resent key")
        expect_eq(up.handshake_failures, [], "handshakes the upstream saw fail")
    with_upstream(ctx.good, ["ca_file: %s" % ctx.ca.cert], run)


@test
def an_untrusted_ca_is_refused_before_anything_is_sent(ctx):
    with_upstream(ctx.untrusted, ["ca_file: %s" % ctx.ca.cert],
                  lambda gw, up: expect_refused(gw, up, "self-signed certificate in certificate chain",
                                                "untrusted CA"))


@test
def the_system_store_does_not_trust_a_private_ca(ctx):
    with_upstream(ctx.good, [],
                  lambda gw, up: expect_refused(gw, up, "certificate verify failed",
                                                "no ca_file"))


@test
def an_expired_certificate_is_refused(ctx):
    with_upstream(ctx.expired, ["ca_file: %s" % ctx.ca.cert],
                  lambda gw, up: expect_refused(gw, up, "certificate has expired", "expired"))


@test
def a_certificate_for_another_host_is_refused(ctx):
    with_upstream(ctx.other, ["ca_file: %s" % ctx.ca.cert, "server_name: api.test"],
                  lambda gw, up: expect_refused(gw, up, "hostname mismatch", "wrong host"))
    # By address: the certificate must carry the address.
    with_upstream(ctx.other, ["ca_file: %s" % ctx.ca.cert],
                  lambda gw, up: expect_refused(gw, up, "IP address mismatch", "wrong address"))


@test
def the_server_name_is_verified_and_sent_as_sni(ctx):
    def run(gw, up):
        r = gw.request("POST", "/v1/things", {"n": 1}, key=key("sni"))
        expect_eq(r.status, 201, "through a certificate for api.test: %s" % r.describe())
        expect(up.sni and set(up.sni) == {"api.test"}, "SNI the upstream saw: %r" % up.sni)
        expect_eq(up.last_request()["headers"].get("Host"), "api.test:%d" % up.port,
                  "the Host the upstream saw (its own name, not the gateway's)")
    with_upstream(ctx.named, ["ca_file: %s" % ctx.ca.cert, "server_name: api.test"], run)


@test
def mutual_tls_with_and_without_a_client_certificate(ctx):
    def accepted(gw, up):
        r = gw.request("POST", "/v1/things", {"n": 1}, key=key("mtls"))
        expect_eq(r.status, 201, "with the client certificate: %s" % r.describe())
        expect(up.client_certs and up.client_certs[-1], "the upstream saw a client certificate")
    with_upstream(ctx.good, ["ca_file: %s" % ctx.ca.cert, "cert_file: %s" % ctx.client.chain,
                             "key_file: %s" % ctx.client.key], accepted, client_ca=ctx.ca.cert)
    with_upstream(ctx.good, ["ca_file: %s" % ctx.ca.cert],
                  # The server's alert races its reset of the request's write: several rounds.
                  lambda gw, up: expect_refused(gw, up, "certificate required",
                                                "no client certificate", rounds=5),
                  client_ca=ctx.ca.cert)


@test
def later_connections_resume_the_session(ctx):
    def run(gw, up):
        # Keyed requests go on connections of their own (keyed_connections: fresh).
        for i in range(5):
            r = gw.request("POST", "/v1/things", {"n": i}, key=key("resume"))
            expect_eq(r.status, 201, "request %d: %s" % (i, r.describe()))
        expect(up.handshakes >= 5, "connections: %d" % up.handshakes)
        expect(up.resumed >= up.handshakes - 2,
               "resumed handshakes: %d of %d" % (up.resumed, up.handshakes))
    with_upstream(ctx.good, ["ca_file: %s" % ctx.ca.cert], run)


@test
def answers_too_large_to_hold_stream_through_tls(ctx):
    def run(gw, up):
        n = 3 << 20
        for mode in ("big:%d" % n, "bigchunked:%d" % n):
            # Passed through: over max_response_size, streamed by the loop from the TLS stream.
            r = gw.request("POST", "/v2/big", {"n": 1}, headers={"X-Test-Mode": mode})
            expect(r.status == 200 and len(r.body) == n and gateway_harness.is_pattern(r.body),
                   "%s passed through: %d, %d bytes" % (mode, r.status, len(r.body)))
            # Keyed: over the route's max_stored_body (1 MiB), streamed and not stored.
            r = gw.request("POST", "/v1/things", {"n": 2}, key=key("big"),
                           headers={"X-Test-Mode": mode})
            expect(r.status == 200 and len(r.body) == n and gateway_harness.is_pattern(r.body),
                   "%s keyed: %d, %d bytes" % (mode, r.status, len(r.body)))
    with_upstream(ctx.good, ["ca_file: %s" % ctx.ca.cert], run,
                  upstream_extra="  max_response_size: 64KiB\n")


@test
def check_config_reads_the_tls_files(ctx):
    up = TlsUpstream(ctx.good)
    try:
        for lines, code, said in (
                (["ca_file: %s" % ctx.ca.cert], 0, ": ok"),
                (["ca_file: %s" % ctx.ca.cert, "cert_file: %s" % ctx.client.chain,
                  "key_file: %s" % ctx.good.key], 1, "key values mismatch"),
                (["ca_file: %s" % ctx.good.key], 1, "cannot load the CA certificates")):
            gw = tls_gateway(up, lines, "gateway-tls-check")
            p = subprocess.run([GATEWAY, "check-config", "--no-store", "--config", gw.config_path],
                               capture_output=True, timeout=20, text=True)
            expect(p.returncode == code and said in p.stdout + p.stderr,
                   "check-config with %r: %d %r %r" % (lines, p.returncode, p.stdout, p.stderr))
            gw.close()
    finally:
        up.close()


# ---- TLS at the edge: listen_tls -----------------------------------------------------------------

import http.client  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402


class EdgeGateway(Gateway):
    """A gateway whose public listener speaks TLS with `leaf` (copied, so a test may rotate it)."""

    listen_re = re.compile(gateway_harness.GATEWAY_LISTEN_RE.pattern.replace(
        "listening on http://", "listening on https://"))

    def __init__(self, up, setup, leaf, limits=""):
        super().__init__(up, name="gateway-edge", extra=limits)
        self.ca = setup.ca
        self.cert = os.path.join(self.tmpdir, "edge.pem")
        self.key = os.path.join(self.tmpdir, "edge.key")
        self.install(leaf)
        with open(self.config_path, "a") as f:
            f.write("listen_tls:\n  cert_file: %s\n  key_file: %s\n" % (self.cert, self.key))

    def install(self, leaf):
        shutil.copyfile(leaf.chain, self.cert + ".new")
        shutil.copyfile(leaf.key, self.key + ".new")
        os.replace(self.key + ".new", self.key)
        os.replace(self.cert + ".new", self.cert)

    def client_context(self):
        ctx = ssl.create_default_context(cafile=self.ca.cert)
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    def connection(self, timeout=10):
        return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                           context=self.client_context())

    def request(self, method, path, body=None, headers=None, principal="alice", key=None,
                timeout=30):
        h = {"X-Consumer-Id": principal} if principal else {}
        if key is not None:
            h["Idempotency-Key"] = key
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            return harness.Response(r.status, r.headers, r.read(), 0)
        finally:
            conn.close()


def with_edge(ctx, fn, limits=""):
    up = gateway_harness.Upstream()
    gw = EdgeGateway(up, ctx, ctx.edge, limits)
    try:
        gw.start()
        fn(gw, up)
    finally:
        gw.close()
        up.close()


def open_connections(gw):
    """The public listener's open connections, from the admin listener's metrics."""
    m = re.search(r"^idem_gateway_http_connections_open (\d+)$",
                  gw.admin("GET", "/metrics").body.decode(), re.M)
    return int(m.group(1)) if m else -1


def served_serial(conn):
    return conn.sock.getpeercert()["serialNumber"]


@test
def the_listener_speaks_tls(ctx):
    def run(gw, up):
        k = key("edge")
        a = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        b = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        expect(a.status == 201 and b.status == 201 and
               b.headers.get("Idempotent-Replayed") == "true" and a.body == b.body,
               "a keyed POST over HTTPS and its replay: %s / %s" % (a.describe(), b.describe()))
        expect_eq(up.executions(k), 1, "executions")
        # Keep-alive: several requests on one TLS connection; ALPN says http/1.1.
        conn = gw.connection()
        for i in range(3):
            conn.request("POST", "/v2/free", body=json.dumps({"i": i}),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            expect_eq(r.status, 201, "request %d on one connection" % i)
            r.read()
        expect_eq(conn.sock.selected_alpn_protocol(), "http/1.1", "ALPN")
        conn.close()
        # A body streamed by the loop (over the route's max_stored_body) goes out through TLS.
        n = 3 << 20
        r = gw.request("POST", "/v1/things", {"n": 2}, key=key("edge-big"),
                       headers={"X-Test-Mode": "bigchunked:%d" % n})
        expect(r.status == 200 and len(r.body) == n and gateway_harness.is_pattern(r.body),
               "a streamed answer over HTTPS: %d, %d bytes" % (r.status, len(r.body)))
    with_edge(ctx, run)


@test
def plain_http_on_the_tls_port_is_told_and_closed(ctx):
    def run(gw, up):
        s = socket.create_connection((gw.host, gw.port), timeout=5)
        s.sendall(b"GET /v2/x HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while True:
            piece = s.recv(4096)
            if not piece:
                break
            got += piece
        s.close()
        expect(got.startswith(b"HTTP/1.1 400 ") and b"tls-required" in got,
               "a plain request on the TLS port: %r" % got[:300])
        head, _, body = got.partition(b"\r\n\r\n")
        length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
        expect_eq(len(body), length, "the body is its Content-Length")
        json.loads(body)
        expect_eq(up.count, 0, "nothing reached the upstream")
    with_edge(ctx, run)


@test
def a_stalled_handshake_is_cut_and_counts_against_the_address(ctx):
    def run(gw, up):
        # Half a ClientHello, then silence: a slowloris mid-handshake.
        stalled = []
        for _ in range(2):
            s = socket.create_connection((gw.host, gw.port), timeout=10)
            s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
            stalled.append(s)
        # Both taken by the gateway (the kernel completes a connect before any loop accepts it,
        # and the third may land on the other loop first) ...
        harness.wait_until("the gateway to hold both stalled connections",
                           lambda: open_connections(gw) >= 2)
        # ... so the address holds as many connections as it may: a third is not served.
        try:
            r = gw.request("GET", "/count", timeout=5)
            raise TestFailure("a third connection was served: %s" % r.describe())
        except (ssl.SSLError, OSError, http.client.HTTPException):
            pass
        t0 = time.monotonic()
        for s in stalled:
            expect_eq(s.recv(100), b"", "the stalled handshake is closed")
        waited = time.monotonic() - t0
        expect(waited < 4, "cut by the head deadline (1 s), after %.1f s" % waited)
        # The gateway gives the address's slots back once each close is done, just after the
        # client saw it end.
        harness.wait_until("the gateway to let go of the stalled connections",
                           lambda: open_connections(gw) == 0)
        r = gw.request("POST", "/v2/free", {"n": 1})
        expect_eq(r.status, 201, "served again once they are cut")
    with_edge(ctx, run, limits="limits:\n  head_timeout_ms: 1000\n  max_connections_per_ip: 2\n")


@test
def sighup_reads_a_new_certificate_while_requests_run(ctx):
    def run(gw, up):
        old = gw.connection()
        old.request("GET", "/count")
        old.getresponse().read()
        first = served_serial(old)
        hung_key = key("during")
        hung = harness.in_thread(lambda: gw.request("POST", "/v1/things", {"n": 1}, key=hung_key,
                                                    headers={"X-Test-Mode": "slow:1500"}))
        harness.wait_until("the slow request to reach the upstream",
                           lambda: up.executions(hung_key) == 1)
        gw.install(ctx.edge2)
        gw.proc.send_signal(signal.SIGHUP)
        harness.wait_until("the log to say the certificate was read again",
                           lambda: "read again" in stderr_of(gw))
        new = gw.connection()
        new.request("GET", "/count")
        new.getresponse().read()
        expect(served_serial(new) != first, "a new connection gets the new certificate")
        new.close()
        old.request("GET", "/count")
        r = old.getresponse()
        r.read()
        expect_eq(r.status, 200, "the connection open before SIGHUP goes on")
        old.close()
        thread, box = hung
        thread.join(20)
        expect("resp" in box, "the request running across SIGHUP: %r" % box)
        r = box["resp"]
        expect_eq(r.status, 201, "the request running across SIGHUP: %s" % r.describe())
        expect(gw.alive(), "the gateway still runs")
    with_edge(ctx, run)


def admin_get(gw, path, ca):
    """GET `path` on the admin listener over HTTPS: (status, body, the serving certificate's
    serial)."""
    conn = http.client.HTTPSConnection(gw.host, gw.admin_port, timeout=10,
                                       context=ssl.create_default_context(cafile=ca))
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read(), served_serial(conn)
    finally:
        conn.close()


@test
def the_admin_listener_speaks_tls_when_given_a_certificate(ctx):
    """admin_listen_tls: the admin listener alone over HTTPS (the public one stays plain), a plain
    request on its port told and closed, and SIGHUP reads its certificate again."""
    up = gateway_harness.Upstream()
    gw = Gateway(up, name="gateway-admin-tls")
    cert, keyf = os.path.join(gw.tmpdir, "admin.pem"), os.path.join(gw.tmpdir, "admin.key")

    def install(leaf):
        shutil.copyfile(leaf.chain, cert + ".new")
        shutil.copyfile(leaf.key, keyf + ".new")
        os.replace(keyf + ".new", keyf)
        os.replace(cert + ".new", cert)
    install(ctx.edge)
    with open(gw.config_path, "a") as f:
        f.write("admin_listen_tls:\n  cert_file: %s\n  key_file: %s\n" % (cert, keyf))
    try:
        gw.start()
        with open(gw.stdout_path) as f:
            said = f.read()
        expect("listening on http://" in said and "(admin https://" in said,
               "the listening line: %r" % said)
        status, body, first = admin_get(gw, "/healthz", ctx.ca.cert)
        expect_eq(status, 200, "GET /healthz over HTTPS")
        status, body, _ = admin_get(gw, "/metrics", ctx.ca.cert)
        expect(status == 200 and b"idem_gateway_requests_total" in body,
               "GET /metrics over HTTPS: %d %r" % (status, body[:200]))
        k = key("admin-tls")
        a = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        b = gw.request("POST", "/v1/things", {"n": 1}, key=k)
        expect(a.status == 201 and b.headers.get("Idempotent-Replayed") == "true",
               "the public listener stays plain HTTP: %s / %s" % (a.describe(), b.describe()))
        s = socket.create_connection((gw.host, gw.admin_port), timeout=5)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        got = b""
        while True:
            piece = s.recv(4096)
            if not piece:
                break
            got += piece
        s.close()
        expect(got.startswith(b"HTTP/1.1 400 ") and b"tls-required" in got,
               "a plain request on the admin listener: %r" % got[:300])
        install(ctx.edge2)
        gw.proc.send_signal(signal.SIGHUP)
        harness.wait_until("the log to say the admin listener's certificate was read again",
                           lambda: "admin listener's certificate was read again" in stderr_of(gw))
        status, _, now = admin_get(gw, "/healthz", ctx.ca.cert)
        expect(status == 200 and now != first,
               "after SIGHUP a new connection gets the new certificate (%s, then %s)"
               % (first, now))
        expect(gw.alive(), "the gateway still runs")
    finally:
        gw.close()
        up.close()


@test
def the_gateway_calls_provider_sim_over_https(ctx):
    """The egress example of docs/gateway.md: provider-sim serving HTTPS (--tls-cert)."""
    import provider
    sim = provider.Provider(args=["--tls-cert", ctx.edge.chain, "--tls-key", ctx.edge.key])
    sim.start()
    routes = "\n  - match: POST /v1/emails\n    operation: emails.create\n"
    gw = Gateway(sim, routes=routes, name="gateway-sim")
    with open(gw.config_path) as f:
        text = f.read()
    with open(gw.config_path, "w") as f:
        f.write(text.replace("  timeout: 3s\n", "  timeout: 3s\n  tls:\n    ca_file: %s\n"
                             % ctx.ca.cert, 1))
    try:
        gw.start()
        k = key("email")
        doc = {"to": "a@example.com", "subject": "hi", "template": "welcome"}
        a = gw.request("POST", "/v1/emails", doc, key=k)
        b = gw.request("POST", "/v1/emails", doc, key=k)
        expect(a.status // 100 == 2 and b.status == a.status and a.body == b.body and
               b.headers.get("Idempotent-Replayed") == "true",
               "an email through the gateway, then its replay: %s / %s"
               % (a.describe(), b.describe()))
        r = gw.request("GET", "/v1/emails?idempotency_key=" + k)
        expect(r.status == 200 and len(r.json().get("data", r.json().get("emails", [1]))) >= 1,
               "provider-sim sent one email: %s" % r.describe())
        # Plain HTTP to provider-sim's TLS port: told, and closed.
        s = socket.create_connection(("127.0.0.1", sim.port), timeout=5)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        expect(s.recv(100).startswith(b"HTTP/1.1 400 "), "plain HTTP on provider-sim's TLS port")
        s.close()
        # SIGHUP: provider-sim reads its certificate again.
        sim.proc.send_signal(signal.SIGHUP)
        harness.wait_until("provider-sim to read its certificate again",
                           lambda: "read again" in open(sim.stderr_path).read())
        r = gw.request("POST", "/v1/emails", doc, key=key("email-after"))
        expect(r.status // 100 == 2, "after SIGHUP: %s" % r.describe())
    finally:
        gw.close()
        sim.close()


DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "gateway.md")


def egress_example():
    """docs/gateway.md's "In front of a remote API" example: (the openssl command, the YAML, the
    curl command), each as the doc writes it."""
    with open(DOCS) as f:
        text = f.read()
    section = text[text.index("## In front of a remote API"):text.index("## TLS at the edge")]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)

    def command(block, start):
        joined = block.replace("\\\n", " ")
        line = next(ln for ln in joined.splitlines() if ln.lstrip().startswith(start))
        return line.split("#")[0].strip()
    sh = [b for kind, b in blocks if kind == "sh"]
    yaml = next(b for kind, b in blocks if kind == "yaml" and b.startswith("# egress/gateway.yaml"))
    return (command(next(b for b in sh if "openssl req" in b), "openssl req"), yaml,
            command(next(b for b in sh if "curl -si" in b), "curl -si"))


@test
def the_docs_egress_example_works_as_written(ctx):
    """The example a newcomer pastes: its openssl command, its provider-sim flags, its config (only
    the ports changed to free ones) and its request, sent twice; then without ca_file."""
    import provider
    import shlex
    openssl, yaml, curl = egress_example()
    work = tempfile.mkdtemp(prefix="idem-egress-", dir=ctx.dir)
    p = subprocess.run(openssl, shell=True, cwd=work, capture_output=True, text=True, timeout=30)
    expect(p.returncode == 0, "the doc's openssl command: %s" % p.stderr)
    sim = provider.Provider(args=["--tls-cert", os.path.join(work, "sim.pem"),
                                  "--tls-key", os.path.join(work, "sim.key")],
                            ca_file=os.path.join(work, "sim.pem"))
    sim.start()
    argv = shlex.split(curl)
    headers = {argv[i + 1].split(":")[0]: argv[i + 1].split(":", 1)[1].strip()
               for i in range(len(argv) - 1) if argv[i] == "-H"}
    body = argv[argv.index("-d") + 1]
    expect("127.0.0.1:8443" in yaml and "127.0.0.1:8280" in yaml and "127.0.0.1:8281" in yaml,
           "the doc's ports, as the test replaces them:\n" + yaml)
    yaml = (yaml.replace("127.0.0.1:8443", "127.0.0.1:%d" % sim.port)
            .replace("127.0.0.1:8280", "127.0.0.1:0").replace("127.0.0.1:8281", "127.0.0.1:0"))
    gw = gw2 = None
    try:
        gw = Gateway(sim, name="gateway-egress-doc")
        shutil.copyfile(os.path.join(work, "sim.pem"), os.path.join(gw.tmpdir, "sim.pem"))
        with open(gw.config_path, "w") as f:
            f.write(yaml)
        c = subprocess.run([GATEWAY, "check-config", "--config", gw.config_path],
                           capture_output=True, text=True, timeout=20)
        expect(c.returncode == 0 and "ok (1 route)" in c.stdout,
               "check-config of the doc's config: %d %r %r" % (c.returncode, c.stdout, c.stderr))
        gw.start()
        a = gw.request("POST", "/v1/emails", body, headers=headers, principal=None)
        b = gw.request("POST", "/v1/emails", body, headers=headers, principal=None)
        expect(a.status == 201 and b.status == 201 and a.body == b.body and
               b.headers.get("Idempotent-Replayed") == "true",
               "the doc's request, then again: %s / %s" % (a.describe(), b.describe()))
        status, doc = sim.call("GET", "/v1/emails?idempotency_key=" + headers["Idempotency-Key"])
        expect(status == 200 and len(doc["data"]) == 1, "provider-sim's emails: %r" % doc)
        gw.close()
        # Without ca_file: nothing is sent, and the log says why.
        gw2 = Gateway(sim, name="gateway-egress-doc-noca")
        with open(gw2.config_path, "w") as f:
            f.write("".join(ln for ln in yaml.splitlines(True)
                            if "tls:" not in ln and "ca_file:" not in ln))
        gw2.start()
        h = dict(headers, **{"Idempotency-Key": "welcome-ada-2"})
        r = gw2.request("POST", "/v1/emails", body, headers=h, principal=None)
        expect(r.status == 502 and r.json().get("code") == "upstream-unavailable",
               "without ca_file: %s" % r.describe())
        expect("certificate verify failed: self-signed certificate" in stderr_of(gw2),
               "the log says why:\n" + stderr_of(gw2)[-2000:])
        status, doc = sim.call("GET", "/v1/emails?idempotency_key=welcome-ada-2")
        expect(status == 200 and doc["data"] == [], "nothing sent without ca_file: %r" % doc)
    finally:
        for g in (gw, gw2):
            if g is not None:
                g.close()
        sim.close()


if __name__ == "__main__":
    harness.run("gateway-tls", setup=Setup)
