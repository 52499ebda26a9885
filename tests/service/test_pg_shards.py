#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_pg_shards.py - idem-gateway on a shard set (docs/shards.md): `store: shards:URI`, the URI a
directory database naming three clusters, which are three more databases of the with_pg.sh
server.  Buckets 0-341 are on c1, 342-682 on c2, the rest on c3, set up with the SQL of
docs/shards.md.

  - keys of many principals: each record is in the database that owns its principal's bucket
    (SHA-256, first 8 bytes big-endian, mod 1024, computed here in Python) and in no other;
  - a retry is a replay, run upstream once; `keys show` and GET /records find each record;
  - held keys on two clusters: `keys list` and GET /records/list list both, also a page at a
    time (--limit 1), the cursor going from one cluster to the next;
  - a bucket moved by hand while the gateway runs (directory flipped, the old owner's
    idem_buckets row deleted, the new owner's inserted): the gateway's first write for it is
    refused by the old owner (503, nothing sent upstream), and once it has read the map again a
    retry runs at the new owner, once.

Runs only under tests/pg/with_pg.sh (CTest: service-pg.pg_shards).
"""

import json
import subprocess
import time

import harness
from harness import expect, expect_eq, run, test, TestFailure
from gateway_harness import GATEWAY, Gateway, Upstream

CLUSTERS = harness.SHARD_CLUSTERS
bucket_of = harness.shard_bucket
owner_of = harness.shard_owner


class Ctx:
    def __init__(self):
        self.dbs = []
        self.gw = None
        self.up = Upstream()
        # The directory and each cluster's rows, as docs/shards.md sets them up.
        self.dir_uri, self.cluster_uris, self.dbs = harness.pg_shard_set_by_hand("sh")
        self.gw = Gateway(self.up, db_uri="shards:" + self.dir_uri)
        self.gw.start()

    def records(self, i, key):
        """The principals of cluster i's records of `key`."""
        return [r[0] for r in harness.psql(self.cluster_uris[i],
                                           "SELECT principal FROM idem_records"
                                           " WHERE idem_key = :'k';\n", {"k": key})]

    def close(self):
        if self.gw:
            self.gw.close()
        self.up.close()
        for name in self.dbs:
            harness.pg_drop_database(name)


def keys_cli(gw, *args):
    p = subprocess.run([GATEWAY, "keys"] + list(args) + ["--config", gw.config_path],
                       capture_output=True, timeout=30)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def principal_on(cluster, prefix):
    """A principal whose bucket is on `cluster` (0, 1, 2)."""
    n = 0
    while owner_of(bucket_of("%s-%d" % (prefix, n))) != cluster:
        n += 1
    return "%s-%d" % (prefix, n)


@test
def records_land_in_the_owning_cluster_only_and_replay_there(ctx):
    seen = set()
    for n in range(15):
        p, k = "user-%d" % n, harness.new_key("shard")
        first = ctx.gw.request("POST", "/v1/things", {"n": n}, principal=p, key=k)
        harness.expect_fresh(first, 201, "a new key of %s" % p)
        harness.expect_replay(ctx.gw.request("POST", "/v1/things", {"n": n}, principal=p, key=k),
                              first, "a retry of %s" % p)
        expect_eq(ctx.up.executions(k), 1, "upstream executions of %s" % k)
        where = [i for i in range(3) if ctx.records(i, k)]
        expect(len(where) == 1, "the record of %s is in one cluster: %r" % (k, where))
        stored = ctx.records(where[0], k)[0]
        expect_eq(where[0], owner_of(bucket_of(stored)),
                  "the cluster of %s's record (principal %r, bucket %d)"
                  % (k, stored, bucket_of(stored)))
        seen.add(where[0])
        code, out, err = keys_cli(ctx.gw, "show", "--principal", stored, "--operation",
                                  "things.create", "--key", k)
        expect(code == 0 and json.loads(out)["state"] == "completed",
               "keys show finds %s: %d %r %r" % (k, code, out, err))
        shown = ctx.gw.admin("GET", "/records?principal=%s&operation=things.create&key=%s"
                             % (stored, k))
        expect_eq(shown.status, 200, "GET /records of %s" % k)
    expect_eq(seen, {0, 1, 2}, "the clusters that got records")


@test
def held_keys_of_every_cluster_are_listed(ctx):
    held = {}
    for c in (0, 2):
        p, k = principal_on(c, "held"), harness.new_key("held")
        r = ctx.gw.request("POST", "/v1/things", {"n": 1}, principal=p, key=k,
                           headers={"X-Test-Mode": "reset"})
        expect_eq(r.status, 502, "an upstream reset: %s" % r.describe())
        held[k] = c
    code, out, err = keys_cli(ctx.gw, "list", "--state", "unknown", "--limit", "1000")
    listed = [r["key"] for r in json.loads(out)["records"]] if code == 0 else []
    expect(set(held) <= set(listed), "keys list shows both: %d %r %r" % (code, out[:400], err))
    page = ctx.gw.admin("GET", "/records/list?state=unknown&limit=1000").json()["records"]
    expect(set(held) <= {r["key"] for r in page}, "GET /records/list shows both: %r" % page)
    # A page at a time: every held key once, the cursor crossing from c1 to c3.
    walked, after = [], None
    for _ in range(20):
        args = ["list", "--state", "unknown", "--limit", "1"] + (["--after", after] if after else [])
        code, out, err = keys_cli(ctx.gw, *args)
        if code != 0:
            raise TestFailure("keys list %r: %d %r" % (args, code, err))
        doc = json.loads(out)
        walked += [r["key"] for r in doc["records"]]
        after = doc["next"]
        if after is None:
            break
    expect(set(held) <= set(walked) and len(walked) == len(set(walked)),
           "paged keys list: %r" % walked)


@test
def a_moved_bucket_is_refused_at_its_old_owner_then_runs_at_the_new(ctx):
    p = principal_on(0, "mover")
    b = bucket_of(p)
    before = harness.new_key("before")
    harness.expect_fresh(ctx.gw.request("POST", "/v1/things", {"n": 1}, principal=p, key=before),
                         201, "before the move")
    # The move, by hand: c1 gives the bucket up, c2 takes it, the directory says so.
    harness.psql(ctx.cluster_uris[0], "DELETE FROM idem_buckets WHERE bucket = %d;\n" % b)
    harness.psql(ctx.cluster_uris[1], "INSERT INTO idem_buckets VALUES (%d, 2);\n" % b)
    harness.psql(ctx.dir_uri, "UPDATE idem_shard_buckets SET cluster = 'c2', epoch = 2"
                              " WHERE bucket = %d;\n" % b)
    k = harness.new_key("moved")
    r = ctx.gw.request("POST", "/v1/things", {"n": 2}, principal=p, key=k)
    expect_eq(r.status, 503, "the first write after the move, refused by c1: %s" % r.describe())
    expect_eq(ctx.up.executions(k), 0, "nothing was sent upstream")
    deadline = time.monotonic() + 10
    while r.status == 503 and time.monotonic() < deadline:
        time.sleep(0.15)
        r = ctx.gw.request("POST", "/v1/things", {"n": 2}, principal=p, key=k)
    harness.expect_fresh(r, 201, "a retry once the map is read again")
    expect_eq(ctx.up.executions(k), 1, "upstream executions of the moved principal's key")
    expect_eq((len(ctx.records(0, k)), len(ctx.records(1, k))), (0, 1),
              "the record is at c2, not c1")


if __name__ == "__main__":
    run("test_pg_shards", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
