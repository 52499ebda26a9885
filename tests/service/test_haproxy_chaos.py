# SPDX-License-Identifier: Apache-2.0
"""
test_haproxy_chaos.py - a real load balancer that retries: `idem-check chaos
--haproxy-config docs/ops/haproxy.cfg` puts HAProxy (Debian 12's 2.6, the shipped example
configuration, unchanged) between its fault proxy and three orderd instances on one store:

    clients -> fault proxy (drops, resets, cuts) -> HAProxy (retry-on all-retryable-errors,
    option redispatch, retries 3) -> orderd x 3 (kill -9 every 3 s)

HAProxy re-sends POSTs that may have run (an instance killed mid-request, orderd's 503s); the
Idempotency-Key makes each re-send a replay or a wait, so the audit must still find exactly one
order, one charge and one confirmation email per intent, nothing lost or unsettled, and HAProxy's
own stats (`show stat` on its admin socket) must show that it did re-send requests.

Also: the shipped file passes `haproxy -c` and carries the settings docs/ha.md explains; a config
HAProxy refuses exits 3 naming its log; --haproxy-config with --attach (and the other misuses) is a
usage error.

Store: SQLite (three processes on one WAL file) as service.haproxy_chaos, and a fresh
PostgreSQL database as service-pg.haproxy_chaos, the deployment the configuration is for.
"""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (BIN, expect, expect_eq, fail, pg_create_database, run_idem_check,  # noqa: E402
                     pg_drop_database, pg_fresh_mode, run, test)

IDEM_CHECK = os.path.join(BIN, "idem-check")
ORDERD = os.path.join(BIN, "orderd")
PROVIDER_SIM = os.path.join(BIN, "provider-sim")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "docs", "ops", "haproxy.cfg")

WORK = tempfile.mkdtemp(prefix="idem-lb-test-")
atexit.register(shutil.rmtree, WORK, True)

BASE = ["chaos", "--orderd-bin", ORDERD, "--provider-bin", PROVIDER_SIM]
FAULTS = ["--drop-rate", "0.1", "--reset-rate", "0.05", "--cut-rate", "0.05",
          "--dup-rate", "0.1", "--provider-lost-rate", "0.05", "--provider-5xx-rate", "0.05"]
# The drive is bounded by time, not by intents: 15 s with a kill every 3 s is about five kills
# whatever the machine's speed (some 1,000-1,500 intents on an idle 2-core machine).
INTENTS = 20000
DRIVE_S = 15


def haproxy():
    """The haproxy program (in /usr/sbin, off a user's PATH); scripts/deps.sh test installs it."""
    path = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.access(path, os.X_OK):
        fail("haproxy is not installed (Debian package `haproxy`; scripts/deps.sh test installs it)")
    return path


def idem_check(args, timeout=150):
    return run_idem_check(args, WORK, timeout)


@test
def test_shipped_config_is_valid(ctx):
    # Valid as shipped (the defaults of every variable) and as idem-check runs it.
    for extra in ({}, {"IDEM_LB_KEEP_USER": "1", "IDEM_ORDERD_1": "127.0.0.1:1",
                       "IDEM_LB_BIND": "127.0.0.1:2", "IDEM_LB_STATS": "/tmp/x.sock"}):
        env = dict((k, v) for k, v in os.environ.items()
                   if not k.startswith(("IDEM_LB_", "IDEM_ORDERD_")))
        env.update(extra)
        p = subprocess.run([haproxy(), "-c", "-f", CONFIG], capture_output=True, env=env,
                           timeout=30)
        expect_eq(p.returncode, 0, "haproxy -c -f docs/ops/haproxy.cfg with %r: %s" %
                  (extra, p.stderr.decode("utf-8", "replace")[-1000:]))
    # The settings docs/ha.md explains, not commented out.
    with open(CONFIG, encoding="utf-8") as f:
        lines = [l.split("#")[0].strip() for l in f]
    for setting in ("retry-on all-retryable-errors", "retries 3", "option redispatch 1",
                    "option httpchk GET /healthz", "option http-buffer-request",
                    "timeout http-request 10s", "balance roundrobin"):
        expect(setting in lines, "docs/ops/haproxy.cfg sets `%s`" % setting)


@test
def test_chaos_through_haproxy_is_clean(ctx):
    haproxy()
    args = BASE + ["--instances", "3", "--kill-every", "3", "--haproxy-config", CONFIG,
                   "--intents", str(INTENTS), "--clients", "8", "--max-time", str(DRIVE_S),
                   "--webhook-dup", "2", "--json"] + FAULTS
    dbname = None
    if pg_fresh_mode():
        uri, dbname = pg_create_database("lbchaos")
        args += ["--db", uri]
    try:
        rc, out, err, took = idem_check(args)
    finally:
        if dbname:
            pg_drop_database(dbname)
    try:
        doc = json.loads(out)
    except ValueError as e:
        fail("--json output is not JSON (%s), rc %d:\n%s\nstderr: %s" % (e, rc, out, err[-2000:]))
    print("measured: chaos through HAProxy took %.1f s: %s" % (took, out.strip()), flush=True)

    # The verdict: exactly once, every started intent.
    started = doc["intents"]["started"]
    expect_eq(rc, 0, "exit code of a clean run:\n%s\nstderr: %s" % (out, err[-2000:]))
    expect_eq(doc["verdict"], "clean", "verdict")
    for what in ("duplicates", "lost", "unsettled", "webhookProblems"):
        expect_eq(doc[what], 0, what)
    expect(200 <= started <= INTENTS, "intents started: %d (at least 200 in %d s)" %
           (started, DRIVE_S))
    expect_eq(doc["intents"]["answered2xx"] + doc["intents"]["finishedByAudit"], started,
              "every started intent finished")
    expect_eq(doc["orders"]["total"], started, "orders made")
    expect_eq((doc["ledger"]["charges"], doc["ledger"]["emails"]), (started, started),
              "one charge and one confirmation email per intent")
    expect(doc["ledger"]["clean"], "the ledger flags no duplicate")

    # The faults happened: kill -9 of instances, the fault proxy's, the provider's.
    f = doc["faults"]
    expect(f["kills"] >= 3, "several kill -9: %r" % f)
    expect(f["proxyDrops"] > 0 and f["proxyResets"] > 0 and f["proxyCuts"] > 0,
           "the fault proxy injected every kind of fault: %r" % f)
    expect(f["provider5xx"] > 0, "the provider failed some calls: %r" % f)

    # HAProxy was in front, from the shipped file, and really re-sent requests.
    lb = doc["haproxy"]
    expect(lb["enabled"] and lb["config"] == CONFIG, "HAProxy in front: %r" % lb)
    expect(lb["stats"], "HAProxy's stats were read: %r" % lb)
    expect(lb["retries"] > 0, "HAProxy retried requests (wretr): %r" % lb)
    expect(lb["redispatches"] > 0, "HAProxy redispatched to another instance (wredis): %r" % lb)
    expect_eq(f["orderdDown"], 0, "the fault proxy's upstream is HAProxy, which never went away")
    expect_eq(len(lb["instances"]), 3, "HAProxy's figures per instance")
    expect(all(i["connections"] > 0 for i in doc["instances"]),
           "HAProxy gave every instance requests: %r" % doc["instances"])
    expect(took <= 150, "a short run stays short (%.1f s)" % took)


@test
def test_a_config_haproxy_refuses_exits_3(ctx):
    haproxy()
    bad = os.path.join(WORK, "bad.cfg")
    with open(bad, "w", encoding="utf-8") as f:
        f.write("global\n    no-such-keyword\n")
    rc, out, err, _ = idem_check(BASE + ["--haproxy-config", bad, "--intents", "5"], timeout=60)
    expect_eq(rc, 3, "exit code when HAProxy does not start (stderr %r)" % err)
    expect("haproxy" in err and "haproxy.stderr" in err, "HAProxy's log is named: %r" % err)


@test
def test_haproxy_usage_errors(ctx):
    attach = ["chaos", "--attach", "--orderd-url", "http://127.0.0.1:9", "--token", "t"]
    for args, what in [
        (attach + ["--haproxy-config", CONFIG], "--haproxy-config with --attach"),
        (attach + ["--haproxy-bin", "/usr/sbin/haproxy"], "--haproxy-bin with --attach"),
        (BASE + ["--haproxy-bin", "/usr/sbin/haproxy"], "--haproxy-bin without --haproxy-config"),
        (BASE + ["--haproxy-config", os.path.join(WORK, "nonexistent.cfg")], "a missing config"),
        (BASE + ["--haproxy-config", CONFIG, "--haproxy-bin", "/nonexistent/haproxy"],
         "a missing haproxy"),
    ]:
        rc, out, err, _ = idem_check(args, timeout=20)
        expect_eq(rc, 2, "exit code for %s (stderr %r)" % (what, err))
        expect("idem-check chaos:" in err, "%s is explained on stderr: %r" % (what, err))
    rc, out, err, _ = idem_check(["chaos", "--help"], timeout=20)
    expect_eq(rc, 0, "--help exit code")
    for flag in ("--haproxy-config", "--haproxy-bin"):
        expect(flag in out, "--help lists %s" % flag)


if __name__ == "__main__":
    run("haproxy chaos")
