#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""
shards_sim.py - a model of a shard set past what one machine can run: fed with one cluster's
measured fresh-key rate (bench/shards_bench.py's N = 1, under its CPU cap), it extends the curve
to 8 .. 64 clusters and asks what the spread of the principals does to it.

The model: buckets are owned as `idem-gateway shards init` spreads them (cluster i of N owns
buckets [i * 1024 / N, (i + 1) * 1024 / N)), a principal's bucket is docs/shards.md's (SHA-256 of
`principal-<i>`, the names bench/lua/shards.lua sends), and every cluster takes keys at most at
the measured one-cluster rate, whatever the others do (each has its own CPU, disk and WAL; the app
tier is taken to grow with them: more gateway instances).  The callers send a fixed mix of keys,
each principal its share, so the set's rate is reached when its busiest cluster is full:

    rate(N) = rate(1) / max over clusters of (the cluster's share of the keys)

Three mixes: the bench's (10,000 principals, each as many keys), the same with 1,000,000
principals, and a skewed one (10,000 principals, Zipf s = 1.1: the k-th busiest sends in
proportion to 1 / k^1.1, ranks given to principals by a seeded shuffle).  For each N it gives the
rate and its share of N x rate(1), the one hot principal's ceiling (its keys all go to one bucket,
so one cluster: it never gets more than rate(1), however many clusters there are), and what a
failover of one cluster touches: 1/N of the buckets, and of the keys its share of them (the worst
cluster's, and the hot principal's cluster under skew).  Deterministic: the same seed gives the
same table.  Standard library only; bench/shards_bench.py prints its table in the same report.

  python3 bench/shards_sim.py --rate1 1200 [--cpu-us 160 --cap 0.2] [--seed 1]
"""

import argparse
import hashlib
import random
import sys

BUCKETS = 1024  # IDEM_SHARD_BUCKETS
NS = (1, 2, 4, 8, 16, 32, 64)
PRINCIPALS = 10000
MANY_PRINCIPALS = 1000000
ZIPF_S = 1.1


def bucket_of(principal):
    """docs/shards.md: the first 8 bytes of SHA-256, big-endian, modulo 1,024."""
    return int.from_bytes(hashlib.sha256(principal.encode("utf-8")).digest()[:8], "big") % BUCKETS


def owners(n):
    """The owner of each bucket when `shards init` spreads them over n clusters."""
    own = [0] * BUCKETS
    for i in range(n):
        for b in range(i * BUCKETS // n, (i + 1) * BUCKETS // n):
            own[b] = i
    return own


def bucket_weights(principals, weights=None):
    """Each bucket's share of the keys when principal-<i> sends weights[i] of them (or one each)."""
    w = [0.0] * BUCKETS
    total = float(sum(weights)) if weights else float(principals)
    for i in range(principals):
        w[bucket_of("principal-%d" % i)] += (weights[i] if weights else 1.0) / total
    return w


def zipf_weights(principals, s, rng):
    """Zipf(s) over the principals: rank k sends 1 / k^s; the ranks are shuffled by `rng`."""
    ranks = list(range(1, principals + 1))
    rng.shuffle(ranks)
    return [1.0 / (k ** s) for k in ranks], ranks.index(1)


def cluster_shares(bw, n):
    own = owners(n)
    shares = [0.0] * n
    for b, x in enumerate(bw):
        shares[own[b]] += x
    return shares


def simulate(rate1, seed=1, ns=NS, principals=PRINCIPALS, many=MANY_PRINCIPALS, s=ZIPF_S):
    """
    The model's rows, one per N: {"n", "uniform": rate, "uniform_eff", "many", "many_eff",
    "zipf", "zipf_eff", "zipf_busiest_share", "hot_share", "hot_ceiling", "failover_buckets",
    "failover_keys_max", "failover_keys_zipf_max", "failover_keys_hot"}.
    """
    rng = random.Random(seed)
    uni = bucket_weights(principals)
    lots = bucket_weights(many) if many else None
    zw, hot = zipf_weights(principals, s, rng)
    zipf = bucket_weights(principals, zw)
    hot_share = zw[hot] / sum(zw)
    hot_bucket = bucket_of("principal-%d" % hot)
    rows = []
    for n in ns:
        su, sz = cluster_shares(uni, n), cluster_shares(zipf, n)
        sm = cluster_shares(lots, n) if lots else None
        own = owners(n)
        r = {"n": n,
             "uniform": rate1 / max(su), "many": rate1 / max(sm) if sm else None,
             "zipf": rate1 / max(sz), "zipf_busiest_share": max(sz),
             "hot_share": hot_share, "hot_ceiling": rate1,
             "failover_buckets": max(own.count(i) for i in range(n)) / BUCKETS,
             "failover_keys_max": max(su), "failover_keys_zipf_max": max(sz),
             "failover_keys_hot": sz[own[hot_bucket]]}
        for k in ("uniform", "many", "zipf"):
            r[k + "_eff"] = r[k] / (n * rate1) if r[k] is not None else None
        rows.append(r)
    return rows


def markdown(rows, rate1, cpu_us=None, cap=None, seed=1):
    """The model's section of bench/shards_bench.py's report."""
    basis = "one cluster's measured rate, %.0f fresh keys/s" % rate1
    if cpu_us and cap:
        basis += (" (its CPU bound: %.2f CPU ÷ %.0f µs of PostgreSQL CPU per key = %.0f keys/s)"
                  % (cap, cpu_us, cap * 1e6 / cpu_us))
    L = ["A **model**, not a measurement (`bench/shards_sim.py`, seed %d): every cluster takes "
         "keys at most at %s, the app tier grows with the clusters, the callers send a fixed mix "
         "of keys; the set is full when its busiest cluster is. Buckets spread as `shards init` "
         "does, principals' buckets by SHA-256 as docs/shards.md says. *Even*: %s principals "
         "sending alike (the bench's mix); *1M*: 1,000,000 principals alike; *Zipf*: %s "
         "principals, the k-th busiest sending ∝ 1/k^%.1f. The hot principal (Zipf's first) "
         "sends %.1f%% of the keys, all to one bucket, so one cluster: it never gets more than "
         "one cluster's rate. *Failover*: the share of keys that wait while one cluster fails "
         "over (its buckets' share; the worst cluster)." % (
             seed, basis, "{:,}".format(PRINCIPALS), "{:,}".format(PRINCIPALS), ZIPF_S,
             rows[0]["hot_share"] * 100), "",
         "| clusters | even: keys/s | ÷ N×rate(1) | 1M: ÷ N×rate(1) | Zipf: keys/s | "
         "÷ N×rate(1) | Zipf: busiest cluster's share | hot principal: keys/s of its ceiling | "
         "failover: "
         "buckets | keys, even | keys, Zipf (worst / hot's cluster) |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append("| %d | %.0f | %.2f | %s | %.0f | %.2f | %.1f%% | %.0f of %.0f | %.1f%% | "
                 "%.1f%% | %.1f%% / %.1f%% |" % (
                     r["n"], r["uniform"], r["uniform_eff"],
                     "%.2f" % r["many_eff"] if r["many_eff"] is not None else "—",
                     r["zipf"], r["zipf_eff"], r["zipf_busiest_share"] * 100,
                     r["hot_share"] * r["zipf"], r["hot_ceiling"],
                     r["failover_buckets"] * 100, r["failover_keys_max"] * 100,
                     r["failover_keys_zipf_max"] * 100, r["failover_keys_hot"] * 100))
    last = rows[-1]
    L += ["", "Read: with even callers the set grows with its clusters, less the unevenness of "
          "the principals' buckets (%.2f of N×rate(1) at %d clusters with %s principals, %s with "
          "1,000,000). Under Zipf s=%.1f the busiest cluster holds the hot principal, and the "
          "set stops growing at about rate(1) ÷ its share (%.0f keys/s at %d clusters, %.1f× "
          "one cluster): more clusters do not lift it; a principal that hot needs a cluster of "
          "its own that is faster, not more clusters." % (
              last["uniform_eff"], last["n"], "{:,}".format(PRINCIPALS),
              "%.2f" % last["many_eff"] if last["many_eff"] is not None else "—", ZIPF_S,
              last["zipf"], last["n"], last["zipf"] / rate1)]
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--rate1", type=float, required=True,
                    help="one cluster's fresh keys a second (measured)")
    ap.add_argument("--cpu-us", type=float, help="PostgreSQL CPU per key, µs (measured)")
    ap.add_argument("--cap", type=float, help="CPU cap per cluster, in CPUs")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rows = simulate(args.rate1, seed=args.seed)
    print("\n".join(markdown(rows, args.rate1, args.cpu_us, args.cap, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
