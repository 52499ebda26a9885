# SPDX-License-Identifier: Apache-2.0
"""
bench_http.py - the HTTP the benchmarks speak besides wrk's load: one request, orderd's
headers, a server's /metrics page read into samples, and wrk's JSON line (bench/lua/common.lua)
as the numbers the reports use.
"""

import http.client
import re
import urllib.parse

from bench_procs import BenchError


def split_url(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port


def http_call(url, method, path, body=None, headers=None, conn=None, timeout=30, context=None):
    """One request; returns (status, headers dict lower-cased, body bytes).  An https `url` is
    reached with the ssl.SSLContext `context` (which says whom to trust)."""
    own = conn is None
    if own:
        host, port = split_url(url)
        if url.startswith("https:"):
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        if own:
            conn.close()


def order_headers(token, key):
    return {"Authorization": "Bearer " + token, "Content-Type": "application/json",
            "Idempotency-Key": key}


def metrics(url):
    """orderd's /metrics as {(name, frozenset(labels)): value}."""
    status, _, body = http_call(url, "GET", "/metrics")
    if status != 200:
        raise BenchError("GET /metrics answered %d" % status)
    out = {}
    for line in body.decode("utf-8", "replace").splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$', line)
        if not m:
            continue
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        try:
            out[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            pass
    return out


def metric(samples, name, **labels):
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def created(samples, outcome):
    return metric(samples, "orderd_requests_total", operation="orders.create", outcome=outcome)


def metrics_or_none(url):
    try:
        return metrics(url) if url else None
    except (OSError, BenchError, http.client.HTTPException):
        return None


def wrk_result(j, conns, seconds):
    """bench/lua/common.lua's BENCH_JSON line as the numbers the report uses."""
    errors = j["err_connect"] + j["err_read"] + j["err_write"] + j["err_timeout"]
    return {"rps": j["requests"] / max(j["duration_us"] / 1e6, 1e-9),
            "p50_ms": j["p50_us"] / 1000, "p90_ms": j["p90_us"] / 1000,
            "p99_ms": j["p99_us"] / 1000, "max_ms": j["max_us"] / 1000,
            "requests": j["requests"], "non2xx": j["err_status"], "socket_errors": errors,
            "socket_errors_by_kind": {k[4:]: j[k] for k in ("err_connect", "err_read",
                                                            "err_write", "err_timeout")},
            "connections": conns, "seconds": seconds}
