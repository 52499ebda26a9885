#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# license_test.sh - the project is licensed under Apache-2.0 (LICENSE), and every source file says
# so in its first lines with an SPDX identifier, so a file copied out of the tree keeps its terms.
# Usage: license_test.sh SOURCE_DIR
set -eu
src=$1
cd "$src"
fail=0
grep -q "Apache License" LICENSE 2>/dev/null && grep -q "Version 2.0, January 2004" LICENSE || {
    echo "license_test: LICENSE is missing or is not the Apache License 2.0" >&2
    fail=1
}
grep -q "^License: Apache-2.0$" packaging/deb/copyright || {
    echo "license_test: packaging/deb/copyright does not name Apache-2.0" >&2
    fail=1
}
# Code, scripts, build files, packaging and manual pages; not prose (*.md), JSON (no comments),
# fuzzer seeds or test data.
files=$(find lib include common src tests bench fuzz examples scripts packaging cmake docs \
            \( -path fuzz/seeds -o -path tests/data -o -name node_modules -o -path bench/results \) \
            -prune -o -type f \( -name '*.[ch]' -o -name '*.py' -o -name '*.sh' -o -name '*.js' \
            -o -name '*.lua' -o -name '*.yaml' -o -name '*.yml' -o -name '*.cmake' \
            -o -name '*.[18]' -o -name CMakeLists.txt -o -name '*.pc.in' \) -print | sort)
n=0
for f in $files Makefile CMakeLists.txt .ci/run; do
    n=$((n + 1))
    head -n 3 "$f" | grep -q "SPDX-License-Identifier: Apache-2.0" || {
        echo "license_test: $f has no 'SPDX-License-Identifier: Apache-2.0' in its first lines" >&2
        fail=1
    }
done
[ "$fail" -eq 0 ] || exit 1
echo "license_test: LICENSE is Apache-2.0 and $n source files carry its SPDX identifier"
