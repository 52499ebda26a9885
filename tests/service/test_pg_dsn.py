#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_pg_dsn.py - `orderd --db` takes libpq URIs and key=value strings, and never shows a password.

A connection string may carry a password.  Whatever orderd prints -- the start-up and request log
(text and JSON), the errors of a store it cannot open (refused connection, unknown database,
wrong password, malformed string), usage errors, and every --help -- must not contain it, in any
form the string had it (plain, percent-encoded, quoted).  The password here is a real one: the
test gives a role a SCRAM password and makes the cluster ask for it on TCP.

Runs only under tests/pg/with_pg.sh (CTest: service-pg.pg_dsn); without IDEM_TEST_PG_URI it
FAILS with a message saying so.
"""

import os
import re
import socket
import subprocess
import sys
import urllib.parse
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (ORDERD, Server, TestFailure, expect, expect_eq, expect_status,  # noqa: E402
                     fail, new_key, pg_create_database, pg_drop_database, pg_uri_with_db,
                     psql, run, test)

ROLE = "idem_pw_user"
# Characters a URI must percent-encode, and a recognisable core to search for.
SECRET = "S3cr3t-Pw/x@y:z%q"
CORE = "S3cr3t-Pw"
# What must never appear: the password, its URI-encoded form, and its distinctive core.
FORBIDDEN = [SECRET, urllib.parse.quote(SECRET, safe=""), CORE]
URI_WITH_PASSWORD_RE = re.compile(r"[a-z]+://[^\s/@:]*:(?!\*+@)[^\s/@]+@")  # "***" is masked


class Ctx:
    def __init__(self):
        admin = os.environ.get("IDEM_TEST_PG_URI")
        data = os.environ.get("IDEM_TEST_PG_DATA")
        if not admin or not data:
            raise TestFailure(
                "IDEM_TEST_PG_URI / IDEM_TEST_PG_DATA are not set: run under tests/pg/with_pg.sh "
                "(`sh tests/pg/with_pg.sh python3 tests/service/test_pg_dsn.py`; CTest: "
                "service-pg.pg_dsn).  This test does not skip.")
        self.admin = admin
        self.port = int(os.environ["IDEM_TEST_PG_PORT"])
        self.db_uri, self.db_name = pg_create_database("dsn")
        # A role with a real password, which the server asks for on TCP (scram-sha-256).
        psql(admin, "SET password_encryption = 'scram-sha-256';\n"
                    "CREATE ROLE %s LOGIN PASSWORD :'pw';\n"
                    "GRANT ALL ON DATABASE \"%s\" TO %s;\n" % (ROLE, self.db_name, ROLE),
             {"pw": SECRET})
        psql(pg_uri_with_db(admin, self.db_name), "GRANT ALL ON SCHEMA public TO %s;\n" % ROLE)
        hba = os.path.join(data, "pg_hba.conf")
        with open(hba) as f:
            old = f.read()
        with open(hba, "w") as f:  # first match wins: this line before the trust ones
            f.write("host all %s 127.0.0.1/32 scram-sha-256\n%s" % (ROLE, old))
        psql(admin, "SELECT pg_reload_conf();\n")

    def uri(self, password=SECRET, db=None, port=None):
        return "postgresql://%s:%s@127.0.0.1:%d/%s" % (
            ROLE, urllib.parse.quote(password, safe=""), port or self.port, db or self.db_name)

    def kv(self, password=SECRET, db=None, port=None):
        return "host=127.0.0.1 port=%d dbname=%s user=%s password='%s'" % (
            port or self.port, db or self.db_name, ROLE,
            password.replace("\\", "\\\\").replace("'", "\\'"))

    def close(self):
        pg_drop_database(self.db_name)
        psql(self.admin, "DROP ROLE IF EXISTS %s;\n" % ROLE, check=False)


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def expect_no_secret(text, what):
    for f in FORBIDDEN:
        if f in text:
            fail("%s shows the password (%r):\n%s" % (what, f, text[:3000]))
    m = URI_WITH_PASSWORD_RE.search(text)
    if m:
        fail("%s shows a URI with a password (%r):\n%s" % (what, m.group(0), text[:3000]))


def orderd(args, timeout=40):
    p = subprocess.run([ORDERD] + args, capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def expect_refused(args, what, status=1, says=None):
    rc, out, err = orderd(args)
    text = out + err
    expect_no_secret(text, what)
    if rc != status:
        fail("%s: expected exit %d, got %d\nstdout: %s\nstderr: %s" % (what, status, rc, out, err))
    expect(err.strip() != "", "%s: no message on stderr" % what)
    if says is not None:
        expect(says in err, "%s: expected %r in the message: %s" % (what, says, err))
    return err


# ---- it works, and says nothing of the password --------------------------------------------

def _serve_and_use(ctx, db, fmt):
    s = Server(db_uri=db, name="orderd-dsn-" + fmt, extra_args=["--log-format", fmt])
    try:
        s.start()
        u = s.new_user("dsn")
        k = new_key("dsn")
        expect_status(u.create_order(k), 201, "an order through %s" % fmt)
        expect_status(u.create_order(k), 201, "its replay")
        expect_status(u.create_order(k, quantity=9), 422, "a mismatch")
        expect_status(u.create_order(new_key(), product="no-such"), 422, "an unknown product")
        expect_status(s.client().get("/healthz"), 200, "healthz")
        s.stop()
        with open(s.stdout_path) as f:
            out = f.read()
        with open(s.stderr_path) as f:
            err = f.read()
        expect(err.count("/api/orders") >= 4, "the request log is missing (%s): %s" % (fmt, err))
        expect_no_secret(out + err, "orderd serve's output (--log-format %s)" % fmt)
    finally:
        s.close()


@test
def test_uri_with_password_serves_and_never_logs_it(ctx):
    # The role needs its password: a wrong one is refused, so this proves the URI's is used.
    _serve_and_use(ctx, ctx.uri(), "text")
    _serve_and_use(ctx, ctx.uri(), "json")


@test
def test_key_value_string_with_password_serves_and_never_logs_it(ctx):
    _serve_and_use(ctx, ctx.kv(), "text")
    rc, out, err = orderd(["migrate", "--db", ctx.kv()])
    expect_eq(rc, 0, "orderd migrate with a key=value string (stderr: %s)" % err)
    expect_no_secret(out + err, "orderd migrate")
    rc, out, err = orderd(["token", "create", "--db", ctx.kv(), "--user", "kv-user"])
    expect_eq(rc, 0, "orderd token create with a key=value string (stderr: %s)" % err)
    expect_no_secret(err, "orderd token create")


# ---- errors: the server is named, the password is not --------------------------------------

@test
def test_store_errors_never_show_the_password(ctx):
    cases = [
        ("wrong password (URI)", ctx.uri(password=SECRET + "-wrong"), "password authentication"),
        ("wrong password (key=value)", ctx.kv(password=SECRET + "-wrong"),
         "password authentication"),
        ("nothing listens (URI)", ctx.uri(port=closed_port()), None),
        ("nothing listens (key=value)", ctx.kv(port=closed_port()), None),
        ("unknown database", ctx.uri(db="no_such_db_" + uuid.uuid4().hex[:8]), "does not exist"),
        ("bad port in the URI", "postgresql://%s:%s@127.0.0.1:notaport/x" % (
            ROLE, urllib.parse.quote(SECRET, safe="")), None),
        ("bad percent-encoding", "postgresql://%s:%s%%zz@127.0.0.1:%d/x" % (
            ROLE, CORE, ctx.port), None),
        ("unterminated quote", "host=127.0.0.1 user=%s password='%s" % (ROLE, CORE), None),
        ("unknown keyword", "host=127.0.0.1 password=%s nosuchkey=1" % CORE, None),
    ]
    shown = []
    for what, db, says in cases:
        for cmd in (["serve", "--listen", "127.0.0.1:0", "--db", db], ["migrate", "--db", db],
                    ["token", "create", "--db", db, "--user", "x"]):
            err = expect_refused(cmd, "orderd %s, %s" % (cmd[0], what), says=says)
        shown.append("%s: %s" % (what, err.strip().splitlines()[0][:160]))
    print("     " + "\n     ".join(shown))


@test
def test_usage_errors_never_echo_the_password(ctx):
    uri = ctx.uri()
    cases = [
        ([uri], "a URI as the command"),
        ([ctx.kv()], "a key=value string as the command"),
        (["serve", uri], "a URI without --db"),
        (["migrate", uri], "a URI without --db (migrate)"),
        (["serve", "--db-pool", uri], "a URI as --db-pool"),
        (["serve", "--lease-ms", ctx.kv()], "a key=value string as --lease-ms"),
        (["serve", "--listen", uri], "a URI as --listen"),
        (["token", "create", "--db", uri, "--user", "u", uri], "an extra argument"),
    ]
    for args, what in cases:
        expect_refused(args, "orderd " + what, status=2)


@test
def test_help_texts_show_no_password(ctx):
    for args in (["--help"], ["serve", "--help"], ["migrate", "--help"],
                 ["token", "create", "--help"], ["token", "--help"]):
        rc, out, err = orderd(args)
        expect_eq(rc, 0, "orderd %s" % " ".join(args))
        expect_no_secret(out + err, "orderd %s" % " ".join(args))
        expect("password=" not in (out + err).lower(),
               "orderd %s shows a password= example: %s" % (" ".join(args), out))


if __name__ == "__main__":
    run("test_pg_dsn", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
