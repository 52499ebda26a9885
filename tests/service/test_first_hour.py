#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_first_hour.py - what a new user or an operator meets in the first hour, with the
real programs: every server refuses a port another process holds; a token made in a new database
says so; SQLite's failures to open say the system's reason and name the -wal and -shm files;
Retry-After is a wait a client can act on; idem-check checks a gateway whose callers are named by
a header; the idem CLI says where a request stands when Ctrl-C stops it.

service-tests: sqlite-only (the programs' own start-up; no store of the run's is involved)
"""

import json
import os
import re
import select
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import BIN, expect_eq, test  # noqa: E402
from gateway_harness import Gateway, Upstream, expect  # noqa: E402
from harness import free_port  # noqa: E402

LISTENING = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)")


def start(cmd, cwd):
    """Starts `cmd`; returns (process, its stdout so far) once it says it listens, or it exited."""
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = b""

    def listening():
        nonlocal out
        if p.poll() is not None:
            return True
        # A line only once one is there: a server that hangs silent meets the deadline.
        if select.select([p.stdout], [], [], 0)[0]:
            out += p.stdout.readline()
        return LISTENING.search(out) is not None
    harness.wait_until("%s to listen or exit" % cmd[0], listening, timeout_s=30)
    return p, out


def commands(port, tmp):
    gw_conf = os.path.join(tmp, "gw.yaml")
    with open(gw_conf, "w") as f:
        f.write("listen: 127.0.0.1:%d\nadmin_listen: 127.0.0.1:0\nstore: sqlite:%s/gw.db\n"
                "upstream: {url: 'http://127.0.0.1:9'}\nprincipal: {header: X-Consumer-Id}\n"
                % (port, tmp))
    return {
        "provider-sim": [os.path.join(BIN, "provider-sim"), "--listen", "127.0.0.1:%d" % port,
                         "--db", "sqlite:%s/sim.db" % tmp],
        "orderd": [os.path.join(BIN, "orderd"), "serve", "--listen", "127.0.0.1:%d" % port,
                   "--db", "sqlite:%s/orderd.db" % tmp],
        "idem-gateway": [os.path.join(BIN, "idem-gateway"), "serve", "--config", gw_conf],
    }


@test
def every_server_refuses_a_port_another_process_holds(ctx):
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        for name, cmd in commands(port, tmp).items():
            first, _ = start(cmd, tmp)
            try:
                expect(first.poll() is None, "%s: the first one listens on %d" % (name, port))
                second = subprocess.run(cmd, cwd=tmp, capture_output=True, timeout=30)
                expect(second.returncode != 0, "%s: a second one on the same port exits non-zero "
                       "(it exited %d: %s)" % (name, second.returncode, second.stdout[-300:]))
                expect(b"in use" in second.stderr, "%s: and says the address is in use: %s"
                       % (name, second.stderr[-300:]))
                expect(b"listening" not in second.stdout, "%s: and never says it listens" % name)
            finally:
                first.terminate()
                first.wait(30)
                first.stdout.close()
                first.stderr.close()
            # Once the first has stopped, the port is free again at once (TIME_WAIT is no hold).
            again, out = start(cmd, tmp)
            try:
                expect_eq(again.poll(), None, "%s: starts again on the port just given up (%s)"
                          % (name, out[-200:]))
            finally:
                again.terminate()
                again.wait(30)
                again.stdout.close()
                again.stderr.close()


@test
def a_token_made_in_a_new_database_says_so(ctx):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [os.path.join(BIN, "orderd"), "token", "create", "--db",
               "sqlite:%s/var/nosuch.db" % tmp, "--user", "demo"]
        first = subprocess.run(cmd, capture_output=True, timeout=60)
        expect_eq(first.returncode, 0, "a token in a database made for it")
        expect(first.stdout.startswith(b"idem_") and first.stdout.count(b"\n") == 1,
               "the token alone on stdout: %r" % first.stdout)
        expect(b"warning: there was no database at" in first.stderr,
               "a warning that the database is new: %r" % first.stderr)
        again = subprocess.run(cmd, capture_output=True, timeout=60)
        expect_eq(again.returncode, 0, "a second token")
        expect_eq(again.stderr, b"", "no warning once the database exists")


@test
def a_store_path_s_missing_directories_are_made(ctx):
    with tempfile.TemporaryDirectory() as tmp:
        conf = os.path.join(tmp, "gw.yaml")
        db = os.path.join(tmp, "var", "lib", "idem-gateway", "gateway.db")
        with open(conf, "w") as f:
            f.write("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nstore: sqlite:%s\n"
                    "upstream: {url: 'http://127.0.0.1:9'}\n" % db)
        gw, out = start([os.path.join(BIN, "idem-gateway"), "serve", "--config", conf], tmp)
        try:
            expect(gw.poll() is None, "the gateway serves with a store in directories not made "
                   "yet: %r %r" % (out, gw.stderr.read() if gw.poll() is not None else ""))
            expect(os.path.exists(db), "its database is made")
            expect_eq(os.stat(db).st_mode & 0o777, 0o600, "readable by its owner only")
        finally:
            gw.terminate()
            gw.wait(30)
            gw.stdout.close()
            gw.stderr.close()


@test
def number_flags_take_plain_decimal_numbers_only(ctx):
    # One parser (parse_double) behind every fractional flag: provider-sim's rates, idem-check
    # chaos's rates and the idem CLI's seconds.  strtod alone would take each of these.
    sim = os.path.join(BIN, "provider-sim")
    idem = os.path.join(BIN, "idem")
    for bad in ("inf", "nan", " 0.5", "0.5x", "0x1p-1", "1.5", ""):
        p = subprocess.run([sim, "--fail-rate", bad], capture_output=True, timeout=30)
        expect(p.returncode == 2 and b"--fail-rate must be a number from 0 to 1, not '%s'"
               % bad.encode() in p.stderr, "provider-sim --fail-rate %r: %d %r"
               % (bad, p.returncode, p.stderr))
    for bad in ("nan", "inf", "0x10", "0", "90000"):
        p = subprocess.run([idem, "get", "http://127.0.0.1:9/x", "--max-time", bad],
                           capture_output=True, timeout=30)
        expect(p.returncode == 2 and b"--max-time" in p.stderr, "idem --max-time %r: %d %r"
               % (bad, p.returncode, p.stderr))
    for bad in ("nan", "-0.1", "1e9"):
        p = subprocess.run([os.path.join(BIN, "idem-check"), "chaos", "--drop-rate", bad],
                           capture_output=True, timeout=30)
        expect(p.returncode == 2 and b"--drop-rate" in p.stderr, "idem-check chaos --drop-rate "
               "%r: %d %r" % (bad, p.returncode, p.stderr))


@test
def option_mistakes_get_one_right_line_and_version_works_everywhere(ctx):
    gw = os.path.join(BIN, "idem-gateway")
    orderd = os.path.join(BIN, "orderd")
    for cmd, want in (([gw, "serve", "--bogus"], b"idem-gateway serve: unknown option '--bogus'"),
                      ([gw, "serve", "--config"],
                       b"idem-gateway serve: option '--config' needs a value"),
                      ([gw, "check-config", "-x"],
                       b"idem-gateway check-config: unknown option '-x'"),
                      ([gw, "keys", "show", "--nope"], b"idem-gateway keys: unknown option '--nope'"),
                      ([orderd, "serve", "--bogus"], b"orderd serve: unknown option '--bogus'"),
                      ([orderd, "serve", "--config"],
                       b"orderd serve: option '--config' needs a value")):
        p = subprocess.run(cmd, capture_output=True, timeout=30)
        expect_eq(p.returncode, 2, "%s exits 2" % " ".join(cmd[1:]))
        lines = p.stderr.decode().splitlines()
        expect(len(lines) == 2 and lines[0].encode() == want and "--help" in lines[1],
               "%s: one line saying what is wrong, one pointing at --help: %r"
               % (" ".join(cmd[1:]), p.stderr))
    for cmd in ([gw, "serve", "--version"], [gw, "check-config", "--version"],
                [gw, "keys", "show", "--version"], [orderd, "serve", "--version"],
                [orderd, "token", "create", "--version"]):
        p = subprocess.run(cmd, capture_output=True, timeout=30)
        expect(p.returncode == 0 and re.match(rb"(idem-gateway|orderd) \d", p.stdout),
               "%s shows the version: %r %r" % (" ".join(cmd[1:]), p.stdout, p.stderr))


@test
def retry_after_is_a_wait_a_client_can_act_on(ctx):
    up = Upstream()
    gw = Gateway(up, upstream_timeout="15s", name="gateway-retry-after")  # a lease of 25 s
    try:
        gw.start()
        k = "ra-%d" % os.getpid()
        first = harness.in_thread(lambda: gw.request("POST", "/v1/things", {"n": 1}, key=k,
                                                     headers={"X-Test-Mode": "slow:5000"}))
        harness.wait_until("the first request to reach the upstream", lambda: up.executions(k))
        dup = gw.request("POST", "/v1/things", {"n": 1}, key=k)  # waits `wait` (2 s), then 409
        harness.expect_problem(dup, 409, "idempotency-request-in-progress", "a duplicate")
        ra = int(dup.header("Retry-After"))
        expect(1 <= ra <= 5, "Retry-After about as long as the first has run (2-3 s), not the "
               "rest of its 25 s lease: %d" % ra)
        expect_eq(harness.joined(*first, "the first request").status, 201, "the first")
        # A held key: the first answer says what every retry will say.
        k2 = k + "-held"
        lost = gw.request("POST", "/v1/things", {"n": 1}, key=k2, headers={"X-Test-Mode": "reset"})
        harness.expect_problem(lost, 502, "outcome-unknown", "an answer lost")
        retry = gw.request("POST", "/v1/things", {"n": 1}, key=k2)
        harness.expect_problem(retry, 503, "outcome-unknown", "its retry, held")
        expect_eq(lost.header("Retry-After"), retry.header("Retry-After"),
                  "the first answer's Retry-After is the held retries'")
    finally:
        gw.close()
        up.close()


@test
def idem_check_checks_the_quick_start_gateway(ctx):
    # docs/idem-check.md, "Checking an idem-gateway": the gateway's principal from a header.
    with tempfile.TemporaryDirectory() as tmp:
        uport, gport = free_port(), free_port()
        up, _ = start([sys.executable, os.path.join(harness.REPO, "examples", "payments_upstream.py"),
                       "--port", str(uport)], tmp)
        conf = os.path.join(tmp, "gateway.yaml")
        with open(conf, "w") as f:
            f.write("listen: 127.0.0.1:%d\nadmin_listen: 127.0.0.1:0\nstore: sqlite:./gateway.db\n"
                    "upstream: {url: 'http://127.0.0.1:%d'}\nprincipal: {header: X-Consumer-Id}\n"
                    "routes:\n  - match: POST /v1/payments\n    operation: payments.create\n"
                    % (gport, uport))
        gw, _ = start([os.path.join(BIN, "idem-gateway"), "serve", "--config", conf], tmp)
        try:
            p = subprocess.run(
                [os.path.join(BIN, "idem-check"), "conformance", "--url",
                 "http://127.0.0.1:%d" % gport, "--path", "/v1/payments",
                 "--header", "X-Consumer-Id: acct_1", "--header2", "X-Consumer-Id: acct_2",
                 "--body", '{"amount":500}', "--invalid-body", '{"amount":-1}',
                 "--count-url", "http://127.0.0.1:%d/v1/payments" % uport, "--json"],
                capture_output=True, timeout=120)
            expect_eq(p.returncode, 0, "idem-check conformance through the gateway: %s %s"
                      % (p.stdout.decode()[-2000:], p.stderr.decode()))
            checks = json.loads(p.stdout)["checks"]
            verdicts = {c["id"]: c["result"] for c in checks}
            storm = json.dumps([c for c in checks if c["id"] == "storm"])
            expect("1 new effect(s) counted" in storm,
                   "the storm counted one execution upstream: %s" % storm)
            expect(sum(1 for v in verdicts.values() if v == "PASS") >= 8 and
                   all(v in ("PASS", "SKIP") for v in verdicts.values()), "%s" % verdicts)
            # A caller the gateway does not know: one clear failure, not a wrong verdict per check.
            p = subprocess.run(
                [os.path.join(BIN, "idem-check"), "conformance", "--url",
                 "http://127.0.0.1:%d" % gport, "--path", "/v1/payments",
                 "--header", "X-Other: acct_1", "--header2", "X-Other: acct_2",
                 "--body", '{"amount":500}', "--json"], capture_output=True, timeout=120)
            checks = json.loads(p.stdout)["checks"]
            expect(p.returncode == 1 and [c["id"] for c in checks] == ["caller"] and
                   "--header" in json.dumps(checks), "an unknown caller: %s" % checks)
            bad = subprocess.run(
                [os.path.join(BIN, "idem-check"), "conformance", "--url", "http://127.0.0.1:1",
                 "--header", "no colon here", "--header2", "X-Consumer-Id: b"],
                capture_output=True, timeout=30)
            expect(bad.returncode == 2 and b"--header wants 'Name: value'" in bad.stderr,
                   "a header that is not one: %r" % bad.stderr)
        finally:
            for proc in (gw, up):
                proc.terminate()
                proc.wait(30)
                proc.stdout.close()
                proc.stderr.close()


@test
def the_idem_cli_says_where_a_request_stands_on_ctrl_c(ctx):
    with tempfile.TemporaryDirectory() as tmp:
        silent = socket.socket()  # accepts, reads, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        silent.settimeout(30)  # accept() and recv() below wait 30 s at most
        url = "http://127.0.0.1:%d/api/orders" % silent.getsockname()[1]
        journal = os.path.join(tmp, "journal")
        p = subprocess.Popen([os.path.join(BIN, "idem"), "post", url, "-d", '{"n":1}',
                              "--intent", "first-order", "--journal", journal],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            conn = silent.accept()[0]
            conn.settimeout(30)
            expect(conn.recv(65536).startswith(b"POST /api/orders"), "the request arrived")
            p.send_signal(2)  # SIGINT, as Ctrl-C
            _, err = p.communicate(timeout=30)
            expect_eq(p.returncode, 130, "exit status after Ctrl-C")
            expect(b'interrupted; intent "first-order" keeps its key' in err and
                   journal.encode() in err and b"run the same command again" in err,
                   "it says the intent keeps its key and how to retry: %r" % err)
            conn.close()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            silent.close()


@test
def check_config_opens_the_store_as_serve_would(ctx):
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        ro = os.path.join(tmp, "ro")
        os.mkdir(ro, 0o555 if os.geteuid() != 0 else 0o755)
        conf = os.path.join(tmp, "gateway.yaml")
        with open(conf, "w") as f:
            f.write("store: sqlite:%s/gateway.db\nupstream: {url: 'http://127.0.0.1:9'}\n"
                    "principal: {header: X-Consumer-Id}\n"
                    "routes:\n  - match: POST /v1/payments\n    operation: payments.create\n" % ro)
        os.chmod(conf, 0o644)
        gw = os.path.join(BIN, "idem-gateway")
        p = subprocess.run(as_another_user([gw, "check-config", "--config", conf]),
                           capture_output=True, timeout=30)
        expect_eq(p.stdout, b"", "no 'ok' for a config whose store cannot be made")
        expect(p.returncode == 1 and b"cannot be made" in p.stderr and
               b"Permission denied" in p.stderr, "its store cannot be made: %r" % p.stderr)
        p = subprocess.run(as_another_user([gw, "check-config", "--config", conf, "--no-store"]),
                           capture_output=True, timeout=30)
        expect_eq(p.returncode, 0, "--no-store checks the file only")
        expect_eq(p.stdout, ("%s: ok (1 route, store not checked)\n" % conf).encode(),
                  "and says what it did not check")
        # A store that is there but is not a database: the file is fine, the whole is not.
        with open(os.path.join(tmp, "garbage.db"), "wb") as f:
            f.write(b"not a database" * 512)
        with open(conf, "w") as f:
            f.write("store: sqlite:garbage.db\nupstream: {url: 'http://127.0.0.1:9'}\n"
                    "principal: {header: X-Consumer-Id}\n")
        p = subprocess.run([gw, "check-config", "--config", conf], capture_output=True, timeout=30)
        expect(p.returncode == 1 and p.stdout == b"" and b"the store cannot be opened" in p.stderr,
               "ok is said only when everything checked holds: %r %r" % (p.stdout, p.stderr))


@test
def every_command_reads_the_store_serve_writes(ctx):
    # A relative store path is beside the config file, for serve, check-config and keys alike,
    # whichever directory each runs in; the read-only commands never make a store.
    with tempfile.TemporaryDirectory() as tmp:
        conf_dir, elsewhere = os.path.join(tmp, "etc"), os.path.join(tmp, "elsewhere")
        os.mkdir(conf_dir)
        os.mkdir(elsewhere)
        conf = os.path.join(conf_dir, "gateway.yaml")
        store = os.path.join(conf_dir, "gw.db")
        with open(conf, "w") as f:
            f.write("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nstore: sqlite:gw.db\n"
                    "upstream: {url: 'http://127.0.0.1:9'}\nprincipal: {header: X-Consumer-Id}\n"
                    "routes:\n  - match: POST /v1/payments\n    operation: payments.create\n")
        gw = os.path.join(BIN, "idem-gateway")

        def run(*args):
            return subprocess.run([gw] + list(args) + ["--config", conf], cwd=elsewhere,
                                  capture_output=True, timeout=30)
        p = run("check-config")
        expect(p.returncode == 0 and b"ok (1 route)" in p.stdout, "check-config: %r" % (p,))
        p = run("keys", "list")
        expect(p.returncode == 1 and ("no store at %s" % store).encode() in p.stderr,
               "keys list on a store serve has not made names the path it looked at: %r" % (p,))
        p = run("keys", "show", "--principal", "a", "--operation", "payments.create", "--key", "k")
        expect(p.returncode == 1 and ("no store at %s" % store).encode() in p.stderr,
               "keys show likewise: %r" % (p,))
        expect_eq(sorted(os.listdir(elsewhere)), [], "and nothing was made where they ran")
        expect_eq(sorted(os.listdir(conf_dir)), ["gateway.yaml"], "nor beside the config")

        server, _ = start([gw, "serve", "--config", conf], cwd=elsewhere)
        try:
            expect(server.poll() is None, "serve runs")
            expect(os.path.exists(store), "serve made its store beside the config")
            p = run("keys", "list")
            expect(p.returncode == 0 and json.loads(p.stdout) == {"records": [], "next": None},
                   "keys list reads serve's store from another directory: %r" % (p,))
            p = subprocess.run([gw, "keys", "list", "--config", os.path.relpath(conf, "/")],
                               cwd="/", capture_output=True, timeout=30)
            expect_eq(p.returncode, 0, "and with a relative --config from yet another: %r" % (p,))
        finally:
            server.terminate()
            server.wait(timeout=30)
        expect_eq(sorted(os.listdir(elsewhere)), [], "no stray store where serve ran")


@test
def a_config_that_cannot_be_read_names_no_line(ctx):
    gw = os.path.join(BIN, "idem-gateway")
    p = subprocess.run([gw, "check-config", "--config", "/nonexistent/gateway.yaml"],
                       capture_output=True, timeout=30)
    expect_eq(p.stderr, b"/nonexistent/gateway.yaml: cannot read: No such file or directory\n",
              "the file's name and why, no line 0")


def as_another_user(cmd):
    """`cmd` run as a user who cannot write where root can: nobody, when the test runs as root."""
    if os.geteuid() == 0:
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] + cmd
    return cmd


@test
def sqlite_errors_say_the_cause(ctx):
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        ro = os.path.join(tmp, "ro")
        os.mkdir(ro, 0o755)  # root's, or read-only for a user who is not root
        if os.geteuid() != 0:
            os.chmod(ro, 0o555)
        orderd = os.path.join(BIN, "orderd")
        # A database that cannot be made: the system's reason, not "unable to open".
        p = subprocess.run(as_another_user([orderd, "migrate", "--db", "sqlite:%s/x.db" % ro]),
                           capture_output=True, timeout=60)
        expect(p.returncode != 0, "migrate in a directory it cannot write fails")
        expect(b"cannot create %s/x.db: Permission denied" % ro.encode() in p.stderr,
               "and says why: %r" % p.stderr)
        # A writable file in a read-only directory: the -wal and -shm files are named.
        db = os.path.join(ro, "y.db")
        open(db, "w").close()
        if os.geteuid() == 0:
            os.chown(db, 65534, 65534)
        else:
            os.chmod(db, 0o644)
        p = subprocess.run(as_another_user([orderd, "migrate", "--db", "sqlite:" + db]),
                           capture_output=True, timeout=60)
        expect(p.returncode != 0, "migrate beside a file it can write but no -wal fails")
        expect(b"-wal and " in p.stderr and b"directory must be writable" in p.stderr,
               "and names the files SQLite writes beside the database: %r" % p.stderr)
        if os.geteuid() != 0:
            os.chmod(ro, 0o755)


if __name__ == "__main__":
    harness.run("first-hour")
