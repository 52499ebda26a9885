#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# chaos_shards.sh - `make chaos-shards`: idem-check chaos over a shard set of three clusters, one
# of them failing over and a bucket moving while it runs (docs/chaos.md, "Over a shard set").
#
#   sh tests/ha/chaos_shards.sh BUILD_DIR
#
# The three clusters are three PostgreSQL servers, each made by the scripts the other tests use,
# one inside the other: c3 is the Patroni cluster of tests/ha/with_ha.sh, c1 and c2 two plain
# servers of tests/pg/with_pg.sh.  This script runs itself under them in turn, keeping each
# server's URI before the next one hides it, and at the innermost level runs
# tests/ha/chaos_shards.py, which makes the directory and the catalogue on c1's server, sets the
# set up and runs the two phases.  Every server is removed at the end, also on failure; the exit
# status is chaos_shards.py's.
set -eu

if [ "$#" -ne 1 ]; then
    echo "usage: chaos_shards.sh BUILD_DIR" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
pg="$here/../pg/with_pg.sh"

case "${IDEM_CHAOS_SHARDS_STAGE:-}" in
"")
    IDEM_CHAOS_SHARDS_STAGE=c3 exec sh "$here/with_ha.sh" sh "$here/chaos_shards.sh" "$1"
    ;;
c3)
    IDEM_CHAOS_SHARDS_STAGE=c1 exec sh "$pg" sh "$here/chaos_shards.sh" "$1"
    ;;
c1)
    # c1's server: with_pg.sh's variables name the next one (c2) from here on.
    IDEM_CHAOS_SHARDS_STAGE=c2 IDEM_CHAOS_SHARDS_C1_URI=$IDEM_TEST_PG_URI \
        IDEM_CHAOS_SHARDS_C1_PORT=$IDEM_TEST_PG_PORT exec sh "$pg" sh "$here/chaos_shards.sh" "$1"
    ;;
c2)
    exec python3 "$here/chaos_shards.py" "$1"
    ;;
*)
    echo "chaos_shards.sh: unknown IDEM_CHAOS_SHARDS_STAGE '$IDEM_CHAOS_SHARDS_STAGE'" >&2
    exit 2
    ;;
esac
