# SPDX-License-Identifier: Apache-2.0
"""
bench_pg.py - PostgreSQL for the benchmarks: psql of the throw-away cluster
tests/pg/with_pg.sh started, its WAL statistics, and a sampler of what the backends wait on.
"""

import os
import subprocess
import threading
import time
import urllib.parse

from bench_procs import BenchError


def pg_bin(program):
    return os.path.join(os.environ.get("IDEM_TEST_PG_BIN") or "/usr/lib/postgresql/15/bin",
                        program)


def psql(uri, sql, timeout=60):
    p = subprocess.run([pg_bin("psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d",
                        uri, "-c", sql], capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise BenchError("psql %r: %s" % (sql[:80], p.stderr.decode("utf-8", "replace")))
    return p.stdout.decode("utf-8", "replace").strip()


def pg_uri_with_db(uri, dbname):
    u = urllib.parse.urlsplit(uri)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + dbname, u.query, u.fragment))


def pg_wal_stats(admin_uri):
    """Cluster-wide WAL syncs and commits so far (pg_stat_wal, pg_stat_database)."""
    row = psql(admin_uri, "SELECT (SELECT wal_sync FROM pg_stat_wal), "
                          "(SELECT sum(xact_commit) FROM pg_stat_database)")
    sync, commits = row.split("|")
    return int(sync), int(commits)


class PgWaitSampler:
    """
    What the backends of one database are doing, sampled every 20 ms from pg_stat_activity by one
    psql session: running, waiting on a lock, on the WAL, idle in a transaction (orderd is
    working between two statements) or idle (waiting for orderd's next request).
    """

    QUERY = ("SELECT state, coalesce(wait_event_type, '-'), coalesce(wait_event, '-'), count(*) "
             "FROM pg_stat_activity WHERE datname = current_database() AND pid <> "
             "pg_backend_pid() AND backend_type = 'client backend' GROUP BY 1, 2, 3;\n"
             "SELECT pg_sleep(0.02);\n")

    def __init__(self, uri, max_samples=1500):
        self.uri = uri
        self.max_samples = max_samples
        self.p = None

    def start(self):
        self.p = subprocess.Popen([pg_bin("psql"), "-X", "-q", "-A", "-t", "-d", self.uri],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL)
        self.out = []
        self.reader = threading.Thread(target=lambda: self.out.append(self.p.stdout.read()),
                                       daemon=True)
        self.reader.start()
        self.writer = threading.Thread(target=self.feed, daemon=True)
        self.halt = threading.Event()
        self.writer.start()

    def feed(self):
        try:
            for _ in range(self.max_samples):
                if self.halt.is_set():
                    break
                self.p.stdin.write(self.QUERY.encode())
                self.p.stdin.flush()
                time.sleep(0.02)
            self.p.stdin.close()
        except (BrokenPipeError, ValueError):
            pass

    def stop(self):
        """Returns {"state / wait": share of the samples}."""
        self.halt.set()
        self.writer.join(10)
        try:
            self.p.wait(20)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(5)
        self.reader.join(5)
        counts = {}
        text = b"".join(x for x in self.out if x).decode("utf-8", "replace")
        for ln in text.splitlines():
            parts = ln.split("|")
            if len(parts) != 4:
                continue
            state, wtype, wev, n = parts
            label = state if wtype == "-" else "%s, waiting on %s:%s" % (state, wtype, wev)
            counts[label] = counts.get(label, 0) + int(n)
        total = sum(counts.values()) or 1
        return {k: v / total for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}


# ---- PostgreSQL's own account of one run --------------------------------------------------------

PG_STATS_FLUSH_S = 1.5  # backends publish their table and WAL counters at most once a second


def postmaster_pid(data_dir=None):
    """The cluster's postmaster, from postmaster.pid in its data directory (None if unknown)."""
    data_dir = data_dir or os.environ.get("IDEM_TEST_PG_DATA")
    if not data_dir:
        return None
    try:
        with open(os.path.join(data_dir, "postmaster.pid")) as f:
            return int(f.readline().strip())
    except (OSError, ValueError):
        return None


def cluster_cpu_seconds(pid):
    """
    CPU of a whole PostgreSQL cluster so far: the postmaster, its live children (backends,
    WAL writer, checkpointer, autovacuum, WAL senders) and, through the postmaster's cutime and
    cstime, every child it has already reaped.
    """
    if pid is None:
        return None
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        own = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    except (OSError, IndexError, ValueError):
        return None
    from bench_proc_stats import child_pids, cpu_seconds
    return own / os.sysconf("SC_CLK_TCK") + sum(cpu_seconds(c) for c in child_pids(pid))


class PgRunStats:
    """
    What PostgreSQL itself says of one run against one database: pg_stat_statements (calls and
    time per statement, reset at the start), pg_stat_user_tables (inserts, updates, HOT updates,
    dead tuples), pg_stat_database (commits), pg_stat_wal (WAL records, full-page images, bytes)
    and the CPU of the cluster's processes (/proc).  start() right before the load, stop(keys)
    right after it; stop returns a dict (report() prints it).  pg_stat_statements needs
    shared_preload_libraries (make bench's clusters have it): without it that part says why.
    """

    def __init__(self, admin_uri, db_uri, extra_pids=()):
        self.admin = admin_uri
        self.db = db_uri
        self.dbname = urllib.parse.urlsplit(db_uri).path.lstrip("/")
        self.extra_pids = list(extra_pids)  # other postmasters whose CPU counts (a standby)
        self.pss = None

    def cpu(self):
        total = 0.0
        for pid in [postmaster_pid()] + self.extra_pids:
            c = cluster_cpu_seconds(pid)
            if c is None:
                return None
            total += c
        return total

    def enable_statements(self):
        """CREATE EXTENSION pg_stat_statements in the admin database; the reason if it fails."""
        try:
            psql(self.admin, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            psql(self.admin, "SELECT count(*) FROM pg_stat_statements")
            return None
        except BenchError as e:
            return str(e).strip().splitlines()[-1]

    def wal(self):
        row = psql(self.admin, "SELECT wal_records, wal_fpi, wal_bytes, wal_sync FROM pg_stat_wal")
        return [int(x) for x in row.split("|")]

    def tables(self):
        out = {}
        rows = psql(self.db, "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, "
                             "n_live_tup, n_dead_tup, autovacuum_count FROM pg_stat_user_tables")
        for ln in rows.splitlines():
            f = ln.split("|")
            if len(f) == 8:
                out[f[0]] = [int(x) for x in f[1:]]
        return out

    def commits(self):
        return int(psql(self.admin, "SELECT xact_commit FROM pg_stat_database WHERE datname = "
                                    "'%s'" % self.dbname) or 0)

    def start(self):
        self.pss = self.enable_statements()
        if self.pss is None:
            psql(self.admin, "SELECT pg_stat_statements_reset()")
        time.sleep(PG_STATS_FLUSH_S)  # the counters of what ran before are published
        self.wal0, self.tab0, self.com0 = self.wal(), self.tables(), self.commits()
        self.cpu0 = self.cpu()
        self.t0 = time.monotonic()

    def stop(self, keys):
        cpu1 = self.cpu()
        seconds = time.monotonic() - self.t0
        time.sleep(PG_STATS_FLUSH_S)
        wal1, tab1, com1 = self.wal(), self.tables(), self.commits()
        keys = max(keys, 1)
        r = {"keys": keys, "seconds": seconds, "commits": com1 - self.com0}
        if cpu1 is not None and self.cpu0 is not None:
            r["cpu_s"] = cpu1 - self.cpu0
            r["cpu_us_per_key"] = r["cpu_s"] * 1e6 / keys
        dw = [b - a for a, b in zip(self.wal0, wal1)]
        r["wal"] = {"records": dw[0], "fpi": dw[1], "bytes": dw[2], "syncs": dw[3],
                    "bytes_per_key": dw[2] / keys, "records_per_key": dw[0] / keys}
        tabs = {}
        for name, v1 in tab1.items():
            v0 = self.tab0.get(name, [0] * 7)
            d = {"ins": v1[0] - v0[0], "upd": v1[1] - v0[1], "hot_upd": v1[2] - v0[2],
                 "del": v1[3] - v0[3], "live": v1[4], "dead": v1[5],
                 "autovacuums": v1[6] - v0[6]}
            if d["ins"] or d["upd"] or d["del"] or d["dead"]:
                tabs[name] = d
        r["tables"] = tabs
        idem = [d for n, d in tabs.items() if n.startswith("idem_")]
        upd = sum(d["upd"] for d in idem)
        r["idem_updates"] = upd
        r["idem_hot_share"] = sum(d["hot_upd"] for d in idem) / upd if upd else None
        if self.pss is None:
            rows = psql(self.admin, "SELECT calls, total_exec_time, mean_exec_time, rows, "
                                    "wal_bytes, regexp_replace(query, '\\s+', ' ', 'g') FROM "
                                    "pg_stat_statements WHERE dbid = (SELECT oid FROM "
                                    "pg_database WHERE datname = '%s') AND query NOT LIKE "
                                    "'%%pg_stat_%%' ORDER BY "
                                    "total_exec_time DESC" % self.dbname)
            st = []
            for ln in rows.splitlines():
                f = ln.split("|", 5)
                if len(f) == 6:
                    st.append({"calls": int(f[0]), "total_ms": float(f[1]),
                               "mean_ms": float(f[2]), "rows": int(f[3]),
                               "wal_bytes": int(float(f[4])), "query": f[5]})
            r["statements"] = st
            r["statement_calls"] = sum(x["calls"] for x in st)
            r["statement_ms"] = sum(x["total_ms"] for x in st)
        else:
            r["statements_missing"] = self.pss
        return r


def pg_stats_summary(r):
    """One line: CPU, commits, statements, WAL and HOT per key of a PgRunStats result."""
    k = r["keys"]
    parts = []
    if "cpu_us_per_key" in r:
        parts.append("PostgreSQL CPU %.0f µs/key" % r["cpu_us_per_key"])
    parts.append("%.2f keys/commit" % (k / max(r["commits"], 1)))
    if "statement_calls" in r:
        parts.append("%.2f statements/key, %.0f µs executing/key" % (
            r["statement_calls"] / k, r["statement_ms"] * 1e3 / k))
    parts.append("WAL %.0f B/key (%.1f records, %d full-page images)" % (
        r["wal"]["bytes_per_key"], r["wal"]["records_per_key"], r["wal"]["fpi"]))
    if r["idem_hot_share"] is not None:
        parts.append("HOT %.0f%% of %d updates" % (r["idem_hot_share"] * 100, r["idem_updates"]))
    return ", ".join(parts)


def pg_stats_markdown(title, r, top=8):
    """A report section: the tables' counters and the top statements by total time."""
    k = r["keys"]
    L = ["", "### PostgreSQL's account: %s" % title, "",
         "%d keys in %.1f s; %s." % (k, r["seconds"], pg_stats_summary(r)), "",
         "`pg_stat_user_tables` (counters over the run; live and dead tuples at its end):", "",
         "| table | inserts | updates | HOT updates | HOT share | deletes | live | dead | "
         "autovacuums |", "|---|---|---|---|---|---|---|---|---|"]
    for name, d in sorted(r["tables"].items()):
        L.append("| %s | %d | %d | %d | %s | %d | %d | %d | %d |" % (
            name, d["ins"], d["upd"], d["hot_upd"],
            "%.0f%%" % (d["hot_upd"] * 100 / d["upd"]) if d["upd"] else "—", d["del"],
            d["live"], d["dead"], d["autovacuums"]))
    w = r["wal"]
    L += ["", "`pg_stat_wal`: %d records, %d full-page images, %d bytes (%.0f per key), %d "
              "syncs." % (w["records"], w["fpi"], w["bytes"], w["bytes_per_key"], w["syncs"])]
    if "statements" in r:
        L += ["", "`pg_stat_statements`, top %d of %d statements by total time (%d calls, "
                  "%.0f ms in all):" % (min(top, len(r["statements"])), len(r["statements"]),
                                         r["statement_calls"], r["statement_ms"]), "",
              "| calls | per key | total ms | mean µs | rows | WAL bytes | statement |",
              "|---|---|---|---|---|---|---|"]
        for s in r["statements"][:top]:
            q = s["query"] if len(s["query"]) <= 160 else s["query"][:157] + "..."
            L.append("| %d | %.2f | %.0f | %.1f | %d | %d | `%s` |" % (
                s["calls"], s["calls"] / k, s["total_ms"], s["mean_ms"] * 1e3, s["rows"],
                s["wal_bytes"], q.replace("|", "\\|").replace("`", "'")))
    else:
        L += ["", "`pg_stat_statements` not read: %s" % r.get("statements_missing")]
    return L


class SyncStandby:
    """
    A synchronous standby of the bench cluster on the same machine: pg_basebackup -R of the
    primary into a temp directory, a second server started from it on a free loopback port (a
    plain streaming replica; no Patroni), then the primary's synchronous_standby_names = '*' so
    that every commit waits until the standby has flushed it (synchronous_commit = on).  stop()
    makes the primary asynchronous again, stops the standby by its data directory and removes it.
    """

    def __init__(self, admin_uri):
        self.admin = admin_uri
        self.os_user = os.environ.get("IDEM_TEST_PG_OS_USER") or ""
        self.dir = None
        self.postmaster = None
        self.started = False

    def as_owner(self, cmd):
        return (["runuser", "-u", self.os_user, "--"] if self.os_user else []) + cmd

    def run(self, cmd, timeout=120):
        p = subprocess.run(self.as_owner(cmd), capture_output=True, timeout=timeout)
        if p.returncode != 0:
            raise BenchError("%s: %s" % (os.path.basename(cmd[0]), (
                p.stderr or p.stdout).decode("utf-8", "replace")[-600:]))

    def start(self):
        import shutil
        import tempfile
        from bench_procs import free_port
        u = urllib.parse.urlsplit(self.admin)
        self.dir = tempfile.mkdtemp(prefix="idem-standby.")
        os.chmod(self.dir, 0o755)  # the server's user writes its data and socket here
        if self.os_user:
            shutil.chown(self.dir, self.os_user)
        data = os.path.join(self.dir, "data")
        self.run([pg_bin("pg_basebackup"), "-h", u.hostname, "-p", str(u.port), "-U",
                  u.username or "postgres", "-D", data, "-X", "stream", "-R",
                  "--checkpoint=fast", "--no-sync"])
        self.port = free_port()
        self.run([pg_bin("pg_ctl"), "-D", data, "-l", os.path.join(self.dir, "server.log"), "-w",
                  "-t", "60", "-o", "-k %s -c listen_addresses=127.0.0.1 -p %d -c fsync=on "
                  "-c cluster_name=bench_standby" % (self.dir, self.port), "start"])
        self.started = True
        self.data = data
        self.postmaster = postmaster_pid(data)
        psql(self.admin, "ALTER SYSTEM SET synchronous_standby_names = '*'")
        psql(self.admin, "SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        while True:
            state = psql(self.admin, "SELECT string_agg(application_name || ' ' || state || "
                                     "' ' || sync_state, ', ') FROM pg_stat_replication")
            if state.endswith(" streaming sync"):
                self.state = state
                return state
            if time.monotonic() > deadline:
                raise BenchError("the standby did not become synchronous: %r" % state)
            time.sleep(0.2)

    def stop(self):
        import shutil
        try:
            psql(self.admin, "ALTER SYSTEM RESET synchronous_standby_names")
            psql(self.admin, "SELECT pg_reload_conf()")
        finally:
            if self.started:
                try:
                    self.run([pg_bin("pg_ctl"), "-D", self.data, "-m", "immediate", "-w",
                              "stop"])
                except BenchError:
                    if self.postmaster:
                        os.kill(self.postmaster, 9)
                self.started = False
            if self.dir:
                shutil.rmtree(self.dir, ignore_errors=True)
                self.dir = None
