#!/usr/bin/env bash
# Two release binaries of ringflow side by side (a change of the release profile, say): the
# same jobs on each, alternating, with nothing else running.
#
#   benches/release_profile.sh BEFORE AFTER [REPEATS]     # REPEATS defaults to 3
#
# For each binary it prints its size and, per run, the wall time and training samples/s of
# `local examples/mnist.toml` (Parquet → tensors → 2 executors) and `local
# examples/mnist_sql.toml` (the same data prepared with SQL: a join, a filter, a derived
# column, standardization), with the test accuracy each reached, and the samples/s of `bench
# train --device cpu` (the tensor engine alone). Medians are printed at the end. Also for a
# change of the code that must not cost speed: build the release binary of each commit.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
    echo "usage: benches/release_profile.sh BEFORE AFTER [REPEATS]" >&2
    exit 2
fi
BEFORE="$1" AFTER="$2" REPEATS="${3:-3}"
for b in "$BEFORE" "$AFTER"; do
    [ -x "$b" ] || { echo "$b is not an executable" >&2; exit 2; }
done
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# `local SPEC` with BIN: "wall_s samples_per_s test_accuracy".
job() {
    local bin="$1" spec="$2" out="$WORK/summary.json"
    local start end
    start=$(date +%s.%N)
    "$bin" local "$spec" --executors 2 --ui off \
        --set "cluster.checkpoint_dir=$WORK/run" --summary-json "$out" >/dev/null 2>&1
    end=$(date +%s.%N)
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("%.2f %.0f %.4f" % (float(sys.argv[3])-float(sys.argv[2]), s["train_samples_per_s"], s["test_accuracy"]))' \
        "$out" "$start" "$end"
    rm -rf "$WORK/run" "$out"
}

engine() {
    "$1" bench train --device cpu --steps 20 --warmup 2 --json 2>/dev/null |
        python3 -c 'import json,sys; print("%.0f" % json.load(sys.stdin)["samples_per_s"])'
}

RESULTS="$WORK/results"
for i in $(seq 1 "$REPEATS"); do
    for name in before after; do
        bin="$BEFORE"; [ "$name" = after ] && bin="$AFTER"
        read -r mw ms ma < <(job "$bin" examples/mnist.toml)
        read -r sw ss sa < <(job "$bin" examples/mnist_sql.toml)
        es=$(engine "$bin")
        echo "$name run $i: mnist ${mw} s (${ms} samples/s, accuracy ${ma}), mnist_sql ${sw} s" \
            "(${ss} samples/s, accuracy ${sa}), engine ${es} samples/s"
        echo "$name $mw $ms $sw $ss $es $ma $sa" >>"$RESULTS"
    done
done

python3 - "$RESULTS" "$BEFORE" "$AFTER" <<'EOF'
import os, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
cols = ["mnist wall s", "mnist samples/s", "mnist_sql wall s", "mnist_sql samples/s",
        "engine samples/s", "mnist test accuracy", "mnist_sql test accuracy"]
med = {n: [statistics.median(float(r[i + 1]) for r in rows if r[0] == n) for i in range(7)]
       for n in ("before", "after")}
print(f"\n| | before ({os.path.getsize(sys.argv[2]):,} bytes) | after ({os.path.getsize(sys.argv[3]):,} bytes) | after/before |")
print("|---|---:|---:|---:|")
for i, c in enumerate(cols):
    b, a = med["before"][i], med["after"][i]
    digits = 4 if "accuracy" in c else 2
    print(f"| {c} (median) | {b:,.{digits}f} | {a:,.{digits}f} | {a / b:.3f} |")
EOF
