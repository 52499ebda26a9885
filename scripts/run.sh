#!/bin/sh
# run.sh - what `make run` starts once the build is done: orderd on SQLite (./var/orderd.db) with
# a demo user, and a few lines that show a first order and its safe retry.  orderd replaces this
# shell (exec), so Ctrl-C reaches it directly and it stops cleanly.
#   ORDERD_PORT  port to listen on (default 8080)
#   BUILD        build directory relative to the repository (default build, as in the Makefile)
set -eu

root=$(CDPATH='' cd -- "$(dirname -- "$0")/.." && pwd)
cd "$root"

port=${ORDERD_PORT:-8080}
orderd="$root/${BUILD:-build}/bin/orderd"
db="sqlite:./var/orderd.db"
url="http://127.0.0.1:$port"

if [ ! -x "$orderd" ]; then
    echo "run: $orderd not found; build first with: make build" >&2
    exit 1
fi

mkdir -p var
"$orderd" migrate --db "$db" >/dev/null
token=$("$orderd" token create --db "$db" --user demo)
key="order-$(date +%Y%m%d-%H%M%S)"

cat <<EOF

  orderd (idem's reference service) on $url, store $db
  demo user: demo    token: $token

  Create an order; the Idempotency-Key makes the request safe to retry:

    curl -i -X POST $url/api/orders \\
      -H 'Authorization: Bearer $token' \\
      -H 'Content-Type: application/json' \\
      -H 'Idempotency-Key: $key' \\
      -d '{"productId":"p-1024","quantity":2}'

  Run the very same command again: same order, same body, no second order,
  and the answer says "Idempotent-Replayed: true".

  List your orders:

    curl -s $url/api/orders -H 'Authorization: Bearer $token'

  Ctrl-C stops the server.

EOF

exec "$orderd" serve --listen "127.0.0.1:$port" --db "$db"
