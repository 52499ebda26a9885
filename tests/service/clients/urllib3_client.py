#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""
urllib3_client.py - a Python client that retries as urllib3's Retry does, for
tests/service/test_gateway_clients.py.  Run by Debian's /usr/bin/python3 with Debian's
python3-urllib3 (scripts/deps.sh test installs it); urllib3 1.26 and 2.x alike.

  urllib3_client.py --url http://127.0.0.1:PORT [--intents FILE] [--total 5] [--backoff 0.05]
                    [--read-timeout 5] [--threads 8] [--close]

One urllib3.PoolManager with
  Retry(total=5, allowed_methods=None (every method, POST included), status_forcelist=[409, 502,
        503, 504], backoff_factor=small, respect_retry_after_header=True, raise_on_status=False)
sends each intent as a JSON POST with its Idempotency-Key.  Intents (a JSON array, from the file
or stdin; --close sends each with `Connection: close`, so every attempt,
retries included, is a connection of its own):
  {"intent": "u-1", "path": "/v1/charges", "body": {...}, "key": "...",
   "apiKey": "sk_test_...", "headers": {...}}
and for each it prints one JSON line as it ends:
  {"intent", "status", "body" (JSON, or text), "replayed", "retries" (how many Retry took),
   "history" [[status or error, ...]], "ms"}
or, when Retry gave up on errors with no answer, {"intent", "status": null, "error": "..."}.
"""

import argparse
import concurrent.futures
import json
import sys
import threading
import time

try:
    import urllib3
    from urllib3.util.retry import Retry
except ImportError as e:
    sys.stderr.write("urllib3_client: cannot import urllib3 (apt-get install python3-urllib3; "
                     "scripts/deps.sh test): %s\n" % e)
    sys.exit(3)

_print_lock = threading.Lock()


def emit(doc):
    with _print_lock:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()


def make_retry(total, backoff):
    kw = dict(total=total, status_forcelist=[409, 502, 503, 504], backoff_factor=backoff,
              respect_retry_after_header=True, raise_on_status=False)
    try:
        return Retry(allowed_methods=None, **kw)  # urllib3 >= 1.26: None = every method
    except TypeError:
        return Retry(method_whitelist=False, **kw)  # older: False = every method


def history_of(retries):
    out = []
    for h in getattr(retries, "history", ()) or ():
        if h.status is not None:
            out.append(h.status)
        elif h.error is not None:
            out.append(type(h.error).__name__)
        else:
            out.append(None)
    return out


def run_one(pool, base, it, retry, close):
    name = str(it.get("intent"))
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if close:
        headers["Connection"] = "close"
    if it.get("apiKey"):
        headers["Authorization"] = "Bearer " + it["apiKey"]
    if it.get("key") is not None:
        headers["Idempotency-Key"] = it["key"]
    headers.update(it.get("headers") or {})
    body = json.dumps(it.get("body") or {}, separators=(",", ":")).encode()
    t0 = time.monotonic()
    try:
        r = pool.request("POST", base + it.get("path", "/v1/charges"), body=body,
                         headers=headers, retries=retry)
    except urllib3.exceptions.HTTPError as e:
        emit({"intent": name, "status": None, "error": "%s: %s" % (type(e).__name__, e),
              "ms": int((time.monotonic() - t0) * 1000)})
        return
    data = r.data
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError:
        doc = data.decode("utf-8", "replace")
    hist = history_of(r.retries)
    emit({"intent": name, "status": r.status, "body": doc,
          "replayed": r.headers.get("Idempotent-Replayed"),
          "shouldRetry": r.headers.get("Stripe-Should-Retry"),
          "retries": len(hist), "history": hist, "ms": int((time.monotonic() - t0) * 1000)})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="http://HOST:PORT")
    ap.add_argument("--intents", help="a JSON array of intents (default: stdin)")
    ap.add_argument("--total", type=int, default=5)
    ap.add_argument("--backoff", type=float, default=0.05)
    ap.add_argument("--connect-timeout", type=float, default=2.0)
    ap.add_argument("--read-timeout", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--close", action="store_true", help="a connection per attempt")
    a = ap.parse_args()
    try:
        if a.intents:
            with open(a.intents) as f:
                intents = json.load(f)
        else:
            intents = json.load(sys.stdin)
    except (OSError, ValueError) as e:
        sys.stderr.write("urllib3_client: bad intents: %s\n" % e)
        return 2
    retry = make_retry(a.total, a.backoff)
    pool = urllib3.PoolManager(num_pools=4, maxsize=a.threads, block=False,
                               timeout=urllib3.Timeout(connect=a.connect_timeout,
                                                       read=a.read_timeout),
                               retries=retry)
    base = a.url.rstrip("/")
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.threads)) as ex:
        futures = [ex.submit(run_one, pool, base, it, retry, a.close) for it in intents]
        for f in futures:
            f.result()
    pool.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
