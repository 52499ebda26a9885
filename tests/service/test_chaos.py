"""
test_chaos.py - `idem-check chaos` (src/idem-check/chaos.c, docs/chaos.md): a short run against
orderd + provider-sim with every fault kind on (dropped responses, resets, duplicated sends,
provider 5xx and lost responses, kill -9 of orderd) must end with a clean verdict: every intent one
order, one charge, one confirmation email; nothing duplicated, lost or unsettled.  And bad command
lines exit 2.

Store: on SQLite idem-check makes orderd's file in its own temp directory; under with_pg.sh
(service-pg.test_chaos) the clean run gets a fresh PostgreSQL database and passes it with --db.
"""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (BIN, expect, expect_eq, fail, pg_create_database,  # noqa: E402
                     pg_drop_database, pg_fresh_mode, run, test)

IDEM_CHECK = os.path.join(BIN, "idem-check")
ORDERD = os.path.join(BIN, "orderd")
PROVIDER_SIM = os.path.join(BIN, "provider-sim")


# idem-check keeps each run's work directory (logs, databases) under $TMPDIR for a person to read;
# the tests give it a TMPDIR of their own and remove it at the end.
WORK = tempfile.mkdtemp(prefix="idem-chaos-test-")
atexit.register(shutil.rmtree, WORK, True)


def idem_check(args, timeout=120):
    t0 = time.monotonic()
    env = dict(os.environ, TMPDIR=WORK)
    try:
        p = subprocess.run([IDEM_CHECK] + args, capture_output=True, timeout=timeout, env=env)
    except FileNotFoundError:
        fail("%s not found (IDEM_BIN=%s): build the idem-check target" % (IDEM_CHECK, BIN))
    except subprocess.TimeoutExpired:
        fail("`idem-check %s` did not finish in %d s" % (" ".join(args), timeout))
    took = time.monotonic() - t0
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"), took


BASE = ["chaos", "--orderd-bin", ORDERD, "--provider-bin", PROVIDER_SIM]


@test
def test_short_chaos_run_is_clean(ctx):
    args = BASE + ["--intents", "300", "--clients", "8", "--max-time", "30",
                   "--drop-rate", "0.1", "--reset-rate", "0.05", "--dup-rate", "0.1",
                   "--provider-lost-rate", "0.05", "--provider-5xx-rate", "0.05",
                   "--kill-every", "1", "--json"]
    dbname = None
    if pg_fresh_mode():
        uri, dbname = pg_create_database("chaos")
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
    print("measured: chaos run took %.1f s: %s" % (took, out.strip()), flush=True)
    expect_eq(doc.get("exitCode"), rc, "exitCode member vs the process's exit code")
    expect_eq(rc, 0, "exit code of a clean run:\n%s\nstderr: %s" % (out, err[-2000:]))
    expect_eq(doc["verdict"], "clean", "verdict")
    expect_eq(doc["duplicates"], 0, "duplicates found")
    expect_eq(doc["lost"], 0, "lost found")
    expect_eq(doc["unsettled"], 0, "unsettled orders")
    expect_eq(doc["intents"]["started"], 300, "intents started")
    expect_eq(doc["orders"]["total"], 300, "orders made")
    expect_eq(doc["ledger"]["charges"], 300, "charges in the provider's ledger")
    expect_eq(doc["ledger"]["emails"], 300, "confirmation emails in the provider's ledger")
    expect(doc["ledger"]["clean"], "the ledger flags no duplicate")
    f = doc["faults"]
    expect(f["kills"] >= 1, "at least one kill -9: %r" % f)
    expect(f["proxyDrops"] + f["proxyResets"] > 0, "the proxy injected faults: %r" % f)
    expect(f["provider5xx"] + f["providerLost"] > 0, "the provider injected faults: %r" % f)
    expect(doc["duplicatedSends"] > 0, "some intents were sent twice: %r" % doc)
    expect(doc["retries"] > 0, "clients retried: %r" % doc)
    expect("intents," in err and "kills" in err, "a progress line on stderr: %r" % err[-300:])
    expect(took <= 60, "a short run stays short (%.1f s)" % took)


@test
def test_table_output(ctx):
    rc, out, err, _ = idem_check(BASE + ["--intents", "20", "--max-time", "10"])
    expect_eq(rc, 0, "exit code:\n%s\n%s" % (out, err[-2000:]))
    for row in ("intents started", "client retries", "faults: proxy resets", "DUPLICATES found",
                "LOST found", "UNSETTLED", "verdict: CLEAN"):
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
import http.client, os, re, sys, time, uuid
pid = sys.argv[1]
for _ in range(300):
    try:
        out = open("/proc/%s/fd/1" % pid).read()
    except OSError:
        out = ""
    m = re.search(r"listening on http://127.0.0.1:(\d+)", out)
    if m:
        break
    time.sleep(0.05)
else:
    sys.exit(1)
token = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "token")).read().strip()
c = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=10)
c.request("POST", "/api/orders", body='{"productId":"p-1024","quantity":1}',
          headers={"Authorization": "Bearer " + token, "Content-Type": "application/json",
                   "Idempotency-Key": "extra-" + uuid.uuid4().hex})
print(c.getresponse().status)
"""


@test
def test_audit_catches_an_order_no_intent_made(ctx):
    # The audit must not be vacuous: one order too many is a duplicate, and the run fails.
    import tempfile
    d = tempfile.mkdtemp(prefix="idem-chaos-wrap-")
    wrapper = os.path.join(d, "orderd")
    with open(wrapper, "w") as f:
        f.write(WRAPPER % {"real": ORDERD, "dir": d, "python": sys.executable})
    os.chmod(wrapper, 0o755)
    with open(os.path.join(d, "extra.py"), "w") as f:
        f.write(EXTRA)
    try:
        rc, out, err, _ = idem_check(["chaos", "--orderd-bin", wrapper, "--provider-bin",
                                      PROVIDER_SIM, "--intents", "50", "--max-time", "10",
                                      "--json"])
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)
    try:
        doc = json.loads(out)
    except ValueError:
        fail("--json output is not JSON, rc %d:\n%s\nstderr: %s" % (rc, out, err[-2000:]))
    print("measured: with one extra order: %s" % out.strip(), flush=True)
    expect_eq(rc, 1, "exit code when an order belongs to no intent")
    expect_eq(doc["verdict"], "failed", "verdict")
    expect(doc["duplicates"] >= 1, "the extra order is counted as a duplicate: %r" % doc)
    expect("belongs to no intent" in doc["firstProblem"], "and named: %r" % doc["firstProblem"])


@test
def test_usage_errors(ctx):
    for args, what in [
        (["chaos"], "no binaries"),
        (["chaos", "--orderd-bin", ORDERD], "no --provider-bin"),
        (BASE + ["--drop-rate", "1.5"], "a rate above 1"),
        (BASE + ["--intents", "0"], "zero intents"),
        (BASE + ["--kill-every", "x"], "a bad --kill-every"),
        (BASE + ["--bogus"], "an unknown option"),
        (["chaos", "--orderd-bin", "/nonexistent/orderd", "--provider-bin", PROVIDER_SIM],
         "a missing program"),
    ]:
        rc, out, err, _ = idem_check(args, timeout=20)
        expect_eq(rc, 2, "exit code for %s (stderr %r)" % (what, err))
        expect("idem-check chaos:" in err, "%s is explained on stderr: %r" % (what, err))
    rc, out, err, _ = idem_check(["chaos", "--help"], timeout=20)
    expect_eq(rc, 0, "--help exit code")
    expect("--kill-every" in out, "--help lists the options")


if __name__ == "__main__":
    run("chaos")
