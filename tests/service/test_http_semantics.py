# SPDX-License-Identifier: Apache-2.0
"""
test_http_semantics.py - every rule of docs/http-api.md, one test each, against a real orderd
over real HTTP.

Each test works as freshly created users, so the tests do not depend on one another and the same
file runs against SQLite (service.*) and PostgreSQL (service-pg.*, a fresh database per server on
a with_pg.sh cluster), or a shared PostgreSQL (IDEM_TEST_DB_URI).  The few tests that reach into
the store (rewinding a record's expiry, holding its lock) do it on either store.
"""

import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (ORDERD, Server, db_query, expect, expect_eq, expect_fresh,  # noqa: E402
                     expect_problem, expect_replay, expect_status, fail, fresh_db_per_server,
                     in_thread, joined, metric_value, new_key, parse_metrics, retry_after_seconds, run,
                     store_kind, store_locked, test, wait_until, wait_order_committed)

ORDER_ID_RE = re.compile(r"^ord_[0-9a-f]{32}$")
CREATED_AT_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")
ONE_MIB = 1024 * 1024


class Ctx:
    """The servers this file shares: a plain one, and one with ORDERD_TEST_HOOKS=1 on demand."""

    def __init__(self):
        self.server = Server(name="orderd-main").start()
        self._hooks = None

    @property
    def hooks(self):
        if self._hooks is None:
            self._hooks = Server(name="orderd-hooks", env={"ORDERD_TEST_HOOKS": "1"}).start()
        return self._hooks

    def close(self):
        if self._hooks is not None:
            self._hooks.close()
        self.server.close()


def order_count(client):
    return len(client.all_orders())


def expect_no_orders(client, what):
    orders = client.all_orders()
    if orders:
        fail("%s: expected no order to exist, found %d: %r" % (what, len(orders), orders))


def expect_created(resp, product="p-1024", quantity=2, unit_price=1999, what="create"):
    """A 201 of POST /api/orders with the documented shape; returns the body."""
    expect_status(resp, 201, what)
    expect_eq(resp.content_type, "application/json", what + ": Content-Type")
    doc = resp.json()
    oid = doc.get("orderId")
    expect(isinstance(oid, str) and ORDER_ID_RE.match(oid),
           "%s: orderId should be ord_<32 hex>: %s" % (what, resp.describe()))
    expect_eq(resp.header("Location"), "/api/orders/" + oid, what + ": Location")
    expect_eq(doc.get("status"), "created", what + ": status")
    expect_eq(doc.get("productId"), product, what + ": productId")
    expect_eq(doc.get("quantity"), quantity, what + ": quantity")
    expect_eq(doc.get("unitPrice"), unit_price, what + ": unitPrice")
    expect_eq(doc.get("amount"), unit_price * quantity, what + ": amount")
    expect_eq(doc.get("currency"), "EUR", what + ": currency")
    expect(isinstance(doc.get("createdAt"), str) and CREATED_AT_RE.match(doc["createdAt"]),
           "%s: createdAt should be an RFC 3339 UTC time: %s" % (what, resp.describe()))
    return doc


# ---- keys: missing, invalid, forms ---------------------------------------------------------------

@test
def test_post_order_without_key_is_400_missing_and_nothing_runs(ctx):
    u = ctx.server.new_user()
    r = u.post("/api/orders", {"productId": "p-1024", "quantity": 2})
    expect_problem(r, 400, "idempotency-key-missing", "POST /api/orders without a key")
    expect_no_orders(u, "after a keyless POST")


@test
def test_cancel_without_key_is_400_missing(ctx):
    u = ctx.server.new_user()
    oid = expect_created(u.create_order(new_key()))["orderId"]
    r = u.request("POST", "/api/orders/%s/cancel" % oid)
    expect_problem(r, 400, "idempotency-key-missing", "cancel without a key")
    expect_eq(u.get("/api/orders/" + oid).json().get("status"), "created",
              "order status after a refused keyless cancel")


INVALID_KEYS = [
    ("empty", ""),
    ("empty_sf_string", '""'),
    ("256_chars", "k" * 256),
    ("256_chars_quoted", '"' + "q" * 256 + '"'),
    ("control_char_tab", "ab\tcd"),
    ("unterminated_sf_string", '"abc'),
    ("sf_string_with_trailing_garbage", '"a"b'),
    ("non_ascii", "caf\xe9-key"),
    ("space_in_bare_token", "a b"),
]


def _invalid_key_test(key, code):
    def t(ctx):
        u = ctx.server.new_user()
        r = u.create_order(key)
        expect_problem(r, 400, code, "Idempotency-Key %r" % key)
        expect_no_orders(u, "after an invalid key")
    return t


for _name, _key in INVALID_KEYS:
    test(_invalid_key_test(_key, "idempotency-key-invalid"), "test_invalid_key_%s_is_400" % _name)

# A control character other than HTAB is not allowed in any header field (RFC 9110 5.5): the
# HTTP layer refuses the request before the key is looked at, with the same 400 and nothing done.
INVALID_FIELD_KEYS = [
    ("control_char_soh", "ab\x01cd"),
    ("control_char_del", "ab\x7fcd"),
]

for _name, _key in INVALID_FIELD_KEYS:
    test(_invalid_key_test(_key, "bad-request"), "test_invalid_key_%s_is_400" % _name)


@test
def test_two_idempotency_key_headers_are_400_invalid(ctx):
    u = ctx.server.new_user()
    k = new_key()
    r = u.post("/api/orders", {"productId": "p-1024", "quantity": 2},
               headers=[("Idempotency-Key", k), ("Idempotency-Key", k + "-other")])
    expect_problem(r, 400, "idempotency-key-invalid", "two Idempotency-Key headers")
    r = u.post("/api/orders", {"productId": "p-1024", "quantity": 2},
               headers=[("Idempotency-Key", k), ("Idempotency-Key", k)])
    expect_problem(r, 400, "idempotency-key-invalid", "the same Idempotency-Key header twice")
    expect_no_orders(u, "after two-header requests")


@test
def test_key_of_255_chars_is_accepted(ctx):
    u = ctx.server.new_user()
    key = ("x" * 223) + new_key("")[1:]  # 223 + 32 hex = 255 visible characters
    expect_eq(len(key), 255, "test key length")
    first = u.create_order(key)
    expect_created(first, what="255-character key")
    expect_replay(u.create_order(key), first, "retry with the 255-character key")


@test
def test_quoted_key_of_255_chars_is_accepted(ctx):
    u = ctx.server.new_user()
    inner = ("y" * 223) + new_key("")[1:]
    first = u.create_order('"%s"' % inner)
    expect_created(first, what="sf-string key of 255 characters")
    expect_replay(u.create_order(inner), first, "the same 255 characters as a bare token")


@test
def test_sf_string_escapes_are_decoded(ctx):
    # RFC 8941: inside an sf-string, \" and \\ stand for " and \ (visible characters).
    u = ctx.server.new_user()
    k = new_key("esc")
    first = u.create_order('"%s\\"x"' % k)
    expect_created(first, what='key "<k>\\"x"')
    expect_replay(u.create_order('"%s\\"x"' % k), first, "same escaped key")
    other = u.create_order('"%s\\\\x"' % k)
    expect_created(expect_fresh(other, 201, 'key "<k>\\\\x" is another key'))
    expect(other.json()["orderId"] != first.json()["orderId"], "two keys, one order")
    bad = u.create_order('"%s\\n"' % k)
    expect_problem(bad, 400, "idempotency-key-invalid", "sf-string with the escape \\n")


@test
def test_header_names_are_case_insensitive(ctx):
    u = ctx.server.new_user()
    k = new_key()
    body = {"productId": "p-1024", "quantity": 2}
    first = u.post("/api/orders", body, token=None,
                   headers=[("authorization", "Bearer " + u.token), ("idempotency-key", k)])
    expect_created(first, what="lower-case header names")
    again = u.post("/api/orders", body, token=None,
                   headers=[("AUTHORIZATION", "Bearer " + u.token), ("IDEMPOTENCY-KEY", k)])
    expect_replay(again, first, "upper-case header names")
    # RFC 9110: the auth scheme is case-insensitive too.
    r = u.post("/api/orders", body, token=None, key=k,
               headers=[("Authorization", "bearer " + u.token)])
    expect_replay(r, first, "Authorization: bearer <token>")


@test
def test_sf_string_and_bare_token_are_the_same_key(ctx):
    u = ctx.server.new_user()
    k = new_key("same")
    first = u.create_order('"%s"' % k)
    expect_created(first, what='key as sf-string "%s"' % k)
    second = u.create_order(k)
    expect_replay(second, first, "same key sent as a bare token")
    third = u.create_order('"%s"' % k)
    expect_replay(third, first, "same key sent again as an sf-string")
    expect_eq(order_count(u), 1, "orders after three requests with one key in two forms")


@test
def test_keys_are_case_sensitive(ctx):
    u = ctx.server.new_user()
    k = new_key("Case")
    a = expect_created(u.create_order(k))
    b = u.create_order(k.lower())
    expect_created(expect_fresh(b, 201, "the same key in lower case is another key"))
    expect(b.json()["orderId"] != a["orderId"], "two keys gave one order: %s" % b.describe())


@test
def test_key_is_ignored_on_get(ctx):
    u = ctx.server.new_user()
    r = u.get("/api/orders", headers=[("Idempotency-Key", "")])
    expect_status(r, 200, "GET with an empty Idempotency-Key")
    r = u.get("/api/orders", headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
    expect_status(r, 200, "GET with two Idempotency-Key headers")
    expect(not r.replayed, "GET must not be replayed: %s" % r.describe())
    r = u.request("HEAD", "/api/orders", headers=[("Idempotency-Key", "")])
    expect_status(r, 200, "HEAD with an empty Idempotency-Key")
    expect_eq(r.body, b"", "HEAD body")


@test
def test_key_is_optional_on_put_but_must_be_valid(ctx):
    u = ctx.server.new_user()
    p = {"name": "Key Less", "email": "k@example.com"}
    expect_problem(u.put("/api/me/profile", p, key=""), 400, "idempotency-key-invalid",
                   "PUT with an empty key")
    expect_problem(u.put("/api/me/profile", p, key="x" * 256), 400, "idempotency-key-invalid",
                   "PUT with a 256-character key")
    r = expect_fresh(u.put("/api/me/profile", p), 200, "PUT without a key after the 400s")
    expect_eq(r.json().get("changed"), True, "the refused PUTs changed nothing")


# ---- principal -----------------------------------------------------------------------------------

@test
def test_no_or_unknown_token_is_401_and_never_stored(ctx):
    s = ctx.server
    u = s.new_user()
    k = new_key()
    r = u.create_order(k, token=None)
    expect_problem(r, 401, "unauthorized", "POST without Authorization")
    expect("bearer" in (r.header("WWW-Authenticate") or "").lower(),
           "401 should carry WWW-Authenticate: Bearer: %s" % r.describe())
    r = u.create_order(k, token="not-a-real-token-" + new_key())
    expect_problem(r, 401, "unauthorized", "POST with an unknown token")
    expect("bearer" in (r.header("WWW-Authenticate") or "").lower(),
           "401 should carry WWW-Authenticate: Bearer: %s" % r.describe())
    r = u.create_order(k, headers={"Authorization": "Basic dXNlcjpwYXNz"}, token=None)
    expect_problem(r, 401, "unauthorized", "POST with Basic instead of Bearer")
    # Now with the right token and the same key: executed, not a replay of a 401.
    expect_created(expect_fresh(u.create_order(k), 201, "same key after fixing the token"))
    expect_eq(order_count(u), 1, "orders after the 401s and one good request")


@test
def test_get_routes_need_a_token(ctx):
    c = ctx.server.client()
    for path in ("/api/orders", "/api/orders/ord_" + "0" * 32):
        expect_problem(c.get(path), 401, "unauthorized", "GET %s without a token" % path)
    expect_problem(c.put("/api/me/profile", {"name": "A", "email": "a@b.c"}), 401,
                   "unauthorized", "PUT /api/me/profile without a token")


# ---- first request, replay -----------------------------------------------------------------------

@test
def test_first_request_is_201_with_location_and_order(ctx):
    u = ctx.server.new_user()
    r = u.create_order(new_key(), quantity=2)
    doc = expect_created(r, quantity=2)
    expect(r.header("Idempotent-Replayed") is None,
           "the first response must not say Idempotent-Replayed: %s" % r.describe())
    g = expect_status(u.get(r.header("Location")), 200, "GET the Location")
    expect_eq(g.json(), doc, "GET %s body vs the 201 body" % r.header("Location"))


@test
def test_other_products_have_their_prices(ctx):
    u = ctx.server.new_user()
    expect_created(u.create_order(new_key(), product="p-2048", quantity=3), product="p-2048",
                   quantity=3, unit_price=4999)


@test
def test_replay_is_byte_identical_with_headers(ctx):
    u = ctx.server.new_user()
    k = new_key()
    first = u.create_order(k)
    expect_created(first)
    for i in range(3):
        expect_replay(u.create_order(k), first, "retry %d" % (i + 1))
    expect_eq(order_count(u), 1, "orders after one request and three retries")


@test
def test_key_order_and_whitespace_do_not_change_the_fingerprint(ctx):
    u = ctx.server.new_user()
    k = new_key()
    first = u.post("/api/orders", body=b'{"productId":"p-1024","quantity":2}', key=k)
    expect_created(first)
    variants = [
        b'{"quantity":2,"productId":"p-1024"}',
        b'  {\n\t"quantity" : 2 ,\r\n  "productId" :   "p-1024"\n}\n  ',
        b'{ "productId": "p-1024", "quantity": 2 }',
    ]
    for v in variants:
        expect_replay(u.post("/api/orders", body=v, key=k), first, "body %r" % v)
    expect_eq(order_count(u), 1, "orders after reformatted retries")


@test
def test_equivalent_json_escapes_are_the_same_fingerprint(ctx):
    # RFC 8785 compares the decoded strings: "\u0031" and "1" are the same body.
    u = ctx.server.new_user()
    k = new_key()
    first = u.post("/api/orders", body=b'{"productId":"p-1024","quantity":2}', key=k)
    expect_created(first)
    r = u.post("/api/orders", body=b'{"productId":"p-\\u0031024","quantity":2}', key=k)
    expect_replay(r, first, "productId written with a \\u escape")


@test
def test_different_body_same_key_is_422_reused_and_not_executed(ctx):
    u = ctx.server.new_user()
    k = new_key()
    first = u.create_order(k, quantity=2)
    expect_created(first)
    r = u.create_order(k, quantity=3)
    expect_problem(r, 422, "idempotency-key-reused", "same key, quantity 3 instead of 2")
    expect(not r.replayed, "a 422 reused is not a replay: %s" % r.describe())
    r = u.post("/api/orders", {"productId": "p-1024", "quantity": 2, "note": "x"}, key=k)
    expect_problem(r, 422, "idempotency-key-reused", "same key, an extra member")
    expect_eq(order_count(u), 1, "orders after the mismatching requests")
    expect_replay(u.create_order(k, quantity=2), first, "the original body afterwards")


# ---- scope ---------------------------------------------------------------------------------------

@test
def test_scope_two_users_same_key_do_not_collide(ctx):
    a, b = ctx.server.new_user("alice"), ctx.server.new_user("bob")
    k = new_key("shared")
    ra = a.create_order(k)
    da = expect_created(ra, what="alice")
    rb = b.create_order(k)
    db = expect_created(expect_fresh(rb, 201, "bob with alice's key"), what="bob")
    expect(da["orderId"] != db["orderId"], "bob got alice's order: %s" % rb.describe())
    expect_eq([o["orderId"] for o in a.all_orders()], [da["orderId"]], "alice's orders")
    expect_eq([o["orderId"] for o in b.all_orders()], [db["orderId"]], "bob's orders")
    # Bob's retry replays his own order, not alice's.
    expect_replay(b.create_order(k), rb, "bob's retry")


@test
def test_scope_same_key_on_another_operation_is_another_record(ctx):
    u = ctx.server.new_user()
    k = new_key("op")
    created = u.create_order(k)
    oid = expect_created(created)["orderId"]
    r = u.cancel(oid, k)
    expect_fresh(r, 200, "cancel with the key used for create")
    expect_eq(r.json().get("status"), "cancelled", "cancel with the create key: status")
    expect_eq(r.json().get("orderId"), oid, "cancel with the create key: orderId")
    # And the create record is untouched: its retry still replays the 201.
    expect_replay(u.create_order(k), created, "create retry after the cancel")


# ---- requests refused before anything runs: never stored -----------------------------------------

def _padded_body(size):
    """A valid order body of exactly `size` bytes (other members are ignored)."""
    head = b'{"productId":"p-1024","quantity":2,"pad":"'
    tail = b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


@test
def test_body_over_1mib_is_413_and_not_stored(ctx):
    u = ctx.server.new_user()
    k = new_key()
    r = u.post("/api/orders", body=_padded_body(ONE_MIB + 1), key=k)
    expect_problem(r, 413, "body-too-large", "1 MiB + 1 byte body")
    r = u.post("/api/orders", body=_padded_body(2 * ONE_MIB), key=k)
    expect_problem(r, 413, "body-too-large", "2 MiB body")
    expect_no_orders(u, "after 413s")
    expect_created(expect_fresh(u.create_order(k), 201, "same key with a small body"))


@test
def test_chunked_body_over_1mib_is_413_and_small_chunked_body_works(ctx):
    u = ctx.server.new_user()
    k = new_key()
    r = u.post("/api/orders", body=_padded_body(ONE_MIB + 100), key=k, chunked=True)
    expect_problem(r, 413, "body-too-large", "chunked body of 1 MiB + 100 bytes")
    expect_no_orders(u, "after a chunked 413")
    r = u.post("/api/orders", body=b'{"productId":"p-1024","quantity":2}', key=k, chunked=True)
    expect_created(expect_fresh(r, 201, "same key, small chunked body"))


@test
def test_body_of_exactly_1mib_is_accepted(ctx):
    u = ctx.server.new_user()
    body = _padded_body(ONE_MIB)
    expect_eq(len(body), ONE_MIB, "test body length")
    k = new_key()
    first = u.post("/api/orders", body=body, key=k)
    expect_created(first, what="a body of exactly 1 MiB")
    expect_replay(u.post("/api/orders", body=body, key=k), first, "retry of the 1 MiB body")


@test
def test_text_plain_is_415_and_not_stored(ctx):
    u = ctx.server.new_user()
    k = new_key()
    body = b'{"productId":"p-1024","quantity":2}'
    r = u.post("/api/orders", body=body, key=k, content_type="text/plain")
    expect_problem(r, 415, "unsupported-media-type", "Content-Type: text/plain")
    r = u.post("/api/orders", body=body, key=k, content_type=None)
    expect_problem(r, 415, "unsupported-media-type", "no Content-Type")
    r = u.post("/api/orders", body=body, key=k, content_type="application/jsonx")
    expect_problem(r, 415, "unsupported-media-type", "Content-Type: application/jsonx")
    expect_no_orders(u, "after 415s")
    r = u.post("/api/orders", body=body, key=k, content_type="application/json; charset=utf-8")
    expect_created(expect_fresh(r, 201, "same key, application/json; charset=utf-8"))


@test
def test_media_type_is_case_insensitive(ctx):
    # RFC 9110 8.3.1: type, subtype and parameter names are case-insensitive.
    u = ctx.server.new_user()
    r = u.post("/api/orders", body=b'{"productId":"p-1024","quantity":2}', key=new_key(),
               content_type="Application/JSON; Charset=UTF-8")
    expect_created(r, what="Content-Type: Application/JSON; Charset=UTF-8")


@test
def test_unknown_route_is_404(ctx):
    u = ctx.server.new_user()
    expect_problem(u.get("/api/nope"), 404, "not-found", "GET /api/nope")
    expect_problem(u.get("/nope", token=None), 404, "not-found", "GET /nope")
    expect_problem(u.post("/api/orders/x/y/z", {}, key=new_key()), 404, "not-found",
                   "POST /api/orders/x/y/z")


@test
def test_wrong_method_is_405_with_allow(ctx):
    u = ctx.server.new_user()
    oid = expect_created(u.create_order(new_key()))["orderId"]
    cases = [
        ("DELETE", "/api/orders", {"GET", "POST"}),
        ("PUT", "/api/orders/" + oid, {"GET"}),
        ("GET", "/api/orders/%s/cancel" % oid, {"POST"}),
        ("POST", "/api/me/profile", {"PUT"}),
        ("POST", "/healthz", {"GET"}),
    ]
    for method, path, must_allow in cases:
        r = u.request(method, path, body=b"{}", key=new_key())
        what = "%s %s" % (method, path)
        expect_problem(r, 405, "method-not-allowed", what)
        allow = {m.strip().upper() for v in r.header_all("Allow") for m in v.split(",")
                 if m.strip()}
        expect(must_allow <= allow, "%s: Allow should list %s, got %r" % (
            what, sorted(must_allow), r.header_all("Allow")))
        expect(method not in allow, "%s: Allow lists the refused method: %r" % (
            what, r.header_all("Allow")))


@test
def test_bad_json_is_400_invalid_json_and_not_stored(ctx):
    u = ctx.server.new_user()
    k = new_key()
    for body in (b'{"productId": "p-1024", "quantity": 2', b"not json", b'{"productId":"p-\xff",'
                 b'"quantity":2}'):
        r = u.post("/api/orders", body=body, key=k)
        expect_problem(r, 400, "invalid-json", "body %r" % body)
    expect_no_orders(u, "after invalid JSON")
    expect_created(expect_fresh(u.create_order(k), 201, "same key with valid JSON"))


@test
def test_duplicate_member_names_are_400_invalid_json(ctx):
    u = ctx.server.new_user()
    k = new_key()
    r = u.post("/api/orders", body=b'{"productId":"p-1024","productId":"p-2048","quantity":2}',
               key=k)
    expect_problem(r, 400, "invalid-json", "duplicate productId member")
    r = u.post("/api/orders", body=b'{"productId":"p-1024","quantity":2,"quantity":2}', key=k)
    expect_problem(r, 400, "invalid-json", "duplicate quantity member with equal values")
    expect_no_orders(u, "after duplicate members")
    expect_created(expect_fresh(u.create_order(k), 201, "same key with a valid body"))


VALIDATION_CASES = [
    ("quantity_0", {"productId": "p-1024", "quantity": 0}),
    ("quantity_1001", {"productId": "p-1024", "quantity": 1001}),
    ("quantity_negative", {"productId": "p-1024", "quantity": -1}),
    ("quantity_string", {"productId": "p-1024", "quantity": "2"}),
    ("quantity_fraction", {"productId": "p-1024", "quantity": 1.5}),
    ("quantity_missing", {"productId": "p-1024"}),
    ("product_missing", {"quantity": 2}),
    ("product_number", {"productId": 1024, "quantity": 2}),
    ("body_array", [{"productId": "p-1024", "quantity": 2}]),
]


def _validation_test(body):
    def t(ctx):
        u = ctx.server.new_user()
        k = new_key()
        r = u.post("/api/orders", body, key=k)
        expect_problem(r, 400, "validation-failed", "body %r" % (body,))
        expect_no_orders(u, "after validation-failed")
        expect_created(expect_fresh(u.create_order(k), 201, "same key with a valid body"))
    return t


for _name, _body in VALIDATION_CASES:
    test(_validation_test(_body), "test_validation_%s_is_400_and_not_stored" % _name)


@test
def test_quantity_bounds_1_and_1000_are_valid(ctx):
    u = ctx.server.new_user()
    expect_created(u.create_order(new_key(), quantity=1), quantity=1)
    expect_created(u.create_order(new_key(), quantity=1000), quantity=1000)


# ---- business outcomes: stored -------------------------------------------------------------------

@test
def test_unknown_product_is_422_and_stored(ctx):
    u = ctx.server.new_user()
    k = new_key()
    first = u.create_order(k, product="p-does-not-exist")
    expect_problem(first, 422, "unknown-product", "unknown product")
    expect(not first.replayed, "first 422 must not be a replay: %s" % first.describe())
    again = u.create_order(k, product="p-does-not-exist")
    expect_replay(again, first, "retry of the unknown product")
    expect_problem(again, 422, "unknown-product", "replayed unknown product")
    # The key is spent on that outcome: another body is a reuse, not a new order.
    expect_problem(u.create_order(k), 422, "idempotency-key-reused", "same key, a real product")
    expect_no_orders(u, "after the unknown product")


@test
def test_out_of_stock_is_409_and_stored(ctx):
    # p-limited has stock 3 in a fresh catalog and never more: 4 never fits.
    u = ctx.server.new_user()
    k = new_key()
    first = u.create_order(k, product="p-limited", quantity=4)
    expect_problem(first, 409, "out-of-stock", "4 x p-limited")
    expect(not first.replayed, "first 409 must not be a replay: %s" % first.describe())
    expect_replay(u.create_order(k, product="p-limited", quantity=4), first,
                  "retry of 4 x p-limited")
    expect_no_orders(u, "after out-of-stock")


@test
def test_limited_stock_runs_out_and_the_refusal_is_stored(ctx):
    # A server of its own, so p-limited starts at its seeded stock of 3.
    if not fresh_db_per_server():
        print("     (skipped: needs a fresh database per server, IDEM_TEST_DB_URI with {tmp})")
        return
    with Server(name="orderd-stock") as s:
        u = s.new_user()
        expect_created(u.create_order(new_key(), product="p-limited", quantity=2),
                       product="p-limited", quantity=2, unit_price=999)
        k = new_key()
        first = u.create_order(k, product="p-limited", quantity=2)
        expect_problem(first, 409, "out-of-stock", "2 more x p-limited with 1 left")
        expect_created(u.create_order(new_key(), product="p-limited", quantity=1),
                       product="p-limited", quantity=1, unit_price=999)
        # Even after the stock changed, the retry gets the stored refusal.
        expect_replay(u.create_order(k, product="p-limited", quantity=2), first,
                      "retry of the out-of-stock request")
        expect_eq(order_count(u), 2, "orders of p-limited")


def _stock(uri, product):
    return int(db_query(uri, "SELECT stock FROM products WHERE id = ?", (product,))[0][0])


def _orders_with_key(uri, key):
    return int(db_query(uri, "SELECT count(*) FROM orders WHERE idem_key = ?", (key,))[0][0])


@test
def test_out_of_stock_takes_the_order_back_and_stores_the_409(ctx):
    # The order row and its 201 are written before the stock is reserved (the reservation is
    # the last statement before the commit); a reservation that finds too little stock must take
    # both back: no order, the stock untouched, and the stored answer is the 409, not the 201.
    if not fresh_db_per_server():
        print("     (skipped: needs a fresh database per server, IDEM_TEST_DB_URI with {tmp})")
        return
    with Server(name="orderd-stock-back", extra_args=["--replay-cache-mb", "0"]) as s:
        u = s.new_user()
        expect_eq(_stock(s.db_uri, "p-limited"), 3, "seeded stock of p-limited")
        k = new_key("short")
        first = u.create_order(k, product="p-limited", quantity=4)
        expect_problem(first, 409, "out-of-stock", "4 x p-limited")
        expect_eq(_stock(s.db_uri, "p-limited"), 3, "stock of p-limited after the refusal")
        expect_eq(_orders_with_key(s.db_uri, k), 0, "order rows of the refused key")
        rec = db_query(s.db_uri, "SELECT status, response_status FROM idem_records "
                                 "WHERE idem_key = ?", (k,))
        expect_eq(rec, [["1", "409"]], "record of the refused key (status, response status)")
        # Replayed from the store (no replay cache), byte for byte.
        expect_replay(u.create_order(k, product="p-limited", quantity=4), first,
                      "retry of 4 x p-limited")
        expect_no_orders(u, "after out-of-stock")
        # The whole stock is still there to buy, and then it is gone.
        expect_created(u.create_order(new_key(), product="p-limited", quantity=3),
                       product="p-limited", quantity=3, unit_price=999)
        expect_eq(_stock(s.db_uri, "p-limited"), 0, "stock of p-limited after buying 3")
        expect_problem(u.create_order(new_key(), product="p-limited", quantity=1), 409,
                       "out-of-stock", "1 x p-limited with none left")
        expect_eq(order_count(u), 1, "orders of p-limited")


@test
def test_idempotency_off_baseline_sells_stock_the_same_way(ctx):
    # --idempotency off (a benchmark baseline) runs the same business writes without a record:
    # a 201, the same key again is 409 order-exists, and too little stock is the same 409
    # out-of-stock with no order and no stock taken.
    if not fresh_db_per_server():
        print("     (skipped: needs a fresh database per server, IDEM_TEST_DB_URI with {tmp})")
        return
    with Server(name="orderd-off", extra_args=["--idempotency", "off"]) as s:
        u = s.new_user()
        k = new_key("off")
        expect_created(u.create_order(k, product="p-limited", quantity=2),
                       product="p-limited", quantity=2, unit_price=999)
        expect_problem(u.create_order(k, product="p-limited", quantity=2), 409, "order-exists",
                       "the same key again, without idempotency")
        expect_eq(_stock(s.db_uri, "p-limited"), 1, "stock of p-limited after buying 2")
        k2 = new_key("off-short")
        expect_problem(u.create_order(k2, product="p-limited", quantity=2), 409, "out-of-stock",
                       "2 x p-limited with 1 left")
        expect_eq(_stock(s.db_uri, "p-limited"), 1, "stock of p-limited after the refusal")
        expect_eq(_orders_with_key(s.db_uri, k2), 0, "order rows of the refused key")
        expect_problem(u.create_order(new_key(), product="p-nope"), 422, "unknown-product",
                       "unknown product, without idempotency")
        expect_eq(order_count(u), 1, "orders without idempotency")
        expect_eq(int(db_query(s.db_uri, "SELECT count(*) FROM idem_records")[0][0]), 0,
                  "idempotency records without idempotency")


@test
def test_every_error_is_problem_json(ctx):
    u = ctx.server.new_user()
    k = new_key()
    expect_created(u.create_order(k))
    cases = [
        (u.post("/api/orders", {"productId": "p-1024", "quantity": 2}), 400,
         "idempotency-key-missing"),
        (u.create_order(""), 400, "idempotency-key-invalid"),
        (u.create_order(new_key(), token=None), 401, "unauthorized"),
        (u.get("/api/orders/ord_" + "f" * 32), 404, "order-not-found"),
        (u.get("/api/unknown"), 404, "not-found"),
        (u.request("DELETE", "/api/orders"), 405, "method-not-allowed"),
        (u.post("/api/orders", body=_padded_body(ONE_MIB + 10), key=new_key()), 413,
         "body-too-large"),
        (u.post("/api/orders", body=b"{}", key=new_key(), content_type="text/plain"), 415,
         "unsupported-media-type"),
        (u.post("/api/orders", body=b"{", key=new_key()), 400, "invalid-json"),
        (u.post("/api/orders", {"productId": "p-1024"}, key=new_key()), 400,
         "validation-failed"),
        (u.create_order(k, quantity=5), 422, "idempotency-key-reused"),
        (u.create_order(new_key(), product="p-unknown"), 422, "unknown-product"),
        (u.create_order(new_key(), product="p-limited", quantity=500), 409, "out-of-stock"),
        (u.get("/api/orders?limit=0"), 400, "validation-failed"),
    ]
    for r, status, code in cases:
        expect_problem(r, status, code, "problem %s" % code)


# ---- reading orders ----------------------------------------------------------------------------

@test
def test_list_orders_only_mine_newest_first_paginated(ctx):
    me, other = ctx.server.new_user("me"), ctx.server.new_user("other")
    mine = []
    for i in range(5):
        mine.append(expect_created(me.create_order(new_key(), quantity=i + 1),
                                   quantity=i + 1)["orderId"])
        if i % 2 == 0:
            expect_created(other.create_order(new_key()))
    newest_first = list(reversed(mine))
    # Default page: everything (5 < 20), newest first, no next page.
    r = expect_status(me.get("/api/orders"), 200, "GET /api/orders")
    expect_eq(r.content_type, "application/json", "list Content-Type")
    doc = r.json()
    expect_eq([o.get("orderId") for o in doc.get("orders", [])], newest_first,
              "my orders, newest first")
    expect("nextCursor" in doc, "list body must have nextCursor: %s" % r.describe())
    expect_eq(doc.get("nextCursor"), None, "nextCursor of the only page")
    # Pages of 2: 2 + 2 + 1, with cursors.
    seen, cursor, pages = [], None, 0
    while True:
        path = "/api/orders?limit=2" + ("&cursor=" + cursor if cursor else "")
        page = expect_status(me.get(path), 200, "GET " + path).json()
        expect(len(page["orders"]) <= 2, "page of limit 2 has %d orders" % len(page["orders"]))
        seen.extend(o["orderId"] for o in page["orders"])
        pages += 1
        cursor = page.get("nextCursor")
        if cursor is None or pages > 5:
            break
        expect(isinstance(cursor, str) and cursor, "nextCursor must be a string: %r" % page)
    expect_eq(seen, newest_first, "orders across pages of 2")
    expect_eq(pages, 3, "number of pages of 2 for 5 orders")
    expect_eq(len(other.all_orders()), 3, "the other user's orders")


@test
def test_list_orders_bad_limit_is_400(ctx):
    u = ctx.server.new_user()
    for limit in ("0", "101", "-1", "abc", "", "2.5"):
        r = u.get("/api/orders?limit=" + limit)
        expect_problem(r, 400, "validation-failed", "GET /api/orders?limit=%s" % limit)
    expect_status(u.get("/api/orders?limit=1"), 200, "limit=1")
    expect_status(u.get("/api/orders?limit=100"), 200, "limit=100")


@test
def test_get_order_of_another_user_is_404(ctx):
    a, b = ctx.server.new_user("alice"), ctx.server.new_user("bob")
    created = a.create_order(new_key())
    doc = expect_created(created)
    expect_eq(expect_status(a.get("/api/orders/" + doc["orderId"]), 200, "owner GET").json(), doc,
              "owner's GET body")
    expect_problem(b.get("/api/orders/" + doc["orderId"]), 404, "order-not-found",
                   "bob GETs alice's order")
    expect_problem(a.get("/api/orders/ord_" + "0" * 32), 404, "order-not-found",
                   "GET an unknown order")


# ---- cancel --------------------------------------------------------------------------------------

@test
def test_cancel_is_200_cancelled_and_idempotent(ctx):
    u = ctx.server.new_user()
    oid = expect_created(u.create_order(new_key()))["orderId"]
    k1 = new_key("cancel")
    first = u.cancel(oid, k1)
    expect_fresh(first, 200, "cancel")
    expect_eq(first.content_type, "application/json", "cancel Content-Type")
    doc = first.json()
    expect_eq(doc.get("orderId"), oid, "cancelled orderId")
    expect_eq(doc.get("status"), "cancelled", "cancel status")
    expect_eq(u.get("/api/orders/" + oid).json().get("status"), "cancelled",
              "GET after cancel: status")
    # Replay with the same key.
    expect_replay(u.cancel(oid, k1), first, "cancel retry, same key")
    # Cancelling again with a new key: a state transition already done, the same 200 body.
    second = u.cancel(oid, new_key("cancel"))
    expect_fresh(second, 200, "cancel again with a new key")
    expect_eq(second.json(), doc, "second cancel body vs first")
    # A body, when sent, may be {} (and must be JSON).
    third = u.request("POST", "/api/orders/%s/cancel" % oid, body=b"{}", key=new_key())
    expect_status(third, 200, "cancel with {}")
    expect_eq(third.json(), doc, "cancel with {} body")
    r = u.request("POST", "/api/orders/%s/cancel" % oid, body=b"{oops", key=new_key())
    expect_problem(r, 400, "invalid-json", "cancel with a body that is not JSON")
    r = u.request("POST", "/api/orders/%s/cancel" % oid, body=b"{}", key=new_key(),
                  content_type="text/plain")
    expect_problem(r, 415, "unsupported-media-type", "cancel with a text/plain body")


@test
def test_cancel_other_users_or_unknown_order_is_404_and_stored(ctx):
    a, b = ctx.server.new_user("alice"), ctx.server.new_user("bob")
    oid = expect_created(a.create_order(new_key()))["orderId"]
    k = new_key()
    first = b.cancel(oid, k)
    expect_problem(first, 404, "order-not-found", "bob cancels alice's order")
    expect_replay(b.cancel(oid, k), first, "bob's retry")
    expect_eq(a.get("/api/orders/" + oid).json().get("status"), "created",
              "alice's order after bob's cancel")
    k2 = new_key()
    unknown = "ord_" + "e" * 32
    first = a.cancel(unknown, k2)
    expect_problem(first, 404, "order-not-found", "cancel an unknown order")
    expect_replay(a.cancel(unknown, k2), first, "retry of the unknown cancel")


@test
def test_cancel_same_key_other_order_is_422_reused(ctx):
    # The path parameter is part of the fingerprint.
    u = ctx.server.new_user()
    o1 = expect_created(u.create_order(new_key()))["orderId"]
    o2 = expect_created(u.create_order(new_key()))["orderId"]
    k = new_key()
    expect_status(u.cancel(o1, k), 200, "cancel o1")
    expect_problem(u.cancel(o2, k), 422, "idempotency-key-reused", "same key on o2")
    expect_eq(u.get("/api/orders/" + o2).json().get("status"), "created", "o2 status")


# ---- profile -------------------------------------------------------------------------------------

@test
def test_profile_put_set_semantics_with_and_without_key(ctx):
    u = ctx.server.new_user()
    p1 = {"name": "Ada Lovelace", "email": "ada@example.com"}
    r = expect_fresh(u.put("/api/me/profile", p1), 200, "first PUT without key")
    doc = r.json()
    expect_eq((doc.get("name"), doc.get("email"), doc.get("changed")),
              (p1["name"], p1["email"], True), "first PUT body")
    expect(isinstance(doc.get("updatedAt"), str), "updatedAt missing: %s" % r.describe())
    r = expect_fresh(u.put("/api/me/profile", p1), 200, "same PUT again without key")
    expect_eq(r.json().get("changed"), False, "same values again: changed")
    p2 = {"name": "Ada King", "email": "ada@example.com"}
    k = new_key("profile")
    first = expect_fresh(u.put("/api/me/profile", p2, key=k), 200, "PUT new values with a key")
    expect_eq(first.json().get("changed"), True, "new values with a key: changed")
    replay = u.put("/api/me/profile", p2, key=k)
    expect_replay(replay, first, "PUT retry with the same key")
    expect_eq(replay.json().get("changed"), True, "the replay keeps the stored changed:true")
    r = expect_fresh(u.put("/api/me/profile", p2, key=new_key()), 200, "same values, new key")
    expect_eq(r.json().get("changed"), False, "same values with a new key: changed")
    expect_problem(u.put("/api/me/profile", p1, key=k), 422, "idempotency-key-reused",
                   "PUT other values with a used key")


def profile_emails(server, user):
    """The recipients of user's "profile changed" emails in orderd's outbox."""
    uid = db_query(server.db_uri, "SELECT id FROM users WHERE name = ?", (user.user,))[0][0]
    rows = db_query(server.db_uri, "SELECT recipient, payload FROM outbox")
    return sorted(r[0] for r in rows if "profile_changed" in r[1] and uid in r[1])


@test
def test_concurrent_identical_profile_puts_change_once_and_email_old_address(ctx):
    # 16 identical PUTs at once (no key, so nothing dedupes them but the write
    # itself) -> one says changed and queues one email; on PostgreSQL they all read the old row at
    # once unless the write decides.
    import threading
    u = ctx.server.new_user("race")
    body = {"name": "Grace", "email": "grace@example.com"}
    results = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def put():
        start.wait()
        r = u.put("/api/me/profile", body)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=put) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    expect(all(r.status == 200 for r in results), "all 200: %s" %
           [r.describe(150) for r in results if r.status != 200][:2])
    changed = [r for r in results if r.json().get("changed")]
    expect_eq(len(changed), 1, "PUTs that say changed")
    expect_eq(profile_emails(ctx.server, u), ["grace@example.com"], "emails queued")
    # A new address: both the new and the old one are told.
    r = u.put("/api/me/profile", {"name": "Grace", "email": "hopper@example.com"})
    expect_eq(r.json().get("changed"), True, "email changed")
    expect_eq(profile_emails(ctx.server, u),
              ["grace@example.com", "grace@example.com", "hopper@example.com"],
              "emails after the address change (the old address is told too)")


@test
def test_metrics_on_their_own_listener(ctx):
    # With --metrics-listen, a scraper reads /metrics on a
    # loopback listener of its own, and the API's listener no longer serves it.
    import re as _re
    import http.client as _hc
    with Server(name="orderd-metrics", extra_args=["--metrics-listen", "127.0.0.1:0"]) as s:
        with open(s.stdout_path) as f:
            m = _re.search(r"\(metrics http://127\.0\.0\.1:(\d+)\)", f.read())
        expect(m is not None, "the listening line names the metrics listener")
        port = int(m.group(1))
        u = s.new_user("metrics")
        expect_eq(u.get("/api/orders").status, 200, "the API works")
        expect_problem(s.client().get("/metrics"), 404, "not-found", "/metrics on the API listener")
        conn = _hc.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            text = r.read().decode()
            expect(r.status == 200 and "orderd_requests_total" in text,
                   "/metrics on the metrics listener: %d" % r.status)
            samples = parse_metrics(text)
            expect(metric_value(samples, "orderd_requests_total", operation="orders.list",
                                outcome="none") >= 1, "it counts the API's requests")
            conn.request("GET", "/api/orders")
            r = conn.getresponse()
            r.read()
            expect_eq(r.status, 404, "the metrics listener serves nothing else")
        finally:
            conn.close()
    code = subprocess.run([ORDERD, "serve", "--metrics-listen", "nope"],
                          capture_output=True, timeout=10).returncode
    expect_eq(code, 2, "a bad --metrics-listen is a usage error")


@test
def test_profile_validation_is_400(ctx):
    u = ctx.server.new_user()
    k = new_key()
    for body in ({"name": "", "email": "a@b.c"}, {"name": "A", "email": "no-at-sign"},
                 {"name": "A"}, {"name": "x" * 201, "email": "a@b.c"},
                 {"name": "A", "email": "@"}, {"name": 5, "email": "a@b.c"},
                 # Control characters could forge a log line or an email header, or drive a
                 # terminal that shows the profile.
                 {"name": "Mallory\r\nX-Admin: yes", "email": "a@b.c"},
                 {"name": "A\x1b[2J", "email": "a@b.c"},
                 {"name": "A", "email": "a@b.c\nBcc: all@example.com"},
                 {"name": "A\u0085B", "email": "a@b.c"}):
        r = u.put("/api/me/profile", body, key=k)
        expect_problem(r, 400, "validation-failed", "PUT %r" % (body,))
    r = u.put("/api/me/profile", {"name": "Grace", "email": "grace@example.com"}, key=k)
    expect_fresh(r, 200, "same key after validation failures")
    expect_eq(r.json().get("changed"), True, "valid profile after refusals: changed")


@test
def test_profiles_are_per_user(ctx):
    a, b = ctx.server.new_user("alice"), ctx.server.new_user("bob")
    p = {"name": "Same", "email": "same@example.com"}
    expect_eq(expect_status(a.put("/api/me/profile", p), 200, "alice").json().get("changed"),
              True, "alice's first profile")
    expect_eq(expect_status(b.put("/api/me/profile", p), 200, "bob").json().get("changed"),
              True, "bob's first profile (same values as alice's)")


# ---- health and metrics --------------------------------------------------------------------------

@test
def test_healthz_is_200_without_auth(ctx):
    r = ctx.server.client().get("/healthz")
    expect_status(r, 200, "GET /healthz")
    doc = r.json()
    expect_eq(doc.get("status"), "ok", "healthz status")
    expect_eq(doc.get("store"), store_kind(ctx.server.db_uri), "healthz store")


@test
def test_metrics_count_executed_and_replayed(ctx):
    c = ctx.server.client()

    def snapshot():
        r = expect_status(c.get("/metrics"), 200, "GET /metrics")
        expect(r.content_type == "text/plain",
               "metrics Content-Type: %s" % r.header("Content-Type"))
        return parse_metrics(r.body.decode("utf-8", "replace")), r

    before, _ = snapshot()
    u = ctx.server.new_user()
    k = new_key()
    expect_created(u.create_order(k))
    expect_status(u.create_order(k), 201, "replay")
    expect_problem(u.create_order(k, quantity=9), 422, "idempotency-key-reused", "mismatch")
    after, raw = snapshot()
    name = "orderd_requests_total"
    for outcome, delta in (("executed", 1), ("replayed", 1), ("mismatch", 1)):
        b = metric_value(before, name, operation="orders.create", outcome=outcome)
        a = metric_value(after, name, operation="orders.create", outcome=outcome)
        if a - b != delta:
            fail('%s{operation="orders.create",outcome="%s"} moved by %g (from %g to %g), '
                 "expected %d\n%s" % (name, outcome, a - b, b, a, delta,
                                      raw.body.decode("utf-8", "replace")[:3000]))
    cnt = metric_value(after, "orderd_request_duration_seconds_count", operation="orders.create")
    expect(cnt >= 3, "orderd_request_duration_seconds_count{operation=\"orders.create\"} is %g"
           % cnt)
    expect(any(n == "orderd_request_duration_seconds_bucket" and "le" in lab
               for n, lab, _ in after), "no orderd_request_duration_seconds_bucket samples")


# ---- retention: after the record is gone, the order row still dedupes ----------------------------

def _wait_record_swept(uri, key, timeout=30.0):
    wait_until("the sweeper to delete the expired record of %s" % key, lambda: db_query(
        uri, "SELECT count(*) FROM idem_records WHERE idem_key = ?", (key,))[0][0] == "0",
        timeout_s=timeout, pause_s=0.2)


def _expire_record(uri, key):
    """24 hours pass in one UPDATE (SQLite or PostgreSQL): the record's expiry is moved back."""
    rows = db_query(uri, "UPDATE idem_records SET expires_ms = 1 WHERE idem_key = ? "
                         "RETURNING idem_key", (key,))
    expect_eq(len(rows), 1, "idempotency records of the key (in idem_records)")


@test
def test_late_retry_after_retention_gets_the_existing_order(ctx):
    # 24 hours pass in one UPDATE: the record's expiry is moved to the past, and the server's own
    # sweeper (every second here) deletes it, as it would after the published retention.  The
    # replay cache is off: its entries die with the record's real retention, which an UPDATE
    # behind the server's back does not shorten (test_replay_cache.py).
    with Server(name="orderd-retention",
                extra_args=["--sweep-interval-s", "1", "--replay-cache-mb", "0"]) as s:
        u = s.new_user()
        k = new_key("late")
        first = u.create_order(k, quantity=6)
        doc = expect_created(first, quantity=6)
        _expire_record(s.db_uri, k)
        _wait_record_swept(s.db_uri, k)
        stock = _stock(s.db_uri, "p-1024")
        late = u.create_order(k, quantity=6)
        expect_status(late, 200, "late retry with the same body")
        expect(late.replayed, "late retry should say Idempotent-Replayed: true: %s"
               % late.describe())
        expect_eq(late.json(), doc, "late retry body vs the original order")
        expect_eq(_stock(s.db_uri, "p-1024"), stock, "stock after the late retry")
        expect_problem(u.create_order(k, quantity=7), 422, "idempotency-key-reused",
                       "late retry with another body")
        # Another body that names no product: the order row answers, not the refusal.
        k2 = new_key("late-other")
        doc2 = expect_created(u.create_order(k2))
        _expire_record(s.db_uri, k2)
        _wait_record_swept(s.db_uri, k2)
        expect_problem(u.create_order(k2, product="p-nope"), 422, "idempotency-key-reused",
                       "late retry naming an unknown product")
        expect_eq(sorted(o["orderId"] for o in u.all_orders()),
                  sorted([doc["orderId"], doc2["orderId"]]), "orders after the late retries")


@test
def test_expired_record_not_yet_swept_is_a_new_request_that_finds_the_order(ctx):
    # Past its expiry a record no longer answers, even before the sweeper removed it.  (Replay
    # cache off, as above: the expiry is moved by hand.)
    with Server(name="orderd-expired",
                extra_args=["--sweep-interval-s", "0", "--replay-cache-mb", "0"]) as s:
        u = s.new_user()
        k = new_key("expired")
        doc = expect_created(u.create_order(k))
        _expire_record(s.db_uri, k)
        late = u.create_order(k)
        expect_status(late, 200, "retry after the record expired")
        expect(late.replayed, "expected Idempotent-Replayed: true: %s" % late.describe())
        expect_eq(late.json(), doc, "late retry body vs the original order")
        expect_eq(len(u.all_orders()), 1, "orders after the late retry")


# ---- store busy: 503, nothing executed -----------------------------------------------------------

@test
def test_store_busy_is_503_with_retry_after_and_nothing_runs(ctx):
    # Another process holds the store's lock (SQLite: the file; PostgreSQL: idem_records) for
    # longer than the store waits: 503 with Retry-After, and nothing ran.
    s = ctx.server
    u = s.new_user()
    k = new_key()
    with store_locked(s.db_uri):
        r = u.create_order(k, timeout=30)
    expect_problem(r, 503, "idempotency-store-unavailable", "POST while the store is locked")
    retry_after_seconds(r, "503")
    expect_no_orders(u, "after the 503")
    expect_created(expect_fresh(u.create_order(k), 201, "same key once the store is back"))


# ---- requests in progress (ORDERD_TEST_HOOKS=1) --------------------------------------------------

def _create_counter(server, outcome):
    r = expect_status(server.client().get("/metrics"), 200, "GET /metrics")
    return metric_value(parse_metrics(r.body.decode("utf-8", "replace")), "orderd_requests_total",
                        operation="orders.create", outcome=outcome)


def _wait_phase1(server, key, out):
    """Until the request with `key` (in_thread's box `out`) is in progress: a duplicate finds it."""
    wait_order_committed(server, key, lambda: "error" in out or "resp" in out)
    if "error" in out:
        fail("the first request with key %s raised %r" % (key, out["error"]))


@test
def test_in_progress_duplicate_waits_then_409_with_retry_after(ctx):
    s = ctx.hooks
    u = s.new_user()
    k = new_key("slow")
    in_progress_before = _create_counter(s, "in_progress")
    t0 = time.monotonic()
    t, out = in_thread(lambda: u.create_order(k, headers={"X-Test-Delay-Ms": "4000"}))
    _wait_phase1(s, k, out)
    dup = u.create_order(k)
    dup_done = time.monotonic() - t0
    expect_problem(dup, 409, "idempotency-request-in-progress", "duplicate during a 4 s request")
    retry_after_seconds(dup, "409 in progress")
    expect(1.7 <= dup.elapsed <= 3.5,
           "the duplicate should wait about wait_ms (2 s) before the 409; it took %.2f s"
           % dup.elapsed)
    first = joined(t, out, "the slow first request", timeout=30)
    expect_created(expect_fresh(first, 201, "the slow first request"))
    expect(first.elapsed >= 3.8, "X-Test-Delay-Ms: 4000 answered in %.2f s" % first.elapsed)
    expect(dup_done < first.elapsed, "the 409 came after the first request finished")
    expect_replay(u.create_order(k), first, "retry after the first finished")
    expect_eq(order_count(u), 1, "orders after the in-progress duplicate")
    expect_eq(_create_counter(s, "in_progress") - in_progress_before, 1,
              'orderd_requests_total{operation="orders.create",outcome="in_progress"} increase')


@test
def test_in_progress_different_body_is_422(ctx):
    s = ctx.hooks
    u = s.new_user()
    k = new_key("slow")
    t, out = in_thread(lambda: u.create_order(k, headers={"X-Test-Delay-Ms": "3000"}))
    _wait_phase1(s, k, out)
    r = u.create_order(k, quantity=7)
    expect_problem(r, 422, "idempotency-key-reused", "other body while the first runs")
    first = joined(t, out, "the slow first request", timeout=30)
    expect_created(first)
    expect_eq(order_count(u), 1, "orders")


@test
def test_in_progress_duplicate_waits_and_gets_the_replay(ctx):
    s = ctx.hooks
    u = s.new_user()
    k = new_key("short")
    waited_before = _create_counter(s, "waited")
    # The first sleeps 1.5 s after phase 1: under orderd's 2 s wait, so the duplicate sent once
    # phase 1 is seen waits for it and replays it (rather than answering 409).
    t, out = in_thread(lambda: u.create_order(k, headers={"X-Test-Delay-Ms": "1500"}))
    _wait_phase1(s, k, out)
    dup = u.create_order(k)
    first = joined(t, out, "the first request", timeout=30)
    expect_created(expect_fresh(first, 201, "the first request"))
    expect_replay(dup, first, "the duplicate that waited")
    expect(dup.elapsed >= 0.2, "the duplicate answered in %.2f s: it did not wait for the first"
           % dup.elapsed)
    expect_eq(order_count(u), 1, "orders after the waiting duplicate")
    expect_eq(_create_counter(s, "waited") - waited_before, 1,
              'orderd_requests_total{operation="orders.create",outcome="waited"} increase')


@test
def test_test_hooks_are_off_without_the_env(ctx):
    # A production server must not sleep or crash because a client sent a header.
    u = ctx.server.new_user()
    # A delay asked for far above what any build takes to answer: honoured, it would show.
    r = u.create_order(new_key(), headers={"X-Test-Delay-Ms": "20000"})
    expect_created(r)
    expect(r.elapsed < 10.0, "X-Test-Delay-Ms was honoured without ORDERD_TEST_HOOKS (%.2f s)"
           % r.elapsed)
    r = u.create_order(new_key(), headers={"X-Test-Crash": "after-order-created"})
    expect_created(r)
    expect(ctx.server.alive(), "X-Test-Crash killed a server without ORDERD_TEST_HOOKS")


if __name__ == "__main__":
    run("test_http_semantics", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
