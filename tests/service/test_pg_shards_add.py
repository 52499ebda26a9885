#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_pg_shards_add.py - a cluster added to a shard set while a gateway runs (docs/shards.md,
"Adding a cluster"): `idem-gateway shards init` names c1 and c2 (buckets 0-511 on c1), a
gateway serves on them; `shards add` names c3, `shards move` gives it a bucket of c1, and the
same gateway process, not restarted:

  - answers the bucket's principal's next write 503 (c1 refused it: nothing sent upstream),
    reads the map, opens c3 and runs the retry there, once: the record is in c3's database
    only, with the bucket's earlier record the move took along, and a retry replays it;
  - shows it on /metrics: idem_gateway_shard_*{shard="c3"} claims and answers, c1's refusal
    (reason "moved"), the map refreshes and three clusters;
  - `shards add` refuses a name taken, a bad name and a cluster it cannot reach (exit 1).
  - the bucket then frozen by hand on c3 (its directory row moving, c3's fence row gone): c3
    refuses the next write (reason "moved"), and once the map is read the 503s count as
    "moving", on c3 only.

Runs only under tests/pg/with_pg.sh (CTest: service-pg.pg_shards_add).
"""

import re
import subprocess

import harness
from harness import expect, expect_eq, run, test, TestFailure
from gateway_harness import GATEWAY, Gateway, Upstream


bucket_of = harness.shard_bucket


def shards(*args, timeout=60):
    p = subprocess.run([GATEWAY, "shards"] + list(args), capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


class Ctx:
    def __init__(self):
        self.dbs, self.gw = [], None
        self.up = Upstream()
        self.dir_uri, name = harness.pg_create_database("addir")
        self.dbs.append(name)
        self.cluster_uris = []
        for c in ("c1", "c2", "c3"):
            uri, name = harness.pg_create_database("ad" + c)
            self.dbs.append(name)
            self.cluster_uris.append(uri)
        code, out, err = shards("init", "--directory", self.dir_uri,
                                "--cluster", "c1=" + self.cluster_uris[0],
                                "--cluster", "c2=" + self.cluster_uris[1])
        if code != 0:
            raise TestFailure("shards init: %d %r %r" % (code, out, err))
        self.gw = Gateway(self.up, db_uri="shards:" + self.dir_uri)
        self.gw.start()

    def records(self, i, key):
        return [r[0] for r in harness.psql(self.cluster_uris[i],
                                           "SELECT principal FROM idem_records"
                                           " WHERE idem_key = :'k';\n", {"k": key})]

    def metrics(self):
        r = self.gw.admin("GET", "/metrics")
        expect_eq(r.status, 200, "GET /metrics")
        return r.body.decode()

    def close(self):
        if self.gw:
            self.gw.close()
        self.up.close()
        for name in self.dbs:
            harness.pg_drop_database(name)


def metric(text, name, labels=""):
    """The value of `name{labels}` in a /metrics text, or None."""
    m = re.search(r"^%s%s (\d+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return int(m.group(1)) if m else None


@test
def add_refuses_a_name_taken_a_bad_name_and_an_unreachable_cluster(ctx):
    code, out, err = shards("add", "--directory", ctx.dir_uri, "c1", ctx.cluster_uris[2])
    expect(code == 1 and "the name 'c1' is taken" in err, "a name taken: %d %r" % (code, err))
    code, out, err = shards("add", "--directory", ctx.dir_uri, "c 3", ctx.cluster_uris[2])
    expect(code == 1 and "name" in err, "a bad name: %d %r" % (code, err))
    code, out, err = shards("add", "--directory", ctx.dir_uri, "c9",
                            "postgresql://127.0.0.1:1/nowhere?connect_timeout=2")
    expect(code == 1 and "shard cluster c9" in err, "an unreachable cluster: %d %r" % (code, err))
    code, out, err = shards("show", "--directory", ctx.dir_uri)
    named = [line.split()[0] for line in out.splitlines()[1:] if line and not line[0].isspace()]
    expect(code == 0 and "c3" not in named and "c9" not in named, "nothing named: %r" % out)


@test
def a_cluster_added_and_given_a_bucket_takes_its_requests_without_a_restart(ctx):
    p = next("add-%d" % n for n in range(10000) if bucket_of("add-%d" % n) < 512)
    b = bucket_of(p)
    pid = ctx.gw.proc.pid
    before = harness.new_key("before")
    harness.expect_fresh(ctx.gw.request("POST", "/v1/things", {"n": 1}, principal=p, key=before),
                         201, "before the cluster is added")
    expect_eq(len(ctx.records(0, before)), 1, "the first record is at c1")
    text = ctx.metrics()
    expect_eq(metric(text, "idem_gateway_shard_clusters"), 2, "clusters before the add")
    expect_eq(metric(text, "idem_gateway_shard_claims_total", '{shard="c1"}'), 1, "c1's claims")

    code, out, err = shards("add", "--directory", ctx.dir_uri, "c3", ctx.cluster_uris[2])
    expect(code == 0 and "cluster c3 added" in out, "shards add: %d %r %r" % (code, out, err))
    code, out, err = shards("show", "--directory", ctx.dir_uri)
    expect(code == 0 and re.search(r"^c3\s+0\s", out, re.M), "show lists c3, no bucket: %r" % out)
    code, out, err = shards("move", "--directory", ctx.dir_uri, str(b), "--to", "c3")
    expect(code == 0 and ("bucket %d: on c3" % b) in out, "shards move: %d %r %r" % (code, out, err))

    k = harness.new_key("after")
    r = ctx.gw.request("POST", "/v1/things", {"n": 2}, principal=p, key=k)
    expect_eq(r.status, 503, "the first write after the move, refused by c1: %s" % r.describe())
    expect_eq(ctx.up.executions(k), 0, "nothing was sent upstream")
    def retried():
        resp = ctx.gw.request("POST", "/v1/things", {"n": 2}, principal=p, key=k)
        return resp if resp.status != 503 else None

    r = harness.wait_until("a retry not refused once the map names c3", retried, timeout_s=10)
    harness.expect_fresh(r, 201, "a retry once the map names c3")
    harness.expect_replay(ctx.gw.request("POST", "/v1/things", {"n": 2}, principal=p, key=k),
                          r, "a retry of the key run at c3")
    expect_eq(ctx.up.executions(k), 1, "upstream executions of the key")
    expect_eq([len(ctx.records(i, k)) for i in range(3)], [0, 0, 1], "the key's record, by cluster")
    expect_eq([len(ctx.records(i, before)) for i in range(3)], [0, 0, 1],
              "the earlier record went with the bucket")
    expect(ctx.gw.proc.poll() is None and ctx.gw.proc.pid == pid, "the same gateway process")

    text = ctx.metrics()
    expect_eq(metric(text, "idem_gateway_shard_clusters"), 3, "clusters after the add")
    expect_eq(metric(text, "idem_gateway_shard_claims_total", '{shard="c3"}'), 1, "c3's claims")
    expect_eq(metric(text, "idem_gateway_shard_answers_total", '{shard="c3"}'), 1, "c3's answers")
    expect_eq(metric(text, "idem_gateway_shard_claims_total", '{shard="c1"}'), 1,
              "c1's claims: the refused one is none")
    expect(metric(text, "idem_gateway_shard_refused_total", '{shard="c1",reason="moved"}') >= 1,
           "c1's refusal of the moved bucket: %r" % re.findall(r"^idem_gateway_shard.*$", text, re.M))
    expect_eq(metric(text, "idem_gateway_shard_refused_total", '{shard="c3",reason="moved"}'), 0,
              "c3 refused nothing")
    expect(metric(text, "idem_gateway_shard_map_refreshes_total") >= 1, "the map was read again")
    # The store's and the replay cache's series, one per cluster; c3's took the one write there.
    for name in ("idem_gateway_store_write_commits_total", "idem_gateway_replay_cache_bytes"):
        expect_eq(text.count("# TYPE %s " % name), 1, "TYPE lines of %s" % name)
        for c in ("c1", "c2", "c3"):
            expect(metric(text, name, '{shard="%s"}' % c) is not None, "%s of %s" % (name, c))
    expect(metric(text, "idem_gateway_store_write_commits_total", '{shard="c3"}') >= 1,
           "c3's store commits")
    expect(metric(text, "idem_gateway_replay_cache_bytes", '{shard="c3"}') >= 1,
           "c3's replay cache holds its answer")


@test
def a_bucket_frozen_on_the_new_cluster_is_counted_as_moving(ctx):
    """As a move's freeze and fence steps leave it: c3 refuses (moved), the map says moving."""
    p = next("add-%d" % n for n in range(10000) if bucket_of("add-%d" % n) < 512)
    b = bucket_of(p)
    harness.psql(ctx.dir_uri, "UPDATE idem_shard_buckets SET moving = 1 WHERE bucket = %d;\n" % b)
    harness.psql(ctx.cluster_uris[2], "DELETE FROM idem_buckets WHERE bucket = %d;\n" % b)
    k = harness.new_key("frozen")

    def moving():
        r = ctx.gw.request("POST", "/v1/things", {"n": 3}, principal=p, key=k)
        expect_eq(r.status, 503, "a write of the frozen bucket: %s" % r.describe())
        return metric(ctx.metrics(), "idem_gateway_shard_refused_total",
                      '{shard="c3",reason="moving"}') >= 1
    harness.wait_until("a 503 of the bucket counted as moving on c3", moving, timeout_s=10)
    text = ctx.metrics()
    expect(metric(text, "idem_gateway_shard_refused_total", '{shard="c3",reason="moved"}') >= 1,
           "c3's refusal before the map was read: %r"
           % re.findall(r"^idem_gateway_shard_refused.*$", text, re.M))
    expect_eq(metric(text, "idem_gateway_shard_refused_total", '{shard="c1",reason="moving"}'), 0,
              "c1: no bucket of its is moving")
    expect_eq(ctx.up.executions(k), 0, "nothing was sent upstream")


if __name__ == "__main__":
    run("test_pg_shards_add", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
