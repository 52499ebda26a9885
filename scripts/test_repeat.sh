#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# test_repeat.sh BUILD_DIR RUNS [REGEX] - runs the ctest tests matching REGEX (default: the service
# suites, SQLite and PostgreSQL) RUNS times in BUILD_DIR and reports every test that failed in any
# run, with how many runs it failed and where each failing run's output is.  A test that fails once
# in ten runs is a broken test: this is how it shows before a user meets it.
#
#   make test-repeat N=3                      the service suites, three times, plain build
#   make test-repeat N=5 BUILD=build-asan     the same under ASan+UBSan (make test-asan built it)
#   make test-repeat N=10 TESTS='gateway'     any ctest -R regex
#
# Exit status: 0 if every run passed, 1 if any test failed in any run, 2 on a usage error.
set -u

usage() {
    echo "usage: test_repeat.sh BUILD_DIR RUNS [CTEST_REGEX]" >&2
    exit 2
}

[ $# -ge 2 ] || usage
build=$1
runs=$2
regex=${3:-'^service(-pg)?\.'}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

case $runs in
'' | *[!0-9]* | 0) echo "test_repeat.sh: RUNS must be a positive number, not '$runs'" >&2; exit 2 ;;
esac
if [ ! -f "$build/CTestTestfile.cmake" ]; then
    echo "test_repeat.sh: $build is not a configured build tree (run make build or make test-asan)" >&2
    exit 2
fi
build=$(cd "$build" && pwd)
count=$(cd "$build" && ctest -N -R "$regex" | sed -n 's/^Total Tests: //p')
if [ "${count:-0}" -eq 0 ]; then
    echo "test_repeat.sh: no test in $build matches '$regex'" >&2
    exit 2
fi

logs="$build/test-repeat"
rm -rf "$logs"
mkdir -p "$logs"
failures="$logs/failures"
: >"$failures"

echo "test-repeat: $count tests matching '$regex', $runs runs, in $build"
i=1
while [ "$i" -le "$runs" ]; do
    log="$logs/run-$i.log"
    start=$(date +%s)
    (cd "$build" && ctest --output-on-failure -j "$jobs" -R "$regex") >"$log" 2>&1
    rc=$?
    took=$(($(date +%s) - start))
    failed="$build/Testing/Temporary/LastTestsFailed.log"
    if [ "$rc" -eq 0 ]; then
        echo "run $i/$runs: all $count passed (${took} s)"
    elif [ -s "$failed" ]; then
        names=$(sed 's/^[0-9]*://' "$failed")
        for n in $names; do
            echo "$n $i" >>"$failures"
        done
        echo "run $i/$runs: FAILED $(echo "$names" | tr '\n' ' ')(${took} s, output in $log)"
    else
        echo "run $i/$runs: ctest exited $rc without a failed test (${took} s, output in $log)"
        echo "(ctest) $i" >>"$failures"
    fi
    i=$((i + 1))
done

if [ ! -s "$failures" ]; then
    echo "test-repeat: every test passed in all $runs runs"
    exit 0
fi
echo "test-repeat: tests that failed in some run (test, failed runs of $runs, which runs):"
sort "$failures" | awk '
    { n[$1]++; r[$1] = r[$1] (r[$1] == "" ? "" : ",") $2 }
    END { for (t in n) printf "  %-40s %d  runs %s\n", t, n[t], r[t] }' | sort
exit 1
