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
