# SPDX-License-Identifier: Apache-2.0
"""
test_systemd.py - the systemd units of packaging/systemd/, as far as a machine without
systemd as PID 1 can check them.

`cmake --install` puts the programs, the manual pages, the units (their paths rewritten for the
prefix), the sysusers.d file and /etc/idem's files into a temporary prefix; then:

  units...   `systemd-analyze verify` accepts both installed units with nothing to say (their
             programs exist, their Documentation= man pages are found); they carry the hardening
             settings of packaging/systemd/; the sysusers.d file makes the two system users in a scratch root;
             `systemd-analyze security --offline` rates them, and docs/ops.md reports that score.
  stop...    orderd and idem-gateway are started as their unit starts them (its ExecStart, its
             EnvironmentFile, ExecStartPre), a request is kept in flight, the unit's KillSignal is
             sent: the request is answered, the process exits 0 within TimeoutStopSec, and what it
             answered is stored.

What it cannot check here: the sandbox itself (systemd applies it, and is not PID 1 here), the
system users' ownership of /var/lib/*, the journal, Restart=on-failure.

`test_systemd.py units` or `... stop` runs one half (ctest ops.systemd_units, ops.graceful_stop).
IDEM_BUILD is the build tree (CTest sets it).
"""

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "service"))

from harness import (Server, TestFailure, expect, expect_eq, fail,  # noqa: E402
                     in_thread, new_key, run, test, wait_order_committed)
from provider import wait_until  # noqa: E402

BUILD = os.environ.get("IDEM_BUILD") or os.path.join(REPO, "build")
UNITS = ("orderd.service", "idem-gateway.service")
OPS_MD = os.path.join(REPO, "docs", "ops.md")


class Ctx:
    """A temporary prefix with everything `cmake --install` puts there."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="idem-systemd-")
        self.prefix = os.path.join(self.tmp, "prefix")
        p = subprocess.run(["cmake", "--install", BUILD, "--prefix", self.prefix],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise TestFailure("cmake --install %s failed:\n%s%s" % (BUILD, p.stdout, p.stderr))
        self.unitdir = os.path.join(self.prefix, "lib", "systemd", "system")
        self.etc = os.path.join(self.prefix, "etc", "idem")

    def unit_path(self, name):
        return os.path.join(self.unitdir, name)

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


def read_unit(path):
    """{section: [(key, value)]} of a unit file (continuation lines are not used in ours)."""
    sections, cur = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                cur = sections.setdefault(line[1:-1], [])
                continue
            key, _, value = line.partition("=")
            cur.append((key.strip(), value.strip()))
    return sections


def setting(unit, key, section="Service"):
    values = [v for k, v in unit.get(section, []) if k == key]
    return values[-1] if values else None


def seconds(value):
    """A systemd time span such as 30s, 1min 30s, 500ms, in seconds."""
    total = 0.0
    for n, u in re.findall(r"([0-9.]+)\s*(ms|s|sec|min|m|h)?", value):
        total += float(n) * {"ms": 0.001, "min": 60, "m": 60, "h": 3600}.get(u, 1)
    return total


def environment_file(path):
    """What systemd's EnvironmentFile= gives: KEY=VALUE lines, quotes removed."""
    env = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;" or "=" not in line:
                continue
            key, _, value = line.partition("=")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[key.strip()] = value
    return env


def command_line(value, env):
    """ExecStart= as systemd runs it: $VAR split into words, ${VAR} one word."""
    words = []
    for w in shlex.split(value.lstrip("-@:+!")):
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", w)
        if m:
            words += env.get(m.group(1), "").split()
        else:
            words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                                lambda m: env.get(m.group(1), ""), w))
    return words


# ---- the unit files ----------------------------------------------------------------------------

@test
def units_pass_systemd_analyze_verify(ctx):
    env = dict(os.environ, MANPATH=os.path.join(ctx.prefix, "share", "man"))
    paths = [ctx.unit_path(u) for u in UNITS]
    p = subprocess.run(["systemd-analyze", "verify"] + paths, capture_output=True, text=True,
                       env=env, timeout=60)
    said = (p.stdout + p.stderr).strip()
    if p.returncode != 0 or said:
        fail("systemd-analyze verify %s: exit %d\n%s" % (" ".join(UNITS), p.returncode, said))
    # Not vacuous: a misspelt setting is reported.
    bad = os.path.join(ctx.tmp, "bad-orderd.service")
    with open(ctx.unit_path("orderd.service")) as f, open(bad, "w") as g:
        g.write(f.read().replace("ProtectSystem=strict", "ProtectSystm=strict"))
    p = subprocess.run(["systemd-analyze", "verify", bad], capture_output=True, text=True,
                       env=env, timeout=60)
    expect("ProtectSystm" in p.stdout + p.stderr, "verify did not report a misspelt key: %r" % (
        p.stdout + p.stderr))


@test
def units_carry_the_settings_of_a_debian_service(ctx):
    want = {
        "User": None, "StateDirectory": None, "Restart": "on-failure",
        "ProtectSystem": "strict", "NoNewPrivileges": "yes", "PrivateTmp": "yes",
        "CapabilityBoundingSet": "", "KillSignal": "SIGTERM",
    }
    # What a stop may take (docs/ops.md): orderd's drain; the gateway's, an upstream still answering
    # (upstream.connect_timeout + upstream.timeout of the shipped gateway.yaml, 2 s + 30 s).
    drains = {"orderd.service": 15, "idem-gateway.service": 32}
    for name in UNITS:
        unit = read_unit(ctx.unit_path(name))
        problems = []
        for key, value in want.items():
            got = setting(unit, key)
            if got is None or (value is not None and got != value):
                problems.append("%s=%r (want %r)" % (key, got, value if value is not None
                                                     else "set"))
        filters = [v for k, v in unit["Service"] if k == "SystemCallFilter"]
        if "@system-service" not in filters:
            problems.append("SystemCallFilter=@system-service missing: %r" % filters)
        user, state = setting(unit, "User"), setting(unit, "StateDirectory")
        if user is not None and state != user:
            problems.append("StateDirectory=%r for user %r" % (state, user))
        stop = seconds(setting(unit, "TimeoutStopSec") or "90s")
        if stop <= drains[name]:
            problems.append("TimeoutStopSec=%s is not above the %d s drain" % (
                setting(unit, "TimeoutStopSec"), drains[name]))
        config = [v for k, v in unit["Service"] if k in ("EnvironmentFile", "ExecStart")]
        if not any(ctx.etc in v for v in config):
            problems.append("no config from %s: %r" % (ctx.etc, config))
        if problems:
            fail("%s:\n  %s" % (name, "\n  ".join(problems)))


@test
def units_system_users_are_made_by_sysusers(ctx):
    root = os.path.join(ctx.tmp, "sysroot")
    os.makedirs(os.path.join(root, "etc"), exist_ok=True)
    confs = [os.path.join(ctx.prefix, "lib", "sysusers.d", u.replace(".service", ".conf"))
             for u in UNITS]
    p = subprocess.run(["systemd-sysusers", "--root=" + root] + confs, capture_output=True,
                       text=True, timeout=60)
    expect(p.returncode == 0, "systemd-sysusers: %s%s" % (p.stdout, p.stderr))
    with open(os.path.join(root, "etc", "passwd")) as f:
        users = {line.split(":")[0]: line.strip().split(":") for line in f}
    for name in UNITS:
        user = setting(read_unit(ctx.unit_path(name)), "User")
        expect(user in users, "%s runs as %r, which sysusers.d does not make: %s" % (
            name, user, sorted(users)))
        expect_eq(users[user][5], "/var/lib/" + setting(read_unit(ctx.unit_path(name)),
                                                        "StateDirectory"), user + "'s home")
        expect(users[user][6].endswith("nologin"), "%s logs in: %r" % (user, users[user]))


@test
def units_security_score_is_reported_in_ops_md(ctx):
    with open(OPS_MD, encoding="utf-8") as f:
        ops = f.read()
    for name in UNITS:
        p = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager",
                            ctx.unit_path(name)], capture_output=True, text=True, timeout=60)
        m = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", p.stdout + p.stderr)
        expect(m is not None, "systemd-analyze security %s: %s%s" % (name, p.stdout[-500:],
                                                                     p.stderr))
        score, verdict = float(m.group(1)), m.group(2)
        expect(score <= 2.0, "%s: exposure %.1f %s; the sandbox got weaker" % (name, score,
                                                                              verdict))
        doc = re.search(r"`%s`\s*\|\s*([0-9.]+) (\w+)" % re.escape(name), ops)
        expect(doc is not None, "docs/ops.md reports no security score for %s" % name)
        expect_eq((float(doc.group(1)), doc.group(2)), (score, verdict),
                  "docs/ops.md's score of %s vs systemd-analyze security" % name)


# ---- stopping as the unit stops it -----------------------------------------------------------------

class UnitServer(Server):
    """orderd started with its unit's ExecStart and EnvironmentFile."""

    def __init__(self, ctx, overrides, env):
        super().__init__(name="orderd-unit", env=env)
        unit = read_unit(ctx.unit_path("orderd.service"))
        self.unit = unit
        envfile = setting(unit, "EnvironmentFile").lstrip("-")
        expect(os.path.exists(envfile), "the unit's EnvironmentFile %s was not installed" %
               envfile)
        self.unit_env = environment_file(envfile)
        # The operator's way to change an option: ORDERD_OPTS in the environment file, after the
        # unit's own.  Here: a scratch store and free ports instead of /var/lib and 8080.
        opts = self.unit_env.get("ORDERD_OPTS", "")
        self.unit_env["ORDERD_OPTS"] = (opts + " " + overrides % {"db": self.db_uri}).strip()
        self.env.update(self.unit_env)

    def serve_command(self):
        return command_line(setting(self.unit, "ExecStart"), self.unit_env)


def refused(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return False
    except OSError:
        return True


@test
def stop_orderd_finishes_a_request_in_flight_and_exits_0(ctx):
    s = UnitServer(ctx, "--db %(db)s --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0",
                   env={"ORDERD_TEST_HOOKS": "1"})
    try:
        s.start()
        cmd = s.serve_command()
        expect(cmd[0] == os.path.join(ctx.prefix, "bin", "orderd") and cmd[1] == "serve",
               "the unit's command: %r" % cmd)
        expect("--config" in cmd, "the unit names its config file: %r" % cmd)
        conf = cmd[cmd.index("--config") + 1]
        with open(conf) as f:
            text = f.read()
        expect("log-format: json" in text and "metrics-listen:" in text,
               "the installed %s holds the unit's options: %r" % (conf, text))
        kill = getattr(signal, setting(s.unit, "KillSignal"))
        bound = seconds(setting(s.unit, "TimeoutStopSec"))
        u = s.new_user("unit")
        k = new_key("inflight")
        t, out = in_thread(lambda: u.create_order(k, headers={"X-Test-Delay-Ms": "2000"},
                                                  timeout=60))
        # In flight: its order is committed (phase 1) and it sleeps before answering.
        wait_order_committed(s, k)
        t0 = time.monotonic()
        s.proc.send_signal(kill)
        # The listener closes at once, while the request in flight still holds the process.
        wait_until("orderd to close its listener after %s" % kill.name,
                   lambda: refused(s.host, s.port), pause_s=0.05)
        expect(s.alive() and "resp" not in out and "error" not in out,
               "orderd closed its listener only as it exited, after the request in flight")
        code = s.wait_exit(bound + 5)
        took = time.monotonic() - t0
        t.join(10)
        if code is None:
            fail("orderd did not exit within TimeoutStopSec=%.0f s after %s\n%s" % (
                bound, kill.name, s.logs()))
        expect_eq(code, 0, "orderd's exit status after %s (%s)" % (kill.name, s.logs()))
        expect(took < bound, "orderd took %.1f s to stop, TimeoutStopSec is %.0f" % (took, bound))
        if "error" in out:
            fail("the request in flight got no answer: %r\n%s" % (out["error"], s.logs()))
        r = out["resp"]
        expect_eq(r.status, 201, "the request in flight: %s" % r.describe())
        expect_eq((r.header("Connection") or "").lower(), "close", "Connection of the last answer")
        expect(took >= 1.0, "orderd stopped after %.1f s without waiting for the request" % took)
        # What it answered was stored: after a restart, its retry is the same order.
        s.start()
        again = u.create_order(k)
        expect(again.status == 201 and again.replayed and again.body == r.body,
               "the retry after the restart: %s" % again.describe())
    finally:
        s.close()


@test
def stop_gateway_finishes_a_request_in_flight_and_exits_0(ctx):
    from gateway_harness import GATEWAY_LISTEN_RE, Upstream
    unit = read_unit(ctx.unit_path("idem-gateway.service"))
    up = Upstream()
    store = os.path.join(ctx.tmp, "gateway.db")
    # The operator edits /etc/idem/gateway.yaml: here, scratch ports, store and upstream.
    config = os.path.join(ctx.etc, "gateway.yaml")
    with open(config, "w") as f:
        f.write("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nstore: sqlite:%s\n"
                "upstream:\n  url: %s\n  timeout: 10s\nprincipal:\n  header: X-Consumer-Id\n"
                "routes:\n  - match: POST /v1/things\n    operation: things.create\n" % (
                    store, up.url))
    proc = None
    try:
        pre = command_line(setting(unit, "ExecStartPre"), {})
        p = subprocess.run(pre, capture_output=True, text=True, timeout=30)
        expect_eq(p.returncode, 0, "ExecStartPre %r: %s%s" % (pre, p.stdout, p.stderr))
        cmd = command_line(setting(unit, "ExecStart"), {})
        out_path = os.path.join(ctx.tmp, "gateway.stdout")
        with open(out_path, "wb") as o, open(os.path.join(ctx.tmp, "gateway.stderr"), "wb") as e:
            proc = subprocess.Popen(cmd, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        m = None
        while m is None:
            with open(out_path) as f:
                m = GATEWAY_LISTEN_RE.search(f.read())
            expect(proc.poll() is None and time.monotonic() < deadline,
                   "idem-gateway did not start: %r" % cmd)
            time.sleep(0.05)
        host, port = m.group(1), int(m.group(2))
        from gateway_harness import http_request
        t, out = in_thread(lambda: http_request(host, port, "POST", "/v1/things", "{\"n\": 1}", {
            "X-Consumer-Id": "alice", "Idempotency-Key": "stop-1",
            "Content-Type": "application/json", "X-Test-Mode": "slow:2000"}, 30))
        wait_until("the request in flight upstream", lambda: up.executions("stop-1") == 1,
                   pause_s=0.02)
        kill = getattr(signal, setting(unit, "KillSignal"))
        bound = seconds(setting(unit, "TimeoutStopSec"))
        t0 = time.monotonic()
        proc.send_signal(kill)
        try:
            code = proc.wait(bound + 5)
        except subprocess.TimeoutExpired:
            fail("idem-gateway did not exit within TimeoutStopSec=%.0f s" % bound)
        took = time.monotonic() - t0
        t.join(10)
        expect_eq(code, 0, "idem-gateway's exit status after %s" % kill.name)
        expect(took < bound, "idem-gateway took %.1f s to stop (TimeoutStopSec %.0f)" % (took,
                                                                                        bound))
        if "error" in out:
            fail("the request in flight got no answer: %r" % out["error"])
        expect(200 <= out["resp"].status < 300, "the request in flight: %s" %
               out["resp"].describe())
        expect_eq(up.executions("stop-1"), 1, "executions of the request in flight")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        up.close()


if __name__ == "__main__":
    run("test_systemd", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
