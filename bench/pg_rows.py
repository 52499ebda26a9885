#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""pg_rows.py - what a claim and a completion cost PostgreSQL per row, one statement a row
against the statement for several rows, at each count of rows a batch may hold.

The PostgreSQL store sends a batch's claims and completions either as a statement each or as one
statement for all its rows (lib/store_pg.c; docs/postgres.md, "Which form at which count of
rows"); this measures both on a table of 200,000 records, with pg_stat_statements (execution and
planning time), in one session, the forms interleaved batch by batch so that a loaded machine
weighs on each alike.  Run it through the tests' throw-away cluster:

  IDEM_PG_SERVER_OPTS="-c shared_preload_libraries=pg_stat_statements \
      -c pg_stat_statements.track_planning=on" \
      sh tests/pg/with_pg.sh python3 bench/pg_rows.py [ROWS]

ROWS (640) is the keys per form and count of rows.  It prints, per count of rows and in us a
key: the claim alone and for several; the completion alone, for several (its execution and
planning), its two settings statements, the statement for several planned each time instead
(raw), and what the store sent for a batch's completions before (from two rows the statement
for several, its settings set and undone) and sends now (the same, its settings' undoing left to
the COMMIT that follows it).  The statements are the store's, written out here (keep them in
step).
"""
import os
import re
import subprocess
import sys

NS = [4, 1, 2, 3, 4, 6, 8, 16, 32]  # the first is a warm-up, not reported
ROWS_PER_N = int(sys.argv[1]) if len(sys.argv) > 1 else 640
NOW = "(extract(epoch from clock_timestamp()) * 1000)::bigint"
CLAIM_INSERT = ("INSERT INTO idem_records AS r (principal, operation, idem_key, fingerprint, status,"
 " recovery_point, lease_owner, lease_expires_ms, created_ms, expires_ms)")
RLG = "r.expires_ms <= excluded.created_ms AND (r.status = 1 OR r.lease_expires_ms <= excluded.created_ms)"
CONFLICT = (" ON CONFLICT (principal, operation, idem_key) DO UPDATE SET"
 " fingerprint = excluded.fingerprint, status = 0, recovery_point = excluded.recovery_point,"
 " recovery_data = NULL, lease_owner = excluded.lease_owner,"
 " lease_expires_ms = excluded.lease_expires_ms, response_status = NULL,"
 " response_headers = NULL, response_body = NULL, created_ms = excluded.created_ms,"
 " expires_ms = excluded.expires_ms WHERE " + RLG + " RETURNING r.principal, r.operation, r.idem_key")
INFL = ("f AS (INSERT INTO idem_inflight (principal, operation, idem_key)"
 " SELECT principal, operation, idem_key FROM c ON CONFLICT DO NOTHING)")
CLAIM = ("WITH t AS (SELECT " + NOW + " AS now), c AS (" + CLAIM_INSERT +
 " SELECT $1, $2, $3, $4, 0, $8, $5, t.now + $6, t.now, t.now + $7 FROM t" + CONFLICT + "), " + INFL + " SELECT 1 FROM c")
CLAIM_MANY = ("WITH t AS (SELECT " + NOW + " AS now), c AS (" + CLAIM_INSERT +
 " SELECT v.principal, v.operation, v.idem_key, v.fingerprint, 0, v.point, v.owner, t.now + v.lease::int8, t.now,"
 " t.now + v.ttl::int8 FROM t, unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::text[], $8::text[])"
 " AS v(principal, operation, idem_key, fingerprint, owner, lease, ttl, point)" + CONFLICT + "), " + INFL +
 " SELECT principal, operation, idem_key FROM c")
def ended(dml, tail):
    return ("WITH u AS (" + dml + " RETURNING r.principal, r.operation, r.idem_key),"
            " d AS (DELETE FROM idem_inflight f USING u WHERE f.principal = u.principal AND f.operation = u.operation AND f.idem_key = u.idem_key) " + tail)
COMPLETE = ("UPDATE idem_records r SET status = 1, response_status = $4, response_headers = $5,"
 " response_body = $6, lease_owner = NULL, lease_expires_ms = 0"
 " WHERE r.principal = $1 AND r.operation = $2 AND r.idem_key = $3 AND r.status = 0 AND r.lease_owner = $7")
SETS = (" SET status = 1, response_status = v.code::int4, response_headers = v.headers, response_body = v.body, lease_owner = NULL, lease_expires_ms = 0")
UNN = ("unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[]) AS v(principal, operation, idem_key, code, headers, body, owner)")
COMPLETE_MANY = ("UPDATE idem_records r" + SETS + " FROM " + UNN +
 " WHERE r.principal = v.principal AND r.operation = v.operation AND r.idem_key = v.idem_key AND r.status = 0 AND r.lease_owner = v.owner")
FW = "SELECT 1 / count(*)::int4 FROM u"
FWA = "SELECT 1 / (count(*) = cardinality($1::text[]))::int4 FROM u"
variants_sql = {
 'claim1': ("(text,text,text,bytea,text,int8,int8,text)", CLAIM),
 'claimN': ("(text[],text[],text[],bytea[],text[],text[],text[],text[])", CLAIM_MANY),
 'comp1': ("(text,text,text,int4,text,bytea,text)", ended(COMPLETE, FW)),
 'compN': ("(text[],text[],text[],text[],text[],bytea[],text[])", ended(COMPLETE_MANY, FWA)),
 # the same, run without the plan settings (one more, idle condition: pg_stat_statements
 # tells statements apart by their parse trees)
 'compNraw': ("(text[],text[],text[],text[],text[],bytea[],text[])", ended(COMPLETE_MANY, FWA).replace("r.status = 0 AND r.lease_owner = v.owner", "r.status = 0 AND r.lease_owner = v.owner AND r.lease_expires_ms >= 0") ),
}
PROBES = ("SELECT set_config('idem.pcm', current_setting('plan_cache_mode'), true),"
 " set_config('idem.hj', current_setting('enable_hashjoin'), true),"
 " set_config('idem.mj', current_setting('enable_mergejoin'), true),"
 " set_config('idem.ss', current_setting('enable_seqscan'), true),"
 " set_config('plan_cache_mode', 'force_generic_plan', true),"
 " set_config('enable_hashjoin', 'off', true),"
 " set_config('enable_mergejoin', 'off', true),"
 " set_config('enable_seqscan', 'off', true)")
RESTORE = ("SELECT set_config('plan_cache_mode', current_setting('idem.pcm'), true),"
 " set_config('enable_hashjoin', current_setting('idem.hj'), true),"
 " set_config('enable_mergejoin', current_setting('idem.mj'), true),"
 " set_config('enable_seqscan', current_setting('idem.ss'), true)")
out = []
w = out.append
w("\\set ON_ERROR_STOP 1")
w("\\pset pager off")
w("\\o /dev/null")
w("""CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
CREATE TABLE idem_records ( principal text NOT NULL, operation text NOT NULL, idem_key text NOT NULL,
 fingerprint bytea NOT NULL, status smallint NOT NULL, recovery_point text NOT NULL DEFAULT '', recovery_data text,
 lease_owner text, lease_expires_ms bigint NOT NULL DEFAULT 0, response_status integer, response_headers text, response_body bytea,
 created_ms bigint NOT NULL, expires_ms bigint NOT NULL, PRIMARY KEY (principal, operation, idem_key)) WITH (fillfactor = 70);
CREATE INDEX idem_records_expires ON idem_records (expires_ms);
CREATE TABLE idem_inflight (principal text NOT NULL, operation text NOT NULL, idem_key text NOT NULL, PRIMARY KEY (principal, operation, idem_key));
INSERT INTO idem_records SELECT 'tenant-' || (g % 50), 'gw.POST /v1/charges', 'old-' || g || '-' || md5(g::text), decode(md5(g::text) || md5(g::text), 'hex'), 1, 'forwarded', NULL,
 NULL, 0, 200, '[["content-type","application/json"]]', convert_to(repeat('x', 300), 'UTF8'), 1700000000000, 9999999999999 FROM generate_series(1, 200000) g;
VACUUM ANALYZE idem_records; VACUUM ANALYZE idem_inflight;""")
w("PREPARE probes AS " + PROBES + ";")
w("PREPARE restore AS " + RESTORE + ";")
for k, (types, sql) in variants_sql.items():
    w("PREPARE %s%s AS %s;" % (k, types, sql))
FP = "\\x" + "ab" * 32
BODY = "x" * 300
HDR = '[["content-type","application/json"]]'
def arr(vals):
    return "'{" + ",".join('"%s"' % v for v in vals) + "}'"
def barr(n, v):
    return "ARRAY[" + ",".join(["'%s'::bytea" % v] * n) + "]"
seq = [0]
def keys(n, tag):
    r = []
    for _ in range(n):
        seq[0] += 1
        r.append("k-%s-%d-%08x" % (tag, seq[0], (seq[0] * 2654435761) & 0xffffffff))
    return r
P = "tenant-7"; OP = "gw.POST /v1/charges"; OWN = "gw1:123:456/77"
def claim1(ks):
    for key in ks:
        w("EXECUTE claim1('%s','%s','%s','%s','%s',60000,86400000,'forwarded');" % (P, OP, key, FP, OWN))
def claimN(ks):
    n = len(ks)
    w("EXECUTE claimN(%s,%s,%s,%s,%s,%s,%s,%s);" % (arr([P]*n), arr([OP]*n), arr(ks), barr(n, FP), arr([OWN]*n), arr(['60000']*n), arr(['86400000']*n), arr(['forwarded']*n)))
def comp1(ks):
    for key in ks:
        w("EXECUTE comp1('%s','%s','%s',201,'%s','%s','%s');" % (P, OP, key, HDR, BODY, OWN))
def compN(ks, name='compN', settings=True):
    n = len(ks)
    if settings: w("EXECUTE probes;")
    w("EXECUTE %s(%s,%s,%s,%s,%s,%s,%s);" % (name, arr([P]*n), arr([OP]*n), arr(ks), arr(['201']*n), "ARRAY[" + ",".join(["'%s'" % HDR]*n) + "]", barr(n, BODY), arr([OWN]*n)))
    if settings: w("EXECUTE restore;")
for N in NS:
    reps = max(1, ROWS_PER_N // N)
    # Keys a, c claimed a row at a time, b as one statement; then a completed a row at a time,
    # b as one statement with its settings, c as one statement planned as PostgreSQL likes.
    w("SELECT pg_stat_statements_reset();")
    sets = []
    for r in range(reps):
        a, b, c = keys(N, 'a%d' % N), keys(N, 'b%d' % N), keys(N, 'c%d' % N)
        w("BEGIN;"); claim1(a); w("COMMIT;")
        w("BEGIN;"); claimN(b); w("COMMIT;")
        w("BEGIN;"); claim1(c); w("COMMIT;")
        sets.append((a, b, c))
    for a, b, c in sets:
        w("BEGIN;"); comp1(a); w("COMMIT;")
        w("BEGIN;"); compN(b); w("COMMIT;")
        w("BEGIN;"); compN(c, 'compNraw', False); w("COMMIT;")
    w("\\echo N=%d" % N)
    w("\\o")
    w("SELECT %d AS n, substring(query from '^PREPARE (\\w+)') AS what, calls, rows, plans,"
      " round((total_exec_time*1000/%d)::numeric,1) AS exec_us_key, round((total_plan_time*1000/%d)::numeric,1) AS plan_us_key,"
      " round(((total_exec_time+total_plan_time)*1000/%d)::numeric,1) AS us_per_key"
      " FROM pg_stat_statements WHERE query LIKE 'PREPARE%%' ORDER BY 2;" % (N, reps * N, reps * N, reps * N))
    w("\\o /dev/null")



def report(text):
    per = {}
    n, seen = None, 0
    for line in text.splitlines():
        m = re.match(r"N=(\d+)", line)
        if m:
            n, seen = int(m.group(1)), seen + 1
            continue
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 8 and n is not None and seen > 1 and parts[0].isdigit():
            cost = float(parts[7])
            if parts[1] == "claim1":
                cost /= 2  # two sets of keys are claimed a row at a time
            per[(n, parts[1])] = cost
    print("rows | claim: alone several | complete: alone several settings undo raw | before now")
    for N in sorted({k[0] for k in per}):
        g = lambda w: per.get((N, w), float("nan"))
        c1, cn, p1, pn, pr, rs, raw = (g(w) for w in
                                       ["claim1", "claimN", "comp1", "compN", "probes", "restore", "compNraw"])
        before = p1 if N == 1 else pn + pr + rs
        now = p1 if N == 1 else pn + pr
        print("%4d | %12.0f %7.0f | %15.0f %7.0f %8.1f %4.1f %4.0f | %6.0f %3.0f"
              % (N, c1, cn, p1, pn, pr, rs, raw, before, now))


def main():
    uri = os.environ.get("IDEM_TEST_PG_URI")
    if not uri:
        sys.exit("run through tests/pg/with_pg.sh (IDEM_TEST_PG_URI is not set)")
    psql = os.path.join(os.environ.get("IDEM_TEST_PG_BIN", ""), "psql")
    res = subprocess.run([psql, "-q", "-X", uri], input="\n".join(out), text=True,
                         capture_output=True, check=True)
    report(res.stdout)


if __name__ == "__main__":
    main()
