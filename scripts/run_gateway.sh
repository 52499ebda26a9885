#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# run_gateway.sh - what `make run-gateway` starts once the build is done: a small payments API
# that is NOT idempotent (examples/payments_upstream.py, every POST makes a new payment) and
# idem-gateway in front of it on SQLite (./var/gateway.db).  It sends one payment twice with the
# same Idempotency-Key and shows that the API made one payment, then how to try more.
# Ctrl-C stops both.
#   GATEWAY_PORT   port of the gateway (default 8180, clear of make run's orderd on 8080 and
#                  provider-sim on 8090); its admin listener is the next one
#   UPSTREAM_PORT  port of the payments API (default 9000)
#   BUILD          build directory relative to the repository (default build)
set -eu

root=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
cd "$root"

port=${GATEWAY_PORT:-8180}
aport=$((port + 1))
uport=${UPSTREAM_PORT:-9000}
gateway="$root/${BUILD:-build}/bin/idem-gateway"
url="http://127.0.0.1:$port"
uurl="http://127.0.0.1:$uport"

if [ ! -x "$gateway" ]; then
    echo "run-gateway: $gateway not found; build first with: make build" >&2
    exit 1
fi
mkdir -p -m 700 var
cat >var/gateway.yaml <<YAML
# written by scripts/run_gateway.sh; docs/gateway.md explains every key
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$aport
store: sqlite:$root/var/gateway.db
upstream:
  url: $uurl
  timeout: 10s
principal:
  header: X-Consumer-Id
unrouted_keys: refuse
routes:
  - match: POST /v1/payments
    operation: payments.create
    on_unknown:
      reconcile: "GET /v1/payments?requestKey={key}"
YAML

. "$root/scripts/services.sh"

python3 examples/payments_upstream.py --port "$uport" >var/upstream.log 2>&1 &
started $!
wait_up "$uurl/v1/payments" upstream
"$gateway" serve --config var/gateway.yaml 2>var/gateway.log &
gw_pid=$!
started "$gw_pid"
wait_up "http://127.0.0.1:$aport/healthz" gateway

key="pay-$(date +%Y%m%d-%H%M%S)"
pay() {
    curl -s -i -X POST "$url/v1/payments" -H 'X-Consumer-Id: acct_demo' \
        -H "Idempotency-Key: $key" -H 'Content-Type: application/json' \
        -d '{"amount":500,"currency":"EUR"}' | tr -d '\r' | grep -v '^Date:' | sed 's/^/    /'
}
cat <<EOF

  payments API (not idempotent) on $uurl, log in var/upstream.log
  idem-gateway in front of it on $url (admin http://127.0.0.1:$aport),
  config var/gateway.yaml,
  store var/gateway.db, log in var/gateway.log

  1. A payment through the gateway, with an Idempotency-Key:

    curl -i -X POST $url/v1/payments -H 'X-Consumer-Id: acct_demo' \\
      -H 'Idempotency-Key: $key' -H 'Content-Type: application/json' \\
      -d '{"amount":500,"currency":"EUR"}'

EOF
pay
echo
echo "  2. The same request again (a retry): the stored answer, Idempotent-Replayed: true"
echo
pay
echo
echo "  3. What the payments API made: one payment for the two requests"
echo
curl -s "$uurl/v1/payments" | python3 -c '
import json, sys
for p in json.load(sys.stdin)["data"]:
    print("    %s  %s %s  key %s" % (p["id"], p["amount"], p["currency"], p["requestKey"]))'
cat <<EOF

  The same key with another body is refused (422); another X-Consumer-Id with the same key
  is another caller (its own payment).  Requests on other paths pass through untouched.
  The record:  $gateway keys show --config var/gateway.yaml \\
                 --principal acct_demo --operation payments.create --key $key
  Metrics:     curl -s http://127.0.0.1:$aport/metrics
  Ctrl-C stops both.
EOF
wait "$gw_pid"
