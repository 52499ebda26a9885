# SPDX-License-Identifier: Apache-2.0
"""
test_client.py - the `idem` CLI (libidem-client) against a real orderd, over real HTTP, with
faults made by tests/service/faultproxy.py.

Checklist point 1 is the client's: one key per business intent, reused for every retry.  These
tests check what a user of the CLI relies on: answers lost after the server executed, and
connections reset, end in exactly one order and in the body of the first execution; a 409 "still
in progress" is waited out as its Retry-After says; a final 4xx is never retried; a CLI killed
mid-request and run again with the same --intent reuses the journaled key; a damaged journal is
reported with its file and line instead of being used.

Measurements (attempts, pauses, time) are printed as "measured: ..." lines.

service-tests: sqlite-only - the client is what is under test here; the store behind orderd does
not change what the client sends or how it retries (test_http_semantics covers both stores).
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from faultproxy import DROP, FORWARD, RESET, FaultProxy, split_http  # noqa: E402
from harness import (BIN, Server, expect, expect_eq, expect_status,  # noqa: E402
                     fail, new_key, run, test, wait_until, wait_order_committed)

IDEM = os.path.join(BIN, "idem")
ORDER = '{"productId":"p-1024","quantity":2}'
LEASE_MS = 5000  # with orderd's 2 s wait_ms: a 409 carries Retry-After of about 3 s

# Exit codes of docs/idem.1
EXIT_OK, EXIT_LOCAL, EXIT_USAGE, EXIT_4XX, EXIT_OTHER = 0, 1, 2, 3, 4
EXIT_EXHAUSTED, EXIT_TRANSPORT, EXIT_JOURNAL = 5, 6, 7

ATTEMPT_RE = re.compile(
    r"^idem: attempt (\d+): (?:HTTP (\d+)|no answer), waited (\d+) ms, took (\d+) ms; "
    r"(retry in (\d+) ms(?: \(Retry-After (\d+) ms\))?|final|giving up(?: \(Retry-After \d+ ms\))?"
    r"|failed): (.*)$")


class Attempt:
    def __init__(self, m):
        self.n = int(m.group(1))
        self.status = int(m.group(2)) if m.group(2) else None
        self.waited_ms = int(m.group(3))
        self.took_ms = int(m.group(4))
        self.action = m.group(5)
        self.next_delay_ms = int(m.group(6)) if m.group(6) else None
        self.retry_after_ms = int(m.group(7)) if m.group(7) else None
        self.reason = m.group(8)

    def __repr__(self):
        return "<attempt %d %s waited=%d took=%d %s>" % (
            self.n, self.status, self.waited_ms, self.took_ms, self.action)


class Result:
    def __init__(self, args, rc, out, err, elapsed):
        self.args = args
        self.rc = rc
        self.out = out
        self.err = err
        self.elapsed = elapsed
        self.attempts = [Attempt(m) for m in
                         (ATTEMPT_RE.match(line) for line in err.splitlines()) if m]

    def describe(self):
        return "`idem %s` exited %s after %.2f s\nstdout: %r\nstderr:\n%s" % (
            " ".join(self.args), self.rc, self.elapsed, self.out[:1500], self.err)

    def body(self):
        """The body part of -i output, or all of stdout."""
        if self.out.startswith(b"HTTP/"):
            return self.out.partition(b"\r\n\r\n")[2]
        return self.out


def cli_env(extra=None):
    env = dict(os.environ)
    # The CLI honours the usual proxy variables, as curl does; loopback tests go direct.
    for k in list(env):
        if k.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            del env[k]
    env.pop("IDEM_TOKEN", None)
    env.update(extra or {})
    return env


def idem(args, env=None, timeout=60):
    t0 = time.monotonic()
    try:
        p = subprocess.run([IDEM] + args, capture_output=True, timeout=timeout, env=cli_env(env),
                           stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        fail("%s not found (IDEM_BIN=%s)" % (IDEM, BIN))
    return Result(args, p.returncode, p.stdout, p.stderr.decode("utf-8", "replace"),
                  time.monotonic() - t0)


def expect_rc(res, rc, what):
    if res.rc != rc:
        fail("%s: expected exit %d\n%s" % (what, rc, res.describe()))


def key_from_request(raw):
    m = re.search(rb"\r\nIdempotency-Key: ([^\r]*)\r\n", raw)
    return m.group(1).decode() if m else None


def journal_records(path):
    """[(type, intent, last)] of a journal file, for the tests' own bookkeeping."""
    out = []
    with open(path, "rb") as f:
        for line in f.read().split(b"\n"):
            if not line:
                continue
            _crc, _len, payload = line.split(b" ", 2)
            typ, _ms, name, last = payload.decode().split(" ")
            out.append((typ, name, last))
    return out


class Ctx:
    def __init__(self):
        self.server = Server(name="orderd-client", env={"ORDERD_TEST_HOOKS": "1"},
                             extra_args=["--lease-ms", str(LEASE_MS)]).start()
        self.tmp = tempfile.mkdtemp(prefix="idem-client-test-")

    def url(self, path="/api/orders"):
        return self.server.base_url + path

    def journal(self, name):
        return os.path.join(self.tmp, name, "journal")

    def close(self):
        self.server.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


@test
def test_help_and_usage_errors(ctx):
    res = idem(["--help"])
    expect_rc(res, EXIT_OK, "--help")
    for word in (b"post", b"put", b"get", b"delete", b"Exit codes", b"journal error"):
        expect(word in res.out, "--help does not mention %r:\n%s" % (word, res.describe()))
    for cmd in ("post", "put", "get", "delete", "journal"):
        res = idem([cmd, "--help"])
        expect_rc(res, EXIT_OK, cmd + " --help")
        expect(("idem %s" % cmd).encode() in res.out, "%s --help: %s" % (cmd, res.describe()))
    expect(b"--intent" in idem(["post", "--help"]).out, "post --help lacks --intent")
    expect(b"--intent" not in idem(["get", "--help"]).out, "get --help offers --intent")
    for args, why in ((["bogus"], "unknown command"),
                      (["post"], "needs a URL"),
                      (["post", ctx.url(), "--max-attempts", "0"], "--max-attempts"),
                      (["post", ctx.url(), "--max-time", "soon"], "--max-time"),
                      (["post", ctx.url(), "--key", "k", "--intent", "i"], "exclude each other"),
                      (["post", ctx.url(), "--key", "has space"], "bad --key"),
                      (["post", ctx.url(), "-H", "Idempotency-Key: x"], "not with -H"),
                      (["post", ctx.url(), "-H", "no colon"], "bad header"),
                      (["get", ctx.url(), "-d", "{}"], "sends no body"),
                      (["post", ctx.url(), "--frobnicate"], "unknown option")):
        res = idem(args)
        expect_rc(res, EXIT_USAGE, " ".join(args))
        expect(why in res.err, "`idem %s`: stderr should say %r:\n%s" % (
            " ".join(args), why, res.describe()))
    # A body file that cannot be read is a local failure, not a usage error.
    res = idem(["post", ctx.url(), "-d", "@/nonexistent/body.json"])
    expect_rc(res, EXIT_LOCAL, "-d @missing")


@test
def test_dropped_responses_then_success_make_one_order(ctx):
    """reset, drop, drop, forward: four attempts, one order, the first execution's body."""
    user = ctx.server.new_user("cli-drop")
    with FaultProxy(ctx.server.host, ctx.server.port) as proxy:
        proxy.plan([RESET, DROP, DROP, FORWARD])
        res = idem(["post", proxy.base_url + "/api/orders", "-d", ORDER, "--token", user.token,
                    "-i", "-v"])
        proxy.wait_idle()
        conns = list(proxy.connections)
    expect_rc(res, EXIT_OK, "post through reset/drop/drop/forward")
    expect_eq([a.status for a in res.attempts], [None, None, None, 201],
              "statuses per attempt (%s)" % res.err)
    expect_eq([a.n for a in res.attempts], [1, 2, 3, 4], "attempt numbers")
    for prev, cur in zip(res.attempts, res.attempts[1:]):
        expect_eq(cur.waited_ms, prev.next_delay_ms, "pause before attempt %d" % cur.n)
    expect_eq([c.mode for c in conns], [RESET, DROP, DROP, FORWARD], "proxy connections")
    for c in conns:
        expect(c.error is None, "proxy failed on %r" % c)

    # Every attempt sent the same bytes: the same key, the same body.
    key = key_from_request(conns[0].request)
    expect(key is not None, "no Idempotency-Key in %r" % conns[0].request[:400])
    for c in conns[1:]:
        expect_eq(c.request, conns[0].request, "request bytes of connection %d" % c.index)
    expect("with key %s" % key in res.err, "-v should name the key %s:\n%s" % (key, res.err))

    # The first execution happened behind the first DROP; its answer never reached the client.
    first_head, first_body = split_http(conns[1].response)
    expect(first_head.startswith("HTTP/1.1 201"), "first execution: %r" % conns[1].response[:300])
    expect("Idempotent-Replayed" not in first_head, "the first DROP was not the first execution")
    second_head, second_body = split_http(conns[2].response)
    expect("Idempotent-Replayed: true" in second_head, "second DROP: %r" % second_head)
    expect_eq(res.body(), first_body, "the body the CLI printed vs the first execution's")
    expect(b"\r\nIdempotent-Replayed: true\r\n" in res.out, "-i output: %r" % res.out[:600])
    expect(res.out.startswith(b"HTTP/1.1 201 "), "-i output: %r" % res.out[:200])

    orders = user.all_orders()
    expect_eq(len(orders), 1, "orders after four attempts")
    expect(orders[0]["orderId"].encode() in first_body, "the order is the first execution's")
    print("measured: reset/drop/drop/forward: %d attempts, statuses %s, pauses %s ms, "
          "%.3f s in all; 1 order" % (len(res.attempts), [a.status for a in res.attempts],
                                      [a.waited_ms for a in res.attempts[1:]], res.elapsed))


@test
def test_409_in_progress_then_replay_honours_retry_after(ctx):
    user = ctx.server.new_user("cli-409")
    key = new_key("cli409")
    first = {}

    def slow_first():
        try:
            first["resp"] = user.post("/api/orders", None, body=ORDER, key=key,
                                      headers={"X-Test-Delay-Ms": "4000"}, timeout=30)
        except Exception as e:  # noqa: BLE001 - reported below
            first["error"] = e

    t = threading.Thread(target=slow_first)
    t.start()
    # The first request holds the record: its order is committed (phase 1) and it sleeps.
    wait_order_committed(ctx.server, key, lambda: "error" in first)
    expect("error" not in first, "the direct first request failed: %r" % first.get("error"))
    res = idem(["post", ctx.url(), "-d", ORDER, "--key", key, "--token", user.token, "-v"])
    t.join(30)
    expect("error" not in first, "the direct first request failed: %r" % first.get("error"))
    expect_status(first["resp"], 201, "the direct first request")
    expect_rc(res, EXIT_OK, "post with the key of a request in progress")
    expect_eq([a.status for a in res.attempts], [409, 201], "statuses (%s)" % res.err)
    a1, a2 = res.attempts
    # orderd made the duplicate wait wait_ms (2 s) before answering 409 with Retry-After.
    expect(a1.took_ms >= 1800, "attempt 1 should take orderd's 2 s wait: %r" % a1)
    expect(a1.retry_after_ms is not None and a1.retry_after_ms >= 1000,
           "attempt 1 should carry Retry-After: %s" % res.err)
    expect_eq(a1.next_delay_ms, a1.retry_after_ms, "the pause is the Retry-After (backoff shorter)")
    expect_eq(a2.waited_ms, a1.retry_after_ms, "attempt 2 waited the Retry-After")
    expect(res.elapsed >= (a1.took_ms + a1.retry_after_ms) / 1000.0,
           "elapsed %.2f s is shorter than the 409 plus its Retry-After" % res.elapsed)
    expect_eq(res.out, first["resp"].body, "the replay is the first request's body")
    expect_eq(len(user.all_orders()), 1, "orders")
    print("measured: 409 after %d ms with Retry-After %d ms, waited %d ms, replay 201; "
          "%.3f s in all" % (a1.took_ms, a1.retry_after_ms, a2.waited_ms, res.elapsed))


@test
def test_final_4xx_is_not_retried(ctx):
    user = ctx.server.new_user("cli-422")
    key = new_key("cli422")
    expect_status(user.post("/api/orders", {"productId": "p-1024", "quantity": 1}, key=key), 201,
                  "first use of the key")
    # The same key with another body: 422 idempotency-key-reused, final.
    res = idem(["post", ctx.url(), "-d", ORDER, "--key", key, "--token", user.token, "-v"])
    expect_rc(res, EXIT_4XX, "422")
    expect_eq(len(res.attempts), 1, "attempts for a 422 (%s)" % res.err)
    expect_eq(res.attempts[0].status, 422, "status")
    expect_eq(res.attempts[0].action, "final", "action")
    expect(b'"code":"idempotency-key-reused"' in res.out, "stdout: %r" % res.out)
    expect(("--key %s was already used for another request" % key) in res.err,
           "the CLI says it in its own terms: %r" % res.err)
    # No token: 401 is final too; an unknown product (422, stored) as well.
    res = idem(["post", ctx.url(), "-d", ORDER, "-v"])
    expect_rc(res, EXIT_4XX, "401")
    expect_eq([a.status for a in res.attempts], [401], "attempts for a 401")
    res = idem(["post", ctx.url(), "-d", '{"productId":"nope","quantity":1}', "--token",
                user.token, "-v"])
    expect_rc(res, EXIT_4XX, "unknown product")
    expect_eq([a.status for a in res.attempts], [422], "attempts for unknown-product")
    expect_eq(len(user.all_orders()), 1, "orders")
    # An intent that ran one request, asked to send another: name a new --intent.
    with tempfile.TemporaryDirectory() as tmp:
        journal = os.path.join(tmp, "journal")
        args = ["post", ctx.url(), "--token", user.token, "--journal", journal,
                "--intent", "reused-intent"]
        expect_rc(idem(args + ["-d", ORDER]), 0, "the intent's first request")
        res = idem(args + ["-d", '{"productId":"p-1024","quantity":3}'])
        expect_rc(res, EXIT_4XX, "another request under the same intent")
        expect('intent "reused-intent" already sent another request' in res.err and
               "name a new --intent" in res.err and "new key" not in res.err,
               "a user who never chose a key is told to name a new --intent: %r" % res.err)


@test
def test_killed_cli_rerun_with_same_intent_reuses_the_key(ctx):
    user = ctx.server.new_user("cli-kill")
    journal = ctx.journal("kill")
    args = ["post", ctx.url(), "-d", ORDER, "--token", user.token, "--intent", "buy-p1024-x2",
            "--journal", journal, "-v"]
    p = subprocess.Popen([IDEM] + args + ["-H", "X-Test-Delay-Ms: 3000"], env=cli_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)

    def journaled():
        try:
            return any(r[0] == "K" for r in journal_records(journal))
        except (OSError, ValueError):  # not there yet, or a line being written
            return False
    # Killed once its key is journaled, while its request is under way (3 s at the server).
    wait_until("the CLI to journal its key", journaled)
    os.kill(p.pid, signal.SIGKILL)
    out, err = p.communicate(10)
    expect_eq(p.returncode, -signal.SIGKILL, "the first CLI was killed")
    expect_eq(out, b"", "the killed CLI printed no answer")
    recs = journal_records(journal)
    keys = [r for r in recs if r[0] == "K"]
    expect_eq(len(keys), 1, "K records after the kill: %r" % recs)
    key = keys[0][2]
    expect_eq(keys[0][1], "buy-p1024-x2", "journaled intent")

    res = rerun = idem(args)
    expect_rc(res, EXIT_OK, "the re-run")
    expect("reusing key %s" % key in res.err, "the re-run should reuse %s:\n%s" % (key, res.err))
    expect_eq(res.attempts[-1].status, 201, "final status of the re-run (%s)" % res.err)
    orders = user.all_orders()
    expect_eq(len(orders), 1, "orders after kill + re-run")
    expect(orders[0]["orderId"].encode() in res.out, "the re-run printed that order")
    recs = journal_records(journal)
    expect_eq([r for r in recs if r[0] == "K"], [("K", "buy-p1024-x2", key)],
              "K records after the re-run")
    expect_eq([r for r in recs if r[0] == "S"], [("S", "buy-p1024-x2", "201")],
              "final status in the journal")

    # Once more: the intent is finished; the CLI still sends (same key) and gets the replay.
    res = idem(args)
    expect_rc(res, EXIT_OK, "a third run")
    expect("answered 201 before" in res.err, "-v should say the intent was answered:\n%s"
           % res.err)
    expect_eq(len(user.all_orders()), 1, "orders after a third run")
    lst = idem(["journal", "--journal", journal])
    expect_rc(lst, EXIT_OK, "idem journal")
    expect(("buy-p1024-x2\t%s\t201\t" % key).encode() in lst.out, "listing: %r" % lst.out)
    print("measured: re-run after SIGKILL: %d attempts (%s, pauses %s ms), %.3f s; 1 order, "
          "key %s reused" % (len(rerun.attempts), [a.status for a in rerun.attempts],
                             [a.waited_ms for a in rerun.attempts[1:]], rerun.elapsed, key))


@test
def test_truncated_journal_is_reported(ctx):
    user = ctx.server.new_user("cli-journal")
    journal = ctx.journal("truncated")
    res = idem(["post", ctx.url(), "-d", ORDER, "--token", user.token, "--intent", "first",
                "--journal", journal])
    expect_rc(res, EXIT_OK, "the first intent")
    with open(journal, "rb") as f:
        data = f.read()
    expect_eq(data.count(b"\n"), 2, "journal lines (key, final status)")
    with open(journal, "wb") as f:
        f.write(data[:-7])  # the final-status line, cut short
    res = idem(["post", ctx.url(), "-d", ORDER, "--token", user.token, "--intent", "second",
                "--journal", journal, "-v"])
    expect_rc(res, EXIT_JOURNAL, "a truncated journal")
    expect("%s:2:" % journal in res.err, "stderr should name %s line 2:\n%s" % (journal,
                                                                                 res.describe()))
    expect("truncated" in res.err, "stderr should say truncated:\n%s" % res.err)
    expect_eq(res.attempts, [], "nothing is sent with a damaged journal")
    expect_eq(len(user.all_orders()), 1, "orders")
    with open(journal, "rb") as f:
        expect_eq(f.read(), data[:-7], "the damaged journal is left as it was")
    lst = idem(["journal", "--journal", journal])
    expect_rc(lst, EXIT_JOURNAL, "idem journal on a truncated journal")
    expect("%s:2:" % journal in lst.err, "idem journal: %s" % lst.describe())

    # A flipped byte in the middle of a line is caught by its checksum, with its line number.
    damaged = bytearray(data)
    damaged[20] ^= 0x01
    with open(journal, "wb") as f:
        f.write(bytes(damaged))
    res = idem(["post", ctx.url(), "-d", ORDER, "--token", user.token, "--intent", "first",
                "--journal", journal])
    expect_rc(res, EXIT_JOURNAL, "a corrupted journal")
    expect("%s:1:" % journal in res.err and "checksum" in res.err, res.describe())


@test
def test_journal_compact_drops_old_finished_intents_only(ctx):
    # `idem journal compact` keeps what a retry may still need.
    user = ctx.server.new_user("cli-compact")
    journal = ctx.journal("compact")
    for intent in ("done-1", "done-2"):
        res = idem(["post", ctx.url(), "-d", ORDER, "--token", user.token, "--intent", intent,
                    "--journal", journal])
        expect_rc(res, EXIT_OK, intent)
    # An intent whose outcome never arrived (the server was unreachable): no final status.
    res = idem(["post", "http://127.0.0.1:1/api/orders", "-d", ORDER, "--token", user.token,
                "--intent", "open", "--journal", journal, "--max-attempts", "1"])
    expect(res.rc != EXIT_OK, "the unreachable intent fails: %s" % res.describe())
    before = idem(["journal", "--journal", journal]).out.decode()
    expect_eq(len(before.splitlines()), 3, "intents before")
    # Nothing is a day old yet: nothing goes.
    res = idem(["journal", "compact", "--journal", journal, "--older-than-days", "1"])
    expect_rc(res, EXIT_OK, "compact")
    expect("0 intents dropped, 3 kept" in res.out.decode(), res.describe())
    # Backdate every record by 30 days, then compact with the default (7 days).
    import zlib
    lines = []
    with open(journal, "rb") as f:
        for line in f.read().split(b"\n"):
            if not line:
                continue
            _crc, _len, payload = line.split(b" ", 2)
            typ, ms, name, last = payload.split(b" ")
            payload = b" ".join([typ, str(int(ms) - 30 * 86400 * 1000).encode(), name, last])
            lines.append(b"%08x %d %s\n" % (zlib.crc32(payload), len(payload), payload))
    with open(journal, "wb") as f:
        f.write(b"".join(lines))
    res = idem(["journal", "compact", "--journal", journal])
    expect_rc(res, EXIT_OK, "compact")
    expect("2 intents dropped, 1 kept" in res.out.decode(), res.describe())
    after = idem(["journal", "--journal", journal]).out.decode()
    expect(len(after.splitlines()) == 1 and after.startswith("open\t"),
           "only the unfinished intent stays: %r" % after)
    res = idem(["journal", "compact", "--journal", journal, "--older-than-days", "0"])
    expect_rc(res, EXIT_USAGE, "--older-than-days 0")


@test
def test_retries_exhausted_and_unfixable_failures(ctx):
    user = ctx.server.new_user("cli-exhaust")
    with FaultProxy(ctx.server.host, ctx.server.port, default=RESET) as proxy:
        res = idem(["post", proxy.base_url + "/api/orders", "-d", ORDER, "--token", user.token,
                    "--max-attempts", "3", "-v"])
        proxy.wait_idle()
        n = len(proxy.connections)
    expect_rc(res, EXIT_EXHAUSTED, "three resets")
    expect_eq(len(res.attempts), 3, "attempts (%s)" % res.err)
    expect_eq(n, 3, "connections the proxy saw")
    expect_eq(res.attempts[-1].action, "giving up", "last action")
    expect("outcome is unknown" in res.err and "--key" in res.err, res.describe())
    expect_eq(len(user.all_orders()), 0, "orders (nothing was forwarded)")
    # A time cap shorter than the pauses: stops early.
    with FaultProxy(ctx.server.host, ctx.server.port, default=RESET) as proxy:
        res = idem(["post", proxy.base_url + "/api/orders", "-d", ORDER, "--token", user.token,
                    "--max-attempts", "1000", "--max-time", "1.5", "-v"])
    expect_rc(res, EXIT_EXHAUSTED, "--max-time 1.5")
    expect(res.elapsed < 5, "--max-time 1.5 took %.2f s" % res.elapsed)
    expect("no time left" in res.err, res.describe())
    # A scheme no retry can fix.
    res = idem(["get", "ftp://127.0.0.1/x", "-v"])
    expect_rc(res, EXIT_TRANSPORT, "ftp://")
    expect_eq(len(res.attempts), 1, "attempts for ftp://")


@test
def test_put_get_delete(ctx):
    user = ctx.server.new_user("cli-verbs")
    env = {"IDEM_TOKEN": user.token}
    res = idem(["put", ctx.url("/api/me/profile"), "-d", '{"name":"Ada","email":"ada@example.org"}',
                "-i"], env=env)
    expect_rc(res, EXIT_OK, "put profile")
    expect(b'"changed":true' in res.body(), res.describe())
    res = idem(["post", ctx.url(), "-d", "@-"], env=env)  # stdin is /dev/null: empty body
    expect_rc(res, EXIT_4XX, "post with an empty body")
    res = idem(["get", ctx.url("/api/orders?limit=5"), "-v"], env=env)
    expect_rc(res, EXIT_OK, "get orders")
    expect(b'"orders":[]' in res.out, res.describe())
    expect("with key" not in res.err, "a GET sends no key: %s" % res.err)
    res = idem(["delete", ctx.url("/api/orders")], env=env)
    expect_rc(res, EXIT_4XX, "delete on a route without DELETE (405)")


def setup():
    return Ctx()


def teardown(ctx):
    if ctx is not None:
        ctx.close()


if __name__ == "__main__":
    run("test_client", setup=setup, teardown=teardown)
