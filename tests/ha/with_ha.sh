#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# with_ha.sh - runs a command against a throw-away PostgreSQL 15 cluster of three nodes managed by
# Patroni, with etcd as its store, then removes all of it (docs/ha.md).
#
#   sh tests/ha/with_ha.sh COMMAND [ARGS...]
#
# Everything listens on 127.0.0.1 on free ports and lives in one temporary directory: one etcd,
# three Patroni agents (their PostgreSQL servers run as the `postgres` user when this runs as
# root), `synchronous_mode: true` so an acknowledged commit is on two nodes.  Once a leader and two
# streaming replicas are up and the database `idemtest` exists, the command runs with:
#
#   IDEM_TEST_HA_URI        postgresql://postgres@N1,N2,N3/idemtest?target_session_attrs=read-write
#                           (libpq tries the nodes in turn and keeps the one that takes writes;
#                           with --use below, another database of the command's own)
#   IDEM_TEST_HA_NODES      "name:pg_port:api_port ..." of the three nodes
#   IDEM_TEST_HA_CONFIGS    the Patroni config files, space-separated (for patronictl -c)
#   IDEM_TEST_HA_DIR        the temporary directory (etcd's and Patroni's logs are there)
#
# and always stops every process (the Patroni agents tests/ha/failover.sh restarted too: it lists
# them in $IDEM_TEST_HA_DIR/agents.pids) and removes the directory afterwards, also when the
# command fails or the script is interrupted.  The command's exit status is the script's.  A cluster that
# cannot be formed within 90 s is a failure (exit 1), never a skip.
#
# One cluster for several commands (CTest's ha.* share one, a fixture: ha.cluster_start and
# ha.cluster_stop):
#
#   sh tests/ha/with_ha.sh --start STATE           starts the cluster, writes STATE (a shell file)
#                                                  and returns once it is ready; it stays up
#   sh tests/ha/with_ha.sh --use STATE COMMAND...  brings every node back that a command before
#                                                  killed (its Patroni agent started again), waits
#                                                  for a leader, a sync standby and a replica, makes
#                                                  a database of its own for COMMAND and runs it
#                                                  with the environment above
#   sh tests/ha/with_ha.sh --stop STATE            stops every process and removes the directory
#
# A cluster started with --start is also stopped once the process that started it (CTest) is
# gone, so that an interrupted run leaves nothing behind.
set -eu

usage() {
    echo "usage: with_ha.sh COMMAND [ARGS...] | --start STATE | --use STATE COMMAND... |" \
         "--stop STATE" >&2
    exit 2
}
mode=run
began=$(date +%s)
case "${1:-}" in
"") usage ;;
--start | --stop)
    [ "$#" -eq 2 ] || usage
    mode=${1#--}
    state=$2
    ;;
--use)
    [ "$#" -ge 3 ] || usage
    mode=use
    state=$2
    shift 2
    ;;
esac

PGBIN=${IDEM_PG_BIN:-/usr/lib/postgresql/15/bin}
for tool in patroni patronictl etcd; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "with_ha.sh: no $tool (Debian packages patroni and etcd-server; scripts/deps.sh test" \
             "installs them)" >&2
        exit 1
    fi
done

OS_USER=""
if [ "$(id -u)" -eq 0 ]; then
    OS_USER=postgres
fi
as_owner() {
    if [ -n "$OS_USER" ]; then
        runuser -u "$OS_USER" -- "$@"
    else
        "$@"
    fi
}

# Signals those of the pids that are still ours: a process whose command line names $tmp.  A pid
# whose process ended (an agent tests/ha/failover.sh killed) may belong to anyone by now (pids wrap
# at /proc/sys/kernel/pid_max, often 32768): to another test's server running beside this one.
signal_ours() {
    sig=$1
    shift
    for p in "$@"; do
        if tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qF "$tmp"; then
            kill "-$sig" "$p" 2>/dev/null || true
        fi
    done
}

# Stops every process of the cluster in $tmp and removes it; exits with the status it was called
# with (the trap's).
cleanup() {
    rc=$?
    trap - EXIT INT TERM
    # Patroni agents the command restarted (tests/ha/failover.sh records them) go too.
    # shellcheck disable=SC2046,SC2086 # one pid per word
    set -- $pids $(cat "$tmp/agents.pids" 2>/dev/null || true)
    signal_ours TERM "$@"
    sleep 1
    for n in 1 2 3; do
        if [ -f "$tmp/node$n/postmaster.pid" ]; then
            as_owner "$PGBIN/pg_ctl" -D "$tmp/node$n" -m immediate -w stop >/dev/null 2>&1 || true
        fi
    done
    signal_ours KILL "$@"
    rm -rf "$tmp"
    exit "$rc"
}

# wait_ready SECONDS: a leader, its synchronous standby and a replica, all streaming.
wait_ready() {
    deadline=$(($(date +%s) + $1))
    first_cfg=${configs# }
    first_cfg=${first_cfg%% *}
    while :; do
        state_json=$(patronictl -c "$first_cfg" list -f json 2>/dev/null || true)
        ready=$(printf '%s' "$state_json" | python3 -c '
import json, sys
try:
    members = json.load(sys.stdin)
except ValueError:
    members = []
up = ("streaming", "running")
leaders = [m for m in members if m.get("Role") == "Leader" and m.get("State") == "running"]
sync = [m for m in members if m.get("Role") == "Sync Standby" and m.get("State") in up]
replicas = [m for m in members if m.get("Role") == "Replica" and m.get("State") in up]
print("yes" if len(leaders) == 1 and len(sync) == 1 and len(replicas) == 1 else "no")' \
            2>/dev/null || echo no)
        [ "$ready" = yes ] && return 0
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "with_ha.sh: no leader, sync standby and replica within $1 s:" >&2
            printf '%s\n' "$state_json" >&2
            tail -n 20 "$tmp"/patroni*.log "$tmp/etcd.log" >&2 || true
            exit 1
        fi
        sleep 1
    done
}

# make_database NAME: made on the primary, and there on every node before anyone connects (a
# client tries the nodes in order).
make_database() {
    uri="postgresql://postgres@$hosts/postgres?target_session_attrs=read-write&connect_timeout=3"
    "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 "$uri" -c "CREATE DATABASE $1" >/dev/null
    for hp in $(echo "$hosts" | tr ',' ' '); do
        until "$PGBIN/psql" -X -q "postgresql://postgres@$hp/$1?connect_timeout=3" \
            -c "SELECT 1" >/dev/null 2>&1; do
            if [ "$(date +%s)" -ge "$deadline" ]; then
                echo "with_ha.sh: database $1 did not reach $hp" >&2
                exit 1
            fi
            sleep 0.2
        done
    done
}

# run_command DATABASE COMMAND...: the command with the cluster's environment; its exit status.
run_command() {
    export IDEM_TEST_HA_URI="postgresql://postgres@$hosts/$1?target_session_attrs=read-write&connect_timeout=3"
    export IDEM_TEST_HA_NODES="${nodes# }"
    export IDEM_TEST_HA_CONFIGS="${configs# }"
    export IDEM_TEST_HA_DIR="$tmp"
    shift
    echo "with_ha.sh: Patroni cluster idem-ha of 3 nodes ($hosts), etcd on" \
        "127.0.0.1:$etcd_client; ready in $(($(date +%s) - began)) s" >&2
    set +e
    "$@"
    status=$?
    set -e
    exit "$status"
}

case $mode in
use)
    # shellcheck disable=SC1090 # written by --start
    . "$state"
    [ -d "$tmp" ] || { echo "with_ha.sh: the cluster of $state is gone" >&2; exit 1; }
    # A node whose agent a command before killed (tests/ha/test_failover.py leaves its victim down)
    # comes back as tests/ha/failover.sh brings one back: its agent started again (in a session of
    # its own, recorded in agents.pids).  Then the cluster must be whole again.
    for n in 1 2 3; do
        if ! pgrep -f "patroni $tmp/node$n.yml" >/dev/null 2>&1; then
            # shellcheck disable=SC2016 # $1 is the inner shell's
            setsid sh -c 'if [ "$(id -u)" -eq 0 ]; then exec runuser -u postgres -- patroni "$1"
                else exec patroni "$1"; fi' restart "$tmp/node$n.yml" </dev/null \
                >>"$tmp/patroni$n.log" 2>&1 &
            echo "$!" >>"$tmp/agents.pids"
            echo "with_ha.sh: node$n was down: its agent started again (pid $!)" >&2
        fi
    done
    wait_ready "${IDEM_TEST_HA_HEAL_TIMEOUT:-150}"
    # A database of its own: what a command before left in its own is not seen.
    db=idemtest_$$
    make_database "$db"
    run_command "$db" "$@"
    ;;
stop)
    if [ ! -f "$state" ]; then
        exit 0
    fi
    # shellcheck disable=SC1090 # written by --start
    . "$state"
    rm -f "$state"
    [ -d "$tmp" ] || exit 0
    true
    cleanup
    ;;
esac

tmp=$(mktemp -d /tmp/idem-ha.XXXXXX)
chmod 755 "$tmp"
pids=""
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The eight ports at once, from one interpreter: bound together, so all distinct.
ports=$(python3 -c '
import socket
socks = [socket.socket() for _ in range(8)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
nth_port() { echo "$ports" | cut -d ' ' -f "$1"; }
etcd_client=$(nth_port 1)
etcd_peer=$(nth_port 2)
etcd --name idem-ha --data-dir "$tmp/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" \
    --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "idem-ha=http://127.0.0.1:$etcd_peer" >"$tmp/etcd.log" 2>&1 &
pids="$pids $!"

nodes=""
configs=""
hosts=""
for n in 1 2 3; do
    pg=$(nth_port $((2 * n + 1)))
    api=$(nth_port $((2 * n + 2)))
    nodes="$nodes node$n:$pg:$api"
    hosts="${hosts:+$hosts,}127.0.0.1:$pg"
    cfg="$tmp/node$n.yml"
    configs="$configs $cfg"
    # ttl / loop_wait / retry_timeout: Patroni's defaults are 30 / 10 / 10; these bound a failover
    # at about ttl + loop_wait (docs/ha.md).
    cat >"$cfg" <<EOF
scope: idem-ha
name: node$n
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:$api
  connect_address: 127.0.0.1:$api
etcd3:
  hosts: 127.0.0.1:$etcd_client
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 2
    retry_timeout: 5
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        fsync: "on"
        synchronous_commit: "on"
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$pg
  connect_address: 127.0.0.1:$pg
  data_dir: $tmp/node$n
  bin_dir: $PGBIN
  pgpass: $tmp/pgpass$n
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
  parameters:
    unix_socket_directories: '$tmp'
tags:
  nofailover: false
  noloadbalance: false
EOF
    if [ -n "$OS_USER" ]; then chown "$OS_USER" "$cfg"; fi
done
if [ -n "$OS_USER" ]; then chown "$OS_USER" "$tmp"; fi

# Started as simple commands, not through as_owner: a function in the background runs in a subshell
# of its own, whose pid $! would be (killing it leaves the agent running).  runuser passes the
# cleanup's SIGTERM on to the agent.
for n in 1 2 3; do
    if [ -n "$OS_USER" ]; then
        runuser -u "$OS_USER" -- patroni "$tmp/node$n.yml" >"$tmp/patroni$n.log" 2>&1 &
    else
        patroni "$tmp/node$n.yml" >"$tmp/patroni$n.log" 2>&1 &
    fi
    pids="$pids $!"
done

wait_ready 90

if [ "$mode" = start ]; then
    # (no database yet: each --use makes its own)
    {
        echo "# with_ha.sh --start: the cluster in $tmp"
        for v in tmp pids nodes configs hosts etcd_client; do
            eval "echo \"$v='\$$v'\""
        done
    } >"$tmp/state"
    cp "$tmp/state" "$state"
    # Stopped with --stop, or once the process that started it (CTest) is gone: a watcher in the
    # background, its output nowhere (CTest waits for the test's output to end), which stops this
    # very cluster (from its own copy of the state: STATE may name a newer one by then).
    starter=$PPID
    # shellcheck disable=SC2016 # the inner shell's
    setsid sh -c 'while [ -d "$1" ] && kill -0 "$2" 2>/dev/null; do sleep 2; done
        [ -d "$1" ] && exec sh "$3" --stop "$1/state"' watch "$tmp" "$starter" "$0" \
        </dev/null >/dev/null 2>&1 &
    trap - EXIT INT TERM
    echo "with_ha.sh: Patroni cluster idem-ha of 3 nodes ($hosts) in $tmp, etcd on" \
        "127.0.0.1:$etcd_client, ready in $(($(date +%s) - began)) s; its state in $state" >&2
    exit 0
fi

make_database idemtest
run_command idemtest "$@"
