#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_chaos_failover.py - `idem-check chaos --failover-every S --failover-cmd CMD` on the Patroni
cluster of tests/ha/with_ha.sh (docs/ha.md, "Chaos with failovers").  Three orderd
instances on the cluster's multi-host URI behind HAProxy with the shipped docs/ops/haproxy.cfg
(retry-on all-retryable-errors, redispatch, retries 3), one instance killed -9 every 5 s, dropped
responses, resets, cuts, duplicated sends and provider faults, and every 15 s of the drive the
database fails over through tests/ha/failover.sh: a switchover first, then the primary's node
killed.  The whole deployment of docs/ha.md, failing at every layer at once.  What a user relies
on:

  - the audit is clean: every intent exactly one order, charge and confirmation email, nothing
    lost that a client saw acknowledged, nothing unsettled, every webhook accepted once;
  - both kinds of failover happened (switchover, then kill), each command succeeded, and the
    verdict has how long each left the clients without a 2xx (the kill at least some seconds:
    the dead leader's key must expire first);
  - HAProxy was in front and re-sent requests that failed on an instance (its retries), which the
    keys made harmless.

Prints the figures.  Runs only under with_ha.sh (it needs IDEM_TEST_HA_URI).
"""

import atexit
import json
import os
import shlex
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))

from harness import BIN, expect, expect_eq, fail, run, run_idem_check, test  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
HAPROXY_CONFIG = os.path.join(REPO, "docs", "ops", "haproxy.cfg")

IDEM_CHECK = os.path.join(BIN, "idem-check")
FAILOVER_CMD = "sh " + shlex.quote(os.path.join(HERE, "failover.sh"))

# idem-check keeps its work directory (logs, failover.log) under $TMPDIR; the test's own.
WORK = tempfile.mkdtemp(prefix="idem-chaos-failover-test-")
atexit.register(shutil.rmtree, WORK, True)

# The drive: the first failover (switchover) at 15 s, the second (kill) 15 s after the switchover
# is over (10-60 s on this 2-core machine, under load).  --min-failovers 2 drives on past the 70 s
# until both ran, and one running then keeps the clients going until it is over, so the killed
# primary is always measured.  --intents is only a ceiling.
ARGS = ["chaos", "--orderd-bin", os.path.join(BIN, "orderd"),
        "--provider-bin", os.path.join(BIN, "provider-sim"),
        "--instances", "3", "--kill-every", "5", "--haproxy-config", HAPROXY_CONFIG,
        "--failover-every", "15", "--failover-cmd", FAILOVER_CMD, "--min-failovers", "2",
        "--intents", "60000", "--clients", "8", "--max-time", "70",
        "--drop-rate", "0.05", "--reset-rate", "0.02", "--cut-rate", "0.02", "--dup-rate", "0.05",
        "--provider-lost-rate", "0.02", "--provider-5xx-rate", "0.02", "--json"]


def idem_check(args, timeout):
    return run_idem_check(args, WORK, timeout)


@test
def test_chaos_run_through_a_switchover_and_a_killed_primary(_):
    rc, out, err, took = idem_check(ARGS + ["--db", os.environ["IDEM_TEST_HA_URI"]], timeout=300)
    try:
        doc = json.loads(out)
    except ValueError as e:
        fail("--json output is not JSON (%s), rc %d:\n%s\nstderr: %s" % (e, rc, out, err[-3000:]))
    expect_eq((rc, doc.get("exitCode")), (0, 0),
              "exit code of a clean run:\n%s\nstderr: %s" % (out, err[-3000:]))
    expect_eq(doc["verdict"], "clean", "verdict")
    for what in ("duplicates", "lost", "unsettled", "webhookProblems"):
        expect_eq(doc[what], 0, what)
    expect(doc["audit"]["complete"], "the audit read everything: %r" % doc["audit"])
    started = doc["intents"]["started"]
    expect(started >= 200, "intents enough to mean something: %d" % started)
    expect_eq(doc["intents"]["answered2xx"] + doc["intents"]["finishedByAudit"], started,
              "every started intent finished")
    expect_eq((doc["orders"]["total"], doc["ledger"]["charges"], doc["ledger"]["emails"]),
              (started, started, started), "orders, charges and confirmation emails")
    expect(doc["faults"]["kills"] >= 2, "orderd was killed meanwhile: %r" % doc["faults"])

    fo = doc["failovers"]
    runs = fo["list"]
    expect_eq((fo["every"], fo["count"], len(runs) >= 2), (15, len(runs), True),
              "at least two failovers: %r" % fo)
    expect_eq([r["kind"] for r in runs], ["switchover", "kill"] * (len(runs) // 2) +
              ["switchover"] * (len(runs) % 2), "kinds, alternating from a switchover")
    for r in runs:
        expect_eq(r["exitStatus"], 0, "failover %d's command: %r" % (r["n"], r))
        expect(isinstance(r["unavailableSeconds"], (int, float)) and r["unavailableSeconds"] >= 0,
               "failover %d: an unavailability figure: %r" % (r["n"], r))
        expect(r["recovered"], "failover %d: the clients got a 2xx again: %r" % (r["n"], r))
        expect(r["noneFailed"] or (r["failedAt"] is not None and r["failedAt"] >= r["startedAt"]),
               "failover %d: its failures began while it ran: %r" % (r["n"], r))
    lb = doc.get("haproxy") or {}
    expect(lb.get("retries", 0) > 0, "HAProxy in front re-sent requests: %r" % lb)
    kill = runs[1]
    expect(not kill["noneFailed"] and 1.0 <= kill["unavailableSeconds"] <= 60,
           "a killed primary leaves the clients without a 2xx for seconds (its key expires "
           "first): %r" % kill)
    print("     %d intents in %.1f s, %d kill -9 of orderd, HAProxy retries %d, failovers: %s"
          % (started, took, doc["faults"]["kills"], lb["retries"],
             ", ".join("%s at %.0f s (command %.1f s): %s" %
                       (r["kind"], r["startedAt"], r["commandSeconds"],
                        "none failed" if r["noneFailed"] else
                        "unavailable %.1f s" % r["unavailableSeconds"]) for r in runs)))


if __name__ == "__main__":
    if "IDEM_TEST_HA_URI" not in os.environ:
        sys.stderr.write("test_chaos_failover.py runs under tests/ha/with_ha.sh\n")
        sys.exit(2)
    run("ha_chaos_failover")
