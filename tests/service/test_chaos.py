# SPDX-License-Identifier: Apache-2.0
"""
test_chaos.py - `idem-check chaos` (src/idem-check/chaos*.c, fault_proxy.c, docs/chaos.md).  Short runs
with every fault kind on must end with a clean verdict: every intent one order, one charge, one
confirmation email, every webhook event accepted by orderd; nothing duplicated, lost or unsettled:

  - one orderd, every fault (dropped responses, resets, cuts mid-request, duplicated sends,
    provider 5xx and lost responses, duplicated webhooks, kill -9);
  - three orderd instances on one store, connections spread at random, a random one killed every
    second, webhooks through the fault proxy;
  - --attach: orderd (two instances) and provider-sim started by this test, idem-check only puts
    its proxy in front and audits; nothing is killed, the provider's settings are put back.

With webhooks on, the audit reads orderd's webhook inbox (orderd_webhook_inbox_events_total on
/metrics) before and after the run: one new entry per new event, each decided once; where the count
is missing (attached to something that is not this orderd) it says so and checks indirectly.

The audit must not be vacuous (an extra order fails the run, and so does an orderd that refuses
every webhook), and bad command lines exit 2, an unreachable attached service 3.

Store: on SQLite idem-check makes orderd's file in its own temp directory; under with_pg.sh
(service-pg.chaos) each run gets a fresh PostgreSQL database (--db, or the attached orderd's).
"""

import atexit
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (BIN, HttpFront, Server, expect, expect_eq, expect_status, fail,  # noqa: E402
                     new_key, pg_create_database, pg_drop_database, pg_fresh_mode, psql, run,
                     run_idem_check, test, wait_until, SHARD_CLUSTERS, shard_bucket, shard_owner)
from provider import WEBHOOK_SECRET, paid_pair  # noqa: E402

IDEM_CHECK = os.path.join(BIN, "idem-check")
ORDERD = os.path.join(BIN, "orderd")
PROVIDER_SIM = os.path.join(BIN, "provider-sim")


# idem-check keeps each run's work directory (logs, databases) under $TMPDIR for a person to read;
# the tests give it a TMPDIR of their own and remove it at the end.
WORK = tempfile.mkdtemp(prefix="idem-chaos-test-")
atexit.register(shutil.rmtree, WORK, True)


def idem_check(args, timeout=120):
    return run_idem_check(args, WORK, timeout)


BASE = ["chaos", "--orderd-bin", ORDERD, "--provider-bin", PROVIDER_SIM]
ALL_FAULTS = ["--drop-rate", "0.1", "--reset-rate", "0.05", "--cut-rate", "0.05",
              "--dup-rate", "0.1", "--provider-lost-rate", "0.05", "--provider-5xx-rate", "0.05"]


def parse_json(rc, out, err):
    try:
        return json.loads(out)
    except ValueError as e:
        fail("--json output is not JSON (%s), rc %d:\n%s\nstderr: %s" % (e, rc, out, err[-2000:]))


def chaos_on_fresh_store(args, timeout=200):
    """Runs idem-check with `args`, plus --db of a fresh PostgreSQL database under with_pg.sh."""
    dbname = None
    if pg_fresh_mode():
        uri, dbname = pg_create_database("chaos")
        args = args + ["--db", uri]
    try:
        return idem_check(args, timeout)
    finally:
        if dbname:
            pg_drop_database(dbname)


def store_free(what):
    """
    True on the SQLite run; under with_pg.sh False, with a note: `what` checks idem-check's own
    machinery, on a store of its own in both runs, so the PostgreSQL run would repeat it.
    """
    if pg_fresh_mode():
        print("skipped on PostgreSQL: %s runs the same on the SQLite run" % what)
        return False
    return True


def expect_clean(doc, rc, out, err, intents):
    """
    A clean verdict over every intent that started: all of `intents` on an idle machine; under a
    sanitizer on a loaded one --max-time may stop the drive early, and at least half must start.
    """
    started = doc["intents"]["started"]
    expect_eq(doc.get("exitCode"), rc, "exitCode member vs the process's exit code")
    expect_eq(rc, 0, "exit code of a clean run:\n%s\nstderr: %s" % (out, err[-2000:]))
    expect_eq(doc["verdict"], "clean", "verdict")
    expect_eq(doc["duplicates"], 0, "duplicates found")
    expect_eq(doc["lost"], 0, "lost found")
    expect_eq(doc["unsettled"], 0, "unsettled orders")
    expect_eq(doc["webhookProblems"], 0, "webhook problems")
    expect(intents // 2 <= started <= intents, "intents started: %d of %d" % (started, intents))
    if started < intents:
        print("note: only %d of %d intents started before --max-time" % (started, intents))
    expect_eq(doc["intents"]["answered2xx"] + doc["intents"]["finishedByAudit"], started,
              "every started intent finished")
    expect_eq(doc["orders"]["total"], started, "orders made")
    expect_eq(doc["ledger"]["charges"], started, "charges of the run's orders in the ledger")
    expect_eq(doc["ledger"]["emails"], started, "confirmation emails of the run's orders")
    expect(doc["ledger"]["clean"], "the ledger flags no duplicate")


def expect_webhooks_clean(doc, copies):
    w = doc["webhooks"]
    started = doc["intents"]["started"]
    expect(w["enabled"], "webhooks are on: %r" % w)
    expect_eq(w["copies"], copies, "copies of each webhook event")
    expect_eq(w["events"], started, "one charge.succeeded event per charge")
    expect_eq(w["expectedDeliveries"], started * copies, "deliveries owed")
    expect(w["delivered"] >= started * copies, "every delivery accepted by orderd: %r" % w)
    expect_eq(w["pending"], 0, "webhook deliveries still pending")
    expect_eq(w["abandoned"], 0, "webhook deliveries abandoned")
    # The direct audit of orderd's inbox: one new entry per event id, each decided once.
    i = w["inbox"]
    expect(i["direct"], "orderd's inbox was audited directly: %r" % i)
    expect_eq((i["baselinePending"], i["baselineNewEvents"]), (0, 0),
              "the provider was quiet when the inbox was first read: %r" % i)
    expect_eq((i["entries"], i["expectedEntries"]), (started, started), "new inbox entries")
    expect_eq((i["chargeEvents"], i["expectedChargeEvents"]), (started, started),
              "new charge.succeeded entries: %r" % i)
    expect_eq(i["applied"] + i["ignored"], started, "every entry applied or ignored: %r" % i)
    expect_eq((i["undecided"], i["problems"]), (0, 0), "inbox problems: %r" % i)


@test
def test_short_chaos_run_is_clean(ctx):
    # One orderd, webhooks off: the run CI has always made, plus requests cut mid-body.
    args = BASE + ["--intents", "300", "--clients", "8", "--max-time", "60",
                   "--kill-every", "1", "--no-webhooks", "--json"] + ALL_FAULTS
    rc, out, err, took = chaos_on_fresh_store(args)
    doc = parse_json(rc, out, err)
    print("measured: chaos run took %.1f s: %s" % (took, out.strip()), flush=True)
    expect_clean(doc, rc, out, err, 300)
    expect(not doc["webhooks"]["enabled"], "--no-webhooks: %r" % doc["webhooks"])
    expect_eq(doc["instanceCount"], 1, "one orderd by default")
    f = doc["faults"]
    expect(f["kills"] >= 1, "at least one kill -9: %r" % f)
    expect(f["proxyDrops"] > 0 and f["proxyResets"] > 0 and f["proxyCuts"] > 0,
           "the proxy injected every kind of fault: %r" % f)
    expect(f["provider5xx"] + f["providerLost"] > 0, "the provider injected faults: %r" % f)
    expect(doc["duplicatedSends"] > 0, "some intents were sent twice: %r" % doc)
    expect(doc["retries"] > 0, "clients retried: %r" % doc)
    # stderr is a pipe here: plain progress lines (a first and a last at least), no bar frames
    # redrawn with carriage returns (those are for a terminal).
    lines = [l for l in err.splitlines() if l.startswith("chaos: ") and " intents, " in l]
    expect("\r" not in err and len(lines) >= 2,
           "plain progress lines off a terminal: %r" % err[-300:])
    # Every intent started, or on a loaded machine those --max-time let start (expect_clean).
    n, started = doc["intents"]["requested"], doc["intents"]["started"]
    expect(lines[-1].startswith("chaos: %d/%d intents" % (started, n)),
           "the last progress line counts every intent started: %r" % lines[-1:])
    expect(took <= 120, "a short run stays short (%.1f s)" % took)


@test
def test_instances_kills_webhooks_cuts(ctx):
    # Three orderd processes on one store (SQLite WAL file or PostgreSQL database), a random one
    # killed every second; provider-sim's webhooks (each event twice) go through a second fault
    # proxy; the audit must stay exact.
    args = BASE + ["--instances", "3", "--balance", "random", "--intents", "300", "--clients",
                   "8", "--max-time", "60", "--kill-every", "1", "--webhook-dup", "2",
                   "--json"] + ALL_FAULTS
    rc, out, err, took = chaos_on_fresh_store(args)
    doc = parse_json(rc, out, err)
    print("measured: 3 instances took %.1f s: %s" % (took, out.strip()), flush=True)
    expect_clean(doc, rc, out, err, 300)
    expect_webhooks_clean(doc, 2)
    expect_eq(doc["instanceCount"], 3, "instances")
    inst = doc["instances"]
    expect_eq(len(inst), 3, "one verdict row per instance")
    expect(all(i["connections"] > 0 for i in inst), "every instance got connections: %r" % inst)
    expect_eq(sum(i["kills"] for i in inst), doc["faults"]["kills"], "kills per instance add up")
    expect(doc["faults"]["kills"] >= 2, "several kills: %r" % doc["faults"])
    expect(doc["faults"]["proxyCuts"] > 0, "requests cut mid-body: %r" % doc["faults"])
    hp = doc["webhooks"]["proxy"]
    expect(hp["requests"] >= 2 * doc["intents"]["started"],
           "every delivery went through the webhook proxy: %r" % hp)
    expect(hp["resets"] + hp["cuts"] + hp["drops"] > 0, "webhook deliveries were hit: %r" % hp)
    expect(took <= 120, "a short run stays short (%.1f s)" % took)


@test
def test_many_users(ctx):
    # --users 5: five users made by `orderd token create`, the intents spread over them in turn,
    # each user's orders audited with its own token.
    args = BASE + ["--users", "5", "--intents", "100", "--clients", "4", "--max-time", "60",
                   "--no-webhooks", "--drop-rate", "0.1", "--dup-rate", "0.1", "--json"]
    rc, out, err, took = chaos_on_fresh_store(args)
    doc = parse_json(rc, out, err)
    print("measured: 5 users took %.1f s: %s" % (took, out.strip()), flush=True)
    expect_clean(doc, rc, out, err, 100)
    u = doc["users"]
    started = doc["intents"]["started"]
    expect_eq(u["count"], 5, "users made: %r" % u)
    expect(started // 5 <= u["intentsMin"] <= u["intentsMax"] <= started // 5 + 1,
           "the intents are spread evenly: %r" % u)
    expect_eq((u["ordersMin"], u["ordersMax"]), (u["intentsMin"], u["intentsMax"]),
              "each user has one order per intent of its own: %r" % u)
    expect_eq(u["withProblems"], 0, "no user has a problem: %r" % u)
    expect("shards" not in doc and "shard clusters" not in err,
           "no per-cluster figures without --shard-directory")


bucket_of = shard_bucket


def owner_of(bucket):
    return SHARD_CLUSTERS[shard_owner(bucket)]


@test
def test_shard_directory_counts_per_cluster(ctx):
    # --shard-directory: a directory database naming three clusters (buckets 0-341 on c1,
    # 342-682 on c2, the rest on c3, as docs/shards.md sets one up; chaos only reads the map, so
    # the clusters need not exist).  orderd runs on one plain store, and the verdict counts each
    # cluster's users, intents and failed attempts: they add up, and each user is where its
    # principal's bucket says.
    if not pg_fresh_mode():
        print("skipped: needs PostgreSQL (service-pg.chaos)")
        return
    dir_uri, dir_name = pg_create_database("chaosdir")
    db_uri, db_name = pg_create_database("chaos")
    try:
        psql(dir_uri,
             "CREATE TABLE idem_shard_clusters (name text PRIMARY KEY, uri text NOT NULL);"
             "CREATE TABLE idem_shard_buckets (bucket integer PRIMARY KEY,"
             " cluster text NOT NULL REFERENCES idem_shard_clusters (name),"
             " epoch bigint NOT NULL, moving integer NOT NULL DEFAULT 0);" +
             "".join("INSERT INTO idem_shard_clusters VALUES ('%s', 'postgresql:///%s');" % (c, c)
                     for c in SHARD_CLUSTERS) +
             "INSERT INTO idem_shard_buckets (bucket, cluster, epoch)"
             " SELECT b, CASE WHEN b < 342 THEN 'c1' WHEN b < 683 THEN 'c2' ELSE 'c3'"
             " END, 1 FROM generate_series(0, 1023) b;\n")
        rc, out, err, took = idem_check(
            BASE + ["--db", db_uri, "--users", "20", "--intents", "100", "--clients", "4",
                    "--max-time", "60", "--no-webhooks", "--drop-rate", "0.1",
                    "--shard-directory", dir_uri, "--json"], timeout=200)
        doc = parse_json(rc, out, err)
        print("measured: 20 users on 3 clusters took %.1f s: %s" % (took, doc.get("shards")),
              flush=True)
        expect_clean(doc, rc, out, err, 100)
        users = psql(db_uri, "SELECT id FROM users WHERE name LIKE 'chaos-%';\n")
        expect_eq(len(users), 20, "orderd's users table has the run's 20 users")
        want = {c: 0 for c in SHARD_CLUSTERS}
        for (uid,) in users:
            want[owner_of(bucket_of(uid))] += 1
        got = doc["shards"]["clusters"]
        expect_eq([c["name"] for c in got], list(SHARD_CLUSTERS), "the map's clusters, in order")
        expect_eq({c["name"]: c["users"] for c in got}, want, "users per cluster, by bucket")
        expect_eq(sum(c["intents"] for c in got), doc["intents"]["started"],
                  "the clusters' intents add up to the run's: %r" % got)
        expect(all(c["answered2xx"] > 0 for c in got if c["users"]),
               "every cluster's users got answers: %r" % got)
        # A cluster's last attempt may be a dropped response its client did not retry before
        # the drive ended ("recovered" false): that is a figure, not a failure.
        expect(sum(c["failedAttempts"] for c in got) > 0,
               "the dropped responses are counted: %r" % got)
    finally:
        pg_drop_database(db_name)
        pg_drop_database(dir_name)


class ShardDownFront:
    """
    An HTTP front for one orderd that stands for a shard set with one cluster down: while `down`
    is set, POST /api/orders with one of the `tokens` gets 503 (nothing passed on); everything
    else goes to orderd as it came.  The window opens at the first POST of those users and closes
    `seconds` later.
    """

    def __init__(self, port, tokens, seconds):
        import http.server
        front = self
        self.opened = None
        self.refused = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self, status, headers, data):
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("content-length", "connection", "transfer-encoding",
                                         "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                auth = self.headers.get("Authorization", "")
                if self.command == "POST" and auth[len("Bearer "):] in tokens:
                    now = time.monotonic()
                    if front.opened is None:
                        front.opened = now
                    if now - front.opened < seconds:
                        front.refused += 1
                        self.answer(503, [("Content-Type", "application/problem+json")],
                                    b'{"type":"about:blank","title":"cluster down"}')
                        return
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length")}
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    c.request(self.command, self.path, body=body, headers=headers)
                    r = c.getresponse()
                    self.answer(r.status, r.getheaders(), r.read())
                finally:
                    c.close()

            do_GET = do_POST = forward

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@test
def test_one_cluster_down_others_see_no_error(ctx):
    # Attached, six users with their principals in --tokens FILE; the directory puts the first
    # user's bucket on c1 and every other bucket on c2.  A front refuses c1's users (503) for 1.5 s
    # and nothing else is injected: c1's row has the failures and a stretch without a 2xx, c2's
    # users saw no error at all, and the audit is clean.
    if not pg_fresh_mode():
        print("skipped: needs PostgreSQL (service-pg.chaos)")
        return
    prov, s = paid_pair(order_args=FAST_WORKERS, name="shard-down")
    front = None
    dir_uri, dir_name = pg_create_database("chaosdir")
    try:
        s.start()
        users = [s.new_user("chaos-down-%d" % i) for i in range(6)]
        ids = [psql(s.db_uri, "SELECT id FROM users WHERE name LIKE :'p';\n",
                    {"p": "chaos-down-%d-%%" % i}) for i in range(6)]
        expect(all(len(r) == 1 for r in ids), "one user of each name: %r" % ids)
        principals = [r[0][0] for r in ids]
        down = bucket_of(principals[0])
        psql(dir_uri,
             "CREATE TABLE idem_shard_clusters (name text PRIMARY KEY, uri text NOT NULL);"
             "CREATE TABLE idem_shard_buckets (bucket integer PRIMARY KEY,"
             " cluster text NOT NULL REFERENCES idem_shard_clusters (name),"
             " epoch bigint NOT NULL, moving integer NOT NULL DEFAULT 0);"
             "INSERT INTO idem_shard_clusters VALUES ('c1', 'postgresql:///c1'),"
             " ('c2', 'postgresql:///c2');"
             "INSERT INTO idem_shard_buckets (bucket, cluster, epoch) SELECT b,"
             " CASE WHEN b = %d THEN 'c1' ELSE 'c2' END, 1 FROM generate_series(0, 1023) b;\n"
             % down)
        on_c1 = [u.token for u, p in zip(users, principals) if bucket_of(p) == down]
        tokens = os.path.join(WORK, "down.tokens")
        with open(tokens, "w") as f:
            f.write("".join("%s %s\n" % (u.token, p) for u, p in zip(users, principals)))
        front = ShardDownFront(s.port, set(on_c1), 1.5)
        rc, out, err, took = idem_check(["chaos", "--attach", "--orderd-url", front.url,
                                         "--provider-url", prov.url, "--tokens", tokens,
                                         "--intents", "120", "--clients", "4", "--max-time", "60",
                                         "--shard-directory", dir_uri, "--json"], timeout=120)
        doc = parse_json(rc, out, err)
        print("measured: one cluster down took %.1f s: %s" % (took, doc.get("shards")),
              flush=True)
        expect_clean(doc, rc, out, err, 120)
        c1, c2 = doc["shards"]["clusters"]
        expect_eq((c1["name"], c1["users"], c2["name"], c2["users"]),
                  ("c1", len(on_c1), "c2", 6 - len(on_c1)), "users per cluster")
        expect(front.refused > 0 and c1["failedAttempts"] == front.refused,
               "c1's refused attempts are counted (%d refused): %r" % (front.refused, c1))
        expect(1.0 <= c1["longestWithout2xxSeconds"] and c1["recovered"],
               "c1's users went without a 2xx while it was down: %r" % c1)
        expect_eq((c2["failedAttempts"], c2["longestWithout2xxSeconds"]), (0, 0),
                  "c2's users saw no error: %r" % c2)
        expect(c2["answered2xx"] >= c2["intents"] > 0, "c2's users were answered: %r" % c2)
    finally:
        if front is not None:
            front.close()
        s.close()
        prov.close()
        pg_drop_database(dir_name)


@test
def test_unreachable_shard_directory_exits_3(ctx):
    # Port 9 (discard) on loopback: nothing listens; the run stops before it starts anything.
    rc, out, err, took = idem_check(BASE + ["--intents", "5", "--shard-directory",
                                            "postgresql://127.0.0.1:9/nodir"], timeout=60)
    expect_eq(rc, 3, "exit code for an unreachable directory (stderr %r)" % err)
    expect("--shard-directory: cannot open the shard directory" in err,
           "the directory is named: %r" % err)


# orderd's settings in the attach test: the ones idem-check gives the instances it starts, so that
# the workers settle what the faults leave open within the audit's grace.
FAST_WORKERS = ["--lease-ms", "1500", "--wait-ms", "1000", "--provider-timeout-ms", "1000",
                "--completer-interval-ms", "200", "--reconciler-interval-ms", "200",
                "--reconcile-after-ms", "500", "--outbox-interval-ms", "100",
                "--outbox-max-attempts", "1000"]


def wait_paid(client, order_id, timeout_s=30.0):
    last = {}

    def paid():
        last["r"] = client.get("/api/orders/" + order_id)
        return last["r"].status == 200 and last["r"].json().get("status") == "paid"
    wait_until("order %s paid" % order_id, paid, timeout_s=timeout_s,
               describe=lambda: last["r"].describe())


@test
def test_attach_to_running_services(ctx):
    # This test starts provider-sim (webhooks to the first orderd, directly) and two orderd
    # instances on one store; idem-check only puts its proxy in front, injects provider faults
    # through /v1/faults, and audits against what was there before the run.
    prov, s1 = paid_pair(order_args=FAST_WORKERS, name="attach")
    s2 = None
    try:
        s1.start()
        s2 = Server(name="attach-orderd-2", db_uri=s1.db_uri,
                    extra_args=["--provider", prov.url, "--webhook-secret", WEBHOOK_SECRET] +
                    FAST_WORKERS)
        s2.start()
        user = s1.new_user("chaos-attach")
        # An order from before the run: the audit must neither count it nor call it a duplicate.
        r = expect_status(user.create_order(new_key("before"), quantity=1), 201, "order before")
        wait_paid(user, r.json()["orderId"])
        _, faults_before = prov.call("GET", "/v1/faults")
        args = ["chaos", "--attach", "--orderd-url", "%s,%s/" % (s1.base_url, s2.base_url),
                "--provider-url", prov.url, "--token", user.token, "--intents", "200",
                "--clients", "8", "--max-time", "60", "--webhook-dup", "2",
                "--json"] + ALL_FAULTS
        rc, out, err, took = idem_check(args, timeout=200)
        doc = parse_json(rc, out, err)
        print("measured: attached run took %.1f s: %s" % (took, out.strip()), flush=True)
        expect_clean(doc, rc, out, err, 200)
        expect_webhooks_clean(doc, 2)
        expect(doc["attach"], "the verdict says it attached: %r" % doc)
        expect_eq([i["url"] for i in doc["instances"]], [s1.base_url, s2.base_url], "instances")
        expect(all(i["connections"] > 0 for i in doc["instances"]),
               "the proxy spread connections over both: %r" % doc["instances"])
        expect_eq(doc["orders"]["preexisting"], 1, "the order from before the run")
        expect_eq(doc["faults"]["kills"], 0, "nothing is killed when attached")
        f = doc["faults"]
        expect(f["proxyDrops"] > 0 and f["proxyResets"] > 0 and f["proxyCuts"] > 0,
               "the proxy injected every kind of fault: %r" % f)
        expect(f["provider5xx"] + f["providerLost"] > 0, "provider faults via /v1/faults: %r" % f)
        expect(s1.alive() and s2.alive() and prov.proc.poll() is None,
               "the attached services still run")
        _, faults_after = prov.call("GET", "/v1/faults")
        expect_eq(faults_after, faults_before, "provider-sim's settings are put back")
        expect(took <= 120, "a short run stays short (%.1f s)" % took)
    finally:
        for proc in (s2, s1, prov):
            if proc is not None:
                proc.close()


def inbox_gauge_stripper(port):
    """
    An HTTP front for one orderd that hides orderd_webhook_inbox_events from its /metrics, as an
    orderd of an older version would (everything else is passed on as it is).
    """
    def rewrite(path, data):
        if path.split("?")[0] != "/metrics":
            return data
        return b"".join(line for line in data.splitlines(True)
                        if b"orderd_webhook_inbox_events" not in line)
    return HttpFront(port, rewrite=rewrite)


@test
def test_attach_without_the_inbox_gauge_falls_back(ctx):
    # Attached to something whose /metrics has no inbox gauge: the run is still audited (through
    # the ledger's deliveries and the confirmation emails), and the table says the inbox was not.
    prov, s = paid_pair(order_args=FAST_WORKERS, name="noinbox")
    front = None
    try:
        s.start()
        user = s.new_user("chaos-noinbox")
        # A second user from a file of tokens (with a comment and a blank line).
        user2 = s.new_user("chaos-noinbox-2")
        tokens = os.path.join(WORK, "noinbox.tokens")
        with open(tokens, "w") as f:
            f.write("# the second user\n\n%s\n" % user2.token)
        front = inbox_gauge_stripper(s.port)
        rc, out, err, took = idem_check(["chaos", "--attach", "--orderd-url", front.url,
                                         "--provider-url", prov.url, "--token", user.token,
                                         "--tokens", tokens, "--intents", "20", "--clients", "4",
                                         "--max-time", "30"],
                                        timeout=120)
        print("measured: attached without the inbox gauge took %.1f s:\n%s" % (took, out),
              flush=True)
        expect_eq(rc, 0, "exit code:\n%s\n%s" % (out, err[-2000:]))
        expect("verdict: CLEAN" in out, "a clean verdict:\n%s" % out)
        row = [line for line in out.splitlines() if line.startswith("webhook inbox")]
        expect(len(row) == 1 and "not audited directly" in row[0] and
               "has no orderd_webhook_inbox_events" in row[0] and "indirectly" in row[0],
               "the table says the inbox was checked indirectly only:\n%s" % out)
        expect("WEBHOOK problems                   0" in out, "no webhook problem:\n%s" % out)
        expect("users                              2 (tokens given): intents each 10..10, new "
               "orders each 10..10, 0 with a problem" in out, "two users, ten each:\n%s" % out)
        for u in (user, user2):
            r = expect_status(u.get("/api/orders?limit=100"), 200, "orders of a user")
            expect_eq(len(r.json()["orders"]), 10, "each user has its ten orders")
    finally:
        if front is not None:
            front.close()
        s.close()
        prov.close()


# A stand-in for a failover command (tests/ha/failover.sh fails a real cluster over, in
# ha.chaos_failover): `sh FAKE MODE KIND` notes KIND; in mode "ok" it succeeds, in mode
# "kill-fails" the kill does not (exit 3).
FAKE_FAILOVER = """echo "$2" >>"$(dirname "$0")/kinds-$1"
sleep 0.2
[ "$1" = ok ] || [ "$2" = switchover ] || exit 3
"""


def fake_command(name, script, notes, mode):
    """The stand-in `script` as WORK/name: the command line, and the file it notes its $1 in."""
    path = os.path.join(WORK, name)
    with open(path, "w") as f:
        f.write(script)
    return "sh %s %s" % (path, mode), os.path.join(WORK, notes + "-" + mode)


def fake_failover(mode):
    return fake_command("fake-failover.sh", FAKE_FAILOVER, "kinds", mode)


@test
def test_failover_command(ctx):
    # --failover-every without a database that fails over: the command runs every second of the
    # drive with switchover, kill, switchover, ... and the verdict lists each, none of which made
    # a request fail (nothing else is injected).
    cmd, kinds = fake_failover("ok")
    rc, out, err, took = chaos_on_fresh_store(
        BASE + ["--intents", "5000", "--clients", "4", "--max-time", "5", "--failover-every", "1",
                "--failover-cmd", cmd, "--json"])
    doc = parse_json(rc, out, err)
    expect_eq((rc, doc["verdict"]), (0, "clean"), "a clean run:\n%s\n%s" % (out, err[-2000:]))
    fo = doc["failovers"]
    runs = fo["list"]
    expect(fo["count"] == len(runs) >= 2 and fo["every"] == 1 and fo["command"] == cmd,
           "failovers: %r" % fo)
    with open(kinds) as f:
        ran = f.read().split()
    expect_eq([r["kind"] for r in runs], ran, "the kinds reported are the ones run")
    expect_eq(ran[:2], ["switchover", "kill"], "a switchover first, then a kill")
    for r in runs:
        expect(r["exitStatus"] == 0 and r["noneFailed"] and r["unavailableSeconds"] == 0 and
               r["recovered"] and r["failedAt"] is None and r["commandSeconds"] >= 0.2,
               "failover %d: its command ran, no request failed: %r" % (r["n"], r))
    expect("chaos: failover 1 (switchover)" in err, "progress names the failovers: %r" % err)


@test
def test_failed_failover_command_fails_the_run(ctx):
    # Attached (a work directory is made for the command's log all the same): the kill fails,
    # which ends the drive at once and fails the run, naming the command and its log.
    prov, s = paid_pair(order_args=FAST_WORKERS, name="failover")
    try:
        s.start()
        user = s.new_user("chaos-failover")
        cmd, _ = fake_failover("kill-fails")
        rc, out, err, took = idem_check(["chaos", "--attach", "--orderd-url", s.base_url,
                                         "--provider-url", prov.url, "--token", user.token,
                                         "--intents", "100000", "--clients", "4", "--max-time",
                                         "60", "--failover-every", "1", "--failover-cmd", cmd],
                                        timeout=120)
        expect_eq(rc, 1, "exit code when a failover command fails:\n%s\n%s" % (out, err[-2000:]))
        expect("the database failover failed: failover 2" in err and "kill" in err and
               "exited with status 3" in err, "the failure is explained: %r" % err[-2000:])
        log = err.split("its output is in ")[-1].split(")")[0]
        expect(log.startswith(WORK) and log.endswith("/failover.log"), "the log is named: %r" % log)
        with open(log) as f:
            text = f.read()
        expect("== failover 1: switchover" in text and "== failover 2: kill" in text and
               "exit status 3" in text, "failover.log has both commands:\n%s" % text)
        expect(took < 40, "the drive ended with the failed command (%.1f s)" % took)
        expect(s.alive(), "the attached orderd still runs")
    finally:
        s.close()
        prov.close()


# A stand-in for a bucket move (a real one is `idem-gateway shards move`, which needs a shard
# set): `sh FAKE MODE N` notes N; in mode "ok" it succeeds, in mode "second-fails" move 2 fails.
FAKE_MOVE = """echo "$2" >>"$(dirname "$0")/moves-$1"
sleep 0.2
[ "$1" = ok ] || [ "$2" != 2 ] || { echo "bucket 175 stays frozen" >&2; exit 4; }
"""


def fake_move(mode):
    return fake_command("fake-move.sh", FAKE_MOVE, "moves", mode)


@test
def test_move_command(ctx):
    # --move-every 1: the command runs every second of the drive with $1 = 1, 2, 3, ...;
    # --min-moves 3 keeps the drive going past a --max-time too short for three.
    if not store_free("the move schedule"):
        return
    cmd, calls = fake_move("ok")
    rc, out, err, took = idem_check(
        BASE + ["--intents", "5000", "--clients", "4", "--max-time", "1", "--move-every", "1",
                "--move-cmd", cmd, "--min-moves", "3", "--no-webhooks", "--json"])
    doc = parse_json(rc, out, err)
    expect_eq((rc, doc["verdict"]), (0, "clean"), "a clean run:\n%s\n%s" % (out, err[-2000:]))
    mv = doc["moves"]
    runs = mv["list"]
    expect(mv["count"] == len(runs) >= 3 and mv["every"] == 1 and mv["command"] == cmd,
           "moves: %r" % mv)
    with open(calls) as f:
        ran = f.read().split()
    expect_eq(ran, [str(i) for i in range(1, len(runs) + 1)], "$1 is the move's number")
    expect_eq([r["n"] for r in runs], [int(n) for n in ran], "the moves reported are those run")
    for r in runs:
        expect(r["exitStatus"] == 0 and r["recovered"] and r["commandSeconds"] >= 0.2 and
               r["noneFailed"] == (r["failedAt"] is None) and "kind" not in r,
               "move %d: its command ran: %r" % (r["n"], r))
    expect(runs[2]["startedAt"] >= 2.0, "three moves, a second apart: %r" % runs)
    expect_eq(doc["failovers"]["count"], 0, "no failover: %r" % doc["failovers"])
    expect("chaos: move 1 at " in err and "chaos: move 3 done in " in err,
           "progress names the moves: %r" % err[-2000:])


@test
def test_failed_move_command_fails_the_run(ctx):
    # Move 2 fails: the drive ends at once, the run exits 1 naming the command and move.log,
    # which has both moves and the command's own words.
    if not store_free("a failed move"):
        return
    cmd, _ = fake_move("second-fails")
    rc, out, err, took = idem_check(
        BASE + ["--intents", "100000", "--clients", "4", "--max-time", "60", "--move-every", "1",
                "--move-cmd", cmd, "--no-webhooks"])
    expect_eq(rc, 1, "exit code when a move command fails:\n%s\n%s" % (out, err[-2000:]))
    expect("idem-check chaos: the bucket move failed: move 2, `%s 2`, exited with status 4" % cmd
           in err, "the failure is explained: %r" % err[-2000:])
    log = err.split("its output is in ")[-1].split(")")[0]
    expect(log.startswith(WORK) and log.endswith("/move.log"), "the log is named: %r" % log)
    with open(log) as f:
        text = f.read()
    expect("== move 1, " in text and "== move 2, " in text and "bucket 175 stays frozen" in text
           and "== move 2: exit status 4" in text, "move.log has both commands:\n%s" % text)
    expect(took < 40, "the drive ended with the failed command (%.1f s)" % took)


@test
def test_table_output(ctx):
    rc, out, err, _ = idem_check(BASE + ["--intents", "20", "--max-time", "10"])
    expect_eq(rc, 0, "exit code:\n%s\n%s" % (out, err[-2000:]))
    for row in ("intents started", "client retries", "faults: proxy resets",
                "faults: proxy cut mid-request", "orderd 1 http://127.0.0.1:", "webhooks",
                "webhook inbox (orderd's store)     20 new entries for 20 events",
                "DUPLICATES found", "LOST found", "UNSETTLED", "WEBHOOK problems",
                "verdict: CLEAN"):
        expect(row in out, "table has %r:\n%s" % (row, out))


# A stand-in for orderd that is orderd, plus one order nobody asked for: `token create` leaves
# the token in a file, and `serve` (exec'd, so its pid is orderd's) has a helper that waits for
# the "listening on" line on orderd's stdout and creates one extra order with a fresh key.
WRAPPER = """#!/bin/sh
if [ "$1" = token ]; then
    "%(real)s" "$@" > "%(dir)s/token" || exit $?
    cat "%(dir)s/token"
    exit 0
fi
if [ "$1" = serve ]; then
    "%(python)s" "%(dir)s/extra.py" $$ &
    exec "%(real)s" "$@"
fi
exec "%(real)s" "$@"
"""
EXTRA = r"""
import http.client, json, os, re, sys, uuid
sys.path.insert(0, "@HARNESS_DIR@")
from harness import wait_until
pid = sys.argv[1]


def port():
    try:
        m = re.search(r"listening on http://127.0.0.1:(\d+)", open("/proc/%s/fd/1" % pid).read())
    except OSError:
        return None
    return m and int(m.group(1))


def orders_made():
    c.request("GET", "/api/orders?limit=1", headers={"Authorization": "Bearer " + token})
    r = c.getresponse()
    body = r.read()
    return r.status == 200 and json.loads(body)["orders"]


# (a slow, sanitized or loaded, orderd may take a while to listen)
c = http.client.HTTPConnection("127.0.0.1", wait_until("orderd to listen", port, 60), timeout=10)
token = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "token")).read().strip()
# Only once the run has made an order: idem-check lists the orders there before the run first,
# and an order made before that list is one that was there already, not one too many.
wait_until("the run's first order", orders_made, 60)
c.request("POST", "/api/orders", body='{"productId":"p-1024","quantity":1}',
          headers={"Authorization": "Bearer " + token, "Content-Type": "application/json",
                   "Idempotency-Key": "extra-" + uuid.uuid4().hex})
print(c.getresponse().status)
"""


@test
def test_audit_catches_an_order_no_intent_made(ctx):
    # The audit must not be vacuous: one order too many is a duplicate, and the run fails.
    d = tempfile.mkdtemp(prefix="idem-chaos-wrap-")
    wrapper = os.path.join(d, "orderd")
    with open(wrapper, "w") as f:
        f.write(WRAPPER % {"real": ORDERD, "dir": d, "python": sys.executable})
    os.chmod(wrapper, 0o755)
    with open(os.path.join(d, "extra.py"), "w") as f:
        f.write(EXTRA.replace("@HARNESS_DIR@", os.path.dirname(os.path.abspath(__file__))))
    try:
        rc, out, err, _ = idem_check(["chaos", "--orderd-bin", wrapper, "--provider-bin",
                                      PROVIDER_SIM, "--intents", "50", "--max-time", "10",
                                      "--json"])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    doc = parse_json(rc, out, err)
    print("measured: with one extra order: %s" % out.strip(), flush=True)
    expect_eq(rc, 1, "exit code when an order belongs to no intent")
    expect_eq(doc["verdict"], "failed", "verdict")
    expect(doc["duplicates"] >= 1, "the extra order is counted as a duplicate: %r" % doc)
    expect("belongs to no intent" in doc["firstProblem"], "and named: %r" % doc["firstProblem"])


# A stand-in for orderd that has lost its webhook secret: it refuses (401) every delivery.
NO_SECRET = """#!/bin/sh
unset ORDERD_WEBHOOK_SECRET
exec "%(real)s" "$@"
"""


@test
def test_audit_catches_webhooks_orderd_refuses(ctx):
    # The webhook audit must not be vacuous either: orders still get paid (the checkout hears the
    # provider's answer), but every delivery stays pending, and the run fails on that alone.
    d = tempfile.mkdtemp(prefix="idem-chaos-wrap-")
    wrapper = os.path.join(d, "orderd")
    with open(wrapper, "w") as f:
        f.write(NO_SECRET % {"real": ORDERD})
    os.chmod(wrapper, 0o755)
    try:
        rc, out, err, _ = idem_check(["chaos", "--orderd-bin", wrapper, "--provider-bin",
                                      PROVIDER_SIM, "--intents", "20", "--max-time", "10",
                                      "--grace", "2", "--json"])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    doc = parse_json(rc, out, err)
    print("measured: webhooks refused: %s" % out.strip(), flush=True)
    expect_eq(rc, 1, "exit code when orderd accepts no webhook")
    expect_eq(doc["verdict"], "failed", "verdict")
    expect(doc["webhookProblems"] > 0, "the webhook problems are counted: %r" % doc)
    expect_eq(doc["duplicates"] + doc["lost"], 0, "nothing duplicated or lost")
    expect(doc["webhooks"]["pending"] > 0, "deliveries left pending: %r" % doc["webhooks"])
    expect(doc["webhooks"]["orderdResults"].get("rejected", 0) > 0,
           "orderd's metrics show the refusals: %r" % doc["webhooks"])
    expect(doc["firstProblem"].startswith("webhooks:"), "and named: %r" % doc["firstProblem"])
    inbox = doc["webhooks"]["inbox"]
    expect(inbox["direct"] and inbox["entries"] == 0 and inbox["expectedEntries"] > 0 and
           inbox["problems"] > 0, "the inbox audit sees no event recorded: %r" % inbox)


# A stand-in for orderd that notes its arguments, one call a line, then runs orderd without
# --catalogue URI (orderd on a shard set is what takes it; here the store is a plain one).
CATALOGUE_WRAPPER = """#!/bin/sh
echo "$*" >>"%(dir)s/calls"
for a; do
    shift
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    if [ "$a" = --catalogue ]; then skip=1; continue; fi
    set -- "$@" "$a"
done
exec "%(real)s" "$@"
"""


@test
def test_catalogue_is_passed_on(ctx):
    # --catalogue URI goes to `orderd token create` (each user's) and to every orderd started.
    if not store_free("the catalogue's pass-through"):
        return
    d = tempfile.mkdtemp(prefix="idem-chaos-wrap-")
    wrapper = os.path.join(d, "orderd")
    with open(wrapper, "w") as f:
        f.write(CATALOGUE_WRAPPER % {"real": ORDERD, "dir": d})
    os.chmod(wrapper, 0o755)
    try:
        rc, out, err, _ = idem_check(["chaos", "--orderd-bin", wrapper, "--provider-bin",
                                      PROVIDER_SIM, "--catalogue", "postgresql:///cat-x",
                                      "--users", "2", "--instances", "2", "--intents", "10",
                                      "--max-time", "10", "--no-webhooks", "--json"])
        with open(os.path.join(d, "calls")) as f:
            calls = f.read().splitlines()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    doc = parse_json(rc, out, err)
    expect_eq((rc, doc["verdict"]), (0, "clean"), "a clean run:\n%s\n%s" % (out, err[-2000:]))
    tokens = [c for c in calls if c.startswith("token create ")]
    serves = [c for c in calls if c.startswith("serve ")]
    expect_eq((len(tokens), len(serves)), (2, 2), "two token creates, two orderd: %r" % calls)
    expect(all(c.endswith(" --catalogue postgresql:///cat-x") or
               " --catalogue postgresql:///cat-x " in c for c in tokens + serves),
           "every call has the catalogue: %r" % calls)


@test
def test_usage_errors(ctx):
    attach = ["chaos", "--attach", "--orderd-url", "http://127.0.0.1:9", "--token", "t"]
    for args, what in [
        (["chaos"], "no binaries"),
        (["chaos", "--orderd-bin", ORDERD], "no --provider-bin"),
        (BASE + ["--drop-rate", "1.5"], "a rate above 1"),
        (BASE + ["--cut-rate", "x"], "a bad --cut-rate"),
        (BASE + ["--drop-rate", "0.4", "--reset-rate", "0.3", "--cut-rate", "0.3"],
         "proxy rates above 0.9 together"),
        (BASE + ["--intents", "0"], "zero intents"),
        (BASE + ["--kill-every", "x"], "a bad --kill-every"),
        (BASE + ["--grace", "0"], "a zero --grace"),
        (BASE + ["--instances", "9"], "too many instances"),
        (BASE + ["--instances", "0"], "zero instances"),
        (BASE + ["--balance", "fair"], "an unknown --balance"),
        (BASE + ["--webhook-dup", "11"], "too many webhook copies"),
        (BASE + ["--no-webhooks", "--webhook-dup", "2"], "webhooks off and duplicated"),
        (BASE + ["--db", "mysql://x"], "an unknown store"),
        (BASE + ["--token", "t"], "--token without --attach"),
        (BASE + ["--orderd-url", "http://127.0.0.1:9"], "--orderd-url without --attach"),
        (BASE + ["--bogus"], "an unknown option"),
        (["chaos", "--orderd-bin", "/nonexistent/orderd", "--provider-bin", PROVIDER_SIM],
         "a missing program"),
        (attach + ["--kill-every", "1"], "--attach with --kill-every"),
        (attach + ["--instances", "2"], "--attach with --instances"),
        (attach + ["--orderd-bin", ORDERD], "--attach with --orderd-bin"),
        (attach + ["--db", "sqlite:/tmp/x.db"], "--attach with --db"),
        (attach + ["--no-webhooks"], "--attach with --no-webhooks"),
        (attach + ["--provider-5xx-rate", "0.1"], "provider faults without --provider-url"),
        (attach + ["--webhook-dup", "2"], "--webhook-dup without --provider-url"),
        (["chaos", "--attach", "--token", "t"], "--attach without --orderd-url"),
        (["chaos", "--attach", "--orderd-url", "http://127.0.0.1:9"], "--attach without --token"),
        (["chaos", "--attach", "--orderd-url", "https://example.com", "--token", "t"],
         "an orderd URL that is not http://IPv4:PORT"),
        (attach + ["--provider-url", "127.0.0.1:8090"], "a provider URL without http://"),
        (BASE + ["--failover-every", "10"], "--failover-every without --failover-cmd"),
        (attach + ["--failover-every", "10"], "--attach, --failover-every without a command"),
        (BASE + ["--failover-cmd", "true"], "--failover-cmd without --failover-every"),
        (BASE + ["--failover-every", "0", "--failover-cmd", "true"], "a zero --failover-every"),
        (BASE + ["--failover-every", "x", "--failover-cmd", "true"], "a bad --failover-every"),
        (BASE + ["--failover-every", "5", "--failover-cmd", " "], "an empty --failover-cmd"),
        (BASE + ["--users", "0"], "zero users"),
        (BASE + ["--shard-directory", "sqlite:/tmp/x.db"], "a --shard-directory not PostgreSQL"),
        (attach + ["--shard-directory", "postgresql:///d"], "attached, a token without principal"),
        (BASE + ["--db", "shards:postgresql:///d", "--shard-directory", "postgresql:///d"],
         "--shard-directory on a shard set without --catalogue"),
        (BASE + ["--move-every", "10"], "--move-every without --move-cmd"),
        (attach + ["--move-every", "10"], "--attach, --move-every without a command"),
        (BASE + ["--move-cmd", "true"], "--move-cmd without --move-every"),
        (BASE + ["--min-moves", "2"], "--min-moves without --move-every"),
        (BASE + ["--move-every", "0", "--move-cmd", "true"], "a zero --move-every"),
        (BASE + ["--move-every", "5", "--move-cmd", ""], "an empty --move-cmd"),
        (attach + ["--catalogue", "postgresql:///c"], "--attach with --catalogue"),
        (BASE + ["--catalogue", ""], "an empty --catalogue"),
        (BASE + ["--users", "1001"], "too many users"),
        (attach + ["--users", "2"], "--attach with --users"),
        (BASE + ["--tokens", "/dev/null"], "--tokens without --attach"),
        (attach + ["--tokens", "/nonexistent/tokens"], "an unreadable --tokens file"),
        (attach + ["--token", "t"], "the same token twice"),
        (["chaos", "--attach", "--orderd-url", "http://127.0.0.1:9", "--tokens", "/dev/null"],
         "a --tokens file with no token"),
    ]:
        rc, out, err, _ = idem_check(args, timeout=20)
        expect_eq(rc, 2, "exit code for %s (stderr %r)" % (what, err))
        expect("idem-check chaos:" in err, "%s is explained on stderr: %r" % (what, err))
    rc, out, err, _ = idem_check(["chaos", "--help"], timeout=20)
    expect_eq(rc, 0, "--help exit code")
    for flag in ("--kill-every", "--grace", "--instances", "--balance", "--cut-rate", "--attach",
                 "--orderd-url", "--provider-url", "--token", "--no-webhooks", "--webhook-dup",
                 "--failover-every", "--failover-cmd", "--users", "--tokens", "--catalogue",
                 "--move-every", "--move-cmd", "--min-moves", "--shard-directory"):
        expect(flag in out, "--help lists %s" % flag)


@test
def test_attach_to_nothing_exits_3(ctx):
    # Port 9 (discard) on loopback: nothing listens, the connection is refused.
    rc, out, err, _ = idem_check(["chaos", "--attach", "--orderd-url", "http://127.0.0.1:9",
                                  "--token", "t", "--intents", "5"], timeout=30)
    expect_eq(rc, 3, "exit code when the attached orderd cannot be reached (stderr %r)" % err)
    expect("api/orders" in err, "the failed request is named: %r" % err)


if __name__ == "__main__":
    run("chaos")
