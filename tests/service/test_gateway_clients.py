#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_gateway_clients.py - idem-gateway driven by REAL retrying clients, not by a test's own
requests: the official Stripe Node.js SDK (npm `stripe` 23.2.0, clients/stripe_client.js: its
maxNetworkRetries, its own idempotency keys, its reading of Stripe-Should-Retry and of the error
envelope) and a Python client retrying with urllib3's Retry (clients/urllib3_client.py, Debian's
python3-urllib3).  In front of a Stripe-shaped upstream that does NOT dedupe
(stripe_upstream.py: every POST is a new charge, and its ledger shows each one), with the
gateway configured as docs/gateway.md "Using it with Stripe-style clients" says: the API key as
the caller (`principal.authorization: sha256`), `error_format: stripe`, `scope_headers:
[Stripe-Account]`.

  - exactly once under faults: 60 intents over 3 API keys, the SDK retrying (maxNetworkRetries 5)
    through a fault proxy that drops answers after the gateway executed and resets connections
    before it saw anything, some answers slower than the SDK's timeout: one charge per intent,
    and the id each intent ended with is that charge's;
  - the same SDK over HTTPS, the gateway serving `listen_tls` with a throw-away CA's certificate
    that the SDK trusts through NODE_EXTRA_CA_CERTS: late answers retried, one charge per
    intent; without the CA the SDK cannot connect and nothing is made;
  - each of the gateway's own errors is the SDK's matching error class, and the SDK retries
    exactly those that say so: the key reused (StripeIdempotencyError), no caller
    (StripeAuthenticationError), a bad key (StripeInvalidRequestError), a duplicate in flight
    (409 idempotency_key_in_use, retried to the first's answer), an outcome held (not retried);
  - a transient 409 lock_timeout (Stripe-Should-Retry: true) is retried by the SDK to one charge
    (and stored, with store_retryable: true, it is replayed instead);
  - two connected accounts (Stripe-Account) with one key and one body are two charges;
  - replays keep Request-Id and Stripe-Version;
  - a retry after the gateway was killed mid-forward and restarted is answered at once (held:
    503 outcome_unknown), not after the lease;
  - urllib3's Retry, 30 intents through DROP/RESET faults: one charge per intent.

Needs node with the stripe package in `npm root -g` and /usr/bin/python3 with urllib3
(scripts/deps.sh test installs both).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from harness import expect_eq, test  # noqa: E402
from faultproxy import DROP, FORWARD, RESET, FaultProxy  # noqa: E402
from gateway_harness import Gateway, expect, http_request  # noqa: E402
from stripe_upstream import StripeUpstream  # noqa: E402
from tls_ca import TlsCa  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STRIPE_CLIENT = os.path.join(HERE, "clients", "stripe_client.js")
URLLIB3_CLIENT = os.path.join(HERE, "clients", "urllib3_client.py")
STRIPE_VERSION_PINNED = "23.2.0"
# The urllib3 client runs on Debian's Python, with Debian's python3-urllib3 (scripts/deps.sh test).
DEBIAN_PYTHON = "/usr/bin/python3"

API_KEYS = ["sk_test_%s_%s" % (n, uuid.uuid4().hex[:16]) for n in ("alpha", "beta", "gamma")]

ROUTES = """
  - match: POST /v1/charges
    operation: charges.create
    scope_headers: [Stripe-Account]
    wait: 500ms
  - match: POST /v1/customers
    operation: customers.create
    scope_headers: [Stripe-Account]
    wait: 500ms
    store_retryable: true
"""


def gateway_extra(name):
    # `instance`: on PostgreSQL a restarted gateway frees only its own earlier process's records.
    return "error_format: stripe\ninstance: %s-%s\n" % (name, uuid.uuid4().hex[:8])


def new_gateway(up, name, routes=ROUTES, upstream_timeout="10s", tls=None):
    """The gateway as the Stripe section configures it; `tls` (a tls_ca leaf): it serves HTTPS
    (listen_tls) with that certificate."""
    extra = gateway_extra(name)
    if tls is not None:
        extra += "listen_tls:\n  cert_file: %s\n  key_file: %s\n" % (tls.chain, tls.key)
    return Gateway(up, routes=routes, extra=extra, principal="authorization: sha256",
                   upstream_timeout=upstream_timeout, name=name)


def key(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:16])


def setup():
    up = StripeUpstream()
    gw = new_gateway(up, "gw-clients")
    gw.start()
    return {"up": up, "gw": gw}


def teardown(ctx):
    if ctx:
        ctx["gw"].close()
        ctx["up"].close()


# ---- the clients -------------------------------------------------------------------------------

_node_env = None


def node_env():
    """The environment node runs the SDK in: NODE_PATH is npm's global root, where
    scripts/deps.sh test installed the pinned stripe package."""
    global _node_env
    if _node_env is None:
        node, npm = shutil.which("node"), shutil.which("npm")
        if node is None or npm is None:
            harness.fail("node and npm are needed (scripts/deps.sh test)")
        root = subprocess.run([npm, "root", "-g"], capture_output=True, timeout=60,
                              text=True).stdout.strip()
        pkg = os.path.join(root, "stripe", "package.json")
        try:
            with open(pkg) as f:
                version = json.load(f).get("version")
        except (OSError, ValueError):
            version = None
        if version != STRIPE_VERSION_PINNED:
            harness.fail("the stripe npm package %s is needed in %s (found %s): run scripts/deps.sh test"
                         % (STRIPE_VERSION_PINNED, root, version))
        _node_env = dict(os.environ, NODE_PATH=root)
    return _node_env


class StripeRun:
    """One stripe_client.js process running `intents` with `cfg`; wait() gives {intent: result}."""

    def __init__(self, cfg, intents, what="stripe client", env=None):
        self.what = what
        self.count = len(intents)
        self.tmp = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(intents, self.tmp)
        self.tmp.close()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(["node", STRIPE_CLIENT, json.dumps(cfg), self.tmp.name],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, env=dict(node_env(), **(env or {})))

    def wait(self, timeout=60):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            harness.fail("%s: no end within %d s\nstdout: %s\nstderr: %s" % (
                self.what, timeout, out.decode("utf-8", "replace")[-2000:],
                err.decode("utf-8", "replace")[-2000:]))
        finally:
            os.unlink(self.tmp.name)
        self.seconds = time.monotonic() - self.t0
        return client_results(self.what, self.proc.returncode, out, err, self.count)


def client_results(what, returncode, out, err, count):
    """A client's {intent: result} from its JSON lines; all `count` of them, or the test fails."""
    results = {}
    for line in out.decode("utf-8", "replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "intent" in doc:
            results[doc["intent"]] = doc
    if returncode != 0 or len(results) != count:
        harness.fail("%s: exit %s, %d of %d results\nstdout: %s\nstderr: %s" % (
            what, returncode, len(results), count, out.decode("utf-8", "replace")[-2000:],
            err.decode("utf-8", "replace")[-2000:]))
    return results


def sdk_config(port, api_key, retries=5, timeout_ms=20000, **more):
    cfg = {"host": "127.0.0.1", "port": port, "apiKey": api_key,
           "maxNetworkRetries": retries, "timeout": timeout_ms}
    cfg.update(more)
    return cfg


def sdk(port, intents, api_key=None, retries=5, timeout_ms=20000, what="stripe client", **more):
    """Runs `intents` (one dict, or a list) through the SDK and waits: one result, or a dict."""
    single = isinstance(intents, dict)
    run = StripeRun(sdk_config(port, api_key or API_KEYS[0], retries, timeout_ms, **more),
                    [intents] if single else intents, what)
    results = run.wait()
    return results[str(intents["intent"])] if single else results


def charge(intent, amount=500, idem=None, **meta):
    it = {"intent": intent, "op": "charges.create",
          "params": {"amount": amount, "currency": "usd", "description": "order " + intent,
                     "metadata": dict(meta, intent=intent)}}
    if idem is not None:
        it["idempotencyKey"] = idem
    return it


def expect_ok(res, what):
    expect(res.get("ok") is True and isinstance(res.get("id"), str),
           "%s: expected a charge, the SDK ended with %s" % (what, json.dumps(res)))
    return res


def expect_sdk_error(res, cls, status, raw_type, code, should_retry, what):
    """The SDK raised `cls` for an answer of `status` whose envelope had (raw_type, code) and
    whose Stripe-Should-Retry was `should_retry`."""
    got = (res.get("error"), res.get("statusCode"), res.get("rawType"), res.get("code"),
           res.get("shouldRetry"))
    if res.get("ok") is not False or got != (cls, status, raw_type, code, should_retry):
        harness.fail("%s: expected the SDK to raise %s (status %s, type %s, code %s, "
                     "Stripe-Should-Retry %s), it ended with %s" % (
                         what, cls, status, raw_type, code, should_retry, json.dumps(res)))
    return res


def run_urllib3(url, intents, close=True, timeout=90):
    """clients/urllib3_client.py on Debian's Python: {intent: result}."""
    if not os.path.exists(DEBIAN_PYTHON):
        harness.fail("%s is needed for the urllib3 client (scripts/deps.sh test)" % DEBIAN_PYTHON)
    cmd = [DEBIAN_PYTHON, URLLIB3_CLIENT, "--url", url, "--total", "5", "--backoff", "0.05",
           "--read-timeout", "8", "--threads", "8"]
    if close:
        cmd.append("--close")
    try:
        p = subprocess.run(cmd, input=json.dumps(intents).encode(), capture_output=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        harness.fail("the urllib3 client did not end within %d s" % timeout)
    return client_results("urllib3 client", p.returncode, p.stdout, p.stderr, len(intents))


def raw(gw, path, body, headers, timeout=30):
    """One request to the gateway, sent as given (no principal header of the harness's)."""
    return http_request(gw.host, gw.port, "POST", path, body, headers, timeout)


def gateway_requests(gw, operation, outcome=None):
    """idem_gateway_requests_total of `operation` (of one `outcome`, or all)."""
    samples = harness.parse_metrics(gw.admin("GET", "/metrics").body.decode())
    labels = {"operation": operation}
    if outcome is not None:
        labels["outcome"] = outcome
    return int(harness.metric_value(samples, "idem_gateway_requests_total", **labels))


def fault_plan(n, every=10, drops=(0, 5), resets=(2, 8)):
    """n modes: per `every` connections, DROP at the `drops` places and RESET at the `resets`
    places, the rest FORWARD (so 40% of them fail by default, never three in a row)."""
    return [DROP if i % every in drops else RESET if i % every in resets else FORWARD
            for i in range(n)]


# ---- 1. exactly once under faults --------------------------------------------------------------

INTENTS_PER_KEY = 20


@test
def sdk_retries_through_faults_make_exactly_one_charge_per_intent(ctx):
    gw, up = ctx["gw"], ctx["up"]
    tag = uuid.uuid4().hex[:6]
    # The first connections of the run take the faults: 40% of the first 70 fail, 20% of the
    # next 40; then all are passed (an intent that still loses all six of its attempts is
    # tried again with its key, below, or -- the SDK's own key -- checked for at most once).
    plan = fault_plan(70) + fault_plan(40, every=10, drops=(3,), resets=(7,))
    proxy = FaultProxy("127.0.0.1", gw.port).start()
    proxy.plan(plan)
    t0 = time.monotonic()
    try:
        # One SDK process per API key, as three applications.  The first key lets the SDK make
        # its own idempotency keys (stripe-node-retry-<uuid>, one per call, reused by its
        # retries); the other two keep one per order, as Stripe tells applications to.  Every
        # sixth intent is answered after the SDK's timeout (1.5 s): executed, the answer late.
        runs, intents_of = [], {}
        for n, api_key in enumerate(API_KEYS):
            intents = []
            for i in range(INTENTS_PER_KEY):
                name = "f%s-%d-%02d" % (tag, n, i)
                meta = {"slow_ms": 2200} if i % 6 == 3 else {}
                if i % 7 == 5:
                    it = {"intent": name, "op": "customers.create",
                          "params": {"email": "%s@example.com" % name,
                                     "metadata": dict(meta, intent=name)}}
                    if n:
                        it["idempotencyKey"] = key("cus-" + name)
                else:
                    it = charge(name, amount=100 + 7 * i + n, idem=key(name) if n else None,
                                **meta)
                it["apiKey"] = api_key
                intents.append(it)
                intents_of[name] = it
            runs.append(StripeRun(sdk_config(proxy.port, api_key, retries=5, timeout_ms=1500,
                                             keepAlive=False), intents, "SDK, key %d" % n))
        results = {}
        for run in runs:
            results.update(run.wait(90))
        # An application that keeps its idempotency keys tries an order again that the SDK gave
        # up on (six attempts lost): with the same key, without faults now.
        gave_up = [name for name, r in results.items() if not r.get("ok")]
        again = [intents_of[name] for name in gave_up if "idempotencyKey" in intents_of[name]]
        if again:
            for n, api_key in enumerate(API_KEYS):
                mine = [it for it in again if it["apiKey"] == api_key]
                if mine:
                    results.update(StripeRun(sdk_config(gw.port, api_key, retries=5,
                                                        timeout_ms=5000), mine,
                                             "SDK again, key %d" % n).wait(60))
        proxy.wait_idle(10)
    finally:
        proxy.close()

    problems = []
    for name, it in sorted(intents_of.items()):
        res, got = results[name], up.by_intent(name)
        if len(got) > 1:
            problems.append("%s: %d objects made (%s) for one intent; the SDK ended with %s" % (
                name, len(got), ", ".join(e["id"] for e in got), json.dumps(res)))
        elif res.get("ok"):
            if len(got) != 1 or got[0]["id"] != res["id"]:
                problems.append("%s: the SDK ended with %s, the upstream made %s" % (
                    name, res.get("id"), [e["id"] for e in got]))
            elif got[0]["api_key"] != it["apiKey"]:
                problems.append("%s: made for API key %s, not %s" % (name, got[0]["api_key"],
                                                                    it["apiKey"]))
        elif "idempotencyKey" in it:
            problems.append("%s: the SDK, its key kept, ended without a charge: %s" % (
                name, json.dumps(res)))
    expect(not problems, "%d of %d intents wrong:\n%s" % (len(problems), len(intents_of),
                                                          "\n".join(problems[:12])))
    dropped = [c for c in proxy.connections if c.mode == DROP]
    lost_after = sum(1 for c in dropped if c.response)  # the gateway executed and answered
    resets = sum(1 for c in proxy.connections if c.mode == RESET)
    attempts = sum(r.get("attempts", 0) for r in results.values())
    timeouts = sum(1 for r in results.values() for t in r.get("tries", ()) if t == "ETIMEDOUT")
    replays = sum(1 for r in results.values() if r.get("replayed") == "true")
    unkept = [name for name in gave_up if "idempotencyKey" not in intents_of[name]]
    expect(lost_after > 0 and resets > 0 and timeouts > 0,
           "the faults happened: %d answers lost after executing, %d resets, %d SDK timeouts" % (
               lost_after, resets, timeouts))
    expect(len(unkept) <= 2, "the SDK gave up on %d intents whose key it made itself: %s" % (
        len(unkept), [json.dumps(results[n]) for n in unkept][:3]))
    print("     SDK x 3 keys: %d intents, %d objects; %d attempts (%d answers lost after "
          "executing, %d resets, %d SDK timeouts), %d replays; gave up %d (%d tried again, %d at "
          "most once); %.1f s" % (
              len(intents_of), sum(len(up.by_intent(n)) for n in intents_of), attempts,
              lost_after, resets, timeouts, replays, len(gave_up), len(gave_up) - len(unkept),
              len(unkept), time.monotonic() - t0))


@test
def sdk_over_https_to_the_gateway_makes_exactly_one_charge_per_intent(ctx):
    """The same SDK through the gateway's TLS listener (listen_tls, a certificate of a throw-away
    CA the SDK trusts through NODE_EXTRA_CA_CERTS, as an application trusting a private CA would):
    answers that come after the SDK's timeout make it retry, each attempt on a TLS connection of its
    own, and every intent still makes exactly one object."""
    up = ctx["up"]
    tls_dir = tempfile.mkdtemp(prefix="idem-clients-tls-")
    ca = TlsCa(tls_dir)
    gw = new_gateway(up, "gw-clients-tls", tls=ca.server("gateway"))
    trust = {"NODE_EXTRA_CA_CERTS": ca.cert}
    tag = uuid.uuid4().hex[:6]
    t0 = time.monotonic()
    try:
        gw.start()
        # Without the CA the SDK cannot connect, and nothing is made.
        res = sdk(gw.port, charge("u" + tag, 100, key("untrusted")), retries=0, protocol="https")
        expect(res.get("ok") is False and res.get("error") == "StripeConnectionError",
               "the SDK without the CA: %s" % json.dumps(res))
        expect_eq(up.count(lambda e: e["intent"] == "u" + tag), 0,
                  "objects made for the SDK that did not trust the gateway")
        # Two applications: the first lets the SDK make its keys, the second keeps one per
        # order; every fourth intent is answered after the SDK's timeout (1.5 s).
        runs, intents_of = [], {}
        for n, api_key in enumerate(API_KEYS[:2]):
            intents = []
            for i in range(12):
                name = "t%s-%d-%02d" % (tag, n, i)
                meta = {"slow_ms": 2200} if i % 4 == 1 else {}
                it = charge(name, amount=100 + 7 * i + n, idem=key(name) if n else None, **meta)
                it["apiKey"] = api_key
                intents.append(it)
                intents_of[name] = it
            runs.append(StripeRun(sdk_config(gw.port, api_key, retries=5, timeout_ms=1500,
                                             keepAlive=False, protocol="https"),
                                  intents, "SDK over HTTPS, key %d" % n, env=trust))
        results = {}
        for run in runs:
            results.update(run.wait(90))
    finally:
        gw.close()
        shutil.rmtree(tls_dir, ignore_errors=True)
    problems = []
    for name, it in sorted(intents_of.items()):
        res, got = results[name], up.by_intent(name)
        if not res.get("ok"):
            problems.append("%s: the SDK ended without a charge: %s" % (name, json.dumps(res)))
        elif len(got) != 1 or got[0]["id"] != res["id"]:
            problems.append("%s: the SDK ended with %s, the upstream made %s" % (
                name, res.get("id"), [e["id"] for e in got]))
        elif got[0]["api_key"] != it["apiKey"]:
            problems.append("%s: made for API key %s, not %s" % (name, got[0]["api_key"],
                                                                it["apiKey"]))
    expect(not problems, "%d of %d intents wrong:\n%s" % (len(problems), len(intents_of),
                                                          "\n".join(problems[:12])))
    timeouts = sum(1 for r in results.values() for t in r.get("tries", ()) if t == "ETIMEDOUT")
    attempts = sum(r.get("attempts", 0) for r in results.values())
    expect(timeouts > 0, "the SDK timed out and retried: %d timeouts" % timeouts)
    print("     SDK over HTTPS x 2 keys: %d intents, %d objects; %d attempts (%d SDK timeouts); "
          "%.1f s" % (len(intents_of), sum(len(up.by_intent(n)) for n in intents_of), attempts,
                      timeouts, time.monotonic() - t0))


# ---- 2. the gateway's errors as the SDK's classes ----------------------------------------------

@test
def gateway_errors_are_the_sdks_error_classes(ctx):
    gw, up = ctx["gw"], ctx["up"]
    api_key = API_KEYS[1]
    tag = uuid.uuid4().hex[:6]

    # The key reused with other params: StripeIdempotencyError, not retried.
    k = key("reuse")
    first = expect_ok(sdk(gw.port, charge("r" + tag, 100, k), api_key), "the first charge")
    res = sdk(gw.port, charge("r" + tag, 200, k), api_key)
    expect_sdk_error(res, "StripeIdempotencyError", 400, "idempotency_error",
                     "idempotency_key_reused", "false", "the key reused with another amount")
    expect_eq(res["attempts"], 1, "attempts at a reused key")
    expect_eq([e["id"] for e in up.entries(lambda e: e["key"] == k)], [first["id"]],
              "charges made with the reused key")

    # No caller: a client whose authenticator sends no Authorization at all.
    res = sdk(gw.port, charge("a" + tag, 100), noAuth=True)
    expect_sdk_error(res, "StripeAuthenticationError", 401, "authentication_error", "unauthorized",
                     "false", "no Authorization")
    r = raw(gw, "/v1/charges", "amount=100&currency=usd",
            {"Content-Type": "application/x-www-form-urlencoded", "Idempotency-Key": key()})
    expect_stripe_envelope(r, 401, "authentication_error", "false", "no Authorization (raw)")
    # A key the gateway cannot read ("order 42" is neither an sf-token nor an sf-string).
    res = sdk(gw.port, charge("b" + tag, 100, "order 42"), api_key)
    expect_sdk_error(res, "StripeInvalidRequestError", 400, "invalid_request_error",
                     "idempotency_key_invalid", "false", "a malformed Idempotency-Key")
    r = raw(gw, "/v1/charges", "amount=100&currency=usd",
            {"Content-Type": "application/x-www-form-urlencoded",
             "Authorization": "Bearer " + api_key})
    expect_stripe_envelope(r, 400, "invalid_request_error", "false", "no Idempotency-Key (raw)")
    expect_eq(up.count(lambda e: e["intent"] in ("a" + tag, "b" + tag)), 0,
              "objects made for refused requests")

    # A duplicate while the first still runs (held at the upstream until the test lets it go):
    # without retries the SDK raises the 409 idempotency_key_in_use; with them, it keeps trying
    # and ends with the first's charge.
    k = key("busy")
    it = charge("p" + tag, 300, k, hold="p" + tag)
    try:
        slow = StripeRun(sdk_config(gw.port, api_key, retries=0), [it], "the held first")
        up.wait_for("the first request at the upstream",
                    lambda u: u.count(lambda e: e["key"] == k))
        busy = gateway_requests(gw, "charges.create", "in_progress")
        res = sdk(gw.port, it, api_key, retries=0)
        expect_sdk_error(res, "StripeAPIError", 409, "idempotency_error",
                         "idempotency_key_in_use", "true",
                         "a duplicate while the first runs, no retries")
        expect_eq(res["attempts"], 1, "attempts without retries")
        retrying = StripeRun(sdk_config(gw.port, api_key, retries=5), [it], "the SDK retrying")
        harness.wait_until("the retrying duplicate to be told 409 at least once", lambda:
                           gateway_requests(gw, "charges.create", "in_progress") >= busy + 2,
                           timeout_s=20)
    finally:
        up.release("p" + tag)
    first = expect_ok(slow.wait()[it["intent"]], "the held first")
    retried = expect_ok(retrying.wait()[it["intent"]], "a duplicate the SDK retried")
    expect_eq(retried["id"], first["id"], "the retried duplicate's charge is the first's")
    expect(retried["attempts"] >= 2 and retried["tries"][0] == 409,
           "the SDK retried the 409: %s" % json.dumps(retried))
    expect_eq(up.count(lambda e: e["key"] == k), 1, "charges made for the key in flight")

    # An outcome held: the upstream holds the answer past the gateway's timeout (1 s).  The 504
    # says Stripe-Should-Retry: false, so the SDK does not spend its 5 retries on it; a later
    # call with the key meets the held 503, again not retried.
    short = new_gateway(up, "gw-clients-short", upstream_timeout="1s")
    try:
        short.start()
        k = key("held")
        it = charge("h" + tag, 400, k, hold="h" + tag)
        before = gateway_requests(short, "charges.create")
        res = sdk(short.port, it, api_key, retries=5)
        expect_sdk_error(res, "StripeAPIError", 504, "api_error", "outcome_unknown", "false",
                         "an upstream past the gateway's timeout")
        expect_eq(res["attempts"], 1, "the SDK's attempts at an outcome held")
        again = sdk(short.port, it, api_key, retries=5)
        expect_sdk_error(again, "StripeAPIError", 503, "api_error", "outcome_unknown", "false",
                         "a later call with the held key")
        expect_eq(again["attempts"], 1, "the SDK's attempts at the held key")
        expect_eq(gateway_requests(short, "charges.create") - before, 2,
                  "requests the gateway got for the held key (metrics)")
        expect_eq(len(up.received(lambda r: r["key"] == k)), 1, "requests the upstream got")
    finally:
        up.release("h" + tag)
        short.close()
    print("     SDK classes: reused StripeIdempotencyError, no caller StripeAuthenticationError, "
          "bad key StripeInvalidRequestError, in flight 409 (retried: %d attempts to the first's "
          "charge), held 504 then 503 (1 attempt each)" % retried["attempts"])


def expect_stripe_envelope(r, status, etype, should_retry, what):
    expect(r.status == status and r.content_type == "application/json",
           "%s: expected %d application/json, got %s" % (what, status, r.describe()))
    doc = r.json()
    err = doc.get("error") if isinstance(doc, dict) else None
    expect(isinstance(err, dict) and len(doc) == 1 and err.get("type") == etype and
           isinstance(err.get("code"), str) and err["code"] and
           isinstance(err.get("message"), str) and err["message"],
           "%s: expected {\"error\": {\"type\": %r, \"code\", \"message\"}}, got %s" % (
               what, etype, r.describe()))
    expect_eq(r.header("Stripe-Should-Retry"), should_retry, what + ": Stripe-Should-Retry")


# ---- 3. a transient lock_timeout --------------------------------------------------------------

@test
def a_transient_lock_timeout_is_retried_by_the_sdk_to_one_charge(ctx):
    gw, up = ctx["gw"], ctx["up"]
    tag = uuid.uuid4().hex[:6]
    locked = sdk(gw.port, charge("l" + tag, 700, lock_timeout=2), API_KEYS[2])
    expect_ok(locked, "a charge that met a lock twice")
    expect_eq(locked["tries"], [409, 409, 200], "what the SDK's attempts got")
    made = up.by_intent("l" + tag)
    expect_eq([e["id"] for e in made], [locked["id"]], "charges made")
    expect_eq(len(up.received(lambda r: r["key"] == made[0]["key"])), 3,
              "requests the upstream got (two lock_timeouts, one charge)")
    # A call again with the SDK's key's twin: an application's own key, the same way, then a
    # second call with it is the replay of the charge, not of a 409.
    k = key("lock")
    first = expect_ok(sdk(gw.port, charge("m" + tag, 700, k, lock_timeout=1), API_KEYS[2]),
                      "a charge with its own key that met a lock once")
    again = expect_ok(sdk(gw.port, charge("m" + tag, 700, k, lock_timeout=1), API_KEYS[2]),
                      "the same call again")
    expect_eq((again["id"], again["replayed"]), (first["id"], "true"), "the replay of the charge")
    expect_eq(up.count(lambda e: e["key"] == k), 1, "charges made with the key")
    # A route with store_retryable: true keeps the 409: every retry replays it, nothing more runs.
    k = key("kept")
    res = sdk(gw.port, {"intent": "c" + tag, "op": "customers.create", "idempotencyKey": k,
                        "params": {"email": "c@example.com",
                                   "metadata": {"intent": "c" + tag, "lock_timeout": 1}}},
              API_KEYS[2], retries=2)
    expect_eq((res.get("error"), res.get("statusCode"), res.get("code")),
              ("StripeAPIError", 409, "lock_timeout"), "the stored lock_timeout, replayed: %s" %
              json.dumps(res))
    expect_eq(res["attempts"], 3, "the SDK's attempts (maxNetworkRetries 2)")
    expect_eq(len(up.received(lambda r: r["key"] == k)), 1, "requests the upstream got")
    print("     lock_timeout x2: SDK tries %s, 1 charge; stored (store_retryable) 409 replayed "
          "to %d attempts, upstream saw 1" % (locked["tries"], res["attempts"]))


# ---- 4. connected accounts --------------------------------------------------------------------

@test
def two_connected_accounts_with_one_key_are_two_charges(ctx):
    gw, up = ctx["gw"], ctx["up"]
    tag = uuid.uuid4().hex[:6]
    k = key("acct")
    accounts = ["acct_1%s" % tag.upper(), "acct_2%s" % tag.upper()]
    intents = []
    for a in accounts:
        it = charge("x" + tag, 900, k)
        it["stripeAccount"] = a
        intents.append(it)
    got = {}
    for it in intents:  # one after the other: the same intent name, one result each
        got[it["stripeAccount"]] = expect_ok(sdk(gw.port, it, API_KEYS[0]),
                                             "a charge for " + it["stripeAccount"])
    platform = expect_ok(sdk(gw.port, charge("x" + tag, 900, k), API_KEYS[0]),
                         "the same key for the platform's own account")
    ids = [got[a]["id"] for a in accounts] + [platform["id"]]
    expect(len(set(ids)) == 3, "three charges, one per account: %s" % ids)
    for a in accounts:
        made = up.entries(lambda e: e["key"] == k and e["account"] == a)
        expect_eq([e["id"] for e in made], [got[a]["id"]], "the charge made for " + a)
    expect_eq([e["id"] for e in up.entries(lambda e: e["key"] == k and e["account"] is None)],
              [platform["id"]], "the platform's charge (no Stripe-Account forwarded)")
    for it in intents:  # each account's retry is its own charge again
        again = expect_ok(sdk(gw.port, it, API_KEYS[0]), "again for " + it["stripeAccount"])
        expect_eq((again["id"], again["replayed"]), (got[it["stripeAccount"]]["id"], "true"),
                  "the replay for " + it["stripeAccount"])
    expect_eq(up.count(lambda e: e["key"] == k), 3, "charges made with the key")
    print("     connected accounts: one key, one body: %d charges (2 accounts + platform), "
          "replays each its own" % up.count(lambda e: e["key"] == k))


# ---- 5. replays keep Request-Id and Stripe-Version ---------------------------------------------

@test
def replays_keep_request_id_and_stripe_version(ctx):
    gw, up = ctx["gw"], ctx["up"]
    tag = uuid.uuid4().hex[:6]
    k = key("ids")
    version = "2024-06-20"
    first = expect_ok(sdk(gw.port, charge("v" + tag, 1100, k), API_KEYS[1], apiVersion=version),
                      "a charge")
    again = expect_ok(sdk(gw.port, charge("v" + tag, 1100, k), API_KEYS[1], apiVersion=version),
                      "the same call again")
    expect_eq((again["id"], again["replayed"]), (first["id"], "true"), "the replay")
    expect(first["requestId"], "the first answer's Request-Id: %s" % json.dumps(first))
    expect_eq((again["requestId"], again["stripeVersion"]), (first["requestId"], version),
              "the replay's Request-Id and Stripe-Version (as the SDK reads them)")
    # The same over plain HTTP, headers compared as sent.
    k = key("raw")
    h = {"Authorization": "Bearer " + API_KEYS[1], "Idempotency-Key": k,
         "Stripe-Version": version, "Content-Type": "application/x-www-form-urlencoded"}
    body = "amount=1200&currency=usd&metadata[intent]=w%s" % tag
    r1 = raw(gw, "/v1/charges", body, h)
    r2 = raw(gw, "/v1/charges", body, h)
    expect(r1.status == 200 and r1.header("Request-Id"), "a charge: %s" % r1.describe())
    expect(r2.status == 200 and r2.replayed and r2.body == r1.body,
           "its replay, byte for byte: %s" % r2.describe())
    expect_eq((r2.header("Request-Id"), r2.header("Stripe-Version")),
              (r1.header("Request-Id"), version), "Request-Id and Stripe-Version replayed")
    expect(r2.header("Set-Cookie") is None, "no Set-Cookie replayed: %s" % r2.describe())
    expect_eq(up.count(lambda e: e["key"] in (k,) or e["intent"] == "v" + tag), 2,
              "charges made")
    print("     replays: Request-Id %s and Stripe-Version %s kept" % (r1.header("Request-Id"),
                                                                      version))


# ---- 6. a retry after a crash ------------------------------------------------------------------

@test
def a_retry_after_the_gateway_was_killed_mid_forward_is_answered_at_once(ctx):
    up = ctx["up"]
    tag = uuid.uuid4().hex[:6]
    # upstream.timeout 10 s: the dead process's lease would last 20 s.  The charge is held at
    # the upstream (made, not answered) while the gateway is killed.
    gw = new_gateway(up, "gw-clients-crash", upstream_timeout="10s")
    try:
        gw.start()
        k = key("crash")
        it = charge("k" + tag, 1300, k, hold="k" + tag)
        first = StripeRun(sdk_config(gw.port, API_KEYS[0], retries=0, timeout_ms=20000), [it],
                          "the call cut by the crash")
        up.wait_for("the charge at the upstream", lambda u: u.count(lambda e: e["key"] == k))
        gw.kill9()
        cut = first.wait(30)[it["intent"]]
        expect(not cut.get("ok"), "the call under the kill ends without an answer: %s" %
               json.dumps(cut))
        gw.start()
        t0 = time.monotonic()
        # The application tries the order again with its key; the SDK retries what says so.
        res = sdk(gw.port, it, API_KEYS[0], retries=5)
        took = time.monotonic() - t0
        expect_sdk_error(res, "StripeAPIError", 503, "api_error", "outcome_unknown", "false",
                         "a retry after the restart (hold)")
        expect(took < 5, "answered %.2f s after the restart (tries %s), not after the lease" % (
            took, res.get("tries")))
        expect_eq(len(up.received(lambda r: r["key"] == k)), 1, "requests the upstream got")
        print("     crash: kill -9 mid-forward, restart; the retry got 503 outcome_unknown "
              "after %.2f s (SDK tries %s), 1 charge" % (took, res.get("tries")))
    finally:
        up.release("k" + tag)
        gw.close()


# ---- 7. urllib3's Retry ------------------------------------------------------------------------

@test
def urllib3_retry_through_faults_makes_one_charge_per_intent(ctx):
    gw, up = ctx["gw"], ctx["up"]
    tag = uuid.uuid4().hex[:6]
    proxy = FaultProxy("127.0.0.1", gw.port).start()
    proxy.plan(fault_plan(36) + fault_plan(20, drops=(4,), resets=()))
    t0 = time.monotonic()
    intents = []
    for i in range(30):
        name = "u%s-%02d" % (tag, i)
        intents.append({"intent": name, "path": "/v1/charges", "key": key(name),
                        "apiKey": API_KEYS[i % 3],
                        "body": {"amount": 200 + i, "currency": "eur",
                                 "metadata": {"intent": name}}})
    try:
        results = run_urllib3(proxy.base_url, intents)
        proxy.wait_idle(10)
    finally:
        proxy.close()
    problems = []
    for it in intents:
        name, res = it["intent"], results[it["intent"]]
        made = up.by_intent(name)
        body = res.get("body") if isinstance(res.get("body"), dict) else {}
        if res.get("status") != 200 or len(made) != 1 or made[0]["id"] != body.get("id"):
            problems.append("%s: urllib3 ended with %s; the upstream made %s" % (
                name, json.dumps(res)[:400], [e["id"] for e in made]))
    expect(not problems, "%d of %d intents wrong:\n%s" % (len(problems), len(intents),
                                                          "\n".join(problems[:10])))
    lost_after = sum(1 for c in proxy.connections if c.mode == DROP and c.response)
    resets = sum(1 for c in proxy.connections if c.mode == RESET)
    retries = sum(r.get("retries", 0) for r in results.values())
    replays = sum(1 for r in results.values() if r.get("replayed") == "true")
    expect(lost_after > 0 and resets > 0, "the faults happened: %d answers lost after executing, "
           "%d resets" % (lost_after, resets))
    print("     urllib3 Retry: %d intents, %d charges; %d retries (%d answers lost after "
          "executing, %d resets), %d replays; %.1f s" % (
              len(intents), sum(len(up.by_intent(it["intent"])) for it in intents), retries,
              lost_after, resets, replays, time.monotonic() - t0))


if __name__ == "__main__":
    harness.run("gateway-clients", setup=setup, teardown=teardown)
