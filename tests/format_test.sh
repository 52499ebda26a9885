#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# format_test.sh - every C file of the project is formatted as .clang-format says, so a change
# never mixes its substance with reformatting and a reader meets one layout everywhere.
# Usage: format_test.sh SOURCE_DIR   (clang-format: scripts/deps.sh test installs it)
# To fix what it reports: clang-format -i FILE (or git clang-format for a change's lines).
set -eu
src=$1
command -v clang-format >/dev/null 2>&1 || {
    echo "clang-format is not installed: run scripts/deps.sh test" >&2
    exit 1
}
cd "$src"
files=$(find lib include common src tests bench fuzz examples -name '*.[ch]' 2>/dev/null | sort)
n=$(echo "$files" | wc -l)
# shellcheck disable=SC2086 # one word per file: no path of the project holds a space
if ! clang-format --dry-run --Werror $files; then
    echo "format_test: the files above differ from .clang-format; run clang-format -i on them" >&2
    exit 1
fi
echo "format_test: $n C files as .clang-format says"
