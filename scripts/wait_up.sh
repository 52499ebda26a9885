# wait_up.sh - sourced by the run scripts (run.sh, run_gateway.sh): wait_up URL NAME waits up to
# 10 s until URL answers 2xx, and otherwise names NAME's log (var/NAME.log) and exits 1.
wait_up() {
    i=0
    while ! curl -fs -o /dev/null "$1" 2>/dev/null; do
        i=$((i + 1))
        if [ "$i" -gt 100 ]; then
            echo "run: $2 did not come up on $1; see var/$2.log" >&2
            exit 1
        fi
        sleep 0.1
    done
}
