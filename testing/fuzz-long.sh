#!/usr/bin/env bash
# The fuzz targets (docs/testing.md) in long mode: every property test named `fuzz_*` runs
# CASES cases (default 1,000,000) instead of CI's bound of a few hundred.
#
#   testing/fuzz-long.sh                      # all targets, 1,000,000 cases each
#   testing/fuzz-long.sh 100000               # all targets, 100,000 cases each
#   testing/fuzz-long.sh 1000000 fuzz_token   # the targets whose name contains fuzz_token
#
# A failure prints the shrunk input; turn it into a plain regression test beside the target
# (see docs/testing.md). A failing target does not stop the others: the script ends by naming
# every target that failed, with a non-zero exit. Runs in the dev profile that `cargo test`
# builds.
set -euo pipefail
cd "$(dirname "$0")/.."

CASES="${1:-1000000}"
FILTER="${2:-fuzz_}"
export PROPTEST_CASES="$CASES"
# The long-fuzz switch: tests that need GiBs of memory (the image bombs of tests/cli) run only
# with it.
export RINGFLOW_LONG_FUZZ=1

# Where the targets live: crate and test target.
SUITES=(
    "-p ringflow-core --lib"
    "-p ringflow-ml --lib"
    "-p ringflow-ml --test conformance"
    "-p ringflow-ml --test footprint"
    "-p ringflow-executor --lib"
    "-p ringflow-driver --lib"
    "--test cli"
)

failed=()
for suite in "${SUITES[@]}"; do
    # shellcheck disable=SC2086 # the suite is several arguments
    names=$(cargo test $suite -- --list 2>/dev/null | sed -n 's/: test$//p' | grep -F "$FILTER" || true)
    for name in $names; do
        echo "== $name ($CASES cases)"
        start=$(date +%s)
        # shellcheck disable=SC2086
        if cargo test -q $suite -- --exact "$name" --test-threads 1; then
            echo "   $name: $CASES cases in $(($(date +%s) - start)) s"
        else
            echo "   $name: FAILED after $(($(date +%s) - start)) s (its shrunk input is above)"
            failed+=("$name")
        fi
    done
done
if ((${#failed[@]})); then
    echo "failed: ${failed[*]}"
    exit 1
fi
