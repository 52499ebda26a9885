#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs libidem into a temporary prefix, builds examples/embed.c against it with pkg-config
# only (as a user would), runs it twice, and checks that the second run replays.
set -eu
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
pc=$(find "$tmp/prefix" -name idem.pc -print -quit)
[ -n "$pc" ] || { echo "idem.pc was not installed"; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
test -f "$tmp/prefix/include/idem/idem.h" || { echo "idem.h was not installed"; exit 1; }
# shellcheck disable=SC2046
libdir=$(pkg-config --variable=libdir idem)
# The static archive, with the private dependencies pkg-config names for it.
cc -std=c11 -Wall -Werror "$src/examples/embed.c" $(pkg-config --cflags idem) "$libdir/libidem.a" \
   $(pkg-config --libs --static idem | sed 's/-lidem//') -o "$tmp/embed-static"
cc -std=c11 -Wall -Werror "$src/examples/embed.c" $(pkg-config --cflags --libs idem) \
   -o "$tmp/embed" -Wl,-rpath,"$(pkg-config --variable=libdir idem)"
out=$("$tmp/embed" "sqlite:$tmp/demo.db")
echo "$out"
echo "$out" | grep -q '^executed: 201 {"payment":"created"}$' || { echo "first run did not execute"; exit 1; }
echo "$out" | grep -q '^replayed: 201 {"payment":"created"}$' || { echo "retry did not replay"; exit 1; }
out=$("$tmp/embed-static" "sqlite:$tmp/demo.db")
echo "$out" | grep -c '^replayed: ' | grep -q '^2$' || { echo "a later process did not replay both: $out"; exit 1; }
# The programs come along: idem-gateway runs from the prefix, with its manual page.
for page in man1/idem.1 man1/idem-check.1 man1/provider-sim.1 man8/orderd.8 man8/idem-gateway.8; do
    test -f "$tmp/prefix/share/man/$page" || { echo "$page was not installed"; exit 1; }
done
# `man orderd` finds the installed page through MANPATH, as it would under /usr/local.
if command -v man >/dev/null 2>&1; then
    MANPATH="$tmp/prefix/share/man" MANWIDTH=80 man orderd 2>/dev/null | grep -q '^ORDERD(8)' ||
        { echo "man orderd does not find the installed page"; exit 1; }
fi
"$tmp/prefix/bin/idem-gateway" --version | grep -q '^idem-gateway ' || { echo "idem-gateway --version failed"; exit 1; }
"$tmp/prefix/bin/idem-gateway" check-config --config "$src/examples/gateway.yaml" >/dev/null ||
    { echo "the installed idem-gateway refuses examples/gateway.yaml"; exit 1; }
echo "install: headers, shared + static library, idem.pc, idem-gateway and the manual pages work from $tmp/prefix"
