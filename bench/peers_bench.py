#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
peers_bench.py - the side-by-side comparison: fresh-key and replay throughput of orderd and
of idem-gateway against Node servers that do the same work, in one run, on the same cores.

  orderd        orderd serve on SQLite (synchronous=FULL, its defaults), POST /api/orders:
                the one-phase create (no --provider), durable before it answers
  gateway       idem-gateway serve (SQLite store, its defaults) with one route, POST /api/orders,
                principal `authorization: sha256`, in front of the plain Node server: durable
  orderd-pg     orderd serve on a fresh database of the PostgreSQL cluster tests/pg/with_pg.sh
  gateway-pg    started (IDEM_TEST_PG_URI), likewise; left out without it
  orderd-pg-spread
                orderd-pg again, its orders going round 1,000 products instead of all of one
                (fresh.lua's NPRODUCTS, as make bench's S1 spread): fresh keys only, for
                information: what one hot stock row costs on PostgreSQL
  gateway-pooled, gateway-pg-pooled
                the two gateways again with `upstream.keyed_connections: pooled`: keyed requests
                over kept upstream connections, not one of their own each (the default, `fresh`).
                Fresh keys only, for information: what the connection per keyed request costs
  redis-peer    bench/peers/server.js --redis: node:http behind the @node-idempotency middleware
                (@node-idempotency/core + storage-adapter-redis) on a redis-server this script
                starts with no persistence (--save '' --appendonly no): not durable
  redis-durable the same on a second redis-server with --appendonly yes --appendfsync always:
                its claims are durable (the middleware stores the completion after the answer)
  node-plain    bench/peers/server.js: the same route with no idempotency (the gateway's upstream)

Every server gets the very same request bytes from the very same wrk scripts as make bench's S1
and S2 (bench/lua/fresh.lua: a new Idempotency-Key per request; bench/lua/replay.lua: 1,000 keys
created first, then every request a replay), wrk -t2 -c64 (--connections), --seconds per run.
Each round runs every server once with fresh keys, then every idempotent one with replays; the
order is reversed in every other round, so a steady drift of other work on the machine moves every
server's mean alike.  Then, on PostgreSQL, a synchronous standby (bench_pg.SyncStandby: a
plain streaming replica on the same machine) and the PostgreSQL servers' fresh keys again, each
round beside a run of redis-durable (kind "fresh-sync").  Targets, as the ratio of the means over
the rounds: orderd and gateway fresh ≥ 0.8× redis-peer; orderd-pg and gateway-pg fresh ≥ 0.7×
redis-durable; gateway-pg with the standby ≥ 0.5× redis-durable; met only if every run of both
sides answered only 2xx, had no socket error, and the servers' own counters agree (fresh runs
executed, replay runs replayed).  Every fresh run on PostgreSQL is also measured by PostgreSQL's
own statistics (bench_pg.PgRunStats).

Everything listens on 127.0.0.1, every load is bounded in time, every process is stopped by its
PID; Redis runs in the temp dir.  The npm packages are installed into bench/peers/node_modules
(npm ci, from bench/peers/package-lock.json) when missing.  Helpers are bench/bench.py's.

  python3 bench/peers_bench.py --bin build-bench/bin [--out bench/results] [--seconds 5]
                               [--connections 64] [--rounds 2] [--node-workers 1] [--no-standby]
                               [--wait-idle 30]

--node-workers N runs each Node server as N processes (node:cluster) instead of one: Node runs
JavaScript on one thread, so one process uses at most one of the cores orderd and the gateway use.

BENCH_KEEP=1 keeps the temp directory (logs, configs, SQLite files).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench as B  # noqa: E402  (bench/bench.py: processes, orderd, tokens, wrk, /proc, metrics)
from bench_fmt import mean  # noqa: E402

PEERS = os.path.join(HERE, "peers")
SERVER_JS = os.path.join(PEERS, "server.js")
PATH = "/api/orders"
OPERATION = "orders.create"
TARGET = 0.8          # orderd and the gateway, fresh keys, ≥ 0.8× the Redis peer
TARGET_PG = 0.7       # both on PostgreSQL, fresh keys, ≥ 0.7× the durable Redis peer
TARGET_SYNC = 0.5     # the gateway on PostgreSQL with a synchronous standby, ≥ 0.5× likewise
WARM_KEYS = B.WARM_KEYS
# A hard stop for the whole run: far above its expected ~6 minutes at 5 s a run (8 at 8 s), and
# growing with --seconds and --rounds (each round runs every server up to three times).
DEADLINE_S = 1200
NPM_PACKAGES = ("@node-idempotency/core", "@node-idempotency/storage-adapter-redis", "redis")

say = B.say
fmt_rate, fmt_ms, fmt_ratio = B.fmt_rate, B.fmt_ms, B.fmt_ratio

# name: (what it is, durable, idempotent)
SERVERS = {
    "orderd": ("orderd, SQLite FULL", "yes", True),
    "gateway": ("idem-gateway (SQLite FULL) in front of plain node:http", "yes", True),
    "orderd-pg": ("orderd, PostgreSQL", "yes", True),
    "orderd-pg-spread": ("orderd, PostgreSQL, orders over 1,000 products", "yes", True),
    "gateway-pg": ("idem-gateway (PostgreSQL) in front of plain node:http", "yes", True),
    "gateway-pooled": ("idem-gateway (SQLite FULL), keyed_connections: pooled", "yes", True),
    "gateway-pg-pooled": ("idem-gateway (PostgreSQL), keyed_connections: pooled", "yes", True),
    "redis-peer": ("node:http + @node-idempotency + Redis (no persistence)", "no", True),
    "redis-durable": ("node:http + @node-idempotency + Redis, appendfsync always",
                      "claims (the completion is written after the answer)", True),
    "node-plain": ("node:http alone, no idempotency", "—", False),
}
ORDER_ALL = ["orderd", "gateway", "gateway-pooled", "orderd-pg", "orderd-pg-spread",
             "gateway-pg", "gateway-pg-pooled", "redis-peer", "redis-durable", "node-plain"]
PG_SERVERS = ("orderd-pg", "orderd-pg-spread", "gateway-pg", "gateway-pg-pooled")
# The runs with a synchronous standby: these servers, kind "fresh-sync".
SYNC_SERVERS = ("gateway-pg", "gateway-pg-pooled", "orderd-pg")
# Measured with fresh keys only, for information beside the server each varies: their replays
# would be that server's.
POOLED = {"gateway-pooled": "gateway", "gateway-pg-pooled": "gateway-pg"}
VARIANTS = dict(POOLED, **{"orderd-pg-spread": "orderd-pg"})


def is_orderd(name):
    return name.startswith("orderd")


def is_gateway(name):
    return name.startswith("gateway")


def npm_install():
    """bench/peers/node_modules from package-lock.json, when it is missing or out of date."""
    have = all(os.path.exists(os.path.join(PEERS, "node_modules", p, "package.json"))
               for p in NPM_PACKAGES)
    marker = os.path.join(PEERS, "node_modules", ".package-lock.json")
    lock = os.path.join(PEERS, "package-lock.json")
    if have and os.path.exists(marker) and os.path.getmtime(marker) >= os.path.getmtime(lock):
        return
    npm = shutil.which("npm")
    if npm is None:
        raise B.BenchError("npm is not installed (scripts/deps.sh installs nodejs and npm)")
    cmd = [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"]
    if not os.path.exists(lock):
        cmd = [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"]
    say("installing the peers' npm packages: (cd bench/peers && %s)" % " ".join(cmd[1:]))
    p = subprocess.run(cmd, cwd=PEERS, capture_output=True, timeout=600)
    if p.returncode != 0:
        raise B.BenchError("npm in bench/peers failed: %s" % p.stderr.decode("utf-8",
                                                                          "replace")[-600:])


def npm_version(name):
    try:
        with open(os.path.join(PEERS, "node_modules", name, "package.json")) as f:
            return json.load(f).get("version", "?")
    except (OSError, ValueError):
        return "?"


def redis_cmd(port, *args):
    """One command to Redis in RESP; returns the raw reply (small replies only)."""
    req = "*%d\r\n" % len(args) + "".join("$%d\r\n%s\r\n" % (len(a), a) for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(req.encode())
        s.settimeout(2)
        buf = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
                if buf.endswith(b"\r\n") and len(buf) > 4:
                    s.settimeout(0.05)
        except socket.timeout:
            pass
    return buf.decode("utf-8", "replace")


class PeersBench(B.Bench):
    def __init__(self, args):
        super().__init__(args)
        self.gateway_bin = os.path.join(self.bin, "idem-gateway")
        self.node = shutil.which("node")
        self.rounds = args.rounds
        self.node_workers = args.node_workers
        self.r = {"runs": [], "targets": [], "info": [], "notes": [], "servers": {}}
        self.srv = {}
        self.order = [n for n in ORDER_ALL if self.pg_admin or n not in PG_SERVERS]
        self.postmaster = B.postmaster_pid() if self.pg_admin else None
        self.standby = None

    def cleanup(self):
        # The last started first: the gateway before its upstream, the Redis peer before Redis.
        self.procs.reverse()
        super().cleanup()

    # -- servers --

    def start_redis(self, durable=False):
        """
        redis-server in the temp dir: with no persistence, or (durable) with its append-only
        file fsynced before every write is acknowledged (appendonly yes, appendfsync always).
        """
        name = "redis-durable" if durable else "redis"
        port = B.free_port()
        d = os.path.join(self.tmp, name)
        os.makedirs(d, exist_ok=True)
        persist = (["--appendonly", "yes", "--appendfsync", "always"] if durable else
                   ["--appendonly", "no"])
        p = self.start(name, ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                              "--save", ""] + persist + ["--dir", d,
                              "--logfile", os.path.join(d, "redis.log"),
                              "--daemonize", "no"], port=port)
        p.port = port
        save = redis_cmd(port, "CONFIG", "GET", "save")
        aof = redis_cmd(port, "CONFIG", "GET", "appendonly")
        if durable:
            fsync = redis_cmd(port, "CONFIG", "GET", "appendfsync")
            if "appendonly\r\n$3\r\nyes" not in aof or "always" not in fsync:
                raise B.BenchError("redis-server (durable) has no appendfsync always: %r %r" % (
                    aof, fsync))
        elif "appendonly\r\n$2\r\nno" not in aof or "save\r\n$0\r\n" not in save:
            raise B.BenchError("redis-server has persistence on: %r %r" % (save, aof))
        info = redis_cmd(port, "INFO", "server")
        for ln in info.splitlines():
            if ln.startswith("redis_version:"):
                self.r["meta"]["redis"] = ln.split(":", 1)[1].strip()
        return p

    def start_node(self, name, redis=None):
        cmd = [self.node, SERVER_JS, "--listen", "127.0.0.1:0", "--workers",
               str(self.node_workers)]
        if redis is not None:
            cmd += ["--redis", "redis://127.0.0.1:%d" % redis.port]
        return self.start(name, cmd)

    def start_gateway(self, name, upstream, store):
        """idem-gateway, one route POST /api/orders, in front of `upstream` (the plain server);
        for the POOLED ones, its keyed requests over kept upstream connections."""
        return self.start_gateway_route(
            name, self.gateway_bin, upstream.url, store, "authorization: sha256", PATH, OPERATION,
            upstream_extra="  keyed_connections: pooled\n" if name in POOLED else "")

    def probe(self, name, p, token, idempotent):
        """A keyed POST twice: 201 both times; the second a replay of the first where keyed."""
        key = "probe-" + uuid.uuid4().hex[:8]
        got = []
        for _ in range(2):
            st, hdrs, body = B.http_call(p.url, "POST", PATH, B.ORDER_BODY,
                                         B.order_headers(token, key))
            got.append((st, hdrs.get("idempotent-replayed") == "true", body))
            time.sleep(0.05)  # the Redis peer stores its completion after it answers
        (s1, r1, b1), (s2, r2, b2) = got
        ok = s1 == 201 and s2 == 201 and not r1 and (
            (r2 and b1 == b2) if idempotent else (not r2 and b1 != b2))
        if not ok or b"orderId" not in b1:
            raise B.BenchError("%s: a keyed POST twice answered %d %r then %d %r (%s)" % (
                name, s1, b1[:120], s2, b2[:120],
                "a replay expected" if idempotent else "two orders expected"))

    def start_all(self):
        r = self.r["servers"]
        db = self.db_uri("sqlite", "orderd")
        self.token_ = self.token(db, "bench")  # migrates the store first
        self.srv["orderd"] = self.start_orderd("orderd", db)
        self.dbs = {}
        if self.pg_admin:
            # orderd's tokens are its store's: the same token value made in the PostgreSQL one.
            self.dbs["orderd-pg"] = self.db_uri("postgresql", "orderd")
            self.token_pg = self.token(self.dbs["orderd-pg"], "bench")
            self.srv["orderd-pg"] = self.start_orderd("orderd-pg", self.dbs["orderd-pg"])
            self.dbs["orderd-pg-spread"] = self.db_uri("postgresql", "orderd-spread")
            self.token_spread = self.token(self.dbs["orderd-pg-spread"], "bench")
            self.add_products(self.dbs["orderd-pg-spread"], B.SPREAD_PRODUCTS)
            self.srv["orderd-pg-spread"] = self.start_orderd("orderd-pg-spread",
                                                             self.dbs["orderd-pg-spread"])
        self.redis = self.start_redis()
        self.redis_durable = self.start_redis(durable=True)
        self.srv["node-plain"] = self.start_node("node-plain")
        self.srv["redis-peer"] = self.start_node("redis-peer", self.redis)
        self.srv["redis-durable"] = self.start_node("redis-durable", self.redis_durable)
        for name in ("gateway", "gateway-pooled"):
            self.srv[name] = self.start_gateway(name, self.srv["node-plain"],
                                                self.db_uri("sqlite", name))
        if self.pg_admin:
            for name in ("gateway-pg", "gateway-pg-pooled"):
                self.dbs[name] = self.db_uri("postgresql", name)
                self.srv[name] = self.start_gateway(name, self.srv["node-plain"], self.dbs[name])
        for name in self.order:
            self.probe(name, self.srv[name], self.tok(name), SERVERS[name][2])
            r[name] = {"what": SERVERS[name][0], "durable": SERVERS[name][1],
                       "pid": self.srv[name].pid, "url": self.srv[name].url}
        say("servers: " + ", ".join("%s %s" % (n, self.srv[n].url) for n in self.order) +
            ", redis 127.0.0.1:%d, 127.0.0.1:%d (durable)" % (self.redis.port,
                                                              self.redis_durable.port))

    def tok(self, name):
        """The bearer token of a server's requests (orderd checks its own; the rest ignore it)."""
        if name == "orderd-pg":
            return self.token_pg
        return self.token_spread if name == "orderd-pg-spread" else self.token_

    # -- what each server counted --

    def counters(self, name):
        """{"executed": n, "replayed": n, "other": n} as the server itself counted its answers."""
        p = self.srv[name]
        if is_orderd(name) or is_gateway(name):
            metric = "orderd_requests_total" if is_orderd(name) else "idem_gateway_requests_total"
            out = {"executed": 0, "replayed": 0, "waited": 0, "other": 0}
            for (n, labels), v in B.metrics(p.url if is_orderd(name) else p.admin).items():
                lab = dict(labels)
                if n != metric or lab.get("operation") != OPERATION:
                    continue
                o = lab.get("outcome")
                out[o if o in out else "other"] += v
                if o not in out:
                    out["other:" + str(o)] = out.get("other:" + str(o), 0) + v
            return out
        st, _, body = B.http_call(p.url, "GET", "/stats")
        if st != 200:
            raise B.BenchError("%s: GET /stats answered %d" % (name, st))
        j = json.loads(body)
        return {"executed": j["executed"], "replayed": j["replayed"], "waited": 0,
                "other": j["in_progress"] + j["mismatch"] + j["rejected"] + j["errors"] +
                j["completion_errors"]}

    def cpu(self, pid):
        """CPU seconds of a server: with --node-workers > 1 a Node server's workers count too;
        a postmaster: the whole cluster's (bench_pg.cluster_cpu_seconds)."""
        if pid == self.postmaster or (self.standby and pid == self.standby.postmaster):
            return B.cluster_cpu_seconds(pid) or 0.0
        node = {self.srv[n].pid for n in ("redis-peer", "redis-durable", "node-plain")
                if n in self.srv}
        if pid in node and self.node_workers > 1:
            return B.tree_cpu_seconds(pid)
        return B.cpu_seconds(pid)

    def pids(self, name):
        """The processes whose CPU a request to `name` costs, besides wrk's."""
        out = {name: self.srv[name].pid}
        if is_gateway(name):
            out["upstream (node-plain)"] = self.srv["node-plain"].pid
        if name == "redis-peer":
            out["redis"] = self.redis.pid
        if name == "redis-durable":
            out["redis"] = self.redis_durable.pid
        if name in PG_SERVERS and self.postmaster:
            out["postgresql"] = self.postmaster
            if self.standby:
                out["standby"] = self.standby.postmaster
        return out

    # -- runs --

    def load(self, name, kind, rnd, tag=None, seconds=None, record=True):
        p = self.srv[name]
        tag = tag or "%s%d%s" % (kind[0], rnd, uuid.uuid4().hex[:6])
        pids = self.pids(name)
        # A fresh run on PostgreSQL: the cluster's own account of it too (bench_pg.py).
        pgs = None
        if name in PG_SERVERS and kind != "replay" and record:
            pgs = B.PgRunStats(self.pg_admin, self.dbs[name],
                               [self.standby.postmaster] if self.standby else ())
            pgs.start()
        c0 = self.counters(name)
        cpu0 = {k: self.cpu(v) for k, v in pids.items()}
        m0 = B.metrics(p.admin) if is_gateway(name) else None
        if kind == "replay":
            res = self.wrk(p.url, B.LUA_REPLAY, [self.tok(name), tag, str(WARM_KEYS)],
                           seconds=seconds)
        else:
            products = [str(B.SPREAD_PRODUCTS)] if name == "orderd-pg-spread" else []
            res = self.wrk(p.url, B.LUA_FRESH, [self.tok(name), tag] + products, seconds=seconds)
        n = max(res["requests"], 1)
        res["cpu_us_per_req"] = {k: (self.cpu(v) - cpu0[k]) * 1e6 / n
                                 for k, v in pids.items()}
        c1 = self.counters(name)
        res["counted"] = {k: int(c1.get(k, 0) - c0.get(k, 0)) for k in c1
                          if not k.startswith("other:") or c1.get(k, 0) - c0.get(k, 0)}
        if m0 is not None:
            m1 = B.metrics(p.admin)

            def delta(metric):
                return B.metric(m1, metric) - B.metric(m0, metric)
            res["durable_commits"] = delta("idem_gateway_store_durable_commits_total")
            res["commit_ms"] = (delta("idem_gateway_store_durable_commit_seconds_total") * 1e3 /
                                max(res["durable_commits"], 1))
            res["round_trips"] = delta("idem_gateway_store_round_trips_total")
        if pgs is not None:
            res["pg"] = pgs.stop(res["counted"].get("executed") or n)
        # The share of the machine that neither wrk nor the servers of this run used: other work
        # on the shared cores (machine_busy is /proc/stat's, over the whole run).
        cores = os.cpu_count() or 2
        ours = (sum(res["cpu_us_per_req"].values()) + res["wrk_cpu_us_per_req"]) * n / 1e6
        res["other_busy"] = max(0.0, res["machine_busy"] - ours / (cores * res["seconds"]))
        res.update({"server": name, "kind": kind, "round": rnd, "tag": tag})
        res["problems"] = self.check(res)
        if not record:
            return res
        self.r["runs"].append(res)
        say("%-10s r%d %-13s %7.0f req/s, p50 %s ms, p99 %s ms, non-2xx %d, socket errors %d, "
            "counted %s%s" % (kind, rnd, name, res["rps"], fmt_ms(res["p50_ms"]),
                              fmt_ms(res["p99_ms"]), res["non2xx"], res["socket_errors"],
                              " ".join("%s %d" % kv for kv in res["counted"].items()),
                              ("  PROBLEM: " + "; ".join(res["problems"]))
                              if res["problems"] else ""))
        return res

    def check(self, res):
        """A run counts only if all its answers were 2xx and the server counted what was asked."""
        out = []
        if res["non2xx"] or res["socket_errors"]:
            out.append("%d non-2xx answers, %d socket errors" % (res["non2xx"],
                                                                  res["socket_errors"]))
        c, n = res["counted"], res["requests"]
        # A replay that arrives while another request with the same key is in flight waits for
        # it and is answered with the stored response: orderd and the gateway count it "waited"
        # (docs/orderd.md, "Metrics").
        if res["kind"] != "replay":
            want, got, bad = "executed", c["executed"], c["replayed"] + c["waited"]
        else:
            want, got, bad = "replayed", c["replayed"] + c["waited"], c["executed"]
        # wrk does not count the requests still in flight when it stops; the server may have
        # answered them (at most one per connection).
        if not (n <= got <= n + self.conns) or bad or c["other"]:
            out.append("the server counted %s for %d answers (all %s expected)" % (
                ", ".join("%s %d" % kv for kv in c.items()), n, want))
        return out

    def warm_replays(self, name):
        """WARM_KEYS keys created (201 each) with replay.lua's key names; then checked to replay."""
        p = self.srv[name]
        tag = "rp" + uuid.uuid4().hex[:6]
        self.warm(p.url, self.tok(name), tag, WARM_KEYS)
        for i in (0, WARM_KEYS // 2, WARM_KEYS - 1):
            # (the Redis peer stores a completion after its answer: asked again until it replays)
            deadline = time.monotonic() + 5
            while True:
                st, hdrs, _ = B.http_call(p.url, "POST", PATH, B.ORDER_BODY,
                                          B.order_headers(self.tok(name), "%s-%d" % (tag, i)))
                replayed = st == 201 and hdrs.get("idempotent-replayed") == "true"
                if replayed or st not in (201, 409) or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            if not replayed:
                raise B.BenchError("%s: warmed key %s-%d does not replay (%d)" % (
                    name, tag, i, st))
        return tag

    def scenarios(self):
        self.start_all()
        # A short unmeasured fresh-key run against each, so that no server (node's JIT, the
        # caches, SQLite's WAL) meets the measured load cold.
        for name in self.order:
            self.load(name, "fresh", 0, seconds=2, record=False)
        replay_tags = {n: self.warm_replays(n) for n in self.order
                       if SERVERS[n][2] and n not in VARIANTS}
        for rnd in range(1, self.rounds + 1):
            order = self.order if rnd % 2 else list(reversed(self.order))
            for name in order:
                self.load(name, "fresh", rnd)
            for name in order:
                if name in replay_tags:
                    self.load(name, "replay", rnd, tag=replay_tags[name])
        if self.pg_admin and not self.args.no_standby:
            self.sync_standby_runs()

    def sync_standby_runs(self):
        """
        The PostgreSQL servers' fresh keys again with a synchronous standby on the same machine
        (bench_pg.SyncStandby), beside runs of the durable Redis peer in the same minutes (the
        order reversed every other round).
        """
        sb = B.SyncStandby(self.pg_admin)
        try:
            say("starting a synchronous standby (pg_basebackup -R, synchronous_standby_names)")
            state = sb.start()
            self.standby = sb
            self.r["meta"]["standby"] = state
            say("standby: %s" % state)
            names = [n for n in SYNC_SERVERS if n in self.srv] + ["redis-durable"]
            for rnd in range(1, self.rounds + 1):
                for name in names if rnd % 2 else list(reversed(names)):
                    self.load(name, "fresh-sync", rnd)
        except B.BenchError as e:
            self.note("the runs with a synchronous standby failed: %s" % e)
        finally:
            self.standby = None
            sb.stop()

    # -- the verdicts --

    def runs_of(self, name, kind):
        return [x for x in self.r["runs"] if x["server"] == name and x["kind"] == kind]

    def rate(self, name, kind):
        rs = self.runs_of(name, kind)
        return mean([x["rps"] for x in rs]), rs

    def targets(self):
        rows = [("orderd", "fresh", "redis-peer", TARGET,
                 "orderd fresh keys ≥ %.1f× the Redis peer" % TARGET),
                ("gateway", "fresh", "redis-peer", TARGET,
                 "idem-gateway (SQLite) in front of node:http, fresh keys ≥ %.1f× the Redis "
                 "peer" % TARGET)]
        if self.pg_admin:
            rows += [("gateway-pg", "fresh", "redis-durable", TARGET_PG,
                      "idem-gateway (PostgreSQL) in front of node:http, fresh keys ≥ %.1f× the "
                      "durable Redis peer" % TARGET_PG),
                     ("orderd-pg", "fresh", "redis-durable", TARGET_PG,
                      "orderd (PostgreSQL) fresh keys ≥ %.1f× the durable Redis peer" %
                      TARGET_PG)]
        if self.runs_of("gateway-pg", "fresh-sync"):
            rows.append(("gateway-pg", "fresh-sync", "redis-durable", TARGET_SYNC,
                         "idem-gateway (PostgreSQL, synchronous standby) fresh keys ≥ %.1f× the "
                         "durable Redis peer" % TARGET_SYNC))
        for name, kind, peer_name, want, label in rows:
            mine, runs = self.rate(name, kind)
            peer, peer_runs = self.rate(peer_name, kind)
            problems = [p for x in runs + peer_runs for p in
                        ("%s %s r%d: %s" % (x["server"], x["kind"], x["round"], q)
                         for q in x["problems"])]
            ratio = mine / peer if mine and peer else None
            per_round = [a["rps"] / b["rps"] for a, b in zip(runs, peer_runs)]
            self.r["targets"].append({
                "id": name, "kind": kind, "peer": peer_name, "target": label, "ratio": ratio,
                "want": want, "per_round": per_round,
                "measured": "%s ÷ %s req/s" % (fmt_rate(mine), fmt_rate(peer)),
                "met": ratio is not None and ratio >= want and not problems,
                "problems": problems})
        for name, default in POOLED.items():
            mine, runs = self.rate(name, "fresh")
            dflt, _ = self.rate(default, "fresh")
            peer_name = "redis-durable" if name in PG_SERVERS else "redis-peer"
            peer, _ = self.rate(peer_name, "fresh")
            if mine:
                self.r["info"].append({
                    "what": "%s: fresh keys over kept upstream connections (÷ the %s; ÷ %s, a "
                            "connection per keyed request)" % (
                                name, "durable Redis peer" if name in PG_SERVERS else
                                "Redis peer", default),
                    "value": "%s req/s (%s; %s)" % (fmt_rate(mine), fmt_ratio(
                        mine / peer if peer else None), fmt_ratio(mine / dflt if dflt else None))})
        mine, _ = self.rate("orderd-pg-spread", "fresh")
        one, _ = self.rate("orderd-pg", "fresh")
        durable, _ = self.rate("redis-durable", "fresh")
        if mine:
            self.r["info"].append({
                "what": "orderd-pg-spread: fresh orders over 1,000 products (÷ the durable Redis "
                        "peer; ÷ orderd-pg, every order of one product)",
                "value": "%s req/s (%s; %s)" % (fmt_rate(mine), fmt_ratio(
                    mine / durable if durable else None), fmt_ratio(mine / one if one else None))})
        for name in SYNC_SERVERS:
            if self.runs_of(name, "fresh-sync"):
                mine, _ = self.rate(name, "fresh-sync")
                alone, _ = self.rate(name, "fresh")
                peer, _ = self.rate("redis-durable", "fresh-sync")
                self.r["info"].append({
                    "what": "%s fresh keys with a synchronous standby (÷ the durable Redis peer "
                            "in the same minutes; ÷ itself without the standby)" % name,
                    "value": "%s req/s (%s; %s)" % (fmt_rate(mine), fmt_ratio(
                        mine / peer if mine and peer else None), fmt_ratio(
                        mine / alone if mine and alone else None))})
        plain, _ = self.rate("node-plain", "fresh")
        info = self.r["info"]
        # Node runs JavaScript on one thread: a peer whose process uses a whole core is bound by it.
        for name in ("redis-peer", "node-plain"):
            runs = self.runs_of(name, "fresh")
            core = mean([x["cpu_us_per_req"][name] * x["rps"] / 1e6 for x in runs])
            if core is not None:
                what = ("%s: cores used by its %d Node process(es) in the fresh runs (one "
                        "JavaScript thread each: near %d it is what limits it)" % (
                            name, self.node_workers, self.node_workers))
                info.append({"what": what, "value": "%.2f" % core})
        if peer and plain:
            info.append({"what": "Redis peer fresh ÷ node:http alone (what the middleware costs "
                                 "the peer)", "value": fmt_ratio(peer / plain)})
        for name in ("orderd", "gateway"):
            mine, _ = self.rate(name, "fresh")
            if mine and plain:
                info.append({"what": "%s fresh ÷ node:http alone" % name,
                             "value": fmt_ratio(mine / plain)})
        durable, _ = self.rate("redis-durable", "fresh")
        peer, _ = self.rate("redis-peer", "fresh")
        if durable and peer:
            info.append({"what": "durable Redis peer fresh ÷ the Redis peer without persistence "
                                 "(what appendfsync always costs it)",
                         "value": fmt_ratio(durable / peer)})
        for name in PG_SERVERS:
            runs = [x for x in self.runs_of(name, "fresh") + self.runs_of(name, "fresh-sync")
                    if x.get("pg")]
            for x in runs:
                info.append({"what": "%s %s r%d, PostgreSQL's account" % (name, x["kind"],
                                                                          x["round"]),
                             "value": B.pg_stats_summary(x["pg"])})
        peer_r, _ = self.rate("redis-peer", "replay")
        for name in ("orderd", "gateway"):
            mine, _ = self.rate(name, "replay")
            if mine and peer_r:
                info.append({"what": "%s replays ÷ Redis peer replays" % name,
                             "value": fmt_ratio(mine / peer_r)})

    def reading(self):
        """Per target not met: the CPU of one fresh request on each side, and waiting."""
        out = []
        cores = self.r["meta"].get("cores") or 2

        def cpu(runs):
            keys = runs[0]["cpu_us_per_req"].keys() if runs else []
            return {k: mean([x["cpu_us_per_req"].get(k) for x in runs]) for k in keys}

        for t in self.r["targets"]:
            if t["met"]:
                continue
            runs = self.runs_of(t["id"], t["kind"])
            peer_runs = self.runs_of(t["peer"], t["kind"])
            if not runs or not peer_runs:
                continue
            pc = cpu(peer_runs)
            pw = mean([x["wrk_cpu_us_per_req"] for x in peer_runs]) or 0
            c = cpu(runs)
            w = mean([x["wrk_cpu_us_per_req"] for x in runs]) or 0
            busy = mean([x["machine_busy"] for x in runs])
            other = mean([x["other_busy"] for x in runs]) or 0
            p50 = mean([x["p50_ms"] for x in runs])
            rps = mean([x["rps"] for x in runs])
            mine_all = sum(c.values()) + w
            peer_all = sum(pc.values()) + pw
            line = ("- **%s**: %s. CPU per fresh request: %s, wrk %.0f µs (the peer: %s, "
                    "wrk %.0f µs); %d cores ÷ all of it ≈ %.0f req/s (the peer ≈ %.0f). The "
                    "machine was %.0f%% busy, %.0f%% of it with other work (the peer's runs "
                    "%.0f%%, %.0f%%). " % (
                        t["target"], t["measured"],
                        ", ".join("%s %.0f µs" % kv for kv in c.items()), w,
                        ", ".join("%s %.0f µs" % kv for kv in pc.items()), pw, cores,
                        cores * 1e6 / max(mine_all, 1e-9), cores * 1e6 / max(peer_all, 1e-9),
                        (busy or 0) * 100, other * 100,
                        (mean([x["machine_busy"] for x in peer_runs]) or 0) * 100,
                        (mean([x["other_busy"] for x in peer_runs]) or 0) * 100))
            if busy is not None and busy >= 0.9:
                line += ("The cores were full: CPU per request is what limits it%s. " % (
                    " (and other work took %.0f%% of them: the absolute rates are low, the "
                    "ratio compares runs of the same minutes)" % (other * 100)
                    if other >= 0.15 else ""))
            else:
                line += ("The cores were not full: requests wait (%d connections ÷ p50 %s ms "
                         "≈ %.0f req/s, measured %.0f) — for durable commits or hand-offs "
                         "between threads. " % (self.conns, fmt_ms(p50),
                                                self.conns * 1000 / max(p50 or 1e-9, 1e-9),
                                                rps))
            if is_gateway(t["id"]):
                cm = mean([x.get("commit_ms") for x in runs])
                dc = mean([x.get("durable_commits", 0) / max(x["requests"], 1) for x in runs])
                rt = mean([x.get("round_trips", 0) / max(x["requests"], 1) for x in runs])
                if cm is not None:
                    line += ("Its store made %.2f durable commits per request, %.2f ms each on "
                             "average" % (dc, cm))
                    line += (", in %.2f round trips to the server per request. " % rt
                             if rt else ". ")
            for v, of in VARIANTS.items():
                vr, vruns = self.rate(v, t["kind"])
                peer, _ = self.rate(t["peer"], t["kind"])
                if of != t["id"] or not vr or not peer:
                    continue
                line += ("%s, in the same minutes: %s req/s, %s the peer (%s this server's). " % (
                    "With `keyed_connections: pooled` (%s)" % v if v in POOLED else
                    "Over 1,000 products, no one hot stock row (%s)" % v,
                    fmt_rate(vr), fmt_ratio(vr / peer), fmt_ratio(vr / rps if rps else None)))
            if t["problems"]:
                line += "Runs that do not count: %s." % "; ".join(t["problems"])
            out.append(line)
        return out

    # -- the report --

    def markdown(self):
        r, m = self.r, self.r["meta"]
        L = ["# orderd and idem-gateway beside Node peers, %s" % self.ts, "",
             "%s; %d cores, %s RAM; kernel %s; %s; node %s; redis-server %s; "
             "@node-idempotency/core %s, storage-adapter-redis %s, redis (client) %s; commit %s. "
             "wrk -t%d -c%d, %g s per run, %d round(s); %d Node process(es) per Node server; the "
             "machine was %.0f%% busy with other "
             "work right before the run (load average %.2f at the start, %.2f at the end)." % (
                 m.get("cpu", "?"), m.get("cores", 0), m.get("mem", "?"), m.get("kernel", "?"),
                 m.get("wrk", "wrk"), m.get("node", "?"), m.get("redis", "?"),
                 m.get("npm", {}).get("@node-idempotency/core", "?"),
                 m.get("npm", {}).get("@node-idempotency/storage-adapter-redis", "?"),
                 m.get("npm", {}).get("redis", "?"), m.get("commit", "?"), B.WRK_THREADS,
                 self.conns, self.seconds, self.rounds, self.node_workers,
                 m.get("busy_at_start", 0) * 100,
                 m.get("loadavg_start", 0), m.get("loadavg_end", 0)), "",
             "Every server gets the same request bytes: `bench/lua/fresh.lua` (POST /api/orders, "
             "a new Idempotency-Key per request) and `bench/lua/replay.lua` (1,000 keys created "
             "first, every request a replay). orderd: `orderd serve` on SQLite with its defaults "
             "(synchronous=FULL), no `--provider`. idem-gateway: its defaults, SQLite store, one "
             "route `POST /api/orders`, principal `authorization: sha256`, upstream the plain "
             "Node server. Redis peer: `bench/peers/server.js --redis` (node:http, "
             "@node-idempotency/core on the Redis storage adapter, wired as its Express "
             "middleware), redis-server with `--save '' --appendonly no`. Plain: "
             "`bench/peers/server.js`. Durable: the answer leaves only once what it reports is "
             "on disk. See docs/bench.md, \"Node peers\".", "",
             "## Targets", "", "| target | measured | ratio | per round | met |",
             "|---|---|---|---|---|"]
        for t in r["targets"]:
            L.append("| %s | %s | %s | %s | %s |" % (
                t["target"], t["measured"], fmt_ratio(t["ratio"]),
                " / ".join(fmt_ratio(x) for x in t["per_round"]) or "—",
                "**met**" if t["met"] else "**not met**"))
        L += ["", "## Side by side", "",
              "Means over the rounds, each round's run in brackets.", "",
              "| | fresh keys req/s | replays req/s | durable | fresh p50 / p99 ms | "
              "CPU µs per fresh request |", "|---|---|---|---|---|---|"]
        rows = [(n, "fresh", SERVERS[n][0]) for n in self.order]
        rows += [(n, "fresh-sync", SERVERS[n][0] + (", synchronous standby" if n in PG_SERVERS
                                                    else ", beside the standby runs"))
                 for n in self.order if self.runs_of(n, "fresh-sync")]
        for name, kind, what in rows:
            f, fr = self.rate(name, kind)
            rp, rr = self.rate(name, "replay") if kind == "fresh" else (None, [])
            cpu = {}
            for x in fr:
                for k, v in x["cpu_us_per_req"].items():
                    cpu.setdefault(k, []).append(v)
            cpu["wrk"] = [x["wrk_cpu_us_per_req"] for x in fr]
            L.append("| %s | **%s** (%s) | %s | %s | %s / %s | %s |" % (
                what, fmt_rate(f), " / ".join(fmt_rate(x["rps"]) for x in fr),
                ("%s (%s)" % (fmt_rate(rp), " / ".join(fmt_rate(x["rps"]) for x in rr)))
                if rr else "—", SERVERS[name][1],
                fmt_ms(mean([x["p50_ms"] for x in fr])), fmt_ms(mean([x["p99_ms"] for x in fr])),
                ", ".join("%s %.0f" % (k, mean(v)) for k, v in cpu.items())))
        if r["info"]:
            L += ["", "Information (no target):", "", "| reading | value |", "|---|---|"]
            for i in r["info"]:
                L.append("| %s | %s |" % (i["what"], i["value"]))
        L += ["", "## Runs", "", "In the order they ran. *counted* is what the server itself "
              "counted meanwhile (orderd's and the gateway's /metrics, the Node servers' "
              "/stats); a run counts only with no non-2xx, no socket error and every answer "
              "counted as asked.", "",
              "| round | kind | server | req/s | p50 ms | p90 ms | p99 ms | non-2xx | socket err | "
              "counted | machine busy | of it other work | problems |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for x in r["runs"]:
            L.append("| %d | %s | %s | %s | %s | %s | %s | %d | %d | %s | %.0f%% | %.0f%% | %s |"
                     % (
                x["round"], x["kind"], x["server"], fmt_rate(x["rps"]), fmt_ms(x["p50_ms"]),
                fmt_ms(x["p90_ms"]), fmt_ms(x["p99_ms"]), x["non2xx"], x["socket_errors"],
                ", ".join("%s %d" % kv for kv in x["counted"].items()),
                x["machine_busy"] * 100, x["other_busy"] * 100,
                "; ".join(x["problems"]) or "—"))
        pg_runs = [x for x in r["runs"] if x.get("pg")]
        if pg_runs:
            L += ["", "## PostgreSQL", "",
                  "PostgreSQL's own account of the last fresh run of each server on it "
                  "(pg_stat_statements, pg_stat_user_tables, pg_stat_wal, the cluster's CPU "
                  "from /proc%s)." % (", the standby's included in the runs with it"
                                      if self.r["meta"].get("standby") else "")]
            last = {}
            for x in pg_runs:
                last[(x["server"], x["kind"])] = x
            for (name, kind), x in last.items():
                L += B.pg_stats_markdown("%s, %s, round %d" % (name, kind, x["round"]),
                                         x["pg"])
        reading = self.reading()
        if reading:
            L += ["", "## Reading", ""] + reading
        if r["notes"]:
            L += ["", "## Notes", ""] + ["- " + n for n in r["notes"]]
        return "\n".join(L) + "\n"

    def write(self):
        base = self.write_json("peers")
        with open(base + ".md", "w") as f:
            f.write(self.markdown())
        return base + ".md"

    def summary(self):
        L = ["", "orderd and idem-gateway beside the Node peers, wrk -t%d -c%d, %g s "
             "per run, %d round(s), %d Node process(es) per Node server:" % (
                 B.WRK_THREADS, self.conns, self.seconds, self.rounds, self.node_workers),
             "", "  %-64s %12s %12s  %s" % ("", "fresh req/s", "replay req/s", "durable")]
        for name in self.order:
            f, _ = self.rate(name, "fresh")
            rp, rr = self.rate(name, "replay")
            L.append("  %-64s %12s %12s  %s" % (SERVERS[name][0], fmt_rate(f),
                                                fmt_rate(rp) if rr else "—", SERVERS[name][1]))
        for name in self.order:
            f, fr = self.rate(name, "fresh-sync")
            if fr:
                L.append("  %-64s %12s %12s" % (SERVERS[name][0] + (
                    ", sync standby" if name in PG_SERVERS else ", same minutes"), fmt_rate(f),
                    "—"))
        L.append("")
        for t in self.r["targets"]:
            L.append("  %-9s %-78s %6s  %s" % ("MET" if t["met"] else "NOT MET", t["target"],
                                               fmt_ratio(t["ratio"]), t["measured"]))
        for i in self.r["info"]:
            L.append("  %-9s %-78s %6s" % ("info", i["what"], i["value"]))
        for n in self.r["notes"]:
            L.append("  note: " + n)
        return "\n".join(L)

    def run(self):
        self.meta()
        p = subprocess.run([self.node, "--version"], capture_output=True, timeout=10)
        self.r["meta"]["node"] = p.stdout.decode().strip()
        self.r["meta"]["node_workers"] = self.node_workers
        self.r["meta"]["npm"] = {n: npm_version(n) for n in NPM_PACKAGES}
        self.wait_idle()
        try:
            self.scenarios()
            self.targets()
        finally:
            if self.r["runs"]:
                path = self.write()
                print(self.summary(), flush=True)
                say("report: %s (and .json)" % path)


def main():
    ap = B.arg_parser(__doc__, connections=64, wait_idle=30.0, profile=False)
    ap.add_argument("--rounds", type=int, default=2,
                    help="fresh and replay runs of every server, order reversed every other round")
    ap.add_argument("--no-standby", action="store_true",
                    help="skip the runs with a synchronous PostgreSQL standby")
    ap.add_argument("--node-workers", type=int, default=1,
                    help="Node processes per Node server (node:cluster); 1: plain node server.js")
    args = B.parse_args(ap, (("wrk", "wrk"), ("redis-server", "redis-server"), ("node", "nodejs")))
    if not 1 <= args.rounds <= 10:
        ap.error("--rounds must be 1..10")
    if not 1 <= args.node_workers <= 8:
        ap.error("--node-workers must be 1..8")
    for prog in ("orderd", "idem-gateway"):
        if not os.access(os.path.join(args.bin, prog), os.X_OK):
            ap.error("%s is not in %s (cmake --build <dir> --target orderd idem-gateway)" % (
                prog, args.bin))

    B.raise_nofile(4096)
    deadline = DEADLINE_S + int(3 * len(ORDER_ALL) * args.rounds * args.seconds)
    return B.run_to_end(PeersBench(args), deadline, first=npm_install)


if __name__ == "__main__":
    sys.exit(main())
