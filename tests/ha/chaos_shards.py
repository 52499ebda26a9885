#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
chaos_shards.py - the exactly-once proof over a shard set (docs/chaos.md, "Over a shard set"):
`idem-check chaos` with orderd on `--db shards:DIR --catalogue CAT`, three clusters, one of them
failing over and a bucket moving back and forth meanwhile.  tests/ha/chaos_shards.sh runs it
inside the three servers (`make chaos-shards`):

  c1  a plain PostgreSQL server (tests/pg/with_pg.sh); the directory and the catalogue are two
      more databases on it
  c2  another plain server (tests/pg/with_pg.sh)
  c3  the Patroni cluster of tests/ha/with_ha.sh, by its multi-host URI

  python3 tests/ha/chaos_shards.py BUILD_DIR     the two phases (under chaos_shards.sh)
  python3 tests/ha/chaos_shards.py move N        idem-check's --move-cmd (N: the move's number)

Phase 1, everything at once: three orderd instances, one killed -9 every 3 s, every fault of
`make chaos-failover` (dropped responses, resets, cuts, duplicated sends, provider faults), 60
users, c3 failing over every 20 s through tests/ha/failover.sh (switchover, then kill), and every
15 s a bucket moved between c1 and c2 (`move`, below: CHAOS_SHARDS_MOVE says which).  The audit
must be clean: no key run twice, no answered key lost, nothing unsettled; at least one failover
and two moves ran, each command succeeded.

Phase 2, one shard down: a second run on the same set, new users, no injected fault and no
kill; 8 s into its drive (once its users are made) c3's primary is killed (tests/ha/failover.sh
kill).  The verdict's per-cluster figures must show c1's and c2's users with no failed attempt,
c3's with some, and the audit clean.

Prints the figures of both phases.  Exit 0 when both hold, 1 otherwise.
"""

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
import harness  # noqa: E402
FAILOVER = os.path.join(HERE, "failover.sh")
BUCKETS = 1024  # IDEM_SHARD_BUCKETS

# Phase 1's drive: --max-time bounds it (past it, --min-failovers and --min-moves keep it going
# until one failover and two moves ran); --intents is only a ceiling.
PHASE1_MAX_TIME = int(os.environ.get("CHAOS_SHARDS_MAX_TIME", "90"))
PHASE1_INTENTS = int(os.environ.get("CHAOS_SHARDS_INTENTS", "20000"))
# Seconds between two bucket moves; 0: none (to tell a move's effect from the rest's).
PHASE1_MOVE_EVERY = int(os.environ.get("CHAOS_SHARDS_MOVE_EVERY", "15"))
PHASE2_MAX_TIME = 45
PHASE2_KILL_AT = 8


def say(msg):
    sys.stderr.write("chaos_shards.py: %s\n" % msg)
    sys.stderr.flush()


def die(msg):
    say(msg)
    sys.exit(1)


def psql(uri, sql):
    """One statement's rows as lists of fields (psql -At)."""
    out = subprocess.run([os.path.join(os.environ["IDEM_TEST_PG_BIN"], "psql"), "-X", "-q",
                          "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", uri, "-c", sql],
                         check=True, capture_output=True, text=True).stdout
    return [line.split("\t") for line in out.splitlines() if line]


def bucket_of(principal):
    """docs/shards.md, "The bucket of a principal"."""
    digest = hashlib.sha256(principal.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


# --- the move command -----------------------------------------------------------------------


def move(n):
    """
    Move N of the run: the first picks the bucket among those of the run's users (orderd's users
    table in the catalogue; their names start with "chaos-") that c1 or c2 owns, the one with the
    most users, and keeps it in the state file; every move takes it to the other of c1 and c2, so
    the bucket goes back and forth with its users' traffic on it.  c3 is left to its failovers.
    The move carries the users' records and orderd's rows of them, so the audit finds their
    orders at the new owner.  With CHAOS_SHARDS_MOVE=empty the bucket is instead c1's first that
    none of the run's users has (a move with no traffic on it, to compare).
    """
    directory = os.environ["IDEM_CHAOS_SHARDS_DIRECTORY"]
    state = os.environ["IDEM_CHAOS_SHARDS_STATE"]
    owners = dict((int(b), c) for b, c in
                  psql(directory, "SELECT bucket, cluster FROM idem_shard_buckets"))
    bucket = None
    if os.path.exists(state):
        with open(state) as f:
            bucket = int(f.read().strip())
    else:
        counts = {}
        for (principal,) in psql(os.environ["IDEM_CHAOS_SHARDS_CATALOGUE"],
                                 "SELECT id FROM users WHERE name LIKE 'chaos-%'"):
            b = bucket_of(principal)
            if owners.get(b) in ("c1", "c2"):
                counts[b] = counts.get(b, 0) + 1
        if os.environ.get("CHAOS_SHARDS_MOVE", "users") == "users":
            if not counts:
                die("move %s: no user of the run has a bucket on c1 or c2" % n)
            bucket = max(sorted(counts), key=lambda b: counts[b])
        else:
            bucket = min(b for b, c in owners.items() if c == "c1" and b not in counts)
        with open(state, "w") as f:
            f.write("%d\n" % bucket)
        say("move %s: bucket %d, %d user(s) of the run" % (n, bucket, counts.get(bucket, 0)))
    to = "c2" if owners[bucket] == "c1" else "c1"
    say("move %s: bucket %d from %s to %s" % (n, bucket, owners[bucket], to))
    # A move that fails (a drain timed out under load) is run again, which finishes one cut
    # short (docs/shards.md), as an operator would.
    def moved():
        rc = subprocess.run([os.environ["IDEM_CHAOS_SHARDS_GATEWAY"], "shards", "move",
                             "--directory", directory, str(bucket), "--to", to]).returncode
        if rc != 0:
            say("move %s: failed (exit %d), running it again" % (n, rc))
        return rc == 0

    try:
        harness.wait_until("move %s to end" % n, moved, timeout_s=150, pause_s=2)
    except harness.TestFailure as e:
        say("move %s: %s" % (n, e))
        sys.exit(1)
    sys.exit(0)


# --- the phases -----------------------------------------------------------------------------


def chaos(bindir, common, extra, timeout, during=None):
    """
    idem-check chaos --json with `common` + `extra`: its exit status, report (checked to be
    JSON), stderr and seconds.  `during`, if given, runs in a thread once the drive has begun (the
    first progress line on stderr) and is waited for.
    """
    args = [os.path.join(bindir, "idem-check"), "chaos"] + common + extra + ["--json"]
    say("running: %s" % " ".join(shlex.quote(a) for a in args))
    started = time.time()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_lines, driving = [], threading.Event()

    def read_stderr():
        for line in proc.stderr:
            err_lines.append(line)
            sys.stderr.write(line)  # its progress, failovers and moves as they come
            if line.startswith("chaos: ") and " intents" in line:
                driving.set()
        driving.set()  # it ended without a drive: `during` does not wait for ever

    def side():
        driving.wait()
        if proc.poll() is None:
            during()

    threads = [threading.Thread(target=read_stderr)]
    if during:
        threads.append(threading.Thread(target=side))
    for t in threads:
        t.start()
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    out = proc.stdout.read()
    rc = proc.wait()
    timer.cancel()
    for t in threads:
        t.join()
    took = time.time() - started
    err = "".join(err_lines)
    with open(os.path.join(os.environ["TMPDIR"], "report.%d.json" % int(started)), "w") as f:
        f.write(out)
    if time.time() - started >= timeout:
        die("idem-check chaos ran past %d s:\n%s" % (timeout, err[-3000:]))
    try:
        doc = json.loads(out)
    except ValueError as e:
        die("--json output is not JSON (%s), rc %d:\n%s\nstderr: %s" % (e, rc, out, err[-3000:]))
    return rc, doc, err, took


def audit_problems(rc, doc):
    """What is wrong with a run's audit, [] when clean."""
    bad = []
    if rc != 0 or doc.get("exitCode") != 0 or doc.get("verdict") != "clean":
        bad.append("exit %d, verdict %s" % (rc, doc.get("verdict")))
    for what in ("duplicates", "lost", "unsettled", "webhookProblems"):
        if doc.get(what) != 0:
            bad.append("%s: %s" % (what, doc.get(what)))
    if doc.get("firstProblem"):
        bad.append("first problem: %s" % doc["firstProblem"])
    if not doc.get("audit", {}).get("complete"):
        bad.append("audit incomplete: %r" % doc.get("audit"))
    intents = doc.get("intents", {})
    started = intents.get("started", 0)
    if intents.get("answered2xx", 0) + intents.get("finishedByAudit", 0) != started:
        bad.append("not every intent finished: %r" % intents)
    orders = doc.get("orders", {}).get("total")
    ledger = doc.get("ledger", {})
    if (orders, ledger.get("charges"), ledger.get("emails")) != (started, started, started):
        bad.append("orders %s, charges %s, emails %s for %d intents"
                   % (orders, ledger.get("charges"), ledger.get("emails"), started))
    return bad


def clusters(doc):
    return dict((c["name"], c) for c in doc.get("shards", {}).get("clusters", []))


def cluster_line(c):
    return ("%s: %d users, %d intents, %d failed attempts, longest without a 2xx %.1f s"
            % (c["name"], c["users"], c["intents"], c["failedAttempts"],
               c["longestWithout2xxSeconds"]))


def schedule_lines(doc, what):
    lines = []
    for r in doc.get(what, {}).get("list", []):
        name = "%s %d%s" % (what[:-1], r["n"], " " + r["kind"] if "kind" in r else "")
        lines.append("%s at %.0f s, command %.1f s, %s" %
                     (name, r["startedAt"], r["commandSeconds"],
                      "none failed" if r["noneFailed"] else
                      "unavailable %.1f s" % r["unavailableSeconds"]))
    return lines


def report(phase, doc, took):
    intents = doc["intents"]
    say("%s: %d intents in %.0f s (%d answered 2xx, %d finished by the audit), %d kill -9 of "
        "orderd, %d users; duplicates %d, lost %d, unsettled %d"
        % (phase, intents["started"], took, intents["answered2xx"], intents["finishedByAudit"],
           doc.get("faults", {}).get("kills", 0), doc["users"]["count"], doc["duplicates"],
           doc["lost"], doc["unsettled"]))
    for line in schedule_lines(doc, "failovers") + schedule_lines(doc, "moves"):
        say("%s:   %s" % (phase, line))
    for c in sorted(clusters(doc).values(), key=lambda c: c["name"]):
        say("%s:   %s" % (phase, cluster_line(c)))


def phase1(bindir, common):
    extra = ["--instances", "3", "--kill-every", "3",
             "--drop-rate", "0.1", "--reset-rate", "0.05", "--cut-rate", "0.05",
             "--dup-rate", "0.1", "--provider-lost-rate", "0.05", "--provider-5xx-rate", "0.05",
             "--webhook-dup", "2",
             "--failover-every", "20", "--failover-cmd", "sh " + shlex.quote(FAILOVER),
             "--min-failovers", "1",
             "--intents", str(PHASE1_INTENTS), "--clients", "8",
             "--max-time", str(PHASE1_MAX_TIME), "--grace", "120"]
    if PHASE1_MOVE_EVERY:
        extra += ["--move-every", str(PHASE1_MOVE_EVERY),
                  "--move-cmd", "python3 " + shlex.quote(os.path.abspath(__file__)) + " move",
                  "--min-moves", "2"]
    rc, doc, err, took = chaos(bindir, common, extra, timeout=900)
    report("phase 1", doc, took)
    bad = audit_problems(rc, doc)
    fo, mv = doc.get("failovers", {}), doc.get("moves", {})
    if fo.get("count", 0) < 1 or mv.get("count", 0) < (2 if PHASE1_MOVE_EVERY else 0):
        bad.append("%d failover(s), %d move(s)" % (fo.get("count", 0), mv.get("count", 0)))
    for r in fo.get("list", []) + mv.get("list", []):
        if r["exitStatus"] != 0 or not r["recovered"]:
            bad.append("a failover or move did not end well: %r" % r)
    if doc.get("intents", {}).get("started", 0) < 200:
        bad.append("too few intents to mean anything: %r" % doc.get("intents"))
    if bad:
        die("phase 1 is not clean: %s (idem-check's work directory and report are kept in %s)"
            % ("; ".join(bad), os.environ["TMPDIR"]))
    say("phase 1: clean")


def phase2(bindir, common):
    extra = ["--instances", "3", "--intents", "20000", "--clients", "8",
             "--max-time", str(PHASE2_MAX_TIME), "--grace", "60"]
    killed = {}

    def kill_c3():
        time.sleep(PHASE2_KILL_AT)  # of the drive
        t = time.time()
        killed["rc"] = subprocess.run(["sh", FAILOVER, "kill"]).returncode
        killed["seconds"] = time.time() - t

    rc, doc, err, took = chaos(bindir, common, extra, timeout=600, during=kill_c3)
    report("phase 2", doc, took)
    say("phase 2:   c3's primary killed at %d s, failover.sh kill took %.1f s"
        % (PHASE2_KILL_AT, killed.get("seconds", 0)))
    bad = audit_problems(rc, doc)
    if killed.get("rc") != 0:
        bad.append("tests/ha/failover.sh kill failed (exit %s)" % killed.get("rc"))
    cl = clusters(doc)
    if sorted(cl) != ["c1", "c2", "c3"]:
        bad.append("the verdict's clusters: %r" % sorted(cl))
    else:
        for name in ("c1", "c2"):
            if cl[name]["users"] == 0 or cl[name]["failedAttempts"] != 0:
                bad.append("%s's users saw failures (or it has none): %s"
                           % (name, cluster_line(cl[name])))
        if cl["c3"]["users"] == 0 or cl["c3"]["failedAttempts"] == 0:
            bad.append("c3's users saw no failure of its failover: %s" % cluster_line(cl["c3"]))
    if bad:
        die("phase 2 does not hold: %s (idem-check's work directory and report are kept in %s)"
            % ("; ".join(bad), os.environ["TMPDIR"]))
    say("phase 2: c1's and c2's users saw no error while c3 failed over")


def main(bindir):
    for var in ("IDEM_TEST_HA_URI", "IDEM_CHAOS_SHARDS_C1_URI", "IDEM_TEST_PG_URI"):
        if var not in os.environ:
            sys.stderr.write("chaos_shards.py runs under tests/ha/chaos_shards.sh (no %s)\n" % var)
            sys.exit(2)
    bindir = os.path.abspath(bindir)
    port = os.environ["IDEM_CHAOS_SHARDS_C1_PORT"]
    c1, c2, c3 = (os.environ["IDEM_CHAOS_SHARDS_C1_URI"], os.environ["IDEM_TEST_PG_URI"],
                  os.environ["IDEM_TEST_HA_URI"])
    for db in ("idemdir", "idemcat"):
        psql(c1, "CREATE DATABASE %s" % db)
    directory = "postgresql://postgres@127.0.0.1:%s/idemdir" % port
    catalogue = "postgresql://postgres@127.0.0.1:%s/idemcat" % port
    gateway = os.path.join(bindir, "idem-gateway")
    subprocess.run([gateway, "shards", "init", "--directory", directory, "--cluster",
                    "c1=" + c1, "--cluster", "c2=" + c2, "--cluster", "c3=" + c3], check=True)
    subprocess.run([gateway, "shards", "show", "--directory", directory], check=True)

    work = tempfile.mkdtemp(prefix="idem-chaos-shards-")
    os.environ.update({"IDEM_CHAOS_SHARDS_DIRECTORY": directory,
                       "IDEM_CHAOS_SHARDS_CATALOGUE": catalogue,
                       "IDEM_CHAOS_SHARDS_GATEWAY": gateway,
                       "IDEM_CHAOS_SHARDS_STATE": os.path.join(work, "move.bucket"),
                       "TMPDIR": work})
    common = ["--orderd-bin", os.path.join(bindir, "orderd"),
              "--provider-bin", os.path.join(bindir, "provider-sim"),
              "--db", "shards:" + directory, "--catalogue", catalogue,
              "--shard-directory", directory, "--users", "60"]
    phase1(bindir, common)
    phase2(bindir, common)
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "move":
        move(sys.argv[2])
    elif len(sys.argv) == 2:
        main(os.path.join(sys.argv[1], "bin"))
    else:
        sys.stderr.write("usage: chaos_shards.py BUILD_DIR | move N\n")
        sys.exit(2)
