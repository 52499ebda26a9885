#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_failover.py - orderd on a Patroni cluster of three PostgreSQL nodes (tests/ha/with_ha.sh), its store URI naming all three with target_session_attrs=read-write.  While clients
keep ordering (each key retried until it gets a final answer, as a client of docs/http-api.md
does), the primary changes twice: a Patroni switchover, then the new primary's node dies (kill -9
of its Patroni agent and its postmaster), so the survivors elect a new leader once its key expires
(ttl).  What a user relies on:

  - every key ends with 201, and each made exactly one order: no order acknowledged with a 2xx is
    missing after the failovers, none is there twice;
  - between a failover and the next success, requests get 503 (never a 2xx that is then lost);
  - orderd follows the new primary by itself (no restart), and the cluster ends with a new one.

Prints the seconds of unavailability per failover (first failed request to first success).
Then idem-gateway on the same URI through a switchover: each key reaches its (not idempotent)
upstream exactly once.
Runs only under with_ha.sh (it needs IDEM_TEST_HA_URI).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))

from harness import Server, expect, expect_eq, fail, new_key, run, test  # noqa: E402
from gateway_harness import Gateway, Upstream  # noqa: E402

CLIENTS = 4


def cluster():
    cfg = os.environ["IDEM_TEST_HA_CONFIGS"].split()[0]
    out = subprocess.run(["patronictl", "-c", cfg, "list", "-f", "json"], capture_output=True,
                         text=True, timeout=30).stdout
    try:
        return json.loads(out)
    except ValueError:
        return []


def member(role):
    for m in cluster():
        if m.get("Role") == role and m.get("State") in ("running", "streaming"):
            return m
    return None


def wait_for(what, cond, timeout_s=90):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.5)
    fail("%s: not within %d s: %r" % (what, timeout_s, cluster()))


def healthy():
    """A leader and a sync standby, both up: the cluster takes writes durably again."""
    leader, sync = member("Leader"), member("Sync Standby")
    return (leader, sync) if leader and sync else None


class Load:
    """CLIENTS threads ordering with new keys, each retried until final; answers are recorded."""

    def __init__(self, user):
        self.user = user
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.finals = {}  # key -> final response
        self.events = []  # (monotonic time, ok) of every attempt
        self.threads = [threading.Thread(target=self.client) for _ in range(CLIENTS)]

    def client(self):
        while not self.stop.is_set():
            k = new_key("ha")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    r = self.user.create_order(k, timeout=15)
                    status = r.status
                except Exception:  # a reset or refused connection: retry as a client would
                    r, status = None, 0
                with self.lock:
                    self.events.append((time.monotonic(), 200 <= status < 300))
                if r is not None and status not in (0, 409, 503):
                    with self.lock:
                        self.finals[k] = r
                    break
                time.sleep(0.1)
            else:
                with self.lock:
                    self.finals[k] = None

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(150)

    def unavailable_after(self, t0):
        """Seconds from the first failed attempt after t0 to the next success (0: none failed)."""
        with self.lock:
            events = sorted(e for e in self.events if e[0] >= t0)
        first_fail = next((t for t, ok in events if not ok), None)
        if first_fail is None:
            return 0.0
        back = next((t for t, ok in events if ok and t > first_fail), None)
        return (back - first_fail) if back else float("inf")


def switchover():
    """patronictl switchover from the leader to its sync standby, until that one leads a healthy
    cluster; the monotonic time it began."""
    leader, sync = healthy()
    t0 = time.monotonic()
    cfg = os.environ["IDEM_TEST_HA_CONFIGS"].split()[0]
    p = subprocess.run(["patronictl", "-c", cfg, "switchover", "--leader", leader["Member"],
                        "--candidate", sync["Member"], "--force"],
                       capture_output=True, text=True, timeout=60)
    expect_eq(p.returncode, 0, "patronictl switchover: %s%s" % (p.stdout, p.stderr))
    wait_for("the switchover", lambda: (member("Leader") or {}).get("Member") ==
             sync["Member"] and healthy())
    return t0


def problem_code(resp):
    try:
        return resp.json().get("code")
    except (ValueError, AttributeError):
        return None


def successes_since(load, t0):
    with load.lock:
        return sum(1 for t, ok in load.events if ok and t >= t0)


@test
def test_orders_survive_a_switchover_and_a_killed_primary(_):
    uri = os.environ["IDEM_TEST_HA_URI"]
    leader0, _ = wait_for("a healthy cluster", healthy)
    with Server(name="orderd-ha", db_uri=uri) as s:
        u = s.new_user("ha")
        downtime = []
        with Load(u) as load:
            # The load runs before the first failover: some orders made (not a fixed head start,
            # which a slow build may spend starting up).  With the 6 + 6 after each failover,
            # the 20 orders checked below.
            wait_for("orders before the switchover", lambda: successes_since(load, 0) >= 8)
            # 1. A switchover to the synchronous standby (what an operator does for maintenance).
            t0 = switchover()
            wait_for("orders after the switchover", lambda: successes_since(load, t0 + 0.5) > 5)
            downtime.append(("switchover", load.unavailable_after(t0)))
            # 2. The new primary's node dies: its Patroni agent and its postmaster, kill -9 (killing
            #    the postmaster alone, its agent would restart it and stay the leader).
            leader, _ = healthy()
            data = os.path.join(os.environ["IDEM_TEST_HA_DIR"], leader["Member"])
            with open(os.path.join(data, "postmaster.pid")) as f:
                pid = int(f.readline())
            # The agent (and the runuser that started it under root): every process naming its
            # config file -- by its full path: another cluster beside this one names its nodes
            # alike.
            agents = [int(x) for x in subprocess.run(
                ["pgrep", "-f", "patroni %s.yml" % data], capture_output=True,
                text=True).stdout.split()]
            expect(agents, "the Patroni agent of %s" % leader["Member"])
            t1 = time.monotonic()
            for a in agents:
                os.kill(a, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
            wait_for("a new leader after the kill", lambda: (
                member("Leader") or {}).get("Member") not in (None, leader["Member"]), 120)
            wait_for("orders after the kill", lambda: successes_since(load, t1 + 0.5) > 5,
                     timeout_s=120)
            downtime.append(("kill -9 of the primary", load.unavailable_after(t1)))
        finals = load.finals
        failed = {k: (r.describe(200) if r is not None else "no final answer in 120 s")
                  for k, r in finals.items() if r is None or r.status != 201}
        expect(not failed, "every key ends 201: %r" % list(failed.items())[:5])
        ids = [r.json()["orderId"] for r in finals.values() if r is not None and r.status == 201]
        orders = u.all_orders()
        listed = [o["orderId"] for o in orders]
        expect_eq(len(listed), len(set(listed)), "no order twice")
        expect_eq(sorted(listed), sorted(ids),
                  "the orders are exactly the acknowledged ones (none lost, none extra)")
        expect(len(ids) >= 20, "enough orders to mean something: %d" % len(ids))
        # After the kill the sync standby leads: it may be the first primary again (it became a
        # replica at the switchover), never the node that was killed.
        now = member("Leader")
        expect(now is not None and now["Member"] != leader["Member"],
               "a new primary after the kill: %r -> %r" % (leader["Member"], now and now["Member"]))
        print("     %d orders through 2 failovers (%s -> ... -> %s); unavailable: %s"
              % (len(ids), leader0["Member"], now["Member"],
                 ", ".join("%s %.1f s" % d for d in downtime)))


@test
def test_gateway_follows_the_primary(_):
    """
    idem-gateway on the same multi-host URI, in front of an upstream that does not dedupe: keyed
    POSTs retried until final through a switchover each reach the upstream exactly once.  A key
    whose completion the switchover cut after the upstream answered is held (the route's default
    `hold`: 503 outcome-unknown to every retry, never forwarded again): it reached the upstream
    once at most, and such keys are the few in flight at the switchover.
    """
    uri = os.environ["IDEM_TEST_HA_URI"]
    wait_for("a healthy cluster", healthy)
    up = Upstream()
    stop = threading.Event()
    lock = threading.Lock()
    finals, events, errors = {}, [], {}

    def client(n):
        i = 0
        while not stop.is_set():
            i += 1
            k = "gw-ha-%d-%d" % (n, i)
            deadline = time.monotonic() + 60
            final = None
            while time.monotonic() < deadline:
                try:
                    r = gw.request("POST", "/v1/things", {"n": n, "i": i}, key=k, timeout=15)
                    status, error = r.status, None
                except Exception as e:  # a reset or refused connection: retry as a client would
                    r, status, error = None, 0, "%s: %s" % (type(e).__name__, e)
                with lock:
                    events.append((time.monotonic(), 200 <= status < 300))
                    if error:
                        errors[k] = error
                if status not in (0, 409, 503):
                    final = status
                    break
                if status == 503 and problem_code(r) == "outcome-unknown":
                    final = "held"  # an operator decides (idem-gateway keys resolve)
                    break
                time.sleep(0.1)
            with lock:
                finals[k] = final

    try:
        with Gateway(up, db_uri=uri, name="gateway-ha") as gw:
            threads = [threading.Thread(target=client, args=(n,)) for n in range(3)]
            for t in threads:
                t.start()

            def ok_since(since):
                with lock:
                    return sum(1 for t, ok in events if ok and t >= since)
            # Keys answered before the switchover (not a fixed head start): with the 6 after it,
            # the 20 keys checked below.
            wait_for("answers before the switchover", lambda: ok_since(0) >= 14)
            t0 = switchover()
            wait_for("answers after the switchover", lambda: ok_since(t0 + 0.5) > 5)
            stop.set()
            for t in threads:
                t.join(90)
            expect(gw.alive(), "the gateway still runs at the end\n%s" % gw.logs())
        held = [k for k, v in finals.items() if v == "held"]
        bad = {k: (v, errors.get(k)) for k, v in finals.items() if v not in (201, "held")}
        expect(not bad, "every key ends with the upstream's 201, or held: %r"
               % list(bad.items())[:5])
        twice = {k: up.executions(k) for k in finals
                 if up.executions(k) != 1 and not (k in held and up.executions(k) == 0)}
        expect(not twice, "each key executed once at the upstream (a held one at most once): %r"
               % list(twice.items())[:5])
        expect(len(held) <= 6, "only keys in flight at the switchover are held: %r" % held)
        expect(len(finals) >= 20, "enough keys to mean something: %d" % len(finals))
        print("     %d keys through the gateway across a switchover, each executed once; "
              "%d held (outcome unknown)" % (len(finals), len(held)))
    finally:
        stop.set()
        up.close()


if __name__ == "__main__":
    if "IDEM_TEST_HA_URI" not in os.environ:
        sys.stderr.write("test_failover.py runs under tests/ha/with_ha.sh\n")
        sys.exit(2)
    run("ha_failover")
