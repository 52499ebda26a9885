#!/bin/sh
# man_test.sh - every manual page in docs/ renders without a groff warning (what `man` would
# show a user as garbage or silently drop).  Usage: man_test.sh SOURCE_DIR
set -eu
src=$1
n=0
for page in "$src"/docs/*.[18]; do
    out=$(groff -man -ww -z "$page" 2>&1) || true
    if [ -n "$out" ]; then
        echo "$page: groff warns:" >&2
        echo "$out" >&2
        exit 1
    fi
    n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "no manual pages found in $src/docs" >&2; exit 1; }
echo "man pages: $n render without warnings"
