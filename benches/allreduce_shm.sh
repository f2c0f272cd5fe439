#!/usr/bin/env bash
# Same-host all-reduce: shared memory against the TCP ring (issue 19, item 3), alternating runs.
#
#   benches/allreduce_shm.sh BIN [REPEATS]    # BIN: a release build of ringflow; REPEATS 3
#
# Prints, per repeat, `ringflow bench allreduce` lines for:
#   - 64 MiB on 2 and 4 ranks, through shared memory and over TCP (`--shared-memory false`):
#     goals busbw >= 3 GB/s at 2 ranks and >= 2 GB/s at 4 through shared memory;
#   - 1 MiB on 4 ranks (latency, `time_ms`): goal <= 0.5 ms through shared memory;
#   - 64 MiB on 4 ranks as 2 simulated hosts x 2 (the hierarchical all-reduce).
# Each configuration is checked first (`--check`: sums, averages, broadcast, all-gather against
# the serial computation). Run it on a quiet machine: it measures memory bandwidth.
#
# WAIT_POLICIES="0,16 4000,16 ..." also runs the shared-memory configurations under each wait
# policy (`RINGFLOW_SHM_WAIT=SPINS,YIELDS`: spins, then yields, before sleeping on a futex),
# alternating with the default policy.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ]; then
    echo "usage: benches/allreduce_shm.sh BIN [REPEATS]" >&2
    exit 2
fi
BIN="$1" REPEATS="${2:-3}"
[ -x "$BIN" ] || { echo "$BIN is not an executable" >&2; exit 2; }

CONFIGS=(
    "--ranks 2 --size-mb 64"
    "--ranks 2 --size-mb 64 --shared-memory false"
    "--ranks 4 --size-mb 64"
    "--ranks 4 --size-mb 64 --shared-memory false"
    "--ranks 4 --size-mb 1 --iters 200 --warmup 20"
    "--ranks 4 --size-mb 1 --iters 200 --warmup 20 --shared-memory false"
    "--ranks 4 --size-mb 64 --hosts 2"
)

echo "== check"
for c in "${CONFIGS[@]}"; do
    # shellcheck disable=SC2086
    "$BIN" bench allreduce $c --floats 1000003 --check
done

for r in $(seq "$REPEATS"); do
    echo "== repeat $r"
    for c in "${CONFIGS[@]}"; do
        # shellcheck disable=SC2086
        printf '%-70s %s\n' "$c" "$("$BIN" bench allreduce $c | tail -n 1)"
    done
    for p in ${WAIT_POLICIES:-}; do
        for c in "${CONFIGS[@]}"; do
            case "$c" in *"--shared-memory false"*) continue ;; esac
            # shellcheck disable=SC2086
            printf '%-70s %s\n' "$c wait=$p" \
                "$(RINGFLOW_SHM_WAIT="$p" "$BIN" bench allreduce $c | tail -n 1)"
        done
    done
done
