#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# with_pg.sh - runs a command against a throw-away PostgreSQL cluster, then removes the cluster.
#
#   sh tests/pg/with_pg.sh COMMAND [ARGS...]
#
# The store contract suite demands the same behaviour of PostgreSQL as of SQLite, so it must run
# against a real server, not a mock.  This script makes one in a temporary directory: initdb (as
# the `postgres` user when run as root, since the server refuses to run as root), a free loopback
# port, fsync on, a database `idemtest`.  It runs the command with these exported:
#
#   IDEM_TEST_PG_URI      postgresql://postgres@127.0.0.1:PORT/idemtest
#   IDEM_TEST_PG_BIN      the server's bin directory (pg_ctl, postgres, psql)
#   IDEM_TEST_PG_DATA     the data directory, so a test can stop and restart the server
#   IDEM_TEST_PG_PORT     the port
#   IDEM_TEST_PG_OS_USER  the OS user the server must run as ("postgres" under root, else empty)
#
# and always stops the server and removes the directory afterwards, also when the command fails
# or the script is interrupted.  The command's exit status is the script's.
#
# IDEM_PG_SERVER_OPTS adds server options to the start (make bench's targets load
# pg_stat_statements so: "-c shared_preload_libraries=pg_stat_statements"); unset, the cluster is
# the tests' plain one.  A server that cannot
# be started is a failure (exit 1), never a skip: the PostgreSQL store is only as good as its test.
set -eu

if [ "$#" -eq 0 ]; then
    echo "usage: with_pg.sh COMMAND [ARGS...]" >&2
    exit 2
fi

PGBIN=${IDEM_PG_BIN:-/usr/lib/postgresql/15/bin}
if [ ! -x "$PGBIN/initdb" ] || [ ! -x "$PGBIN/pg_ctl" ]; then
    echo "with_pg.sh: no PostgreSQL server in $PGBIN (Debian package \`postgresql\`;" \
         "scripts/deps.sh test installs it, or set IDEM_PG_BIN)" >&2
    exit 1
fi

OS_USER=""
if [ "$(id -u)" -eq 0 ]; then
    OS_USER=postgres
    if ! id "$OS_USER" >/dev/null 2>&1; then
        echo "with_pg.sh: running as root but there is no \`postgres\` user to run the server" >&2
        exit 1
    fi
fi

# Runs a server program as the cluster's owner.
as_owner() {
    if [ -n "$OS_USER" ]; then
        runuser -u "$OS_USER" -- "$@"
    else
        "$@"
    fi
}

tmp=$(mktemp -d /tmp/idem-pg.XXXXXX)
data="$tmp/data"
started=0

cleanup() {
    rc=$?
    trap - EXIT INT TERM
    if [ "$started" -eq 1 ]; then
        as_owner "$PGBIN/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The server (another user) must reach the directory: it holds the data and the socket.
chmod 0755 "$tmp"
if [ -n "$OS_USER" ]; then
    chown "$OS_USER" "$tmp"
fi

if ! as_owner "$PGBIN/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 --no-locale --no-sync \
        >"$tmp/initdb.log" 2>&1; then
    echo "with_pg.sh: initdb failed:" >&2
    cat "$tmp/initdb.log" >&2
    exit 1
fi

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# A free port can be taken by someone else before the server binds it (ctest -j): try a few.
port=""
for attempt in 1 2 3 4 5; do
    candidate=$(free_port)
    if as_owner "$PGBIN/pg_ctl" -D "$data" -l "$tmp/server.log" -w -t 60 \
            -o "-k $tmp -c listen_addresses=127.0.0.1 -p $candidate -c fsync=on ${IDEM_PG_SERVER_OPTS:-}" \
            start >/dev/null 2>&1; then
        port=$candidate
        started=1
        break
    fi
    echo "with_pg.sh: the server did not start on port $candidate (attempt $attempt)" >&2
done
if [ -z "$port" ]; then
    echo "with_pg.sh: could not start PostgreSQL; its log:" >&2
    tail -n 30 "$tmp/server.log" >&2 || true
    exit 1
fi

if ! as_owner "$PGBIN/createdb" -h 127.0.0.1 -p "$port" -U postgres idemtest >"$tmp/createdb.log" 2>&1; then
    echo "with_pg.sh: createdb failed:" >&2
    cat "$tmp/createdb.log" >&2
    exit 1
fi

export IDEM_TEST_PG_URI="postgresql://postgres@127.0.0.1:$port/idemtest"
export IDEM_TEST_PG_BIN="$PGBIN"
export IDEM_TEST_PG_DATA="$data"
export IDEM_TEST_PG_PORT="$port"
export IDEM_TEST_PG_OS_USER="$OS_USER"
echo "with_pg.sh: PostgreSQL $("$PGBIN/postgres" --version | sed 's/^postgres (PostgreSQL) //') on 127.0.0.1:$port" >&2

set +e
"$@"
rc=$?
set -e
exit "$rc"
