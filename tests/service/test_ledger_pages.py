# SPDX-License-Identifier: Apache-2.0
"""
test_ledger_pages.py - the audit at scale: provider-sim's per-reference ledger in pages
(GET /v1/ledger/references, src/provider-sim/ledger.c, ledger_query.c) and `idem-check chaos`
reading everything it audits in bounded pages (src/idem-check/chaos_read.c):

  - the pages: every reference exactly once, in order, at most `limit` per page, `after=`
    continuing where the last page stopped (UTF-8 references too), the default and largest
    limits, successful and declined charges and emails counted per reference, a duplicate both
    counted in its page and flagged by GET /v1/ledger, whose totals carry no per-key map;
  - bad arguments (kind, limit, after) are 400 problem+json, other methods 405;
  - a chaos run whose audit is larger than one page (--audit-page-size 7, 40 intents, faults and
    a kill every second on): clean, having really read many pages of orders and of the ledger, small answers
    only, its peak memory reported, and a progress line for the audit on a terminal;
  - an audit that cannot read a page (attached to a provider whose per-reference answer is 2 MiB,
    over idem-check's 1 MiB limit) fails as incomplete, naming the request, what came back and how
    large, instead of counting every order unsettled; and prints no progress line to a pipe.

Store: provider-sim's SQLite file, or, under with_pg.sh (service-pg.ledger_pages), a fresh
PostgreSQL database for provider-sim and for orderd.
"""

import atexit
import http.client
import json
import os
import pty
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (BIN, HttpFront, expect, expect_eq, fail, new_key, pg_create_database,  # noqa: E402
                     pg_drop_database, pg_fresh_mode, run, test)
from provider import Provider, paid_pair  # noqa: E402

IDEM_CHECK = os.path.join(BIN, "idem-check")
ORDERD = os.path.join(BIN, "orderd")
PROVIDER_SIM = os.path.join(BIN, "provider-sim")

WORK = tempfile.mkdtemp(prefix="idem-pages-test-")
atexit.register(shutil.rmtree, WORK, True)
_databases = []


def _drop_databases():
    for name in _databases:
        pg_drop_database(name)


atexit.register(_drop_databases)


def fresh_pg_db(prefix):
    """A fresh PostgreSQL database under with_pg.sh (dropped at exit), else None."""
    if not pg_fresh_mode():
        return None
    uri, name = pg_create_database(prefix)
    _databases.append(name)
    return uri


def get(prov, path):
    """GET `path` of provider-sim: (status, Content-Type, parsed JSON body)."""
    c = http.client.HTTPConnection("127.0.0.1", prov.port, timeout=30)
    try:
        c.request("GET", path)
        r = c.getresponse()
        raw = r.read()
        return r.status, r.getheader("Content-Type"), (json.loads(raw) if raw else None)
    finally:
        c.close()


def post(prov, path, body):
    status, doc = prov.call("POST", path, body, headers={"Idempotency-Key": new_key("pg")})
    expect(status in (201, 402), "POST %s: %d %r" % (path, status, doc))
    return doc


def charge(prov, order, source="tok_ok"):
    post(prov, "/v1/charges", {"amount": 100, "currency": "EUR", "source": source,
                               "metadata": {"orderId": order}})


def email(prov, order, template="order_confirmation"):
    post(prov, "/v1/emails", {"to": "a@example.com", "subject": "s", "template": template,
                              "metadata": {"orderId": order}})


def references(kind, after=None, limit=None):
    q = [("kind", kind)]
    if after is not None:
        q.append(("after", after))
    if limit is not None:
        q.append(("limit", str(limit)))
    return "/v1/ledger/references?" + urllib.parse.urlencode(q, quote_via=urllib.parse.quote)


def walk(prov, kind, limit):
    """Every page of `kind`, following nextAfter: (all entries, number of pages)."""
    entries, pages, after = [], 0, None
    while True:
        status, ctype, doc = get(prov, references(kind, after, limit))
        expect_eq(status, 200, "page %d of %s: %r" % (pages + 1, kind, doc))
        expect_eq(ctype, "application/json", "Content-Type of a page")
        expect_eq((doc["object"], doc["kind"]), ("list", kind), "a page of %s" % kind)
        pages += 1
        data = doc["data"]
        expect(len(data) <= limit, "at most %d entries on a page, not %d" % (limit, len(data)))
        entries += data
        if not doc["hasMore"]:
            expect(doc["nextAfter"] is None, "no nextAfter on the last page: %r" % doc)
            return entries, pages
        expect_eq(len(data), limit, "a page followed by another is full")
        expect_eq(doc["nextAfter"], data[-1]["reference"], "nextAfter is the page's last")
        after = doc["nextAfter"]
        expect(pages < 1000, "the listing ends")


ORDERS = ["ord_%03d" % i for i in range(130)]
UTF8_ORDER = "ord_\u00e9t\u00e9"  # a reference a client may put in metadata, not ASCII


def filled_provider():
    """provider-sim (its store fresh) with 131 orders' charges and emails, one declined charge,
    one duplicate charge, and an email of another template."""
    prov = Provider(name="pages-provider-sim")
    pg = fresh_pg_db("pages")
    if pg:
        prov.db = pg
    prov.start()
    for o in ORDERS + [UTF8_ORDER]:
        charge(prov, o)
        email(prov, o)
    charge(prov, "ord_declined", source="tok_declined")
    charge(prov, "ord_007")  # a second charge for one order: a duplicate, under another key
    email(prov, "ord_001", template="welcome")
    return prov


@test
def test_pages_list_every_reference_once(ctx):
    prov = ctx["prov"]
    charges, pages = walk(prov, "charges", 7)
    refs = [e["reference"] for e in charges]
    expect_eq(sorted(refs), sorted(ORDERS + [UTF8_ORDER, "ord_declined"]),
              "every charged reference, once")
    expect_eq(pages, (len(refs) + 6) // 7, "pages of 7")
    ascii_refs = [r for r in refs if r.isascii()]
    expect_eq(ascii_refs, sorted(ascii_refs), "in order of reference")
    by = {e["reference"]: e for e in charges}
    expect_eq((by["ord_000"]["succeeded"], by["ord_000"]["failed"]), (1, 0), "one charge")
    expect_eq((by["ord_007"]["succeeded"], by["ord_007"]["failed"]), (2, 0), "the duplicate")
    expect_eq((by["ord_declined"]["succeeded"], by["ord_declined"]["failed"]), (0, 1),
              "a declined charge")
    expect_eq(by[UTF8_ORDER]["succeeded"], 1, "the UTF-8 reference")

    emails, pages = walk(prov, "emails", 10)
    counts = {e["reference"]: e["count"] for e in emails}
    expect_eq(len(emails), len(counts), "every email reference once")
    expect_eq(sorted(counts), sorted(["order_confirmation:" + o for o in ORDERS + [UTF8_ORDER]] +
                                     ["welcome:ord_001"]), "emails by template and order")
    expect(all(v == 1 for v in counts.values()), "one email each: %r" % counts)
    expect_eq(pages, (len(emails) + 9) // 10, "pages of 10")


@test
def test_after_limit_and_defaults(ctx):
    prov = ctx["prov"]
    status, _, doc = get(prov, references("charges"))
    expect_eq((status, len(doc["data"]), doc["hasMore"]), (200, 100, True), "default limit 100")
    status, _, doc = get(prov, references("charges", limit=1000))
    expect_eq((status, len(doc["data"]), doc["hasMore"], doc["nextAfter"]),
              (200, 132, False, None), "limit 1000: everything in one page")
    last = doc["data"][-1]["reference"]
    status, _, doc = get(prov, references("charges", after=last))
    expect_eq((status, doc["data"], doc["hasMore"]), (200, [], False), "after the last one")
    status, _, doc = get(prov, references("charges", after="ord_128", limit=5))
    got = [e["reference"] for e in doc["data"]]
    expect(got[0] == "ord_129" and "ord_128" not in got, "strictly after: %r" % got)
    status, _, doc = get(prov, references("charges", after=UTF8_ORDER, limit=1000))
    expect_eq(status, 200, "a UTF-8 after")
    expect(UTF8_ORDER not in [e["reference"] for e in doc["data"]], "after excludes itself")
    status, _, doc = get(prov, references("charges", after="", limit=1000))
    expect_eq((status, len(doc["data"])), (200, 132), "after the empty reference: all")


@test
def test_ledger_totals_flag_duplicates_without_maps(ctx):
    prov = ctx["prov"]
    doc = prov.ledger(keys=False)
    expect("byKey" not in doc["charges"] and "byReference" not in doc["charges"],
           "no per-key or per-reference map with keys=0: %r" % doc["charges"])
    expect_eq(doc["charges"]["succeeded"], 132, "successful charges")
    expect_eq(doc["emails"]["byTemplate"], {"order_confirmation": 131, "welcome": 1}, "templates")
    expect_eq(doc["duplicates"], [{"kind": "charge", "by": "reference", "value": "ord_007",
                                   "count": 2}], "the one duplicate, flagged")
    expect(not doc["clean"], "not clean")


@test
def test_bad_arguments_are_400(ctx):
    prov = ctx["prov"]
    for path, what in [
        ("/v1/ledger/references", "no kind"),
        ("/v1/ledger/references?kind=refunds", "an unknown kind"),
        ("/v1/ledger/references?kind=", "an empty kind"),
        (references("charges", limit=0), "limit 0"),
        (references("charges", limit=1001), "limit 1001"),
        (references("charges", limit=-1), "a negative limit"),
        (references("emails", limit="ten"), "a limit that is not a number"),
        ("/v1/ledger/references?kind=charges&limit=", "an empty limit"),
        ("/v1/ledger/references?kind=charges&after=%FF", "an after that is not UTF-8"),
        ("/v1/ledger/references?kind=charges&after=%ED%A0%80", "a UTF-8 surrogate"),
        (references("charges", after="o" * 1025), "an after over 1024 bytes"),
    ]:
        status, ctype, doc = get(prov, path)
        expect_eq(status, 400, "%s: %r" % (what, doc))
        expect_eq(ctype, "application/problem+json", "%s: Content-Type" % what)
        expect_eq((doc["status"], doc["code"]), (400, "validation-failed"), "%s: problem" % what)
        expect(doc["detail"], "%s: says why" % what)
    status, _, doc = get(prov, references("charges", after="o" * 1024))
    expect_eq(status, 200, "an after of 1024 bytes: %r" % doc)
    status, doc = prov.call("POST", references("charges"), {})
    expect_eq((status, doc["code"]), (405, "method-not-allowed"), "POST")


# ---- idem-check chaos reading in pages --------------------------------------------------------

def idem_check(args, timeout=150, tty=False):
    """
    Runs idem-check; stderr on a pseudo-terminal when `tty` (what a person at a terminal sees),
    else a pipe.  Returns (rc, stdout, stderr, seconds).
    """
    env = dict(os.environ, TMPDIR=WORK)
    t0 = time.monotonic()
    master = slave = None
    chunks = []
    if tty:
        master, slave = pty.openpty()
    try:
        p = subprocess.Popen([IDEM_CHECK] + args, stdout=subprocess.PIPE,
                             stderr=slave if tty else subprocess.PIPE, env=env)
    except FileNotFoundError:
        fail("%s not found (IDEM_BIN=%s): build the idem-check target" % (IDEM_CHECK, BIN))
    reader = None
    if tty:
        os.close(slave)

        def drain():
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO once the child's side is closed
                    return
                if not data:
                    return
                chunks.append(data)
        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        fail("`idem-check %s` did not finish in %d s" % (" ".join(args), timeout))
    if tty:
        reader.join(10)
        os.close(master)
        err = b"".join(chunks)
    return (p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
            time.monotonic() - t0)


def parse_json(rc, out, err):
    try:
        return json.loads(out)
    except ValueError as e:
        fail("--json output is not JSON (%s), rc %d:\n%s\nstderr: %s" % (e, rc, out, err[-2000:]))


@test
def test_chaos_audit_larger_than_one_page(ctx):
    intents, page = 40, 7
    args = ["chaos", "--orderd-bin", ORDERD, "--provider-bin", PROVIDER_SIM,
            "--intents", str(intents), "--clients", "4", "--max-time", "60", "--kill-every", "1",
            "--audit-page-size", str(page), "--drop-rate", "0.1", "--reset-rate", "0.05",
            "--dup-rate", "0.1", "--provider-lost-rate", "0.05", "--provider-5xx-rate", "0.05",
            "--json"]
    db = fresh_pg_db("chaospages")
    if db:
        args += ["--db", db]
    rc, out, err, took = idem_check(args, tty=True)
    doc = parse_json(rc, out, err)
    print("measured: paged audit took %.1f s: %s" % (took, out.strip()), flush=True)
    started = doc["intents"]["started"]
    expect_eq(rc, 0, "exit code of a clean run:\n%s\nstderr: %s" % (out, err[-2000:]))
    expect_eq((doc["verdict"], doc["duplicates"], doc["lost"], doc["unsettled"],
               doc["webhookProblems"]), ("clean", 0, 0, 0, 0), "a clean verdict")
    expect(intents // 2 <= started <= intents, "intents started: %d" % started)
    expect_eq((doc["orders"]["total"], doc["ledger"]["charges"], doc["ledger"]["emails"]),
              (started, started, started), "orders, charges, emails of the run")
    a = doc["audit"]
    expect(a["complete"] and a["problem"] == "", "the audit read everything: %r" % a)
    expect_eq(a["pageSize"], page, "--audit-page-size")
    per_listing = (started + page - 1) // page
    # The orders: one page before the run, then every page at least once after it.
    expect(a["orderPages"] >= 1 + per_listing, "pages of orders read: %r" % a)
    # The ledger: every page of charges and of emails at least once.
    expect(a["ledgerPages"] >= 2 * per_listing, "ledger pages read: %r" % a)
    expect(a["largestAnswerBytes"] < 8192, "every answer was a small page: %r" % a)
    expect(doc["peakRssKiB"] > 0, "idem-check's peak RSS is reported: %r" % doc)
    # On a terminal, the audit says what it is doing, then sums up.
    expect("audit: " in err, "an audit progress line on the terminal: %r" % err[-600:])
    expect("ledger pages read in" in err, "the audit's last line: %r" % err[-600:])
    expect(took <= 120, "a short run stays short (%.1f s)" % took)


OVERSIZE = 2 << 20  # twice idem-check's body limit


def oversize_references(port):
    """
    An HTTP front for provider-sim that passes everything on, except that its per-reference pages
    come back as 2 MiB of JSON, twice idem-check's body limit.
    """
    head, tail = b'{"object":"list","data":[', b'],"hasMore":false}'
    page = head + b" " * (OVERSIZE - len(head) - len(tail)) + tail  # made once, not per request

    def intercept(path):
        if not path.startswith("/v1/ledger/references"):
            return None
        return 200, [("Content-Type", "application/json")], page
    return HttpFront(port, intercept=intercept)


@test
def test_unreadable_page_is_named_not_unsettled(ctx):
    prov, s = paid_pair(name="oversize")
    front = None
    try:
        s.start()
        user = s.new_user("chaos-oversize")
        front = oversize_references(prov.port)
        rc, out, err, took = idem_check(["chaos", "--attach", "--orderd-url", s.base_url,
                                         "--provider-url", front.url, "--token", user.token,
                                         "--intents", "10", "--clients", "2", "--grace", "2",
                                         "--json"])
        doc = parse_json(rc, out, err)
        print("measured: audit with an oversize page took %.1f s: %s" % (took, out.strip()),
              flush=True)
        expect_eq((rc, doc["verdict"]), (1, "failed"), "an incomplete audit fails")
        a = doc["audit"]
        expect(not a["complete"], "the audit says it is incomplete: %r" % a)
        want = "an answer of %d bytes, over idem-check's limit of %d" % (
            OVERSIZE, 1 << 20)
        expect("GET %s/v1/ledger/references?kind=charges" % front.url in a["problem"] and
               want in a["problem"], "the problem names the request and its size: %r" % a)
        expect(doc["firstProblem"].startswith("audit incomplete: GET "),
               "and is the first problem: %r" % doc["firstProblem"])
        expect_eq((doc["unsettled"], doc["lost"], doc["duplicates"]), (0, 0, 0),
                  "what could not be read is not counted against the service")
        expect_eq(doc["orders"]["total"], 10, "the orders were still matched to the intents")
        expect("audit:" not in err, "no audit progress line on a pipe: %r" % err[-600:])
    finally:
        if front is not None:
            front.close()
        s.close()
        prov.close()


def setup():
    return {"prov": filled_provider()}


def teardown(ctx):
    if ctx:
        ctx["prov"].close()


if __name__ == "__main__":
    run("ledger pages", setup=setup, teardown=teardown)
