#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# failover.sh - fails the Patroni cluster of tests/ha/with_ha.sh over, once, and returns when it is
# healthy again (docs/ha.md).  `idem-check chaos --failover-cmd 'sh tests/ha/failover.sh'`
# runs it with `switchover` and `kill` in turn.
#
#   sh tests/ha/failover.sh switchover|kill
#
#   switchover  patronictl switchover from the leader to its sync standby (--force), then waits for
#               that standby to lead with a sync standby of its own.
#   kill        the leader's node dies: kill -9 of its Patroni agent and its postmaster (killing
#               only the postmaster, the agent would restart it and stay the leader).  Once another
#               node leads, the dead node's agent is started again, so that the cluster has three
#               nodes and the next failover a sync standby to go to; then waits until a leader, a
#               sync standby and a replica are up.
#
# Needs the environment with_ha.sh gives its command: IDEM_TEST_HA_CONFIGS, IDEM_TEST_HA_DIR,
# IDEM_TEST_HA_NODES.  An agent it starts is recorded in $IDEM_TEST_HA_DIR/agents.pids, which
# with_ha.sh stops at its end.  Every wait is bounded (all of them together by
# IDEM_TEST_HA_FAILOVER_TIMEOUT, 150 s by default): exit 0 healthy again, 1 not, 2 bad usage.
# One line per step on stderr.
set -eu

say() { echo "failover.sh: $*" >&2; }

case "${1:-}" in
switchover | kill) kind=$1 ;;
*)
    echo "usage: failover.sh switchover|kill (under tests/ha/with_ha.sh)" >&2
    exit 2
    ;;
esac
if [ -z "${IDEM_TEST_HA_CONFIGS:-}" ] || [ -z "${IDEM_TEST_HA_DIR:-}" ] ||
    [ -z "${IDEM_TEST_HA_NODES:-}" ]; then
    echo "failover.sh: IDEM_TEST_HA_CONFIGS, IDEM_TEST_HA_DIR and IDEM_TEST_HA_NODES are not set" \
        "(run it under tests/ha/with_ha.sh)" >&2
    exit 2
fi

tmp=$IDEM_TEST_HA_DIR
cfg=${IDEM_TEST_HA_CONFIGS%% *}
start=$(date +%s)
deadline=$((start + ${IDEM_TEST_HA_FAILOVER_TIMEOUT:-150}))

# The members as "name role state" lines (role and state without spaces: Sync_Standby).
members() {
    patronictl -c "$cfg" list -f json 2>/dev/null | python3 -c '
import json, sys
try:
    members = json.load(sys.stdin)
except ValueError:
    members = []
for m in members:
    print(m.get("Member", "?"), m.get("Role", "?").replace(" ", "_"),
          m.get("State", "?").replace(" ", "_"))' 2>/dev/null || true
}

# The running leader's name, and the sync standby's, "" when there is none.
leader() { members | awk '$2 == "Leader" && $3 == "running" { print $1; exit }'; }
sync_standby() {
    members | awk '$2 == "Sync_Standby" && ($3 == "streaming" || $3 == "running") { print $1; exit }'
}
replica() {
    members | awk '$2 == "Replica" && ($3 == "streaming" || $3 == "running") { print $1; exit }'
}

# "yes" when a leader and a sync standby are up, and with `full` a streaming replica too.
healthy() {
    members | awk -v full="${1:-}" '
        $2 == "Leader" && $3 == "running" { l++ }
        $2 == "Sync_Standby" && ($3 == "streaming" || $3 == "running") { s++ }
        $2 == "Replica" && ($3 == "streaming" || $3 == "running") { r++ }
        END { print (l == 1 && s == 1 && (full == "" || r == 1)) ? "yes" : "no" }'
}

# wait_until WHAT COMMAND...: runs COMMAND every half second until it succeeds, or gives up at
# the deadline, showing the cluster.
wait_until() {
    what=$1
    shift
    while ! "$@"; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            say "no $what by the deadline ($(($(date +%s) - start)) s); the cluster:"
            patronictl -c "$cfg" list >&2 2>&1 || true
            exit 1
        fi
        sleep 0.5
    done
}

is_healthy() { [ "$(healthy "${1:-}")" = yes ]; }
leads() { [ "$(leader)" = "$1" ] && is_healthy ""; }
other_leads() { l=$(leader) && [ -n "$l" ] && [ "$l" != "$1" ]; }
# "N s after the switchover" (or the kill): since $since.
after() { echo "$(($(date +%s) - since)) s after the $kind"; }

# A failover goes from a healthy cluster: the previous one may still be settling.
wait_until "healthy cluster to start from" is_healthy
old=$(leader)

if [ "$kind" = switchover ]; then
    to=$(sync_standby)
    say "switchover: $old -> $to"
    since=$(date +%s)
    if ! out=$(patronictl -c "$cfg" switchover --leader "$old" --candidate "$to" --force 2>&1); then
        say "patronictl switchover failed:"
        printf '%s\n' "$out" >&2
        exit 1
    fi
    wait_until "leader $to with a sync standby" leads "$to"
    say "$to leads, $(sync_standby) is its sync standby ($(after))"
    exit 0
fi

# kill: the leader's postmaster (its pid is the first line of postmaster.pid) and its agent
# (with root, also the runuser that started it: every process naming its config file).
pm=$(head -n 1 "$tmp/$old/postmaster.pid")
children=$(pgrep -P "$pm" || true)
agents=$(pgrep -f "patroni $tmp/$old.yml" || true)
[ -n "$agents" ] || { say "no Patroni agent of $old"; exit 1; }
say "kill -9: $old (agent $(printf '%s' "$agents" | tr '\n' ','), postmaster $pm)"
since=$(date +%s)
# shellcheck disable=SC2086 # one pid per word
kill -9 $agents "$pm"
wait_until "new leader after $old" other_leads "$old"
say "$(leader) leads ($(after))"

# The dead postmaster's children leave once they notice it is gone; a server started while they
# still hold its shared memory would refuse to start.
gone() {
    for p in $children; do
        kill -0 "$p" 2>/dev/null && return 1
    done
    return 0
}
wait_until "exit of the old postmaster's processes" gone

# The node comes back as a replica of the new leader (Patroni rewinds it if it must).  setsid: not
# in the group of the command that ran this script, which a timeout kills.
n=${old#node}
# shellcheck disable=SC2016 # $1 is the inner shell's
setsid sh -c 'if [ "$(id -u)" -eq 0 ]; then exec runuser -u postgres -- patroni "$1"; else
    exec patroni "$1"; fi' restart "$tmp/$old.yml" </dev/null >>"$tmp/patroni$n.log" 2>&1 &
echo "$!" >>"$tmp/agents.pids"
say "restarted the agent of $old (pid $!)"
wait_until "leader, sync standby and replica" is_healthy full
say "healthy: $(leader) leads, $(sync_standby) is its sync standby, $(replica) a replica ($(after))"
