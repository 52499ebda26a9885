# SPDX-License-Identifier: Apache-2.0
"""
test_openapi.py - the OpenAPI 3.1 documents of docs/openapi/ are valid, complete, and true.

1. Both documents validate against the OpenAPI 3.1 JSON Schema with python3-jsonschema, and pass
   the checks the schema cannot make (oas.py); a broken copy of each is refused, so the
   validation is not vacuous.  Every problem code docs/http-api.md names is in orderd.yaml's
   ProblemCode with its status, and every code an operation documents is there too.
2. Against a real orderd (and provider-sim): for POST /api/orders, GET /api/orders/{id},
   PUT /api/me/profile and POST /webhooks/provider, every documented (status, problem code) is
   provoked by a request built for it, and each answer has that status and code, the documented
   media type, a body valid under the documented schema, and the documented headers.  A
   documented outcome without a request that provokes it fails the test, and so does an answer
   the document does not list.  Every path answers 405 with an Allow header naming exactly its
   documented methods.
3. Against a real idem-gateway: every answer of the admin listener the test provokes is
   documented in gateway-admin.yaml and matches it.

Run with Debian's python3 (CTest does: /usr/bin/python3), which has python3-jsonschema and
python3-yaml (scripts/deps.sh test).
"""

import copy
import http.client
import json
import os
import re
import sys
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "service"))

import oas  # noqa: E402
from harness import (Server, TestFailure, db_query, expect, expect_eq, fail,  # noqa: E402
                     in_thread, joined, new_key, run, store_locked, test, wait_order_committed)
from provider import WEBHOOK_SECRET, paid_pair, sign, wait_until  # noqa: E402

ORDERD_DOC = os.path.join(REPO, "docs", "openapi", "orderd.yaml")
GATEWAY_DOC = os.path.join(REPO, "docs", "openapi", "gateway-admin.yaml")
HTTP_API_MD = os.path.join(REPO, "docs", "http-api.md")

# The operations part 2 covers completely.
COVERED = [("POST", "/api/orders"), ("GET", "/api/orders/{id}"), ("PUT", "/api/me/profile"),
           ("POST", "/webhooks/provider")]


class Ctx:
    def __init__(self):
        self.oas_schema = oas.oas31_schema()
        self.orderd = oas.load_yaml(ORDERD_DOC)
        self.gateway = oas.load_yaml(GATEWAY_DOC)
        self.servers = []

    def close(self):
        for s in self.servers:
            s.close()


# ---- 1. the documents ----------------------------------------------------------------------------

@test
def both_documents_are_valid_openapi_3_1(ctx):
    for name, doc in (("orderd.yaml", ctx.orderd), ("gateway-admin.yaml", ctx.gateway)):
        found = oas.problems(doc, ctx.oas_schema)
        if found:
            fail("%s is not a valid OpenAPI 3.1 document:\n  %s" % (name, "\n  ".join(found)))


@test
def a_broken_document_is_refused(ctx):
    # Each mistake must be caught, or the validation above proves nothing.
    def broken(doc, how):
        d = copy.deepcopy(doc)
        how(d)
        return oas.problems(d, ctx.oas_schema)

    mistakes = {
        "a parameter 'in: body' (OpenAPI 2)": lambda d: d["paths"]["/api/orders"]["post"][
            "parameters"].append({"name": "x", "in": "body"}),
        "an unknown member of a response": lambda d: d["paths"]["/api/orders"]["post"][
            "responses"]["201"].update({"bogus": 1}),
        "a schema whose type is a number": lambda d: d["components"]["schemas"]["Order"].update(
            {"type": 5}),
        "a dangling $ref": lambda d: d["paths"]["/api/orders/{id}"]["get"]["responses"].update(
            {"401": {"$ref": "#/components/responses/Nope"}}),
        "an undeclared path parameter": lambda d: d["paths"]["/api/orders/{id}"]["get"].update(
            {"parameters": []}),
        "an example that breaks its schema": lambda d: d["paths"]["/api/orders"]["post"][
            "requestBody"]["content"]["application/json"].update(
                {"example": {"productId": "p-1024", "quantity": 0}}),
        "openapi 3.0.3": lambda d: d.update({"openapi": "3.0.3"}),
    }
    for what, how in mistakes.items():
        expect(broken(ctx.orderd, how), "orderd.yaml with %s passed validation" % what)
    expect(broken(ctx.gateway, lambda d: d["paths"]["/readyz"]["get"]["responses"]["200"].pop(
        "description")), "gateway-admin.yaml with a response without description passed")


@test
def every_problem_code_of_http_api_md_is_documented_with_its_status(ctx):
    table = oas.code_table(ctx.orderd)
    with open(HTTP_API_MD, encoding="utf-8") as f:
        text = f.read()
    pairs = set(re.findall(r"\*\*(\d{3})\*\*\s+`([a-z][a-z0-9-]+)`", text))
    expect(len(pairs) >= 20, "found only %d status/code pairs in http-api.md" % len(pairs))
    missing = []
    for status, code in sorted(pairs):
        if code not in table:
            missing.append("%s %s: not in ProblemCode" % (status, code))
        elif table[code].get("x-status") != int(status):
            missing.append("%s %s: ProblemCode says %r" % (status, code,
                                                           table[code].get("x-status")))
    # And every code an operation lists is one of them, with the response's status.
    for (method, path) in oas.operations(ctx.orderd):
        for (status, code) in oas.documented_outcomes(ctx.orderd, method, path):
            if code is None:
                continue
            if code not in table:
                missing.append("%s %s answers %d %s, not in ProblemCode" % (method, path, status,
                                                                             code))
            elif table[code]["x-status"] != status:
                missing.append("%s %s answers %s with %d, ProblemCode says %d" % (
                    method, path, code, status, table[code]["x-status"]))
    if missing:
        fail("orderd.yaml's problem codes:\n  " + "\n  ".join(missing))


# ---- checking one answer against the document ---------------------------------------------------

def check_answer(doc, method, path, r, status, code, what):
    """`r` is documented for (method, path) as (status, code): status, media type, body, headers."""
    outcomes = oas.documented_outcomes(doc, method, path)
    if (status, code) not in outcomes:
        fail("%s: %s %s does not document %d %s" % (what, method, path, status, code))
    if r.status != status:
        fail("%s: expected %d %s, got %s" % (what, status, code or "", r.describe()))
    resp, media, schema = outcomes[(status, code)]
    got_media = (r.header("Content-Type") or "").split(";")[0].strip().lower()
    expect_eq(got_media, media.split(";")[0].strip(), "%s: Content-Type (%s)" % (what,
                                                                                r.describe()))
    if media.endswith("json"):
        body = r.json()
        errors = [e.message for e in oas.validator_for(doc, schema).iter_errors(body)]
        if errors:
            fail("%s: the body does not match the documented schema of %d: %s\n%s" % (
                what, status, "; ".join(errors[:5]), r.describe()))
        if code is not None:
            expect_eq(body.get("code"), code, "%s: problem code (%s)" % (what, r.describe()))
            expect_eq(body.get("type"), "/problems/" + code, what + ": problem type")
    for name, h in (resp.get("headers") or {}).items():
        h = oas.deref(doc, h)
        value = r.header(name)
        if value is None:
            if h.get("required"):
                fail("%s: documented header %s missing: %s" % (what, name, r.describe()))
            continue
        errors = [e.message for e in oas.validator_for(doc, h["schema"]).iter_errors(value)]
        if errors:
            fail("%s: header %s: %r does not match its schema: %s" % (what, name, value,
                                                                      errors[0]))
    table = doc["components"]["schemas"].get("ProblemCode")
    if code is not None and table is not None and oas.code_table(doc)[code].get("x-retry-after"):
        expect(r.header("Retry-After") is not None,
               "%s: %s is documented with Retry-After: %s" % (what, code, r.describe()))
    return r


class Coverage:
    """Which documented outcomes of the covered operations were provoked."""

    def __init__(self, doc):
        self.doc = doc
        self.seen = set()

    def check(self, method, path, r, status, code, what):
        check_answer(self.doc, method, path, r, status, code, what)
        self.seen.add((method, path, status, code))
        return r

    def missing(self):
        out = []
        for method, path in COVERED:
            for status, code in sorted(oas.documented_outcomes(self.doc, method, path),
                                       key=lambda p: (p[0], p[1] or "")):
                if (method, path, status, code) not in self.seen:
                    out.append("%s %s %d %s" % (method, path, status, code or ""))
        return out


# ---- 2. a running orderd ---------------------------------------------------------------------------

def webhook(client, body, signed=True, **kw):
    raw = json.dumps(body).encode() if not isinstance(body, bytes) else body
    headers = {"Provider-Signature": sign(raw)} if signed else {}
    return client.request("POST", "/webhooks/provider", body=raw, token=None, headers=headers, **kw)


def _tcp_queues(local_port, remote_port):
    """(tx_queue, rx_queue) of the loopback TCP socket local_port -> remote_port, or None."""
    want = ("0100007F:%04X" % local_port, "0100007F:%04X" % remote_port)
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if (fields[1], fields[2]) == want:
                tx, rx = fields[4].split(":")
                return int(tx, 16), int(rx, 16)
    return None


def request_read_by(server, conn):
    """
    Whether everything `conn` (an http.client connection to `server` that sent a request) sent
    has been read by the server: acknowledged on the client's side, nothing left in the receive
    queue of the server's side (/proc/net/tcp).
    """
    mine = conn.sock.getsockname()[1]
    client, served = _tcp_queues(mine, server.port), _tcp_queues(server.port, mine)
    return client is not None and served is not None and client[0] == 0 and served[1] == 0


def hold_record_in_progress(server, key):
    """
    Makes the completed record of `key` look like a request still running elsewhere: processing,
    with a lease held by another owner for a minute (a back door, as tests/service/ uses).
    """
    until = int(time.time() * 1000) + 60000
    rows = db_query(server.db_uri, "UPDATE idem_records SET status = 0, lease_owner = 'elsewhere',"
                    " lease_expires_ms = ? WHERE idem_key = ? RETURNING idem_key", (until, key))
    expect_eq(len(rows), 1, "records of key %s" % key)


@test
def orderd_answers_as_documented(ctx):
    doc = ctx.orderd
    cov = Coverage(doc)
    ORD, ONE, PROF, WH = COVERED[0][1], COVERED[1][1], COVERED[2][1], COVERED[3][1]

    # The main server: a provider, test hooks, a short wait for duplicates, a sweeper every second
    # and no replay cache (so a record swept behind its back is really gone).
    prov, s = paid_pair(order_args=["--wait-ms", "300", "--sweep-interval-s", "1",
                                    "--replay-cache-mb", "0", "--reconciler-interval-ms", "0",
                                    "--completer-interval-ms", "0"],
                        env={"ORDERD_TEST_HOOKS": "1"}, name="openapi")
    ctx.servers += [prov, s]
    s.start()
    u = s.new_user("openapi")
    order = {"productId": "p-1024", "quantity": 2}

    # -- POST /api/orders
    k = new_key("oa")
    first = cov.check("POST", ORD, u.post(ORD, order, key=k), 201, None, "a new order")
    expect_eq(first.json()["status"], "paid", "an order charged through the provider")
    again = cov.check("POST", ORD, u.post(ORD, order, key=k), 201, None, "its retry")
    expect(again.replayed and again.body == first.body, "the retry is the stored answer: %s" %
           again.describe())
    oid = first.json()["orderId"]
    late_key = new_key("late")
    cov.check("POST", ORD, u.post(ORD, order, key=late_key), 201, None, "an order to retry late")
    db_query(s.db_uri, "UPDATE idem_records SET expires_ms = 1 WHERE idem_key = ?", (late_key,))
    wait_until("the late order's record swept", lambda: db_query(
        s.db_uri, "SELECT count(*) FROM idem_records WHERE idem_key = ?", (late_key,))[0][0] == "0")
    cov.check("POST", ORD, u.post(ORD, order, key=late_key), 200, None,
              "a retry after the record was swept")
    cov.check("POST", ORD, u.post(ORD, order), 400, "idempotency-key-missing", "no key")
    cov.check("POST", ORD, u.post(ORD, order, headers=[("Idempotency-Key", "a"),
                                                       ("Idempotency-Key", "b")]),
              400, "idempotency-key-invalid", "the key twice")
    cov.check("POST", ORD, u.request("POST", ORD, body=b'{"productId":', key=new_key()),
              400, "invalid-json", "a body cut short")
    cov.check("POST", ORD, u.post(ORD, {"productId": "p-1024", "quantity": 0}, key=new_key()),
              400, "validation-failed", "quantity 0")
    cov.check("POST", ORD, u.post(ORD, order, key=new_key(), token=None), 401, "unauthorized",
              "no token")
    declined = cov.check("POST", ORD, u.post(ORD, dict(order, paymentSource="tok_declined"),
                                             key=new_key()), 402, "payment-declined", "tok_declined")
    expect(declined.json()["orderId"].startswith("ord_"), "402 names its order")
    cov.check("POST", ORD, u.post(ORD, {"productId": "p-limited", "quantity": 4}, key=new_key()),
              409, "out-of-stock", "4 of a product with 3 in stock")
    slow_key = new_key("slow")
    t, out = in_thread(lambda: u.post(ORD, order, key=slow_key, headers={
        "X-Test-Delay-Ms": "2500"}))
    wait_order_committed(s, slow_key)
    cov.check("POST", ORD, u.post(ORD, order, key=slow_key), 409,
              "idempotency-request-in-progress", "a duplicate of a request still running")
    cov.check("POST", ORD, joined(t, out, "the slow order"), 201, None, "the slow order")
    cov.check("POST", ORD, u.request("POST", ORD, body=b"x" * (1024 * 1024 + 1), key=new_key()),
              413, "body-too-large", "a body over 1 MiB")
    cov.check("POST", ORD, u.request("POST", ORD, body=b"productId=p-1024", key=new_key(),
                                     content_type="application/x-www-form-urlencoded"),
              415, "unsupported-media-type", "a form")
    cov.check("POST", ORD, u.post(ORD, {"productId": "p-nope", "quantity": 1}, key=new_key()),
              422, "unknown-product", "an unknown product")
    cov.check("POST", ORD, u.post(ORD, dict(order, quantity=3), key=k), 422,
              "idempotency-key-reused", "the first key with another body")
    prov.faults(lost_rate=1, webhook_delay_ms=60000)
    cov.check("POST", ORD, u.post(ORD, order, key=new_key()), 503, "outcome-unknown",
              "the provider's answer lost")
    prov.faults(lost_rate=0, webhook_delay_ms=0)

    # -- GET /api/orders/{id}
    cov.check("GET", ONE, u.get("/api/orders/" + oid), 200, None, "the order")
    cov.check("GET", ONE, u.get("/api/orders/" + oid, token=None), 401, "unauthorized", "no token")
    other = s.new_user("other")
    cov.check("GET", ONE, other.get("/api/orders/" + oid), 404, "order-not-found",
              "another user's order")

    # -- PUT /api/me/profile
    prof = {"name": "Ada Lovelace", "email": "ada@example.org"}
    cov.check("PUT", PROF, u.put(PROF, prof), 200, None, "a profile without a key")
    pk = new_key("prof")
    p1 = cov.check("PUT", PROF, u.put(PROF, dict(prof, name="Ada"), key=pk), 200, None,
                   "a profile with a key")
    p2 = cov.check("PUT", PROF, u.put(PROF, dict(prof, name="Ada"), key=pk), 200, None,
                   "its retry")
    expect(p2.replayed and p2.body == p1.body, "the PUT's retry is replayed: %s" % p2.describe())
    cov.check("PUT", PROF, u.put(PROF, prof, headers=[("Idempotency-Key", "a"),
                                                      ("Idempotency-Key", "b")]),
              400, "idempotency-key-invalid", "the key twice")
    cov.check("PUT", PROF, u.request("PUT", PROF, body=b"{nope}"), 400, "invalid-json",
              "not JSON")
    cov.check("PUT", PROF, u.put(PROF, {"name": "", "email": "a@b.c"}), 400, "validation-failed",
              "an empty name")
    cov.check("PUT", PROF, u.put(PROF, prof, token=None), 401, "unauthorized", "no token")
    hold_record_in_progress(s, pk)
    cov.check("PUT", PROF, u.put(PROF, dict(prof, name="Ada"), key=pk), 409,
              "idempotency-request-in-progress", "a PUT whose key another request holds")
    cov.check("PUT", PROF, u.request("PUT", PROF, body=b" " * (1024 * 1024 + 1)), 413,
              "body-too-large", "a body over 1 MiB")
    cov.check("PUT", PROF, u.request("PUT", PROF, body=b"<profile/>", content_type="text/xml"),
              415, "unsupported-media-type", "XML")
    rk = new_key("reuse")
    cov.check("PUT", PROF, u.put(PROF, prof, key=rk), 200, None, "a profile with a new key")
    cov.check("PUT", PROF, u.put(PROF, dict(prof, email="other@example.org"), key=rk), 422,
              "idempotency-key-reused", "the key with another profile")

    # -- POST /webhooks/provider
    event = {"id": "evt_" + new_key("oa"), "type": "charge.succeeded",
             "data": {"object": {"id": "ch_unknown", "idempotency_key": "not-ours"}}}
    cov.check("POST", WH, webhook(u, event), 200, None, "a signed event")
    dup = cov.check("POST", WH, webhook(u, event), 200, None, "the event again")
    expect_eq(dup.json()["duplicate"], True, "a redelivery is a duplicate")
    cov.check("POST", WH, webhook(u, {"id": "evt_x", "type": "x"}), 400, "webhook-invalid",
              "a signed body that is not an event")
    cov.check("POST", WH, webhook(u, event, signed=False), 401, "webhook-signature-invalid",
              "no signature")
    cov.check("POST", WH, u.request("POST", WH, body=b"{" * (1024 * 1024 + 1), token=None),
              413, "body-too-large", "a body over 1 MiB")

    # -- The store locked by another process for longer than orderd waits (5 s): every write
    #    answers 503 idempotency-store-unavailable, at the same time.
    writes = {
        "POST": lambda: u.post(ORD, order, key=new_key(), timeout=30),
        "PUT": lambda: u.put(PROF, prof, key=new_key(), timeout=30),
        "WH": lambda: webhook(u, dict(event, id="evt_" + new_key()), timeout=30),
    }
    with store_locked(s.db_uri):
        running = {name: in_thread(fn) for name, fn in writes.items()}
        answers = {name: joined(t, out, name) for name, (t, out) in running.items()}
    cov.check("POST", ORD, answers["POST"], 503, "idempotency-store-unavailable", "store locked")
    cov.check("PUT", PROF, answers["PUT"], 503, "idempotency-store-unavailable", "store locked")
    cov.check("POST", WH, answers["WH"], 503, "idempotency-store-unavailable", "store locked")

    # -- Every path answers another method with 405 and exactly its documented methods.
    for path, item in doc["paths"].items():
        documented = {m.upper() for m in item if m in oas.METHODS}
        if "GET" in documented:
            documented.add("HEAD")
        concrete = path.replace("{id}", oid)
        method = "DELETE" if "DELETE" not in documented else "PATCH"
        r = u.request(method, concrete, headers={"Content-Length": "0"})
        expect_eq(r.status, 405, "%s %s: %s" % (method, concrete, r.describe()))
        check_problem_ref(doc, "MethodNotAllowed", r, "%s %s" % (method, concrete))
        allow = {m.strip() for m in (r.header("Allow") or "").split(",") if m.strip()}
        expect_eq(allow, documented, "Allow of %s vs the document" % path)
    check_problem_ref(doc, "NotFound", u.get("/api/nothing-here"), "an unknown path")

    # -- Three more orderd, each for what one server cannot show at the same time.
    busy_and_broken_servers(ctx, cov, order, prof, event)

    missing = cov.missing()
    if missing:
        fail("documented outcomes no request provoked:\n  " + "\n  ".join(missing))


def check_problem_ref(doc, name, r, what):
    resp = doc["components"]["responses"][name]
    content = resp["content"]["application/problem+json"]
    code = oas.problem_codes(doc, content["schema"])[0]
    status = content["schema"]["properties"]["status"]["const"]
    expect_eq(r.status, status, "%s: %s" % (what, r.describe()))
    expect_eq(r.json().get("code"), code, what + ": code")
    errors = [e.message for e in oas.validator_for(doc, content["schema"]).iter_errors(r.json())]
    expect(not errors, "%s: %s does not match components/responses/%s: %s" % (
        what, r.describe(), name, errors))
    for hname, h in (resp.get("headers") or {}).items():
        if oas.deref(doc, h).get("required"):
            expect(r.header(hname) is not None, "%s: no %s: %s" % (what, hname, r.describe()))


def busy_and_broken_servers(ctx, cov, order, prof, event):
    ORD, ONE, PROF, WH = (p for _, p in COVERED)

    # --idempotency off (the benchmark baseline): a retry of a key is 409 order-exists.
    off = Server(name="openapi-off", extra_args=["--idempotency", "off"])
    ctx.servers.append(off)
    off.start()
    u = off.new_user("off")
    k = new_key("off")
    cov.check("POST", ORD, u.post(ORD, order, key=k), 201, None, "an order, idempotency off")
    cov.check("POST", ORD, u.post(ORD, order, key=k), 409, "order-exists",
              "its retry, idempotency off")
    off.close()

    # One worker and a queue of one: while both are taken, every request is 503 server-busy.
    busy = Server(name="openapi-busy", env={"ORDERD_TEST_HOOKS": "1"},
                  extra_args=["--http-workers", "1", "--http-queue", "1", "--http-threads", "1",
                              "--webhook-secret", WEBHOOK_SECRET])
    ctx.servers.append(busy)
    busy.start()
    u = busy.new_user("busy")
    oid = cov.check("POST", ORD, u.post(ORD, order, key=new_key()), 201, None, "an order").json()[
        "orderId"]
    holders = []
    first = new_key("hold")
    holders.append(in_thread(lambda: u.post(ORD, order, key=first, headers={
        "X-Test-Delay-Ms": "3000"})))
    wait_order_committed(busy, first)  # the one worker is taken
    # The second takes the queue's one slot: sent now, its answer read at the end.  It is queued
    # once orderd has read it (its one event loop reads a request and queues it in one go).
    queued = http.client.HTTPConnection(busy.host, busy.port, timeout=60)
    queued.request("POST", ORD, body=json.dumps(order).encode(), headers={
        "Authorization": "Bearer " + u.token, "Content-Type": "application/json",
        "Idempotency-Key": new_key(), "X-Test-Delay-Ms": "3000"})
    wait_until("orderd to read the second slow order (queued for the busy worker)",
               lambda: request_read_by(busy, queued), pause_s=0.02)
    # A new order on SQLite needs no worker (the store's writer runs it for the event loop): the
    # test hook's header, even with no delay, sends it the worker's way, as on PostgreSQL.
    cov.check("POST", ORD, u.post(ORD, order, key=new_key(), headers={"X-Test-Delay-Ms": "0"}),
              503, "server-busy", "workers busy")
    cov.check("GET", ONE, u.get("/api/orders/" + oid), 503, "server-busy", "workers busy")
    cov.check("PUT", PROF, u.put(PROF, prof), 503, "server-busy", "workers busy")
    cov.check("POST", WH, webhook(u, event), 503, "server-busy", "workers busy")
    for t, out in holders:
        expect_eq(joined(t, out, "a slow order").status, 201, "a slow order that held a worker")
    try:
        second = queued.getresponse()
        second.read()
        expect_eq(second.status, 201, "the slow order that waited in the queue")
    finally:
        queued.close()
    busy.close()

    # Tables gone under a running orderd: the request fails and is rolled back, 500.  Then the
    # store's files are overwritten: reads fail, 503 idempotency-store-unavailable.
    broken = Server(name="openapi-broken", extra_args=["--webhook-secret", WEBHOOK_SECRET])
    ctx.servers.append(broken)
    broken.start()
    u = broken.new_user("broken")
    oid = cov.check("POST", ORD, u.post(ORD, order, key=new_key()), 201, None, "an order").json()[
        "orderId"]
    for table in ("products", "orders", "profiles", "inbox"):
        db_query(broken.db_uri, "ALTER TABLE %s RENAME TO %s_gone" % (table, table))
    cov.check("POST", ORD, u.post(ORD, order, key=new_key()), 500, "internal-error", "no tables")
    cov.check("GET", ONE, u.get("/api/orders/" + oid), 500, "internal-error", "no tables")
    cov.check("PUT", PROF, u.put(PROF, prof), 500, "internal-error", "no tables")
    cov.check("POST", WH, webhook(u, event), 500, "internal-error", "no tables")
    db_query(broken.db_uri, "ALTER TABLE orders_gone RENAME TO orders")
    expect_eq(u.get("/api/orders/" + oid).status, 200, "GET once the orders table is back")
    # Every byte of the database, its WAL and its shared index overwritten (a failed disk, as far
    # as orderd can tell): the next read finds no database.
    path = broken.db_uri[len("sqlite:"):]
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            size = os.path.getsize(path + suffix)
            with open(path + suffix, "r+b") as f:
                f.write(b"\xa5" * size)
    cov.check("GET", ONE, u.get("/api/orders/" + oid), 503, "idempotency-store-unavailable",
              "the database file overwritten")
    broken.close()


# ---- 3. a running idem-gateway ---------------------------------------------------------------------

@test
def the_gateway_admin_listener_answers_as_documented(ctx):
    from gateway_harness import Gateway, Upstream
    doc = ctx.gateway
    up = Upstream()
    gw = Gateway(up, name="openapi-gateway")
    ctx.servers.append(gw)
    try:
        gw.start()
        seen = set()

        def check(method, path, r, status, code, what):
            check_answer(doc, method, path, r, status, code, what)
            seen.add((method, path, status, code))

        check("GET", "/healthz", gw.admin("GET", "/healthz"), 200, None, "healthz")
        check("GET", "/readyz", gw.admin("GET", "/readyz"), 200, None, "readyz")
        check("GET", "/metrics", gw.admin("GET", "/metrics"), 200, None, "metrics")
        for path in ("/healthz", "/readyz", "/metrics", "/records", "/records/list"):
            r = gw.admin("POST", path, "{}")
            check("GET", path, r, 405, "method-not-allowed", "POST " + path)
            expect_eq(r.header("Allow"), "GET, HEAD", "Allow of " + path)
        r = gw.admin("GET", "/records/resolve")
        check("POST", "/records/resolve", r, 405, "method-not-allowed", "GET /records/resolve")
        expect_eq(r.header("Allow"), "POST", "Allow of /records/resolve")

        def record(principal, op, key):
            return "/records?" + urllib.parse.urlencode(
                {"principal": principal, "operation": op, "key": key})

        check("GET", "/records", gw.admin("GET", "/records?principal=alice"), 400,
              "validation-failed", "no operation, no key")
        check("GET", "/records", gw.admin("GET", record("alice", "things.create", "nope")), 404,
              "not-found", "a key never used")
        done = new_key("done")
        r = gw.request("POST", "/v1/things", {"n": 1}, key=done)
        expect(200 <= r.status < 300, "a request through the gateway: %s" % r.describe())
        shown = gw.admin("GET", record("alice", "things.create", done))
        check("GET", "/records", shown, 200, None, "a completed record")
        expect_eq(shown.json()["state"], "completed", "its state")
        held = new_key("held")
        r = gw.request("POST", "/v1/things", {"n": 1}, key=held, headers={"X-Test-Mode": "reset"})
        expect_eq(r.status, 502, "a reset after the upstream acted: %s" % r.describe())
        shown = gw.admin("GET", record("alice", "things.create", held))
        check("GET", "/records", shown, 200, None, "a held record")
        expect_eq(shown.json()["state"], "unknown", "its state")
        listed = gw.admin("GET", "/records/list?state=unknown")
        check("GET", "/records/list", listed, 200, None, "the held keys")
        expect(held in [r["key"] for r in listed.json()["records"]], "the held key is listed")
        check("GET", "/records/list", gw.admin("GET", "/records/list?state=maybe"), 400,
              "validation-failed", "a state that is not one")

        res = "/records/resolve"

        def resolve(body):
            return gw.admin("POST", res, body if isinstance(body, str) else json.dumps(body))

        base = {"principal": "alice", "operation": "things.create"}
        check("POST", res, resolve("not json"), 400, "validation-failed", "not JSON")
        check("POST", res, resolve(dict(base, key=held, decision="maybe")), 400,
              "validation-failed", "decision maybe")
        check("POST", res, resolve(dict(base, operation="nope", key=held, decision="executed")),
              404, "not-found", "an operation no route has")
        check("POST", res, resolve(dict(base, key="never-used", decision="not-executed")), 404,
              "not-found", "a key never used")
        check("POST", res, resolve(dict(base, key=done, decision="not-executed")), 409,
              "record-completed", "a completed record")
        slow = new_key("slow")
        t, out = in_thread(lambda: gw.request("POST", "/v1/things", {"n": 2}, key=slow,
                                              headers={"X-Test-Mode": "slow:2000"}))
        wait_until("the request in flight upstream", lambda: up.executions(slow) == 1,
                   pause_s=0.02)
        check("POST", res, resolve(dict(base, key=slow, decision="not-executed")), 409,
              "idempotency-request-in-progress", "a record being forwarded")
        shown = gw.admin("GET", record("alice", "things.create", slow))
        check("GET", "/records", shown, 200, None, "an in-flight record")
        expect_eq(shown.json()["state"], "in-flight", "its state")
        joined(t, out, "the slow request")
        check("POST", res, resolve(dict(base, key=held, decision="executed", response={
            "status": 201, "headers": {"Content-Type": "application/json"}, "body": "{}"})),
            200, None, "a held key resolved")
        again = gw.request("POST", "/v1/things", {"n": 1}, key=held)
        expect(again.status == 201 and again.replayed, "the resolution is replayed: %s" %
               again.describe())
        # Web pages are refused on every path; a resolution must be JSON.
        for method, path in oas.operations(doc):
            body = "{}" if method == "POST" else None
            check(method, path, gw.admin(method, path, body, headers={"Origin": "http://x.test"}),
                  403, "forbidden", "%s %s from a web page" % (method, path))
        check("POST", res, gw.admin("POST", res, "{}", headers={"Content-Type": "text/plain"}),
              415, "unsupported-media-type", "a resolution as text/plain")
        # With admin_token_file, every path but /healthz needs the token.
        tgw = Gateway(up, name="openapi-gateway-token", extra="admin_token_file: admin.token\n")
        ctx.servers.append(tgw)
        with open(os.path.join(tgw.tmpdir, "admin.token"), "w") as f:
            f.write("t0ken-t0ken-t0ken-t0ken\n")
        tgw.start()
        for method, path in oas.operations(doc):
            if path == "/healthz":
                continue
            r = tgw.admin(method, path, "{}" if method == "POST" else None)
            check(method, path, r, 401, "unauthorized", "%s %s without the token" % (method, path))
            expect_eq(r.header("WWW-Authenticate"), "Bearer", "401's challenge")
        # What no request can provoke on a healthy SQLite gateway: its store failing.
        unprovoked = []
        for (method, path) in oas.operations(doc):
            for status, code in oas.documented_outcomes(doc, method, path):
                if (method, path, status, code) not in seen:
                    unprovoked.append("%s %s %d %s" % (method, path, status, code or ""))
        allowed = {"GET /readyz 503 idempotency-store-unavailable",
                   "GET /records 500 internal-error",
                   "GET /records 503 idempotency-store-unavailable",
                   "GET /records/list 503 idempotency-store-unavailable",
                   "POST /records/resolve 503 idempotency-store-unavailable"}
        extra = sorted(set(unprovoked) - allowed)
        if extra:
            fail("documented admin outcomes no request provoked:\n  " + "\n  ".join(extra))
    finally:
        gw.close()
        up.close()


if __name__ == "__main__":
    try:
        run("test_openapi", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
    except TestFailure as e:
        print("FAIL %s" % e)
        sys.exit(1)
