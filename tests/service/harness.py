# SPDX-License-Identifier: Apache-2.0
"""
harness.py - what every service test shares: a real `orderd` on a loopback port, a small HTTP
client that shows exactly what came back, users with tokens, and a tiny test runner.

Service tests talk to the binaries a user runs, over real HTTP, so that what they check is what a
client would notice.  Python's standard library only: the tests run on a bare Debian machine.

Environment:
  IDEM_BIN          directory holding the built programs (CTest sets it; default: <repo>/build/bin)
  IDEM_TEST_DB_URI  store URI for the servers; "{tmp}" is replaced by a fresh temp directory.
                    Default "sqlite:{tmp}/orderd.db".  A PostgreSQL run sets e.g.
                    "postgresql://postgres@127.0.0.1:55432/idem" and reuses the same tests: every
                    test works with its own freshly named users, so a shared database is fine;
                    the few tests that need an untouched catalog (p-limited's stock of 3) or the
                    SQLite file itself say "skipped" when the URI has no "{tmp}" / is not SQLite.
  IDEM_TEST_PG_URI  set by tests/pg/with_pg.sh (with IDEM_TEST_PG_BIN): when IDEM_TEST_DB_URI is
                    not set, every Server gets a FRESH PostgreSQL database of its own on that
                    cluster (CREATE DATABASE via psql), so each test sees an untouched catalog
                    exactly as with a fresh SQLite file.  CTest runs every service test this way
                    too, as service-pg.<name>.
  IDEM_TEST_KEEP    set to 1 to keep the temp directory (server logs, database) for a post-mortem.
"""

import atexit
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import tempfile
import time
import traceback
import uuid

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN = os.environ.get("IDEM_BIN") or os.path.join(REPO, "build", "bin")
ORDERD = os.path.join(BIN, "orderd")

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 30.0

LISTEN_RE = re.compile(r"orderd: listening on http://(\[[^\]]+\]|[^:/\s]+):(\d+)")

_live_servers = []


class TestFailure(AssertionError):
    """A check that failed; the message says what was expected and what came back."""


# ---- the server ------------------------------------------------------------------------------

def _db_template():
    return os.environ.get("IDEM_TEST_DB_URI") or "sqlite:{tmp}/orderd.db"


def pg_fresh_mode():
    """Under with_pg.sh without IDEM_TEST_DB_URI: a fresh PostgreSQL database per Server."""
    return bool(os.environ.get("IDEM_TEST_PG_URI")) and not os.environ.get("IDEM_TEST_DB_URI")


def db_uri_for(tmpdir):
    """The store URI for a server whose scratch space is `tmpdir` (see IDEM_TEST_DB_URI)."""
    return _db_template().replace("{tmp}", tmpdir)


def fresh_db_per_server():
    """Whether every Server gets a database of its own (seeded catalog untouched)."""
    return pg_fresh_mode() or "{tmp}" in _db_template()


def store_kind(uri=None):
    """The kind of store the servers of this run use (or `uri` names): sqlite or postgresql."""
    if uri is None:
        uri = os.environ.get("IDEM_TEST_PG_URI") if pg_fresh_mode() else _db_template()
    return "sqlite" if uri.startswith("sqlite:") else "postgresql"


# ---- PostgreSQL helpers (a cluster from tests/pg/with_pg.sh) -----------------------------------

def pg_bin(program):
    """A program of the cluster's bin directory (IDEM_TEST_PG_BIN), e.g. "psql"."""
    d = os.environ.get("IDEM_TEST_PG_BIN") or "/usr/lib/postgresql/15/bin"
    return os.path.join(d, program)


def pg_uri_with_db(uri, dbname):
    """`uri` (postgresql://user@host:port/db?opts) naming database `dbname` instead."""
    import urllib.parse
    u = urllib.parse.urlsplit(uri)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + dbname, u.query, u.fragment))


def psql(uri, script, variables=None, timeout=30, check=True):
    """
    Runs `script` (stdin, so psql interpolates :'name' variables) against `uri`; returns the rows
    as lists of strings (unaligned, tuples only, fields split on the unit separator).
    ON_ERROR_STOP is on.
    """
    cmd = [pg_bin("psql"), "-X", "-q", "-A", "-t", "-F", "\x1f", "-v", "ON_ERROR_STOP=1",
           "-d", uri]
    for k, v in (variables or {}).items():
        cmd += ["-v", "%s=%s" % (k, v)]
    try:
        p = subprocess.run(cmd, input=script.encode("utf-8"), capture_output=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TestFailure("psql did not finish in %d s: %s" % (timeout, script[:200]))
    if check and p.returncode != 0:
        raise TestFailure("psql exited %d on %r: %s" % (p.returncode, script[:300],
                                                         p.stderr.decode("utf-8", "replace")))
    out = p.stdout.decode("utf-8", "replace")
    return [line.split("\x1f") for line in out.splitlines() if line != ""]


def pg_create_database(prefix="svc"):
    """A new, empty database on the with_pg.sh cluster; returns (its URI, its name)."""
    admin = os.environ.get("IDEM_TEST_PG_URI")
    if not admin:
        raise TestFailure("IDEM_TEST_PG_URI is not set: run under tests/pg/with_pg.sh")
    name = "%s_%s" % (prefix, uuid.uuid4().hex[:16])
    psql(admin, 'CREATE DATABASE "%s";\n' % name)
    return pg_uri_with_db(admin, name), name


def pg_drop_database(name):
    admin = os.environ.get("IDEM_TEST_PG_URI")
    if admin:
        psql(admin, 'DROP DATABASE IF EXISTS "%s" WITH (FORCE);\n' % name, check=False)


# --- shard sets (docs/shards.md) -------------------------------------------------------------

SHARD_CLUSTERS = ("c1", "c2", "c3")
# The buckets of each of SHARD_CLUSTERS in the sets the tests make by hand: [lo, hi] each.
SHARD_SPLIT = ((0, 341), (342, 682), (683, 1023))


def shard_bucket(principal):
    """docs/shards.md: the first 8 bytes of SHA-256, big-endian, mod 1024."""
    return int.from_bytes(hashlib.sha256(principal.encode("utf-8")).digest()[:8], "big") % 1024


def shard_owner(bucket):
    """The index in SHARD_CLUSTERS of the cluster owning `bucket` in a set made by hand."""
    return next(i for i, (lo, hi) in enumerate(SHARD_SPLIT) if lo <= bucket <= hi)


def pg_shard_set_by_hand(prefix):
    """
    A shard set made with the SQL of docs/shards.md rather than `shards init`: a directory and
    the three SHARD_CLUSTERS, each a new database of the with_pg.sh server, the buckets split as
    SHARD_SPLIT at epoch 1, each cluster holding its idem_buckets rows (the fence's table only:
    the instance installs the rest).  Returns (directory URI, [cluster URIs], [database names]).
    """
    dir_uri, name = pg_create_database(prefix + "dir")
    names, uris = [name], []
    for c in SHARD_CLUSTERS:
        uri, name = pg_create_database(prefix + c)
        names.append(name)
        uris.append(uri)
    psql(dir_uri,
         "CREATE TABLE idem_shard_clusters (name text PRIMARY KEY, uri text NOT NULL);"
         "CREATE TABLE idem_shard_buckets (bucket integer PRIMARY KEY,"
         " cluster text NOT NULL REFERENCES idem_shard_clusters (name),"
         " epoch bigint NOT NULL, moving integer NOT NULL DEFAULT 0);" +
         "".join("INSERT INTO idem_shard_clusters VALUES ('%s', '%s');" % (c, u)
                 for c, u in zip(SHARD_CLUSTERS, uris)) +
         "".join("INSERT INTO idem_shard_buckets (bucket, cluster, epoch)"
                 " SELECT b, '%s', 1 FROM generate_series(%d, %d) b;" % (c, lo, hi)
                 for c, (lo, hi) in zip(SHARD_CLUSTERS, SHARD_SPLIT)) + "\n")
    for uri, (lo, hi) in zip(uris, SHARD_SPLIT):
        psql(uri, "CREATE TABLE idem_buckets (bucket integer PRIMARY KEY"
                  " CHECK (bucket >= 0 AND bucket < 1024),"
                  " epoch bigint NOT NULL CHECK (epoch >= 1));"
                  "INSERT INTO idem_buckets SELECT b, 1"
                  " FROM generate_series(%d, %d) b;\n" % (lo, hi))
    return dir_uri, uris, names

def db_query(uri, sql, params=()):
    """
    Runs one statement on a server's store, SQLite or PostgreSQL, as a test's back door: `?`
    placeholders, rows back as lists of strings (use RETURNING to see what an UPDATE changed).
    """
    if uri.startswith("sqlite:"):
        import sqlite3
        db = sqlite3.connect(uri[len("sqlite:"):], timeout=10)
        try:
            with db:
                rows = db.execute(sql, tuple(params)).fetchall()
        finally:
            db.close()
        return [[None if v is None else str(v) for v in row] for row in rows]
    parts = sql.split("?")
    if len(parts) - 1 != len(params):
        raise ValueError("db_query: %d placeholders, %d params" % (len(parts) - 1, len(params)))
    text = parts[0]
    variables = {}
    for i, part in enumerate(parts[1:]):
        variables["p%d" % i] = params[i]
        text += ":'p%d'" % i + part
    return psql(uri, text + ";\n", variables)


class store_locked:
    """
    A context manager that makes the server's store refuse writers while it is held, as another
    process holding a lock would: SQLite, BEGIN EXCLUSIVE on the file (everything waits);
    PostgreSQL, a psql session holding ACCESS EXCLUSIVE on idem_records (every claim and record
    read waits, for the store's lock_timeout).  Released (rolled back) on exit.
    """

    def __init__(self, uri):
        self.uri = uri
        self._sqlite = None
        self._psql = None

    def __enter__(self):
        if self.uri.startswith("sqlite:"):
            import sqlite3
            self._sqlite = sqlite3.connect(self.uri[len("sqlite:"):], timeout=10,
                                           isolation_level=None)
            self._sqlite.execute("BEGIN EXCLUSIVE")
            return self
        self._psql = subprocess.Popen(
            [pg_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.uri],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._psql.stdin.write(b"BEGIN;\nLOCK TABLE idem_records IN ACCESS EXCLUSIVE MODE;\n")
        self._psql.stdin.flush()
        deadline = time.monotonic() + 15
        while True:
            rows = psql(self.uri, "SELECT count(*) FROM pg_locks l JOIN pg_class c ON "
                        "c.oid = l.relation WHERE c.relname = 'idem_records' AND "
                        "l.mode = 'AccessExclusiveLock' AND l.granted AND l.database = "
                        "(SELECT oid FROM pg_database WHERE datname = current_database());\n")
            if rows and rows[0][0] != "0":
                return self
            if self._psql.poll() is not None or time.monotonic() > deadline:
                err = self._psql.stderr.read().decode("utf-8", "replace") \
                    if self._psql.poll() is not None else "(still running)"
                self.__exit__(None, None, None)
                raise TestFailure("could not lock idem_records with psql: %s" % err)
            time.sleep(0.05)

    def __exit__(self, *exc):
        if self._sqlite is not None:
            self._sqlite.execute("ROLLBACK")
            self._sqlite.close()
            self._sqlite = None
        if self._psql is not None:
            try:
                self._psql.stdin.write(b"ROLLBACK;\n")
                self._psql.stdin.close()
            except OSError:
                pass
            try:
                self._psql.wait(15)
            except subprocess.TimeoutExpired:
                self._psql.kill()
                self._psql.wait()
            self._psql = None
        return False


def free_port():
    """
    A loopback port free now, for a server that must be told its port before it starts (another
    process is given it first: a webhook URL, an upstream).  Drawn below the kernel's ephemeral
    range, so a process binding port 0 meanwhile -- provider-sim starting between this choice and
    orderd's bind, as once happened under ctest -j -- is never handed it; and it stays reserved
    that way across a restart of the server that holds it.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, max(ephemeral_low, 10001))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise TestFailure("no free loopback port below %d after 200 tries" % ephemeral_low)


def _describe_exit(rc):
    """A Popen return code in words: 'exit code 1' or 'signal 6 (SIGABRT)'."""
    if rc < 0:
        try:
            return "signal %d (%s)" % (-rc, signal.Signals(-rc).name)
        except ValueError:
            return "signal %d" % -rc
    return "exit code %d" % rc


def _tail(path, limit=4000):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    return text if len(text) <= limit else "..." + text[-limit:]


class Server:
    """
    One orderd process on 127.0.0.1:<ephemeral port>, its database and its logs in a temp dir.

    start() may be called again after stop() or kill9(): the new process uses the same database
    (and gets a new port; clients always ask the server for its current address).

    A subclass serves another program (gateway_harness.Gateway): it overrides serve_command(),
    `program`, `listen_re` and migrate().
    """

    program = ORDERD
    listen_re = LISTEN_RE

    def __init__(self, extra_args=(), env=None, db_uri=None, name="orderd"):
        self.name = name
        self.tmpdir = tempfile.mkdtemp(prefix="idem-svc-")
        self.pg_database = None  # the database this Server made (pg_fresh_mode), dropped at close
        if db_uri is None and pg_fresh_mode():
            db_uri, self.pg_database = pg_create_database()
        self.db_uri = db_uri or db_uri_for(self.tmpdir)
        self.extra_args = list(extra_args)
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.proc = None
        self.host = None
        self.port = None
        self.generation = 0
        self.stdout_path = None
        self.stderr_path = None
        self._ended_by_harness = False
        self._migrated = False
        _live_servers.append(self)

    # -- lifecycle --

    @property
    def base_url(self):
        return "http://%s:%d" % (self.host, self.port)

    def _run_tool(self, args, what):
        cmd = [ORDERD] + args
        try:
            p = subprocess.run(cmd, capture_output=True, timeout=30, env=self.env)
        except FileNotFoundError:
            raise TestFailure("%s: %s not found (IDEM_BIN=%s)" % (what, ORDERD, BIN))
        except subprocess.TimeoutExpired:
            raise TestFailure("%s: `%s` did not finish in 30 s" % (what, " ".join(cmd)))
        if p.returncode != 0:
            raise TestFailure("%s: `%s` exited %d\nstdout: %s\nstderr: %s" % (
                what, " ".join(cmd), p.returncode, p.stdout.decode("utf-8", "replace"),
                p.stderr.decode("utf-8", "replace")))
        return p.stdout.decode("utf-8", "replace")

    def migrate(self):
        self._run_tool(["migrate", "--db", self.db_uri], "migrate")
        self._migrated = True

    def serve_command(self):
        """The command line of one run of the server."""
        return [ORDERD, "serve", "--listen", "127.0.0.1:0", "--db", self.db_uri] + self.extra_args

    def listening(self, match):
        """Takes what the "listening" line said (a subclass may read more of it)."""
        self.host = match.group(1).strip("[]")
        self.port = int(match.group(2))

    def start(self):
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("server already running")
        if not self._migrated:
            self.migrate()
        self.generation += 1
        self._ended_by_harness = False
        self.stdout_path = os.path.join(self.tmpdir, "%s.%d.stdout" % (self.name, self.generation))
        self.stderr_path = os.path.join(self.tmpdir, "%s.%d.stderr" % (self.name, self.generation))
        cmd = self.serve_command()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            try:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                             env=self.env)
            except FileNotFoundError:
                raise TestFailure("cannot start %s (IDEM_BIN=%s)" % (self.program, BIN))
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            m = self.listen_re.search(_tail(self.stdout_path, 1 << 20))
            if m:
                self.listening(m)
                return self
            rc = self.proc.poll()
            if rc is not None:
                raise TestFailure("`%s` exited with %d before listening\nstdout: %s\nstderr: %s" % (
                    " ".join(cmd), rc, _tail(self.stdout_path), _tail(self.stderr_path)))
            if time.monotonic() > deadline:
                self._kill()
                raise TestFailure(
                    "`%s` did not print its 'listening on http://HOST:PORT' line within %.0f s\n"
                    "stdout: %s\nstderr: %s" % (" ".join(cmd), START_TIMEOUT_S,
                                                _tail(self.stdout_path), _tail(self.stderr_path)))
            time.sleep(0.02)

    def _kill(self):
        self._ended_by_harness = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout=STOP_TIMEOUT_S):
        """SIGTERM, then SIGKILL if it has not exited within `timeout`.  Returns the exit code."""
        if self.proc is None:
            return None
        self._ended_by_harness = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                sys.stderr.write("harness: %s ignored SIGTERM for %.0f s; killing it\n" % (
                    self.name, timeout))
                self._kill()
        return self.proc.returncode

    def kill9(self):
        """SIGKILL: the process gets no chance to finish anything."""
        self._ended_by_harness = True
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self):
        self.stop()
        return self.start()

    def wait_exit(self, timeout):
        """Waits for the process to exit by itself; returns its exit code or None."""
        self._ended_by_harness = True  # the test expects the exit and checks it
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def close(self):
        rc = self.proc.poll() if self.proc is not None else None
        if rc is not None and not self._ended_by_harness:
            # It ended before the harness stopped it (a crash, a sanitizer's abort, an exit, a
            # signal from elsewhere): say how, with its log, since the temp directory is about to go.
            sys.stderr.write("harness: %s had already ended (%s)\n%s\n" % (
                self.name, _describe_exit(rc), self.logs()))
        self.stop()
        if self in _live_servers:
            _live_servers.remove(self)
        if os.environ.get("IDEM_TEST_KEEP") == "1":
            sys.stderr.write("harness: kept %s\n" % self.tmpdir)
        else:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            if self.pg_database is not None:
                pg_drop_database(self.pg_database)
                self.pg_database = None

    def logs(self):
        return "stderr of %s:\n%s" % (self.name, _tail(self.stderr_path or "", 3000))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False

    # -- users --

    def create_token(self, user):
        """`orderd token create --db URI --user NAME`: the token alone on stdout."""
        out = self._run_tool(["token", "create", "--db", self.db_uri, "--user", user],
                             "token create")
        token = out.strip()
        if not token or "\n" in token or " " in token:
            raise TestFailure("token create printed %r, expected the token alone" % out)
        return token

    def new_user(self, prefix="user"):
        """A freshly named user and a client that speaks as that user."""
        name = "%s-%s" % (prefix, uuid.uuid4().hex[:10])
        return Client(self, self.create_token(name), name)

    def client(self, token=None):
        return Client(self, token)


def _cleanup_all():
    for s in list(_live_servers):
        try:
            s.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


atexit.register(_cleanup_all)


def _on_term(signum, frame):
    # CTest's timeout sends SIGTERM: leave no orderd and no temp dir behind.
    raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, _on_term)


# ---- the client --------------------------------------------------------------------------------

class Response:
    """status, headers (case-insensitive, multi-valued: http.client.HTTPMessage) and raw body."""

    def __init__(self, status, headers, body, elapsed):
        self.status = status
        self.headers = headers
        self.body = body
        self.elapsed = elapsed
        self._json = None

    def header(self, name):
        return self.headers.get(name)

    def header_all(self, name):
        return self.headers.get_all(name) or []

    @property
    def content_type(self):
        return (self.header("Content-Type") or "").split(";")[0].strip().lower()

    def json(self):
        if self._json is None:
            try:
                self._json = json.loads(self.body.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise TestFailure("response body is not JSON (%s): %s" % (e, self.describe()))
        return self._json

    @property
    def replayed(self):
        return (self.header("Idempotent-Replayed") or "").strip().lower() == "true"

    def describe(self, limit=1200):
        body = self.body.decode("utf-8", "replace")
        if len(body) > limit:
            body = body[:limit] + "...(%d bytes)" % len(self.body)
        hdrs = "; ".join("%s: %s" % (k, v) for k, v in self.headers.items())
        return "HTTP %d [%s] %s" % (self.status, hdrs, body)

    def __repr__(self):
        return "<Response %s>" % self.describe(200)


class Client:
    """Speaks HTTP/1.1 to a Server as one principal; one connection per request."""

    def __init__(self, server, token=None, user=None):
        self.server = server
        self.token = token
        self.user = user

    def connect(self, timeout=REQUEST_TIMEOUT_S):
        """An open connection to the server, e.g. to release many requests together."""
        conn = http.client.HTTPConnection(self.server.host, self.server.port, timeout=timeout)
        conn.connect()
        return conn

    def request(self, method, path, body=None, json_body=None, headers=None, key=None,
                token=Ellipsis, content_type=Ellipsis, timeout=REQUEST_TIMEOUT_S, conn=None,
                chunked=False):
        """
        Sends one request and returns a Response.

        body: raw bytes (or str); json_body: an object sent as compact JSON.  content_type defaults
        to application/json when there is a body (None: send no Content-Type).  headers: a dict or
        a list of (name, value) pairs (a list may repeat a name).  key: the Idempotency-Key value,
        sent verbatim.  token: defaults to the client's; None sends no Authorization.  Connection
        errors propagate (OSError, http.client.HTTPException).  chunked: send the body with
        Transfer-Encoding: chunked (64 KiB chunks) instead of a Content-Length.
        """
        if json_body is not None:
            body = json.dumps(json_body, separators=(",", ":")).encode()
        if isinstance(body, str):
            body = body.encode("utf-8")
        if content_type is Ellipsis:
            content_type = "application/json" if body is not None else None
        if token is Ellipsis:
            token = self.token
        hdrs = []
        if token is not None:
            hdrs.append(("Authorization", "Bearer " + token))
        if content_type is not None:
            hdrs.append(("Content-Type", content_type))
        if key is not None:
            hdrs.append(("Idempotency-Key", key))
        if isinstance(headers, dict):
            hdrs.extend(headers.items())
        elif headers:
            hdrs.extend(headers)
        own = conn is None
        if own:
            conn = http.client.HTTPConnection(self.server.host, self.server.port, timeout=timeout)
        t0 = time.monotonic()
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for name, value in hdrs:
                conn.putheader(name, value)
            payload = body
            if chunked:
                conn.putheader("Transfer-Encoding", "chunked")
                payload = [body[i:i + 65536] for i in range(0, len(body or b""), 65536)]
            elif body is not None or method in ("POST", "PUT", "PATCH"):
                conn.putheader("Content-Length", str(len(body or b"")))
            try:
                conn.endheaders(payload, encode_chunked=chunked)
            except (BrokenPipeError, ConnectionResetError):
                # The server may answer (413) and close before reading all of a large body; but
                # a connection that never opened has nothing to read.
                if conn.sock is None:
                    raise
            resp = conn.getresponse()
            data = resp.read()
            return Response(resp.status, resp.msg, data, time.monotonic() - t0)
        finally:
            if own:
                conn.close()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, json_body=None, **kw):
        return self.request("POST", path, json_body=json_body, **kw)

    def put(self, path, json_body=None, **kw):
        return self.request("PUT", path, json_body=json_body, **kw)

    # -- orderd's operations --

    def create_order(self, key, product="p-1024", quantity=2, **kw):
        return self.post("/api/orders", {"productId": product, "quantity": quantity}, key=key, **kw)

    def cancel(self, order_id, key, **kw):
        return self.request("POST", "/api/orders/%s/cancel" % order_id, key=key, **kw)

    def all_orders(self, limit=100):
        """Every order of this user, following nextCursor; checks each page is a 200."""
        orders, cursor, pages = [], None, 0
        while True:
            path = "/api/orders?limit=%d" % limit
            if cursor is not None:
                path += "&cursor=" + cursor
            r = self.get(path)
            expect_status(r, 200, "GET " + path)
            doc = r.json()
            if not isinstance(doc.get("orders"), list):
                raise TestFailure("GET %s: no 'orders' list: %s" % (path, r.describe()))
            orders.extend(doc["orders"])
            cursor = doc.get("nextCursor")
            pages += 1
            if cursor is None or pages > 10000:
                return orders
            if not doc["orders"]:
                raise TestFailure("GET %s: empty page with a nextCursor: %s" % (path, r.describe()))


def exchange_to_eof(s, data):
    """Sends `data` on the connected socket `s`, reads until the peer closes, closes `s`."""
    try:
        s.sendall(data)
        out = b""
        while True:
            piece = s.recv(65536)
            if not piece:
                return out
            out += piece
    finally:
        s.close()


def wait_until(what, fn, timeout_s=30.0, pause_s=0.1, describe=None):
    """
    Polls fn() until it returns a true value (returned); fails with `what` after the timeout,
    saying what describe() (if given) says about the state then.  The way a test waits for
    something another thread or process does: never a fixed sleep and then an assertion.  The
    first polls come quickly (from 5 ms, doubling up to pause_s), so a condition met at once costs
    no pause.
    """
    deadline = time.monotonic() + timeout_s
    pause = min(0.005, pause_s)
    last = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            break
        time.sleep(pause)
        pause = min(pause * 2, pause_s)
    state = describe() if describe is not None else repr(last)
    raise TestFailure("timed out after %.0f s waiting for %s (%s)" % (timeout_s, what, state))


def wait_order_committed(server, key, ended=lambda: False):
    """
    Waits until orderd has committed the order of `key` (its phase 1): the request, sent from
    another thread with the X-Test-Delay-Ms hook, is in flight and holds a worker.  Stops waiting
    as well once ended() says that request is over, so the test can say what came back.
    """
    wait_until("the order of %s committed (phase 1)" % key, lambda: ended() or db_query(
        server.db_uri, "SELECT count(*) FROM orders WHERE idem_key = ?", (key,))[0][0] == "1",
        pause_s=0.02)


def in_thread(fn):
    """Runs fn() in a daemon thread: (thread, box); the box gets "resp" (what fn returned) or
    "error" (what it raised)."""
    out = {}

    def body():
        try:
            out["resp"] = fn()
        except Exception as e:  # noqa: BLE001
            out["error"] = e
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


def joined(t, out, what, timeout=60):
    """in_thread's result: a failure if none came within `timeout` s or fn raised."""
    t.join(timeout)
    if t.is_alive():
        fail("%s: no answer within %d s" % (what, timeout))
    if "error" in out:
        fail("%s raised %r" % (what, out["error"]))
    return out["resp"]


class HttpFront:
    """
    An HTTP front on 127.0.0.1:0 (.url) for a server on 127.0.0.1:`port`: every request is passed
    on as it came, but what `intercept(path)` answers itself ((status, headers, body), or None to
    pass on), and every answer's body goes through `rewrite(path, body)` first.  For tests that
    need a server to look different from the outside.  close() stops it.
    """

    def __init__(self, port, intercept=None, rewrite=None):
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self, status, headers, data):
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("content-length", "connection", "transfer-encoding",
                                         "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                mine = intercept(self.path) if intercept else None
                if mine is not None:
                    self.answer(*mine)
                    return
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length")}
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    c.request(self.command, self.path, body=body, headers=headers)
                    r = c.getresponse()
                    data = r.read()
                    self.answer(r.status, r.getheaders(),
                                rewrite(self.path, data) if rewrite else data)
                finally:
                    c.close()

            do_GET = do_POST = do_PUT = do_DELETE = forward

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def run_idem_check(args, workdir, timeout=120):
    """
    `idem-check ARGS` with TMPDIR=workdir (where chaos keeps its work directory), within `timeout`
    seconds: (exit code, stdout, stderr, seconds taken).  A missing program or a run that does
    not end fails the test.
    """
    program = os.path.join(BIN, "idem-check")
    t0 = time.monotonic()
    env = dict(os.environ, TMPDIR=workdir)
    try:
        p = subprocess.run([program] + args, capture_output=True, timeout=timeout, env=env)
    except FileNotFoundError:
        fail("%s not found (IDEM_BIN=%s): build the idem-check target" % (program, BIN))
    except subprocess.TimeoutExpired:
        fail("`idem-check %s` did not finish in %d s" % (" ".join(args), timeout))
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"), time.monotonic() - t0)


def new_key(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4().hex)


# ---- assertions ----------------------------------------------------------------------------------

def fail(msg):
    raise TestFailure(msg)


def expect(cond, msg):
    if not cond:
        raise TestFailure(msg)


def expect_eq(got, expected, what):
    if got != expected:
        raise TestFailure("%s: expected %r, got %r" % (what, expected, got))


def expect_status(resp, status, what="response"):
    if resp.status != status:
        raise TestFailure("%s: expected status %d, got %s" % (what, status, resp.describe()))
    return resp


def expect_problem(resp, status, code, what="response"):
    """An RFC 9457 problem with the stable code of docs/http-api.md."""
    expect_status(resp, status, what)
    if resp.content_type != "application/problem+json":
        fail("%s: expected Content-Type application/problem+json, got %s" % (what, resp.describe()))
    doc = resp.json()
    if not isinstance(doc, dict):
        fail("%s: problem body is not an object: %s" % (what, resp.describe()))
    problems = []
    if doc.get("code") != code:
        problems.append("code %r (expected %r)" % (doc.get("code"), code))
    if doc.get("type") != "/problems/" + code:
        problems.append("type %r (expected %r)" % (doc.get("type"), "/problems/" + code))
    if doc.get("status") != status:
        problems.append("status member %r (expected %d)" % (doc.get("status"), status))
    for member in ("title", "detail"):
        if not isinstance(doc.get(member), str) or not doc.get(member):
            problems.append("%s missing or not a non-empty string" % member)
    if problems:
        fail("%s: bad problem (%s): %s" % (what, ", ".join(problems), resp.describe()))
    return doc


def expect_replay(resp, first, what="replay"):
    """The stored response again: status, byte-identical body, Content-Type and Location."""
    if resp.status != first.status:
        fail("%s: expected the stored status %d, got %s" % (what, first.status, resp.describe()))
    if not resp.replayed:
        fail("%s: expected Idempotent-Replayed: true, got %s" % (what, resp.describe()))
    if resp.body != first.body:
        fail("%s: body differs from the first response\nfirst: %r\nreplay: %r" % (
            what, first.body[:600], resp.body[:600]))
    for h in ("Content-Type", "Location"):
        if resp.header(h) != first.header(h):
            fail("%s: %s differs: first %r, replay %r" % (what, h, first.header(h),
                                                          resp.header(h)))
    return resp


def expect_fresh(resp, status, what="fresh request"):
    """Executed now: the expected status and no Idempotent-Replayed header."""
    expect_status(resp, status, what)
    if resp.header("Idempotent-Replayed") is not None:
        fail("%s: expected a fresh execution without Idempotent-Replayed, got %s" % (
            what, resp.describe()))
    return resp


def retry_after_seconds(resp, what="response"):
    v = resp.header("Retry-After")
    if v is None:
        fail("%s: no Retry-After header: %s" % (what, resp.describe()))
    try:
        n = int(v.strip())
    except ValueError:
        fail("%s: Retry-After %r is not a number of seconds: %s" % (what, v, resp.describe()))
    if n < 1:
        fail("%s: Retry-After %d is below 1: %s" % (what, n, resp.describe()))
    return n


# ---- Prometheus text ---------------------------------------------------------------------------

_METRIC_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """[(name, {label: value}, float)] from Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC_RE.match(line)
        if not m:
            continue
        labels = dict(_LABEL_RE.findall(m.group(2) or ""))
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), labels, value))
    return out


def metrics(client):
    """The samples of a server's /metrics (parse_metrics)."""
    return parse_metrics(client.get("/metrics").body.decode())


def order_of(client, order_id):
    """orderd's order `order_id` (GET /api/orders/{id}, which must answer 200)."""
    r = client.get("/api/orders/" + order_id)
    expect_eq(r.status, 200, "GET /api/orders/" + order_id)
    return r.json()


def charge_key(order_id):
    """The idempotency key orderd gives the provider for the charge of `order_id`."""
    return "order-%s-charge" % order_id


def metric_value(samples, name, **labels):
    """Sum of the samples of `name` whose labels include `labels` (0 if none)."""
    total = 0.0
    for n, lab, v in samples:
        if n == name and all(lab.get(k) == val for k, val in labels.items()):
            total += v
    return total


# ---- the runner --------------------------------------------------------------------------------

_tests = []


def test(fn=None, name=None):
    """Registers a test function (decorator), or registers `fn` under `name`."""
    if fn is None:
        return lambda f: test(f, name)
    _tests.append((name or fn.__name__, fn))
    return fn


def run(title, setup=None, teardown=None):
    """
    Runs every registered test in order (argv: optional substrings selecting tests), prints one
    line per test, the failures in full, and a summary.  Exits non-zero if anything failed.
    Each test is called with what setup() returned (None without a setup).
    """
    selected = [(n, f) for n, f in _tests if len(sys.argv) < 2 or any(a in n for a in sys.argv[1:])]
    failures = []
    t_start = time.monotonic()
    print("%s: %d tests (programs from %s)" % (title, len(selected), BIN), flush=True)
    ctx = None
    try:
        if setup is not None:
            ctx = setup()
    except Exception as e:  # noqa: BLE001
        print("SETUP FAILED: %s" % e, flush=True)
        traceback.print_exc()
        print("%s: 0 passed, %d failed (setup failed)" % (title, len(selected)), flush=True)
        sys.exit(1)
    try:
        for name, fn in selected:
            t0 = time.monotonic()
            try:
                fn(ctx)
            except TestFailure as e:
                failures.append((name, str(e)))
                print("FAIL %s (%.2fs)\n     %s" % (name, time.monotonic() - t0,
                                                     str(e).replace("\n", "\n     ")), flush=True)
            except Exception as e:  # noqa: BLE001 - an error is a failure, with its trace
                tb = traceback.format_exc()
                failures.append((name, "%s: %s" % (type(e).__name__, e)))
                print("FAIL %s (%.2fs) raised %s\n%s" % (name, time.monotonic() - t0,
                                                         type(e).__name__, tb), flush=True)
            else:
                print("ok   %s (%.2fs)" % (name, time.monotonic() - t0), flush=True)
    finally:
        if teardown is not None:
            try:
                teardown(ctx)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
    passed = len(selected) - len(failures)
    print("", flush=True)
    if failures:
        print("Failed tests:")
        for name, msg in failures:
            print("  %s: %s" % (name, msg.splitlines()[0] if msg else ""))
    print("%s: %d passed, %d failed, %d total in %.1fs" % (
        title, passed, len(failures), len(selected), time.monotonic() - t_start), flush=True)
    sys.exit(1 if failures else 0)
