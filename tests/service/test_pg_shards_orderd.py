#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_pg_shards_orderd.py - orderd on a shard set (docs/shards.md, "orderd on a shard set"):
`orderd serve --db shards:DIRECTORY_URI --catalogue URI`, the directory naming three clusters,
each a database of the with_pg.sh server, and the catalogue (users, tokens) one more.  Buckets
0-341 are on c1, 342-682 on c2, the rest on c3, set up with the SQL of docs/shards.md.

  - `orderd token create` with the same two flags puts the user and its token in the catalogue,
    and no cluster holds users;
  - the orders of many users land in their user's cluster (SHA-256 of the user id, first 8
    bytes big-endian, mod 1024, computed here) and in no other; a retry replays;
  - the stock of products is taken in the catalogue, once per order (a reservation keyed by
    user, operation and Idempotency-Key), also when orderd is killed between the reservation and
    the order and the order is retried; a cancel gives it back once;
  - an order killed once its record reached `stock_reserved`, whose client never retries, is
    made by the completer on the user's cluster, its stock taken once, and a late retry replays
    the completer's answer (with a provider: the order charged once, and paid); a record of an
    older version ("PRICE CURRENCY", without the
    order's input) is passed by the completer and finished by the client's retry;
  - a bucket moved by hand while orderd runs (frozen and fenced first, then flipped and opened
    at the new owner): an order of its user gets 503 with Retry-After while it moves, then is
    made at the new owner, once, and replays there;
  - `idem-gateway shards move` of a user's bucket carries the user's order, profile and outbox
    to the new owner, where they are read and the order's retry replays; a stale write of the
    user's rows on the old cluster is refused;
  - a provider webhook carrying the user in its metadata is recorded in that user's cluster's
    inbox, in a row that names the user, and its second delivery is a duplicate there;
  - /metrics labels the store's series by cluster (shard="c1"), each family's TYPE once.

Runs only under tests/pg/with_pg.sh (CTest: service-pg.pg_shards_orderd).
"""

import http.client
import json
import subprocess

import harness
from harness import Server, expect, expect_eq, new_key, run, test
from gateway_harness import GATEWAY
from provider import WEBHOOK_SECRET, Provider, sign

CLUSTERS = harness.SHARD_CLUSTERS
LEASE_MS = 1000
COMPLETER_MS = 200
bucket_of = harness.shard_bucket
owner_of = harness.shard_owner


class ShardedOrderd(Server):
    """orderd on the set: --db shards:DIR --catalogue CAT on every command line."""

    def __init__(self, dir_uri, catalogue_uri, **kw):
        super().__init__(db_uri="shards:" + dir_uri, **kw)
        self.catalogue = catalogue_uri

    def migrate(self):
        self._run_tool(["migrate", "--db", self.db_uri, "--catalogue", self.catalogue], "migrate")
        self._migrated = True

    def serve_command(self):
        return super().serve_command() + ["--catalogue", self.catalogue]

    def create_token(self, user):
        out = self._run_tool(["token", "create", "--db", self.db_uri, "--catalogue",
                              self.catalogue, "--user", user], "token create")
        return out.strip()


class Ctx:
    def __init__(self):
        self.dbs = []
        self.srv = None
        self.dir_uri, self.cluster_uris, self.dbs = harness.pg_shard_set_by_hand("osh")
        self.cat_uri, name = harness.pg_create_database("oshcat")
        self.dbs.append(name)
        self.srv = ShardedOrderd(self.dir_uri, self.cat_uri, name="orderd-shards",
                                 env={"ORDERD_TEST_HOOKS": "1",
                                      "ORDERD_WEBHOOK_SECRET": WEBHOOK_SECRET},
                                 extra_args=["--lease-ms", str(LEASE_MS),
                                             "--completer-interval-ms", str(COMPLETER_MS)])
        self.srv.start()

    def user(self, prefix="u"):
        """A new user (token in the catalogue): (client, user id)."""
        c = self.srv.new_user(prefix)
        rows = harness.psql(self.cat_uri, "SELECT id FROM users WHERE name = :'n';\n",
                            {"n": c.user})
        expect_eq(len(rows), 1, "users named %s in the catalogue" % c.user)
        return c, rows[0][0]

    def user_on(self, cluster, prefix="u"):
        while True:
            c, uid = self.user(prefix)
            if owner_of(bucket_of(uid)) == cluster:
                return c, uid

    def orders(self, i, user_id):
        return [r[0] for r in harness.psql(self.cluster_uris[i],
                                           "SELECT id FROM orders WHERE user_id = :'u';\n",
                                           {"u": user_id})]

    def where(self, user_id):
        return [i for i in range(3) if self.orders(i, user_id)]

    def stock(self, product="p-1024"):
        """The stock of `product` in the catalogue."""
        return int(harness.psql(self.cat_uri, "SELECT stock FROM products WHERE id = :'p';\n",
                                {"p": product})[0][0])

    def cluster_stocks(self, product="p-1024"):
        return [harness.psql(uri, "SELECT stock FROM products WHERE id = :'p';\n",
                             {"p": product})[0][0] for uri in self.cluster_uris]

    def reservations(self, user_id):
        return harness.psql(self.cat_uri, "SELECT idem_key, quantity, released FROM"
                                          " stock_reservations WHERE user_id = :'u';\n",
                            {"u": user_id})

    def record(self, i, user_id, key):
        """(status, recovery point) of the record of user_id's order with `key` on cluster i."""
        rows = harness.psql(self.cluster_uris[i], "SELECT status, recovery_point FROM idem_records"
                                                  " WHERE principal = :'u' AND operation ="
                                                  " 'orders.create' AND idem_key = :'k';\n",
                            {"u": user_id, "k": key})
        return tuple(rows[0]) if rows else None

    def close(self):
        if self.srv:
            self.srv.close()
        for name in self.dbs:
            harness.pg_drop_database(name)


@test
def tokens_are_made_in_the_catalogue_only(ctx):
    c, uid = ctx.user("tok")
    expect(uid.startswith("usr_"), "a user id: %r" % uid)
    for i, uri in enumerate(ctx.cluster_uris):
        expect_eq(harness.psql(uri, "SELECT count(*) FROM users;\n")[0][0], "0",
                  "users in cluster %s" % CLUSTERS[i])
    expect_eq(c.get("/api/orders").status, 200, "the token works")


@test
def orders_land_in_their_user_s_cluster_only_and_replay(ctx):
    # Four users of each cluster (random users would all miss one cluster once in 40 runs).
    seen = set()
    for n in range(12):
        c, uid = ctx.user_on(n % 3, "many")
        key = new_key("shard")
        body = {"productId": "p-1024", "quantity": 1}
        first = c.post("/api/orders", body, key=key)
        expect_eq(first.status, 201, "order of %s: %s" % (uid, first.describe()))
        again = c.post("/api/orders", body, key=key)
        expect(again.status == 201 and again.replayed and again.body == first.body,
               "a retry of %s replays: %s" % (key, again.describe()))
        where = ctx.where(uid)
        expect_eq(where, [owner_of(bucket_of(uid))],
                  "clusters holding %s's orders (bucket %d)" % (uid, bucket_of(uid)))
        expect_eq(len(ctx.orders(where[0], uid)), 1, "orders of %s" % uid)
        got = c.get("/api/orders/" + first.json()["orderId"])
        expect_eq(got.status, 200, "GET of the order on its cluster")
        seen.add(where[0])
    expect_eq(seen, {0, 1, 2}, "the clusters that got orders")


@test
def a_bucket_moved_by_hand_is_503_then_made_once_at_the_new_owner(ctx):
    c, uid = ctx.user_on(0, "move")
    b = bucket_of(uid)
    # Frozen and fenced: the directory marks it moving, its owner gives up its fence row.
    harness.psql(ctx.dir_uri, "UPDATE idem_shard_buckets SET moving = 1 WHERE bucket = %d;\n" % b)
    harness.psql(ctx.cluster_uris[0], "DELETE FROM idem_buckets WHERE bucket = %d;\n" % b)
    key = new_key("move")
    body = {"productId": "p-1024", "quantity": 2}
    r = c.post("/api/orders", body, key=key)
    expect_eq(r.status, 503, "an order while its bucket moves: %s" % r.describe())
    expect(r.header("Retry-After") is not None, "503 with a Retry-After")
    expect_eq(ctx.where(uid), [], "clusters holding an order after the 503")
    # Flipped to c2 and opened there.
    harness.psql(ctx.dir_uri, "UPDATE idem_shard_buckets SET cluster = 'c2', epoch = epoch + 1,"
                              " moving = 0 WHERE bucket = %d;\n" % b)
    harness.psql(ctx.cluster_uris[1], "INSERT INTO idem_buckets VALUES (%d, 2);\n" % b)
    def posted():
        resp = c.post("/api/orders", body, key=key)
        return resp if resp.status != 503 else None

    r = harness.wait_until("an answer other than 503 once the move ended", posted, timeout_s=5)
    expect_eq(r.status, 201, "the order once the move ended: %s" % r.describe())
    expect_eq(ctx.where(uid), [1], "clusters holding the order")
    expect_eq(len(ctx.orders(1, uid)), 1, "orders at the new owner")
    again = c.post("/api/orders", body, key=key)
    expect(again.status == 201 and again.replayed, "the retry replays: %s" % again.describe())
    expect_eq(len(ctx.orders(1, uid)), 1, "orders at the new owner after the retry")

def user_rows(uri, table, uid):
    return int(harness.psql(uri, "SELECT count(*) FROM %s WHERE user_id = :'u';\n" % table,
                            {"u": uid})[0][0])


@test
def a_move_carries_the_user_s_orders_profile_and_outbox(ctx):
    c, uid = ctx.user_on(0, "carry")
    b = bucket_of(uid)
    key = new_key("carry")
    body = {"productId": "p-1024", "quantity": 1}
    first = c.post("/api/orders", body, key=key)
    expect_eq(first.status, 201, "the order before the move: %s" % first.describe())
    profile = c.put("/api/me/profile", {"name": "Ada", "email": "ada@example.org"},
                    key=new_key("carry-profile"))
    expect_eq(profile.status, 200, "the profile before the move: %s" % profile.describe())
    tables = ("orders", "profiles", "outbox")
    before = {t: user_rows(ctx.cluster_uris[0], t, uid) for t in tables}
    expect(before["orders"] == 1 and before["profiles"] == 1 and before["outbox"] >= 1,
           "the user's rows on c1 before the move: %r" % before)

    move = subprocess.run([GATEWAY, "shards", "move", "--directory", ctx.dir_uri, str(b),
                           "--to", "c3"], capture_output=True, timeout=60)
    expect_eq(move.returncode, 0, "shards move: %s" % move.stderr.decode())
    after = {t: user_rows(ctx.cluster_uris[2], t, uid) for t in tables}
    expect_eq(after, before, "the user's rows on c3 after the move")
    for t in tables:
        expect_eq(user_rows(ctx.cluster_uris[0], t, uid), 0, "the user's %s left on c1" % t)

    def listed():
        r = c.get("/api/orders")
        return r if r.status == 200 else None

    r = harness.wait_until("the order list at the new owner", listed, timeout_s=5)
    expect(first.json()["orderId"] in r.body.decode(), "the moved order is listed: %s"
           % r.describe())
    expect_eq(c.get("/api/orders/" + first.json()["orderId"]).status, 200,
              "GET of the moved order")
    again = c.post("/api/orders", body, key=key)
    expect(again.status == 201 and again.replayed and again.body == first.body,
           "the order's retry replays at the new owner: %s" % again.describe())
    # A write of the user's rows that reaches c1 anyway (a stale map) is refused there at commit.
    sql = ("INSERT INTO outbox (id, kind, dedupe_key, recipient, payload, status, next_attempt_ms,"
           " created_at, user_id) VALUES ('stale', 'k', 'stale', 'r', '{}', 'pending', 0, 'now',"
           " :'u');\n")
    out = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", "u=" + uid,
                          ctx.cluster_uris[0]], input=sql.encode(), capture_output=True)
    expect(out.returncode != 0 and b"not on this cluster" in out.stderr,
           "an outbox row of the user on c1 refused: %s" % out.stderr.decode())


def retry_until_final(client, body, key, deadline_s=30):
    """Retries POST /api/orders past 409 (in progress), 503 and dropped connections."""
    def posted():
        try:
            r = client.post("/api/orders", body, key=key)
        except (OSError, http.client.HTTPException):
            return None
        return r if r.status not in (409, 503) else None

    return harness.wait_until("a final answer for %s" % key, posted, timeout_s=deadline_s,
                              pause_s=0.2)


@test
def stock_is_taken_on_the_catalogue_once_per_order(ctx):
    c, uid = ctx.user("stock")
    clusters = ctx.cluster_stocks()
    before = ctx.stock()
    body = {"productId": "p-1024", "quantity": 3}
    key = new_key("stock")
    r = c.post("/api/orders", body, key=key)
    expect_eq(r.status, 201, "an order: %s" % r.describe())
    expect_eq(ctx.stock(), before - 3, "the catalogue's stock after one order")
    again = c.post("/api/orders", body, key=key)
    expect(again.status == 201 and again.replayed, "a retry replays: %s" % again.describe())
    expect_eq(ctx.stock(), before - 3, "the catalogue's stock after the retry")
    expect_eq(ctx.reservations(uid), [[key, "3", "0"]], "the reservation of the order")
    expect_eq(ctx.cluster_stocks(), clusters, "the clusters' product rows (not used)")
    r = c.post("/api/orders", {"productId": "p-none", "quantity": 1}, key=new_key("none"))
    expect_eq(r.status, 422, "an unknown product: %s" % r.describe())
    expect_eq(ctx.where(uid), [owner_of(bucket_of(uid))], "where the orders are")
    expect_eq(len(ctx.orders(ctx.where(uid)[0], uid)), 1, "orders (the refused one is none)")


@test
def an_order_killed_after_its_reservation_takes_the_stock_once(ctx):
    c, uid = ctx.user("crash")
    before = ctx.stock()
    body = {"productId": "p-1024", "quantity": 5}
    key = new_key("crash")
    try:
        c.post("/api/orders", body, key=key, headers={"X-Test-Crash": "after-stock-reserved"},
               timeout=10)
        expect(False, "X-Test-Crash: after-stock-reserved should drop the connection")
    except (OSError, http.client.HTTPException):
        pass
    expect(ctx.srv.wait_exit(10) is not None, "orderd did not exit after X-Test-Crash")
    expect_eq(ctx.stock(), before - 5, "the catalogue's stock right after the crash")
    expect_eq(ctx.where(uid), [], "clusters holding an order right after the crash")
    ctx.srv.start()
    r = retry_until_final(c, body, key)
    expect_eq(r.status, 201, "the retry after the crash: %s" % r.describe())
    expect_eq(ctx.stock(), before - 5, "the catalogue's stock after the retry (taken once)")
    expect_eq(ctx.reservations(uid), [[key, "5", "0"]], "reservations of the order")
    home = owner_of(bucket_of(uid))
    expect_eq(ctx.where(uid), [home], "where the order is")
    expect_eq(len(ctx.orders(home, uid)), 1, "orders after the retry")
    again = c.post("/api/orders", body, key=key)
    expect(again.status == 201 and again.replayed and again.body == r.body,
           "the next retry replays: %s" % again.describe())
    expect_eq(ctx.stock(), before - 5, "the catalogue's stock after the replay")


def crash_at_the_stock_point(srv, c, body, key, hook="after-stock-reserved-point"):
    """POST /api/orders that kills orderd `srv` at `hook` (the record at stock_reserved)."""
    try:
        c.post("/api/orders", body, key=key, headers={"X-Test-Crash": hook}, timeout=10)
        expect(False, "X-Test-Crash: %s should drop the connection" % hook)
    except (OSError, http.client.HTTPException):
        pass
    expect(srv.wait_exit(10) is not None, "orderd did not exit after X-Test-Crash")


@test
def an_order_left_at_its_reservation_is_made_by_the_completer(ctx):
    left_with_its_stock_reserved(ctx, "after-stock-reserved-point", "stock_reserved")


@test
def an_order_left_before_its_reservation_point_is_made_by_the_completer(ctx):
    # The reservation committed, the record still at stock_reserving (durable before it).
    left_with_its_stock_reserved(ctx, "after-stock-reserved", "stock_reserving")


def left_with_its_stock_reserved(ctx, hook, point):
    c, uid = ctx.user("left")
    home = owner_of(bucket_of(uid))
    before = ctx.stock()
    body = {"productId": "p-1024", "quantity": 2, "paymentSource": "tok_left"}
    key = new_key("left")
    crash_at_the_stock_point(ctx.srv, c, body, key, hook)
    expect_eq(ctx.record(home, uid, key), ("0", point), "the record after the crash")
    expect_eq(ctx.stock(), before - 2, "the catalogue's stock right after the crash")
    expect_eq(ctx.where(uid), [], "clusters holding an order right after the crash")
    # The client never retries: the completer makes the order once the lease has run out.
    ctx.srv.start()
    made = harness.wait_until("the completer's order of %s" % key,
                              lambda: ctx.orders(home, uid), timeout_s=20,
                              describe=lambda: "record %r" % (ctx.record(home, uid, key),))
    expect_eq(len(made), 1, "orders the completer made")
    expect_eq(ctx.record(home, uid, key)[0], "1", "the record's status (completed)")
    expect_eq(ctx.where(uid), [home], "clusters holding the order")
    expect_eq(ctx.stock(), before - 2, "the catalogue's stock after the completer (taken once)")
    expect_eq(ctx.reservations(uid), [[key, "2", "0"]], "reservations of the order")
    expect_eq(harness.psql(ctx.cluster_uris[home], "SELECT quantity, payment_source FROM orders"
                                                   " WHERE id = :'o';\n", {"o": made[0]}),
              [["2", "tok_left"]], "the order's quantity and payment source")
    # The client's late retry gets the completer's answer: the same order, nothing taken again.
    late = c.post("/api/orders", body, key=key)
    expect(late.status == 201 and late.replayed and late.json()["orderId"] == made[0],
           "the late retry replays the completer's order %s: %s" % (made[0], late.describe()))
    expect_eq(ctx.orders(home, uid), made, "orders after the late retry")
    expect_eq(ctx.stock(), before - 2, "the catalogue's stock after the late retry")


@test
def with_a_provider_the_completer_charges_the_order_it_makes(ctx):
    with Provider(name="shards-provider-sim") as prov:
        paying = ShardedOrderd(ctx.dir_uri, ctx.cat_uri, name="orderd-shards-pay",
                               env={"ORDERD_TEST_HOOKS": "1",
                                    "ORDERD_WEBHOOK_SECRET": WEBHOOK_SECRET},
                               extra_args=["--lease-ms", str(LEASE_MS), "--completer-interval-ms",
                                           str(COMPLETER_MS), "--provider", prov.url])
        # The orderd without a provider would make the order unpaid: it waits meanwhile.
        ctx.srv.stop()
        try:
            paying.start()
            c = paying.new_user("paid")
            uid = harness.psql(ctx.cat_uri, "SELECT id FROM users WHERE name = :'n';\n",
                               {"n": c.user})[0][0]
            home = owner_of(bucket_of(uid))
            before = ctx.stock()
            body = {"productId": "p-1024", "quantity": 1}
            key = new_key("paid")
            crash_at_the_stock_point(paying, c, body, key)
            paying.start()

            def paid():
                rows = harness.psql(ctx.cluster_uris[home], "SELECT id, status FROM orders WHERE"
                                    " user_id = :'u';\n", {"u": uid})
                return rows if rows and rows[0][1] == "paid" else None

            made = harness.wait_until("the completer's paid order of %s" % key, paid,
                                      timeout_s=20,
                                      describe=lambda: "record %r" % (ctx.record(home, uid, key),))
            expect_eq(len(made), 1, "orders the completer made")
            order_id = made[0][0]
            expect_eq(len(prov.charges_by_key(harness.charge_key(order_id))), 1,
                      "charges of the order")
            expect_eq(ctx.record(home, uid, key)[0], "1", "the record's status (completed)")
            expect_eq(ctx.stock(), before - 1, "the catalogue's stock (taken once)")
            late = c.post("/api/orders", body, key=key)
            expect(late.status == 201 and late.replayed and late.json()["orderId"] == order_id
                   and late.json()["status"] == "paid",
                   "the late retry replays the paid order %s: %s" % (order_id, late.describe()))
            expect_eq(len(prov.charges_by_key(harness.charge_key(order_id))), 1,
                      "charges of the order after the late retry")
        finally:
            paying.close()
            ctx.srv.start()


@test
def an_order_left_by_an_older_version_waits_for_its_retry(ctx):
    c, uid = ctx.user("older")
    home = owner_of(bucket_of(uid))
    before = ctx.stock()
    body = {"productId": "p-1024", "quantity": 3}
    key = new_key("older")
    crash_at_the_stock_point(ctx.srv, c, body, key)
    # The data as versions before the completer made such orders wrote it: the price alone.
    price = harness.psql(ctx.cat_uri, "SELECT unit_price || ' ' || currency FROM products"
                                      " WHERE id = 'p-1024';\n")[0][0]
    harness.psql(ctx.cluster_uris[home], "UPDATE idem_records SET recovery_data = :'d' WHERE"
                                         " principal = :'u' AND idem_key = :'k';\n",
                 {"d": price, "u": uid, "k": key})
    ctx.srv.start()

    def now_ms():
        return int(harness.psql(ctx.cluster_uris[home], "SELECT (extract(epoch FROM"
                                " clock_timestamp()) * 1000)::bigint;\n")[0][0])

    def lease_ms():
        return int(harness.psql(ctx.cluster_uris[home], "SELECT lease_expires_ms FROM"
                                " idem_records WHERE principal = :'u' AND idem_key = :'k';\n",
                                {"u": uid, "k": key})[0][0])

    harness.wait_until("the crashed lease of %s to run out" % key, lambda: lease_ms() < now_ms(),
                       timeout_s=10)

    def runs():
        return harness.metric_value(harness.metrics(c), "orderd_worker_runs_total",
                                    worker="completer")

    # Two completer ticks over every cluster once the record was the completer's to take.
    seen = runs()
    harness.wait_until("two completer ticks", lambda: runs() >= seen + 2 * len(CLUSTERS),
                       timeout_s=10)
    expect_eq(ctx.record(home, uid, key), ("0", "stock_reserved"), "the record the completer left")
    expect_eq(ctx.where(uid), [], "clusters holding an order before the retry")
    expect_eq(ctx.stock(), before - 3, "the catalogue's stock before the retry")
    r = retry_until_final(c, body, key)
    expect_eq(r.status, 201, "the retry of the older record: %s" % r.describe())
    expect_eq(r.json()["unitPrice"], int(price.split()[0]), "the order's price, the reservation's")
    expect_eq(len(ctx.orders(home, uid)), 1, "orders after the retry")
    expect_eq(ctx.stock(), before - 3, "the catalogue's stock after the retry (taken once)")


@test
def a_cancel_gives_the_stock_back_once(ctx):
    c, uid = ctx.user("cancel")
    before = ctx.stock()
    r = c.post("/api/orders", {"productId": "p-1024", "quantity": 4}, key=new_key("cancel"))
    expect_eq(r.status, 201, "an order: %s" % r.describe())
    order_id = r.json()["orderId"]
    expect_eq(ctx.stock(), before - 4, "the stock after the order")
    key = new_key("cancel")
    x = c.cancel(order_id, key)
    expect_eq(x.status, 200, "the cancel: %s" % x.describe())
    expect_eq(ctx.stock(), before, "the stock after the cancel")
    again = c.cancel(order_id, key)
    expect(again.status == 200 and again.replayed, "a retry replays: %s" % again.describe())
    other = c.cancel(order_id, new_key("cancel"))
    expect_eq(other.status, 200, "a second cancel of the order: %s" % other.describe())
    expect_eq(ctx.stock(), before, "the stock after two cancels")
    expect_eq([r[2] for r in ctx.reservations(uid)], ["1"], "the reservation is released")


@test
def a_webhook_lands_on_its_user_s_cluster(ctx):
    for cluster in (0, 2):
        c, uid = ctx.user_on(cluster, "hook")
        r = c.post("/api/orders", {"productId": "p-1024", "quantity": 1}, key=new_key("hook"))
        expect_eq(r.status, 201, "an order: %s" % r.describe())
        event_id = "evt_shard_" + new_key("e")
        event = json.dumps({"id": event_id, "type": "charge.succeeded",
                            "data": {"object": {"id": "ch_none", "metadata": {
                                "orderId": r.json()["orderId"], "userId": uid}}}}).encode()
        for n in range(2):
            w = c.request("POST", "/webhooks/provider", body=event, token=None,
                          headers={"Provider-Signature": sign(event)})
            expect_eq(w.status, 200, "delivery %d of %s: %s" % (n + 1, event_id, w.describe()))
            expect_eq(w.json().get("duplicate"), n == 1, "delivery %d is a duplicate" % (n + 1))
        where = [i for i, uri in enumerate(ctx.cluster_uris)
                 if harness.psql(uri, "SELECT 1 FROM inbox WHERE event_id = :'e';\n",
                                 {"e": event_id})]
        expect_eq(where, [cluster], "clusters whose inbox holds %s" % event_id)
        # The row names its user: a move of the user's bucket selects it by that column.
        expect_eq(harness.psql(ctx.cluster_uris[cluster], "SELECT user_id FROM inbox WHERE "
                               "event_id = :'e';\n", {"e": event_id}), [[uid]],
                  "the user of %s's inbox row" % event_id)


@test
def metrics_label_the_store_s_series_by_shard(ctx):
    c, _ = ctx.user("metrics")
    page = c.get("/metrics")
    expect_eq(page.status, 200, "GET /metrics")
    text = page.body.decode()
    for name in CLUSTERS:
        for series in ('orderd_store_up{shard="%s"} 1' % name,
                       'orderd_store_write_commits_total{shard="%s"} ' % name,
                       'orderd_replay_cache_lookups_total{shard="%s",result="hit"} ' % name):
            expect(series in text, "/metrics has %s" % series)
    for family in ("orderd_store_up", "orderd_store_write_commits_total",
                   "orderd_replay_cache_bytes", "orderd_outbox_messages"):
        expect_eq(text.count("# TYPE %s " % family), 1, "TYPE lines of %s" % family)
    expect('orderd_outbox_messages{status="pending"} ' in text, "the outbox's sum is there")


if __name__ == "__main__":
    run("test_pg_shards_orderd", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
