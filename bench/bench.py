#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
bench.py - the benchmark: how close orderd's fresh orders and replays come to the HTTP
layer's own ceiling, how that ceiling compares with nginx, what a same-key storm, 10,000
keep-alive connections and a slowloris cost, all against baselines taken in the same run, with a
profile of whatever keeps a target out of reach.

`make bench` runs it under tests/pg/with_pg.sh (so a throw-away PostgreSQL cluster is there and
always removed) after an optimised build into build-bench/.  Everything it starts listens on
127.0.0.1 (the slowloris attacker connects from 127.0.0.2..9), every load is bounded in time, and
every process it starts is stopped by its PID.  Python's standard library only; load comes from
wrk (bench/lua/*.lua), bench/storm.c and bench/slowloris.py.  docs/bench.md says what each
number means.

  python3 bench/bench.py --bin build-bench/bin [--out bench/results] [--seconds 5]
                         [--connections 16] [--no-profile]

Environment: IDEM_TEST_PG_URI / IDEM_TEST_PG_BIN (set by with_pg.sh): without them the
PostgreSQL columns say "not measured".  BENCH_KEEP=1 keeps the temp directory (logs, databases).
"""

import datetime
import http.client
import json
import os
import platform
import re
import resource
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid

# The parts the three benchmarks share (gateway_bench.py and peers_bench.py reach them as B.<name>
# too): processes, HTTP and /metrics, PostgreSQL, /proc, the numbers' print.
from bench_fmt import fmt_ms, fmt_rate, fmt_ratio  # noqa: F401
from bench_http import (created, http_call, metric, metrics, metrics_or_none,  # noqa: F401
                        order_headers, split_url, wrk_result)
from bench_pg import (PgRunStats, PgWaitSampler, SyncStandby,  # noqa: F401
                      cluster_cpu_seconds, pg_bin, pg_stats_markdown, pg_stats_summary,
                      pg_uri_with_db, pg_wal_stats, postmaster_pid, psql)
from bench_proc_stats import (MIB, TidWatcher, busy_share, child_pids, cpu_busy,  # noqa: F401
                              cpu_seconds, fd_count, machine_cpu, parse_trace_summary,
                              read_loadavg, read_status, smaps_breakdown, tree_cpu_seconds,
                              voluntary_switches)
from bench_procs import (LISTEN_RE, NGINX_WORKERS, BenchError, Proc, arg_parser,  # noqa: F401
                         free_port, parse_args, raise_nofile, run_to_end, say, stop_perf,
                         write_nginx_conf)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LUA_FRESH = os.path.join(HERE, "lua", "fresh.lua")
LUA_REPLAY = os.path.join(HERE, "lua", "replay.lua")
SLOWLORIS = os.path.join(HERE, "slowloris.py")
ORDER_BODY = '{"productId":"p-1024","quantity":1}'
STATIC_TOKEN = "idem_" + "0" * 64  # sent to the static servers, which ignore it

WRK_THREADS = 2
STORM_REQUESTS = 200
LONE_REQUESTS = 21
WARM_KEYS = 1000
RSS_CONNECTIONS = 10000
RSS_WARM_KEYS = 200
SLOW_ATTACKERS = 1000
SLOW_SOURCES = ["127.0.0.%d" % i for i in range(2, 10)]  # 125 each, under the cap of 256
SLOW_LEGIT_CONNECTIONS = 4
SLOW_TRICKLE_S = 1.0
NOFILE_WANT = 65536
DEADLINE_S = 1800  # a hard stop for the whole run, far above its expected ~6 minutes

# The targets of the HTTP layer and the record.
T_FRESH_SHARE = 0.30    # S1 on SQLite ÷ static ceiling
T_REPLAY_SHARE = 0.85   # S2 ÷ static ceiling, per store
T_NGINX_SHARE = 0.9     # static ceiling ÷ nginx
T_STORM_P99 = 3.0       # S3 p99 ÷ lone request
T_RSS_MIB = 64          # VmHWM with RSS_CONNECTIONS
T_SLOW_P99 = 5.0        # legitimate p99 with ÷ without the slowloris
T_CPU_US = 60           # orderd CPU per fresh order (an aim)
# The fresh-path targets for orderd (the gateway's are bench/gateway_bench.py's, the Node peers' peers_bench's).
T28_FRESH_SHARE = 0.20  # S1 on SQLite ÷ static ceiling
T28_CPU_US = 100        # orderd CPU per fresh order
T28_VCS = 1.0           # voluntary context switches of orderd's threads per fresh order
T28_WRITER_US = 50      # SQLite's writer held per fresh order
T28_PG_SPREAD_RPS = 3 * 1636  # S1 spread on PostgreSQL: 3× a transaction per order (docs/bench.md)
# Older targets, still reported as information.
I7_GROUP_COMMIT = 6.0
I7_ON_OFF_P50 = 1.10
# S1 p50 with the record ÷ without, orders spread over SPREAD_PRODUCTS products.
T_SPREAD_ON_OFF_P50 = 1.10
SPREAD_PRODUCTS = 1000


# ---- the run ----------------------------------------------------------------------------------


# What a scenario's row of the report says beside its rate, for each field the run measured.
SCENARIO_NOTES = (
    ("executed", lambda x: "executed by the server %d, answered within the run %d" % (
        x["executed"], x["requests"])),
    ("cpu_us_per_req", lambda x: "orderd CPU %.0f µs/request" % x["cpu_us_per_req"]),
    ("p50_runs_ms", lambda x: "the better of 2 runs (p50 %s ms), each on a fresh database" %
     " and ".join(fmt_ms(v) for v in x["p50_runs_ms"])),
    ("wrk_cpu_us_per_req", lambda x: "wrk CPU %.0f µs/request, machine %.0f%% busy" % (
        x["wrk_cpu_us_per_req"], x["machine_busy"] * 100)),
    ("replayed", lambda x: "replayed by the server %d, answered within the run %d" % (
        x["replayed"], x["requests"])),
    ("wal_syncs_per_req", lambda x: "WAL syncs/request %.2f" % x["wal_syncs_per_req"]),
    ("charges_ok", lambda x: "charges ok %d, ledger charges %s emails %s clean %s" % (
        x["charges_ok"], x.get("ledger_charges"), x.get("ledger_emails"), x.get("ledger_clean"))),
)


class Bench:
    def __init__(self, args):
        self.args = args
        self.bin = os.path.abspath(args.bin)
        self.orderd = os.path.join(self.bin, "orderd")
        self.psim = os.path.join(self.bin, "provider-sim")
        self.commit_rate = os.path.join(self.bin, "commit_rate")
        self.static_http = os.path.join(self.bin, "static_http")
        self.storm = os.path.join(self.bin, "storm")
        self.seconds = args.seconds
        self.conns = args.connections
        self.tmp = tempfile.mkdtemp(prefix="idem-bench.")
        self.procs = []
        self.pg_admin = os.environ.get("IDEM_TEST_PG_URI")
        self.pg_dbs = []
        self.r = {"stores": {}, "commit": {}, "notes": [], "profiles": {}}
        self.started = time.monotonic()
        self.ts = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")

    # -- helpers --

    def note(self, text):
        say("note: " + text)
        self.r["notes"].append(text)

    def start(self, name, cmd, env=None, port=None):
        """Starts a server; waits for its "listening on" line, or for `port` to accept."""
        p = Proc(name, cmd, os.path.join(self.tmp, name + ".log"), env=env)
        self.procs.append(p)
        try:
            if port is None:
                p.wait_listening()
            else:
                p.wait_port(port)
        except BenchError:
            self.procs.remove(p)
            raise
        return p

    def start_gateway_route(self, name, gateway_bin, upstream_url, store_uri, principal, path,
                            operation, extra="", upstream_extra=""):
        """
        idem-gateway (`gateway_bin`) with one route, POST `path` as `operation`, in front of
        `upstream_url`, its records in `store_uri`; `principal` is the one line of its principal
        block ("header: X-Consumer-Id"); `extra`, more top-level YAML (a `listen_tls` block);
        `upstream_extra`, more lines of the upstream block ("  keyed_connections: pooled\n").
        Its admin URL is p.admin.  gateway_bench.py and peers_bench.py start theirs so.
        """
        d = os.path.join(self.tmp, name)
        os.makedirs(d, exist_ok=True)
        admin_port = free_port()
        conf = os.path.join(d, "gateway.yaml")
        with open(conf, "w") as f:
            f.write("""# written by bench/bench.py
listen: 127.0.0.1:0
%(extra)sadmin_listen: 127.0.0.1:%(admin)d
store: %(store)s
upstream:
  url: %(up)s
%(upextra)sprincipal:
  %(principal)s
limits:
  max_connections_per_ip: -1
# The load is one principal starting thousands of keys a second, far past what the limits per
# caller let one caller do: they are off here (docs/gateway.md, "Limits per caller").
principal_limits: {keys_in_flight: 0, new_keys_per_second: 0, stored_bytes: 0}
max_stored_bytes: 0
routes:
  - match: POST %(path)s
    operation: %(op)s
""" % {"admin": admin_port, "store": json.dumps(store_uri), "up": upstream_url,
                "principal": principal, "path": path, "op": operation, "extra": extra,
                "upextra": upstream_extra})
        p = self.start(name, [gateway_bin, "serve", "--config", conf])
        p.admin = "http://127.0.0.1:%d" % admin_port
        return p

    def stop(self, p):
        if p is not None:
            p.stop()
            if p in self.procs:
                self.procs.remove(p)

    def cleanup(self):
        for p in list(self.procs):
            try:
                p.stop()
            except Exception as e:  # noqa: BLE001 - clean-up goes on whatever failed
                say("could not stop %s (pid %d): %s" % (p.name, p.pid, e))
        self.procs = []
        for name in self.pg_dbs:
            try:
                psql(self.pg_admin, 'DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % name)
            except Exception:  # noqa: BLE001
                pass
        self.pg_dbs = []
        if os.environ.get("BENCH_KEEP") == "1":
            say("kept %s" % self.tmp)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def db_uri(self, store, name):
        if store == "sqlite":
            return "sqlite:" + os.path.join(self.tmp, name + ".db")
        dbname = "bench_%s_%s" % (name.replace("-", "_"), uuid.uuid4().hex[:8])
        psql(self.pg_admin, 'CREATE DATABASE "%s"' % dbname)
        self.pg_dbs.append(dbname)
        return pg_uri_with_db(self.pg_admin, dbname)

    def token(self, db, user):
        p = subprocess.run([self.orderd, "token", "create", "--db", db, "--user", user],
                           capture_output=True, timeout=60)
        if p.returncode != 0:
            raise BenchError("token create: %s" % p.stderr.decode("utf-8", "replace"))
        return p.stdout.decode().strip()

    def orderd_supports(self, flag):
        p = subprocess.run([self.orderd, "serve", "--help"], capture_output=True, timeout=10)
        return flag in p.stdout.decode("utf-8", "replace")

    def start_orderd(self, name, db, extra=None, per_ip_cap=False):
        # Every load generator here connects from 127.0.0.1: lift the per-address cap, except
        # for the slowloris scenario, which is about the defaults.
        cmd = [self.orderd, "serve", "--listen", "127.0.0.1:0", "--db", db]
        if not per_ip_cap:
            cmd += ["--max-connections-per-ip", "-1"]
        return self.start(name, cmd + (extra or []))

    def wrk(self, url, script, wrk_args, conns=None, seconds=None):
        """
        One wrk run.  Besides wrk's own numbers: the CPU wrk used (it shares the cores with the
        server) and how busy the whole machine was meanwhile.
        """
        conns = conns or self.conns
        seconds = seconds or self.seconds
        cmd = ["wrk", "-t", str(min(WRK_THREADS, conns)), "-c", str(conns), "-d",
               "%gs" % seconds, "--timeout", "10s", "-s", script, url, "--"] + wrk_args
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        m0 = machine_cpu()
        p = subprocess.run(cmd, capture_output=True, timeout=seconds + 90)
        m1 = machine_cpu()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = p.stdout.decode("utf-8", "replace")
        m = re.search(r"^BENCH_JSON (\{.*\})$", out, re.M)
        if p.returncode != 0 or not m:
            raise BenchError("wrk failed (%d): %s %s" % (p.returncode, out[-400:],
                                                         p.stderr.decode()[-400:]))
        res = wrk_result(json.loads(m.group(1)), conns, seconds)
        res["wrk_cpu_us_per_req"] = ((ru1.ru_utime + ru1.ru_stime - ru0.ru_utime -
                                      ru0.ru_stime) * 1e6 / max(res["requests"], 1))
        res["machine_busy"] = busy_share(m0, m1)
        return res

    def run_commit_rate(self, uri, threads, seconds):
        p = subprocess.run([self.commit_rate, uri, "--threads", str(threads), "--seconds",
                            str(seconds)], capture_output=True, timeout=seconds + 60)
        if p.returncode != 0:
            raise BenchError("commit_rate %s: %s" % (uri.split(":")[0],
                                                     p.stderr.decode("utf-8", "replace")))
        return json.loads(p.stdout.decode())

    def warm(self, url, token, tag, n, threads=4):
        """Creates keys TAG-0 .. TAG-(n-1) with the order body, each completed once."""
        failures = []

        def worker(start):
            host, port = split_url(url)
            conn = http.client.HTTPConnection(host, port, timeout=30)
            try:
                for i in range(start, n, threads):
                    st, _, body = http_call(url, "POST", "/api/orders", ORDER_BODY,
                                            order_headers(token, "%s-%d" % (tag, i)), conn=conn)
                    if st != 201:
                        failures.append((i, st, body[:200]))
            finally:
                conn.close()

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(300)
        if failures:
            raise BenchError("warming %s: %d failed, first %r" % (tag, len(failures), failures[0]))

    # -- baselines --

    def baseline_commit(self):
        out = self.r["commit"]
        uri = "sqlite:" + os.path.join(self.tmp, "commit-rate.db")
        # One second first, discarded: a WAL that is still growing commits slower than one that
        # is being recycled, and orderd's run reaches that steady state too.
        self.run_commit_rate(uri, 1, 1)
        for threads in (1, 2, 8):
            out["sqlite-%d" % threads] = self.run_commit_rate(uri, threads, 2)
            say("commit rate sqlite %d thread(s): %.0f/s" % (threads,
                                                             out["sqlite-%d" % threads]["rate"]))
        if self.pg_admin:
            pg = self.db_uri("postgresql", "commit")
            self.run_commit_rate(pg, 1, 1)
            for threads in (1, 2, 8):
                out["postgresql-%d" % threads] = self.run_commit_rate(pg, threads, 2)
                say("commit rate postgresql %d thread(s): %.0f/s" % (
                    threads, out["postgresql-%d" % threads]["rate"]))

    def baseline_static(self, storm=True):
        """
        The static HTTP ceiling: bench/static_http.c (orderd's HTTP layer answering on the loop
        with nothing behind it) under S2's very request bytes, with the CPU it used per request;
        then S3's storm against it (the floor the HTTP layer alone sets for S3).
        """
        p = self.start("static_http", [self.static_http, "--listen", "127.0.0.1:0",
                                       "--max-connections-per-ip", "-1"])
        try:
            st, hdrs, body = http_call(p.url, "POST", "/api/orders", ORDER_BODY,
                                       order_headers(STATIC_TOKEN, "probe"))
            if st != 201:
                raise BenchError("static_http answered %d" % st)
            # nginx is given these very bytes to send.
            self.fixed = {"body": body, "content_type": hdrs.get("content-type", "")}
            t0 = cpu_seconds(p.pid)
            res = self.wrk(p.url, LUA_REPLAY, [STATIC_TOKEN, "static", str(WARM_KEYS)])
            res["cpu_us_per_req"] = (cpu_seconds(p.pid) - t0) * 1e6 / max(res["requests"], 1)
            if storm:
                j = self.run_storm(p.url, "static")
                res["storm"] = {k: j[k] for k in ("p50_ms", "p99_ms", "lone_p50_ms", "failed")}
        finally:
            self.stop(p)
        say("static ceiling: %.0f req/s, p50 %.2f ms%s" % (
            res["rps"], res["p50_ms"], "; storm p99 %.1f ms, lone %.2f ms" % (
                res["storm"]["p99_ms"], res["storm"]["lone_p50_ms"]) if storm else ""))
        return res

    def ceiling_and_nginx(self):
        """
        static, nginx, static again (A-B-A): other work on the machine drifts from one minute
        to the next, and the two static runs around nginx cancel a steady drift.  The ceiling is
        the mean of the two static runs (each kept in "runs"); the storm floor is the first's.
        """
        a = self.baseline_static()
        ng = self.baseline_nginx()
        b = self.baseline_static(storm=False)
        res = dict(a)
        for k in ("rps", "p50_ms", "p90_ms", "p99_ms", "cpu_us_per_req", "wrk_cpu_us_per_req",
                  "machine_busy"):
            res[k] = (a[k] + b[k]) / 2
        res["requests"] = a["requests"] + b["requests"]
        res["non2xx"] = a["non2xx"] + b["non2xx"]
        res["socket_errors"] = a["socket_errors"] + b["socket_errors"]
        res["runs"] = [{k: v for k, v in x.items() if k != "storm"} for x in (a, b)]
        return res, ng

    def nginx_conf(self, port):
        """An nginx config in the temp dir answering every request with static_http's response."""
        body = self.fixed["body"].decode("utf-8")
        if "$" in body:
            raise BenchError("the static body has a '$', which nginx's return would expand")
        quoted = "'" + body.replace("\\", "\\\\").replace("'", "\\'") + "'"
        ctype = self.fixed["content_type"] or "application/json"
        return write_nginx_conf(os.path.join(self.tmp, "nginx"),
                                "bench/bench.py: the static ceiling's response, served by nginx",
                                """    types { }
    default_type %(ctype)s;
    server {
        listen 127.0.0.1:%(port)d;
        location / {
            return 201 %(body)s;
        }
    }
""" % {"port": port, "ctype": ctype, "body": quoted})

    def baseline_nginx(self):
        """
        nginx (Debian's, 2 workers) answering S2's request bytes with the very response of the
        static server, right after it: what an established event-driven server does here.
        """
        nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx")
                                          else None)
        if nginx is None:
            return {"skipped": "nginx is not installed (scripts/deps.sh bench installs "
                               "nginx-light)"}
        if not getattr(self, "fixed", None):
            return {"skipped": "the static server's response is not known"}
        port = free_port()
        conf, d = self.nginx_conf(port)
        p = self.start("nginx", [nginx, "-c", conf, "-p", d + "/", "-g", "daemon off;"],
                       port=port)
        try:
            st, hdrs, body = http_call(p.url, "POST", "/api/orders", ORDER_BODY,
                                       order_headers(STATIC_TOKEN, "probe"))
            same = (st == 201 and body == self.fixed["body"] and
                    hdrs.get("content-type", "") == self.fixed["content_type"])
            if not same:
                self.note("nginx's answer differs from the static server's: %d %r %r" % (
                    st, hdrs.get("content-type"), body[:80]))
            t0 = tree_cpu_seconds(p.pid)
            res = self.wrk(p.url, LUA_REPLAY, [STATIC_TOKEN, "nginx", str(WARM_KEYS)])
            res["cpu_us_per_req"] = (tree_cpu_seconds(p.pid) - t0) * 1e6 / max(
                res["requests"], 1)
            res["workers"] = len(child_pids(p.pid))
            res["same_response"] = same
        finally:
            self.stop(p)
        say("nginx: %.0f req/s, p50 %.2f ms (%d workers)" % (res["rps"], res["p50_ms"],
                                                             res["workers"]))
        return res

    # -- scenarios --

    def s1(self, url, pid, token, tag, products=0):
        before = metrics(url)
        t0 = cpu_seconds(pid)
        v0 = voluntary_switches(pid)
        res = self.wrk(url, LUA_FRESH, [token, tag] + ([str(products)] if products else []))
        cpu = cpu_seconds(pid) - t0
        vcs = voluntary_switches(pid) - v0
        after = metrics(url)
        res["executed"] = int(sum(created(after, o) - created(before, o)
                                  for o in ("executed", "none")))
        # CPU time of the orderd process (all its threads) during the run, per order it made.
        res["cpu_us_per_req"] = cpu * 1e6 / max(res["executed"], 1)
        # How often its threads slept (a wait for another thread, a lock, the disk), per order.
        res["vcs_per_req"] = vcs / max(res["executed"], 1)
        # SQLite: how long the store's one writer was held, per order (the serial part).
        busy = (metric(after, "orderd_store_writer_busy_seconds_total") -
                metric(before, "orderd_store_writer_busy_seconds_total"))
        if busy > 0:
            res["writer_busy_us_per_req"] = busy * 1e6 / max(res["executed"], 1)
        return res

    def run_storm(self, url, token):
        """bench/storm.c against `url`: its JSON (latencies of the storm and of the lone requests)."""
        host, port = split_url(url)
        key = "storm-" + uuid.uuid4().hex[:12]
        p = subprocess.run([self.storm, host, str(port), token, key, "--requests",
                            str(STORM_REQUESTS), "--lone", str(LONE_REQUESTS), "--lone-prefix",
                            "lone-" + uuid.uuid4().hex[:8]],
                           capture_output=True, timeout=180)
        try:
            return json.loads(p.stdout.decode())
        except ValueError:
            raise BenchError("storm failed (%d): %s" % (p.returncode, p.stderr.decode()[-300:]))

    def s3(self, url, storm_token):
        """
        STORM_REQUESTS same-key requests released together, and LONE_REQUESTS lone ones before
        them, all sent by bench/storm.c (one epoll thread, so the client never queues).
        """
        before = metrics(url)
        j = self.run_storm(url, storm_token)
        after = metrics(url)
        st, _, body = http_call(url, "GET", "/api/orders?limit=100", None,
                                {"Authorization": "Bearer " + storm_token})
        # The lone requests are the storm user's too: its orders are the lone ones plus the storm's.
        orders = len(json.loads(body).get("orders", [])) - j["lone"] if st == 200 else None
        lone_exec = j["lone"]
        return {"lone_p50_ms": j["lone_p50_ms"], "lone_max_ms": j["lone_max_ms"],
                "p50_ms": j["p50_ms"], "p99_ms": j["p99_ms"], "max_ms": j["max_ms"],
                "requests": j["requests"], "failed": j["failed"],
                "statuses": {int(k): v for k, v in j["statuses"].items()},
                "replayed_header": j["replayed_header"], "orders": orders,
                "executed": int(created(after, "executed") - created(before, "executed")) -
                lone_exec,
                "waited": int(created(after, "waited") - created(before, "waited")),
                "replayed": int(created(after, "replayed") - created(before, "replayed")),
                "in_progress": int(created(after, "in_progress") - created(before, "in_progress"))}

    def add_products(self, db, n):
        """Products p-bench-0 .. p-bench-(n-1), stock 10^9 each, in orderd's (migrated) store."""
        rows = ", ".join("('p-bench-%d', 'Bench %d', 100, 'EUR', 1000000000)" % (i, i)
                         for i in range(n))
        sql = ("INSERT INTO products (id, name, unit_price, currency, stock) VALUES " + rows +
               " ON CONFLICT DO NOTHING")
        if db.startswith("sqlite:"):
            con = sqlite3.connect(db[len("sqlite:"):], timeout=30)
            with con:
                con.execute(sql)
            con.close()
        else:
            psql(db, sql)

    def s1_spread(self, store, res):
        """
        S1 with and without the record, the orders spread over SPREAD_PRODUCTS products, so that no
        one hot stock row (p-1024's, which every S1 order updates) serialises them and hides what
        the record costs.  Each on a fresh database; on, then off, then on and off again, and the
        better p50 of each kept: the machine's noise moves a single pair more than the gap.
        """
        runs = {"S1s": [], "S1soff": []}
        for rnd in range(2):
            for sc, extra in (("S1s", []), ("S1soff", ["--idempotency", "off"])):
                db = self.db_uri(store, "spread-%s-%d" % ("on" if not extra else "off", rnd))
                tok = self.token(db, "bench")  # migrates the store first
                self.add_products(db, SPREAD_PRODUCTS)
                srv = self.start_orderd("orderd-%s-%s-%d" % (sc, store, rnd), db, extra)
                try:
                    runs[sc].append(self.s1(srv.url, srv.pid, tok, "%s%d" % (sc.lower(), rnd),
                                            SPREAD_PRODUCTS))
                finally:
                    self.stop(srv)
        for sc, rs in runs.items():
            best = min(rs, key=lambda x: x["p50_ms"])
            best["p50_runs_ms"] = [x["p50_ms"] for x in rs]
            res[sc] = best
        say("S1 spread %s: on p50 %.2f ms (%.0f req/s), off p50 %.2f ms (%.0f req/s)" % (
            store, res["S1s"]["p50_ms"], res["S1s"]["rps"], res["S1soff"]["p50_ms"],
            res["S1soff"]["rps"]))

    def s4(self, store):
        if not os.path.exists(self.psim) or not self.orderd_supports("--provider"):
            return {"skipped": "provider-sim or orderd --provider is not in this tree yet"}
        psim = self.start("provider-sim-" + store, [
            self.psim, "--listen", "127.0.0.1:0", "--db",
            "sqlite:" + os.path.join(self.tmp, "provider-sim-%s.db" % store)])
        srv = None
        try:
            db = self.db_uri(store, "s4")
            tok = self.token(db, "pay")
            srv = self.start_orderd("orderd-s4-" + store, db, ["--provider", psim.url])
            before = metrics(srv.url)
            res = self.wrk(srv.url, LUA_FRESH, [tok, "s4"])
            after = metrics(srv.url)
            res["executed"] = int(created(after, "executed") - created(before, "executed"))
            res["charges_ok"] = int(
                metric(after, "orderd_provider_calls_total", call="charge", outcome="ok") -
                metric(before, "orderd_provider_calls_total", call="charge", outcome="ok"))
            st, _, body = http_call(psim.url, "GET", "/v1/ledger?keys=0")
            if st == 200:
                led = json.loads(body)
                res["ledger_charges"] = led.get("charges", {}).get("total")
                res["ledger_emails"] = led.get("emails", {}).get("total")
                res["ledger_clean"] = led.get("clean")
        finally:
            self.stop(srv)
            self.stop(psim)
        return res

    def rss(self, store):
        """
        Peak RSS of a fresh orderd with RSS_CONNECTIONS keep-alive connections replaying
        RSS_WARM_KEYS warmed keys (wrk, 2 threads): VmHWM, with where the memory is at the
        highest sample (/proc/PID/smaps) and how many descriptors orderd held at most.
        """
        db = self.db_uri(store, "rss")
        tok = self.token(db, "rss")
        srv = self.start_orderd("orderd-rss-" + store, db)
        try:
            self.warm(srv.url, tok, "rss", RSS_WARM_KEYS)
            base = read_status(srv.pid)
            cmd = ["wrk", "-t", str(WRK_THREADS), "-c", str(RSS_CONNECTIONS), "-d",
                   "%gs" % self.seconds, "--timeout", "10s", "-s", LUA_REPLAY, srv.url, "--",
                   tok, "rss", str(RSS_WARM_KEYS)]
            w = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            threads_max, fds_max = 0, 0
            peak, breakdown = 0, {}
            deadline = time.monotonic() + self.seconds + 60
            while w.poll() is None and time.monotonic() < deadline:
                st = read_status(srv.pid)
                threads_max = max(threads_max, st.get("Threads", 0))
                fds_max = max(fds_max, fd_count(srv.pid))
                if st.get("VmRSS", 0) > peak:
                    # Where the memory is at the highest point seen: heap, arenas, stacks, code.
                    peak = st["VmRSS"]
                    breakdown = smaps_breakdown(srv.pid)
                time.sleep(0.25)
            if w.poll() is None:
                w.kill()
            out, err = w.communicate(timeout=30)
            st = read_status(srv.pid)
            m = re.search(r"^BENCH_JSON (\{.*\})$", out.decode("utf-8", "replace"), re.M)
            if not m:
                raise BenchError("wrk -c%d failed: %s" % (RSS_CONNECTIONS,
                                                          err.decode("utf-8", "replace")[-300:]))
            res = wrk_result(json.loads(m.group(1)), RSS_CONNECTIONS, self.seconds)
            hwm = st.get("VmHWM", 0) / 1024
            res.update({"hwm_mib": hwm, "rss_mib": st.get("VmRSS", 0) / 1024,
                        "base_mib": base.get("VmRSS", 0) / 1024,
                        "kib_per_conn": (hwm - base.get("VmRSS", 0) / 1024) * 1024 /
                        RSS_CONNECTIONS,
                        "threads_max": threads_max, "fds_max": fds_max,
                        "breakdown_at_mib": peak / 1024, "breakdown": breakdown})
            return res
        finally:
            self.stop(srv)

    def legit(self, host, port, token, tag):
        """
        The slowloris scenario's legitimate client (bench/slowloris.py legit): fresh orders on
        SLOW_LEGIT_CONNECTIONS connections from 127.0.0.1 for the scenario's length, with the
        latency of every request as it was, the CPU it used and how busy the machine was.
        """
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        m0 = machine_cpu()
        p = subprocess.run([sys.executable, SLOWLORIS, "legit", host, str(port), "--token", token,
                            "--connections", str(SLOW_LEGIT_CONNECTIONS), "--seconds",
                            str(self.seconds), "--tag", tag + "-" + uuid.uuid4().hex[:6]],
                           capture_output=True, timeout=self.seconds + 60)
        m1 = machine_cpu()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        m = re.search(rb"^(\{.*\})$", p.stdout, re.M)
        if p.returncode != 0 or not m:
            raise BenchError("the legitimate client failed (%d): %s" % (
                p.returncode, p.stderr.decode("utf-8", "replace")[-400:]))
        res = json.loads(m.group(1))
        res["client_cpu_us_per_req"] = ((ru1.ru_utime + ru1.ru_stime - ru0.ru_utime -
                                         ru0.ru_stime) * 1e6 / max(res["requests"], 1))
        res["machine_busy"] = busy_share(m0, m1)
        return res

    def slowloris(self, store="sqlite", profile=False):
        """
        SLOW_ATTACKERS connections from 127.0.0.2..9 trickling heads and bodies
        (bench/slowloris.py attack) against an orderd with its default limits (per-address cap
        256, head and body deadlines), while a legitimate client from 127.0.0.1 places fresh
        orders (bench/slowloris.py legit, SLOW_LEGIT_CONNECTIONS connections): its latency and
        errors without and with the attack, on the same server.
        """
        db = self.db_uri(store, "slow")
        tok = self.token(db, "legit")
        atok = self.token(db, "slowloris")
        srv = self.start_orderd("orderd-slowloris-" + store, db, per_ip_cap=True)
        att = None
        log = open(os.path.join(self.tmp, "slowloris.log"), "wb")
        try:
            host, port = split_url(srv.url)
            res = {"connections": SLOW_LEGIT_CONNECTIONS, "attackers": SLOW_ATTACKERS,
                   "sources": "%s..%s" % (SLOW_SOURCES[0], SLOW_SOURCES[-1].rsplit(".", 1)[1])}
            res["fds_before"] = fd_count(srv.pid)
            m_before = metrics_or_none(srv.url)
            t0 = cpu_seconds(srv.pid)
            res["alone"] = self.legit(host, port, tok, "legit-alone")
            res["alone"]["orderd_cpu_us_per_req"] = (cpu_seconds(srv.pid) - t0) * 1e6 / max(
                res["alone"]["requests"], 1)
            att = subprocess.Popen([sys.executable, SLOWLORIS, "attack", host, str(port),
                                    "--token", atok,
                                    "--connections", str(SLOW_ATTACKERS), "--sources",
                                    ",".join(SLOW_SOURCES), "--trickle-s", str(SLOW_TRICKLE_S),
                                    "--max-seconds", str(self.seconds + 120)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
            line = b""
            deadline = time.monotonic() + 60
            while not line.endswith(b"\n") and time.monotonic() < deadline:
                r, _, _ = select.select([att.stdout], [], [], 0.5)
                if r:
                    ch = os.read(att.stdout.fileno(), 1)
                    if not ch:
                        break
                    line += ch
                elif att.poll() is not None:
                    break
            parts = line.decode().split()
            if len(parts) != 3 or parts[0] != "ready":
                raise BenchError("the slowloris attacker did not start: %r" % line)
            res["attack_open"], res["attack_connect_errors"] = int(parts[1]), int(parts[2])
            time.sleep(SLOW_TRICKLE_S)  # every attacker has trickled at least once
            res["fds_attacked"] = fd_count(srv.pid)
            m_attacked = metrics_or_none(srv.url)
            t0 = cpu_seconds(srv.pid)
            box = {}

            def attacked():
                box["r"] = self.legit(host, port, tok, "legit-attacked")
                return box["r"]
            if profile:  # the attacked run under perf record (machine-wide, as the others)
                res["cpu"] = self.perf_during("cpu", "slowloris-" + store, srv.pid, attacked)
            else:
                attacked()
            res["attacked"] = box["r"]
            res["attacked"]["orderd_cpu_us_per_req"] = (cpu_seconds(srv.pid) - t0) * 1e6 / max(
                res["attacked"]["requests"], 1)
            res["fds_end"] = fd_count(srv.pid)
            m_end = metrics_or_none(srv.url)
            if m_before and m_attacked and m_end:
                # The HTTP layer's own counters (orderd /metrics): connections open under
                # attack, and what it refused or timed out meanwhile.
                res["http"] = {"connections_attacked": metric(m_attacked,
                                                              "orderd_http_connections")}
                for name in ("connections_refused_total", "timeouts_total",
                             "refused_heads_total", "queue_full_total"):
                    res["http"][name] = (metric(m_end, "orderd_http_" + name) -
                                         metric(m_before, "orderd_http_" + name))
            att.send_signal(signal.SIGTERM)
            out, _ = att.communicate(timeout=60)
            m = re.search(rb"^(\{.*\})$", out, re.M)
            res["attack"] = json.loads(m.group(1)) if m else {}
            att = None
        finally:
            if att is not None and att.poll() is None:
                att.kill()
                att.wait(10)
            log.close()
            self.stop(srv)
        a, b = res["alone"], res["attacked"]
        say("slowloris: legitimate p99 %.2f ms alone, %.2f ms with %d attackers (%d open); "
            "errors %d" % (a["p99_ms"], b["p99_ms"], SLOW_ATTACKERS, res["attack_open"],
                           b["non2xx"] + b["socket_errors"]))
        return res

    def store_run(self, store):
        say("== %s ==" % store)
        res = self.r["stores"].setdefault(store, {})
        db = self.db_uri(store, "on")
        tok = self.token(db, "bench")
        storm_tok = self.token(db, "storm")
        srv = self.start_orderd("orderd-" + store, db)
        try:
            wal0 = pg_wal_stats(self.pg_admin) if store == "postgresql" else None
            if store == "sqlite":
                res["commit_before"] = self.run_commit_rate(
                    "sqlite:" + os.path.join(self.tmp, "commit-rate.db"), 1, 2)
            # PostgreSQL's own account of S1 (bench_pg.PgRunStats): statements, HOT, WAL, CPU.
            pgs = PgRunStats(self.pg_admin, db) if store == "postgresql" else None
            if pgs:
                pgs.start()
            res["S1"] = self.s1(srv.url, srv.pid, tok, "s1")
            if pgs:
                res["S1"]["pg"] = pgs.stop(res["S1"]["executed"])
                say("S1 postgresql, PostgreSQL's account: %s" % pg_stats_summary(res["S1"]["pg"]))
            if store == "sqlite":
                res["commit_after"] = self.run_commit_rate(
                    "sqlite:" + os.path.join(self.tmp, "commit-rate.db"), 1, 2)
            if wal0:
                time.sleep(1.2)  # backends report their statistics at most once a second
                wal1 = pg_wal_stats(self.pg_admin)
                res["S1"]["wal_syncs_per_req"] = (wal1[0] - wal0[0]) / max(res["S1"]["requests"], 1)
            say("S1 %s: %.0f req/s, p50 %.2f ms, p99 %.1f ms" % (
                store, res["S1"]["rps"], res["S1"]["p50_ms"], res["S1"]["p99_ms"]))

            self.warm(srv.url, tok, "s2", WARM_KEYS)
            # The ceiling right before the replays, so that both see the same machine, and nginx
            # right after it, with the same response and the same request bytes.
            res["static"], res["nginx"] = self.ceiling_and_nginx()
            before = metrics(srv.url)
            t0 = cpu_seconds(srv.pid)
            res["S2"] = self.wrk(srv.url, LUA_REPLAY, [tok, "s2", str(WARM_KEYS)])
            cpu = cpu_seconds(srv.pid) - t0
            after = metrics(srv.url)
            res["S2"]["replayed"] = int(created(after, "replayed") - created(before, "replayed"))
            res["S2"]["cpu_us_per_req"] = cpu * 1e6 / max(res["S2"]["replayed"], 1)
            say("S2 %s: %.0f req/s, p50 %.2f ms" % (store, res["S2"]["rps"], res["S2"]["p50_ms"]))

            res["S3"] = self.s3(srv.url, storm_tok)
            say("S3 %s: executions %d, p99 %.1f ms, lone %.2f ms" % (
                store, res["S3"]["executed"], res["S3"]["p99_ms"] or -1,
                res["S3"]["lone_p50_ms"]))
        finally:
            self.stop(srv)

        if self.orderd_supports("--idempotency"):
            db_off = self.db_uri(store, "off")
            tok_off = self.token(db_off, "bench")
            off = self.start_orderd("orderd-off-" + store, db_off, ["--idempotency", "off"])
            try:
                wal0 = pg_wal_stats(self.pg_admin) if store == "postgresql" else None
                res["S1off"] = self.s1(off.url, off.pid, tok_off, "s1off")
                if wal0:
                    time.sleep(1.2)
                    wal1 = pg_wal_stats(self.pg_admin)
                    res["S1off"]["wal_syncs_per_req"] = (wal1[0] - wal0[0]) / max(
                        res["S1off"]["requests"], 1)
            finally:
                self.stop(off)
            say("S1 off %s: %.0f req/s, p50 %.2f ms" % (store, res["S1off"]["rps"],
                                                        res["S1off"]["p50_ms"]))
        else:
            res["S1off"] = {"skipped": "orderd has no --idempotency flag in this tree"}
        if self.orderd_supports("--idempotency"):
            self.s1_spread(store, res)


        res["S4"] = self.s4(store)
        if "rps" in res["S4"]:
            say("S4 %s: %.0f req/s, p50 %.2f ms" % (store, res["S4"]["rps"], res["S4"]["p50_ms"]))
        res["RSS"] = self.rss(store)
        say("RSS %s: peak %.1f MiB with %d connections (%d descriptors at most, %d threads), "
            "socket errors %d" % (store, res["RSS"]["hwm_mib"], RSS_CONNECTIONS,
                                  res["RSS"]["fds_max"], res["RSS"]["threads_max"],
                                  res["RSS"]["socket_errors"]))

    # -- targets --

    def targets(self):
        """The targets (met / not met), and the group-commit readings as information."""
        t, info = [], []
        st = self.r["stores"]
        sq = st.get("sqlite", {})
        if "S1" in sq and "static" in sq:
            ratio = sq["S1"]["rps"] / sq["static"]["rps"]
            t.append({"id": "fresh", "store": "sqlite",
                      "target": "S1 fresh durable orders ≥ %.2f× the static HTTP ceiling" %
                      T_FRESH_SHARE,
                      "measured": "%.0f ÷ %.0f req/s" % (sq["S1"]["rps"], sq["static"]["rps"]),
                      "ratio": ratio, "met": ratio >= T_FRESH_SHARE})
        for store, res in st.items():
            if "cpu_us_per_req" in res.get("S1", {}):
                cpu = res["S1"]["cpu_us_per_req"]
                t.append({"id": "cpu", "store": store,
                          "target": "orderd CPU per fresh order ≤ %d µs (aim)" % T_CPU_US,
                          "measured": "%.0f µs (%.2f s of CPU ÷ %d orders)" % (
                              cpu, cpu * res["S1"]["executed"] / 1e6, res["S1"]["executed"]),
                          "ratio": cpu / T_CPU_US, "met": cpu <= T_CPU_US})
        for store, res in st.items():
            if "S2" in res and "static" in res:
                ratio = res["S2"]["rps"] / res["static"]["rps"]
                t.append({"id": "replay", "store": store,
                          "target": "S2 replays ≥ %.2f× the static HTTP ceiling" % T_REPLAY_SHARE,
                          "measured": "%.0f ÷ %.0f req/s" % (res["S2"]["rps"],
                                                             res["static"]["rps"]),
                          "ratio": ratio, "met": ratio >= T_REPLAY_SHARE})
        for store, res in st.items():
            if "static" not in res or "nginx" not in res:
                continue
            ng = res["nginx"]
            row = {"id": "nginx", "store": store,
                   "target": "static HTTP ceiling ≥ %.1f× nginx, same response" % T_NGINX_SHARE}
            if "rps" in ng:
                ratio = res["static"]["rps"] / ng["rps"]
                row.update({"measured": "%.0f ÷ %.0f req/s (static before and after nginx, "
                                        "ahead of S2 on %s)" % (
                    res["static"]["rps"], ng["rps"], store), "ratio": ratio,
                    "met": ratio >= T_NGINX_SHARE})
            else:
                row.update({"measured": "not measured: " + ng.get("skipped", "?"),
                            "ratio": None, "met": None})
            t.append(row)
        for store, res in st.items():
            if "S3" in res and res["S3"]["p99_ms"] is not None:
                s3 = res["S3"]
                ratio = s3["p99_ms"] / s3["lone_p50_ms"]
                once = s3["executed"] == 1 and s3["orders"] == 1
                t.append({"id": "storm", "store": store,
                          "target": "S3 storm p99 ≤ %g× a lone request, exactly 1 execution" %
                          T_STORM_P99,
                          "measured": "%s ÷ %s ms; executions %d, orders %s" % (
                              fmt_ms(s3["p99_ms"]), fmt_ms(s3["lone_p50_ms"]), s3["executed"],
                              s3["orders"]),
                          "ratio": ratio, "met": ratio <= T_STORM_P99 and once})
        for store, res in st.items():
            if "RSS" in res:
                rss = res["RSS"]
                hwm = rss["hwm_mib"]
                held = rss["fds_max"] >= RSS_CONNECTIONS
                t.append({"id": "rss", "store": store,
                          "target": "peak RSS ≤ %d MiB with %s keep-alive connections" % (
                              T_RSS_MIB, "{:,}".format(RSS_CONNECTIONS)),
                          "measured": "VmHWM %.1f MiB; %s descriptors at most, socket errors %d"
                          % (hwm, "{:,}".format(rss["fds_max"]), rss["socket_errors"]),
                          "ratio": hwm / T_RSS_MIB,
                          # Not met either when the connections were not all there.
                          "met": hwm <= T_RSS_MIB and held})
        sl = self.r.get("slowloris")
        if sl:
            a, b = sl["alone"], sl["attacked"]
            errors = b["non2xx"] + b["socket_errors"]
            ratio = b["p99_ms"] / max(a["p99_ms"], 1e-6)
            t.append({"id": "slowloris", "store": "sqlite",
                      "target": "slowloris: legitimate p99 with ÷ without %s attackers ≤ %g×, "
                      "no error" % ("{:,}".format(SLOW_ATTACKERS), T_SLOW_P99),
                      "measured": "p99 %s ÷ %s ms; legitimate errors %d (non-2xx %d, socket "
                      "%d); %d attackers open" % (
                          fmt_ms(b["p99_ms"]), fmt_ms(a["p99_ms"]), errors, b["non2xx"],
                          b["socket_errors"], sl["attack_open"]),
                      "ratio": ratio, "met": ratio <= T_SLOW_P99 and errors == 0})
        # The older targets, as information: the same data, no verdict.
        if "S1" in sq and "commit_before" in sq:
            ref = (sq["commit_before"]["rate"] + sq["commit_after"]["rate"]) / 2
            info.append({"what": "S1 ÷ the 1-thread durable commit rate (the group-commit aim: ≥ %g×)" %
                         I7_GROUP_COMMIT, "store": "sqlite",
                         "measured": "%.0f req/s ÷ %.0f commits/s" % (sq["S1"]["rps"], ref),
                         "ratio": sq["S1"]["rps"] / ref})
        for store, res in st.items():
            if "S1" in res and "rps" in res.get("S1off", {}):
                info.append({"what": "S1 p50 idempotency on ÷ off (the old aim: ≤ %.2f×)" %
                             I7_ON_OFF_P50, "store": store,
                             "measured": "%s ÷ %s ms" % (fmt_ms(res["S1"]["p50_ms"]),
                                                         fmt_ms(res["S1off"]["p50_ms"])),
                             "ratio": res["S1"]["p50_ms"] / res["S1off"]["p50_ms"]})
        for store, res in st.items():
            if "S1s" in res and "S1soff" in res:
                on, off = res["S1s"], res["S1soff"]
                ratio = on["p50_ms"] / off["p50_ms"]
                row = {"what": "S1 p50 idempotency on ÷ off, orders over %s products" %
                       "{:,}".format(SPREAD_PRODUCTS), "store": store,
                       "measured": "%s ÷ %s ms (%.0f ÷ %.0f req/s)" % (
                           fmt_ms(on["p50_ms"]), fmt_ms(off["p50_ms"]), on["rps"], off["rps"]),
                       "ratio": ratio}
                if store == "postgresql":
                    t.append({"id": "onoff-spread", "store": store,
                              "target": "S1 p50 idempotency on ÷ off ≤ %.2f×, orders over %s "
                              "products" % (T_SPREAD_ON_OFF_P50, "{:,}".format(SPREAD_PRODUCTS)),
                              "measured": row["measured"], "ratio": ratio,
                              "met": ratio <= T_SPREAD_ON_OFF_P50})
                else:
                    info.append(row)
        self.targets_issue28(t, st)
        pg = st.get("postgresql", {})
        acc = pg.get("S1", {}).get("pg")
        if acc:
            if "cpu_us_per_key" in acc:
                info.append({"what": "S1: PostgreSQL's CPU per fresh order (the cluster's "
                                     "processes, /proc)", "store": "postgresql",
                             "measured": "%.0f µs (%.2f s ÷ %d orders)" % (
                                 acc["cpu_us_per_key"], acc["cpu_s"], acc["keys"]),
                             "ratio": None})
            hot = acc["idem_hot_share"]
            info.append({"what": "S1: HOT share of the record's updates (pg_stat_user_tables)",
                         "store": "postgresql",
                         "measured": "%s of %d updates" % (
                             "%.0f%%" % (hot * 100) if hot is not None else "—",
                             acc["idem_updates"]), "ratio": None})
            info.append({"what": "S1: WAL bytes per fresh order (pg_stat_wal)",
                         "store": "postgresql",
                         "measured": "%.0f B (%.1f records)" % (
                             acc["wal"]["bytes_per_key"], acc["wal"]["records_per_key"]),
                         "ratio": None})
        if "S1" in pg and "static" in pg:
            info.append({"what": "S1 fresh durable orders ÷ the static HTTP ceiling",
                         "store": "postgresql",
                         "measured": "%.0f ÷ %.0f req/s" % (pg["S1"]["rps"], pg["static"]["rps"]),
                         "ratio": pg["S1"]["rps"] / pg["static"]["rps"]})
        self.r["targets"] = t
        self.r["info"] = info

    def targets_issue28(self, t, st):
        """The targets for orderd's fresh orders (a commit pipeline, not a hand-off chain)."""
        sq = st.get("sqlite", {})
        if "S1" in sq and "static" in sq:
            ratio = sq["S1"]["rps"] / sq["static"]["rps"]
            t.append({"id": "i28-fresh", "store": "sqlite",
                      "target": "S1 ≥ %.2f× the static HTTP ceiling" % T28_FRESH_SHARE,
                      "measured": "%.0f ÷ %.0f req/s" % (sq["S1"]["rps"], sq["static"]["rps"]),
                      "ratio": ratio, "met": ratio >= T28_FRESH_SHARE})
        for store, res in st.items():
            s1 = res.get("S1", {})
            if "cpu_us_per_req" in s1:
                t.append({"id": "i28-cpu", "store": store,
                          "target": "orderd CPU per fresh order ≤ %d µs" % T28_CPU_US,
                          "measured": "%.0f µs" % s1["cpu_us_per_req"],
                          "ratio": s1["cpu_us_per_req"] / T28_CPU_US,
                          "met": s1["cpu_us_per_req"] <= T28_CPU_US})
            if "writer_busy_us_per_req" in s1:
                w = s1["writer_busy_us_per_req"]
                t.append({"id": "i28-writer", "store": store,
                          "target": "the store's writer held ≤ %d µs per fresh order" %
                          T28_WRITER_US,
                          "measured": "%.0f µs (orderd_store_writer_busy_seconds_total)" % w,
                          "ratio": w / T28_WRITER_US, "met": w <= T28_WRITER_US})
            if "vcs_per_req" in s1:
                t.append({"id": "i28-vcs", "store": store,
                          "target": "≤ %g voluntary context switch per fresh order" %
                          T28_VCS,
                          "measured": "%.2f (orderd's threads, /proc/PID/task/*/status)" %
                          s1["vcs_per_req"],
                          "ratio": s1["vcs_per_req"] / T28_VCS,
                          "met": s1["vcs_per_req"] <= T28_VCS})
        pg = st.get("postgresql", {})
        if "S1s" in pg:
            rps = pg["S1s"]["rps"]
            t.append({"id": "i28-pg-spread", "store": "postgresql",
                      "target": "S1 over %s products ≥ %s req/s" % (
                          "{:,}".format(SPREAD_PRODUCTS), "{:,}".format(T28_PG_SPREAD_RPS)),
                      "measured": "%.0f req/s (a figure of another run and day: read it with "
                      "the machine's noise)" % rps,
                      "ratio": rps / T28_PG_SPREAD_RPS, "met": rps >= T28_PG_SPREAD_RPS})

    # -- profiles of what is not met --

    def perf_works(self):
        if not shutil.which("perf"):
            return False
        p = subprocess.run(["perf", "stat", "-e", "cpu-clock", "true"], capture_output=True,
                           timeout=30)
        return p.returncode == 0

    def perf_report(self, data, extra, limit=18):
        p = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-g",
                            "none", "--percent-limit", "0.7"] + extra,
                           capture_output=True, timeout=180)
        lines = [ln.rstrip() for ln in p.stdout.decode("utf-8", "replace").splitlines()
                 if re.match(r"^\s+\d+\.\d+%", ln)]
        return lines[:limit]

    def perf_threads(self, data, tids, keys, limit):
        """
        A flat profile of the threads in `tids` only, as shares of their own samples.  (perf's
        --pid / --tid filters select nothing in machine-wide data here, so this sorts by thread
        and adds up.)
        """
        p = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "-g",
                            "none", "--percent-limit", "0", "-t", "|", "--sort", "pid," + keys],
                           capture_output=True, timeout=180)
        sums, total = {}, 0.0
        for ln in p.stdout.decode("utf-8", "replace").splitlines():
            f = ln.split("|")
            if len(f) < 3 or not f[0].strip().endswith("%"):
                continue
            try:
                pct = float(f[0].strip().rstrip("%"))
                tid = int(f[1].strip().split(":", 1)[0])
            except ValueError:
                continue
            if tid not in tids:
                continue
            key = "  ".join(x.strip() for x in f[2:])
            sums[key] = sums.get(key, 0.0) + pct
            total += pct
        top = sorted(sums.items(), key=lambda kv: -kv[1])[:limit]
        return ["%8.2f%%  %s" % (100 * v / total, k) for k, v in top if total > 0]

    def perf_during(self, kind, name, pid, load, freq=999, pg_uri=None):
        """
        Runs load() under perf, machine-wide (threads orderd starts during the load count too):
        kind "cpu" is `perf record -e cpu-clock -g` (on-CPU samples with call chains), kind
        "trace" is `perf trace -s` (time inside each system call, per thread).  Also samples
        what PostgreSQL's backends are doing when pg_uri is given.  Returns a dict.
        """
        path = os.path.join(self.tmp, "%s.%s" % (name, kind))
        if kind == "cpu":
            cmd = ["perf", "record", "-q", "-a", "-g", "-F", str(freq), "-e", "cpu-clock", "-o",
                   path]
        else:
            cmd = ["perf", "trace", "-a", "-s", "-o", path]
        watcher = TidWatcher(pid)
        pg = PgWaitSampler(pg_uri) if pg_uri else None
        perf = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # perf needs a moment to set its events up on every CPU
        out = {}
        try:
            watcher.start()
            if pg:
                pg.start()
            before = metrics_or_none(self.url_of(pid))
            t0 = cpu_seconds(pid)
            res = load()
            out["cpu_s"] = cpu_seconds(pid) - t0
            after = metrics_or_none(self.url_of(pid))
            if before and after:
                # "none": an order made with --idempotency off.
                out["requests"] = sum(created(after, o) - created(before, o)
                                      for o in ("executed", "replayed", "waited", "none"))
            elif isinstance(res, dict) and res.get("requests"):
                out["requests"] = res["requests"]  # a server without /metrics: wrk's count
        finally:
            if pg:
                out["pg_waits"] = pg.stop()
            stop_perf(perf)
            watcher.stop()
        n = max(out.get("requests", 0), 1)
        out["cpu_us_per_req"] = out["cpu_s"] * 1e6 / n
        if kind == "cpu":
            out["by_command"] = self.perf_report(path, ["--sort", "comm"], 8)
            out["by_dso"] = self.perf_threads(path, watcher.tids, "dso", 8)
            out["symbols"] = self.perf_threads(path, watcher.tids, "dso,sym", 20)
        else:
            calls = parse_trace_summary(path, watcher.tids)
            out["syscalls_per_req"] = {k: (v[0] / n, v[1] / n) for k, v in calls.items()}
        return out

    def url_of(self, pid):
        for p in self.procs:
            if p.pid == pid:
                return p.url
        return None

    def profile_server(self, store, name, extra=None):
        db = self.db_uri(store, name)
        tok = self.token(db, "prof")
        stok = self.token(db, "storm")
        srv = self.start_orderd("orderd-%s-%s" % (name, store), db, extra)
        return srv, db, tok, stok

    def profiles(self):
        unmet = {(t["id"], t["store"]) for t in self.r["targets"] if t["met"] is False}
        if not unmet:
            return
        if not self.perf_works():
            self.note("perf does not work here: no profiles (docs/bench.md says how to use "
                      "valgrind --tool=callgrind instead)")
            return
        prof = self.r["profiles"]
        say("profiling what is not met: %s" % ", ".join("%s/%s" % u for u in sorted(unmet)))
        secs = max(3.0, self.seconds - 1)
        for store in [s for s in ("sqlite", "postgresql") if s in self.r["stores"]]:
            pg = store == "postgresql"
            if ("fresh", store) in unmet or ("cpu", store) in unmet:
                srv, db, tok, _ = self.profile_server(store, "prof-s1")
                try:
                    run = lambda tag: (lambda: self.wrk(srv.url, LUA_FRESH, [tok, tag],
                                                        seconds=secs))
                    p = {"title": "S1 fresh keys"}
                    p["cpu"] = self.perf_during("cpu", "s1-" + store, srv.pid, run("pc"))
                    p["trace"] = self.perf_during("trace", "s1-" + store, srv.pid, run("pt"),
                                                  pg_uri=db if pg else None)
                    prof["S1-" + store] = p
                finally:
                    self.stop(srv)
            if ("replay", store) in unmet:
                srv, db, tok, _ = self.profile_server(store, "prof-s2")
                try:
                    self.warm(srv.url, tok, "p2", WARM_KEYS)
                    run = lambda: self.wrk(srv.url, LUA_REPLAY, [tok, "p2", str(WARM_KEYS)],
                                           seconds=secs)
                    prof["S2-" + store] = {
                        "title": "S2 replays",
                        "cpu": self.perf_during("cpu", "s2-" + store, srv.pid, run),
                        "trace": self.perf_during("trace", "s2-" + store, srv.pid, run,
                                                  pg_uri=db if pg else None)}
                finally:
                    self.stop(srv)
            if ("storm", store) in unmet:
                srv, db, tok, stok = self.profile_server(store, "prof-s3")
                try:
                    box = {}
                    cpu = self.perf_during("cpu", "s3-" + store, srv.pid,
                                           lambda: box.update(c=self.s3(srv.url, stok)),
                                           freq=4999)
                    trace = self.perf_during("trace", "s3-" + store, srv.pid,
                                             lambda: box.update(t=self.s3(srv.url, stok)),
                                             pg_uri=db if pg else None)
                    prof["S3-" + store] = {"title": "S3 same-key storm (lone requests included)",
                                           "cpu": cpu, "trace": trace,
                                           "storm_cpu": box.get("c"), "storm_trace": box.get("t")}
                finally:
                    self.stop(srv)
            if ("rss", store) in unmet:
                # Is it malloc's per-thread arenas?  The same run with at most 2 of them.
                os.environ["MALLOC_ARENA_MAX"] = "2"
                try:
                    prof["RSS-" + store] = {"title": "peak RSS, %s connections" %
                                            "{:,}".format(RSS_CONNECTIONS),
                                            "arena2": self.rss(store)}
                finally:
                    del os.environ["MALLOC_ARENA_MAX"]
                # And how much is the HTTP layer's own: the static server on the same layer.
                if "static_rss" not in prof:
                    prof["static_rss"] = self.static_rss()
        if any(u[0] == "nginx" for u in unmet):
            p = self.start("static_http-prof", [self.static_http, "--listen", "127.0.0.1:0",
                                                "--max-connections-per-ip", "-1"])
            try:
                run = lambda: self.wrk(p.url, LUA_REPLAY, [STATIC_TOKEN, "sp", str(WARM_KEYS)],
                                       seconds=secs)
                prof["static"] = {"title": "the static HTTP server (bench/static_http.c) "
                                           "under S2's request bytes",
                                  "cpu": self.perf_during("cpu", "static", p.pid, run),
                                  "trace": self.perf_during("trace", "static", p.pid, run)}
            finally:
                self.stop(p)
        if any(u[0] == "slowloris" for u in unmet):
            prof["slowloris"] = {"title": "the legitimate client's fresh orders under the "
                                          "slowloris", "rerun": self.slowloris("sqlite",
                                                                               profile=True)}

    def static_rss(self):
        """VmHWM of the static server (the HTTP layer alone) with RSS_CONNECTIONS connections."""
        p = self.start("static_http-rss", [self.static_http, "--listen", "127.0.0.1:0",
                                           "--max-connections-per-ip", "-1"])
        try:
            base = read_status(p.pid).get("VmRSS", 0) / 1024
            fds = [0]
            done = threading.Event()

            def watch():
                while not done.is_set():
                    fds[0] = max(fds[0], fd_count(p.pid))
                    done.wait(0.25)
            w = threading.Thread(target=watch, daemon=True)
            w.start()
            try:
                res = self.wrk(p.url, LUA_REPLAY, [STATIC_TOKEN, "static", str(WARM_KEYS)],
                               conns=RSS_CONNECTIONS)
            finally:
                done.set()
                w.join(5)
            hwm = read_status(p.pid).get("VmHWM", 0) / 1024
            return {"hwm_mib": hwm, "base_mib": base, "fds_max": fds[0],
                    "kib_per_conn": (hwm - base) * 1024 / RSS_CONNECTIONS,
                    "socket_errors": res["socket_errors"]}
        finally:
            self.stop(p)

    # -- the report --

    def write_json(self, prefix):
        """Writes the results as OUT/PREFIX-TIME.json; returns OUT/PREFIX-TIME for the rest."""
        out_dir = os.path.abspath(self.args.out)
        os.makedirs(out_dir, exist_ok=True)
        base = os.path.join(out_dir, prefix + "-" + self.ts)
        self.r["meta"]["wall_s"] = time.monotonic() - self.started
        self.r["meta"]["loadavg_end"] = read_loadavg()
        with open(base + ".json", "w") as f:
            json.dump(self.r, f, indent=1, default=str)
        return base

    def write(self):
        base = self.write_json("bench")
        out_dir = os.path.dirname(base)
        chart = self.chart(base)
        for path, img in ((base + ".md", os.path.basename(chart) if chart else None),
                          (os.path.join(out_dir, "latest.md"), "latest.svg" if chart else None)):
            with open(path, "w") as f:
                f.write(self.markdown(img))
        if chart:
            shutil.copyfile(chart, os.path.join(out_dir, "latest.svg"))
        say("report: %s (and latest.md)" % (base + ".md"))

    def chart(self, base):
        if not shutil.which("gnuplot"):
            self.note("gnuplot is not installed: no chart")
            return None
        st = self.r["stores"]

        def v(store, sc, field):
            x = st.get(store, {}).get(sc, {})
            return x.get(field) if isinstance(x, dict) and x.get(field) is not None else "?"
        c = self.r["commit"]
        s3 = [st.get(x, {}).get("S3", {}) for x in ("sqlite", "postgresql")]
        dat = base + "-rate.dat"
        with open(dat, "w") as f:
            f.write("# scenario sqlite postgresql (req/s; commits/s for the commit rows)\n")
            for label, sc in (("S1 fresh", "S1"), ("S1 idempotency off", "S1off"),
                              ("S2 replay", "S2"), ("S4 payment", "S4")):
                f.write('"%s" %s %s\n' % (label, v("sqlite", sc, "rps"),
                                          v("postgresql", sc, "rps")))
            f.write('"static HTTP ceiling" %s %s\n' % (v("sqlite", "static", "rps"),
                                                       v("postgresql", "static", "rps")))
            f.write('"nginx, same response" %s %s\n' % (v("sqlite", "nginx", "rps"),
                                                        v("postgresql", "nginx", "rps")))
            for t in (1, 8):
                f.write('"commits, %d thread%s" %s %s\n' % (
                    t, "s" if t > 1 else "", c.get("sqlite-%d" % t, {}).get("rate", "?"),
                    c.get("postgresql-%d" % t, {}).get("rate", "?")))
        lat = base + "-latency.dat"
        with open(lat, "w") as f:
            f.write("# scenario sqlite_p50 sqlite_p99 pg_p50 pg_p99 (ms)\n")
            for label, sc in (("S1 fresh", "S1"), ("S1 idempotency off", "S1off"),
                              ("S2 replay", "S2"), ("S4 payment", "S4")):
                f.write('"%s" %s %s %s %s\n' % (
                    label, v("sqlite", sc, "p50_ms"), v("sqlite", sc, "p99_ms"),
                    v("postgresql", sc, "p50_ms"), v("postgresql", sc, "p99_ms")))
            f.write('"S3 storm (200, one key)" %s %s %s %s\n' % (
                s3[0].get("p50_ms", "?"), s3[0].get("p99_ms", "?"),
                s3[1].get("p50_ms", "?"), s3[1].get("p99_ms", "?")))
            f.write('"S3 lone request" %s ? %s ?\n' % (s3[0].get("lone_p50_ms", "?"),
                                                       s3[1].get("lone_p50_ms", "?")))
            f.write('"static HTTP ceiling" %s %s %s %s\n' % (
                v("sqlite", "static", "p50_ms"), v("sqlite", "static", "p99_ms"),
                v("postgresql", "static", "p50_ms"), v("postgresql", "static", "p99_ms")))
            f.write('"nginx, same response" %s %s %s %s\n' % (
                v("sqlite", "nginx", "p50_ms"), v("sqlite", "nginx", "p99_ms"),
                v("postgresql", "nginx", "p50_ms"), v("postgresql", "nginx", "p99_ms")))
            sl = self.r.get("slowloris", {})
            f.write('"fresh -c%d, slowloris" %s %s ? ?\n' % (
                SLOW_LEGIT_CONNECTIONS, sl.get("attacked", {}).get("p50_ms", "?"),
                sl.get("attacked", {}).get("p99_ms", "?")))
            f.write('"fresh -c%d, no attack" %s %s ? ?\n' % (
                SLOW_LEGIT_CONNECTIONS, sl.get("alone", {}).get("p50_ms", "?"),
                sl.get("alone", {}).get("p99_ms", "?")))
        svg = base + ".svg"
        gp = """
set terminal svg size 1100,820 dynamic font "sans,11" background "#ffffff"
set output '%(svg)s'
set datafile missing '?'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics
set logscale y
set xtics rotate by -25 nomirror
set key top right
set multiplot layout 2,1 title "idem bench %(ts)s (orderd, %(conns)d connections, %(secs)g s per run)"
set title "throughput (req/s, or commits/s for the commit baselines; log scale)"
set ylabel "per second"
plot '%(dat)s' using 2:xtic(1) title 'SQLite' lc rgb '#3b75af', '' using 3 title 'PostgreSQL' lc rgb '#ef8536'
set title "latency (ms, log scale)"
set ylabel "ms"
plot '%(lat)s' using 2:xtic(1) title 'SQLite p50' lc rgb '#8fb4d9', '' using 3 title 'SQLite p99' lc rgb '#3b75af', '' using 4 title 'PostgreSQL p50' lc rgb '#f5b98b', '' using 5 title 'PostgreSQL p99' lc rgb '#c4561b'
unset multiplot
""" % {"svg": svg, "dat": dat, "lat": lat, "ts": self.ts, "conns": self.conns, "secs": self.seconds}
        with open(base + ".gp", "w") as f:
            f.write(gp)
        p = subprocess.run(["gnuplot", base + ".gp"], capture_output=True, timeout=60)
        if p.returncode != 0:
            self.note("gnuplot failed: %s" % p.stderr.decode("utf-8", "replace")[-300:])
            return None
        return svg

    def markdown(self, img):
        r = self.r
        m = r["meta"]
        st = r["stores"]
        L = []
        self.rss_lines = []
        L.append("# idem benchmark — %s" % self.ts)
        L.append("")
        L.append("`make bench` (docs/bench.md). Machine: %s, %d cores, %s RAM, Linux %s, data on "
                 "%s. Tools: %s, SQLite %s, %s. Checkout: %s. Whole run: %.0f s. Other work on the machine right before the run: CPUs %.0f%% busy "
                 "(load average %.2f; %.2f at the end, our own load included)." % (
                     m["cpu"], m["cores"], m["mem"], m["kernel"], m["fs"], m["wrk"],
                     m.get("sqlite", "?"), m.get("postgresql", "PostgreSQL not run"),
                     m["commit"], m["wall_s"], m.get("busy_at_start", 0) * 100,
                     m["loadavg_start"], m["loadavg_end"]))
        L.append("")
        L.append("Load: wrk, %d threads, %d connections, %g s per scenario, on 127.0.0.1; wrk and "
                 "the server share the %d cores. Latencies are wrk's (from the request's first "
                 "byte to its response; wrk 4.1 corrects its p90/p99 for coordinated omission, "
                 "docs/bench.md), storm.c's and slowloris.py's (each request as it was). "
                 "orderd runs with its defaults (`--db-pool 16`, "
                 "`--sqlite-sync full`, text log to a file; HTTP: one event loop per core, 64 "
                 "workers) and `--max-connections-per-ip -1`, except in the slowloris scenario, "
                 "which keeps the default cap of 256 and the default deadlines. Open-file limit "
                 "of the run and its children: %s." % (
                     WRK_THREADS, self.conns, self.seconds, m["cores"],
                     "{:,}".format(m.get("nofile", 0))))
        L.append("")
        if img:
            L.append("![throughput and latency](%s)" % img)
            L.append("")
        L.append("## Targets")
        L.append("")
        L.append("| target | store | measured | ratio | |")
        L.append("|---|---|---|---|---|")
        for t in r.get("targets", []):
            met = "not measured" if t["met"] is None else ("**met**" if t["met"] else "**not met**")
            L.append("| %s | %s | %s | %s | %s |" % (t["target"], t["store"], t["measured"],
                                                     fmt_ratio(t["ratio"]), met))
        L.append("")
        if r.get("info"):
            L.append("Information, no verdict (the group-commit readings, and S1 on PostgreSQL "
                     "with PostgreSQL's own account of it):")
            L.append("")
            L.append("| reading | store | measured | ratio |")
            L.append("|---|---|---|---|")
            for i in r["info"]:
                L.append("| %s | %s | %s | %s |" % (i["what"], i["store"], i["measured"],
                                                    fmt_ratio(i["ratio"])))
            L.append("")
        L.append("## Scenarios")
        L.append("")
        L.append("| scenario | store | req/s | p50 ms | p90 ms | p99 ms | checks |")
        L.append("|---|---|---|---|---|---|---|")
        for store in ("sqlite", "postgresql"):
            res = st.get(store)
            if res is None:
                L.append("| all | %s | not measured: no PostgreSQL cluster (run under "
                         "tests/pg/with_pg.sh) | | | | |" % store)
                continue
            for sc, label in (("S1", "S1 fresh keys"), ("S1off", "S1 with `--idempotency off`"),
                              ("S1s", "S1 fresh keys, %s products" % "{:,}".format(
                                  SPREAD_PRODUCTS)),
                              ("S1soff", "S1 `--idempotency off`, %s products" % "{:,}".format(
                                  SPREAD_PRODUCTS)),
                              ("S2", "S2 replays of %d warmed keys" % WARM_KEYS),
                              ("S4", "S4 payment flow (provider-sim)")):
                x = res.get(sc, {})
                if "skipped" in x:
                    L.append("| %s | %s | not measured: %s | | | | |" % (label, store,
                                                                       x["skipped"]))
                    continue
                if "rps" not in x:
                    continue
                checks = ["non-2xx %d" % x["non2xx"], "socket errors %d" % x["socket_errors"]]
                checks += [text(x) for field, text in SCENARIO_NOTES if field in x]
                L.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                    label, store, fmt_rate(x["rps"]), fmt_ms(x["p50_ms"]), fmt_ms(x["p90_ms"]),
                    fmt_ms(x["p99_ms"]), "; ".join(checks)))
            s3 = res.get("S3")
            if s3:
                L.append("| S3 storm: %d requests, one key, released together | %s | — | %s | — "
                         "| %s | executions %d (metrics), orders %s (GET /api/orders); statuses %s; "
                         "waited %d, replayed %d, 409 %d; lone request p50 %s ms (%d sent one "
                         "by one) |" % (
                             STORM_REQUESTS, store, fmt_ms(s3["p50_ms"]), fmt_ms(s3["p99_ms"]),
                             s3["executed"], s3["orders"],
                             ", ".join("%s×%d" % (k, v) for k, v in sorted(s3["statuses"].items(),
                                                                           key=str)),
                             s3["waited"], s3["replayed"], s3["in_progress"],
                             fmt_ms(s3["lone_p50_ms"]), LONE_REQUESTS))
            rss = res.get("RSS")
            if rss and rss.get("breakdown"):
                parts = sorted(rss["breakdown"].items(), key=lambda kv: -kv[1][1])
                self.rss_lines.append(
                    "- %s, %.1f MiB resident at the highest sample: " % (store,
                                                                         rss["breakdown_at_mib"]) +
                    "; ".join("%s %.1f MiB (%d mappings)" % (k, v[1] / 1024, v[0])
                              for k, v in parts if v[1] >= 256))
            if rss:
                L.append("| peak RSS, wrk -c%d replays of %d keys | %s | %s | %s | %s | %s | "
                         "VmHWM %.1f MiB (%.1f MiB before the load: %.1f KiB per connection), "
                         "%s descriptors and %d threads at most, non-2xx %s, socket errors %d "
                         "(%s) |" % (
                             RSS_CONNECTIONS, RSS_WARM_KEYS, store, fmt_rate(rss["rps"]),
                             fmt_ms(rss["p50_ms"]), fmt_ms(rss["p90_ms"]), fmt_ms(rss["p99_ms"]),
                             rss["hwm_mib"], rss["base_mib"], rss["kib_per_conn"],
                             "{:,}".format(rss["fds_max"]), rss["threads_max"], rss["non2xx"],
                             rss["socket_errors"], ", ".join(
                                 "%s %d" % kv for kv in rss["socket_errors_by_kind"].items())))
        sl = r.get("slowloris")
        if sl:
            for key, label in (("alone", "legitimate client alone"),
                               ("attacked", "legitimate client with %s slowloris connections "
                                            "from %s" % ("{:,}".format(SLOW_ATTACKERS),
                                                         sl["sources"]))):
                x = sl[key]
                extra = ("; orderd CPU %.0f µs, client CPU %.0f µs per order; machine %.0f%% "
                         "busy" % (x.get("orderd_cpu_us_per_req", 0),
                                   x.get("client_cpu_us_per_req", 0), x["machine_busy"] * 100))
                if key == "attacked":
                    at = sl.get("attack", {})
                    cbs = at.get("closed_by_server", {})
                    extra += ("; attackers: %d open at the start (connect errors %d), %d at the "
                              "end; orderd closed %d trickling heads and %d trickling bodies "
                              "(%s); orderd's descriptors %d before the attack, %d during" % (
                                  sl["attack_open"], sl["attack_connect_errors"],
                                  at.get("open_at_end", -1), cbs.get("head", 0),
                                  cbs.get("body", 0), ", ".join(
                                      "%s ×%d" % kv for kv in at.get("status_lines", {}).items())
                                  or "no answer yet", sl["fds_before"], sl["fds_attacked"]))
                    h = sl.get("http")
                    if h:
                        extra += ("; orderd's /metrics: %d connections open under attack; during "
                                  "the legitimate runs %d connections refused, %d timeouts, %d "
                                  "heads refused, %d requests refused for a full queue" % (
                                      h["connections_attacked"], h["connections_refused_total"],
                                      h["timeouts_total"], h["refused_heads_total"],
                                      h["queue_full_total"]))
                L.append("| slowloris: %s; fresh orders on %d connections | sqlite | %s | %s | "
                         "%s | %s | non-2xx %d; socket errors %d%s |" % (
                             label, sl["connections"], fmt_rate(x["rps"]), fmt_ms(x["p50_ms"]),
                             fmt_ms(x["p90_ms"]), fmt_ms(x["p99_ms"]), x["non2xx"],
                             x["socket_errors"], extra))
        L.append("")
        if self.rss_lines:
            L.append("Where the resident memory of orderd is with %d connections (from "
                     "/proc/PID/smaps):" % RSS_CONNECTIONS)
            L.append("")
            L.extend(self.rss_lines)
            L.append("")
        acc = r["stores"].get("postgresql", {}).get("S1", {}).get("pg")
        if acc:
            L.append("## PostgreSQL")
            L.extend(pg_stats_markdown("orderd's S1 fresh orders", acc)[2:])
            L.append("")
        L.append("## Baselines (same run)")
        L.append("")
        L.append("| baseline | req/s or commits/s | p50 ms | p99 ms | notes |")
        L.append("|---|---|---|---|---|")
        for store in ("sqlite", "postgresql"):
            s = st.get(store, {}).get("static")
            if s:
                runs = s.get("runs", [])
                L.append("| static HTTP ceiling (bench/static_http.c: orderd's HTTP layer "
                         "answering on the loop, S2's request bytes), right before S2 on %s: the "
                         "mean of a run before nginx and one after (%s req/s) | "
                         "%s | %s | %s | non-2xx %d; server CPU %.0f µs, wrk CPU %.0f µs per "
                         "request; machine %.0f%% busy |" % (
                             store, " / ".join(fmt_rate(x["rps"]) for x in runs) or "?",
                             fmt_rate(s["rps"]), fmt_ms(s["p50_ms"]), fmt_ms(s["p99_ms"]),
                             s["non2xx"], s["cpu_us_per_req"], s["wrk_cpu_us_per_req"],
                             s["machine_busy"] * 100))
                ng = st.get(store, {}).get("nginx", {})
                if "rps" in ng:
                    L.append("| nginx %d workers, the same response and request bytes, right "
                             "between the two static runs on %s | %s | %s | %s | non-2xx %d; same "
                             "body and Content-Type: %s; nginx CPU %.0f µs, wrk CPU %.0f µs per "
                             "request; machine %.0f%% busy |" % (
                                 ng["workers"], store, fmt_rate(ng["rps"]), fmt_ms(ng["p50_ms"]),
                                 fmt_ms(ng["p99_ms"]), ng["non2xx"],
                                 "yes" if ng["same_response"] else "**no**",
                                 ng["cpu_us_per_req"], ng["wrk_cpu_us_per_req"],
                                 ng["machine_busy"] * 100))
                elif ng:
                    L.append("| nginx | not measured: %s | | | |" % ng.get("skipped"))
                sst = s.get("storm")
                if sst:
                    L.append("| S3's storm against the static HTTP server (no work behind it), "
                             "right before S2 on %s | | %s | %s | %d same requests released "
                             "together on new connections; lone request p50 %s ms; failed %d |" % (
                                 store, fmt_ms(sst["p50_ms"]), fmt_ms(sst["p99_ms"]),
                                 STORM_REQUESTS, fmt_ms(sst["lone_p50_ms"]), sst["failed"]))
        for key, x in sorted(r["commit"].items()):
            store, threads = key.rsplit("-", 1)
            extra = ("WAL, synchronous=%s" % x.get("synchronous") if store == "sqlite" else
                     "fsync=%s, synchronous_commit=%s" % (x.get("fsync"),
                                                          x.get("synchronous_commit")))
            L.append("| commit rate, %s, %s thread(s), one-row transactions | %s | %s | %s | %s, "
                     "errors %d |" % (store, threads, fmt_rate(x["rate"]), fmt_ms(x["p50_us"] / 1000),
                                      fmt_ms(x["p99_us"] / 1000), extra, x["errors"]))
        sq = st.get("sqlite", {})
        if "commit_before" in sq:
            L.append("| commit rate, sqlite, 1 thread, right before / after S1 (the reference "
                     "of the group-commit reading is their mean) | %s / %s | | | |" % (
                         fmt_rate(sq["commit_before"]["rate"]),
                         fmt_rate(sq["commit_after"]["rate"])))
        L.append("")
        if r["profiles"]:
            L.append("## Profiles of the targets not met")
            L.append("")
            L.append("Taken after the measured runs, on fresh servers, machine-wide: `perf record "
                     "-e cpu-clock -g` for where the CPU goes, `perf trace -s` for the time "
                     "the server's threads spend inside each system call (tracing slows the run, "
                     "so read it per request, not as a rate), and for PostgreSQL what its "
                     "backends were doing (pg_stat_activity sampled every 20 ms). docs/bench.md "
                     "explains how to read them.")
            L.append("")
            for name, p in r["profiles"].items():
                L.extend(self.profile_lines(name, p))
        if r.get("reading"):
            L.append("## Reading")
            L.append("")
            L.extend(r["reading"])
            L.append("")
        if r["notes"]:
            L.append("## Notes")
            L.append("")
            for n in r["notes"]:
                L.append("- " + n)
            L.append("")
        return "\n".join(L)

    def readings(self):
        """What the numbers say about each target not met, in sentences, from this run's data."""
        r, st, prof = self.r, self.r["stores"], self.r["profiles"]
        cores = r["meta"]["cores"] or 2
        out = []

        def sc(name, call):
            t = prof.get(name, {}).get("trace", {}).get("syscalls_per_req", {})
            return t.get(call, (0.0, 0.0))

        # Calls where an idle thread sleeps (64 workers waiting for work, loops waiting for
        # sockets): their time is mostly idleness summed over threads, so they are ranked apart.
        idle_calls = ("futex", "epoll_wait", "epoll_pwait", "poll", "ppoll", "select",
                      "clock_nanosleep", "nanosleep", "accept", "accept4")

        def top_calls(name, n=5):
            t = prof.get(name, {}).get("trace", {}).get("syscalls_per_req", {})
            top = sorted(((k, v) for k, v in t.items() if k not in idle_calls),
                         key=lambda kv: -kv[1][1])[:n]
            return ", ".join("%s %.2f× (%.0f µs)" % (k, c, ms * 1000) for k, (c, ms) in top)

        def top_lines(name, part, n):
            lines = prof.get(name, {}).get("cpu", {}).get(part) or []
            return "; ".join(" ".join(ln.split()) for ln in lines[:n])

        def machine_us(x):
            """Machine CPU (all cores) per request during a wrk run, in µs."""
            return x["machine_busy"] * cores * x["seconds"] * 1e6 / max(x["requests"], 1)

        for t in r.get("targets", []):
            if t["met"] is not False:
                continue
            store, res = t["store"], st.get(t["store"], {})
            k1 = "S1-" + store
            if t["id"] == "fresh":
                s1, stc = res["S1"], res["static"]
                need = T_FRESH_SHARE * stc["rps"]
                mach = machine_us(s1)
                line = ("- **S1 fresh orders ÷ static ceiling (%s)**: %.0f req/s = %.2f× the "
                        "ceiling of %.0f req/s; %.2f× would be %.0f req/s. During S1 the machine "
                        "was %.0f%% busy: %.0f µs of CPU (all cores) per order, of which orderd "
                        "%.0f µs, wrk %.0f µs and the rest (kernel work not charged to either, "
                        "other processes) %.0f µs; the static server's answer cost %.0f µs of "
                        "its own CPU." % (
                            store, s1["rps"], s1["rps"] / stc["rps"], stc["rps"],
                            T_FRESH_SHARE, need, s1["machine_busy"] * 100, mach,
                            s1["cpu_us_per_req"], s1["wrk_cpu_us_per_req"],
                            max(mach - s1["cpu_us_per_req"] - s1["wrk_cpu_us_per_req"], 0),
                            stc["cpu_us_per_req"]))
                if s1["machine_busy"] >= 0.9:
                    line += (" The cores were full, so the rate is CPU: %.0f req/s needs at most "
                             "%.0f µs of machine CPU per order in all, against %.0f µs now." % (
                                 need, cores * 1e6 / need, mach))
                else:
                    line += (" The cores were not full (%.0f%% idle), so orders waited more than "
                             "they computed: with %d connections, %d ÷ %.0f req/s = %.1f ms per "
                             "order in flight (Little's law)." % (
                                 (1 - s1["machine_busy"]) * 100, s1["connections"],
                                 s1["connections"], s1["rps"],
                                 s1["connections"] * 1000 / s1["rps"]))
                    if store == "sqlite":
                        fs = sc(k1, "fdatasync")
                        line += (" SQLite's group commit gives every write of the process to one "
                                 "writer connection, which runs the members' statements one "
                                 "after another and stays held through the batch's COMMIT, "
                                 "fdatasync included: at this rate each order had %.0f µs of "
                                 "the writer in turn%s. The rate moves with the time an order "
                                 "holds the writer (its statements, its savepoint, the "
                                 "hand-over to the next) and with the batch size." % (
                                     1e6 / s1["rps"],
                                     ("; a batch held %.1f orders and its fdatasync took %.2f ms "
                                      "while traced" % (1 / fs[0], fs[1] / fs[0]))
                                     if fs[0] > 0 else ""))
                if k1 in prof:
                    syncs = sc(k1, "fdatasync")[0] + sc(k1, "fsync")[0]
                    line += (" Per order while traced: %.2f fdatasync%s, %.1f futex calls "
                             "(the writer's queue and batch, the worker pool's queue, hand-backs "
                             "to the loop: each a sleep and a wake-up), %.1f pwrite64; the "
                             "longest system calls other than the waits of idle threads: %s." % (
                                 syncs, (" (about %.0f orders share each durable commit)" %
                                         (1 / syncs)) if 0 < syncs < 0.5 else "",
                                 sc(k1, "futex")[0], sc(k1, "pwrite64")[0], top_calls(k1)))
                out.append(line)
            elif t["id"] == "cpu":
                s1 = res["S1"]
                line = ("- **orderd CPU per fresh order (%s)**: %.0f µs against the aim of %d µs "
                        "(%.1f×)." % (store, s1["cpu_us_per_req"], T_CPU_US,
                                      s1["cpu_us_per_req"] / T_CPU_US))
                stc = res.get("static")
                if stc:
                    line += (" The HTTP layer alone answers in %.0f µs (static server), so "
                             "orderd's own work per order is about %.0f µs: token and route "
                             "checks, the fingerprint (JCS + SHA-256), the hand-off to a worker "
                             "and back to the loop, the claim, %s, the replay cache and the "
                             "request log." % (
                                 stc["cpu_us_per_req"],
                                 s1["cpu_us_per_req"] - stc["cpu_us_per_req"],
                                 "the order's statements in a savepoint of the SQLite writer's "
                                 "shared batch and the wait for its group commit"
                                 if store == "sqlite" else
                                 "the order's statements in a PostgreSQL transaction (a round "
                                 "trip each: %.1f sendto per order while traced) and its commit"
                                 % sc(k1, "sendto")[0]))
                if k1 in prof:
                    line += (" By library: %s. Top symbols (self time): %s." % (
                        top_lines(k1, "by_dso", 4), top_lines(k1, "symbols", 6)))
                out.append(line)
            elif t["id"] == "replay":
                s2, stc = res["S2"], res["static"]
                line = ("- **S2 replays (%s)**: %.0f ÷ %.0f req/s. Replays are answered on the "
                        "event loop from the replay cache (no worker, no store), yet orderd used "
                        "%.0f µs of CPU per replay against %.0f µs for the static server's "
                        "answer (%.1f×); wrk used %.0f µs per replay and %.0f µs per static "
                        "answer. wrk shares the cores, so every µs the server spends is taken "
                        "from the load generator too." % (
                            store, s2["rps"], stc["rps"], s2["cpu_us_per_req"],
                            stc["cpu_us_per_req"],
                            s2["cpu_us_per_req"] / max(stc["cpu_us_per_req"], 1e-9),
                            s2["wrk_cpu_us_per_req"], stc["wrk_cpu_us_per_req"]))
                k2 = "S2-" + store
                if k2 in prof:
                    line += (" What orderd adds on the loop: the token (cache), the key, the "
                             "fingerprint (JCS + SHA-256 of the body), the cache lookup, the "
                             "stored headers and the request log line (formatted with printf; "
                             "write %.1f× per replay: the response and the log line). By "
                             "library: %s. Top symbols: %s." % (
                                 sc(k2, "write")[0], top_lines(k2, "by_dso", 4),
                                 top_lines(k2, "symbols", 6)))
                out.append(line)
            elif t["id"] == "nginx":
                stc, ng = res["static"], res["nginx"]
                line = ("- **static ceiling ÷ nginx (%s)**: %.0f ÷ %.0f req/s. Per request the "
                        "static server used %.0f µs of CPU, nginx %.0f µs (its %d workers); wrk "
                        "used %.0f µs against the static server and %.0f µs against nginx; the "
                        "machine was %.0f%% and %.0f%% busy." % (
                            store, stc["rps"], ng["rps"], stc["cpu_us_per_req"],
                            ng["cpu_us_per_req"], ng["workers"], stc["wrk_cpu_us_per_req"],
                            ng["wrk_cpu_us_per_req"], stc["machine_busy"] * 100,
                            ng["machine_busy"] * 100))
                if "static" in prof:
                    line += (" The static server's profile, by library: %s; top symbols: %s; "
                             "system calls per request: %s." % (
                                 top_lines("static", "by_dso", 4),
                                 top_lines("static", "symbols", 6), top_calls("static", 6)))
                out.append(line)
            elif t["id"] == "storm":
                s3 = res["S3"]
                k3 = "S3-" + store
                line = ("- **S3 storm (%s)**: exactly one execution (%d), but p99 %s ms against "
                        "a lone %s ms." % (store, s3["executed"], fmt_ms(s3["p99_ms"]),
                                           fmt_ms(s3["lone_p50_ms"])))
                line += (" %d duplicates parked on the event loop until the first completed "
                         "and were answered from the replay cache, %d found it completed and "
                         "replayed at once, %d got 409." % (s3["waited"], s3["replayed"],
                                                           s3["in_progress"]))
                sst = res.get("static", {}).get("storm")
                if sst:
                    floor = sst["p99_ms"] / s3["lone_p50_ms"]
                    line += (" The same storm against the static server, which does no work "
                             "at all, took p99 %s ms (lone %s ms): accepting %d new connections "
                             "and answering them on the loops alone costs %.1f× the lone "
                             "order's latency" % (fmt_ms(sst["p99_ms"]),
                                                  fmt_ms(sst["lone_p50_ms"]), STORM_REQUESTS,
                                                  floor))
                    line += ("; the target cannot be met by orderd's own work alone." if
                             floor > T_STORM_P99 else "; orderd's own work is the rest.")
                if k3 in prof:
                    cpu = prof[k3]["cpu"].get("cpu_us_per_req", 0)
                    line += (" orderd used %.0f µs of CPU per storm request, against %.0f µs "
                             "per replay on a kept-alive connection in S2; %.1f futex calls per "
                             "request. 200 × %.0f µs over %d cores ≈ %.0f ms: the order of the "
                             "p99. To stay within %g× a lone request a duplicate may cost at "
                             "most %d cores × %g × %s ms ÷ %d ≈ %.0f µs of machine CPU, accept "
                             "and the client's share included." % (
                                 cpu, res.get("S2", {}).get("cpu_us_per_req", 0),
                                 sc(k3, "futex")[0], cpu, cores,
                                 STORM_REQUESTS * cpu / 1000 / cores, T_STORM_P99, cores,
                                 T_STORM_P99, fmt_ms(s3["lone_p50_ms"]), STORM_REQUESTS,
                                 cores * T_STORM_P99 * s3["lone_p50_ms"] * 1000 /
                                 STORM_REQUESTS))
                out.append(line)
            elif t["id"] == "rss":
                rss = res["RSS"]
                b = rss.get("breakdown", {})
                parts = sorted(b.items(), key=lambda kv: -kv[1][1])
                line = ("- **RSS (%s)**: VmHWM %.1f MiB with %s connections (%s descriptors at "
                        "most, socket errors %d), %.1f MiB before the load: %.1f KiB per "
                        "connection, %d threads. At the highest sample: %s." % (
                            store, rss["hwm_mib"], "{:,}".format(RSS_CONNECTIONS),
                            "{:,}".format(rss["fds_max"]), rss["socket_errors"],
                            rss["base_mib"], rss["kib_per_conn"], rss["threads_max"],
                            "; ".join("%s %.1f MiB" % (k, v[1] / 1024) for k, v in parts
                                      if v[1] >= 256) or "?"))
                if rss["fds_max"] < RSS_CONNECTIONS:
                    line += (" Not all %s connections were open at once (see socket errors): "
                             "the reading is not the target's." % "{:,}".format(RSS_CONNECTIONS))
                srss = prof.get("static_rss")
                if srss:
                    line += (" The static server on the same HTTP layer peaks at %.1f MiB with "
                             "the same connections (%.1f KiB per connection)%s." % (
                                 srss["hwm_mib"], srss["kib_per_conn"],
                                 ": the memory per connection is the HTTP layer's (its "
                                 "connection state and buffers, allocated by the event loops "
                                 "in their malloc arenas), not orderd's"
                                 if srss["kib_per_conn"] >= 0.7 * rss["kib_per_conn"] else ""))
                a2 = prof.get("RSS-" + store, {}).get("arena2")
                if a2:
                    line += (" With MALLOC_ARENA_MAX=2 the peak was %.1f MiB." % a2["hwm_mib"])
                out.append(line)
            elif t["id"] == "slowloris":
                sl = r["slowloris"]
                a, b = sl["alone"], sl["attacked"]
                at = sl.get("attack", {})
                line = ("- **slowloris**: the legitimate client's p99 went from %s ms alone to "
                        "%s ms with %d attackers open (%.1f×), its throughput from %.0f to "
                        "%.0f orders/s; non-2xx %d, socket errors %d. orderd used %.0f µs of "
                        "CPU per legitimate order under attack; the attacker sent %s bytes in "
                        "%.0f s and orderd closed %s of its connections." % (
                            fmt_ms(a["p99_ms"]), fmt_ms(b["p99_ms"]), sl["attack_open"],
                            b["p99_ms"] / max(a["p99_ms"], 1e-6), a["rps"], b["rps"],
                            b["non2xx"], b["socket_errors"], b.get("orderd_cpu_us_per_req", 0),
                            "{:,}".format(at.get("bytes_sent", 0)), at.get("attack_s", 0),
                            at.get("closed_by_server")))
                rerun = prof.get("slowloris", {}).get("rerun")
                if rerun and rerun.get("cpu"):
                    line += (" Profiled again under attack (p99 %s ms alone, %s ms attacked): "
                             "orderd by library %s; top symbols %s." % (
                                 fmt_ms(rerun["alone"]["p99_ms"]),
                                 fmt_ms(rerun["attacked"]["p99_ms"]),
                                 "; ".join(" ".join(x.split())
                                           for x in rerun["cpu"].get("by_dso", [])[:4]),
                                 "; ".join(" ".join(x.split())
                                           for x in rerun["cpu"].get("symbols", [])[:6])))
                out.append(line)
        r["reading"] = out

    def profile_lines(self, name, p):
        if name == "static_rss":
            return ["### static_http with %s connections" % "{:,}".format(RSS_CONNECTIONS), "",
                    "- VmHWM %.1f MiB on orderd's HTTP layer (src/http/), %.1f MiB before the "
                    "load: %.1f KiB per connection; %s descriptors at most, socket errors %d" % (
                        p["hwm_mib"], p["base_mib"], p["kib_per_conn"],
                        "{:,}".format(p["fds_max"]), p["socket_errors"]), ""]
        if name == "slowloris" and p.get("rerun"):
            rr = p["rerun"]
            p = {"title": p["title"], "cpu": rr.get("cpu")}
        L = ["### %s — %s" % (name, p.get("title", "")), ""]
        cpu, trace = p.get("cpu"), p.get("trace")
        for part in (cpu, trace):
            if part and part.get("requests"):
                L.append("- %s run: %d requests answered; the server used %.0f µs of CPU per "
                         "request" % ("CPU-profiled" if part is cpu else "traced",
                                      part["requests"], part["cpu_us_per_req"]))
        if trace and trace.get("syscalls_per_req"):
            top = sorted(trace["syscalls_per_req"].items(), key=lambda kv: -kv[1][1])[:10]
            L.append("- inside system calls, per request, summed over the server's threads "
                     "(futex and epoll_wait include idle workers and loops waiting) (calls × / "
                     "ms): " + ", ".join(
                "%s %.2f× / %.3f ms" % (k, c, ms) for k, (c, ms) in top))
        if trace and trace.get("pg_waits"):
            L.append("- PostgreSQL backends of orderd's database (share of samples): " +
                     ", ".join("%s %.0f%%" % (k, v * 100) for k, v in
                               list(trace["pg_waits"].items())[:8]))
        for key in ("storm_cpu", "storm_trace"):
            s3 = p.get(key)
            if s3:
                L.append("- the storm %s: p50 %s ms, p99 %s ms, lone %s ms, statuses %s, "
                         "executions %d" % (
                             "while CPU-profiled" if key == "storm_cpu" else "while traced",
                             fmt_ms(s3["p50_ms"]), fmt_ms(s3["p99_ms"]),
                             fmt_ms(s3["lone_p50_ms"]), s3["statuses"], s3["executed"]))
        a2 = p.get("arena2")
        if a2:
            L.append("- the same run with `MALLOC_ARENA_MAX=2`: VmHWM %.1f MiB (%d threads, %s "
                     "descriptors)" % (a2["hwm_mib"], a2["threads_max"],
                                       "{:,}".format(a2["fds_max"])))
            if a2.get("breakdown"):
                parts = sorted(a2["breakdown"].items(), key=lambda kv: -kv[1][1])
                L.append("  (" + "; ".join("%s %.1f MiB" % (k, v[1] / 1024) for k, v in parts
                                            if v[1] >= 256) + ")")
        if cpu:
            for part, title in (("by_command", "CPU by thread name, whole machine"),
                                ("by_dso", "the server's CPU by library"),
                                ("symbols", "the server's CPU, top symbols (self time)")):
                if cpu.get(part):
                    L += ["", "%s:" % title, "", "```"] + cpu[part] + ["```"]
        L.append("")
        return L

    def meta(self):
        m = {"cores": os.cpu_count() or 0, "kernel": platform.release()}
        m["cpu"] = "?"
        try:
            with open("/proc/cpuinfo") as f:
                for ln in f:
                    if ln.startswith("model name"):
                        m["cpu"] = ln.split(":", 1)[1].strip()
                        break
            with open("/proc/meminfo") as f:
                kb = int(f.readline().split()[1])
                m["mem"] = "%.0f GiB" % (kb / 1024 / 1024)
        except OSError:
            m["mem"] = "?"
        p = subprocess.run(["df", "-T", self.tmp], capture_output=True, timeout=10)
        lines = p.stdout.decode().splitlines()
        m["fs"] = (lines[-1].split()[1] + " (" + lines[-1].split()[0] + ")") if len(lines) > 1 else "?"
        p = subprocess.run(["wrk", "-v"], capture_output=True, timeout=10)
        m["wrk"] = (p.stdout.decode() + p.stderr.decode()).split("[")[0].strip() or "wrk"
        m["commit"] = read_head()
        m["loadavg_start"] = read_loadavg()
        m["nofile"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.r["meta"] = m

    def wait_idle(self):
        """Waits (up to --wait-idle seconds) until other work leaves the CPUs mostly idle."""
        deadline = time.monotonic() + self.args.wait_idle
        busy = cpu_busy(2.0)
        while busy > 0.25 and time.monotonic() < deadline:
            say("the machine is %.0f%% busy with other work; waiting for it to calm down" % (
                busy * 100))
            busy = cpu_busy(5.0)
        self.r["meta"]["busy_at_start"] = busy
        if busy > 0.25:
            self.note("other work kept the CPUs %.0f%% busy right before the run: it shares the "
                      "2 cores and the disk with the benchmark, so the absolute numbers are low "
                      "and noisy; the ratios compare runs of the same minutes" % (busy * 100))

    def run(self):
        self.meta()
        self.wait_idle()
        self.baseline_commit()
        c = self.r["commit"]
        self.r["meta"]["sqlite"] = c.get("sqlite-1", {}).get("sqlite_version", "?")
        if "postgresql-1" in c:
            self.r["meta"]["postgresql"] = "PostgreSQL " + c["postgresql-1"].get(
                "server_version", "?")
        stores = self.args.stores.split(",")
        if "sqlite" in stores:
            self.store_run("sqlite")
        if self.pg_admin and "postgresql" in stores:
            self.store_run("postgresql")
        elif "postgresql" in stores:
            self.note("PostgreSQL was not measured: IDEM_TEST_PG_URI is not set (make bench "
                      "runs this under tests/pg/with_pg.sh)")
        if "sqlite" in stores:
            self.r["slowloris"] = self.slowloris("sqlite")
        self.targets()
        if self.args.profile:
            self.profiles()
            self.readings()
        self.write()


def read_head():
    """The checked-out commit, read from .git without running git (best effort)."""
    try:
        with open(os.path.join(REPO, ".git", "HEAD")) as f:
            head = f.read().strip()
        if not head.startswith("ref: "):
            return head[:12]
        ref = head[5:]
        path = os.path.join(REPO, ".git", ref)
        if os.path.exists(path):
            with open(path) as f:
                return "%s %s" % (ref.rsplit("/", 1)[-1], f.read().strip()[:12])
        with open(os.path.join(REPO, ".git", "packed-refs")) as f:
            for ln in f:
                if ln.strip().endswith(" " + ref):
                    return "%s %s" % (ref.rsplit("/", 1)[-1], ln.split()[0][:12])
    except OSError:
        pass
    return "unknown"


def main():
    ap = arg_parser(__doc__, connections=16, wait_idle=60.0)
    ap.add_argument("--stores", default="sqlite,postgresql",
                    help="which stores to run (comma-separated), for a partial run by hand")
    args = parse_args(ap)

    # 10,000 connections need as many descriptors in wrk and in orderd (which raises its own
    # soft limit to fit --max-connections, within the hard limit it inherits from here).
    nofile = raise_nofile(NOFILE_WANT)
    b = Bench(args)
    if nofile < RSS_CONNECTIONS + 1024:
        b.note("the open-file limit is %d (hard limit reached): %s connections may not all "
               "open" % (nofile, "{:,}".format(RSS_CONNECTIONS)))
    return run_to_end(b, DEADLINE_S)


if __name__ == "__main__":
    sys.exit(main())
