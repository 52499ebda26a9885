#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs the build into a temporary prefix and builds tests/client/example_client.c against the
# installed libidem-client with pkg-config only (shared and static), as a user would.  It runs the
# shared build against a closed loopback port: the journal must hold the intent's key afterwards,
# and a second run must reuse it.
set -eu
build=$1
example=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
pc=$(find "$tmp/prefix" -name idem-client.pc -print -quit)
[ -n "$pc" ] || { echo "idem-client.pc was not installed"; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
test -f "$tmp/prefix/include/idem/client.h" || { echo "client.h was not installed"; exit 1; }
test -x "$tmp/prefix/bin/idem" || { echo "the idem CLI was not installed"; exit 1; }
test -f "$tmp/prefix/share/man/man1/idem.1" || { echo "idem.1 was not installed"; exit 1; }
libdir=$(pkg-config --variable=libdir idem-client)
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$example" $(pkg-config --cflags --libs idem-client) \
   -o "$tmp/example" -Wl,-rpath,"$libdir"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$example" $(pkg-config --cflags idem-client) "$libdir/libidem-client.a" \
   $(pkg-config --libs --static idem-client | sed 's/-lidem-client//') -o "$tmp/example-static"
# Nobody listens on this port: retries are exhausted (exit 5), but the key was journaled first.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
set +e
"$tmp/example" "http://127.0.0.1:$port/api/orders" tok buy-1 "$tmp/journal" >"$tmp/out1" 2>&1
rc1=$?
"$tmp/example-static" "http://127.0.0.1:$port/api/orders" tok buy-1 "$tmp/journal" >"$tmp/out2" 2>&1
rc2=$?
set -e
[ "$rc1" = 5 ] && [ "$rc2" = 5 ] || { echo "expected exit 5 twice, got $rc1 and $rc2"; cat "$tmp/out1" "$tmp/out2"; exit 1; }
key1=$(awk '{print $2}' "$tmp/out1")
key2=$(awk '{print $2}' "$tmp/out2")
[ -n "$key1" ] && [ "$key1" = "$key2" ] || { echo "the re-run did not reuse the key: '$key1' vs '$key2'"; exit 1; }
grep -q " buy-1 $key1\$" "$tmp/journal" || { echo "the key is not in the journal"; cat "$tmp/journal"; exit 1; }
echo "install: client.h, shared + static libidem-client, idem-client.pc, idem and idem.1 work from $tmp/prefix (key $key1 reused)"
