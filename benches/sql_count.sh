#!/usr/bin/env bash
# What the driver's row count costs where data.sql may drop or multiply rows (issue 39, item 1):
# the MNIST example for one epoch on one executor, plain (no query: nothing to count) and with a
# filter and a join that doubles every row, in alternating rounds. Prints, per run, the seconds
# the driver spent counting (the job's "counted on the driver in X s" message), the training
# seconds (samples over the summary's samples per second), the job's wall time, and the rows.
#
#   benches/sql_count.sh                  # 3 rounds, target/release/ringflow
#   RINGFLOW=target/debug/ringflow ROUNDS=2 benches/sql_count.sh
#
# Run it on an otherwise idle machine: the figures are times.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${RINGFLOW:-target/release/ringflow}
ROUNDS=${ROUNDS:-3}
[ -x "$BIN" ] || { echo "error: $BIN is missing; cargo build --release first" >&2; exit 1; }
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
# Every label twice: the join yields 120,000 rows from MNIST's 60,000.
printf 'label\n' >"$DIR/twice.csv"
for l in 0 1 2 3 4 5 6 7 8 9; do printf '%s\n%s\n' "$l" "$l" >>"$DIR/twice.csv"; done

# run NAME [--set ...]: one epoch; prints the count's seconds, the training seconds, the rows.
run() {
    local name=$1
    shift
    "$BIN" local examples/mnist.toml --ui off --set train.epochs=1 \
        --set "cluster.checkpoint_dir=\"$DIR/$name\"" "$@" \
        --summary-json "$DIR/out.json" 2>"$DIR/log" >/dev/null || { cat "$DIR/log" >&2; exit 1; }
    python3 - "$DIR/out.json" "$DIR/log" "$name" <<'EOF'
import json, re, sys
summary, log, name = sys.argv[1:]
m = re.search(r"data\.train: data\.sql yields (\d+) rows .*?counted on the driver in ([0-9.]+) s",
              open(log).read())
rows, count = (int(m.group(1)), float(m.group(2))) if m else (60000, 0.0)
s = json.load(open(summary))
train = s["samples"] / s["train_samples_per_s"]
print(f"{name:<12} count {count:5.1f} s   training {train:6.1f} s   job {s['wall_s']:6.1f} s   "
      f"rows {rows:>6}   samples {s['samples']:>6}")
EOF
}

for round in $(seq "$ROUNDS"); do
    echo "round $round"
    run plain
    run where --set 'data.sql="SELECT * FROM input WHERE label < 5"'
    run join-twice --set 'data.sql="SELECT input.* FROM input JOIN twice ON input.label = twice.label"' \
        --set "data.tables={ twice = \"$DIR/twice.csv\" }"
done
