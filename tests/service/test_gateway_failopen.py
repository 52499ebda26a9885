#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_gateway_failopen.py - idem-gateway never lets a request the upstream runs as a keyed write
slip past unkeyed, over real HTTP on loopback, in front of the counting upstream of
gateway_harness.py (which does not dedupe, so a second execution shows):

  - a path an upstream router reads as a keyed route's (trailing '/', any case, "//", dot segments,
    ";params", ".json", %2F) is keyed: one execution per key, forwarded as sent; without a key it
    is refused, not passed;
  - a request target with a byte outside RFC 3986 is refused, nothing forwarded;
  - a method override from any source (headers, `_method` in the query, a form or a JSON body,
    compressed or not), in any spelling, on a path a route covers is refused; Express with
    method-override, the documented upstream, runs each variant when sent to it, never through;
  - the query string is part of the fingerprint (a changed `?amount=` is 422), unless the route
    says `fingerprint_query: false`;
  - the upstream gets the key the gateway used, in its canonical form, never the client's own;
  - a reconcile query carries the fixed header set, not the retry's other headers;
  - a principal header is trimmed, cannot claim another source's space, and is not hop-by-hop;
  - a scope header's value is trimmed (one account however padded), no header the gateway
    reads (principal, key, scope, override, Content-Type, Content-Encoding) may be named in
    Connection, nor sent also under a name with '_' for '-';
  - the admin API refuses web pages (Origin, a Host not loopback) and resolutions that are not
    JSON or are 1xx or 5xx (the CLI too), can require a bearer token, and a listener off loopback is warned about;
  - an upstream connection that carried bytes nobody asked for is not reused, and keyed requests
    can have connections of their own.
"""

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import types
import uuid
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import expect_eq, expect_fresh, expect_problem, expect_replay, test  # noqa: E402
from gateway_harness import DEFAULT_ROUTES, Gateway, HandUpstream, Upstream, expect  # noqa: E402

ROUTES = DEFAULT_ROUTES + """
  - match: PUT /v1/things/{id}
    operation: things.put
  - match: POST /v1/tenant/{id}/refunds
    operation: tenant.refunds
    on_unknown: {reconcile: "GET /lookup?key={key}", headers: [X-Api-Version]}
  - match: POST /v1/charges
    operation: charges.create
    scope_headers: [Stripe-Account]
  - match: POST /v1/search
    operation: search.create
    fingerprint_query: false
  - match: POST /v1/quoted
    operation: quoted.create
    key: {forward: sf-string}
"""


def key(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def setup():
    up = Upstream()
    gw = Gateway(up, routes=ROUTES)
    gw.start()
    return {"up": up, "gw": gw}


def teardown(ctx):
    if ctx:
        ctx["gw"].close()
        ctx["up"].close()


def raw_request(gw, request_line, headers=(), body=b""):
    """Sends `request_line` (bytes, as is) with `headers` (values as sent, white space and all),
    reads one answer: a harness.Response."""
    head = request_line + b"\r\nHost: gw\r\nX-Consumer-Id: alice\r\n"
    for name, value in headers:
        head += ("%s:%s\r\n" % (name, value if value[:1] in (" ", "\t") else " " + value)).encode()
    if not any(name.lower() == "transfer-encoding" for name, _ in headers):
        head += b"Content-Length: %d\r\n" % len(body)
    head += b"Connection: close\r\n\r\n"
    data = harness.exchange_to_eof(socket.create_connection((gw.host, gw.port), timeout=30),
                                   head + body)
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    import email.message
    msg = email.message.Message()
    for line in lines[1:]:
        name, _, value = line.partition(":")
        msg[name.strip()] = value.strip()
    return harness.Response(status, msg, rest, 0.0)


# ---- paths -----------------------------------------------------------------------------------

@test
def paths_a_lenient_router_runs_as_a_keyed_route_are_keyed(ctx):
    gw, up = ctx["gw"], ctx["up"]
    # Each runs the POST /v1/things handler in Express, Rails, Spring, Flask or ASP.NET Core.
    for path in ("/v1/things/", "/V1/THINGS", "/v1//things", "/v1/./things", "/v1/x/../things",
                 "/v1/%2e/things", "/v1/things;jsessionid=1", "/v1/things.json", "/v1%2Fthings"):
        k = key("path")
        first = gw.request("POST", path, {"p": path}, key=k)
        expect_fresh(first, 201, "%s, first" % path)
        expect_eq(up.last_request()["path"], path, "%s: forwarded as sent" % path)
        expect_replay(gw.request("POST", path, {"p": path}, key=k), first, "%s, a retry" % path)
        # The same key on the route's own path is the same record: the same request again.
        expect_replay(gw.request("POST", "/v1/things", {"p": path}, key=k), first,
                      "%s, a retry on /v1/things" % path)
        expect_eq(up.executions(k), 1, "%s: executions" % path)
        before = up.count
        expect_problem(gw.request("POST", path, {"p": path}), 400, "idempotency-key-missing",
                       "%s without a key" % path)
        expect_eq(up.count, before, "%s without a key: nothing forwarded" % path)


@test
def a_slash_encoded_in_a_path_value_stays_in_it(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("enc")
    path = "/v1/orders/a%2Fb/refunds/"
    first = gw.request("POST", path, {"n": 1}, key=k)
    expect_fresh(first, 201, "a refund for order a/b")
    expect_eq(up.last_request()["path"], path, "forwarded as sent")
    expect_replay(gw.request("POST", "/v1/orders/a%2fb/refunds", {"n": 1}, key=k), first,
                  "the same order, written otherwise")
    # Another order is another request: the key reused for it is a mismatch, not a replay.
    expect_problem(gw.request("POST", "/v1/orders/a/refunds", {"n": 1}, key=k), 422,
                   "idempotency-key-reused", "the key for order a")
    expect_eq(up.executions(k), 1, "executions")


@test
def a_target_with_bytes_outside_rfc_3986_is_refused(ctx):
    gw, up = ctx["gw"], ctx["up"]
    before = up.count
    for target in (b"/v1/things\t/x", b"/v1/things\x0c", b"/v1/th\x80ings", b"/v1/things?\xff",
                   b"/v1/things?a=<b>", b"/v1/{things}", b"/v1/things|x", b"/v1/things%zz",
                   b"/v1/things%2", b"/v1/things#x", b"/v1/things\\x"):
        r = raw_request(gw, b"POST " + target + b" HTTP/1.1", [("Idempotency-Key", key())],
                        b'{"n": 1}')
        expect_problem(r, 400, "bad-request", "target %r" % target)
        expect("RFC 3986" in r.json().get("detail", ""), "the detail names RFC 3986: %s"
               % r.describe(300))
    expect_eq(up.count, before, "nothing forwarded")
    # What RFC 3986 allows, and brackets in a query as browsers send them, go through.
    r = raw_request(gw, b"GET /v2/else/a-b._~!$&'()*+,;=:@?q=a[]&r=%20/? HTTP/1.1")
    expect_eq(r.status, 200, "every byte RFC 3986 allows: %s" % r.describe(300))
    expect_eq(up.last_request()["path"], "/v2/else/a-b._~!$&'()*+,;=:@?q=a[]&r=%20/?",
              "forwarded as sent")


# ---- method overrides ------------------------------------------------------------------------

@test
def a_method_override_onto_a_keyed_route_is_refused(ctx):
    gw, up = ctx["gw"], ctx["up"]
    before = up.count
    cases = [
        ("/v1/things/7", {"X-HTTP-Method-Override": "PUT"}, None, "X-HTTP-Method-Override"),
        ("/v1/things/7", {"X-HTTP-Method": "put"}, None, "X-HTTP-Method"),
        ("/v1/things/7", {"X-Method-Override": "PUT"}, None, "X-Method-Override"),
        ("/v1/things/7?_method=put", {}, None, "_method query argument"),
        ("/v1/things/7/", {}, "a=1&_method=PUT", "_method form field"),
        ("/v1/things/7", {}, "_method=P%55T", "_method form field"),
        # The request's own route is keyed: it would be keyed as what it is not.
        ("/v1/things", {"X-HTTP-Method-Override": "DELETE"}, None, "X-HTTP-Method-Override"),
    ]
    for path, headers, form, how in cases:
        h = dict(headers)
        body = {"n": 1}
        if form is not None:
            h["Content-Type"] = "application/x-www-form-urlencoded"
            body = form
        r = gw.request("POST", path, body, key=key(), headers=h)
        expect_problem(r, 400, "method-override-refused", "POST %s with %s" % (path, how))
        expect(how in r.json()["detail"], "the detail names %s: %s" % (how, r.describe(300)))
    expect_eq(up.count, before, "nothing forwarded")
    # An override naming the request's own method, or on a path no route keys, changes nothing.
    k = key("same")
    r = gw.request("POST", "/v1/things", {"n": 1}, key=k,
                   headers={"X-HTTP-Method-Override": "post"})
    expect_fresh(r, 201, "an override to the method itself")
    r = gw.request("POST", "/v2/else", {"n": 1}, headers={"X-HTTP-Method-Override": "PUT"})
    expect_eq(r.status, 201, "an override on an unrouted path is passed through")


# Each asks to run a POST as PUT in a way some framework honours (those marked [express], the
# Express upstream below): a value not trimmed or a list, a source behind one that names the
# method itself, a duplicate, a field name encoded or mangled, a JSON or compressed body.
# (what, query, header fields, body)
OVERRIDE_VARIANTS = [
    ("a header, trailing white space [express]", b"", [("X-HTTP-Method-Override", "PUT \t")], b""),
    ("a header's list, PUT first [express]", b"", [("X-HTTP-Method-Override", "PUT, POST")], b""),
    ("a header's list, PUT second", b"", [("X-HTTP-Method-Override", "POST,PUT")], b""),
    ("a header's name with '_' (CGI, PHP, Rack)", b"", [("X_HTTP_Method_Override", "PUT")], b""),
    ("a second header field", b"", [("X-HTTP-Method-Override", "POST"),
                                    ("X-HTTP-Method-Override", "PUT")], b""),
    ("the method itself in a header, PUT in the query [express]", b"?_method=PUT",
     [("X-HTTP-Method-Override", "POST")], b""),
    ("a second query argument", b"?_method=POST&_method=PUT", [], b""),
    ("a form field name encoded [express]", b"", [("Content-Type", "application/x-www-form-urlencoded")],
     b"%5Fmethod=PUT"),
    ("a form field name partly encoded [express]", b"",
     [("Content-Type", "application/x-www-form-urlencoded")], b"_%6Dethod=PUT"),
    ("a form array [express]", b"", [("Content-Type", "application/x-www-form-urlencoded")],
     b"_method[]=PUT"),
    ("PHP's .method", b"", [("Content-Type", "application/x-www-form-urlencoded")],
     b".method=PUT"),
    ("PHP's space method", b"", [("Content-Type", "application/x-www-form-urlencoded")],
     b"+method=PUT"),
    ("a form with no Content-Type (Rack)", b"", [], b"_method=PUT"),
    ("a second form field", b"", [("Content-Type", "application/x-www-form-urlencoded")],
     b"_method=POST&_method=PUT"),
    ("a JSON body [express]", b"", [("Content-Type", "application/json")], b'{"_method": "PUT"}'),
    ("a gzip form [express]", b"", [("Content-Type", "application/x-www-form-urlencoded"),
                          ("Content-Encoding", "gzip")], gzip.compress(b"_method=PUT")),
    ("a gzip JSON body [express]", b"", [("Content-Type", "application/json"),
                               ("Content-Encoding", "gzip")], gzip.compress(b'{"_method":"PUT"}')),
    ("a deflate form [express]", b"", [("Content-Type", "application/x-www-form-urlencoded"),
                             ("Content-Encoding", "deflate")], zlib.compress(b"_method=PUT")),
]


@test
def every_override_source_and_spelling_is_refused(ctx):
    gw, up = ctx["gw"], ctx["up"]
    before = up.count
    for what, query, headers, body in OVERRIDE_VARIANTS:
        for path in (b"/v1/things/7", b"/v1/things"):  # onto a keyed PUT; away from a keyed POST
            r = raw_request(gw, b"POST " + path + query + b" HTTP/1.1",
                            headers + [("Idempotency-Key", key())], body)
            expect_problem(r, 400, "method-override-refused", "%s, POST %s" % (what, path))
    expect_eq(up.count, before, "nothing forwarded")
    # A body the gateway cannot read on such a path is refused; a body it can, without an
    # override, goes on.
    r = raw_request(gw, b"POST /v1/things/7 HTTP/1.1",
                    [("Content-Type", "application/x-www-form-urlencoded"),
                     ("Content-Encoding", "br")], b"\x0b\x05\x80_method=PUT\x03")
    expect_problem(r, 415, "unsupported-media-type", "an unknown Content-Encoding")
    expect_eq(up.count, before, "nothing forwarded")
    r = raw_request(gw, b"POST /v1/things/7 HTTP/1.1",
                    [("Content-Type", "application/x-www-form-urlencoded"),
                     ("Content-Encoding", "gzip")], gzip.compress(b"a=1&b=POST"))
    expect_eq(r.status, 201, "a gzip form without an override: %s" % r.describe(200))
    # The same on a path no route covers: passed on as sent.
    r = raw_request(gw, b"POST /v2/else HTTP/1.1", [("Content-Encoding", "br")], b"xyz")
    expect_eq(r.status, 201, "an unknown coding on an unrouted path: %s" % r.describe(200))


class ExpressUpstream:
    """tests/service/clients/express_override.js: Express with method-override, as documented."""

    def __init__(self):
        node, npm = shutil.which("node"), shutil.which("npm")
        if node is None or npm is None:
            harness.fail("node and npm are needed (scripts/deps.sh)")
        root = subprocess.run([npm, "root", "-g"], capture_output=True, timeout=60,
                              text=True).stdout.strip()
        for pkg in ("express", "method-override"):
            if not os.path.isdir(os.path.join(root, pkg)):
                harness.fail("the %s npm package is needed in %s: run scripts/deps.sh" % (pkg, root))
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clients",
                              "express_override.js")
        self.proc = subprocess.Popen([node, script], stdout=subprocess.PIPE,
                                     env=dict(os.environ, NODE_PATH=root))
        line = self.proc.stdout.readline().decode()
        if not line.startswith("port "):
            self.close()
            harness.fail("the Express upstream did not start: %r" % line)
        self.host, self.port = "127.0.0.1", int(line.split()[1])
        self.url = "http://127.0.0.1:%d" % self.port

    def runs(self, order):
        r = raw_request(self, b"GET /runs/" + order.encode() + b" HTTP/1.1")
        return r.json()["runs"]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@test
def express_with_method_override_never_runs_a_keyed_put_unkeyed(ctx):
    ex = ExpressUpstream()
    gw = Gateway(ex, name="gateway-express", routes="""
  - match: PUT /v1/orders/{order_id}
    operation: orders.put
""")
    try:
        gw.start()
        # Through the gateway, a keyed PUT runs once and is replayed.
        k = key("put")
        first = gw.request("PUT", "/v1/orders/o-keyed", {"n": 1}, key=k)
        expect_fresh(first, 201, "a keyed PUT")
        expect_replay(gw.request("PUT", "/v1/orders/o-keyed", {"n": 1}, key=k), first, "its retry")
        expect_eq(ex.runs("o-keyed"), 1, "the PUT handler's runs")
        for i, (what, query, headers, body) in enumerate(OVERRIDE_VARIANTS):
            if "[express]" not in what:
                continue
            order = "o%d" % i
            line = b"POST /v1/orders/" + order.encode() + query + b" HTTP/1.1"
            # Sent to Express itself, each runs the PUT handler: the variant is real.
            r = raw_request(ex, line, headers, body)
            expect_eq((r.status, r.json().get("ran")), (201, "PUT"),
                      "%s, straight to Express: %s" % (what, r.describe(200)))
            # Through the gateway, without a key, it is refused and never reaches Express.
            for attempt in range(2):
                r = raw_request(gw, line, headers, body)
                expect_problem(r, 400, "method-override-refused",
                               "%s through the gateway, attempt %d" % (what, attempt + 1))
            expect_eq(ex.runs(order), 1, "%s: the PUT handler ran only when sent to it" % what)
        # A plain POST to the same path is no PUT: passed through, unkeyed, as the upstream's.
        r = gw.request("POST", "/v1/orders/o-post", {"n": 1})
        expect_eq((r.status, r.json().get("ran")), (200, "POST"), "a plain POST")
    finally:
        gw.close()
        ex.close()


@test
def method_override_headers_are_configurable(ctx):
    up = ctx["up"]
    gw = Gateway(up, routes=ROUTES, extra="method_override_headers: [X-Verb]\n",
                 name="gateway-override")
    try:
        gw.start()
        r = gw.request("POST", "/v1/things/7", {"n": 1}, key=key(), headers={"X-Verb": "PUT"})
        expect_problem(r, 400, "method-override-refused", "the configured header")
        before = up.count
        r = gw.request("POST", "/v1/things/7", {"n": 1},
                       headers={"X-HTTP-Method-Override": "PUT"})
        expect_eq(r.status, 201, "a default header no longer listed is passed on")
        expect_eq(up.count, before + 1, "forwarded")
    finally:
        gw.close()


@test
def a_header_any_connection_field_lists_is_not_forwarded(ctx):
    # Connection may come as several fields; a header the second one names is hop-by-hop too.
    up, gw = ctx["up"], ctx["gw"]
    r = raw_request(gw, b"POST /v2/else HTTP/1.1",
                    [("Connection", "keep-alive"), ("Connection", "X-Secret"), ("X-Secret", "s"),
                     ("X-Kept", "k")], b"{}x")
    expect_eq(r.status, 201, "passed through")
    hdrs = {k.lower(): v for k, v in up.last_request()["headers"].items()}
    expect("x-secret" not in hdrs and hdrs.get("x-kept") == "k",
           "a header named in the second Connection field is dropped: %s" % hdrs)


# ---- a key on no route -------------------------------------------------------------------------

def unrouted_count(gw):
    for name, _, value in harness.parse_metrics(gw.admin("GET", "/metrics").body.decode()):
        if name == "idem_gateway_unrouted_keys_total":
            return value
    harness.fail("/metrics has no idem_gateway_unrouted_keys_total")


def log_of(gw):
    with open(gw.stderr_path, encoding="utf-8", errors="replace") as f:
        return f.read()


@test
def a_key_sent_where_no_route_reads_it_is_warned_about(ctx):
    # A route typo (POST /tickets for an API at /api/tickets): the key is the clearest sign.
    up, gw = ctx["up"], ctx["gw"]
    before, count = up.count, unrouted_count(gw)
    k = key("typo")
    for _ in range(3):
        r = gw.request("POST", "/api/tickets", {"n": 1}, key=k)
        expect_eq(r.status, 201, "passed through by default")
    expect_eq(up.count, before + 3, "and so run three times: what the warning is about")
    expect_eq(unrouted_count(gw), count + 3, "each counted in /metrics")
    gw.request("POST", "/api/tickets/2", {"n": 1}, key=k)
    gw.request("GET", "/api/tickets", key=k)  # a read with a key is not a typo's sign
    gw.request("POST", "/api/other", {"n": 1})  # nor a write without one

    def warnings():  # this test's paths (the gateway is shared with the tests before it)
        return [ln for ln in log_of(gw).splitlines() if "no route takes it" in ln and "/api/" in ln]
    harness.wait_until("the warnings in the log", lambda: len(warnings()) >= 2, describe=log_of)
    lines = warnings()
    expect_eq(len([ln for ln in lines if "POST /api/tickets " in ln]), 1,
              "one warning per method and path, not one per request: %s" % lines)
    expect(any("POST /api/tickets/2 " in ln for ln in lines), "another path, its own: %s" % lines)
    expect(all("POST /v1/things" in ln and "Idempotency-Key" in ln for ln in lines),
           "naming the key header and the routes there are: %s" % lines)
    expect_eq(len(lines), 2, "no warning for the read or the request without a key: %s" % lines)
    expect_eq(unrouted_count(gw), count + 4, "the read and the keyless write are not counted")


@test
def unrouted_keys_refuse_turns_such_a_request_away(ctx):
    up = ctx["up"]
    gw = Gateway(up, routes=ROUTES, extra="unrouted_keys: refuse\n", name="gateway-unrouted")
    try:
        gw.start()
        before = up.count
        r = gw.request("POST", "/api/tickets", {"n": 1}, key=key("typo"))
        expect_problem(r, 400, "idempotency-key-unrouted", "a key no route reads")
        detail = json.loads(r.body)["detail"]
        expect("POST /v1/things" in detail and "Idempotency-Key" in detail,
               "the problem names the header and the routes: %r" % detail)
        expect_eq(up.count, before, "nothing forwarded")
        r = gw.request("POST", "/api/tickets", {"n": 1})
        expect_eq(r.status, 201, "a request without a key is passed through as always")
        r = gw.request("POST", "/v1/things", {"n": 1}, key=key())
        expect_eq(r.status, 201, "a routed request is keyed as always")
    finally:
        gw.close()


# ---- the query in the fingerprint ------------------------------------------------------------

@test
def a_retry_with_another_query_is_another_request(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("query")
    first = gw.request("POST", "/v1/things?amount=100", {"n": 1}, key=k)
    expect_fresh(first, 201, "?amount=100")
    expect_replay(gw.request("POST", "/v1/things?amount=100", {"n": 1}, key=k), first,
                  "the same query again")
    for target in ("/v1/things?amount=999", "/v1/things", "/v1/things?amount=100&x=1"):
        r = gw.request("POST", target, {"n": 1}, key=k)
        expect_problem(r, 422, "idempotency-key-reused", "the retry sent to %s" % target)
    expect_eq(up.executions(k), 1, "executions")
    # Without a query, a retry is a replay as ever (a bare '?' is no query).
    k = key("noquery")
    first = gw.request("POST", "/v1/things", {"n": 1}, key=k)
    expect_fresh(first, 201, "no query")
    expect_replay(gw.request("POST", "/v1/things?", {"n": 1}, key=k), first, "a bare '?'")
    # A route with fingerprint_query: false leaves it out.
    k = key("search")
    first = gw.request("POST", "/v1/search?page=1", {"n": 1}, key=k)
    expect_fresh(first, 201, "?page=1")
    expect_replay(gw.request("POST", "/v1/search?page=2", {"n": 1}, key=k), first,
                  "?page=2 with fingerprint_query: false")
    expect_eq(up.executions(k), 1, "executions")


# ---- the key the upstream sees ---------------------------------------------------------------

@test
def the_upstream_gets_the_key_the_gateway_used_in_one_form(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("form")
    # A token and the sf-string of it are one key to the gateway, and one to the upstream.
    first = gw.request("POST", "/v1/resend", {"n": 1}, key=k, headers={"X-Test-Mode": "reset"})
    expect_problem(first, 502, "outcome-unknown", "reset after acting")
    sent = up.last_request()["headers"].get("Idempotency-Key")
    r = gw.request("POST", "/v1/resend", {"n": 1}, key='"%s"' % k)
    expect_eq(r.status, 201, "the retry, its key written as an sf-string, is sent again")
    again = up.last_request()["headers"].get("Idempotency-Key")
    expect_eq((sent, again), (k, k), "the key as the upstream got it, twice: bare, as sent")
    # A key that reads back as another bare (a space, a comma) goes as an sf-string, every time.
    for odd in ('"%s x"' % key("space"), '"%s,x"' % key("comma")):
        expect_eq(gw.request("POST", "/v1/things", {"n": 1}, key=odd).status, 201, odd)
        expect_eq(up.last_request()["headers"].get("Idempotency-Key"), odd,
                  "a key that is no bare token, quoted")
    # key.forward: sf-string quotes every key, however the client wrote it.
    bare, quoted = key("quoted"), key("quoted")
    for written, k2 in ((bare, bare), ('"%s"' % quoted, quoted)):
        expect_eq(gw.request("POST", "/v1/quoted", {"n": 1}, key=written).status, 201, "quoted")
        expect_eq(up.last_request()["headers"].get("Idempotency-Key"), '"%s"' % k2,
                  "key.forward: sf-string, the key written %s" % written)
    # A route whose key is in the body: the client's own Idempotency-Key header never goes on.
    bk = key("body")
    r = gw.request("POST", "/v1/bodykey", {"requestId": bk}, headers={"Idempotency-Key": "other"})
    expect_eq(r.status, 201, "body-keyed")
    keys = [v for n, v in up.last_request()["headers"].items() if n.lower() == "idempotency-key"]
    expect_eq(keys, ['"%s"' % bk], "the Idempotency-Key fields the upstream got")


# ---- reconcile -------------------------------------------------------------------------------

@test
def a_reconcile_query_carries_the_fixed_header_set(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("rec")
    r = gw.request("POST", "/v1/tenant/t1/refunds", {"n": 1}, key=k,
                   headers={"X-Test-Mode": "reset", "X-Api-Version": "2"})
    expect_problem(r, 502, "outcome-unknown", "reset after acting")
    n = len(up.lookup_headers)
    r = gw.request("POST", "/v1/tenant/t1/refunds", {"n": 1}, key=k,
                   headers={"X-Api-Version": "2", "X-Tenant": "someone-else",
                            "Authorization": "Bearer t", "Accept-Language": "fr"})
    expect(r.status == 200 and r.replayed, "reconciled: %s" % r.describe(300))
    expect_eq(len(up.lookup_headers) - n, 1, "reconcile queries")
    # Connection is the gateway's own: the query goes on a connection closed after its answer.
    got = {name.lower() for name in up.lookup_headers[-1]}
    expect_eq(got, {"host", "authorization", "x-consumer-id", "x-api-version", "x-forwarded-for",
                    "idempotency-key", "connection"}, "the header fields of the reconcile query")
    expect_eq(up.executions(k), 1, "executions")



# ---- principals ------------------------------------------------------------------------------

@test
def a_principal_is_one_caller_however_it_is_sent(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("who")
    first = gw.request("POST", "/v1/things", {"n": 1}, key=k, principal="bob")
    expect_fresh(first, 201, "bob")
    # White space around the value is not part of it: the same caller, a replay.
    expect_replay(gw.request("POST", "/v1/things", {"n": 1}, key=k, principal="bob \t"), first,
                  "bob with trailing white space")
    # Another source's principal cannot be claimed through the header.
    r = gw.request("POST", "/v1/things", {"n": 1}, key=k, principal="jwt:bob")
    expect_problem(r, 401, "unauthorized", "a header value in the jwt: space")
    # The caller's header named in Connection would be dropped upstream: refused.
    before = up.count
    r = gw.request("POST", "/v1/things", {"n": 1}, key=key(), principal="bob",
                   headers={"Connection": "X-Consumer-Id"})
    expect_problem(r, 400, "bad-request", "the principal's header named in Connection")
    expect_eq(up.count, before, "nothing forwarded")
    expect_eq(up.executions(k), 1, "executions")


# ---- scope headers and Connection ------------------------------------------------------------

@test
def a_scope_header_is_one_account_however_it_is_padded(ctx):
    gw, up = ctx["gw"], ctx["up"]
    k = key("acct")
    json_body = [("Content-Type", "application/json"), ("Idempotency-Key", k)]
    first = raw_request(gw, b"POST /v1/charges HTTP/1.1",
                        json_body + [("Stripe-Account", "acct_1")], b'{"n": 1}')
    expect_fresh(first, 201, "acct_1")
    # White space around a header's value is not part of it (RFC 9110): one account, a replay.
    for value in ("acct_1 ", "acct_1\t", " \tacct_1 \t"):
        r = raw_request(gw, b"POST /v1/charges HTTP/1.1",
                        json_body + [("Stripe-Account", value)], b'{"n": 1}')
        expect_replay(r, first, "Stripe-Account %r" % value)
    # The key's value likewise (the principal's: a_principal_is_one_caller_however_it_is_sent).
    r = raw_request(gw, b"POST /v1/charges HTTP/1.1",
                    [("Content-Type", "application/json"), ("Idempotency-Key", " %s\t" % k),
                     ("Stripe-Account", "acct_1")], b'{"n": 1}')
    expect_replay(r, first, "the key padded with white space")
    expect_eq(up.executions(k), 1, "executions for acct_1")
    # Another account is another scope: it runs.
    r = raw_request(gw, b"POST /v1/charges HTTP/1.1", json_body + [("Stripe-Account", "acct_2")],
                    b'{"n": 1}')
    expect_fresh(r, 201, "acct_2")


@test
def an_authorization_principal_is_one_caller_however_it_is_padded(ctx):
    up = ctx["up"]
    gw = Gateway(up, routes=ROUTES, principal="authorization: sha256", name="gateway-auth-trim")
    try:
        gw.start()
        k = key("auth")
        first = raw_request(gw, b"POST /v1/things HTTP/1.1",
                            [("Content-Type", "application/json"), ("Idempotency-Key", k),
                             ("Authorization", "Bearer sk_test_1")], b'{"n": 1}')
        expect_fresh(first, 201, "Bearer sk_test_1")
        for value in ("Bearer sk_test_1 ", "Bearer sk_test_1\t", " bearer  sk_test_1"):
            r = raw_request(gw, b"POST /v1/things HTTP/1.1",
                            [("Content-Type", "application/json"), ("Idempotency-Key", k),
                             ("Authorization", value)], b'{"n": 1}')
            expect_replay(r, first, "Authorization %r" % value)
        expect_eq(up.executions(k), 1, "executions")
        r = raw_request(gw, b"POST /v1/things HTTP/1.1",
                        [("Content-Type", "application/json"), ("Idempotency-Key", key()),
                         ("Authorization", "Bearer sk_test_1"), ("Connection", "Authorization")],
                        b'{"n": 1}')
        expect_problem(r, 400, "bad-request", "Authorization named in Connection")
    finally:
        gw.close()


@test
def a_header_the_gateway_reads_may_not_be_named_in_connection(ctx):
    gw, up = ctx["gw"], ctx["up"]
    before = up.count
    # A proxy on the way drops what Connection names: the upstream would act as the platform (no
    # Stripe-Account), without the override or the body's type the gateway judged, while the
    # record is kept under what the gateway read.
    for listed in ("Stripe-Account", "stripe-account, keep-alive", "Idempotency-Key",
                   "X-Consumer-Id", "X-HTTP-Method-Override", "Content-Type", "Content-Encoding"):
        r = raw_request(gw, b"POST /v1/charges HTTP/1.1",
                        [("Content-Type", "application/json"), ("Idempotency-Key", key()),
                         ("Stripe-Account", "acct_9"), ("X-HTTP-Method-Override", "POST"),
                         ("Connection", listed)], b'{"n": 1}')
        expect_problem(r, 400, "bad-request", "Connection: %s" % listed)
        expect(listed.split(",")[0].lower() in r.json()["detail"].lower(),
               "the detail names %s: %s" % (listed, r.describe(300)))
    expect_eq(up.count, before, "nothing forwarded")
    # CGI, PHP and Rack read Stripe_Account as Stripe-Account: the upstream could act for acct_9
    # while the gateway keys the platform (or acct_1).
    for fields in ([("Stripe_Account", "acct_9")],
                   [("Stripe-Account", "acct_1"), ("stripe_account", "acct_9")]):
        r = raw_request(gw, b"POST /v1/charges HTTP/1.1",
                        [("Content-Type", "application/json"), ("Idempotency-Key", key())] + fields,
                        b'{"n": 1}')
        expect_problem(r, 400, "bad-request", "%s" % fields)
    expect_eq(up.count, before, "nothing forwarded")
    # Connection naming anything else is as it was.
    r = raw_request(gw, b"POST /v1/charges HTTP/1.1",
                    [("Content-Type", "application/json"), ("Idempotency-Key", key()),
                     ("Stripe-Account", "acct_9"), ("Connection", "X-Trace")], b'{"n": 1}')
    expect_fresh(r, 201, "Connection: X-Trace")


# ---- what passes through ---------------------------------------------------------------------

@test
def a_head_answer_keeps_the_length_it_announces(ctx):
    gw = ctx["gw"]
    path = "/v2/files/report"
    r = raw_request(gw, b"HEAD " + path.encode() + b" HTTP/1.1")
    expect_eq(r.status, 200, "HEAD passed through")
    expect_eq(r.header("Content-Length"), str(len(json.dumps({"path": path}))),
              "the upstream's Content-Length, not the empty body's")
    expect_eq(r.body, b"", "no body")


@test
def connect_and_unknown_transfer_codings_are_refused(ctx):
    gw, up = ctx["gw"], ctx["up"]
    before = up.count
    r = raw_request(gw, b"CONNECT 127.0.0.1:%d HTTP/1.1" % up.port)
    expect(r.status in (405, 501), "CONNECT is not forwarded: %s" % r.describe(300))
    expect_eq(r.header("Content-Type"), "application/problem+json", "a problem")
    body = b"1\r\nx\r\n0\r\n\r\n"
    r = raw_request(gw, b"POST /v2/else HTTP/1.1", [("Transfer-Encoding", "gzip, chunked")],
                    body)
    expect_eq(r.status, 501, "a transfer coding the gateway cannot pass on: %s" % r.describe(300))
    expect_eq(up.count, before, "nothing forwarded")


# ---- the admin API ---------------------------------------------------------------------------

def held_key(gw):
    """A key whose outcome is unknown (the upstream reset after acting): one to resolve."""
    k = key("held")
    expect_problem(gw.request("POST", "/v1/things", {"n": 1}, key=k,
                              headers={"X-Test-Mode": "reset"}), 502, "outcome-unknown", "reset")
    return k


def resolution(k, status=201):
    return json.dumps({"principal": "alice", "operation": "things.create", "key": k,
                       "decision": "executed",
                       "response": {"status": status, "body": '{"id":"by-hand"}'}})


def record_state(gw, k, token=None):
    q = "/records?principal=alice&operation=things.create&key=" + k
    return gw.admin("GET", q, token=token).json()["state"]


@test
def the_admin_api_refuses_web_pages_and_needs_json(ctx):
    gw = ctx["gw"]
    k = held_key(gw)
    # A page in the operator's browser: a cross-site "simple" POST (text/plain, an Origin).
    r = gw.admin("POST", "/records/resolve", resolution(k),
                 headers={"Content-Type": "text/plain", "Origin": "https://evil.example"})
    expect_problem(r, 403, "forbidden", "a cross-site POST")
    r = gw.admin("GET", "/metrics", headers={"Origin": "http://localhost:3000"})
    expect_problem(r, 403, "forbidden", "any Origin, even a GET")
    # A name rebound to 127.0.0.1 (DNS rebinding): the Host is not loopback.
    r = gw.admin("POST", "/records/resolve", resolution(k), headers={"Host": "evil.example"})
    expect_problem(r, 403, "forbidden", "a Host that is not loopback")
    # Without a browser: not JSON is refused before anything changes.
    r = gw.admin("POST", "/records/resolve", resolution(k), headers={"Content-Type": "text/plain"})
    expect_problem(r, 415, "unsupported-media-type", "a resolution that is not JSON")
    expect_eq(record_state(gw, k), "unknown", "none of them resolved the key")
    for host in ("localhost", "127.0.0.1", "127.0.0.1:%d" % gw.admin_port):
        expect_eq(gw.admin("GET", "/healthz", headers={"Host": host}).status, 200, "Host " + host)
    # A 5xx is never stored, so it is never a resolution.
    r = gw.admin("POST", "/records/resolve", resolution(k, 599))
    expect_problem(r, 400, "validation-failed", "a resolution with status 599")
    r = gw.admin("POST", "/records/resolve", resolution(k, 503))
    expect_problem(r, 400, "validation-failed", "a resolution with status 503")
    # A 1xx is no final answer: every retry would get a bare "100 Continue" and wait on.
    for status in (100, 101, 199):
        r = gw.admin("POST", "/records/resolve", resolution(k, status))
        expect_problem(r, 400, "validation-failed", "a resolution with status %d" % status)
    expect_eq(record_state(gw, k), "unknown", "none of them resolved the key")
    p = subprocess.run([gw.program, "keys", "resolve", "--config", gw.config_path,
                        "--principal", "alice", "--operation", "things.create", "--key", k,
                        "--decision", "executed", "--status", "101"],
                       capture_output=True, timeout=30)
    expect(p.returncode == 2 and b"status" in p.stderr,
           "keys resolve --status 101 is refused: %r %r" % (p.returncode, p.stderr))
    expect_eq(gw.admin("POST", "/records/resolve", resolution(k)).status, 200, "a good one")
    expect_eq(record_state(gw, k), "completed", "resolved")


@test
def an_admin_token_file_guards_the_admin_api(ctx):
    up = ctx["up"]
    token = uuid.uuid4().hex
    gw = Gateway(up, routes=ROUTES, name="gateway-admin-token",
                 extra="admin_token_file: admin.token\n")
    with open(os.path.join(gw.tmpdir, "admin.token"), "w") as f:
        f.write(token + "\n")
    try:
        gw.start()
        k = held_key(gw)
        expect_eq(gw.admin("GET", "/healthz").status, 200, "/healthz stays open (liveness probes)")
        for method, path, body in (("GET", "/metrics", None), ("GET", "/readyz", None),
                                   ("POST", "/records/resolve", resolution(k))):
            for t in (None, "wrong-" + token, token.upper() if token != token.upper() else "x"):
                r = gw.admin(method, path, body, token=t)
                expect_problem(r, 401, "unauthorized", "%s %s with token %r" % (method, path, t))
                expect_eq(r.header("WWW-Authenticate"), "Bearer", "the scheme asked for")
        expect_eq(gw.admin("GET", "/metrics", token=token).status, 200, "the right token")
        expect_eq(record_state(gw, k, token), "unknown", "nothing resolved without it")
        expect_eq(gw.admin("POST", "/records/resolve", resolution(k), token=token).status, 200,
                  "resolved with the token")
    finally:
        gw.close()
    # A token file that is too short, or empty: the config is refused, naming the file.
    for text in ("short\n", "\n"):
        bad = Gateway(up, routes=ROUTES, name="gateway-admin-bad",
                      extra="admin_token_file: admin.token\n")
        with open(os.path.join(bad.tmpdir, "admin.token"), "w") as f:
            f.write(text)
        p = subprocess.run([bad.program, "check-config", "--config", bad.config_path,
                            "--no-store"], capture_output=True, timeout=30)
        expect(p.returncode == 2 and b"admin_token_file" in p.stderr and b"at least 16" in
               p.stderr, "a token file holding %r: %r" % (text, p.stderr))
        bad.close()


@test
def an_admin_listener_off_loopback_is_warned_about(ctx):
    up = ctx["up"]
    gw = Gateway(up, routes=ROUTES, name="gateway-admin-open")
    with open(gw.config_path) as f:
        text = f.read().replace("admin_listen: 127.0.0.1:0", "admin_listen: 0.0.0.0:0")
    with open(gw.config_path, "w") as f:
        f.write(text)
    try:
        p = subprocess.run([gw.program, "check-config", "--config", gw.config_path, "--no-store"],
                           capture_output=True, timeout=30)
        expect(p.returncode == 0 and b"warning: admin_listen 0.0.0.0:0 is not on loopback" in
               p.stderr and b"anyone who reaches it" in p.stderr,
               "check-config warns, and still says ok: %r %r" % (p.stdout, p.stderr))
    finally:
        gw.close()


# ---- upstream connections --------------------------------------------------------------------

class RawUpstream(HandUpstream):
    """
    An upstream that speaks HTTP/1.1 by hand, to misbehave as some do.  Every request is answered
    200 {"conn": C, "path": P} (C numbers the connections it accepted).  After a request to a path
    ending in /trail it sends a second, unasked answer in the same write.  A request to /early is
    answered as soon as its head is in, and its body is read as the next request (an upstream that
    answers before reading the body): the answer to that hidden request is held until more bytes
    come on the connection, then sent before anything else.
    """

    def __init__(self):
        super().__init__()
        self.seen = []  # (connection, path) of every request read

    @staticmethod
    def _answer(conn, path):
        body = json.dumps({"conn": conn, "path": path}).encode()
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body), body)

    def _serve(self, c, n):
        buf, held = b"", None
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    piece = c.recv(65536)
                    if not piece:
                        return
                    if held is not None:
                        c.sendall(held)
                        held = None
                    buf += piece
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                with self.lock:
                    self.seen.append((n, path))
                answer = self._answer(n, path)
                if path == "/early":
                    c.sendall(answer)  # the body stays unread: it is the next "request"
                    continue
                buf = self._past_body(c, buf, length)
                if buf is None:
                    return
                if path == "/hidden":
                    held = answer
                elif path.endswith("/trail"):
                    c.sendall(answer + self._answer(n, "/unasked"))
                else:
                    c.sendall(answer)
        except OSError:
            return
        finally:
            c.close()



@test
def a_connection_with_bytes_after_its_answer_is_not_reused(ctx):
    up = RawUpstream()
    gw = Gateway(up, routes=ROUTES, name="gateway-trail", args=["--http-threads", "1"])
    try:
        gw.start()
        for path in ("/v2/a/trail", "/v1/things"):  # passed through, then keyed
            k = None if path.startswith("/v2") else key("trail")
            r = gw.request("POST", path, {"n": 1}, key=k)
            expect_eq(r.status, 200, "%s: %s" % (path, r.describe(200)))
            expect_eq(r.json()["path"], path, "%s: its own answer" % path)
            conn = r.json()["conn"]
            r = gw.request("POST", "/v2/next", {"n": 2})
            expect_eq(r.json()["path"], "/v2/next", "the next request's own answer")
            expect(r.json()["conn"] != conn or not path.endswith("/trail"),
                   "after %s, the next request on a new connection: %s" % (path, r.describe(200)))
        # Without stray bytes, a connection is reused (the check above is not vacuous).
        a = gw.request("POST", "/v2/one", {"n": 1}).json()["conn"]
        b = gw.request("POST", "/v2/two", {"n": 1}).json()["conn"]
        expect_eq(a, b, "a clean connection is reused")
    finally:
        gw.close()
        up.close()


@test
def keyed_connections_fresh_keeps_a_hidden_answer_from_a_keyed_request(ctx):
    # An upstream that answers /early before reading its body takes the body for a second request
    # and answers it later, on whatever comes next on that connection.  With keyed_connections:
    # fresh, a keyed request never shares a connection, so it gets its own answer, stored.
    up = RawUpstream()
    gw = Gateway(up, routes=ROUTES, name="gateway-fresh", args=["--http-threads", "1"])
    with open(gw.config_path) as f:
        text = f.read()
    with open(gw.config_path, "w") as f:
        f.write(text.replace("upstream:\n", "upstream:\n  keyed_connections: fresh\n", 1))
    try:
        gw.start()
        hidden = b"POST /hidden HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        r = gw.request("POST", "/early", hidden, headers={"Content-Type": "text/plain"})
        expect_eq(r.json()["path"], "/early", "the early answer")
        harness.wait_until("the upstream to read the hidden request",
                           lambda: any(p == "/hidden" for _, p in up.seen))
        conns = {c for c, p in up.seen if p == "/early"}
        for i in range(3):
            k = key("fresh")
            r = gw.request("POST", "/v1/things", {"n": i}, key=k)
            expect_eq(r.json()["path"], "/v1/things", "keyed request %d: its own answer" % i)
            expect(r.json()["conn"] not in conns, "on a connection of its own")
            conns.add(r.json()["conn"])
            expect_replay(gw.request("POST", "/v1/things", {"n": i}, key=k), r,
                          "keyed request %d replayed" % i)
    finally:
        gw.close()
        up.close()


if __name__ == "__main__":
    harness.run("gateway-failopen", setup=setup, teardown=teardown)
