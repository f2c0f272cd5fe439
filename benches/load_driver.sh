#!/usr/bin/env bash
# Load test of one standalone driver at full size: 200 jobs submitted back to back by 4
# concurrent clients (`ringflow submit` processes) to a driver with 4 executors, with seeded
# cancels mixed in, while 500 idle connections are held open to the web UI and 500 to the
# control plane for the whole run. It is the integration test `load::` of tests/cli/load.rs at a
# larger size; it fails when a job does not end as expected, the driver stops answering, its
# open files or threads do not return near their level before the load, its memory grows
# without bound, or it keeps more finished jobs than --retained-jobs. It prints the figures:
# job outcomes, wall time, the driver's RSS (start, max, end), open files and threads, and the
# latency percentiles of the web UI and `ringflow status`.
#
# Usage: benches/load_driver.sh [JOBS [IDLE [CLIENTS [SEED]]]]   (defaults 200 500 4 15)
# Not part of CI's time budget; the regular suite runs 20 jobs and 50 + 50 idle connections.
set -euo pipefail
cd "$(dirname "$0")/.."

export RINGFLOW_LOAD_JOBS="${1:-200}"
export RINGFLOW_LOAD_IDLE="${2:-500}"
export RINGFLOW_LOAD_CLIENTS="${3:-4}"
export RINGFLOW_LOAD_SEED="${4:-15}"

# The test holds 2 × IDLE connections plus the clients' own: it raises its open-file limit to
# the hard limit, which must leave room for them.
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt $((2 * RINGFLOW_LOAD_IDLE + 256)) ]; then
    echo "error: the open-file hard limit ($hard) is too low for $RINGFLOW_LOAD_IDLE idle" \
        "connections per port; raise it (ulimit -Hn) or pass a smaller IDLE" >&2
    exit 1
fi

start=$(date +%s)
mkdir -p target
set +e
cargo test --test cli load:: -- --nocapture --test-threads 1 2>&1 | tee target/load_driver.log |
    grep -E 'load: [0-9]+ jobs|^(driver RSS:|web UI:|ringflow status:|test result)|panicked'
status=${PIPESTATUS[0]}
set -e
echo "load_driver.sh: $(( $(date +%s) - start )) s in all (build included), exit $status;" \
    "the whole output is in target/load_driver.log"
exit "$status"
