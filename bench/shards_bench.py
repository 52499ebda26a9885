#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
shards_bench.py - the shards scaling benchmark: does idem-gateway's fresh-key rate grow with the
number of PostgreSQL clusters of its shard set (docs/shards.md) when each cluster gets the same
share of CPU?

For N = 1, 2, 4 clusters: N PostgreSQL clusters of this script's own (initdb once, copied; each
its own postmaster on a free 127.0.0.1 port, fsync on, synchronous_commit on: durable) plus a
directory cluster, a fresh database on each per run, `idem-gateway shards init` spreading the
buckets evenly, and idem-gateway (`store: shards:DIRECTORY`, principal from X-Consumer-Id, one
route POST /v1/things) in front of bench/static_http.c.  Each cluster's server processes are in a
cgroup of their own with the same CPU cap (--cap, 0.2 CPU by default; cgroup v1's
cpu.cfs_quota_us, or v2's cpu.max): the postmaster is moved in before any connection opens, with
the children it has, and every backend it forks later inherits the cgroup (checked after each
run).  The directory's cluster, the gateway, the upstream and wrk are not capped: the app tier.

Load: wrk -t2 with 64 connections per cluster (--connections: -c64 x N, so that each cluster has
as many keys in flight at every N) running bench/lua/shards.lua: a new Idempotency-Key per
request from 10,000 principals round-robin (every bucket gets keys); an unmeasured warm-up, a
CHECKPOINT, then --seconds.  Each run has fresh databases, dropped after it.  Per run:
fresh keys/s, each cluster's keys (its idem_records rows), the CPU of each cluster's processes
(/proc: postmaster, children, reaped children) per key and against its cap, the share of the
cgroup's periods it was throttled, the app tier's CPU per key (gateway, upstream, wrk) and its
share of the machine.  Rounds run N = 1, 2, 4 then 4, 2, 1 (--rounds), so a drift of other work
cancels.  Targets: rate(N) >= 0.9 x N x rate(1) for N = 2 and 4, and PostgreSQL's CPU per key
within 10% of N = 1's; a target missed says what limited it.  Then bench/shards_sim.py's model,
fed with the measured one-cluster rate, per-key CPU and cap, extends the curve to 64 clusters,
skewed principals and one cluster's failover.

Without the rights to make a cgroup (not root, no cpu controller) nothing is measured: the report
says "not measured: no cgroup".  Everything listens on 127.0.0.1; every process started here is
stopped by its PID, every cluster by its data directory (pg_ctl -m immediate, then SIGKILL of its
postmaster), the cgroups removed and the temp directories too, also when a step fails.

  python3 bench/shards_bench.py --bin build-bench/bin [--out bench/results] [--seconds 8]
                                [--connections 64] [--cap 0.2] [--rounds 2] [--wait-idle 10]

BENCH_KEEP=1 keeps the temp directories (the clusters' logs, the gateway's config and log).
docs/bench.md ("Shards: scaling with clusters") says how to read the report.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench as B  # noqa: E402  (bench/bench.py: processes, wrk, /proc, metrics)
import shards_sim  # noqa: E402
from bench_fmt import fmt_ms, fmt_rate, mean  # noqa: E402
from bench_pg import PG_STATS_FLUSH_S  # noqa: E402

LUA_SHARDS = os.path.join(HERE, "lua", "shards.lua")
ROUTE_PATH = "/v1/things"
OPERATION = "things.create"
NS = (1, 2, 4)
PRINCIPALS = 10000
WARM_S = 2.0
CFS_PERIOD_US = 10000  # a 10 ms period: a capped cluster waits at most that long for its share
# Every cgroup of the run weighs 8 times a plain one (cpu.shares 8192 of 1024, cpu.weight 800 of
# 100), so that other work on the machine does not take the CPU its cap allows it.
WEIGHT_V1, WEIGHT_V2 = 8192, 800
DEADLINE_S = 900  # a hard stop for the whole run, far above its expected ~2 minutes

T_SCALE = 0.9    # rate(N) ÷ (N × rate(1)), N = 2 and 4
T_CPU_DRIFT = 0.10  # PostgreSQL's CPU per key at N within ±10% of N = 1's

say = B.say


# ---- a cgroup with a CPU cap --------------------------------------------------------------------

V1_CPU = "/sys/fs/cgroup/cpu"
V2_ROOT = "/sys/fs/cgroup"


def cgroup_probe():
    """("v1" | "v2", root) where this process may make a capped cgroup, or (None, reason)."""
    if os.path.exists(os.path.join(V1_CPU, "cpu.cfs_quota_us")):
        root, kind = V1_CPU, "v1"
    elif os.path.exists(os.path.join(V2_ROOT, "cgroup.controllers")):
        with open(os.path.join(V2_ROOT, "cgroup.controllers")) as f:
            if "cpu" not in f.read().split():
                return None, "cgroup v2 without its cpu controller"
        root, kind = V2_ROOT, "v2"
    else:
        return None, "no cgroup cpu controller mounted"
    probe = os.path.join(root, "idem-shards-probe-%d" % os.getpid())
    try:
        if kind == "v2":
            enable_v2_cpu()
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as e:
        return None, "cannot make a cgroup in %s (%s)" % (root, e.strerror)
    return kind, root


def enable_v2_cpu():
    path = os.path.join(V2_ROOT, "cgroup.subtree_control")
    with open(path) as f:
        if "cpu" in f.read().split():
            return
    with open(path, "w") as f:
        f.write("+cpu")


def pct(x):
    """A signed change in percent, "±0%" when it rounds to nothing."""
    return "%+.0f%%" % (x * 100) if round(x * 100) else "±0%"


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


class CpuCap:
    """
    A cgroup of its own for one cluster, capped at `cpus` CPUs (quota over CFS_PERIOD_US), or
    with `cpus` None not capped (the app tier's); either weighs WEIGHT_V1 / WEIGHT_V2.
    """

    def __init__(self, kind, root, name, cpus):
        self.kind, self.root = kind, root
        self.path = os.path.join(root, "idem-shards-%d-%s" % (os.getpid(), name))
        os.mkdir(self.path)
        if kind == "v1":
            write(os.path.join(self.path, "cpu.shares"), str(WEIGHT_V1))
        else:
            write(os.path.join(self.path, "cpu.weight"), str(WEIGHT_V2))
        if cpus is None:
            return
        quota = max(int(cpus * CFS_PERIOD_US), 1000)
        if kind == "v1":
            write(os.path.join(self.path, "cpu.cfs_period_us"), str(CFS_PERIOD_US))
            write(os.path.join(self.path, "cpu.cfs_quota_us"), str(quota))
        else:
            write(os.path.join(self.path, "cpu.max"), "%d %d" % (quota, CFS_PERIOD_US))

    def add(self, pid):
        write(os.path.join(self.path, "cgroup.procs"), str(pid))

    def pids(self):
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def stats(self):
        """(periods, throttled periods, throttled seconds) so far, from cpu.stat."""
        st = {}
        try:
            with open(os.path.join(self.path, "cpu.stat")) as f:
                for ln in f:
                    k, _, v = ln.partition(" ")
                    st[k] = int(v)
        except (OSError, ValueError):
            pass
        thr = (st.get("throttled_time", 0) / 1e9 if self.kind == "v1" else
               st.get("throttled_usec", 0) / 1e6)
        return st.get("nr_periods", 0), st.get("nr_throttled", 0), thr

    def leave(self):
        """Moves this process back to the root cgroup."""
        write(os.path.join(self.root, "cgroup.procs"), str(os.getpid()))

    def remove(self):
        """Moves whatever is left in it to the root cgroup, then removes it."""
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                for pid in self.pids():
                    try:
                        write(os.path.join(self.root, "cgroup.procs"), str(pid))
                    except OSError:
                        pass
                time.sleep(0.1)
        say("could not remove the cgroup %s" % self.path)


# ---- PostgreSQL clusters of this script's own ---------------------------------------------------

class Cluster:
    """
    One PostgreSQL cluster: a copy of the template data directory, its postmaster on a free
    loopback port (fsync on, synchronous_commit on), optionally in a CpuCap.  Stopped by its data
    directory (pg_ctl -m immediate), or by SIGKILL of its postmaster when that fails.
    """

    def __init__(self, name, base, template, os_user):
        self.name = name
        self.dir = os.path.join(base, name)
        self.data = os.path.join(self.dir, "data")
        self.os_user = os_user
        self.cap = None
        self.started = False
        os.makedirs(self.dir)
        subprocess.run(["cp", "-a", template, self.data], check=True, timeout=120)
        if os_user:
            shutil.chown(self.dir, os_user)

    def as_owner(self, cmd):
        return (["runuser", "-u", self.os_user, "--"] if self.os_user else []) + cmd

    def start(self):
        for _ in range(5):
            self.port = B.free_port()
            p = subprocess.run(self.as_owner([
                B.pg_bin("pg_ctl"), "-D", self.data, "-l", os.path.join(self.dir, "server.log"),
                "-w", "-t", "60", "-o",
                "-k %s -c listen_addresses=127.0.0.1 -p %d -c fsync=on -c synchronous_commit=on "
                "-c cluster_name=%s" % (self.dir, self.port, self.name), "start"]),
                capture_output=True, timeout=90)
            if p.returncode == 0:
                self.started = True
                self.postmaster = B.postmaster_pid(self.data)
                return
        raise B.BenchError("PostgreSQL %s did not start: %s" % (self.name, self.log_tail()))

    def log_tail(self):
        try:
            with open(os.path.join(self.dir, "server.log"), "rb") as f:
                return " | ".join(f.read().decode("utf-8", "replace").splitlines()[-5:])
        except OSError:
            return "(no log)"

    def capped(self, cap):
        """Puts the postmaster and its children (before any client connects) into `cap`."""
        self.cap = cap
        for pid in [self.postmaster] + B.child_pids(self.postmaster):
            cap.add(pid)

    def outside_cap(self):
        """The cluster's processes that are not in its cgroup (none expected)."""
        inside = set(self.cap.pids()) if self.cap else set()
        return [p for p in [self.postmaster] + B.child_pids(self.postmaster) if p not in inside]

    def uri(self, db="postgres"):
        return "postgresql://postgres@127.0.0.1:%d/%s" % (self.port, db)

    def create_db(self, name):
        B.psql(self.uri(), 'CREATE DATABASE "%s"' % name)
        return self.uri(name)

    def records(self, db):
        return int(B.psql(self.uri(db), "SELECT count(*) FROM idem_records") or 0)

    def commits(self, db):
        """Transactions committed in database `db` so far (pg_stat_database)."""
        return int(B.psql(self.uri(), "SELECT xact_commit FROM pg_stat_database WHERE datname "
                                      "= '%s'" % db) or 0)

    def cpu(self):
        return B.cluster_cpu_seconds(self.postmaster)

    def stop(self):
        if not self.started:
            return
        p = subprocess.run(self.as_owner([B.pg_bin("pg_ctl"), "-D", self.data, "-m",
                                          "immediate", "-w", "-t", "30", "stop"]),
                           capture_output=True, timeout=60)
        if p.returncode != 0 and self.postmaster:
            try:
                os.kill(self.postmaster, 9)
            except OSError:
                pass
        self.started = False


# ---- the benchmark ------------------------------------------------------------------------------

class ShardsBench(B.Bench):
    """bench.py's Bench for its helpers: start/stop by PID, wrk, meta, clean-up."""

    def __init__(self, args):
        super().__init__(args)
        self.gateway = os.path.join(self.bin, "idem-gateway")
        self.cap = args.cap
        self.rounds = args.rounds
        self.r = {"runs": [], "targets": [], "notes": [], "by_n": {}, "cap": self.cap}
        self.pg_base = None
        self.clusters = []
        self.directory = None
        self.caps = []
        self.app = None
        self.upstream = None

    # -- set-up --

    def start_clusters(self, kind, root):
        os_user = "postgres" if os.getuid() == 0 else ""
        # This script and all it starts (the directory's cluster, the gateway, the upstream,
        # wrk, psql) are the app tier: a cgroup not capped; each cluster is then moved to its own.
        self.app = CpuCap(kind, root, "app", None)
        self.app.add(os.getpid())
        self.pg_base = tempfile.mkdtemp(prefix="idem-shards-pg.")
        os.chmod(self.pg_base, 0o755)  # the server's user writes its data and socket here
        template = os.path.join(self.pg_base, "template")
        os.makedirs(template)
        if os_user:
            shutil.chown(template, os_user)
        p = subprocess.run((["runuser", "-u", os_user, "--"] if os_user else []) + [
            B.pg_bin("initdb"), "-D", template, "-U", "postgres", "--auth=trust",
            "--encoding=UTF8", "--no-locale", "--no-sync"], capture_output=True, timeout=180)
        if p.returncode != 0:
            raise B.BenchError("initdb: %s" % p.stderr.decode("utf-8", "replace")[-600:])
        self.directory = Cluster("directory", self.pg_base, template, os_user)
        self.directory.start()
        for i in range(max(NS)):
            c = Cluster("c%d" % (i + 1), self.pg_base, template, os_user)
            self.clusters.append(c)
            c.start()
            cap = CpuCap(kind, root, c.name, self.cap)
            self.caps.append(cap)
            c.capped(cap)
        shutil.rmtree(template, ignore_errors=True)
        ver = B.psql(self.directory.uri(), "SHOW server_version")
        self.r["meta"]["postgresql"] = "PostgreSQL " + ver
        say("%d clusters and a directory, PostgreSQL %s, each cluster capped at %.2f CPU "
            "(cgroup %s, period %d ms)" % (len(self.clusters), ver, self.cap, kind,
                                           CFS_PERIOD_US // 1000))

    def shards_init(self, dir_uri, uris):
        cmd = [self.gateway, "shards", "init", "--directory", dir_uri]
        for c, u in zip(self.clusters, uris):
            cmd += ["--cluster", "%s=%s" % (c.name, u)]
        p = subprocess.run(cmd, capture_output=True, timeout=120)
        if p.returncode != 0:
            raise B.BenchError("shards init: %s" % p.stderr.decode("utf-8", "replace")[-600:])
        return p.stdout.decode("utf-8", "replace").strip()

    def start_gateway(self, name, dir_uri):
        p = self.start_gateway_route(name, self.gateway, self.upstream.url, "shards:" + dir_uri,
                                     "header: X-Consumer-Id", ROUTE_PATH, OPERATION)
        key = "probe-" + uuid.uuid4().hex[:8]
        for want in ("executed", "replayed"):
            st, hdrs, body = B.http_call(p.url, "POST", ROUTE_PATH, B.ORDER_BODY, {
                "Content-Type": "application/json", "X-Consumer-Id": "principal-probe",
                "Idempotency-Key": key})
            if st != 201 or (hdrs.get("idempotent-replayed") == "true") != (want == "replayed"):
                self.stop(p)
                raise B.BenchError("%s: a keyed POST answered %d (%s expected): %r" % (
                    name, st, want, body[:200]))
        return p

    # -- one run --

    def run_n(self, n, rnd, seconds=None):
        """One run on n clusters; round 0 is the unmeasured warm-up of every cluster."""
        clusters = self.clusters[:n]
        db = "idem_n%d_r%d" % (n, rnd)
        uris = [c.create_db(db) for c in clusters]
        dir_uri = self.directory.create_db("directory_n%d_r%d" % (n, rnd))
        init = self.shards_init(dir_uri, uris)
        gw = self.start_gateway("gateway-n%d-r%d" % (n, rnd), dir_uri)
        try:
            tag = "n%dr%d" % (n, rnd)
            conns = self.conns * n  # the same connections per cluster at every N
            self.wrk(gw.url, LUA_SHARDS, [ROUTE_PATH, tag + "w", str(PRINCIPALS)],
                     conns=conns, seconds=WARM_S)
            rows0 = [c.records(db) for c in clusters]
            for c in clusters:
                B.psql(c.uri(), "CHECKPOINT")  # the warm-up's pages are written before the run
            time.sleep(PG_STATS_FLUSH_S)  # the backends publish their counters
            com0 = [c.commits(db) for c in clusters]
            m0 = B.metrics(gw.admin)
            cg0 = [c.cap.stats() for c in clusters]
            app0 = (B.cpu_seconds(gw.pid), B.cpu_seconds(self.upstream.pid))
            pg0 = [c.cpu() for c in clusters]
            t0 = time.monotonic()
            res = self.wrk(gw.url, LUA_SHARDS, [ROUTE_PATH, tag, str(PRINCIPALS)], conns=conns,
                           seconds=seconds)
            wall = time.monotonic() - t0
            pg1 = [c.cpu() for c in clusters]
            app1 = (B.cpu_seconds(gw.pid), B.cpu_seconds(self.upstream.pid))
            cg1 = [c.cap.stats() for c in clusters]
            time.sleep(0.3)  # the requests wrk left in flight end
            m1 = B.metrics(gw.admin)
            rows1 = [c.records(db) for c in clusters]
            time.sleep(PG_STATS_FLUSH_S)
            com1 = [c.commits(db) for c in clusters]
            outside = sum(len(c.outside_cap()) for c in clusters)
        finally:
            self.stop(gw)
            # The next run's clusters must not vacuum or checkpoint this run's rows meanwhile.
            for c in clusters:
                B.psql(c.uri(), 'DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % db)
        executed = int(B.metric(m1, "idem_gateway_requests_total", operation=OPERATION,
                                outcome="executed") -
                       B.metric(m0, "idem_gateway_requests_total", operation=OPERATION,
                                outcome="executed"))
        other = int(sum(v for (name, _), v in m1.items()
                        if name == "idem_gateway_requests_total") -
                    sum(v for (name, _), v in m0.items()
                        if name == "idem_gateway_requests_total")) - executed
        keys = [b - a for a, b in zip(rows0, rows1)]
        per = []
        for c, k, a, b, s0, s1, ca, cb in zip(clusters, keys, pg0, pg1, cg0, cg1, com0, com1):
            cpu = (b - a) if a is not None and b is not None else None
            per.append({"cluster": c.name, "keys": k, "share": k / max(sum(keys), 1),
                        "commits": cb - ca, "keys_per_commit": k / max(cb - ca, 1),
                        "cpu_s": cpu, "cpu_us_per_key": cpu * 1e6 / max(k, 1) if cpu else None,
                        "cap_used": cpu / (self.cap * wall) if cpu is not None else None,
                        "throttled": (s1[1] - s0[1]) / max(s1[0] - s0[0], 1),
                        "throttled_s": s1[2] - s0[2]})
        pg_cpu = sum(x["cpu_s"] or 0 for x in per)
        app_cpu = {"gateway": app1[0] - app0[0], "upstream": app1[1] - app0[1],
                   "wrk": res["wrk_cpu_us_per_req"] * res["requests"] / 1e6}
        cores = os.cpu_count() or 2
        nkeys = max(sum(keys), 1)
        x = {"n": n, "round": rnd, "rps": res["rps"], "requests": res["requests"],
             "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"], "non2xx": res["non2xx"],
             "socket_errors": res["socket_errors"], "executed": executed, "other": other,
             "keys": sum(keys), "wall_s": wall, "clusters": per,
             "pg_cpu_us_per_key": pg_cpu * 1e6 / nkeys,
             "keys_per_commit": nkeys / max(sum(c["commits"] for c in per), 1),
             "app_cpu_us_per_key": {k: v * 1e6 / nkeys for k, v in app_cpu.items()},
             "app_cpu_us": sum(app_cpu.values()) * 1e6 / nkeys,
             "app_share": sum(app_cpu.values()) / (wall * cores),
             "pg_share": pg_cpu / (wall * cores),
             "machine_busy": res["machine_busy"], "outside_cgroup": outside,
             "init": init.splitlines()[0] if init else ""}
        x["problems"] = []
        if res["non2xx"] or res["socket_errors"]:
            x["problems"].append("%d non-2xx, %d socket errors" % (res["non2xx"],
                                                                   res["socket_errors"]))
        if other:
            x["problems"].append("the gateway counted %d requests not executed" % other)
        if outside:
            x["problems"].append("%d cluster processes outside their cgroup" % outside)
        if abs(sum(keys) - executed) > max(0.01 * executed, 64):
            x["problems"].append("the clusters hold %d new records, the gateway executed %d" % (
                sum(keys), executed))
        say("%s: %7.0f keys/s, p50 %s ms, p99 %s ms; PostgreSQL %.0f µs/key, %.1f "
            "keys/commit (%s), "
            "app tier %.0f µs/key (%.0f%% of the machine), machine %.0f%% busy%s" % (
                "N=%d round %d" % (n, rnd) if rnd else "warm-up, N=%d (not counted)" % n,
                res["rps"], fmt_ms(res["p50_ms"]), fmt_ms(res["p99_ms"]),
                x["pg_cpu_us_per_key"], x["keys_per_commit"], ", ".join(
                    "%s %.0f%% of cap, throttled %.0f%%" % (
                        c["cluster"], (c["cap_used"] or 0) * 100, c["throttled"] * 100)
                    for c in per), x["app_cpu_us"], x["app_share"] * 100,
                res["machine_busy"] * 100,
                "; PROBLEMS: " + "; ".join(x["problems"]) if x["problems"] else ""))
        if rnd:
            self.r["runs"].append(x)
        return x

    def scenarios(self):
        self.upstream = self.start("upstream", [self.static_http, "--listen", "127.0.0.1:0",
                                                "--max-connections-per-ip", "-1"])
        # Every cluster's first run costs more (its WAL files are made, its caches filled): a
        # run on all of them first, not counted.
        self.run_n(max(NS), 0, seconds=WARM_S)
        order = list(NS)
        for rnd in range(1, self.rounds + 1):
            for n in (order if rnd % 2 else list(reversed(order))):
                self.run_n(n, rnd)

    # -- targets and reading --

    def summarise(self):
        for n in NS:
            runs = [x for x in self.r["runs"] if x["n"] == n]
            if not runs:
                continue
            self.r["by_n"][n] = {
                "rps": mean([x["rps"] for x in runs]),
                "per_round": [x["rps"] for x in runs],
                "pg_cpu_us_per_key": mean([x["pg_cpu_us_per_key"] for x in runs]),
                "keys_per_commit": mean([x["keys_per_commit"] for x in runs]),
                "pg_cpu_range": (min(x["pg_cpu_us_per_key"] for x in runs),
                                 max(x["pg_cpu_us_per_key"] for x in runs)),
                "app_cpu_us": mean([x["app_cpu_us"] for x in runs]),
                "upstream_us": mean([x["app_cpu_us_per_key"]["upstream"] for x in runs]),
                "app_share": mean([x["app_share"] for x in runs]),
                "pg_share": mean([x["pg_share"] for x in runs]),
                "machine_busy": mean([x["machine_busy"] for x in runs]),
                "cap_used": mean([c["cap_used"] for x in runs for c in x["clusters"]]),
                "throttled": mean([c["throttled"] for x in runs for c in x["clusters"]]),
                "p50_ms": mean([x["p50_ms"] for x in runs]),
                "problems": [p for x in runs for p in x["problems"]]}
        one = self.r["by_n"].get(1)
        if not one:
            return
        for n in NS[1:]:
            s = self.r["by_n"].get(n)
            if not s:
                continue
            s["scale"] = s["rps"] / max(n * one["rps"], 1e-9)
            s["cpu_vs_1"] = s["pg_cpu_us_per_key"] / max(one["pg_cpu_us_per_key"], 1e-9)
            ok = not s["problems"] and not one["problems"]
            self.r["targets"].append({
                "target": "N=%d: rate ≥ %.1f × %d × rate(N=1)" % (n, T_SCALE, n),
                "measured": "%.0f ÷ (%d × %.0f) keys/s" % (s["rps"], n, one["rps"]),
                "value": "%.2f" % s["scale"], "met": ok and s["scale"] >= T_SCALE, "n": n,
                "kind": "scale"})
            self.r["targets"].append({
                "target": "N=%d: PostgreSQL CPU per key within %.0f%% of N=1's" % (
                    n, T_CPU_DRIFT * 100),
                "measured": "%.0f vs %.0f µs/key" % (s["pg_cpu_us_per_key"],
                                                     one["pg_cpu_us_per_key"]),
                "value": pct(s["cpu_vs_1"] - 1),
                "met": ok and abs(s["cpu_vs_1"] - 1) <= T_CPU_DRIFT, "n": n, "kind": "cpu"})

    def reading(self):
        """What limited each N, in numbers: the clusters' caps, the app tier or the machine."""
        out = []
        cores = os.cpu_count() or 2
        for n, s in sorted(self.r["by_n"].items()):
            capped = s["cap_used"] >= 0.85
            line = ("- **N=%d**: %.0f keys/s; the clusters used %.0f%% of their caps (throttled "
                    "in %.0f%% of the periods), PostgreSQL %.0f%% of the machine; the app tier "
                    "%.0f µs of CPU per key, %.0f%% of the machine's %d cores; the machine %.0f%% "
                    "busy in all. " % (n, s["rps"], s["cap_used"] * 100, s["throttled"] * 100,
                                       s["pg_share"] * 100, s["app_cpu_us"],
                                       s["app_share"] * 100, cores, s["machine_busy"] * 100))
            if capped:
                line += "The clusters' CPU caps were the limit, as the bench intends. "
            elif s["machine_busy"] >= 0.9:
                line += ("The clusters were **not** at their caps: the machine was full (other "
                         "work and the app tier took the CPU the caps would have allowed), so "
                         "this N measured the machine, not the clusters. ")
            elif s["app_share"] * cores >= 0.9:
                line += "The clusters were **not** at their caps: the app tier was saturated. "
            else:
                line += ("The clusters were **not** at their caps and the cores were not full: "
                         "keys waited (%d connections ÷ p50 %s ms ≈ %.0f keys/s), for commits "
                         "(fsync) or for the CPU of other work. " % (
                             self.conns * n, fmt_ms(s["p50_ms"]),
                             self.conns * n * 1000 / max(s["p50_ms"], 1e-9)))
            if "scale" in s:
                one = self.r["by_n"][1]
                line += ("Scale %.2f of N × rate(1); PostgreSQL CPU per key %+.0f%% vs N=1, at "
                         "%.1f keys per commit against %.1f. " % (
                             s["scale"], (s["cpu_vs_1"] - 1) * 100, s["keys_per_commit"],
                             one["keys_per_commit"]))
                if capped and one["cap_used"] >= 0.85:
                    # At the caps a cluster's rate is its CPU ÷ its CPU per key.
                    line += ("With every cluster at its cap, a cluster's rate is its CPU ÷ its "
                             "CPU per key, so the scale follows (cap used %.0f%% ÷ %.0f%%) × "
                             "(%.0f ÷ %.0f µs) = %.2f. " % (
                                 s["cap_used"] * 100, one["cap_used"] * 100,
                                 one["pg_cpu_us_per_key"], s["pg_cpu_us_per_key"],
                                 s["cap_used"] / one["cap_used"] /
                                 max(s["cpu_vs_1"], 1e-9)))
                spread = [(x["pg_cpu_range"][1] - x["pg_cpu_range"][0]) /
                          max(x["pg_cpu_range"][0], 1e-9) for x in (one, s)]
                if self.rounds > 1:
                    line += ("Runs of the same N differed by up to %.0f%% in CPU per key (N=1: "
                             "%.0f–%.0f µs, N=%d: %.0f–%.0f µs): the difference is %s." % (
                                 max(spread) * 100, one["pg_cpu_range"][0],
                                 one["pg_cpu_range"][1], n, s["pg_cpu_range"][0],
                                 s["pg_cpu_range"][1],
                                 "within that noise" if abs(s["cpu_vs_1"] - 1) <= max(spread)
                                 else "more than that noise"))
                # static_http does the same work per request at every N: its CPU per request
                # shows how fast the machine ran meanwhile.
                line += (" The upstream, whose work per request is the same at every N, used "
                         "%.0f µs per request at N=%d against %.0f at N=1 (%+.0f%%), a gauge "
                         "of how far the machine itself drifted between those runs." % (
                             s["upstream_us"], n, one["upstream_us"],
                             (s["upstream_us"] / max(one["upstream_us"], 1e-9) - 1) * 100))
            out.append(line)
        return out

    # -- the report --

    def model(self):
        one = self.r["by_n"].get(1)
        if not one or not one["rps"]:
            return []
        rows = shards_sim.simulate(one["rps"])
        self.r["model"] = rows
        return shards_sim.markdown(rows, one["rps"], one["pg_cpu_us_per_key"], self.cap)

    def markdown(self):
        r, m = self.r, self.r["meta"]
        if r.get("no_cgroup"):
            return ("# idem-gateway on shards: scaling with clusters, %s\n\n**Not measured: no "
                    "cgroup** (%s). The clusters' equal CPU share is what makes the rates "
                    "comparable; without it they are not measured.\n" % (self.ts,
                                                                        r["no_cgroup"]))
        L = ["# idem-gateway on shards: scaling with clusters, %s" % self.ts, "",
             "%s; %d cores, %s RAM; kernel %s; %s; %s; commit %s. wrk -t%d, %d connections per "
             "cluster (-c%d × N), %g s per run "
             "after a %g s warm-up, %d round(s); the machine was %.0f%% busy with other work "
             "right before the run (load average %.2f at the start, %.2f at the end)." % (
                 m.get("cpu", "?"), m.get("cores", 0), m.get("mem", "?"), m.get("kernel", "?"),
                 m.get("wrk", "wrk"), m.get("postgresql", "PostgreSQL ?"), m.get("commit", "?"),
                 B.WRK_THREADS, self.conns, self.conns, self.seconds, WARM_S, self.rounds,
                 m.get("busy_at_start", 0) * 100, m.get("loadavg_start", 0),
                 m.get("loadavg_end", 0)), ""]
        L += ["For N = %s: N PostgreSQL clusters (fsync on, synchronous_commit on), each in a "
              "cgroup of its own capped at **%.2f CPU** (cgroup %s, %d ms period), a directory "
              "cluster (not capped), `idem-gateway shards init` spreading the 1,024 buckets "
              "evenly, idem-gateway (`store: shards:…`, its defaults: `--db-pool 16` per "
              "cluster) in front of `bench/static_http.c`; `bench/lua/shards.lua`: a new key per "
              "request from %s principals round-robin. The app tier (gateway, upstream, wrk) is "
              "not capped. See docs/bench.md, \"Shards: scaling with clusters\"." % (
                  ", ".join(str(n) for n in NS), self.cap, m.get("cgroup", "?"),
                  CFS_PERIOD_US // 1000, "{:,}".format(PRINCIPALS)), "",
              "## Targets", "", "| target | measured | value | met |", "|---|---|---|---|"]
        for t in r["targets"]:
            L.append("| %s | %s | %s | %s |" % (t["target"], t["measured"], t["value"],
                                                "**met**" if t["met"] else "**not met**"))
        L += ["", "## By number of clusters", "",
              "Means over the rounds (each round's rate in brackets). *PostgreSQL CPU*: all the "
              "clusters' processes (`/proc`: postmaster, children, reaped children) ÷ the keys "
              "they stored (new `idem_records` rows). *Cap used*: each cluster's CPU ÷ (cap × "
              "run time), mean over the clusters; *throttled*: the share of its cgroup's periods "
              "in which it hit the cap. *App tier*: gateway + upstream + wrk CPU per key and "
              "their share of the whole machine.", "",
              "| clusters | keys/s | ÷ N × rate(1) | PostgreSQL CPU µs/key (runs' range) | "
              "vs N=1 | keys per commit | cap used | throttled | app tier µs/key | app tier "
              "share of machine | machine busy | p50 ms |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for n, s in sorted(r["by_n"].items()):
            L.append("| %d | **%s** (%s) | %s | %.0f (%.0f–%.0f) | %s | %.1f | %.0f%% | %.0f%% | "
                     "%.0f | %.0f%% | %.0f%% | %s |" % (
                         n, fmt_rate(s["rps"]), " / ".join(fmt_rate(x) for x in s["per_round"]),
                         "%.2f" % s["scale"] if "scale" in s else "1.00",
                         s["pg_cpu_us_per_key"], s["pg_cpu_range"][0], s["pg_cpu_range"][1],
                         pct(s["cpu_vs_1"] - 1) if "cpu_vs_1" in s else "—",
                         s["keys_per_commit"], s["cap_used"] * 100, s["throttled"] * 100,
                         s["app_cpu_us"],
                         s["app_share"] * 100, s["machine_busy"] * 100, fmt_ms(s["p50_ms"])))
        L += ["", "## Runs", "", "In the order they ran; per cluster: its share of the keys, "
              "its PostgreSQL CPU per key, keys per commit, the share of its cap it used and of "
              "its periods it was throttled.", "",
              "| round | N | keys/s | p50 / p99 ms | keys | PostgreSQL µs/key | per cluster | "
              "app tier µs/key (gateway, upstream, wrk) | machine busy | problems |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for x in r["runs"]:
            L.append("| %d | %d | %s | %s / %s | %d | %.0f | %s | %.0f (%s) | %.0f%% | %s |" % (
                x["round"], x["n"], fmt_rate(x["rps"]), fmt_ms(x["p50_ms"]),
                fmt_ms(x["p99_ms"]), x["keys"], x["pg_cpu_us_per_key"], "; ".join(
                    "%s %.0f%%, %.0f µs, %.1f keys/commit, cap %.0f%%, thr. %.0f%%" % (
                        c["cluster"], c["share"] * 100, c["cpu_us_per_key"] or 0,
                        c["keys_per_commit"],
                        (c["cap_used"] or 0) * 100, c["throttled"] * 100)
                    for c in x["clusters"]), x["app_cpu_us"], ", ".join(
                    "%.0f" % v for v in x["app_cpu_us_per_key"].values()),
                x["machine_busy"] * 100, "; ".join(x["problems"]) or "—"))
        reading = self.reading()
        if reading:
            L += ["", "## Reading", ""] + reading
        model = self.model()
        if model:
            L += ["", "## Model: more clusters, skewed principals, failover", ""] + model
        if r["notes"]:
            L += ["", "## Notes", ""] + ["- " + n for n in r["notes"]]
        return "\n".join(L) + "\n"

    def write(self):
        base = self.write_json("shards")
        with open(base + ".md", "w") as f:
            f.write(self.markdown())
        return base + ".md"

    def summary(self):
        L = ["", "idem-gateway on shards, clusters capped at %.2f CPU each, wrk -c%d × N, %g s "
             "per run, %d round(s):" % (self.cap, self.conns, self.seconds, self.rounds)]
        if self.r.get("no_cgroup"):
            return "\n".join(L + ["  not measured: no cgroup (%s)" % self.r["no_cgroup"]])
        for n, s in sorted(self.r["by_n"].items()):
            L.append("  N=%d  %7.0f keys/s  %s of N × rate(1)  PostgreSQL %.0f µs/key  app tier "
                     "%.0f%% of the machine" % (n, s["rps"], "%.2f" % s.get("scale", 1.0),
                                               s["pg_cpu_us_per_key"], s["app_share"] * 100))
        for t in self.r["targets"]:
            L.append("  %-9s %-60s %6s  %s" % ("MET" if t["met"] else "NOT MET", t["target"],
                                               t["value"], t["measured"]))
        for n in self.r["notes"]:
            L.append("  note: " + n)
        return "\n".join(L)

    def cleanup(self):
        try:
            for p in list(self.procs):  # the gateway first: its connections end
                self.stop(p)
            for c in self.clusters + ([self.directory] if self.directory else []):
                try:
                    c.stop()
                except Exception as e:  # noqa: BLE001 - clean-up goes on whatever failed
                    say("could not stop PostgreSQL %s: %s" % (c.name, e))
            if self.app:
                self.app.leave()
            for cap in self.caps + ([self.app] if self.app else []):
                cap.remove()
            self.caps, self.app = [], None
            if self.pg_base:
                if os.environ.get("BENCH_KEEP") == "1":
                    say("kept %s" % self.pg_base)
                else:
                    shutil.rmtree(self.pg_base, ignore_errors=True)
        finally:
            super().cleanup()

    def run(self):
        self.meta()
        kind, root = cgroup_probe()
        if kind is None:
            self.r["no_cgroup"] = root
            say("not measured: no cgroup (%s)" % root)
            path = self.write()
            print(self.summary(), flush=True)
            say("report: %s (and .json)" % path)
            return
        self.r["meta"]["cgroup"] = kind
        self.wait_idle()
        try:
            self.start_clusters(kind, root)
            self.scenarios()
            self.summarise()
        finally:
            if self.r["runs"]:
                if not self.r["by_n"]:
                    self.summarise()
                path = self.write()
                print(self.summary(), flush=True)
                say("report: %s (and .json)" % path)


def main():
    ap = B.arg_parser(__doc__, connections=64, wait_idle=10.0, profile=False)
    ap.add_argument("--cap", type=float, default=0.2, help="CPU cap of each cluster, in CPUs")
    ap.add_argument("--rounds", type=int, default=2,
                    help="runs of each N, the order reversed every other round")
    ap.set_defaults(seconds=8.0)
    args = B.parse_args(ap)
    if not 0.05 <= args.cap <= 1.0:
        ap.error("--cap must be 0.05..1")
    if not 1 <= args.rounds <= 5:
        ap.error("--rounds must be 1..5")
    for prog in ("idem-gateway", "static_http"):
        if not os.access(os.path.join(args.bin, prog), os.X_OK):
            ap.error("%s is not in %s (cmake --build build-bench --target idem-gateway "
                     "static_http)" % (prog, args.bin))
    B.raise_nofile(4096)
    return B.run_to_end(ShardsBench(args), DEADLINE_S)


if __name__ == "__main__":
    sys.exit(main())
