#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
gateway_bench.py - the gateway's benchmark: what idem-gateway costs in front of an upstream that
answers at once (bench/static_http.c), against that upstream alone and against nginx's
proxy_pass to it, as ratios of runs taken in the same session, A-B-A.

  R  replays       the same keyed POST through the gateway (one warm-up request, then every
                   request is a replay) ÷ the same request sent to the upstream directly
  F  fresh keys    a new Idempotency-Key per request through the gateway (SQLite store, durable)
                   ÷ nginx proxy_pass (keep-alive upstream connections, 2 workers); p50 of both
  P  pass-through  GET /static (on no route) through the gateway ÷ nginx proxy_pass
  T  over TLS      P again over HTTPS kept alive: a second gateway with listen_tls ÷ nginx
                   terminating TLS (the same certificate, ECDSA P-256) before proxy_pass
  H  handshakes    GET /static, each on a new connection with a full TLS 1.3 handshake (no
                   session resumed; bench/handshakes.c): that gateway ÷ that nginx
  FT fresh keys    F through the TLS gateway ÷ F through the plain one (no target)
     over TLS
  F on PostgreSQL  F with the gateway on a fresh PostgreSQL database, when IDEM_TEST_PG_URI is
                   set (make bench-gateway runs this under with_pg.sh): the ratio is information;
                   PostgreSQL's own account of the gateway's run (bench_pg.PgRunStats) gives the
                   targets per fresh key: PostgreSQL's CPU ≤ 45 µs, ≥ 90% of completions HOT,
                   and the gateway's CPU ≤ 45 µs; WAL bytes per key as information

Every ratio is gateway ÷ the mean of the reference run before and after it (A-B-A), so a steady
drift of other work on the machine cancels.  A target not met is profiled afterwards while the
scenario runs again: `perf record --call-graph dwarf -p <gateway pid>` and `perf trace -s -p`.
The TLS servers' certificate comes from a throw-away CA made with `openssl` in the temp dir
(tests/service/tls_ca.py).  Everything listens on 127.0.0.1, every load is bounded in time, every
process is stopped by its PID.  Standard library only; the helpers are bench/bench.py's.
docs/bench.md ("idem-gateway") says what each number means.

  python3 bench/gateway_bench.py --bin build-bench/bin [--out bench/results] [--seconds 5]
                                 [--connections 16] [--no-profile] [--wait-idle 30]

BENCH_KEEP=1 keeps the temp directory (configs, logs, the SQLite file, perf data).
"""

import json
import os
import re
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import types
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(os.path.dirname(HERE), "tests", "service"))
import bench as B  # noqa: E402  (bench/bench.py: processes, wrk, nginx, PostgreSQL, /proc)
from tls_ca import TlsCa  # noqa: E402  (the tests' throw-away CA)
from bench_fmt import fmt_ms, fmt_rate, fmt_ratio, fmt_us, mean  # noqa: E402
from bench_procs import nginx_path  # noqa: E402

LUA_GATEWAY = os.path.join(HERE, "lua", "gateway.lua")
ROUTE_PATH = "/v1/things"
OPERATION = "things.create"
UNROUTED_PATH = "/static"
CONSUMER = "bench"
REPLAY_KEY = "gw-replay-1"
PERF_FREQ = 499  # samples per second and thread, each with 8 KiB of stack for DWARF unwinding
DEADLINE_S = 900  # a hard stop for the whole run, far above its expected ~2 minutes

# The targets: the gateway's throughput ÷ the reference's, same session.
T_REPLAY = 1.0   # replays ÷ the upstream answering the same request directly
T_FRESH = 0.5    # fresh keyed requests (SQLite, durable) ÷ nginx proxy_pass
T_PASS = 0.8     # unkeyed pass-through ÷ nginx proxy_pass
T_TLS_PASS = 0.9       # unkeyed pass-through over HTTPS kept alive ÷ nginx terminating TLS
T_TLS_HANDSHAKE = 0.8  # new connections, each a full TLS 1.3 handshake, ÷ nginx
# The fresh-path targets for a fresh keyed request through the gateway on SQLite.
T28_FRESH = 0.40    # F ÷ nginx proxy_pass
T28_CPU_US = 70     # the gateway's CPU per request
T28_FUTEX = 4       # futex calls of the gateway's threads per request
# A fresh keyed request through the gateway on PostgreSQL, by PostgreSQL's own account.
T_PG_CPU_US = 45    # the CPU of the cluster's processes per fresh key
T_PG_HOT = 0.90     # the share of the record's updates (completions) that are HOT
T_PG_GW_CPU_US = 45  # the gateway's own CPU per fresh key

# nginx's TLS 1.2 suites: the gateway's (src/http/tls.c); TLS 1.3's are both servers' defaults.
TLS12_CIPHERS = ("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
                 "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
                 "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305")

say = B.say


class GatewayBench(B.Bench):
    """bench.py's Bench for its helpers: start/stop by PID, wrk, databases, meta, clean-up."""

    def __init__(self, args):
        super().__init__(args)
        self.gateway = os.path.join(self.bin, "idem-gateway")
        self.r = {"scenarios": {}, "targets": [], "info": [], "notes": [], "profiles": {}}
        self.upstream = None
        self.nginx = None
        self.nginx_tls = None
        self.gw_tls = None
        self.handshakes = os.path.join(self.bin, "handshakes")
        self.cert = None          # the server certificate (tls_ca.Issued) of both TLS servers
        self.tls_client = None    # an ssl.SSLContext trusting the bench's CA, for the probes

    def call(self, url, method, path, body=None, headers=None):
        """One request (bench_http.http_call), over TLS trusting the bench's CA for https."""
        return B.http_call(url, method, path, body, headers, context=self.tls_client)

    # -- servers --

    def start_upstream(self):
        p = self.start("upstream", [self.static_http, "--listen", "127.0.0.1:0",
                                    "--max-connections-per-ip", "-1"])
        st, hdrs, body = self.call(p.url, "POST", ROUTE_PATH, B.ORDER_BODY, {
            "Content-Type": "application/json", "X-Consumer-Id": CONSUMER,
            "Idempotency-Key": "probe"})
        st2, _, body2 = self.call(p.url, "GET", UNROUTED_PATH)
        if st != 201 or st2 != 201 or body2 != body:
            raise B.BenchError("static_http does not answer every method and path alike: POST "
                               "%d, GET %d" % (st, st2))
        self.upstream_answer = body
        return p

    def make_certificate(self):
        """A throw-away CA and a server certificate for 127.0.0.1 (ECDSA P-256), in the temp
        dir; both TLS servers present its chain (leaf + CA)."""
        self.cert = TlsCa(self.tmp, name="bench").server("bench")
        ca = os.path.join(os.path.dirname(self.cert.cert), "ca.crt")
        self.tls_client = ssl.create_default_context(cafile=ca)
        self.tls_client.set_alpn_protocols(["http/1.1"])

    def start_gateway(self, name, store_uri, tls=False):
        """idem-gateway with one route (POST /v1/things) in front of the upstream; with `tls`,
        its listener speaks HTTPS only (listen_tls) with the bench's certificate."""
        extra = ""
        if tls:
            extra = "listen_tls:\n  cert_file: %s\n  key_file: %s\n" % (
                json.dumps(self.cert.chain), json.dumps(self.cert.key))
        p = self.start_gateway_route(name, self.gateway, self.upstream.url, store_uri,
                                     "header: X-Consumer-Id", ROUTE_PATH, OPERATION, extra=extra)
        # A keyed POST executes once and replays; an unrouted GET passes through.
        key = "probe-" + uuid.uuid4().hex[:8]
        for want in ("executed", "replayed"):
            st, hdrs, body = self.call(p.url, "POST", ROUTE_PATH, B.ORDER_BODY, {
                "Content-Type": "application/json", "X-Consumer-Id": CONSUMER,
                "Idempotency-Key": key})
            replayed = hdrs.get("idempotent-replayed") == "true"
            if st != 201 or body != self.upstream_answer or replayed != (want == "replayed"):
                self.stop(p)
                raise B.BenchError("%s: a keyed POST answered %d (%s expected): %r" % (
                    name, st, want, body[:200]))
        st, _, body = self.call(p.url, "GET", UNROUTED_PATH)
        if st != 201 or body != self.upstream_answer:
            self.stop(p)
            raise B.BenchError("%s: GET %s answered %d: %r" % (name, UNROUTED_PATH, st,
                                                               body[:200]))
        return p

    def start_nginx(self):
        """
        nginx, 2 workers, proxy_pass to the upstream over kept-alive connections, on two ports:
        plain HTTP (self.nginx), and HTTPS with the bench's certificate (self.nginx_tls, the same
        process) in front of the same upstream block.
        """
        nginx = nginx_path()
        if nginx is None:
            raise B.BenchError("nginx is not installed (scripts/deps.sh bench installs "
                               "nginx-light)")
        port, tls_port = B.free_port(), B.free_port()
        conf, d = B.write_nginx_conf(
            os.path.join(self.tmp, "nginx"), "bench/gateway_bench.py: a proxy to the gateway's "
            "upstream", """    upstream backend {
        server %(up)s;
        keepalive 64;
        keepalive_requests 10000000;
    }
    server {
        listen 127.0.0.1:%(port)d;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
    server {
        listen 127.0.0.1:%(tls_port)d ssl;
        ssl_certificate %(cert)s;
        ssl_certificate_key %(key)s;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_ciphers %(ciphers)s;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
""" % {"port": port, "tls_port": tls_port, "up": "%s:%d" % B.split_url(self.upstream.url),
       "cert": self.cert.chain, "key": self.cert.key, "ciphers": TLS12_CIPHERS})
        p = self.start("nginx", [nginx, "-c", conf, "-p", d + "/", "-g", "daemon off;"],
                       port=port)
        # The HTTPS server: the same process (its CPU is nginx's), another URL.
        self.nginx_tls = types.SimpleNamespace(name="nginx", pid=p.pid,
                                               url="https://127.0.0.1:%d" % tls_port)
        for url in (p.url, self.nginx_tls.url):
            for method, path, body in (("POST", ROUTE_PATH, B.ORDER_BODY),
                                       ("GET", UNROUTED_PATH, None)):
                st, _, got = self.call(url, method, path, body, {
                    "Content-Type": "application/json", "X-Consumer-Id": CONSUMER,
                    "Idempotency-Key": "probe"} if body else {})
                if st != 201 or got != self.upstream_answer:
                    self.stop(p)
                    raise B.BenchError("nginx: %s %s %s answered %d: %r" % (
                        method, url, path, st, got[:200]))
        return p

    # -- one run --

    def load(self, who, mode, method, path, key, seconds=None):
        """One wrk run of gateway.lua against `who` (a Proc: the gateway, the upstream or nginx;
        its url http or https), measured as measure() says."""
        return self.measure(who, lambda: self.wrk(who.url, LUA_GATEWAY,
                                                  [mode, method, path, CONSUMER, key],
                                                  seconds=seconds))

    def load_handshakes(self, who, seconds=None):
        """
        One run of bench/handshakes.c against `who`'s https URL: GET /static, each request on a
        new connection with a full handshake (TLS 1.3), as many connections at once as wrk's
        runs have; measured as measure() says, its result in wrk_result()'s shape (its rate is
        requests answered a second, one per handshake), with the handshakes, the resumed ones
        (0 expected) and the protocol, cipher and group negotiated.
        """
        seconds = seconds or self.seconds
        host, port = B.split_url(who.url)

        def run():
            cmd = [self.handshakes, host, str(port), "--connections", str(self.conns),
                   "--threads", str(min(B.WRK_THREADS, self.conns)), "--seconds",
                   "%g" % seconds, "--path", UNROUTED_PATH, "--tls", "1.3"]
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            m0 = B.machine_cpu()
            p = subprocess.run(cmd, capture_output=True, timeout=seconds + 60)
            m1 = B.machine_cpu()
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if p.returncode != 0:
                raise B.BenchError("handshakes failed (%d): %s" % (
                    p.returncode, p.stderr.decode("utf-8", "replace")[-400:]))
            j = json.loads(p.stdout.decode())
            res = B.wrk_result({"requests": j["requests"], "duration_us": j["duration_us"],
                                "p50_us": j["p50_us"], "p90_us": j["p90_us"],
                                "p99_us": j["p99_us"], "max_us": j["max_us"],
                                "err_status": j["non2xx"],
                                "err_connect": j["err_connect"] + j["err_handshake"],
                                "err_read": j["err_read"], "err_write": j["err_write"],
                                "err_timeout": j["err_timeout"]}, self.conns, seconds)
            res["handshakes"] = j["handshakes"]
            res["handshake_errors"] = j["err_handshake"]
            res["resumed"] = j["resumed"]
            res["tls"] = "%s %s %s" % (j["protocol"], j["cipher"], j["group"])
            res["wrk_cpu_us_per_req"] = ((ru1.ru_utime + ru1.ru_stime - ru0.ru_utime -
                                          ru0.ru_stime) * 1e6 / max(res["requests"], 1))
            res["machine_busy"] = B.busy_share(m0, m1)
            return res
        return self.measure(who, run)

    def measure(self, who, run):
        """
        run() (a load against `who`: a Proc of the gateway, the upstream or nginx) with the CPU
        each of our servers used per request meanwhile, and, for a gateway, what its /metrics
        counted; for a gateway on PostgreSQL (who.pg_stats), PostgreSQL's own account
        (res["pg"]).
        """
        servers = {"gateway": None, "upstream": self.upstream, "nginx": self.nginx}
        if getattr(who, "admin", None):
            servers["gateway"] = who
        # A gateway on PostgreSQL: the cluster's own statistics of the run too (bench_pg.py).
        pgs = getattr(who, "pg_stats", None)
        if pgs is not None:
            pgs.start()
        cpu0 = {k: self.cpu(p) for k, p in servers.items() if p is not None}
        m0 = B.metrics(who.admin) if servers["gateway"] else None
        res = run()
        n = max(res["requests"], 1)
        res["cpu_us_per_req"] = {k: (self.cpu(servers[k]) - v) * 1e6 / n
                                 for k, v in cpu0.items()}
        if m0 is not None:
            m1 = B.metrics(who.admin)

            def delta(name):
                return B.metric(m1, name) - B.metric(m0, name)
            # What a fresh request waits for at least: two durable commits and the upstream.
            res["store"] = {
                "write_commits": delta("idem_gateway_store_write_commits_total"),
                "durable_commits": delta("idem_gateway_store_durable_commits_total"),
                "commit_seconds": delta("idem_gateway_store_durable_commit_seconds_total"),
                "upstream_count": delta("idem_gateway_upstream_seconds_count"),
                "upstream_seconds": delta("idem_gateway_upstream_seconds_sum")}
            res["outcomes"] = {}
            for (name, labels), v in m1.items():
                if name != "idem_gateway_requests_total":
                    continue
                d = v - m0.get((name, labels), 0.0)
                if d:
                    lab = dict(labels)
                    res["outcomes"]["%s/%s" % (lab.get("operation") or "-",
                                               lab.get("outcome"))] = int(d)
        if pgs is not None:
            # PostgreSQL's figures are per key the gateway executed (a fresh key each).
            res["pg"] = pgs.stop(res.get("outcomes", {}).get("%s/executed" % OPERATION) or n)
        return res

    def cpu(self, p):
        return B.tree_cpu_seconds(p.pid) if p is self.nginx else B.cpu_seconds(p.pid)

    def aba(self, sid, title, ref_name, ref, gw, mode, method, path, key_of, check, load=None):
        """
        Reference, gateway, reference: the ratio is the gateway ÷ the mean of the two.  Each
        run is self.load(who, mode, method, path, key_of()), or load(who) when given.
        """
        say("== %s ==" % title)
        runs = []
        for label, who in ((ref_name, ref), ("gateway", gw), (ref_name, ref)):
            res = (load(who) if load is not None else
                   self.load(who, mode, method, path, key_of()))
            res["label"] = label
            runs.append(res)
            say("%-28s %s: %7.0f req/s, p50 %s ms, p99 %s ms, non-2xx %d, socket errors %d" % (
                title, label, res["rps"], fmt_ms(res["p50_ms"]), fmt_ms(res["p99_ms"]),
                res["non2xx"], res["socket_errors"]))
        a1, g, a2 = runs
        ref_rps = max(mean([a1["rps"], a2["rps"]]), 1e-9)  # (0 when every request failed)
        ref_p50 = mean([a1["p50_ms"], a2["p50_ms"]])
        sc = {"title": title, "reference": ref_name, "runs": runs, "gateway_rps": g["rps"],
              "reference_rps": ref_rps, "ratio": g["rps"] / ref_rps,
              "gateway_p50_ms": g["p50_ms"], "reference_p50_ms": ref_p50,
              "p50_overhead_ms": g["p50_ms"] - ref_p50,
              "drift": abs(a1["rps"] - a2["rps"]) / ref_rps}
        sc["problems"] = check(g)
        for x in (a1, a2):
            if x["non2xx"] or x["socket_errors"]:
                sc["problems"].append("the %s run had %d non-2xx and %d socket errors" % (
                    x["label"], x["non2xx"], x["socket_errors"]))
        if sc["drift"] > 0.2:
            self.note("%s: the two %s runs differ by %.0f%% (other work on the machine): the "
                      "ratio is uncertain by about as much" % (title, ref_name,
                                                               sc["drift"] * 100))
        for p in sc["problems"]:
            self.note("%s: %s" % (title, p))
        self.r["scenarios"][sid] = sc
        say("%s: gateway ÷ %s = %.2f×" % (title, ref_name, sc["ratio"]))
        return sc

    @staticmethod
    def checker(outcome, operation=OPERATION):
        """Every request the gateway answered in the run must have ended as `outcome`."""
        def check(res):
            out = []
            if res["non2xx"] or res["socket_errors"]:
                out.append("the gateway run had %d non-2xx answers and %d socket errors" % (
                    res["non2xx"], res["socket_errors"]))
            got = res.get("outcomes", {})
            want = "%s/%s" % (operation or "-", outcome)
            others = {k: v for k, v in got.items() if k != want}
            # wrk does not count requests still in flight when it stops; the gateway may have.
            if got.get(want, 0) < res["requests"] or others:
                out.append("the gateway counted %r for %d answers (all %s expected)" % (
                    got, res["requests"], want))
            return out
        return check

    # -- scenarios --

    def scenarios(self):
        self.upstream = self.start_upstream()
        gw = self.start_gateway("gateway-sqlite",
                                "sqlite:" + os.path.join(self.tmp, "gateway-sqlite.db"))
        self.gw_sqlite = gw
        self.make_certificate()
        self.nginx = self.start_nginx()
        # R: the warm-up creates the record; from then on every request is a replay.
        st, hdrs, _ = self.call(gw.url, "POST", ROUTE_PATH, B.ORDER_BODY, {
            "Content-Type": "application/json", "X-Consumer-Id": CONSUMER,
            "Idempotency-Key": REPLAY_KEY})
        if st != 201:
            raise B.BenchError("the replay warm-up answered %d" % st)
        self.aba("replay", "R replays", "upstream direct", self.upstream, gw, "fixed", "POST",
                 ROUTE_PATH, lambda: REPLAY_KEY, self.checker("replayed"))
        self.aba("fresh-sqlite", "F fresh keys, SQLite", "nginx", self.nginx, gw, "fresh",
                 "POST", ROUTE_PATH, lambda: "f" + uuid.uuid4().hex[:8],
                 self.checker("executed"))
        self.r["futex"] = self.futex_per_request(gw)
        self.aba("pass", "P pass-through", "nginx", self.nginx, gw, "none", "GET",
                 UNROUTED_PATH, lambda: "-", self.checker("passed", operation=""))
        self.tls_scenarios()
        if self.pg_admin:
            db = self.db_uri("postgresql", "gw")
            pg = self.start_gateway("gateway-postgresql", db)
            pg.pg_stats = B.PgRunStats(self.pg_admin, db)
            try:
                self.aba("fresh-postgresql", "F fresh keys, PostgreSQL", "nginx", self.nginx,
                         pg, "fresh", "POST", ROUTE_PATH, lambda: "p" + uuid.uuid4().hex[:8],
                         self.checker("executed"))
            finally:
                self.stop(pg)
        else:
            self.note("PostgreSQL was not measured: IDEM_TEST_PG_URI is not set (make "
                      "bench-gateway runs this under tests/pg/with_pg.sh)")

    def tls_scenarios(self):
        """T, H and FT: a second gateway, the same but for listen_tls, against nginx's HTTPS
        server, and against the plain gateway for fresh keys."""
        gw = self.start_gateway("gateway-tls",
                                "sqlite:" + os.path.join(self.tmp, "gateway-tls.db"), tls=True)
        self.gw_tls = gw
        # What an OpenSSL client with its defaults (wrk's, Python's) gets from each: the same.
        neg = {who.url: self.tls_probe(who.url) for who in (gw, self.nginx_tls)}
        self.r["tls_negotiated"] = {"gateway": neg[gw.url], "nginx": neg[self.nginx_tls.url]}
        t = self.aba("tls-pass", "T pass-through over TLS", "nginx", self.nginx_tls, gw, "none",
                     "GET", UNROUTED_PATH, lambda: "-", self.checker("passed", operation=""))
        if len(set(neg.values())) != 1:
            t["problems"].append("the gateway and nginx negotiated %s and %s" % (
                neg[gw.url], neg[self.nginx_tls.url]))
        h = self.aba("tls-handshake", "H new TLS connections", "nginx", self.nginx_tls, gw,
                     None, None, None, None, self.handshake_checker(), load=self.load_handshakes)
        tls = sorted({x.get("tls") for x in h["runs"]})
        if len(tls) != 1:
            h["problems"].append("the runs negotiated different parameters: %s" % ", ".join(tls))
            self.note("%s: the runs negotiated different parameters: %s" % (h["title"],
                                                                            ", ".join(tls)))
        self.aba("tls-fresh", "FT fresh keys over TLS", "gateway, plain HTTP", self.gw_sqlite,
                 gw, "fresh", "POST", ROUTE_PATH, lambda: "t" + uuid.uuid4().hex[:8],
                 self.checker("executed"))

    def tls_probe(self, url):
        """The protocol and cipher a default client negotiates with `url`, and its ALPN."""
        host, port = B.split_url(url)
        with socket.create_connection((host, port), timeout=10) as raw:
            with self.tls_client.wrap_socket(raw, server_hostname=host) as s:
                return "%s %s, ALPN %s" % (s.version(), s.cipher()[0],
                                           s.selected_alpn_protocol())

    def handshake_checker(self):
        """H's gateway run: every answer passed through, every handshake a full one."""
        passed = self.checker("passed", operation="")

        def check(res):
            out = passed(res)
            if res.get("resumed"):
                out.append("%d of %d handshakes resumed a session" % (res["resumed"],
                                                                     res["handshakes"]))
            return out
        return check

    def futex_per_request(self, gw):
        """
        futex calls per fresh keyed request: `strace -c -e trace=futex` on every
        thread of the gateway during a short fresh-key run of its own.  strace slows the calls it
        counts, so read the count per request, never the run's rate.  None without strace.
        """
        if not shutil.which("strace"):
            self.note("strace is not installed: futex calls per request not counted")
            return None
        out = os.path.join(self.tmp, "futex.strace")
        tids = sorted(os.listdir("/proc/%d/task" % gw.pid))
        cmd = ["strace", "-c", "-f", "-e", "trace=futex", "-o", out]
        for t in tids:
            cmd += ["-p", t]
        st = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached to every thread
        try:
            res = self.load(gw, "fresh", "POST", ROUTE_PATH, "fx" + uuid.uuid4().hex[:8],
                            seconds=3)
        finally:
            st.send_signal(signal.SIGINT)
            st.wait(timeout=60)
        calls = 0
        try:
            with open(out) as f:
                for line in f:
                    fields = line.split()
                    if fields and fields[-1] == "futex" and len(fields) >= 5:
                        calls = int(fields[3])
        except (OSError, ValueError):
            return None
        n = max(res["requests"], 1)
        say("futex: %d calls for %d fresh requests under strace (%.1f per request)" % (
            calls, n, calls / n))
        return {"calls": calls, "requests": n, "per_request": calls / n, "threads": len(tids)}

    def targets_issue28(self):
        """The bars for a fresh keyed request through the gateway on SQLite."""
        s = self.r["scenarios"].get("fresh-sqlite")
        if not s:
            return
        self.r["targets"].append({
            "id": "i28-fresh", "target": "F: fresh keyed requests, SQLite, ≥ %.2f× "
            "nginx proxy_pass" % T28_FRESH, "ratio": s["ratio"], "want": T28_FRESH,
            "met": s["ratio"] >= T28_FRESH and not s["problems"],
            "measured": "%.0f ÷ %.0f req/s" % (s["gateway_rps"], s["reference_rps"])})
        cpu = s["runs"][1]["cpu_us_per_req"].get("gateway")
        if cpu is not None:
            self.r["targets"].append({
                "id": "i28-cpu", "target": "the gateway's CPU per fresh request, SQLite, ≤ %d µs"
                % T28_CPU_US, "ratio": cpu / T28_CPU_US, "want": 1.0, "met": cpu <= T28_CPU_US,
                "measured": "%.0f µs" % cpu})
        fx = self.r.get("futex")
        if fx:
            self.r["targets"].append({
                "id": "i28-futex", "target": "≤ %d futex calls per fresh request"
                % T28_FUTEX, "ratio": fx["per_request"] / T28_FUTEX, "want": 1.0,
                "met": fx["per_request"] <= T28_FUTEX,
                "measured": "%.1f (strace -c, %d threads, %d requests)" % (
                    fx["per_request"], fx["threads"], fx["requests"])})

    def targets_pg(self):
        """The bars for a fresh key on PostgreSQL: its CPU, HOT completions, the gateway's CPU."""
        s = self.r["scenarios"].get("fresh-postgresql")
        if not s:
            return
        g = s["runs"][1]
        pg = g.get("pg")
        cpu = g["cpu_us_per_req"].get("gateway")
        if cpu is not None:
            self.r["targets"].append({
                "id": "pg-gw-cpu", "target": "the gateway's CPU per fresh request, PostgreSQL, "
                "≤ %d µs" % T_PG_GW_CPU_US, "ratio": cpu / T_PG_GW_CPU_US, "want": 1.0,
                "met": cpu <= T_PG_GW_CPU_US, "measured": "%.0f µs" % cpu})
        if not pg:
            return
        if "cpu_us_per_key" in pg:
            c = pg["cpu_us_per_key"]
            self.r["targets"].append({
                "id": "pg-cpu", "target": "PostgreSQL's CPU per fresh gateway key ≤ %d µs" %
                T_PG_CPU_US, "ratio": c / T_PG_CPU_US, "want": 1.0, "met": c <= T_PG_CPU_US,
                "measured": "%.0f µs (%.2f s of the cluster's processes ÷ %d keys)" % (
                    c, pg["cpu_s"], pg["keys"])})
        hot = pg["idem_hot_share"]
        self.r["targets"].append({
            "id": "pg-hot", "target": "≥ %.0f%% of the record's updates (completions) HOT" % (
                T_PG_HOT * 100), "ratio": hot / T_PG_HOT if hot is not None else None,
            "want": 1.0, "met": hot is not None and hot >= T_PG_HOT,
            "measured": "%s of %d updates of idem_* tables (pg_stat_user_tables)" % (
                "%.0f%%" % (hot * 100) if hot is not None else "no update to measure",
                pg["idem_updates"])})
        w = pg["wal"]
        self.r["info"].append({
            "what": "F fresh keys on PostgreSQL: WAL bytes per key (pg_stat_wal, whole cluster)",
            "measured": "%d bytes, %d records, %d full-page images ÷ %d keys" % (
                w["bytes"], w["records"], w["fpi"], pg["keys"]),
            "value": "%.0f B" % w["bytes_per_key"]})
        self.r["info"].append({
            "what": "F fresh keys on PostgreSQL: keys per commit (pg_stat_database)",
            "measured": "%d keys ÷ %d commits" % (pg["keys"], pg["commits"]),
            "value": "%.2f" % (pg["keys"] / max(pg["commits"], 1))})
        if "statement_calls" in pg:
            self.r["info"].append({
                "what": "F fresh keys on PostgreSQL: statements per key, and their execution "
                        "time per key (pg_stat_statements)",
                "measured": "%d calls, %.0f ms ÷ %d keys" % (
                    pg["statement_calls"], pg["statement_ms"], pg["keys"]),
                "value": "%.2f, %.0f µs" % (pg["statement_calls"] / pg["keys"],
                                             pg["statement_ms"] * 1e3 / pg["keys"])})
        else:
            self.note("pg_stat_statements was not read: %s" % pg.get("statements_missing"))

    def targets(self):
        sc = self.r["scenarios"]
        rows = (("replay", T_REPLAY, "R: replays through the gateway ≥ %.1f× the upstream "
                 "answering the same request directly" % T_REPLAY),
                ("fresh-sqlite", T_FRESH, "F: fresh keyed requests, SQLite durable, ≥ %.1f× "
                 "nginx proxy_pass" % T_FRESH),
                ("pass", T_PASS, "P: unkeyed pass-through ≥ %.1f× nginx proxy_pass" % T_PASS),
                ("tls-pass", T_TLS_PASS, "T: unkeyed pass-through over HTTPS kept alive ≥ %.1f× "
                 "nginx terminating TLS" % T_TLS_PASS),
                ("tls-handshake", T_TLS_HANDSHAKE, "H: new HTTPS connections a second, each a "
                 "full TLS 1.3 handshake, ≥ %.1f× nginx" % T_TLS_HANDSHAKE))
        for sid, want, text in rows:
            s = sc.get(sid)
            if not s:
                continue
            ok = s["ratio"] >= want and not s["problems"]
            self.r["targets"].append({
                "id": sid, "target": text, "ratio": s["ratio"], "want": want, "met": ok,
                "measured": "%.0f ÷ %.0f req/s (%s %.0f, %.0f)%s" % (
                    s["gateway_rps"], s["reference_rps"], s["reference"],
                    s["runs"][0]["rps"], s["runs"][2]["rps"],
                    "; " + "; ".join(s["problems"]) if s["problems"] else "")})
        self.targets_tls()
        for sid in ("fresh-sqlite", "fresh-postgresql"):
            s = sc.get(sid)
            if s:
                self.r["info"].append({
                    "what": "%s: p50 gateway − nginx" % s["title"],
                    "measured": "%s − %s ms" % (fmt_ms(s["gateway_p50_ms"]),
                                                fmt_ms(s["reference_p50_ms"])),
                    "value": "%+.2f ms" % s["p50_overhead_ms"]})
        for sid in ("fresh-sqlite", "fresh-postgresql"):
            s = sc.get(sid)
            c = self.commit_bound(s) if s else None
            if c:
                self.r["info"].append({
                    "what": "%s: the store's durable commit, mean (its two commits each wait at "
                            "least that)" % s["title"],
                    "measured": "%.0f commits carrying %.0f writes in %.2f s" % (
                        c["durable_commits"], c["write_commits"], c["commit_seconds"]),
                    "value": "%.2f ms" % c["commit_ms"]})
                self.r["info"].append({
                    "what": "%s: ceiling from the commits and the upstream alone, %d "
                            "connections ÷ (2 × commit + upstream), ÷ %s" % (
                                s["title"], self.conns, s["reference"]),
                    "measured": "%d ÷ (2 × %.2f + %.2f ms) = %.0f req/s" % (
                        self.conns, c["commit_ms"], c["upstream_ms"], c["ceiling_rps"]),
                    "value": fmt_ratio(c["ceiling_rps"] / max(s["reference_rps"], 1e-9))})
        self.targets_issue28()
        self.targets_pg()
        s = sc.get("fresh-postgresql")
        if s:
            self.r["info"].append({
                "what": "F fresh keys on PostgreSQL ÷ nginx proxy_pass (no target)",
                "measured": "%.0f ÷ %.0f req/s" % (s["gateway_rps"], s["reference_rps"]),
                "value": fmt_ratio(s["ratio"])})

    def targets_tls(self):
        """What H negotiated, what a handshake and TLS cost each side, and FT's ratio."""
        sc = self.r["scenarios"]
        neg = self.r.get("tls_negotiated")
        if neg:
            self.r["info"].append({
                "what": "T pass-through over TLS: negotiated by a default OpenSSL client "
                        "(gateway; nginx)", "measured": "certificate ECDSA P-256",
                "value": "%s; %s" % (neg["gateway"], neg["nginx"])})
        s = sc.get("tls-handshake")
        if s:
            tls = sorted({x.get("tls") for x in s["runs"]})
            g, refs = s["runs"][1], (s["runs"][0], s["runs"][2])
            self.r["info"].append({
                "what": "H new TLS connections: negotiated (every run), handshakes resumed",
                "measured": "certificate ECDSA P-256; %d of %d handshakes resumed" % (
                    sum(x.get("resumed", 0) for x in s["runs"]),
                    sum(x.get("handshakes", 0) for x in s["runs"])),
                "value": ", ".join(map(str, tls))})
            gcpu = g["cpu_us_per_req"].get("gateway")
            ncpu = mean([x["cpu_us_per_req"].get("nginx") for x in refs])
            if gcpu is not None and ncpu:
                self.r["info"].append({
                    "what": "H new TLS connections: CPU per connection, gateway ÷ nginx (master + "
                            "workers; the upstream's apart)",
                    "measured": "%.0f ÷ %.0f µs" % (gcpu, ncpu), "value": fmt_ratio(gcpu / ncpu)})
        s = sc.get("tls-fresh")
        if s:
            g, refs = s["runs"][1], (s["runs"][0], s["runs"][2])
            gcpu = g["cpu_us_per_req"].get("gateway")
            pcpu = mean([x["cpu_us_per_req"].get("gateway") for x in refs])
            self.r["info"].append({
                "what": "FT fresh keys through the gateway, over TLS ÷ over plain HTTP (no target)",
                "measured": "%.0f ÷ %.0f req/s; the gateway's CPU %s ÷ %s µs per request" % (
                    s["gateway_rps"], s["reference_rps"], fmt_us(gcpu), fmt_us(pcpu)),
                "value": fmt_ratio(s["ratio"])})

    def commit_bound(self, s):
        """
        What the gateway's run of a fresh-key scenario spent in the store's durable commits and
        upstream, and the throughput those alone allow: a fresh request waits for two durable
        commits in series (the claim before it goes upstream, the answer before the reply), each
        at least a whole commit, plus the upstream's answer; with a fixed number of connections
        no design of the gateway passes conns ÷ that.  None without the gateway's metrics.
        """
        st = s["runs"][1].get("store")
        if not st or st["durable_commits"] <= 0 or st["upstream_count"] <= 0:
            return None
        c = dict(st)
        c["commit_ms"] = st["commit_seconds"] * 1000 / st["durable_commits"]
        c["upstream_ms"] = st["upstream_seconds"] * 1000 / st["upstream_count"]
        c["ceiling_rps"] = self.conns * 1000 / (2 * c["commit_ms"] + c["upstream_ms"])
        return c

    # -- profiles --

    def profiles(self):
        # (the fresh-path rows share their scenario with F, profiled under its id)
        unmet = [t["id"] for t in self.r["targets"]
                 if not t["met"] and t["id"] in self.r["scenarios"]]
        if not unmet:
            return
        if not self.perf_works():
            self.note("perf does not work here: no profiles")
            return
        secs = max(3.0, self.seconds - 1)

        def wrk_load(gw, mode, method, path, key_of):
            return gw, lambda: self.load(gw, mode, method, path, key_of(), seconds=secs)
        plan = {"replay": lambda: wrk_load(self.gw_sqlite, "fixed", "POST", ROUTE_PATH,
                                           lambda: REPLAY_KEY),
                "fresh-sqlite": lambda: wrk_load(self.gw_sqlite, "fresh", "POST", ROUTE_PATH,
                                                 lambda: "pf" + uuid.uuid4().hex[:8]),
                "pass": lambda: wrk_load(self.gw_sqlite, "none", "GET", UNROUTED_PATH,
                                         lambda: "-"),
                "tls-pass": lambda: wrk_load(self.gw_tls, "none", "GET", UNROUTED_PATH,
                                             lambda: "-"),
                "tls-handshake": lambda: (self.gw_tls, lambda: self.load_handshakes(
                    self.gw_tls, seconds=secs))}
        for sid in unmet:
            gw, load = plan[sid]()
            say("profiling %s: perf record --call-graph dwarf -p %d" % (sid, gw.pid))
            prof = {"scenario": self.r["scenarios"][sid]["title"], "pid": gw.pid}
            prof["cpu"] = self.perf_record(sid, gw.pid, load)
            prof["trace"] = self.perf_trace(sid, gw.pid, load)
            self.r["profiles"][sid] = prof

    def perf_record(self, name, pid, load):
        """`perf record --call-graph dwarf -p PID` (cpu-clock: no PMU here) while load() runs."""
        data = os.path.join(self.tmp, "%s.perf" % name)
        log = open(os.path.join(self.tmp, "%s.perf.log" % name), "wb")
        # DWARF call chains: libc has no frame pointers, so chains through it (write, poll,
        # futex) would end in garbage with -g alone.
        perf = subprocess.Popen(["perf", "record", "-q", "--call-graph", "dwarf,8192", "-F",
                                 str(PERF_FREQ), "-e", "cpu-clock", "-p", str(pid), "-o", data],
                                stdout=log, stderr=log)
        time.sleep(0.5)
        try:
            res = load()
        finally:
            B.stop_perf(perf)
            log.close()
        out = {"requests": res["requests"], "rps": res["rps"],
               "gateway_cpu_us_per_req": res["cpu_us_per_req"].get("gateway")}

        def report(extra):
            p = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children"] + extra,
                               capture_output=True, timeout=300)
            return p.stdout.decode("utf-8", "replace").splitlines()

        # What the brief asks for (`perf report --stdio --no-children | head -60`), and flat
        # lists: the top symbols (self time), by library, by thread name.
        out["head60"] = [ln.rstrip() for ln in report([])[:60]]
        def flat(lines, n):
            return [ln.rstrip() for ln in lines if re.match(r"^\s+\d+\.\d+%", ln)][:n]
        out["symbols"] = flat(report(["-g", "none", "--percent-limit", "0.5",
                                      "--sort", "dso,sym"]), 30)
        out["by_dso"] = flat(report(["-g", "none", "--sort", "dso"]), 10)
        out["by_thread"] = flat(report(["-g", "none", "--sort", "pid"]), 10)
        return out

    def perf_trace(self, name, pid, load):
        """`perf trace -s -p PID` while load() runs: system calls per request."""
        path = os.path.join(self.tmp, "%s.trace" % name)
        watcher = B.TidWatcher(pid)
        perf = subprocess.Popen(["perf", "trace", "-s", "-p", str(pid), "-o", path],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        try:
            watcher.start()
            res = load()
        finally:
            B.stop_perf(perf)
            watcher.stop()
        n = max(res["requests"], 1)
        calls = B.parse_trace_summary(path, watcher.tids)
        top = sorted(calls.items(), key=lambda kv: -kv[1][0])[:12]
        return {"requests": res["requests"], "rps": res["rps"],
                "syscalls_per_req": {k: [c / n, ms / n] for k, (c, ms) in top}}

    # -- the report --

    def markdown(self):
        r, m = self.r, self.r["meta"]
        L = ["# idem-gateway benchmark, %s" % self.ts, "",
             "%s; %d cores, %s RAM; kernel %s; %s; nginx %s; commit %s. %d connections, wrk %d "
             "threads, %g s per run; the machine was %.0f%% busy with other work right before "
             "the run (load average %.2f at the start, %.2f at the end)." % (
                 m.get("cpu", "?"), m.get("cores", 0), m.get("mem", "?"), m.get("kernel", "?"),
                 m.get("wrk", "wrk"), m.get("nginx", "?"), m.get("commit", "?"), self.conns,
                 B.WRK_THREADS, self.seconds, m.get("busy_at_start", 0) * 100,
                 m.get("loadavg_start", 0), m.get("loadavg_end", 0)), "",
             "Upstream: `bench/static_http.c` (answers every method and path at once with the same "
             "190-byte JSON 201). Gateway: `idem-gateway serve` with its defaults (`--db-pool 16`, "
             "an 8 MiB replay cache, a text request log to a file) and one route, `POST %s`; "
             "store SQLite (WAL, synchronous=FULL) in a temp dir. nginx: %d workers, "
             "`proxy_pass` to an upstream block with `keepalive 64`, `proxy_http_version 1.1; "
             "proxy_set_header Connection \"\";`, access log off. TLS (T, H, FT): a second "
             "gateway, the same but for `listen_tls`, and nginx's second server (`listen ... "
             "ssl`, its defaults otherwise) in front of the same upstream block, both with one "
             "ECDSA P-256 certificate from a throw-away CA; H's client is `bench/handshakes.c` "
             "(a new connection and a full handshake per request, no session offered). Each "
             "ratio is the gateway's run ÷ the mean of the reference runs right before and "
             "right after it." % (ROUTE_PATH, B.NGINX_WORKERS), "",
             "## Targets", "", "| target | measured | ratio | met |", "|---|---|---|---|"]
        for t in r["targets"]:
            L.append("| %s | %s | %s | %s |" % (t["target"], t["measured"], fmt_ratio(t["ratio"]),
                                                "**met**" if t["met"] else "**not met**"))
        if r["info"]:
            L += ["", "Information (no target):", "", "| reading | measured | value |",
                  "|---|---|---|"]
            for i in r["info"]:
                L.append("| %s | %s | %s |" % (i["what"], i["measured"], i["value"]))
        L += ["", "## Runs", "",
              "CPU is µs per answered request of each of our processes during the run "
              "(`/proc/PID/stat`; nginx: master + workers); the client's own CPU (wrk, or "
              "handshakes for H) and how busy the whole machine was meanwhile are beside it. "
              "H's latency is from connect() to the answer's last byte.", "",
              "| scenario | run | req/s | p50 ms | p90 ms | p99 ms | non-2xx | socket err | "
              "gateway CPU | upstream CPU | nginx CPU | client CPU | machine busy | "
              "gateway counted |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for sid, s in r["scenarios"].items():
            for x in s["runs"]:
                c = x["cpu_us_per_req"]
                L.append("| %s | %s | %s | %s | %s | %s | %d | %d | %s | %s | %s | %.0f | %.0f%% | "
                         "%s |" % (
                             s["title"], x["label"], fmt_rate(x["rps"]), fmt_ms(x["p50_ms"]),
                             fmt_ms(x["p90_ms"]), fmt_ms(x["p99_ms"]), x["non2xx"],
                             x["socket_errors"],
                             fmt_us(c.get("gateway")) if x["label"].startswith("gateway")
                             else "—",
                             fmt_us(c.get("upstream")),
                             fmt_us(c.get("nginx")) if x["label"] == "nginx" else "—",
                             x["wrk_cpu_us_per_req"], x["machine_busy"] * 100,
                             ", ".join("%s %d" % kv for kv in sorted(
                                 x.get("outcomes", {}).items())) or "—"))
        pg = r["scenarios"].get("fresh-postgresql", {}).get("runs", [{}] * 3)[1].get("pg")
        if pg:
            L += ["", "## PostgreSQL", ""] + B.pg_stats_markdown(
                "the gateway's run of F fresh keys, PostgreSQL", pg)[3:]
        reading = self.reading()
        if reading:
            L += ["", "## Reading", ""] + reading
        for sid, p in r["profiles"].items():
            cpu, tr = p["cpu"], p["trace"]
            L += ["", "## Profile: %s (gateway pid %d)" % (p["scenario"], p["pid"]), "",
                  "`perf record --call-graph dwarf -F %d -e cpu-clock -p PID` for one run of "
                  "the scenario "
                  "(%d requests, %.0f req/s under perf; the gateway used %s µs of CPU per "
                  "request)." % (PERF_FREQ, cpu["requests"], cpu["rps"],
                                 fmt_us(cpu["gateway_cpu_us_per_req"])),
                  "", "By thread (tid:name):", "", "```"] + cpu["by_thread"] + [
                  "```", "", "By library:", "", "```"] + cpu["by_dso"] + [
                  "```", "", "Top symbols (self time):", "", "```"] + cpu["symbols"] + [
                  "```", "", "`perf report --stdio --no-children | head -60`:", "", "```"] + \
                cpu["head60"] + ["```", ""]
            if tr.get("syscalls_per_req"):
                L.append("System calls per request (`perf trace -s -p PID`, another run of %d "
                         "requests; calls × / ms inside, summed over the gateway's threads, "
                         "futex and epoll_wait include idle waiting): %s." % (
                             tr["requests"], ", ".join(
                                 "%s %.2f× / %.3f ms" % (k, c, ms)
                                 for k, (c, ms) in tr["syscalls_per_req"].items())))
        if r["notes"]:
            L += ["", "## Notes", ""] + ["- " + n for n in r["notes"]]
        return "\n".join(L) + "\n"

    def reading(self):
        """Per target not met: where the machine's CPU went per request, gateway vs reference."""
        out = []
        cores = self.r["meta"].get("cores") or 2
        for t in self.r["targets"]:
            if t["met"] or t["id"] not in self.r["scenarios"]:
                continue  # (the fresh-path rows: read under F's)
            s = self.r["scenarios"][t["id"]]
            g = s["runs"][1]
            refs = (s["runs"][0], s["runs"][2])
            gc = g["cpu_us_per_req"]
            ref_key = "nginx" if s["reference"] == "nginx" else None
            ref_own = mean([x["cpu_us_per_req"].get(ref_key) for x in refs]) if ref_key else 0
            ref_up = mean([x["cpu_us_per_req"].get("upstream") for x in refs])
            ref_wrk = mean([x["wrk_cpu_us_per_req"] for x in refs])
            g_all = gc.get("gateway", 0) + gc.get("upstream", 0) + g["wrk_cpu_us_per_req"]
            r_all = (ref_own or 0) + (ref_up or 0) + ref_wrk
            g_cap = cores * 1e6 / max(g_all, 1e-9)
            line = ("- **%s**: %.0f ÷ %.0f req/s. Per request the gateway used %.0f µs of CPU, "
                    "the upstream %.0f µs and wrk %.0f µs (the machine %.0f%% busy); the "
                    "reference run: %s%.0f µs in the upstream, %.0f µs in wrk (%.0f%% busy). "
                    "%d cores ÷ those µs ≈ %.0f req/s with the gateway, %.0f with the "
                    "reference. " % (
                        s["title"], s["gateway_rps"], s["reference_rps"], gc.get("gateway", 0),
                        gc.get("upstream", 0), g["wrk_cpu_us_per_req"], g["machine_busy"] * 100,
                        ("%.0f µs in nginx, " % ref_own) if ref_key else "", ref_up or 0,
                        ref_wrk, mean([x["machine_busy"] for x in refs]) * 100, cores, g_cap,
                        cores * 1e6 / max(r_all, 1e-9)))
            if s["gateway_rps"] >= 0.75 * g_cap or g["machine_busy"] >= 0.9:
                line += ("The cores were full: the gateway's CPU per request is what limits "
                         "it. ")
            else:
                line += ("The cores were not full (%.0f req/s measured of %.0f the CPU would "
                         "allow): requests wait (%d connections ÷ p50 %s ms ≈ %.0f req/s), "
                         "for the store's commits or for hand-offs between threads. " % (
                             s["gateway_rps"], g_cap, self.conns, fmt_ms(g["p50_ms"]),
                             self.conns * 1000 / max(g["p50_ms"], 1e-9)))
            c = self.commit_bound(s)
            if c:
                line += ("Each request waits for two durable commits in series (%.2f ms each on "
                         "average in this run) and the upstream (%.2f ms): %d connections allow "
                         "at most %.0f req/s (%s of %s) whatever the gateway's CPU, and that only "
                         "if every commit began the moment its request asked. " % (
                             c["commit_ms"], c["upstream_ms"], self.conns, c["ceiling_rps"],
                             fmt_ratio(c["ceiling_rps"] / max(s["reference_rps"], 1e-9)),
                             s["reference"]))
            p = self.r["profiles"].get(t["id"])
            if p:
                top = [" ".join(x.split()) for x in p["cpu"]["symbols"][:6]]
                line += "Top symbols in the gateway: %s." % "; ".join(top)
            out.append(line)
        return out

    def write(self):
        base = self.write_json("gateway")
        text = self.markdown()
        with open(base + ".md", "w") as f:
            f.write(text)
        return base + ".md", text

    def summary(self):
        L = ["", "idem-gateway, %d connections, %g s per run:" % (self.conns,
                                                                            self.seconds)]
        for t in self.r["targets"]:
            L.append("  %-9s %-72s %6s  %s" % ("MET" if t["met"] else "NOT MET", t["target"],
                                               fmt_ratio(t["ratio"]), t["measured"]))
        for i in self.r["info"]:
            L.append("  %-9s %-72s %6s  %s" % ("info", i["what"], i["value"], i["measured"]))
        for n in self.r["notes"]:
            L.append("  note: " + n)
        return "\n".join(L)

    def run(self):
        self.meta()
        if nginx_path():
            p = subprocess.run([nginx_path(), "-v"], capture_output=True, timeout=10)
            self.r["meta"]["nginx"] = (p.stderr.decode() + p.stdout.decode()).strip().split(
                "/")[-1]
        self.wait_idle()
        try:
            self.scenarios()
            self.targets()
            if self.args.profile:
                self.profiles()
        finally:
            if self.r["scenarios"]:
                path, _ = self.write()
                print(self.summary(), flush=True)
                say("report: %s (and .json)" % path)


def main():
    ap = B.arg_parser(__doc__, connections=16, wait_idle=30.0)
    args = B.parse_args(ap)
    for prog in ("idem-gateway", "static_http", "handshakes"):
        if not os.access(os.path.join(args.bin, prog), os.X_OK):
            ap.error("%s is not in %s (cmake --build build-bench --target idem-gateway "
                     "static_http handshakes)" % (prog, args.bin))
    if not shutil.which("openssl"):
        ap.error("openssl is not installed (the TLS rows' certificates)")

    return B.run_to_end(GatewayBench(args), DEADLINE_S)


if __name__ == "__main__":
    sys.exit(main())
