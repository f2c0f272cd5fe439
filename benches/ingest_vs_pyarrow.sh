#!/usr/bin/env bash
# Parquet → one contiguous float32 [rows, width] matrix and the labels: ringflow against pyarrow +
# numpy on the same files, alternating runs, with nothing else running.
#
#   benches/ingest_vs_pyarrow.sh [REPEATS] [SYNTHETIC_DIR]     # REPEATS defaults to 5
#
# - ringflow: `ringflow bench ingest PATH --columns FEATURES --label LABEL` (release build):
#   the readers, decoder threads, converter and batching that training uses, without the cache.
# - pyarrow: `pq.read_table(PATH, columns=[...])` (its default, multi-threaded), then each
#   feature column's values (a list column's flattened values) cast into a preallocated float32
#   [rows, width] array, and the label column to int64.
#
# Data: MNIST (`examples/data/mnist/train.parquet`, 60,000 rows of 784 uint8 pixels, zstd) and,
# when SYNTHETIC_DIR is given, the set of `examples/synthetic_data.rs` in it (256 float32
# features); make it with
#   cargo run --release --example synthetic_data -- SYNTHETIC_DIR --gb 2
# and delete it afterwards. Both tools read the same files, so both find them in the page cache
# after the first run. MB/s counts the compressed column chunks read, from the files' footers.
set -euo pipefail
cd "$(dirname "$0")/.."

REPEATS="${1:-5}"
SYNTHETIC="${2:-}"
PYTHON="${PYTHON:-python3}"   # with pyarrow and numpy
BIN=target/release/ringflow
[ -x "$BIN" ] || cargo build --release --bin ringflow
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

cat > "$WORK/pyarrow_ingest.py" <<'EOF'
import sys, time
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.dataset as ds

path, features, label = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
start = time.perf_counter()
table = pq.read_table(path, columns=features + [label])
rows = table.num_rows
widths = []
for name in features:
    t = table.schema.field(name).type
    if pa.types.is_fixed_size_list(t):
        widths.append(t.list_size)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        first = table.column(name).chunk(0)
        widths.append(len(first[0]) if len(first) else 0)
    else:
        widths.append(1)
width = sum(widths)
x = np.empty((rows, width), dtype=np.float32)
offset = 0
for name, w in zip(features, widths):
    at = 0
    for chunk in table.column(name).chunks:
        n = len(chunk)
        values = chunk.flatten() if w != 1 or pa.types.is_list(chunk.type) else chunk
        x[at:at + n, offset:offset + w] = values.to_numpy(zero_copy_only=False).reshape(n, w)
        at += n
    offset += w
y = table.column(label).to_numpy().astype(np.int64)
seconds = time.perf_counter() - start
read = set(features + [label])
nbytes = 0
for f in ds.dataset(path, format="parquet").files:
    meta = pq.ParquetFile(f).metadata
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            if rg.column(c).path_in_schema.split(".")[0] in read:
                nbytes += rg.column(c).total_compressed_size
assert x.shape == (rows, width) and y.shape == (rows,)
print(f"pyarrow rows={rows} width={width} seconds={seconds:.3f} rows_per_s={rows / seconds:.0f} "
      f"MB_per_s={nbytes / 1e6 / seconds:.1f}")
EOF

# "rows_per_s" of a result line.
rate() { sed -n 's/.*rows_per_s=\([0-9.]*\).*/\1/p'; }
median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

compare() {
    local name="$1" path="$2" features="$3" label="$4"
    : > "$WORK/ringflow" ; : > "$WORK/pyarrow"
    echo "== $name: $path (features $features, label $label)"
    for i in $(seq "$REPEATS"); do
        r=$("$BIN" bench ingest "$path" --columns "$features" --label "$label" --batch 128)
        echo "  run $i  ringflow  $r"
        echo "$r" | rate >> "$WORK/ringflow"
        p=$("$PYTHON" "$WORK/pyarrow_ingest.py" "$path" "$features" "$label")
        echo "  run $i  pyarrow   $p"
        echo "$p" | rate >> "$WORK/pyarrow"
    done
    local rf pa
    rf=$(median < "$WORK/ringflow")
    pa=$(median < "$WORK/pyarrow")
    echo "  median rows/s: ringflow $rf, pyarrow $pa, ratio $(awk -v a="$rf" -v b="$pa" 'BEGIN {printf "%.2f", a / b}')"
}

compare mnist examples/data/mnist/train.parquet image label
if [ -n "$SYNTHETIC" ]; then
    compare synthetic "$SYNTHETIC" x y
fi
