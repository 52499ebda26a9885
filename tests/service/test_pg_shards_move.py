#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
test_pg_shards_move.py - buckets moved while traffic runs (docs/shards.md, "Moving a bucket"):
a directory and two clusters, three databases of the with_pg.sh server, set up with
`idem-gateway shards init`; two gateways on it behind one counting upstream.  While threads send
fresh keys and retries of answered ones, for principals of one bucket (the movers) and of others,
`idem-gateway shards move` takes the movers' bucket from c1 to c2 and back, a gateway is killed
-9 and started again, and one move is killed -9 right after its fence step (`shards show` then
reports the bucket moving) and run again to finish.  Afterwards:

  - every key that got a 2xx replays the same answer, from the bucket's owner now, whose
    database alone holds the bucket's records;
  - no key ran twice at the upstream, and every answered key ran once;
  - the principals of other buckets got 2xx only (the movers may get 503 + Retry-After while
    their bucket is frozen); answers lost to the killed gateway are not counted against them.

And one command moves several buckets (`10-12,500`), passes by those already there when run
again, refuses a BUCKETS it cannot read, and says how many moved before one that failed.

Runs only under tests/pg/with_pg.sh (CTest: service-pg.pg_shards_move).
"""

import random
import subprocess
import threading
import time

import harness
from harness import expect, expect_eq, run, test, TestFailure
from gateway_harness import GATEWAY, Gateway, Upstream


bucket_of = harness.shard_bucket


def shards(*args, timeout=60):
    p = subprocess.run([GATEWAY, "shards"] + list(args), capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


class Ctx:
    def __init__(self):
        self.dbs, self.gws = [], []
        self.up = Upstream()
        self.dir_uri, name = harness.pg_create_database("mvdir")
        self.dbs.append(name)
        self.cluster_uris = []
        for c in ("c1", "c2"):
            uri, name = harness.pg_create_database("mv" + c)
            self.dbs.append(name)
            self.cluster_uris.append(uri)
        code, out, err = shards("init", "--directory", self.dir_uri,
                                "--cluster", "c1=" + self.cluster_uris[0],
                                "--cluster", "c2=" + self.cluster_uris[1])
        if code != 0:
            raise TestFailure("shards init: %d %r %r" % (code, out, err))
        for _ in range(2):
            gw = Gateway(self.up, db_uri="shards:" + self.dir_uri)
            gw.start()
            self.gws.append(gw)

    def close(self):
        for gw in self.gws:
            gw.close()
        self.up.close()
        for name in self.dbs:
            harness.pg_drop_database(name)


@test
def init_is_idempotent_and_show_prints_the_map(ctx):
    code, out, err = shards("init", "--directory", "shards:" + ctx.dir_uri,
                            "--cluster", "c1=" + ctx.cluster_uris[0],
                            "--cluster", "c2=" + ctx.cluster_uris[1])
    expect_eq(code, 0, "init again: %r %r" % (out, err))
    code, out, err = shards("init", "--directory", ctx.dir_uri, "--cluster",
                            "c1=" + ctx.cluster_uris[0])
    expect(code == 1 and "another map" in err, "init of another map: %d %r" % (code, err))
    code, out, err = shards("show", "--directory", ctx.dir_uri)
    expect(code == 0 and "moving: 0" in out, "shards show: %d %r %r" % (code, out, err))
    lines = {l.split()[0]: l.split() for l in out.splitlines() if l.startswith("c")}
    expect_eq((lines["c1"][1], lines["c2"][1]), ("512", "512"), "buckets per cluster: %r" % out)


def principals(pred, prefix, n):
    found, i = [], 0
    while len(found) < n:
        p = "%s-%d" % (prefix, i)
        if pred(bucket_of(p)):
            found.append(p)
        i += 1
    return found


class Load:
    """Threads sending fresh keys and retries through the live gateways, remembering answers."""

    def __init__(self, ctx, movers, others):
        self.ctx, self.movers, self.others = ctx, movers, others
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answered = {}  # key -> (principal, body, first 2xx Response)
        self.sent = set()  # every key sent
        self.errors = []  # what a principal of another bucket got that was not a 2xx
        self.bad_replays = []
        self.moved_503 = 0
        self.down = set()  # indexes of gateways being restarted

    def gateway(self, rnd):
        with self.lock:
            live = [g for i, g in enumerate(self.ctx.gws) if i not in self.down]
        return rnd.choice(live)

    def one(self, rnd, n):
        with self.lock:
            old = list(self.answered.items())
        if old and rnd.random() < 0.3:
            key, (p, body, first) = rnd.choice(old)
            fresh = False
        else:
            p = rnd.choice(self.movers + self.others)
            key, body, first, fresh = harness.new_key("mv"), {"n": n}, None, True
        gw = self.gateway(rnd)
        with self.lock:
            self.sent.add(key)
        try:
            r = gw.request("POST", "/v1/things", body, principal=p, key=key, timeout=10)
        except OSError:
            return  # the gateway was killed under it: nothing to say of this answer
        if r.status == 503 and p in self.movers:
            with self.lock:
                self.moved_503 += 1
            return
        if not 200 <= r.status < 300:
            if p in self.others:
                with self.lock:
                    self.errors.append((p, key, r.describe()))
            return
        with self.lock:
            if fresh:
                self.answered[key] = (p, body, r)
            elif r.body != first.body or not r.replayed:
                self.bad_replays.append((key, r.describe()))

    def run(self, seed):
        rnd, n = random.Random(seed), 0
        while not self.stop.is_set():
            n += 1
            self.one(rnd, n)


def move(ctx, bucket, to):
    code, out, err = shards("move", "--directory", ctx.dir_uri, str(bucket), "--to", to)
    if code != 0:
        raise TestFailure("shards move %d --to %s: %d %r %r" % (bucket, to, code, out, err))
    return out


def move_killed_after(ctx, bucket, to, step):
    """A move killed -9 once it printed `step`; shards show then says the bucket is moving."""
    p = subprocess.Popen([GATEWAY, "shards", "move", "--directory", ctx.dir_uri, str(bucket),
                          "--to", to], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in p.stdout:
        if (": %s " % step).encode() in line:
            p.kill()
            break
    p.wait()
    p.stdout.close()
    p.stderr.close()
    code, out, err = shards("show", "--directory", ctx.dir_uri)
    expect(code == 0 and "moving: 1" in out and "bucket %d: moving" % bucket in out,
           "shards show after a move killed once %s: %r %r" % (step, out, err))


@test
def buckets_moved_back_and_forth_under_load_lose_nothing_and_run_nothing_twice(ctx):
    bucket = bucket_of("mover-0")
    owner = "c1" if bucket < 512 else "c2"
    other = "c2" if owner == "c1" else "c1"
    movers = principals(lambda b: b == bucket, "mover", 3)
    others = principals(lambda b: b != bucket, "other", 8)
    load = Load(ctx, movers, others)
    threads = [threading.Thread(target=load.run, args=(s,), daemon=True) for s in range(4)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        time.sleep(1)
        frozen = [move(ctx, bucket, other)]
        time.sleep(0.5)
        # kill -9 of a gateway mid-run; the load goes to the other one meanwhile.
        with load.lock:
            load.down.add(0)
        ctx.gws[0].kill9()
        frozen.append(move(ctx, bucket, owner))
        ctx.gws[0].start()
        with load.lock:
            load.down.discard(0)
        time.sleep(0.5)
        move_killed_after(ctx, bucket, other, "fenced")
        time.sleep(0.3)
        frozen.append(move(ctx, bucket, other))
        time.sleep(0.5)
        frozen.append(move(ctx, bucket, owner))
        time.sleep(1)
    finally:
        load.stop.set()
        for t in threads:
            t.join(30)
    print("# %d keys answered, %d retries 503 while moving, %.1f s; moves: %s" % (
        len(load.answered), load.moved_503, time.monotonic() - t0,
        "; ".join(f.strip().splitlines()[-1] for f in frozen)))
    expect_eq(load.errors, [], "answers to other buckets' principals that were not 2xx")
    expect_eq(load.bad_replays, [], "retries that did not replay the first answer")
    moved = [k for k, (p, _, _) in load.answered.items() if p in movers]
    expect(len(moved) > 0, "the movers got answers")
    # Every answered key replays, from the owner now; no key ran twice.
    for key, (p, body, first) in load.answered.items():
        r = ctx.gws[1].request("POST", "/v1/things", body, principal=p, key=key)
        harness.expect_replay(r, first, "key %s of %s after the moves" % (key, p))
    for key in load.sent:
        n = ctx.up.executions(key)
        expect(n <= 1, "key %s ran %d times upstream" % (key, n))
        if key in load.answered:
            expect_eq(n, 1, "upstream executions of answered key %s" % key)
    at = [int(harness.psql(u, "SELECT count(*) FROM idem_records"
                              " WHERE idem_bucket_of(principal) = %d;\n" % bucket)[0][0])
          for u in ctx.cluster_uris]
    expect(at[0 if owner == "c1" else 1] >= len(moved) and at[1 if owner == "c1" else 0] == 0,
           "the bucket's records are at its owner %s only: %r" % (owner, at))


def owners(ctx, buckets):
    rows = harness.psql(ctx.dir_uri, "SELECT bucket, cluster FROM idem_shard_buckets"
                                     " WHERE bucket IN (%s) ORDER BY bucket;\n"
                        % ",".join(str(b) for b in buckets))
    return [c for _, c in rows]


@test
def several_buckets_move_in_one_command(ctx):
    buckets = [10, 11, 12, 500]
    code, out, err = shards("move", "--directory", ctx.dir_uri, "10-12,500", "--to", "c2")
    expect_eq(code, 0, "move 10-12,500: %r %r" % (out, err))
    expect_eq(owners(ctx, buckets), ["c2"] * 4, "owners after the move")
    expect("shards: 4 buckets on c2" in out, "the last line: %r" % out)
    for b in buckets:
        expect("bucket %d: on c2, frozen" % b in out, "bucket %d's line: %r" % (b, out))
    # Again: every bucket is there already, nothing moves.
    code, out, err = shards("move", "--directory", ctx.dir_uri, "500,10-12", "--to", "c2")
    expect(code == 0 and "frozen" not in out, "the same move again: %d %r %r" % (code, out, err))
    for bad in ("12-10", "1024", "1,,2", "3-", "x", "1,"):
        code, out, err = shards("move", "--directory", ctx.dir_uri, bad, "--to", "c1")
        expect(code == 2 and "BUCKETS is" in err, "BUCKETS %r: %d %r" % (bad, code, err))
    # A cluster the directory does not name stops the command at the first bucket.
    code, out, err = shards("move", "--directory", ctx.dir_uri, "10-12", "--to", "c9")
    expect(code == 1 and "0 of 3 buckets moved before bucket 10" in err,
           "a move to c9: %d %r" % (code, err))
    code, out, err = shards("move", "--directory", ctx.dir_uri, "10-12,500", "--to", "c1")
    expect_eq((code, owners(ctx, buckets)), (0, ["c1"] * 4), "moved back: %r" % err)


if __name__ == "__main__":
    run("test_pg_shards_move", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
