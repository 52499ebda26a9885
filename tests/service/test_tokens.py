#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_tokens.py - bearer tokens as an operator handles them:

  - `orderd token list` shows every token by id (the first 12 hex digits of its SHA-256), date
    and user, or one user's; nothing printed can be used to authenticate;
  - `orderd token revoke --token | --token-id | --user` deletes them; a running orderd stops
    accepting a revoked token within its cache's lifetime (5 s), a new one at once;
  - a malformed or unknown token is 401 without the store being asked more than it must: the
    shape is checked first, and an unknown token is remembered briefly;
  - a flood of made-up tokens cannot take the store's pool from requests with real tokens: at
    most half the pool looks tokens up at once, the rest get 503 server-busy (PostgreSQL, where a
    lock can hold a lookup; skipped on SQLite, whose readers never wait).
"""

import hashlib
import re
import secrets
import subprocess
import threading
import time

import harness
from harness import ORDERD, Server, expect, expect_eq, expect_problem, psql, store_kind, test


def token_cli(server, *args):
    p = subprocess.run([ORDERD, "token"] + list(args) + ["--db", server.db_uri],
                       capture_output=True, timeout=30)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def token_id(token):
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def setup():
    return Server(name="orderd-tokens").start()


def teardown(s):
    if s:
        s.close()


@test
def list_shows_ids_users_and_dates_never_tokens(s):
    a1 = s.create_token("list-ann")
    a2 = s.create_token("list-ann")
    b1 = s.create_token("list-bob")
    code, out, err = token_cli(s, "list")
    expect_eq(code, 0, "token list (stderr %r)" % err)
    for t in (a1, a2, b1):
        expect(token_id(t) in out, "token id %s listed:\n%s" % (token_id(t), out))
        expect(t not in out and hashlib.sha256(t.encode()).hexdigest() not in out,
               "neither the token nor its whole hash is printed")
    code, out, err = token_cli(s, "list", "--user", "list-ann")
    rows = [ln for ln in out.splitlines()[1:] if ln.strip()]
    expect(code == 0 and len(rows) == 2 and all("list-ann" in r for r in rows),
           "one user's tokens: %r" % out)
    expect(re.match(r"^[0-9a-f]{12}  \d{4}-\d\d-\d\dT", rows[0]) is not None,
           "id then date: %r" % rows[0])


@test
def revoke_by_token_id_and_user(s):
    t1 = s.create_token("rev-cid")
    t2 = s.create_token("rev-cid")
    t3 = s.create_token("rev-dan")
    code, out, err = token_cli(s, "revoke", "--token", t1)
    expect_eq((code, out.strip()), (0, "1 token revoked"), "revoke --token (stderr %r)" % err)
    code, out, err = token_cli(s, "revoke", "--token-id", token_id(t2)[:10])
    expect_eq((code, out.strip()), (0, "1 token revoked"), "revoke --token-id (stderr %r)" % err)
    code, out, err = token_cli(s, "revoke", "--user", "rev-dan")
    expect_eq((code, out.strip()), (0, "1 token revoked"), "revoke --user (stderr %r)" % err)
    code, out, err = token_cli(s, "revoke", "--token", t3)
    expect_eq((code, out.strip()), (0, "0 tokens revoked"), "revoking it again")
    code, out, err = token_cli(s, "list", "--user", "rev-cid")
    expect(code == 0 and len(out.splitlines()) == 1, "nothing left of rev-cid: %r" % out)
    # A fresh orderd refuses them at once.
    with Server(name="orderd-tokens-fresh", db_uri=s.db_uri) as fresh:
        for t in (t1, t2, t3):
            r = fresh.client(t).get("/api/orders")
            expect_problem(r, 401, "unauthorized", "a revoked token")
    # Usage mistakes exit 2 with a sentence.
    for args in (["revoke"], ["revoke", "--user", "x", "--token", t1],
                 ["revoke", "--token-id", "xyz"], ["list", "--token", t1]):
        code, out, err = token_cli(s, *args)
        expect(code == 2 and err.strip(), "orderd token %s: %d %r" % (" ".join(args), code, err))


@test
def a_running_orderd_stops_accepting_a_revoked_token_within_its_cache_ttl(s):
    t = s.create_token("rev-live")
    c = s.client(t)
    expect_eq(c.get("/api/orders").status, 200, "the token works (and is cached)")
    code, out, err = token_cli(s, "revoke", "--token", t)
    expect_eq(code, 0, "revoke (stderr %r)" % err)
    # The token was cached by the GET above, before the revocation, for 5 s (AUTH_CACHE_TTL_MS):
    # a request SENT later than that (plus a little) must be refused, however long it takes.
    t0 = time.monotonic()
    while True:
        t_sent = time.monotonic()
        if c.get("/api/orders").status != 200:
            break
        expect(t_sent - t0 < 5.5, "still accepted %.1f s after revoking" % (t_sent - t0))
        time.sleep(0.2)
    expect_problem(c.get("/api/orders"), 401, "unauthorized", "after the cache's lifetime")


@test
def malformed_and_unknown_tokens_are_401(s):
    for value in ("Bearer abc", "Bearer idem_" + "g" * 64, "Bearer idem_" + "0" * 63,
                  "Basic dXNlcjpwYXNz", "Bearer idem_" + "A" * 64):
        r = harness.Client(s).request("GET", "/api/orders", headers={"Authorization": value},
                                      token=None)
        expect_problem(r, 401, "unauthorized", "Authorization: %s" % value)
    unknown = "idem_" + secrets.token_hex(32)
    for _ in range(3):
        expect_problem(s.client(unknown).get("/api/orders"), 401, "unauthorized",
                       "an unknown token, again")


@test
def made_up_tokens_cannot_take_the_pool(s):
    if store_kind(s.db_uri) != "postgresql":
        print("     (skipped: SQLite readers never wait on a lock, so no lookup can be held)")
        return
    with Server(name="orderd-tokens-pool", db_uri=s.db_uri, extra_args=["--db-pool", "2"]) as p:
        real = p.client(p.create_token("pool-real"))
        expect_eq(real.get("/api/orders").status, 200, "the real token, now cached")
        # Hold the one lookup this orderd allows (half its pool of 2): lock the tokens table.
        holder = subprocess.Popen([harness.pg_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                                   "-d", p.db_uri], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        holder.stdin.write(b"BEGIN;\nLOCK TABLE tokens IN ACCESS EXCLUSIVE MODE;\n")
        holder.stdin.flush()
        try:
            deadline = time.monotonic() + 15
            while not psql(p.db_uri, "SELECT count(*) FROM pg_locks l JOIN pg_class c ON "
                           "c.oid = l.relation WHERE c.relname = 'tokens' AND l.granted AND "
                           "l.mode = 'AccessExclusiveLock';\n")[0][0] != "0":
                expect(time.monotonic() < deadline, "psql could not lock tokens")
                time.sleep(0.05)
            first = {}
            t = threading.Thread(target=lambda: first.setdefault(
                "r", p.client("idem_" + secrets.token_hex(32)).get("/api/orders")))
            t.start()
            harness.wait_until(
                "the first made-up token's lookup to wait on the lock",
                lambda: psql(p.db_uri, "SELECT count(*) FROM pg_locks l JOIN pg_class c ON "
                             "c.oid = l.relation WHERE c.relname = 'tokens' AND NOT l.granted;\n"
                             )[0][0] != "0")
            r = p.client("idem_" + secrets.token_hex(32)).get("/api/orders")
            expect_problem(r, 503, "server-busy", "a second made-up token while one is looked up")
            expect_eq(real.get("/api/orders").status, 200,
                      "a real, cached token still gets in")
        finally:
            holder.stdin.write(b"ROLLBACK;\n")
            holder.stdin.close()
            holder.wait(15)
        t.join(30)
        expect(first.get("r") is not None and first["r"].status in (401, 503),
               "the held lookup ends once the lock goes: %r" % first.get("r"))


if __name__ == "__main__":
    harness.run("tokens", setup=setup, teardown=teardown)
