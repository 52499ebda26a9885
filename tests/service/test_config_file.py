#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_config_file.py - `orderd serve --config FILE` (docs/orderd.md, "Config file"): the options of
a YAML file, one `name: value` per option, as if given first on the command line, so that a flag
given there wins; and every mistake in the file refused at start-up with the file, the line and
what is wrong, exit status 2, before anything listens.
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (ORDERD, Server, expect, expect_eq, metric_value,  # noqa: E402
                     parse_metrics, run, test)


def write(text):
    fd, path = tempfile.mkstemp(suffix=".conf", prefix="orderd-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def cache_bound(server):
    r = server.client().get("/metrics")
    expect_eq(r.status, 200, "GET /metrics")
    return metric_value(parse_metrics(r.body.decode()), "orderd_replay_cache_max_bytes")


@test
def test_the_files_options_apply_and_a_flag_wins(_):
    conf = write("# orderd's options\nreplay-cache-mb: 3\nlog-format: json\n"
                 "sweep-interval-s: 30   # a comment after a value\n")
    try:
        with Server(name="orderd-conf", extra_args=["--config", conf]) as s:
            expect_eq(cache_bound(s), 3 << 20, "replay-cache-mb from the file")
            with open(s.stderr_path) as f:
                first = f.readline()
            expect(first.startswith('{"ts":'), "log-format json from the file: %r" % first)
        with Server(name="orderd-conf-flag",
                    extra_args=["--config", conf, "--replay-cache-mb", "5"]) as s:
            expect_eq(cache_bound(s), 5 << 20, "the flag given after --config wins")
        with Server(name="orderd-conf-flag-first",
                    extra_args=["--replay-cache-mb", "5", "--config=" + conf]) as s:
            expect_eq(cache_bound(s), 5 << 20, "a flag wins wherever it stands")
    finally:
        os.unlink(conf)


@test
def test_mistakes_in_the_file_are_refused_with_file_and_line(_):
    cases = [
        ("listen: 127.0.0.1:0\nbogus: 1\n", ":2: unknown option 'bogus'"),
        ("db-pool: [1, 2]\n", ":1: db-pool: a value, not a list or a mapping"),
        ("wait-ms: 10\nwait-ms: 20\n", ":2: 'wait-ms' is given twice"),
        ("- listen\n", ":1: a mapping of option names to values is expected"),
        ("help: yes\n", ":1: unknown option 'help'"),
        ("config: other.conf\n", ":1: unknown option 'config'"),
        ("lease-ms: &a 5\nwait-ms: *a\n", ":2: aliases (*a) are not supported"),
        ("listen: \"127.0.0.1\n", "invalid YAML"),
        ("listen: 127.0.0.1:0\n---\nwait-ms: 5\n", ":2: a second YAML document"),
        ("db-pool: [[[[[1]]]]]\n", ":1: nested deeper than 4 levels"),
        ("db-pool: 0\n", "--db-pool must be an integer from 1 to 1024, not '0'"),
    ]
    for text, want in cases:
        conf = write(text)
        try:
            p = subprocess.run([ORDERD, "serve", "--config", conf], capture_output=True,
                               timeout=10)
            err = p.stderr.decode()
            expect_eq(p.returncode, 2, "exit status for %r" % text)
            expect(want in err and (conf in err or "--db-pool" in want),
                   "%r is refused naming the file and line: %r" % (text, err))
            expect_eq(p.stdout, b"", "nothing listened for %r" % text)
        finally:
            os.unlink(conf)
    p = subprocess.run([ORDERD, "serve", "--config", "/nonexistent/orderd.conf"],
                       capture_output=True, timeout=10)
    expect(p.returncode == 2 and b"/nonexistent/orderd.conf: cannot read it" in p.stderr,
           "a missing file: %r" % p.stderr)


if __name__ == "__main__":
    run("config_file")
