#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_pg_gateways.py - docs/ops.md, "Two gateways on one PostgreSQL", done as the text says it.

The section is a recipe an operator follows on a fresh cluster; this test follows it on the
throw-away PostgreSQL 15 of tests/pg/with_pg.sh, reading the commands out of docs/ops.md itself so
that the text and the test cannot part ways:

  - its SQL, run as the superuser: a role that is no superuser, the database it owns, nothing else
    (the cluster is made to ask that role for its password on TCP, as a real one does);
  - its shell line that writes the password file, with /etc/idem moved to a scratch directory, and
    the file given to the gateways as systemd's EnvironmentFile= would (the unit names that file);
  - its `store:` line, the database server's address put in place of db.internal;
  - its PostgreSQL 15 paragraph: a role that does not own the database fails to start with
    "lock schema: permission denied" until it is given the one GRANT the text names;
  - two idem-gateways with the same file (each on its own loopback address, as two hosts), in
    front of one upstream that does not dedupe and counts what it executes: one keyed request
    sent to both, one after the other and 16 copies at once, runs upstream once, and every client
    gets the same bytes, all but one marked Idempotent-Replayed;
  - its HAProxy snippet (frontend and backend, addresses replaced), alone, without Debian's
    defaults: the health checks on the admin listeners pass (with `admin_token_file` set, as the
    text asks of a listener checked from another host), a retry through HAProxy that lands
    on the other gateway is a replay, and with the gateway that ran the request stopped, HAProxy's
    own re-send (retry-on conn-failure, redispatch) is answered by the other one with the replay.

Runs only under tests/pg/with_pg.sh (CTest: service-pg.pg_gateways); without
IDEM_TEST_PG_URI it FAILS with a message saying so.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import (REPO, Server, TestFailure, expect, expect_eq, expect_problem,  # noqa: E402
                     expect_replay, fail, metric_value, parse_metrics, pg_uri_with_db, psql, run,
                     test, wait_until)
from gateway_harness import GATEWAY, Gateway, Upstream, http_request  # noqa: E402

OPS_MD = os.path.join(REPO, "docs", "ops.md")
UNIT = os.path.join(REPO, "packaging", "systemd", "idem-gateway.service")
SECTION = "## Two gateways on one PostgreSQL"
# The two "hosts" of the gateways: loopback addresses of their own, so both listen on one port as
# two machines would and HAProxy's server lines keep the doc's shape.
HOSTS = ("127.0.0.2", "127.0.0.3")


# ---- what docs/ops.md says -----------------------------------------------------------------------

def doc_blocks():
    """The fenced code blocks of the section, in order: [(info string, text)]."""
    with open(OPS_MD, encoding="utf-8") as f:
        text = f.read()
    start = text.find("\n" + SECTION + "\n")
    expect(start >= 0, "docs/ops.md has a section %r" % SECTION)
    end = text.find("\n## ", start + len(SECTION) + 2)
    section = text[start:end if end >= 0 else len(text)]
    return section, [(m.group(1).strip(), m.group(2))
                     for m in re.finditer(r"\n```([^\n]*)\n(.*?)\n```", section, re.S)]


def doc_block(blocks, lang, starts=None):
    found = [b for info, b in blocks if info == lang and (starts is None or b.startswith(starts))]
    expect(len(found) == 1, "docs/ops.md's section has one ```%s block%s (found %d)"
           % (lang, " starting %r" % starts if starts else "", len(found)))
    return found[0]


def environment_file(path):
    """What systemd's EnvironmentFile= gives a service: KEY=VALUE lines, # comments skipped."""
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or line.startswith(";"):
                continue
            name, _, value = line.partition("=")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[name.strip()] = value
    return env


def free_port_on(hosts):
    """A TCP port free on every address of `hosts` (bound and given back at once)."""
    for _ in range(50):
        probe = socket.socket()
        probe.bind((hosts[0], 0))
        port = probe.getsockname()[1]
        held = [probe]
        try:
            for h in hosts[1:]:
                s = socket.socket()
                held.append(s)
                s.bind((h, port))
            return port
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    fail("no port free on all of %s" % (hosts,))


# ---- the gateways --------------------------------------------------------------------------------

class DocGateway(Gateway):
    """An idem-gateway started from a config text written as is, with an environment added."""

    def __init__(self, upstream, config_text, env, name, admin_token):
        Server.__init__(self, name=name, db_uri="(in the config)", env=env)
        self.upstream = upstream
        self.admin_port = None
        self.admin_token = admin_token
        self.config_path = os.path.join(self.tmpdir, "gateway.yaml")
        with open(self.config_path, "w") as f:
            f.write(config_text)
        write_token(self.tmpdir, admin_token)

    def metric(self, outcome):
        r = self.admin("GET", "/metrics", token=self.admin_token)
        expect_eq(r.status, 200, "GET /metrics of %s" % self.name)
        return metric_value(parse_metrics(r.body.decode()), "idem_gateway_requests_total",
                            operation="payments.create", outcome=outcome)


def write_token(directory, token):
    """The admin token file the config names, beside it (mode 0600)."""
    path = os.path.join(directory, "admin.token")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(token + "\n")


def gateway_config(ctx, host):
    """The one file every gateway gets; only the address it listens on is the host's own."""
    return ("listen: %s:%d\n" % (host, ctx.gw_port) +
            "admin_listen: %s:%d\n" % (host, ctx.admin_port) +
            # As the doc says for health checks from another host: the admin API behind a token,
            # /healthz open.
            "admin_token_file: admin.token\n" +
            ctx.store_line + "\n" +
            "upstream:\n  url: %s\n  timeout: 10s\n" % ctx.upstream.url +
            "principal:\n  header: X-Consumer-Id\n"
            "routes:\n"
            "  - match: POST /v1/payments\n"
            "    operation: payments.create\n"
            # Duplicates wait for the first attempt (LISTEN/NOTIFY across the gateways) instead
            # of a 409 after the default 2 s, which a loaded machine could reach.
            "    wait: 10s\n")


def run_gateway_tool(args, env):
    p = subprocess.run([GATEWAY] + args, capture_output=True, timeout=60,
                       env=dict(os.environ, **env))
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


class Ctx:
    def __init__(self):
        self.admin = os.environ.get("IDEM_TEST_PG_URI")
        data = os.environ.get("IDEM_TEST_PG_DATA")
        if not self.admin or not data:
            raise TestFailure(
                "IDEM_TEST_PG_URI / IDEM_TEST_PG_DATA are not set: run under tests/pg/with_pg.sh "
                "(`sh tests/pg/with_pg.sh python3 tests/service/test_pg_gateways.py`; CTest: "
                "service-pg.pg_gateways).  This test does not skip.")
        self.pg_port = int(os.environ["IDEM_TEST_PG_PORT"])
        self.tmp = tempfile.mkdtemp(prefix="idem-pg-gateways-")
        # The password comes from gateway.env only: none inherited, no ~/.pgpass.
        os.environ.pop("PGPASSWORD", None)
        os.environ["PGPASSFILE"] = os.path.join(self.tmp, "no-pgpass")
        self.section, blocks = doc_blocks()
        self.sql = doc_block(blocks, "sql")
        self.env_cmd = doc_block(blocks, "sh")
        self.yaml = doc_block(blocks, "yaml")
        self.haproxy_snippet = doc_block(blocks, "", starts="# /etc/haproxy/haproxy.cfg")
        self.role = re.search(r"CREATE ROLE (\w+)", self.sql).group(1)
        self.dbname = re.search(r"CREATE DATABASE (\w+)", self.sql).group(1)
        # The superuser's part, as pasted into psql.
        psql(pg_uri_with_db(self.admin, "postgres"), self.sql + "\n")
        # A real cluster asks for the password on TCP (with_pg.sh's trusts everyone): first match
        # wins, so this line goes before the trust ones.
        hba = os.path.join(data, "pg_hba.conf")
        with open(hba) as f:
            old = f.read()
        with open(hba, "w") as f:
            f.write("host all %s 127.0.0.1/32 scram-sha-256\n%s" % (self.role, old))
        psql(self.admin, "SELECT pg_reload_conf();\n")
        self.upstream = Upstream()
        self.admin_token = uuid.uuid4().hex
        write_token(self.tmp, self.admin_token)  # for the configs check-config reads from here
        self.env = None  # gateway.env's environment, once the first test wrote it
        self.gateways = []
        self.haproxy = None

    def close(self):
        if self.haproxy is not None and self.haproxy.poll() is None:
            self.haproxy.terminate()
            try:
                self.haproxy.wait(10)
            except subprocess.TimeoutExpired:
                self.haproxy.kill()
                self.haproxy.wait()
        for g in self.gateways:
            g.close()
        self.upstream.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        psql(pg_uri_with_db(self.admin, "postgres"),
             "DROP DATABASE IF EXISTS %s WITH (FORCE);\nDROP DATABASE IF EXISTS %s_granted "
             "WITH (FORCE);\nDROP ROLE IF EXISTS %s;\n" % (self.dbname, self.dbname, self.role),
             check=False)


# ---- the tests (in order: each builds on the one before) -----------------------------------------

@test
def the_role_is_no_superuser_and_its_password_goes_in_gateway_env(ctx):
    rows = psql(ctx.admin, "SELECT rolsuper, rolcreatedb, rolcreaterole, rolcanlogin FROM pg_roles"
                " WHERE rolname = '%s';\nSELECT pg_get_userbyid(datdba) FROM pg_database WHERE "
                "datname = '%s';\n" % (ctx.role, ctx.dbname))
    expect_eq(rows, [["f", "f", "f", "t"], [ctx.role]],
              "the doc's role: login only, owner of its database")
    # The shell line as pasted, /etc/idem being a scratch directory here.
    etc = os.path.join(ctx.tmp, "etc", "idem")
    os.makedirs(etc)
    expect("/etc/idem/gateway.env" in ctx.env_cmd, "the doc writes /etc/idem/gateway.env")
    p = subprocess.run(["sh", "-ec", ctx.env_cmd.replace("/etc/idem", etc)], capture_output=True,
                       timeout=30)
    expect_eq(p.returncode, 0, "the doc's shell line (%r)" % p.stderr)
    ctx.env_file = os.path.join(etc, "gateway.env")
    expect_eq(os.stat(ctx.env_file).st_mode & 0o777, 0o600, "gateway.env's mode")
    with open(UNIT) as f:
        expect("\nEnvironmentFile=-/etc/idem/gateway.env\n" in f.read(),
               "idem-gateway.service reads the file the doc writes")
    ctx.env = environment_file(ctx.env_file)
    expect_eq(sorted(ctx.env), ["PGPASSWORD"], "what gateway.env holds")
    # The doc's store line, the database server where db.internal is (and its port).
    expect("host=db.internal" in ctx.yaml and "password" not in ctx.yaml,
           "the doc's store line names the host db.internal and no password: %r" % ctx.yaml)
    ctx.store_line = ctx.yaml.replace("host=db.internal", "host=127.0.0.1 port=%d" % ctx.pg_port)
    expect(ctx.store_line.startswith("store: ") and "\n" not in ctx.store_line.strip(),
           "one store line: %r" % ctx.store_line)
    ctx.gw_port = free_port_on(HOSTS)
    ctx.admin_port = free_port_on(HOSTS)
    conf = os.path.join(ctx.tmp, "gateway.yaml")
    with open(conf, "w") as f:
        f.write(gateway_config(ctx, HOSTS[0]))
    # check-config opens the store as serve will: the password is what lets it in.
    rc, out, err = run_gateway_tool(["check-config", "--config", conf], {})
    expect(rc == 1 and "no password supplied" in err,
           "check-config without gateway.env: exit 1, no password (%d: %s)" % (rc, err))
    rc, out, err = run_gateway_tool(["check-config", "--config", conf],
                                    {"PGPASSWORD": ctx.env["PGPASSWORD"] + "-wrong"})
    expect(rc == 1 and "password authentication failed" in err,
           "check-config with a wrong password: exit 1, saying so (%d: %s)" % (rc, err))
    expect(ctx.env["PGPASSWORD"] + "-wrong" not in err, "and not showing it: %s" % err)
    rc, out, err = run_gateway_tool(["check-config", "--config", conf], ctx.env)
    expect_eq((rc, out), (0, "%s: ok (1 route)\n" % conf),
              "check-config with gateway.env's environment (stderr: %s)" % err)


@test
def a_role_that_does_not_own_the_database_needs_the_grant_the_doc_names(ctx):
    expect(ctx.env is not None, "gateway.env was written (the test before)")
    grant = re.search(r"`(GRANT CREATE ON SCHEMA public TO %s;)`" % ctx.role, ctx.section)
    expect(grant is not None, "the doc names the GRANT for a database the role does not own")
    other = ctx.dbname + "_granted"
    psql(pg_uri_with_db(ctx.admin, "postgres"), "CREATE DATABASE %s;\n" % other)
    conf = os.path.join(ctx.tmp, "granted.yaml")
    with open(conf, "w") as f:
        f.write(gateway_config(ctx, HOSTS[0]).replace("dbname=%s " % ctx.dbname,
                                                       "dbname=%s " % other))
    rc, _, err = run_gateway_tool(["check-config", "--config", conf], ctx.env)
    expect(rc == 1 and "lock schema: permission denied" in err,
           "without it, the error the doc quotes (%d: %s)" % (rc, err))
    psql(pg_uri_with_db(ctx.admin, other), grant.group(1) + "\n")
    rc, _, err = run_gateway_tool(["check-config", "--config", conf], ctx.env)
    expect_eq(rc, 0, "with it, the store opens (%s)" % err)


@test
def one_keyed_request_runs_once_through_both_gateways(ctx):
    expect(ctx.env is not None, "gateway.env was written (the first test)")
    for attempt in range(3):
        # Two ports free on both addresses now may be taken before the gateways bind them (other
        # tests run beside this one): then both start again on two other ports.
        if attempt:
            ctx.gw_port, ctx.admin_port = free_port_on(HOSTS), free_port_on(HOSTS)
        texts = [gateway_config(ctx, h) for h in HOSTS]
        differ = [(a, b) for a, b in zip(texts[0].splitlines(), texts[1].splitlines()) if a != b]
        expect(all(a.split(":")[0] in ("listen", "admin_listen") for a, _ in differ),
               "the two files differ in their own addresses only: %s" % differ)
        try:
            for i, text in enumerate(texts):
                g = DocGateway(ctx.upstream, text, ctx.env, "gateway-%d" % (i + 1),
                               ctx.admin_token)
                ctx.gateways.append(g)
                g.start()
            break
        except TestFailure as e:
            for g in ctx.gateways:
                g.close()
            ctx.gateways = []
            if attempt == 2 or "in use" not in str(e):
                raise
    for i, g in enumerate(ctx.gateways):
        expect_eq((g.host, g.port, g.admin_port), (HOSTS[i], ctx.gw_port, ctx.admin_port),
                  "%s listens where its file says" % g.name)
    gw1, gw2 = ctx.gateways
    up = ctx.upstream
    expect_eq((gw1.admin("GET", "/healthz").status, gw1.admin("GET", "/metrics").status),
              (200, 401), "without the admin token: /healthz open (for health checks), no more")
    body = {"amount": 500, "currency": "EUR"}

    # One after the other: the first gateway runs it, the second replays it from PostgreSQL.
    k = harness.new_key("pay")
    first = gw1.request("POST", "/v1/payments", body, principal="acct_1", key=k)
    harness.expect_fresh(first, 201, "the request through gateway 1")
    again = gw2.request("POST", "/v1/payments", body, principal="acct_1", key=k)
    expect_replay(again, first, "its retry through gateway 2")
    expect_eq(up.executions(k), 1, "upstream executions of %s" % k)
    expect_problem(gw2.request("POST", "/v1/payments", {"amount": 501}, principal="acct_1", key=k),
                   422, "idempotency-key-reused", "the key with another body, on gateway 2")
    expect_eq(gw2.metric("replayed"), 1, "gateway 2's replays")

    # At once: 16 copies, 8 to each gateway, released together while the first is slow upstream.
    k = harness.new_key("pay")
    executed_before = [g.metric("executed") for g in ctx.gateways]
    waited_before = [g.metric("waited") for g in ctx.gateways]
    start = threading.Barrier(16)
    answers = [None] * 16

    def send(i):
        g = ctx.gateways[i % 2]
        start.wait(30)
        answers[i] = g.request("POST", "/v1/payments", body, principal="acct_2", key=k,
                               headers={"X-Test-Mode": "slow:1000"})
    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    expect(all(a is not None for a in answers), "every copy was answered within 60 s")
    expect_eq(up.executions(k), 1, "upstream executions of 16 copies of %s" % k)
    fresh = [a for a in answers if a.header("Idempotent-Replayed") is None]
    expect_eq(len(fresh), 1, "answers not marked as replays (%s)"
              % [a.describe() for a in fresh])
    # The copies the other gateway took waited for the first attempt's record (LISTEN/NOTIFY on
    # the one database), then answered from it.
    waited = [g.metric("waited") - w for g, w in zip(ctx.gateways, waited_before)]
    ran = [g.metric("executed") - e for g, e in zip(ctx.gateways, executed_before)]
    expect(sorted(ran) == [0, 1] and waited[ran.index(0)] >= 1,
           "one gateway ran it, and copies on the other waited for it (executed %s, waited %s)"
           % (ran, waited))
    for i, a in enumerate(answers):
        if a is not fresh[0]:
            expect_replay(a, fresh[0], "copy %d (gateway %d)" % (i, i % 2 + 1))


# ---- HAProxy -------------------------------------------------------------------------------------

def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")[-3000:]


def haproxy_bin():
    path = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.access(path, os.X_OK):
        fail("haproxy is not installed (Debian package `haproxy`; scripts/deps.sh test installs it)")
    return path


def show_stat(sock_path):
    """HAProxy's `show stat` on its admin socket: {(proxy, server): {column: value}}."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    try:
        s.connect(sock_path)
    except OSError:
        s.close()
        raise
    data = harness.exchange_to_eof(s, b"show stat\n")
    lines = data.decode().splitlines()
    expect(lines and lines[0].startswith("# "), "show stat answered: %r" % data[:300])
    names = lines[0][2:].split(",")
    out = {}
    for line in lines[1:]:
        if line:
            row = dict(zip(names, line.split(",")))
            out[(row["pxname"], row["svname"])] = row
    return out


@test
def haproxy_as_the_doc_configures_it_sends_a_retry_to_the_other_gateway(ctx):
    expect(len(ctx.gateways) == 2 and all(g.alive() for g in ctx.gateways),
           "both gateways run (the test before started them)")
    snippet = ctx.haproxy_snippet
    for needle in ("10.0.0.11:8180", "10.0.0.12:8180", "check port 8181", "retry-on conn-failure",
                   "option redispatch", "option httpchk GET /healthz", "default_backend"):
        expect(needle in snippet, "the doc's HAProxy snippet has %r" % needle)
    bind = re.search(r"^\s*bind (\S+)\s*$", snippet, re.M)
    expect(bind is not None, "the snippet's frontend binds one address")
    lb_port = free_port_on(("127.0.0.1",))
    snippet = (snippet.replace(bind.group(0), bind.group(0).replace(bind.group(1),
                                                                    "127.0.0.1:%d" % lb_port))
               .replace("10.0.0.11:8180", "%s:%d" % (HOSTS[0], ctx.gw_port))
               .replace("10.0.0.12:8180", "%s:%d" % (HOSTS[1], ctx.gw_port))
               .replace("check port 8181", "check port %d" % ctx.admin_port))
    sock = os.path.join(ctx.tmp, "haproxy.sock")
    cfg = os.path.join(ctx.tmp, "haproxy.cfg")
    with open(cfg, "w") as f:
        # A global section for the admin socket only (HAProxy runs in the foreground here, as this
        # test's user) and no defaults: the doc's snippet must be complete by itself.
        f.write("global\n    stats socket %s mode 600 level admin\n\n" % sock + snippet + "\n")
    check = subprocess.run([haproxy_bin(), "-c", "-f", cfg], capture_output=True, timeout=30)
    expect_eq(check.returncode, 0, "haproxy -c on the doc's snippet: %s" % check.stderr.decode())
    expect(b"WARNING" not in check.stdout + check.stderr,
           "haproxy -c has no warning for the snippet alone: %s" % (check.stdout + check.stderr))
    log = open(os.path.join(ctx.tmp, "haproxy.log"), "wb")
    ctx.haproxy = subprocess.Popen([haproxy_bin(), "-db", "-f", cfg], stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()

    def servers():
        if ctx.haproxy.poll() is not None or not os.path.exists(sock):
            return None
        try:
            st = show_stat(sock)
        except OSError:
            return None
        return {name: st.get(("idem_gateways", name)) for name in ("gw1", "gw2")}

    def both_checked_up():
        s = servers()
        return s and all(r and r["status"] == "UP" and r["check_status"] == "L7OK"
                         for r in s.values())
    wait_until("HAProxy's health checks on both admin listeners to pass", both_checked_up,
               describe=lambda: "%s; exit %s; log: %s" % (
                   {n: r and (r["status"], r["check_status"], r.get("last_chk"))
                    for n, r in (servers() or {}).items()},
                   ctx.haproxy.poll(), read_text(os.path.join(ctx.tmp, "haproxy.log"))))

    def through_lb(key):
        return http_request("127.0.0.1", lb_port, "POST", "/v1/payments", '{"amount":700}',
                            {"X-Consumer-Id": "acct_3", "Idempotency-Key": key,
                             "Content-Type": "application/json"}, 30)

    k = harness.new_key("pay-lb")
    before = [g.metric("executed") for g in ctx.gateways]
    first = through_lb(k)
    harness.expect_fresh(first, 201, "the request through HAProxy")
    ran = [i for i, g in enumerate(ctx.gateways) if g.metric("executed") > before[i]]
    expect_eq(len(ran), 1, "one gateway ran it")
    ran, other = ctx.gateways[ran[0]], ctx.gateways[1 - ran[0]]
    # A client's retry: round robin takes it to the other gateway, which replays it.
    replays = other.metric("replayed")
    for _ in range(4):
        expect_replay(through_lb(k), first,
                      "a retry through HAProxy")
        if other.metric("replayed") > replays:
            break
    expect(other.metric("replayed") > replays,
           "a retry landed on %s, the gateway that did not run it" % other.name)

    # The gateway that ran it stops (one at a time, as the doc says to restart them).  Until the
    # health checks take it out, round robin still picks it: HAProxy cannot connect, re-sends
    # the request to the other gateway (retry-on conn-failure, redispatch), which replays it.
    expect_eq(ran.stop(), 0, "%s stops on SIGTERM" % ran.name)
    ran_server = "gw%d" % (ctx.gateways.index(ran) + 1)
    wredis = int(servers()[ran_server]["wredis"] or 0)
    for _ in range(4):
        expect_replay(through_lb(k), first,
                      "a retry through HAProxy with %s stopped" % ran.name)
        if int(servers()[ran_server]["wredis"] or 0) > wredis:
            break
    stat = servers()[ran_server]
    # (A re-send to another server counts as a redispatch, not as a retry on the same one.)
    expect(int(stat["wredis"] or 0) > wredis,
           "HAProxy re-sent a request meant for the stopped gateway to the other one "
           "(wredis %s, wretr %s, status %s)" % (stat["wredis"], stat["wretr"], stat["status"]))
    # And a new key through HAProxy now: run once, by the gateway that is left.
    k2 = harness.new_key("pay-lb")
    harness.expect_fresh(through_lb(k2), 201, "a new key with one gateway left")
    expect_eq((ctx.upstream.executions(k), ctx.upstream.executions(k2)), (1, 1),
              "upstream executions of both keys")
    expect(ctx.haproxy.poll() is None, "HAProxy still runs")


if __name__ == "__main__":
    run("test_pg_gateways", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
