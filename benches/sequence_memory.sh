#!/usr/bin/env bash
# The driver's memory estimate of one executor against the executor's measured peak resident
# memory, for taggers over long sentences (issue 39, item 6): a grid of lengths and recurrent or
# attention layers, each trained for one epoch by `ringflow local` on one executor. The data is
# made with `ringflow sql` (tokens of 500 words, one tag in five `B-LOC`).
#
#   benches/sequence_memory.sh                 # the grid
#   RINGFLOW=target/debug/ringflow benches/sequence_memory.sh
#
# Prints one line per run: the model, the length, the batch, the estimate (the job's
# "memory: about …" message), the peak RSS (`peak_rss_mib` of the summary) and their ratio.
# Memory does not depend on the machine's speed, so this may run beside other work.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${RINGFLOW:-target/release/ringflow}
[ -x "$BIN" ] || { echo "error: $BIN is missing; cargo build --release first" >&2; exit 1; }
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT

# data ROWS LENGTH: a Parquet file of ROWS sentences of LENGTH tokens with a tag per token.
data() {
    local file="$DIR/s$1x$2.parquet"
    [ -f "$file" ] && { echo "$file"; return; }
    "$BIN" sql "SELECT r.value AS id,
            array_agg(concat('w', CAST((t.value * 7 + r.value * 13) % 500 AS VARCHAR))) AS tokens,
            array_agg(CASE WHEN (t.value + r.value) % 5 = 0 THEN 'B-LOC' ELSE 'O' END) AS tags
        FROM range($1) r CROSS JOIN range($2) t GROUP BY r.value" --output "$file" >/dev/null
    echo "$file"
}

# run NAME ROWS LENGTH BATCH LAYERS: trains one epoch, prints the estimate against the peak.
run() {
    local name=$1 rows=$2 length=$3 batch=$4 layers=$5
    local file spec
    file=$(data "$rows" "$length")
    spec="$DIR/$name-$length.toml"
    cat >"$spec" <<EOF
[data]
train = "$file"
features = ["tokens"]
label = "tags"
max_length = $length
[model]
kind = "sequential"
layers = [{ type = "embedding", dim = ${DIM:-64} }, $layers, { type = "linear" }]
[train]
epochs = 1
batch_size = $batch
optimizer = { kind = "adam", lr = 0.001 }
[cluster]
executors = 1
checkpoint_dir = "$DIR/$name-$length"
EOF
    "$BIN" local "$spec" --summary-json "$DIR/out.json" 2>"$DIR/log" >/dev/null ||
        { cat "$DIR/log" >&2; exit 1; }
    python3 - "$DIR/out.json" "$DIR/log" "$name" "$length" "$batch" <<'EOF'
import json, re, sys
summary, log, name, length, batch = sys.argv[1:]
text = open(log).read()
m = re.search(r"memory: about ([0-9.]+) (KiB|MiB|GiB)", text)
scale = {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}
estimate = float(m.group(1)) * scale[m.group(2)]
peak = max(json.load(open(summary))["peak_rss_mib"])
print(f"{name:<22} T {length:>5} batch {batch:>3}: estimate {estimate:8.1f} MiB, "
      f"peak {peak:8.1f} MiB, estimate/peak {estimate / peak:.2f}")
EOF
}

for length in 100 400 1000; do
    run "bilstm128" 640 "$length" 32 '{ type = "lstm", hidden = 128, bidirectional = true }'
    run "gru128x2" 640 "$length" 32 '{ type = "gru", hidden = 128, layers = 2 }'
    run "transformer" 640 "$length" 32 '{ type = "transformer_encoder", heads = 4, ff = 256 }'
done

# One sentence of 2^20 tokens in a batch of one: the steps' own bookkeeping, not the rows' values,
# is most of what a small recurrent layer keeps.
DIM=16 run "lstm16-one-sentence" 1 1048576 1 '{ type = "lstm", hidden = 16 }'
