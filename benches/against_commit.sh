#!/usr/bin/env bash
# Training speed and accuracy of two ringflow binaries side by side: the same three jobs, runs
# alternating between them, with nothing else running. For a change that must not cost speed
# (a redesign, a tidy-up): build the commit before it and the change, then compare.
#
#   benches/against_commit.sh BEFORE_BIN AFTER_BIN [REPEATS]        # REPEATS 3
#   JOBS="mlp" benches/against_commit.sh ...                         # some of the jobs only
#
# A binary of another commit, in the profile the figures are taken in (the dev profile builds
# the engine and the executor optimized; `--release` for release figures):
#
#   git worktree add ../ringflow-before COMMIT
#   (cd ../ringflow-before && cargo build --bin ringflow)     # ../ringflow-before/target/debug/ringflow
#
# The jobs, on one executor (one rank: no all-reduce in the figure):
#   - mlp:    examples/mnist.toml, 2 epochs;
#   - lenet:  examples/mnist_cnn.toml, 1 epoch;
#   - bilstm: examples/ner_bilstm.toml (embedding, bidirectional LSTM, per-token linear), 2 epochs.
# Each line: the job, the binary, the samples/s of the last epoch (from the summary JSON's
# `history`), and the test accuracy after those epochs (token accuracy for the tagger), so
# that a change in what the job computes shows too. Accuracy after so few epochs is a check
# that both computed the same, not the example's final figure.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
    echo "usage: benches/against_commit.sh BEFORE_BIN AFTER_BIN [REPEATS]" >&2
    exit 2
fi
BEFORE="$1" AFTER="$2" REPEATS="${3:-3}" JOBS="${JOBS:-mlp lenet bilstm}"
for bin in "$BEFORE" "$AFTER"; do
    [ -x "$bin" ] || { echo "$bin is not an executable" >&2; exit 2; }
done
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# JOB's spec and epochs.
spec() {
    case "$1" in
    mlp) echo "examples/mnist.toml 2" ;;
    lenet) echo "examples/mnist_cnn.toml 1" ;;
    bilstm) echo "examples/ner_bilstm.toml 2" ;;
    esac
}

# One run of JOB with BIN: "samples_per_s test_accuracy".
run() {
    local job="$1" bin="$2" out="$WORK/summary.json"
    read -r toml epochs < <(spec "$job")
    "$bin" local "$toml" --executors 1 --ui off --set "train.epochs=$epochs" \
        --set "cluster.checkpoint_dir=$WORK/run" --summary-json "$out" >/dev/null 2>&1
    python3 - "$out" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{s['history'][-1]['samples_per_s']:.0f} {s.get('test_accuracy') or 0:.4f}")
PYEOF
    rm -rf "$WORK/run" "$out"
}

echo "# job binary samples_per_s test_accuracy (runs alternate; $REPEATS each)"
for job in $JOBS; do
    for i in $(seq 1 "$REPEATS"); do
        for side in before after; do
            bin="$BEFORE"
            [ "$side" = after ] && bin="$AFTER"
            echo "$job $side $(run "$job" "$bin")"
        done
    done
done | tee "$WORK/results"

echo "# medians: job before_samples_per_s after_samples_per_s after/before accuracy_before accuracy_after"
python3 - "$WORK/results" <<'PYEOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if not l.startswith("#")]
for job in dict.fromkeys(r[0] for r in rows):
    rate = {s: statistics.median(float(r[2]) for r in rows if r[0] == job and r[1] == s)
            for s in ("before", "after")}
    acc = {s: [r[3] for r in rows if r[0] == job and r[1] == s][-1] for s in ("before", "after")}
    print(f"{job} {rate['before']:.0f} {rate['after']:.0f} {rate['after'] / rate['before']:.3f} "
          f"{acc['before']} {acc['after']}")
PYEOF
