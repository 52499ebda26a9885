# SPDX-License-Identifier: Apache-2.0
# services.sh - sourced by the run scripts (run.sh, run_gateway.sh) before they start anything:
#   started PID      remembers a service just started with &; all are stopped, newest first,
#                    when the script ends, Ctrl-C included
#   wait_up URL NAME [CURL-OPTION...]
#                    waits up to 10 s until URL answers 2xx, and otherwise names NAME's log
#                    (var/NAME.log) and exits 1; the options go to curl (--cacert FILE)
pids=""
started() {
    pids="$1 $pids"
}
stop() {
    trap - EXIT INT TERM
    for pid in $pids; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}
trap stop EXIT
trap 'stop; exit 0' INT TERM

wait_up() {
    wait_url=$1
    wait_name=$2
    shift 2
    i=0
    while ! curl -fs -o /dev/null "$@" "$wait_url" 2>/dev/null; do
        i=$((i + 1))
        if [ "$i" -gt 100 ]; then
            echo "run: $wait_name did not come up on $wait_url; see var/$wait_name.log" >&2
            exit 1
        fi
        sleep 0.1
    done
}
