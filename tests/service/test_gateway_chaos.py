#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_gateway_chaos.py - idem-gateway under chaos, audited at the upstream: clients with retries
send intents through a fault proxy (answers dropped after the gateway executed, connections
reset before it saw anything, some intents sent twice at once) to a gateway that is killed with
SIGKILL and restarted every couple of seconds, in front of an upstream that itself resets some
connections after acting.  Three routes, one per unknown-outcome mode:

  /v1/things           hold       an unknown outcome is held: retries get 503 outcome-unknown
  /v1/orders/{id}/...  reconcile  asks the upstream (GET /lookup?key=) and settles or runs
  /v1/dedupe           resend     sent again with the same key; the upstream dedupes on it

The audit, per key: the upstream executed it at most once (never two); every intent a client saw
a 2xx for was executed exactly once, and the answer it got is that execution's; an intent not
answered 2xx is a held one on the hold route (the upstream may or may not have acted) -- on the
other routes every intent ends with a 2xx.  Bounded: INTENTS intents, DEADLINE_S seconds.
"""

import random
import threading
import time
import uuid

import harness
from harness import test
from faultproxy import DROP, FORWARD, RESET, FaultProxy
from gateway_harness import Gateway, Upstream, expect

INTENTS = 600
CLIENTS = 8
KILL_EVERY_S = 1.5
PAUSE_S = (0.08, 0.18)  # a client's pause between intents: the run lasts ~10 s
DEADLINE_S = 90.0
INTENT_DEADLINE_S = 30.0
HELD_AFTER = 3  # consecutive 503 outcome-unknown answers before a client calls the intent held

ROUTES = """
  - match: POST /v1/things
    operation: things.create
    lease: 2s
    wait: 300ms
  - match: POST /v1/orders/{id}/refunds
    operation: refunds.create
    lease: 2s
    wait: 300ms
    on_unknown: {reconcile: "GET /lookup?key={key}"}
  - match: POST /v1/dedupe
    operation: dedupe.create
    lease: 2s
    wait: 300ms
    on_unknown: resend
"""

PATHS = ["/v1/things", "/v1/orders/%d/refunds", "/v1/dedupe"]


class Intent:
    def __init__(self, i):
        self.i = i
        self.key = "chaos-%d-%s" % (i, uuid.uuid4().hex[:8])
        self.route = i % 3
        self.path = PATHS[self.route] % (i,) if "%d" in PATHS[self.route] else PATHS[self.route]
        self.body = {"intent": i, "amount": 100 + i}
        self.result = None  # the 2xx Response
        self.held = False
        self.attempts = 0
        self.problems = []


def attempt(gw_host, port, intent, rng):
    headers = {"X-Consumer-Id": "chaos-user", "Idempotency-Key": intent.key,
               "Content-Type": "application/json"}
    roll = rng.random()
    if roll < 0.05:
        headers["X-Test-Mode"] = "reset"  # the upstream acts, then resets
    elif roll < 0.15:
        headers["X-Test-Mode"] = "slow:30"
    import json
    from gateway_harness import http_request
    return http_request(gw_host, port, "POST", intent.path, json.dumps(intent.body), headers, 10)


def run_intent(proxy, intent, rng, stop):
    t_end = time.monotonic() + INTENT_DEADLINE_S
    unknown_in_a_row = 0
    while time.monotonic() < t_end and not stop.is_set():
        intent.attempts += 1
        try:
            r = attempt(proxy.host, proxy.port, intent, rng)
        except Exception:  # noqa: BLE001 - dropped, reset, gateway killed: retry
            time.sleep(rng.uniform(0.02, 0.1))
            continue
        if 200 <= r.status < 300:
            intent.result = r
            return
        if r.status == 422:
            intent.problems.append("422 for its own retry: %s" % r.describe(200))
            return
        code = None
        try:
            code = r.json().get("code")
        except harness.TestFailure:
            pass
        if r.status == 503 and code == "outcome-unknown":
            unknown_in_a_row += 1
            if unknown_in_a_row >= HELD_AFTER and intent.route == 0:
                intent.held = True
                return
        else:
            unknown_in_a_row = 0
        time.sleep(rng.uniform(0.05, 0.2))


@test
def chaos_through_the_gateway_never_executes_a_key_twice(ctx):
    up = Upstream()
    port = harness.free_port()
    gw = Gateway(up, routes=ROUTES, upstream_timeout="1s", listen_port=port)
    rng = random.Random(14)
    proxy = FaultProxy("127.0.0.1", port, default=FORWARD)
    modes = []
    for _ in range(20000):
        x = rng.random()
        modes.append(DROP if x < 0.15 else RESET if x < 0.25 else FORWARD)
    proxy.plan(modes)
    stop = threading.Event()
    kills = [0]
    try:
        gw.start()
        proxy.start()
        intents = [Intent(i) for i in range(INTENTS)]
        todo = list(intents)
        # A fifth of the intents are sent twice at once (a double click, a redelivery).
        todo += [it for it in intents if it.i % 5 == 0]
        rng.shuffle(todo)
        lock = threading.Lock()

        def client(seed):
            crng = random.Random(seed)
            while not stop.is_set():
                with lock:
                    if not todo:
                        return
                    it = todo.pop()
                run_intent(proxy, it, crng, stop)
                time.sleep(crng.uniform(*PAUSE_S))

        def killer():
            while not stop.wait(KILL_EVERY_S):
                gw.kill9()
                kills[0] += 1
                try:
                    gw.start()
                except harness.TestFailure:
                    stop.set()
                    raise

        threads = [threading.Thread(target=client, args=(s,)) for s in range(CLIENTS)]
        kt = threading.Thread(target=killer)
        t0 = time.monotonic()
        for t in threads:
            t.start()
        kt.start()
        for t in threads:
            t.join(max(1.0, DEADLINE_S - (time.monotonic() - t0)))
        stop.set()
        kt.join(15)
        elapsed = time.monotonic() - t0

        twice = [(it.key, up.executions(it.key)) for it in intents if up.executions(it.key) > 1]
        wrong = []
        unsettled = []
        for it in intents:
            n = up.executions(it.key)
            if it.result is not None:
                first = up.first_by_key.get(it.key)
                if n != 1 or first is None or it.result.json().get("id") != first["id"]:
                    wrong.append((it.key, n, it.result.describe(200)))
            elif not it.held:
                unsettled.append((it.key, it.route, n, it.attempts))
        held = [it for it in intents if it.held]
        problems = [(it.key, p) for it in intents for p in it.problems]
        print("     %d intents, %d kills, %d proxy connections (%d dropped, %d reset), %.1f s; "
              "%d answered, %d held, %d deduped resends, %d reconcile queries" % (
                  INTENTS, kills[0], len(proxy.connections),
                  sum(1 for c in proxy.connections if c.mode == DROP),
                  sum(1 for c in proxy.connections if c.mode == RESET), elapsed,
                  sum(1 for it in intents if it.result is not None), len(held), up.deduped,
                  up.lookups), flush=True)
        expect(not twice, "keys executed twice at the upstream: %s" % twice[:5])
        expect(not wrong, "2xx answers that are not the one execution: %s" % wrong[:3])
        expect(not problems, "clients saw: %s" % problems[:3])
        expect(not unsettled, "intents neither answered nor held (key, route, executions, "
               "attempts): %s" % unsettled[:5])
        expect(all(it.route == 0 for it in held), "only the hold route holds")
        expect(kills[0] >= 5, "the gateway was killed at least 5 times (%d)" % kills[0])
    finally:
        stop.set()
        proxy.close()
        gw.close()
        up.close()


if __name__ == "__main__":
    harness.run("gateway chaos")
