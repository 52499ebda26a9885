#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# run.sh - what `make run` starts once the build is done: provider-sim (the payment + email
# provider simulator, ./var/provider-sim.db) serving HTTPS, and orderd on SQLite (./var/orderd.db)
# charging through it over TLS as in production, with a demo user.  The certificate comes from a
# throw-away CA made in ./var/tls/ (openssl), which orderd trusts with --provider-ca; nothing
# outside ./var trusts it.  It then places one order and shows the whole flow: the order
# (paid), the charge at the provider, and the confirmation email the outbox relay sent - and how
# to see a retry change nothing.  Ctrl-C stops both.
#   ORDERD_PORT    port of orderd (default 8080)
#   PROVIDER_PORT  port of provider-sim (default 8090)
#   BUILD          build directory relative to the repository (default build, as in the Makefile)
set -eu

root=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
cd "$root"

port=${ORDERD_PORT:-8080}
pport=${PROVIDER_PORT:-8090}
orderd="$root/${BUILD:-build}/bin/orderd"
sim="$root/${BUILD:-build}/bin/provider-sim"
db="sqlite:./var/orderd.db"
url="http://127.0.0.1:$port"
purl="https://127.0.0.1:$pport"
ca=var/tls/ca.crt

for bin in "$orderd" "$sim"; do
    if [ ! -x "$bin" ]; then
        echo "run: $bin not found; build first with: make build" >&2
        exit 1
    fi
done

mkdir -p -m 700 var  # the databases in it hold token hashes and emails
# One secret per run, shared by the two: provider-sim signs its webhooks, orderd verifies them.
secret="whsec_$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
export ORDERD_WEBHOOK_SECRET="$secret"
export PROVIDER_SIM_WEBHOOK_SECRET="$secret"

"$orderd" migrate --db "$db" >/dev/null
token=$("$orderd" token create --db "$db" --user demo)
# The README's requests read it from here: TOKEN=$(cat var/demo.token)
(umask 077 && printf '%s\n' "$token" >var/demo.token)

# The throw-away CA, once, and a certificate it signs for provider-sim on 127.0.0.1 (what orderd
# calls) and localhost.  ECDSA P-256, valid 30 days; remove var/tls to make new ones.
if [ ! -f var/tls/provider-sim.pem ] || [ ! -f var/tls/provider-sim.key ] ||
    ! openssl x509 -checkend 86400 -noout -in var/tls/provider-sim.pem >/dev/null 2>&1; then
    rm -rf var/tls
    mkdir -p -m 700 var/tls
    (
        cd var/tls
        umask 077
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
            -subj "/CN=idem make run CA" -addext basicConstraints=critical,CA:TRUE \
            -addext keyUsage=critical,keyCertSign,cRLSign -keyout ca.key -out ca.crt 2>/dev/null
        openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -subj /CN=127.0.0.1 -keyout provider-sim.key -out provider-sim.csr 2>/dev/null
        printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n%s\n' \
            'subjectAltName=IP:127.0.0.1,DNS:localhost' >provider-sim.ext
        openssl x509 -req -in provider-sim.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
            -sha256 -extfile provider-sim.ext -out provider-sim.pem 2>/dev/null
        rm -f provider-sim.csr provider-sim.ext ca.srl
    ) || { echo "run: openssl could not make var/tls (install openssl)" >&2; exit 1; }
fi

. "$root/scripts/services.sh"

"$sim" --listen "127.0.0.1:$pport" --db sqlite:./var/provider-sim.db \
    --tls-cert var/tls/provider-sim.pem --tls-key var/tls/provider-sim.key \
    --webhook-url "$url/webhooks/provider" >var/provider-sim.log 2>&1 &
started $!
wait_up "$purl/healthz" provider-sim --cacert "$ca"

# Its log goes to a file, so the demo's text below reads in one piece.
"$orderd" serve --listen "127.0.0.1:$port" --db "$db" --provider "$purl" --provider-ca "$ca" \
    >var/orderd.log 2>&1 &
orderd_pid=$!
started "$orderd_pid"
wait_up "$url/healthz" orderd

key="order-$(date +%Y%m%d-%H%M%S)"
cat <<EOF

  orderd (idem's reference service) on $url, store $db, log in var/orderd.log
  provider-sim (payments + emails) on $purl, log in var/provider-sim.log;
  orderd calls it over TLS, trusting the throw-away CA of var/tls (--provider-ca $ca)
  demo user: demo    token: $token   (also in var/demo.token)

  1. An order; the Idempotency-Key makes it safe to retry:

    curl -i -X POST $url/api/orders \\
      -H 'Authorization: Bearer $token' \\
      -H 'Content-Type: application/json' \\
      -H 'Idempotency-Key: $key' \\
      -d '{"productId":"p-1024","quantity":2}'

EOF
curl -s -i -X POST "$url/api/orders" -H "Authorization: Bearer $token" \
    -H 'Content-Type: application/json' -H "Idempotency-Key: $key" \
    -d '{"productId":"p-1024","quantity":2}' | sed 's/^/    /'
# The outbox relay sends the email a moment after the answer: wait for it, at most 10 s.
i=0
while [ "$i" -lt 100 ] && ! curl -s --cacert "$ca" "$purl/v1/emails" | grep -q '"idempotency_key"'; do
    i=$((i + 1))
    sleep 0.1
done
echo
echo
echo "  2. The charge at the provider (its key is derived from the order):"
echo
curl -s --cacert "$ca" "$purl/v1/charges" | python3 -c '
import json, sys
for c in json.load(sys.stdin)["data"][:1]:
    print("    %s  %s %s %s  key %s" % (c["id"], c["status"], c["amount"], c["currency"],
                                        c["idempotency_key"]))'
echo
echo "  3. The confirmation email, sent by the outbox relay (key = the outbox row id):"
echo
curl -s --cacert "$ca" "$purl/v1/emails" | python3 -c '
import json, sys
for e in json.load(sys.stdin)["data"][:1]:
    print("    %s  to %s: \"%s\"  key %s" % (e["id"], e["to"], e["subject"], e["idempotency_key"]))'
cat <<EOF

  Run the curl of step 1 again: same order, same body, "Idempotent-Replayed: true",
  and no second charge or email.  The provider's audit of every effect, per key:

    curl -s --cacert $ca $purl/v1/ledger

  Make the provider lose answers, then order again and watch orderd settle it:

    curl -s --cacert $ca -X POST $purl/v1/faults -d '{"lost_rate":0.5}'

  The same order from the idem CLI, which keeps one key per intent:

    export IDEM_TOKEN=\$(cat var/demo.token)
    build/bin/idem post $url/api/orders -d '{"productId":"p-1024","quantity":2}' --intent first-order -i

  Outbox: $orderd outbox list --db $db
  orderd's log: tail -f var/orderd.log      Ctrl-C stops both.

EOF
wait "$orderd_pid" || true
