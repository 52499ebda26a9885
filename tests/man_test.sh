#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# man_test.sh - the manual pages in docs/: every program has one, each renders without a groff
# warning (what `man` would show a user as garbage or silently drop), through man-db's `man -l`
# too at the usual terminal widths, and each names every option its program's --help lists.
# Usage: man_test.sh SOURCE_DIR [BIN_DIR]   (BIN_DIR: the built programs, for the --help check)
set -eu
src=$1
bin=${2:-}
fail=0

# One page per program, in the section a Debian package would put it.
for page in idem.1 idem-check.1 provider-sim.1 orderd.8 idem-gateway.8; do
    [ -f "$src/docs/$page" ] || { echo "docs/$page is missing" >&2; fail=1; }
done

# man-db renders the pages as a user reads them; scripts/deps.sh installs it.
command -v man >/dev/null 2>&1 || { echo "man (man-db) is not installed: run scripts/deps.sh" >&2; exit 1; }

n=0
for page in "$src"/docs/*.[18]; do
    out=$(groff -man -ww -z "$page" 2>&1) || true
    if [ -n "$out" ]; then
        echo "$page: groff warns:" >&2
        echo "$out" >&2
        fail=1
    fi
    # man-db (scripts/deps.sh installs it): the page as `man -l` shows it, warnings on.
    for width in 80 60 120; do
        out=$(LC_ALL=C.UTF-8 MANWIDTH=$width man --warnings=w -l "$page" 2>&1 >/dev/null) || {
            echo "$page: man -l failed (width $width): $out" >&2
            fail=1
            continue
        }
        if [ -n "$out" ]; then
            echo "$page: man -l warns at width $width:" >&2
            echo "$out" >&2
            fail=1
        fi
    done
    # Its title line names the page as the file does (IDEM-GATEWAY(8) for idem-gateway.8).
    base=$(basename "$page")
    title=$(echo "${base%.*}" | tr '[:lower:]' '[:upper:]')"(${base##*.})"
    first=$(LC_ALL=C.UTF-8 MANWIDTH=80 man -l "$page" 2>/dev/null | head -n 1)
    case "$first" in
    "$title"*) ;;
    *)
        echo "$page: title line is '$first', expected it to start with $title" >&2
        fail=1
        ;;
    esac
    n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "no manual pages found in $src/docs" >&2; exit 1; }

# Every long option a program's --help lists (its commands' too) is in its page.
if [ -n "$bin" ]; then
    check_options() { # page program [command...]: the options of "program command --help"
        page=$1
        shift
        help=$("$bin/$@" --help 2>&1) || { echo "$* --help failed" >&2; fail=1; return; }
        for opt in $(echo "$help" | grep -o -- '--[a-z][a-z0-9-]*' | sort -u); do
            # groff source writes a dash as \- ; the page may use either form.  The option
            # must end there (--max-connections-per-ip does not stand for --max-connections).
            esc=$(echo "$opt" | sed 's/-/\\\\-/g')
            if ! grep -q -E "($esc|$opt)([^a-z0-9\\-]|\\[^-]|$)" "$src/docs/$page"; then
                echo "docs/$page does not mention $opt (from '$* --help')" >&2
                fail=1
            fi
        done
    }
    check_options orderd.8 orderd
    for cmd in serve "token create" migrate "outbox list"; do
        # shellcheck disable=SC2086
        check_options orderd.8 orderd $cmd
    done
    check_options provider-sim.1 provider-sim
    check_options idem-check.1 idem-check conformance
    check_options idem-check.1 idem-check chaos
    check_options idem-gateway.8 idem-gateway
    for cmd in serve check-config "keys show" "shards move"; do
        # shellcheck disable=SC2086
        check_options idem-gateway.8 idem-gateway $cmd
    done
    check_options idem.1 idem
    check_options idem.1 idem post
    check_options idem.1 idem journal
fi

[ "$fail" -eq 0 ] || exit 1
echo "man pages: $n render without warnings${bin:+ and name every option of --help}"
