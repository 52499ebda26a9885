#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_pg_cluster.py - three orderd instances on one PostgreSQL database behave as one service.

Several stateless instances behind a load balancer must give the answers one instance would:

  (a) a storm of >= 150 requests with one key, spread round-robin over the three, makes exactly one
      order; every other answer is a byte-identical replay or a 409 with Retry-After.  And a batch
      of keys each sent to all three at once makes one order per key.
  (b) an instance killed with kill -9 while it holds a lease (phase 1 committed, the order exists)
      is finished by another: a retry gets 409 while the lease lives, then takes the record over
      once the lease (the database's clock) expired, and completes the order phase 1 created.
      And with nobody retrying, another instance's background completer finishes it.
  (c) PostgreSQL stopped in the middle of a stream and started again a few seconds later: while it
      is down every request gets 503 idempotency-store-unavailable with Retry-After (never a 500,
      never an order without its record); once it is back, requests succeed again without any
      orderd being restarted; then every key is retried: each acknowledged order is there once,
      none twice, and orders == distinct keys.
  (d) an instance whose pool (--db-pool 1) is held by a request blocked on a lock answers 503
      idempotency-store-unavailable with Retry-After, runs nothing, and recovers by itself.
  (e) the network to PostgreSQL goes silent (iptables drops every packet of its port, as when its
      host loses power): requests on the pool's open connections are answered 503 within
      seconds (libidem's default keepalives and tcp_user_timeout, docs/postgres.md), not after
      the kernel's 15 minutes of retransmissions; once the packets flow again the instance
      recovers by itself, and every key retried makes exactly one order.

Runs only under tests/pg/with_pg.sh (CTest: service-pg.pg_cluster); without
IDEM_TEST_PG_URI it FAILS: this test exists to prove the PostgreSQL store, it must not skip.
"""

import http.client
import os
import shlex
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Client, Server, TestFailure, db_query, expect, expect_eq,  # noqa: E402
                     expect_problem, fail, new_key, pg_bin, pg_create_database, pg_drop_database,
                     psql, retry_after_seconds, run, test, wait_until)

STORM_REQUESTS = 150
FANOUT_KEYS = 40
LEASE_MS = 3000
WAIT_MS = 500
WRITERS = 6
PG_DOWN_S = 3.0
HELD_DELAY_MS = int(PG_DOWN_S * 1000) + 4500  # phase 2 of the held request: after the restart
RETRY_DEADLINE_S = 30.0
RECOVER_S = 30.0  # how long a test waits for every instance to answer 201 again after a restart


# ---- the cluster ----------------------------------------------------------------------------

class Cluster:
    """One fresh database on the with_pg.sh cluster, and three orderd instances on it."""

    def __init__(self):
        if not os.environ.get("IDEM_TEST_PG_URI") or not os.environ.get("IDEM_TEST_PG_DATA"):
            raise TestFailure(
                "IDEM_TEST_PG_URI / IDEM_TEST_PG_DATA are not set: this test needs the throw-away "
                "PostgreSQL cluster of tests/pg/with_pg.sh; run it as "
                "`sh tests/pg/with_pg.sh python3 tests/service/test_pg_cluster.py` (CTest: "
                "service-pg.pg_cluster).  It does not skip: it is what proves the "
                "PostgreSQL store.")
        self.db_uri, self.db_name = pg_create_database("cluster")
        # The background completer is off on these three, so a stalled record is finished by a
        # client's retry (what (b) and (c) watch); orderd-d in the crash test runs one.
        args = ["--lease-ms", str(LEASE_MS), "--wait-ms", str(WAIT_MS), "--sweep-interval-s", "1",
                "--completer-interval-ms", "0"]
        self.args = args
        self.servers = [Server(db_uri=self.db_uri, name="orderd-" + n, extra_args=args,
                               env={"ORDERD_TEST_HOOKS": "1"}) for n in "abc"]
        # All three at once: their migrations race on one empty database, as a fleet's would.
        errors = []

        def start(s):
            try:
                s.start()
            except Exception as e:  # noqa: BLE001
                errors.append("%s: %s" % (s.name, e))
        threads = [threading.Thread(target=start, args=(s,)) for s in self.servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            self.close()
            raise TestFailure("starting three instances at once failed: %s" % "; ".join(errors))

    def principal(self, prefix):
        """A new user, and one client per instance speaking as that user."""
        import uuid
        name = "%s-%s" % (prefix, uuid.uuid4().hex[:10])
        token = self.servers[0].create_token(name)
        return [Client(s, token, name) for s in self.servers]

    def close(self):
        for s in self.servers:
            s.close()
        pg_drop_database(self.db_name)


def outcome_of(r):
    """A short label for a response: executed / replayed / 409 / 503 / HTTP n / an error."""
    if isinstance(r, Exception):
        return "error:" + type(r).__name__
    if r is None:
        return "none"
    if r.status == 201:
        return "replayed" if r.replayed else "executed"
    return str(r.status)


def blast(work, timeout=60):
    """
    Sends every (client, key, body, headers) at the same instant: one thread and connection each,
    released together by a barrier.  Returns the Responses (or exceptions) in order.
    """
    n = len(work)
    barrier = threading.Barrier(n)
    results = [None] * n

    def worker(i, client, key, body, headers):
        conn = None
        try:
            conn = client.connect(timeout=timeout)
        except Exception as e:  # noqa: BLE001
            results[i] = e
        try:
            barrier.wait(30)
        except threading.BrokenBarrierError:
            pass
        if conn is None:
            return
        try:
            results[i] = client.post("/api/orders", body, key=key, conn=conn, headers=headers)
        except Exception as e:  # noqa: BLE001
            results[i] = e
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(i,) + tuple(w), daemon=True)
               for i, w in enumerate(work)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    return results


def retry_until_final(clients, key, body, start=0, deadline_s=RETRY_DEADLINE_S):
    """
    Retries like a well-behaved client, round-robin over the instances from `start`: 409 and 503
    after Retry-After (capped at 0.25 s), each checked to be the documented problem.  Returns
    (final Response, interim outcomes, seconds taken).
    """
    interim = []
    t0 = time.monotonic()
    i = start
    while True:
        c = clients[i % len(clients)]
        i += 1
        r = c.post("/api/orders", body, key=key, timeout=20)
        if r.status not in (409, 503):
            return r, interim, time.monotonic() - t0
        code = "idempotency-request-in-progress" if r.status == 409 else \
            "idempotency-store-unavailable"
        expect_problem(r, r.status, code, "retry of %s on %s" % (key, c.server.name))
        wait = retry_after_seconds(r, "retry of %s" % key)
        interim.append(r.status)
        if time.monotonic() - t0 > deadline_s:
            fail("key %s: no final answer after %.0f s; interim %r, last %s" % (
                key, deadline_s, interim, r.describe()))
        time.sleep(min(wait, 0.25))


def order_ids(client):
    return [o["orderId"] for o in client.all_orders()]


# ---- (a) storms across the instances ---------------------------------------------------------

@test
def test_same_key_storm_round_robin_over_three_instances_makes_one_order(cl):
    clients = cl.principal("storm")
    key = new_key("storm3")
    body = {"productId": "p-1024", "quantity": 3}
    t0 = time.monotonic()
    results = blast([(clients[i % 3], key, body, None) for i in range(STORM_REQUESTS)])
    took = time.monotonic() - t0
    per = [{"executed": 0, "replayed": 0, "409": 0} for _ in clients]
    executed, replays, bad = [], [], []
    for i, r in enumerate(results):
        o = outcome_of(r)
        if o in per[i % 3]:
            per[i % 3][o] += 1
        if o == "executed":
            executed.append((i % 3, r))
        elif o == "replayed":
            replays.append(r)
        elif o == "409":
            try:
                expect_problem(r, 409, "idempotency-request-in-progress", "409 in the storm")
                retry_after_seconds(r, "409 in the storm")
            except TestFailure as e:
                bad.append(str(e))
        else:
            bad.append(r.describe(400) if hasattr(r, "describe") else repr(r))
    print("     STORM: %d same-key requests round-robin over 3 instances in %.2f s -> %d executed, "
          "%d byte-identical replays, %d 409 in progress, %d other; per instance %s" % (
              len(results), took, len(executed), len(replays),
              sum(p["409"] for p in per), len(bad),
              ", ".join("%s %d/%d/%d" % (cl.servers[j].name, p["executed"], p["replayed"],
                                          p["409"]) for j, p in enumerate(per))))
    if bad:
        fail("%d unexpected answers in the storm, first: %s" % (len(bad), bad[0]))
    expect_eq(len(executed), 1, "requests that executed (201 without Idempotent-Replayed)")
    winner_instance, first = executed[0]
    for r in replays:
        if r.body != first.body or r.header("Location") != first.header("Location") or \
                r.header("Content-Type") != first.header("Content-Type"):
            fail("a replay differs from the executed 201\nexecuted: %s\nreplay: %s" % (
                first.describe(), r.describe()))
    oid = first.json()["orderId"]
    for c in clients:
        expect_eq(order_ids(c), [oid], "orders seen through %s after the storm" % c.server.name)
        again = c.post("/api/orders", body, key=key)
        expect(again.status == 201 and again.replayed and again.body == first.body,
               "a retry on %s after the storm should replay the order: %s" % (
                   c.server.name, again.describe()))


@test
def test_each_key_sent_to_all_three_at_once_makes_one_order_each(cl):
    clients = cl.principal("fanout")
    work, keys = [], []
    for n in range(FANOUT_KEYS):
        key = new_key("fan%02d" % n)
        body = {"productId": "p-2048", "quantity": 1 + n % 5}
        keys.append((key, body))
        for c in clients:
            work.append((c, key, body, None))
    t0 = time.monotonic()
    results = blast(work)
    took = time.monotonic() - t0
    by_key = {}
    counts = {}
    for (c, key, body, _), r in zip(work, results):
        o = outcome_of(r)
        counts[o] = counts.get(o, 0) + 1
        by_key.setdefault(key, []).append((c, r, o))
    print("     fan-out: %d keys x 3 instances at once in %.2f s -> %r" % (
        FANOUT_KEYS, took, counts))
    ids = {}
    for key, body in keys:
        answers = by_key[key]
        execd = [r for _, r, o in answers if o == "executed"]
        others = [(c, r, o) for c, r, o in answers if o not in ("executed", "replayed", "409")]
        if others:
            c, r, o = others[0]
            fail("key %s on %s: unexpected %s" % (key, c.server.name,
                                                   r.describe() if hasattr(r, "describe") else o))
        expect_eq(len(execd), 1, "executions of key %s sent to three instances" % key)
        doc = execd[0].json()
        if (doc["productId"], doc["quantity"]) != (body["productId"], body["quantity"]):
            fail("key %s got an order for another body: %r" % (key, doc))
        for _, r, o in answers:
            if o == "replayed" and r.body != execd[0].body:
                fail("key %s: a replay differs from its 201" % key)
            if o == "409":
                expect_problem(r, 409, "idempotency-request-in-progress", "fan-out 409")
                retry_after_seconds(r, "fan-out 409")
        ids[key] = doc["orderId"]
    listed = order_ids(clients[1])
    expect_eq(len(listed), FANOUT_KEYS, "orders listed after %d keys" % FANOUT_KEYS)
    expect_eq(set(listed), set(ids.values()), "listed orders vs the executed ones")


# ---- (b) an instance dies holding a lease ----------------------------------------------------

def _wait_for_order(client, deadline_s=30.0):
    ids = wait_until("phase 1 of the held request to commit (its order listed)",
                     lambda: order_ids(client), timeout_s=deadline_s, pause_s=0.02)
    return ids, time.monotonic()


def _takeover(cl, clients, dead, key, body, phase1_id, t_sent, how, by_retry=True):
    """
    The retries on the other instances: 409 while the lease lives, then the takeover.  `t_sent`
    is when the dead instance's request was sent, before its phase 1 committed and its lease
    began: the takeover may come no earlier than a lease after it.  by_retry: the retry itself
    takes the record over and runs phase 2 (no completer runs); else the retries wait until
    another instance's completer has finished the record (completed in idem_records) and the
    retry is a replay.
    """
    live = [c for c in clients if c.server is not dead]
    first = live[0].post("/api/orders", body, key=key, timeout=20)
    expect_problem(first, 409, "idempotency-request-in-progress",
                   "a retry on %s while the dead instance's lease lives" % live[0].server.name)
    ra = retry_after_seconds(first, "409 while the lease lives")
    if not by_retry:
        wait_until("another instance's completer to finish the record of %s" % key,
                   lambda: db_query(cl.db_uri, "SELECT count(*) FROM idem_records WHERE "
                                    "idem_key = ? AND status = 1", (key,))[0][0] == "1",
                   pause_s=0.1)
    r, interim, _ = retry_until_final(live, key, body, start=1)
    took = time.monotonic() - t_sent
    interim = [409] + interim
    print("     FAILOVER (%s): %s died holding the lease; retries on %s: %d x 409 (first "
          "Retry-After %d s), then %d%s %.2f s after the first request was sent (lease %d ms)" % (
              how, dead.name, "+".join(c.server.name for c in live), interim.count(409), ra,
              r.status, " replayed (another instance's completer had finished it)" if r.replayed
              else " (the retry took the record over and ran phase 2)", took, LEASE_MS))
    if r.status != 201:
        fail("the takeover should finish the order with 201, got %s (interim %r)" % (
            r.describe(), interim))
    if by_retry:
        expect(not r.replayed, "the retry should have taken over and run phase 2, got a replay: "
               "%s" % r.describe())
    else:
        expect(r.replayed, "the completer should have finished the record before the retry: %s"
               % r.describe())
    doc = r.json()
    expect_eq(doc["orderId"], phase1_id, "orderId of the finished order vs the dead one's phase 1")
    expect_eq(r.header("Location"), "/api/orders/" + phase1_id, "Location")
    expect_eq((doc["productId"], doc["quantity"]), (body["productId"], body["quantity"]),
              "the finished order")
    # Elapsed time alone is what lets a lease go, measured by the database: not earlier.
    expect(took >= LEASE_MS / 1000.0 - 0.05,
           "the record was taken over %.2f s after the first request, before its %d ms lease "
           "expired" % (took, LEASE_MS))
    for c in live:
        expect_eq(order_ids(c), [phase1_id], "orders seen through %s" % c.server.name)
        again = c.post("/api/orders", body, key=key)
        expect(again.status == 201 and again.replayed and again.body == r.body,
               "a retry on %s should replay the finished order: %s" % (c.server.name,
                                                                        again.describe()))
    # The dead instance comes back and answers the same.
    dead.start()
    back = clients[cl.servers.index(dead)].post("/api/orders", body, key=key)
    expect(back.status == 201 and back.replayed and back.body == r.body,
           "%s, restarted, should replay the order: %s" % (dead.name, back.describe()))
    return interim.count(409)


@test
def test_kill9_of_the_lease_holder_is_finished_by_another_instance(cl):
    clients = cl.principal("kill9")
    a = cl.servers[0]
    key = new_key("kill9")
    body = {"productId": "p-1024", "quantity": 5}
    out = {}

    def held():
        try:
            out["r"] = clients[0].post("/api/orders", body, key=key,
                                       headers={"X-Test-Delay-Ms": "60000"}, timeout=90)
        except (OSError, http.client.HTTPException) as e:
            out["r"] = e
    t = threading.Thread(target=held, daemon=True)
    t_sent = time.monotonic()
    t.start()
    ids, _ = _wait_for_order(clients[1])
    a.kill9()  # phase 1 committed, a sleeps before phase 2 holding the lease: kill -9 now
    t.join(10)
    expect(isinstance(out.get("r"), Exception),
           "the request held by the killed instance got an answer: %r" % out.get("r"))
    _takeover(cl, clients, a, key, body, ids[0], t_sent, "kill -9")


@test
def test_crash_hook_after_phase1_is_finished_by_another_instances_completer(cl):
    # Nobody retries in time: the background completer of a fourth instance (on by default,
    # every 200 ms here) takes the expired lease over and finishes the order; the retry replays.
    d = Server(db_uri=cl.db_uri, name="orderd-d",
               extra_args=cl.args[:-2] + ["--completer-interval-ms", "200"])
    try:
        d.start()
        clients = cl.principal("crash")
        b = cl.servers[1]
        key = new_key("crash")
        body = {"productId": "p-2048", "quantity": 2}
        t_sent = time.monotonic()
        try:
            r = clients[1].post("/api/orders", body, key=key,
                                headers={"X-Test-Crash": "after-order-created"}, timeout=20)
            fail("X-Test-Crash should drop the connection, got %s" % r.describe())
        except (OSError, http.client.HTTPException):
            pass
        expect(b.wait_exit(10) is not None, "%s did not exit after X-Test-Crash" % b.name)
        ids, _ = _wait_for_order(clients[2], 2.0)
        _takeover(cl, clients, b, key, body, ids[0], t_sent, "X-Test-Crash, completer",
                  by_retry=False)
    finally:
        d.close()


# ---- (c) PostgreSQL restarted under a stream of requests -------------------------------------

def _as_pg_owner(cmd):
    user = os.environ.get("IDEM_TEST_PG_OS_USER")
    return ["runuser", "-u", user, "--"] + cmd if user else cmd


def pg_stop(mode):
    data = os.environ["IDEM_TEST_PG_DATA"]
    # The options the server runs with (port, socket dir), to start it again the same way.
    with open(os.path.join(data, "postmaster.opts")) as f:
        argv = shlex.split(f.read().strip())
    opts, i = [], 1
    while i < len(argv):
        if argv[i] == "-D":
            i += 2
            continue
        opts.append(argv[i])
        i += 1
    p = subprocess.run(_as_pg_owner([pg_bin("pg_ctl"), "-D", data, "-m", mode, "-w", "-t", "60",
                                     "stop"]), capture_output=True, timeout=90)
    if p.returncode != 0:
        fail("pg_ctl stop failed: %s" % p.stderr.decode("utf-8", "replace"))
    return opts


def pg_start(opts):
    data = os.environ["IDEM_TEST_PG_DATA"]
    log = os.path.join(os.path.dirname(data), "server.log")
    p = subprocess.run(_as_pg_owner([pg_bin("pg_ctl"), "-D", data, "-l", log, "-w", "-t", "60",
                                     "-o", " ".join(shlex.quote(o) for o in opts), "start"]),
                       capture_output=True, timeout=90)
    if p.returncode != 0:
        fail("pg_ctl start failed: %s" % p.stderr.decode("utf-8", "replace"))


def _restart_mid_stream(cl, mode):
    for s in cl.servers:
        if not s.alive():
            s.start()
    pids = [s.proc.pid for s in cl.servers]
    users = [cl.principal("restart%d" % i) for i in range(WRITERS)]
    sent = []  # (writer, instance, key, body, response or exception, t_sent, t_done)
    lock = threading.Lock()
    stop = threading.Event()
    marks = {}

    def writer(i):
        n = 0
        while not stop.is_set():
            n += 1
            inst = (i + n) % 3
            key = new_key("r%d-%d" % (i, n))
            body = {"productId": "p-1024", "quantity": 1 + n % 9}
            t_sent = time.monotonic()
            try:
                r = users[i][inst].post("/api/orders", body, key=key, timeout=30)
            except Exception as e:  # noqa: BLE001 - orderd is never stopped here: a failure
                r = e
            with lock:
                sent.append((i, inst, key, body, r, t_sent, time.monotonic()))
            if not isinstance(r, Exception) and r.status == 503:
                stop.wait(0.1)  # a client honours Retry-After; the test keeps it short
            else:
                stop.wait(0.01)

    # One request sits between its phases (X-Test-Delay-Ms) across the whole outage: phase 1
    # committed before the stop, phase 2 needs a connection again after the start.
    held_user = cl.principal("held")
    held_key, held_body = new_key("held"), {"productId": "p-2048", "quantity": 7}
    held = {}

    def held_request():
        try:
            held["r"] = held_user[2].post("/api/orders", held_body, key=held_key, timeout=60,
                                          headers={"X-Test-Delay-Ms": str(HELD_DELAY_MS)})
        except Exception as e:  # noqa: BLE001
            held["r"] = e

    threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(WRITERS)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # pacing: the stream runs a while before the held request and the stop
    held_thread = threading.Thread(target=held_request, daemon=True)
    held_sent = time.monotonic()
    held_thread.start()
    # The stop comes once the held request's phase 1 is committed (it then sleeps HELD_DELAY_MS).
    wait_until("the held request's phase 1 before the stop",
               lambda: "r" in held or len(order_ids(held_user[0])) == 1, pause_s=0.05)
    expect("r" not in held, "the held request ended before the stop: %r" % (held.get("r"),))
    marks["stopping"] = time.monotonic()
    opts = pg_stop(mode)
    marks["stopped"] = time.monotonic()
    time.sleep(PG_DOWN_S)
    marks["starting"] = time.monotonic()
    pg_start(opts)
    marks["started"] = time.monotonic()
    # Stream on until every instance has answered a 201 again (they reconnect by themselves).
    deadline = time.monotonic() + RECOVER_S
    recovered = {}
    while len(recovered) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        with lock:
            for _, inst, _, _, r, t_sent, t_done in sent:
                if t_sent >= marks["started"] and getattr(r, "status", None) == 201 and \
                        inst not in recovered:
                    recovered[inst] = t_done - marks["started"]
    time.sleep(0.5)  # pacing: the stream goes on a moment after the recovery, then stops
    stop.set()
    for t in threads:
        t.join(40)
    expect(not any(t.is_alive() for t in threads), "a writer hung")

    held_thread.join(40)
    hr = held.get("r")
    if isinstance(hr, Exception) or hr is None:
        fail("the request held across the outage got no answer: %r" % (hr,))
    if hr.status == 503 and held_sent + HELD_DELAY_MS / 1000.0 > marks["started"] + 0.2:
        fail("the held request began phase 2 %.2f s after PostgreSQL was back, yet got %s\n%s" % (
            held_sent + HELD_DELAY_MS / 1000.0 - marks["started"], hr.describe(),
            cl.servers[2].logs()))
    if hr.status == 503:
        expect_problem(hr, 503, "idempotency-store-unavailable", "the held request")
    elif hr.status != 201:
        fail("the request held across the outage: expected 201 (or 503), got %s" % hr.describe())
    errors = [x for x in sent if isinstance(x[4], Exception)]
    if errors:
        fail("a request to a live orderd failed without an answer: %r (instance %s)" % (
            errors[0][4], cl.servers[errors[0][1]].name))
    bad = [x for x in sent if x[4].status not in (201, 503)]
    if bad:
        fail("during the restart a request got neither 201 nor 503: %s" % bad[0][4].describe())
    for x in sent:
        if x[4].status == 503:
            expect_problem(x[4], 503, "idempotency-store-unavailable", "503 during the restart")
            retry_after_seconds(x[4], "503 during the restart")
        elif x[4].replayed:
            fail("a fresh key was answered as a replay: %s" % x[4].describe())
    down = [x for x in sent if x[5] >= marks["stopped"] and x[6] <= marks["starting"]]
    down_ok = [x for x in down if x[4].status == 201]
    if down_ok:
        fail("a request sent and answered while PostgreSQL was down got 201: %s" %
             down_ok[0][4].describe())
    n503_down = len(down)
    n503 = sum(1 for x in sent if x[4].status == 503)
    before = sum(1 for x in sent if x[6] <= marks["stopping"] and x[4].status == 201)
    after = sum(1 for x in sent if x[5] >= marks["started"] and x[4].status == 201)
    expect(n503_down > 0, "no request was answered while PostgreSQL was down")
    missing = [cl.servers[i].name for i in range(3) if i not in recovered]
    if missing:
        fail("no 201 from %s within %.0f s of PostgreSQL being back (orderd must reconnect by "
             "itself)\n%s" % (", ".join(missing), RECOVER_S, "\n".join(
                 cl.servers[i].logs() for i in range(3) if i not in recovered)))
    expect_eq([s.proc.pid if s.alive() else None for s in cl.servers], pids,
              "orderd processes (none may die or be restarted)")

    # Every key again, on another instance: acknowledged ones replay, the rest run once now.
    acked = {x[2]: x[4] for x in sent if x[4].status == 201}
    outcome = {"replayed": 0, "executed": 0, "after_wait": 0}
    lost = doubled = 0
    final = {}
    for i, inst, key, body, first, _, _ in sent:
        r, interim, _ = retry_until_final(users[i], key, body, start=inst + 1)
        if r.status != 201:
            fail("retry of %s: expected 201, got %s (interim %r)%s" % (
                key, r.describe(), interim,
                " - an order exists without its idempotency record" if r.status == 200 else ""))
        outcome["replayed" if r.replayed else "executed"] += 1
        outcome["after_wait"] += 1 if interim else 0
        if key in acked and (not r.replayed or r.body != acked[key].body):
            lost += 1
            fail("acknowledged key %s: expected its 201 replayed byte for byte\nfirst: %s\n"
                 "retry: %s" % (key, acked[key].describe(), r.describe()))
        final[key] = r.json()["orderId"]
    hr2, hinterim, _ = retry_until_final(held_user, held_key, held_body, start=0)
    if hr2.status != 201 or (hr.status == 201 and (not hr2.replayed or hr2.body != hr.body)):
        fail("retry of the held request (first %s): got %s (interim %r)" % (
            hr.describe(300), hr2.describe(), hinterim))
    expect_eq(order_ids(held_user[0]), [hr2.json()["orderId"]], "orders of the held request")
    total = 0
    for i in range(WRITERS):
        listed = order_ids(users[i][0])
        mine = {final[x[2]] for x in sent if x[0] == i}
        doubled += len(listed) - len(set(listed))
        if len(listed) != len(set(listed)) or set(listed) != mine:
            fail("writer %d: %d orders listed, expected exactly the %d of its keys; extra %r, "
                 "missing %r" % (i, len(listed), len(mine), sorted(set(listed) - mine)[:5],
                                 sorted(mine - set(listed))[:5]))
        total += len(listed)
    print("     RESTART (%s): %d writers over 3 instances, %d keys; pg_ctl stop took %.2f s, "
          "down %.1f s, pg_ctl start took %.2f s; %d x 201 before the stop, %d x 503 in "
          "all (%d sent and answered while down), %d x 201 after the start (first 201 after "
          "%s); no 500, no orderd restarted" % (
              mode, WRITERS, len(sent), marks["stopped"] - marks["stopping"],
              marks["starting"] - marks["stopped"],
              marks["started"] - marks["starting"], before, n503, n503_down, after,
              ", ".join("%s %.2f s" % (cl.servers[k].name, v) for k, v in sorted(
                  recovered.items()))))
    print("     RESTART (%s): a request held between its phases across the outage got %d%s; its "
          "retry %d%s" % (mode, hr.status, "" if hr.status == 201 else " (then phase 2 by a retry)",
                          hr2.status, " replayed" if hr2.replayed else " (finished now)"))
    expect(hr.status != 201 or hr2.replayed, "a 201 of the held request was not stored")
    print("     RESTART (%s): retries of every key: %d replayed (all %d acknowledged among "
          "them), %d executed now, %d after 409/503; %d orders for %d distinct keys: lost %d, "
          "duplicated %d" % (mode, outcome["replayed"], len(acked), outcome["executed"],
                             outcome["after_wait"], total, len(final), lost, doubled))
    expect_eq(total, len(final), "orders in the database vs distinct keys")


@test
def test_postgres_fast_restart_mid_stream_503s_then_recovers_nothing_lost_or_doubled(cl):
    # pg_ctl stop -m fast: the server ends every session (57P01), checkpoints, stops.
    _restart_mid_stream(cl, "fast")


@test
def test_postgres_crash_restart_mid_stream_503s_then_recovers_nothing_lost_or_doubled(cl):
    # pg_ctl stop -m immediate: connections are cut with no goodbye; crash recovery at start.
    _restart_mid_stream(cl, "immediate")


# ---- (d) the pool runs out -------------------------------------------------------------------

class PsqlSession:
    """A psql process kept open, fed statements on stdin (to hold a lock across test steps)."""

    def __init__(self, uri):
        self.p = subprocess.Popen([pg_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", uri],
                                  stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)

    def send(self, sql):
        self.p.stdin.write(sql.encode("utf-8") + b"\n")
        self.p.stdin.flush()

    def close(self):
        if self.p.poll() is None:
            try:
                self.send("ROLLBACK;")
                self.p.stdin.close()
            except OSError:
                pass
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def _wait_until(uri, sql, what, deadline_s=30.0):
    deadline = time.monotonic() + deadline_s
    while True:
        rows = psql(uri, sql + ";\n")
        if rows and rows[0][0] not in ("0", "f", ""):
            return
        if time.monotonic() > deadline:
            fail("%s: not seen within %.0f s" % (what, deadline_s))
        time.sleep(0.05)


@test
def test_pool_exhaustion_is_503_with_retry_after_then_recovers(cl):
    # lock_timeout set in `options` is left alone by the store: the holder waits up to 30 s for
    # the table lock while it keeps the pool's only connection, longer than the 5 s others wait.
    uri = cl.db_uri + "?options=-c%20lock_timeout%3D30000"
    d = Server(db_uri=uri, name="orderd-pool1",
               extra_args=["--db-pool", "1", "--sweep-interval-s", "0"])
    holder = None
    try:
        d.start()
        users = cl.principal("pool")
        others = [cl.principal("pool%d" % i) for i in range(3)]
        held = Client(d, users[0].token, users[0].user)
        waiting = [Client(d, o[0].token, o[0].user) for o in others]
        # Readers pass (ACCESS SHARE), every INSERT INTO orders waits (ROW EXCLUSIVE).
        holder = PsqlSession(cl.db_uri)
        holder.send("BEGIN; LOCK TABLE orders IN EXCLUSIVE MODE;")
        _wait_until(cl.db_uri, "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = "
                    "l.relation WHERE c.relname = 'orders' AND l.mode = 'ExclusiveLock' AND "
                    "l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = "
                    "current_database())", "psql's lock on orders")
        out = {}

        def first():
            out["r"] = held.create_order(new_key("held"), product="p-1024", quantity=1,
                                         timeout=60)
        t = threading.Thread(target=first, daemon=True)
        t.start()
        _wait_until(cl.db_uri, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                    "'Lock' AND application_name = 'libidem' AND datname = current_database()",
                    "orderd-pool1's request blocked on the lock (holding its one connection)")
        keys = [new_key("starved") for _ in waiting]
        hout = {}
        ht = threading.Thread(target=lambda: hout.update(r=d.client().get("/healthz", timeout=30)),
                              daemon=True)
        t0 = time.monotonic()
        ht.start()
        results = blast([(c, k, {"productId": "p-2048", "quantity": 1}, None)
                         for c, k in zip(waiting, keys)])
        ht.join(30)
        took = time.monotonic() - t0
        health = hout.get("r")
        expect(health is not None, "/healthz did not answer while the pool was empty")
        statuses = [outcome_of(r) for r in results]
        for r in results:
            if isinstance(r, Exception):
                fail("a request to the starved instance failed: %r" % r)
            expect_problem(r, 503, "idempotency-store-unavailable",
                           "a request while the only connection is held")
            retry_after_seconds(r, "503 of an empty pool")
        expect_problem(health, 503, "idempotency-store-unavailable", "/healthz with no connection")
        expect(t.is_alive(), "the holder finished before the lock was released")
        holder.close()
        holder = None
        t.join(30)
        r = out.get("r")
        expect(r is not None and r.status == 201 and not r.replayed,
               "the request that held the connection should finish with 201 once the lock is "
               "gone, got %s" % (r.describe() if r is not None else "nothing"))
        for o in others:
            expect_eq(order_ids(o[1]), [], "orders of a starved request (nothing may run)")
        again = [c.create_order(k, product="p-2048", quantity=1) for c, k in zip(waiting, keys)]
        for a in again:
            expect(a.status == 201 and not a.replayed,
                   "retry of a starved request: expected a fresh 201, got %s" % a.describe())
        expect_eq(d.client().get("/healthz").status, 200, "/healthz after the pool is free")
        print("     POOL: --db-pool 1 held by a blocked request: %d concurrent requests -> %r and "
              "/healthz %d within %.2f s; the holder then 201; retries %r; /healthz 200" % (
                  len(results), statuses, health.status, took, [a.status for a in again]))
    finally:
        if holder is not None:
            holder.close()
        d.close()


# ---- (e) the network to PostgreSQL goes silent ---------------------------------------------

SILENT_REQUESTS = 4
# tcp_user_timeout (10 s) on a pooled connection, then a reconnection's connect_timeout (5 s).
SILENT_ANSWER_S = 25.0


class SilentPort:
    """
    Every packet to or from a loopback TCP port dropped (iptables, INPUT on lo), both ways: a peer
    that neither answers nor closes.  Needs root (make test runs as root; scripts/deps.sh test installs
    iptables).  The rules go on leaving the block, whatever happens in it.
    """

    def __init__(self, port):
        self.rules = [["-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"],
                      ["-i", "lo", "-p", "tcp", "--sport", str(port), "-j", "DROP"]]

    def _iptables(self, op, rule):
        return subprocess.run(["iptables", "-w", "5", op, "INPUT"] + rule, capture_output=True,
                              text=True)

    def __enter__(self):
        if os.geteuid() != 0:
            raise TestFailure("silencing PostgreSQL's port takes iptables, hence root (make test "
                              "runs as root)")
        for rule in self.rules:
            p = self._iptables("-I", rule)
            if p.returncode != 0:
                self.__exit__()
                raise TestFailure("iptables -I INPUT %s: %s" % (" ".join(rule), p.stderr.strip()))
        return self

    def __exit__(self, *exc):
        for rule in self.rules:
            while self._iptables("-D", rule).returncode == 0:  # until none is left
                pass
        return False


@test
def test_silent_network_to_postgres_is_503_within_seconds_then_recovers(cl):
    a = cl.servers[0]
    if not a.alive():
        a.start()
    users = cl.principal("silent")
    client = users[0]
    body = {"productId": "p-2048", "quantity": 2}
    # Warm the pool, all at once: these connections are open when the network goes silent.
    for r in blast([(client, new_key("warm"), body, None) for _ in range(SILENT_REQUESTS)]):
        expect(not isinstance(r, Exception) and r.status == 201,
               "an order before the network goes silent: %r" % (r,))
    keys = [new_key("silent") for _ in range(SILENT_REQUESTS)]
    with SilentPort(int(os.environ["IDEM_TEST_PG_PORT"])):
        t0 = time.monotonic()
        results = blast([(client, k, body, None) for k in keys], timeout=SILENT_ANSWER_S + 30)
        took = time.monotonic() - t0
    for r in results:
        if isinstance(r, Exception):
            fail("a request while PostgreSQL was silent got no answer: %r\n%s" % (r, a.logs()))
        expect_problem(r, 503, "idempotency-store-unavailable",
                       "a request while PostgreSQL was silent")
        retry_after_seconds(r, "503 while PostgreSQL was silent")
    expect(took < SILENT_ANSWER_S, "every request answered within %.0f s of the network going "
           "silent (took %.1f s)" % (SILENT_ANSWER_S, took))
    # Packets flow again: the instance reconnects by itself; each key ends with one order.
    final = {}
    for k in keys:
        r, _, _ = retry_until_final(users, k, body, start=0)
        expect_eq(r.status, 201, "retry of %s after the network came back" % k)
        final[k] = r.json()["orderId"]
    listed = order_ids(client)
    expect_eq(len(listed), len(set(listed)), "no order listed twice")
    expect_eq(len(listed), SILENT_REQUESTS + len(keys),
              "the user's orders: the warm-up's, and one per key sent while silent")
    expect(set(final.values()) <= set(listed), "every key's order is listed")
    expect(a.alive(), "orderd still runs (it recovered by itself)")
    print("     SILENT: %d requests on pooled connections while every packet to PostgreSQL was "
          "dropped -> %r within %.1f s; after the network came back each key made one order" % (
              len(results), [outcome_of(r) for r in results], took))


if __name__ == "__main__":
    run("test_pg_cluster", setup=Cluster, teardown=lambda cl: cl and cl.close())
