#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_provider_tls.py - orderd calling its provider over HTTPS, as in production: provider-sim
serves TLS (--tls-cert) with certificates of a throw-away CA (tls_ca.py), orderd trusts that CA
(--provider-ca), real TLS on loopback:

  - an order is charged through the https:// provider, its confirmation email goes out the same
    way, a retry replays, and the provider's ledger is clean;
  - a provider certificate orderd must not trust (signed by another CA, naming another host, or a
    private CA with no --provider-ca, so the system's store) gets no byte of the charge: the
    provider counts no POST and no charge, and orderd answers and keeps the order exactly as it
    does when the provider is unreachable (503 outcome-unknown, the order pending_payment and
    flagged for the reconciler); once the provider shows a certificate orderd trusts, the
    reconciler charges the order once;
  - --provider-ca is refused without an https:// --provider, or when it cannot be read.
"""

import http.client
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (ORDERD, Server, charge_key, expect, expect_eq, expect_problem,  # noqa: E402
                     expect_replay, free_port, metric_value, metrics, new_key, order_of, run,
                     test)
from provider import WEBHOOK_SECRET, Provider, wait_until  # noqa: E402
from tls_ca import TlsCa  # noqa: E402

FAST = ["--completer-interval-ms", "100", "--reconciler-interval-ms", "100",
        "--reconcile-after-ms", "300", "--outbox-interval-ms", "50"]


class Setup:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="idem-provider-tls-")
        self.ca = TlsCa(self.dir)
        self.good = self.ca.server("good")
        self.other = self.ca.server("other", hosts=["example.org"])
        self.untrusted = TlsCa(self.dir, name="rogue").server("untrusted")


class TlsProvider(Provider):
    """provider-sim over HTTPS with a copy of `leaf`, so a test may give it another (SIGHUP)."""

    def __init__(self, ctx, leaf, webhook_url, name):
        self.tls_dir = tempfile.mkdtemp(prefix="idem-prov-tls-")
        self.cert = os.path.join(self.tls_dir, "sim.pem")
        self.key = os.path.join(self.tls_dir, "sim.key")
        self.install(leaf)
        super().__init__(args=["--tls-cert", self.cert, "--tls-key", self.key],
                         webhook_url=webhook_url, name=name)

    def connection(self, timeout=30):
        # The test's own reads (ledger, charges) whatever certificate it shows now: what is
        # tested is orderd's verification, not this client's.
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=tls)

    def install(self, leaf):
        shutil.copyfile(leaf.chain, self.cert + ".new")
        shutil.copyfile(leaf.key, self.key + ".new")
        os.replace(self.key + ".new", self.key)
        os.replace(self.cert + ".new", self.cert)

    def rotate(self, leaf):
        """Gives it `leaf`'s certificate for new connections."""
        self.install(leaf)
        before = open(self.stderr_path).read().count("read again")
        self.proc.send_signal(signal.SIGHUP)
        wait_until("provider-sim to read its certificate again",
                   lambda: open(self.stderr_path).read().count("read again") > before)

    def close(self):
        super().close()
        shutil.rmtree(self.tls_dir, ignore_errors=True)


def tls_pair(ctx, leaf, name, order_args=FAST, trust=True):
    """provider-sim over HTTPS with `leaf`, and an orderd calling it (trusting ctx.ca if `trust`)."""
    port = free_port()
    prov = TlsProvider(ctx, leaf, "http://127.0.0.1:%d/webhooks/provider" % port,
                       name + "-provider-sim")
    prov.start()
    args = ["--listen", "127.0.0.1:%d" % port, "--provider", prov.url,
            "--webhook-secret", WEBHOOK_SECRET] + list(order_args)
    if trust:
        args += ["--provider-ca", ctx.ca.cert]
    return prov, Server(name=name + "-orderd", extra_args=args)


def stderr_of(server):
    with open(server.stderr_path) as f:
        return f.read()


@test
def an_order_is_paid_through_an_https_provider(ctx):
    prov, s = tls_pair(ctx, ctx.good, "tls-pay")
    with prov, s:
        expect(prov.url.startswith("https://"), "provider-sim serves HTTPS: " + prov.url)
        u = s.new_user("tls")
        k = new_key("order")
        first = u.create_order(k, quantity=2)
        expect_eq(first.status, 201, "an order through the https provider: " + first.describe())
        doc = first.json()
        expect_eq(doc["status"], "paid", "status of the order")
        charges = prov.charges_by_key(charge_key(doc["orderId"]))
        expect_eq(len(charges), 1, "charges of the order's key")
        expect_eq(doc.get("chargeId"), charges[0]["id"], "chargeId")
        expect_replay(u.create_order(k, quantity=2), first, "retry of the paid order")
        wait_until("the confirmation email over HTTPS",
                   lambda: prov.ledger(keys=False)["emails"]["total"] == 1)
        led = prov.ledger(keys=False)
        expect(led["clean"], "the ledger flags no duplicate: %r" % led.get("duplicates"))
        expect_eq((led["charges"]["succeeded"], led["emails"]["total"]), (1, 1),
                  "charges and emails")
        expect_eq(metric_value(metrics(u), "orderd_provider_calls_total", call="charge",
                               outcome="ok"), 1, "one charge call")


def refused_order(u, what):
    """An order whose charge cannot be made: what orderd answers and keeps (status, pending ids,
    payments flagged unknown)."""
    r = u.create_order(new_key("refused"))
    expect_problem(r, 503, "outcome-unknown", what)
    pending = [o["orderId"] for o in u.all_orders() if o["status"] == "pending_payment"]
    return r.status, r.json().get("code"), pending


@test
def an_untrusted_certificate_charges_nothing_and_waits_as_for_an_unreachable_provider(ctx):
    # The reconciler is held back until the end, so that each refusal can be seen as it is left.
    prov, s = tls_pair(ctx, ctx.untrusted, "tls-refused",
                       order_args=["--reconciler-interval-ms", "0", "--completer-interval-ms",
                                   "0", "--outbox-interval-ms", "50"])
    with prov, s:
        u = s.new_user("refused")
        unknown = []
        # 1. Signed by a CA orderd does not trust.
        st, code, pending = refused_order(u, "a certificate of an untrusted CA")
        expect_eq(len(pending), 1, "the order exists and waits for its payment")
        unknown.append(metric_value(metrics(u), "orderd_payments_unknown", kind="charge"))
        expect("TLS with the provider failed, nothing sent" in stderr_of(s),
               "the log says why:\n" + stderr_of(s)[-2000:])
        # 2. Signed by the trusted CA, for another host.
        prov.rotate(ctx.other)
        refused_order(u, "a certificate for another host")
        unknown.append(metric_value(metrics(u), "orderd_payments_unknown", kind="charge"))
        led = prov.ledger(keys=False)
        expect_eq((led["requests"]["posts"], led["charges"]["total"]), (0, 0),
                  "POSTs and charges the provider saw from orderd")
        # 3. The same provider unreachable: the same answer, the same state.
        prov.stop()
        st3, code3, pending3 = refused_order(u, "the provider unreachable")
        unknown.append(metric_value(metrics(u), "orderd_payments_unknown", kind="charge"))
        expect_eq((st3, code3), (st, code), "unreachable vs untrusted: the answer")
        expect_eq(len(pending3), 3, "orders pending payment, one per attempt")
        expect_eq(unknown, [1, 2, 3], "orderd_payments_unknown after each (flagged alike)")
        # 4. A certificate orderd trusts: the reconciler settles each order with one charge.
        prov.install(ctx.good)
        prov.start()
        s.stop()
        s.extra_args += FAST  # the reconciler on now (the last of a repeated flag wins)
        s.start()
        for oid in pending3:
            wait_until("the reconciler to charge %s" % oid,
                       lambda: order_of(u, oid)["status"] == "paid")
            expect_eq(len(prov.charges_by_key(charge_key(oid))), 1, "charges of " + oid)
        led = prov.ledger(keys=False)
        expect(led["clean"], "the ledger flags no duplicate: %r" % led.get("duplicates"))
        expect_eq(led["charges"]["succeeded"], 3, "charges in the end")


@test
def the_system_store_does_not_trust_a_private_ca(ctx):
    prov, s = tls_pair(ctx, ctx.good, "tls-system", trust=False)
    with prov, s:
        u = s.new_user("system")
        refused_order(u, "a private CA without --provider-ca")
        led = prov.ledger(keys=False)
        expect_eq((led["requests"]["posts"], led["charges"]["total"]), (0, 0),
                  "POSTs and charges the provider saw")
        expect("certificate" in stderr_of(s), "the log says why:\n" + stderr_of(s)[-2000:])


@test
def provider_ca_is_refused_where_it_means_nothing(ctx):
    for args, said in (
            (["--provider", "http://127.0.0.1:1", "--provider-ca", ctx.ca.cert],
             "--provider-ca needs an https:// --provider"),
            (["--provider-ca", ctx.ca.cert], "--provider-ca needs an https:// --provider"),
            (["--provider", "https://127.0.0.1:1", "--provider-ca",
              os.path.join(ctx.dir, "missing.pem")], "--provider-ca")):
        p = subprocess.run([ORDERD, "serve", "--listen", "127.0.0.1:0"] + args,
                           capture_output=True, timeout=20, text=True)
        expect(p.returncode == 2 and said in p.stderr,
               "orderd serve %r: %d %r" % (args, p.returncode, p.stderr))
    p = subprocess.run([ORDERD, "serve", "--help"], capture_output=True, timeout=20, text=True)
    expect(p.returncode == 0 and "--provider-ca FILE" in p.stdout, "--help lists --provider-ca")


if __name__ == "__main__":
    run("provider-tls", setup=Setup)
