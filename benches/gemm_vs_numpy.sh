#!/usr/bin/env bash
# ringflow's CPU GEMM (ml/examples/gemm_bench.rs) against numpy's matmul (OpenBLAS) on the
# products ringflow runs (benches/gemm_shapes.txt: MLP layers forward and backward with their
# transposed operands, im2col convolutions, LSTM gates, square products), alternating runs.
#
#   benches/gemm_vs_numpy.sh [REPEATS] [PYTHON] [SECONDS]   # 3 rounds; python3; 0.3 s a shape
#
# Both use every core: ringflow's rayon pool is as large as the machine, and OpenBLAS threads
# over all cores by default (the script leaves OPENBLAS_NUM_THREADS unset; set RAYON_NUM_THREADS
# and OPENBLAS_NUM_THREADS together to compare on fewer). Each round runs ringflow over every
# shape, then numpy; the table keeps each side's best figure over the rounds (GFLOP/s), with
# ringflow's on one thread and the `gemm` crate's (ringflow's previous GEMM) beside them. Run it
# on a quiet machine: other work lowers both sides unevenly. Where other work cannot be stopped
# (a shared build machine), `chrt -f 1 benches/gemm_vs_numpy.sh ...` as root gives both sides the
# cores: the large products then read as on a quiet machine, but OpenBLAS's threads, which
# spin and yield between calls, lose about half their speed on products under a millisecond
# (lenet2.fwd, pointwise.fwd, lstm.b32.dw), so read those from a quiet run. Each round also
# prints the machine's FMA ceiling as gemm_bench measures it (a loop of register-held FMAs on one
# thread and on all of them), against which to read ringflow's figures.
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS="${1:-3}" PY="${2:-python3}" SECONDS_PER_SHAPE="${3:-0.3}"
SHAPES=benches/gemm_shapes.txt
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

cargo build --release -p ringflow-ml --example gemm_bench >&2
BENCH=target/release/examples/gemm_bench
"$PY" -c 'import numpy; numpy.show_config()' 2>/dev/null | grep -iE '"name"|openblas' | head -4 >&2 || true

for round in $(seq "$REPEATS"); do
    echo "round $round/$REPEATS" >&2
    "$BENCH" --shapes "$SHAPES" --seconds "$SECONDS_PER_SHAPE" >"$WORK/round"
    grep '^# fma peak' "$WORK/round" >&2 || true
    grep -v '^#' "$WORK/round" >>"$WORK/ours"
    "$PY" benches/gemm_numpy.py --shapes "$SHAPES" --seconds "$SECONDS_PER_SHAPE" >>"$WORK/numpy"
done

# Best per shape on each side, then the table in the shapes file's order.
awk '
    FNR == 1 { file++ }
    file == 1 { key = $1; shape[key] = $2 "x" $3 "x" $4 (($5 || $6) ? " t" $5 $6 : "");
                if ($7 > ours[key]) ours[key] = $7; if ($8 > serial[key]) serial[key] = $8;
                if ($9 > crate[key]) crate[key] = $9; next }
    file == 2 { if ($2 > np[$1]) np[$1] = $2; next }
    file == 3 { sub(/#.*/, ""); if (NF == 0) next; order[++count] = $1 }
    END {
        printf "%-14s %-20s %9s %9s %9s %9s %7s\n", "product", "m x k x n (t a b)", "ringflow",
            "1 thread", "gemm", "numpy", "ratio"
        for (i = 1; i <= count; i++) {
            k = order[i]
            printf "%-14s %-20s %9.1f %9.1f %9.1f %9.1f %7.2f\n", k, shape[k], ours[k],
                serial[k], crate[k], np[k], (np[k] > 0 ? ours[k] / np[k] : 0)
        }
    }' "$WORK/ours" "$WORK/numpy" "$SHAPES"
