# SPDX-License-Identifier: Apache-2.0
"""
bench_procs.py - the processes a benchmark run starts and stops, shared by bench.py,
gateway_bench.py and peers_bench.py: each server is stopped by its PID and only that PID, a run
ends within its deadline and always cleans up, nginx gets a config of its own, and the open-file
limit is raised for 10,000 connections.
"""

import argparse
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import time

LISTEN_RE = re.compile(r"listening on (https?://[0-9.]+:\d+)")
NGINX_WORKERS = 2


class BenchError(Exception):
    """A step that could not run; the message says which and why."""


def say(msg):
    print("bench: " + msg, flush=True)


def run_to_end(b, deadline_s, first=None):
    """Runs bench `b` (after `first()`, if given) within `deadline_s` seconds (SIGALRM; SIGTERM
    ends it too), always cleaning up after it; the exit status: 0, 1 (failed), 130 (interrupted).
    bench.py, gateway_bench.py and peers_bench.py end so."""
    def on_signal(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGALRM, on_signal)
    signal.alarm(deadline_s)
    try:
        if first is not None:
            first()
        b.run()
    except BenchError as e:
        say("failed: %s" % e)
        return 1
    except KeyboardInterrupt as e:
        say("interrupted (%s)" % e)
        return 130
    finally:
        signal.alarm(0)
        b.cleanup()
    return 0


class Proc:
    """A server this run started: stopped by its PID, and only that PID."""

    def __init__(self, name, cmd, logpath, env=None):
        self.name = name
        self.cmd = cmd
        self.logpath = logpath
        self.log = open(logpath, "wb")
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                  stdin=subprocess.DEVNULL)
        self.url = None

    @property
    def pid(self):
        return self.p.pid

    def wait_listening(self, timeout=20.0):
        """Reads the one "listening on URL" line the servers print on stdout."""
        deadline = time.monotonic() + timeout
        buf = b""
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.p.stdout], [], [], 0.2)
            if r:
                chunk = os.read(self.p.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                m = LISTEN_RE.search(buf.decode("utf-8", "replace"))
                if m:
                    self.url = m.group(1)
                    return self.url
            elif self.p.poll() is not None:
                break
        self.stop()
        raise BenchError("%s did not start: %s" % (self.name, self.tail()))

    def wait_port(self, port, timeout=20.0):
        """For a server that prints nothing (nginx): waits until 127.0.0.1:port accepts."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                self.url = "http://127.0.0.1:%d" % port
                return self.url
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise BenchError("%s did not start: %s" % (self.name, self.tail()))

    def tail(self, n=5):
        try:
            with open(self.logpath, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
            return " | ".join(lines[-n:]) or "(no log)"
        except OSError:
            return "(no log)"

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        if self.p.stdout:
            self.p.stdout.close()
        self.log.close()


def write_nginx_conf(d, comment, http_rest):
    """
    Writes d/nginx.conf for a bench run: NGINX_WORKERS workers, logs and temp paths under `d`
    (made, readable by nginx's workers), access log off, long keep-alive, then `http_rest` inside
    the http block (the servers).  Returns (conf, d).
    """
    for sub in ("", "logs", "tmp"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    os.chmod(d, 0o755)  # nginx's workers may run as another user; they need the tmp paths
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write("""# written by %(comment)s
worker_processes %(workers)d;
pid %(d)s/nginx.pid;
error_log %(d)s/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    server_tokens off;
    keepalive_requests 10000000;
    keepalive_timeout 60s;
    client_body_temp_path %(d)s/tmp/body;
    proxy_temp_path %(d)s/tmp/proxy;
    fastcgi_temp_path %(d)s/tmp/fastcgi;
    uwsgi_temp_path %(d)s/tmp/uwsgi;
    scgi_temp_path %(d)s/tmp/scgi;
%(rest)s}
""" % {"comment": comment, "workers": NGINX_WORKERS, "d": d, "rest": http_rest})
    return conf, d


def raise_nofile(want):
    """Raises this process's open-file limit (inherited by every child) towards `want`, as far
    as the hard limit goes: `ulimit -n` semantics.  Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def free_port():
    """A loopback port free right now (for nginx, which cannot be told to pick one)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def nginx_path():
    """nginx's binary, or None when it is not installed."""
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx")
                                     else None)


def arg_parser(doc, connections, wait_idle, profile=True):
    """
    The command line every benchmark takes: --bin, --out, --seconds, --connections (default
    `connections`), --wait-idle (default `wait_idle` seconds), and with `profile` --no-profile.
    `doc` is the script's docstring.  Add the script's own, then parse with parse_args().
    """
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(here), "build-bench", "bin"))
    ap.add_argument("--out", default=os.path.join(here, "results"))
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each load run")
    ap.add_argument("--connections", type=int, default=connections, help="wrk connections")
    if profile:
        ap.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the profiles of targets not met")
    ap.add_argument("--wait-idle", type=float, default=wait_idle,
                    help="wait up to this many seconds for the machine to be idle first")
    return ap


def parse_args(ap, tools=(("wrk", "wrk"),)):
    """ap.parse_args(), refusing --seconds outside 2..60 and a missing tool of `tools`
    ((command, Debian package) pairs, which scripts/deps.sh bench installs)."""
    args = ap.parse_args()
    if args.seconds < 2 or args.seconds > 60:
        ap.error("--seconds must be 2..60")
    for tool, pkg in tools:
        if not shutil.which(tool):
            ap.error("%s is not installed (scripts/deps.sh bench installs %s)" % (tool, pkg))
    return args


def stop_perf(perf):
    """Ends a `perf record` or `perf trace` child as its user would (SIGINT), so it writes its
    data out; killed if it has not within 180 s."""
    perf.send_signal(signal.SIGINT)
    try:
        perf.wait(180)
    except subprocess.TimeoutExpired:
        perf.kill()
        perf.wait(5)
