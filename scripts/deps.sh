#!/bin/sh
# Installs the Debian packages idem needs to build, run and test, when any is missing.
# Used by `make run` and `make test` (and by `make bench`, with the group `bench`), so a fresh
# Debian 12 machine needs nothing by hand.
set -eu

PKGS="build-essential cmake pkg-config clang libclang-rt-14-dev python3 sqlite3 curl procps
      libuv1-dev libhttp-parser-dev libjansson-dev libsqlite3-dev libssl-dev libcurl4-openssl-dev
      libpq-dev postgresql libyaml-dev groff-base man-db"

# Optional groups on top of the default list: `scripts/deps.sh bench` (used by `make bench`) adds
# the load generator, the chart maker and the profiler of docs/bench.md.
case "${1:-}" in
"") ;;
bench) PKGS="$PKGS wrk gnuplot-nox linux-perf nginx-light" ;;
*)
    echo "usage: scripts/deps.sh [bench]" >&2
    exit 2
    ;;
esac

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "deps: installing:$missing" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
