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
#                           (libpq tries the nodes in turn and keeps the one that takes writes)
#   IDEM_TEST_HA_NODES      "name:pg_port:api_port ..." of the three nodes
#   IDEM_TEST_HA_CONFIGS    the Patroni config files, space-separated (for patronictl -c)
#   IDEM_TEST_HA_DIR        the temporary directory (etcd's and Patroni's logs are there)
#
# and always stops every process (the Patroni agents tests/ha/failover.sh restarted too: it lists
# them in $IDEM_TEST_HA_DIR/agents.pids) and removes the directory afterwards, also when the
# command fails or the script is interrupted.  The command's exit status is the script's.  A cluster that
# cannot be formed within 90 s is a failure (exit 1), never a skip.
set -eu

if [ "$#" -eq 0 ]; then
    echo "usage: with_ha.sh COMMAND [ARGS...]" >&2
    exit 2
fi

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

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

tmp=$(mktemp -d /tmp/idem-ha.XXXXXX)
chmod 755 "$tmp"
pids=""

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
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

etcd_client=$(free_port)
etcd_peer=$(free_port)
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
    pg=$(free_port)
    api=$(free_port)
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

# A leader, its synchronous standby and a replica, all streaming; then the database.
first_cfg=$(echo "$configs" | awk '{print $1}')
deadline=$(($(date +%s) + 90))
while :; do
    state=$(patronictl -c "$first_cfg" list -f json 2>/dev/null || true)
    ready=$(printf '%s' "$state" | python3 -c '
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
    [ "$ready" = yes ] && break
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "with_ha.sh: no leader, sync standby and replica within 90 s:" >&2
        printf '%s\n' "$state" >&2
        tail -n 20 "$tmp"/patroni*.log "$tmp/etcd.log" >&2 || true
        exit 1
    fi
    sleep 1
done

uri="postgresql://postgres@$hosts/postgres?target_session_attrs=read-write&connect_timeout=3"
"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 "$uri" -c "CREATE DATABASE idemtest" >/dev/null
# The replicas have it too before anyone connects (a client tries the nodes in order).
for hp in $(echo "$hosts" | tr ',' ' '); do
    until "$PGBIN/psql" -X -q "postgresql://postgres@$hp/idemtest?connect_timeout=3" \
        -c "SELECT 1" >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "with_ha.sh: database idemtest did not reach $hp" >&2
            exit 1
        fi
        sleep 0.2
    done
done

export IDEM_TEST_HA_URI="postgresql://postgres@$hosts/idemtest?target_session_attrs=read-write&connect_timeout=3"
export IDEM_TEST_HA_NODES="${nodes# }"
export IDEM_TEST_HA_CONFIGS="${configs# }"
export IDEM_TEST_HA_DIR="$tmp"
echo "with_ha.sh: Patroni cluster idem-ha of 3 nodes ($hosts), etcd on 127.0.0.1:$etcd_client" >&2
set +e
"$@"
status=$?
set -e
exit "$status"
