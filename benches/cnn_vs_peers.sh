#!/usr/bin/env bash
# The LeNet-style CNN of issue 17 (conv 5x5 32 - pool - conv 5x5 64 - pool - fc 128 - fc 10, Adam,
# batch 64) trained by ringflow, TensorFlow/Keras (CPU, oneDNN) and JAX (XLA CPU) on the same
# MNIST Parquet, alternating runs, with nothing else running.
#
#   benches/cnn_vs_peers.sh BIN [REPEATS] [PYTHON]    # REPEATS 3; PYTHON with tensorflow and jax
#
# Each run trains 2 epochs and reports the samples/s of the second (the first includes the
# peers' tracing and compilation, and ringflow's first read of the data), and the test accuracy
# after the 2 epochs. ringflow's second-epoch figure comes from the summary JSON's `history`,
# with the epoch's phase times (data, forward, backward, all-reduce, optimizer) to say where the
# time goes. Then the example as it is (3 epochs) on 1, 2 and 4 executors (samples/s of the last
# epoch, summed over executors, and the test accuracy), and the peak RSS of each executor at
# batch 64 and 256.
#
# With PRECISION=bf16 in the environment, ringflow multiplies in bfloat16 with f32 sums
# (`train.matmul_precision = "bf16"`), Keras runs twice (f32, and its `mixed_bfloat16` policy)
# and JAX with `jax_default_matmul_precision = "bfloat16"`; only the 2-epoch comparison runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ]; then
    echo "usage: benches/cnn_vs_peers.sh BIN [REPEATS] [PYTHON]" >&2
    exit 2
fi
BIN="$1" REPEATS="${2:-3}" PY="${3:-python3}" PRECISION="${PRECISION:-f32}"
[ -x "$BIN" ] || { echo "$BIN is not an executable" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# ringflow on EXECUTORS executors with BATCH for EPOCHS: "samples_per_s(last epoch)
# test_accuracy phases rss".
ringflow() {
    local executors="$1" batch="$2" epochs="$3" out="$WORK/summary.json"
    "$BIN" local examples/mnist_cnn.toml --executors "$executors" --ui off \
        --set "train.epochs=$epochs" --set "train.batch_size=$batch" \
        --set "train.matmul_precision=\"$PRECISION\"" --set "cluster.checkpoint_dir=$WORK/run" --summary-json "$out" >/dev/null 2>&1
    "$PY" - "$out" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
e = s["history"][-1]
p = e["phases"]
total = sum(p.values()) or 1
share = " ".join(f"{k}={100 * v / total:.0f}%" for k, v in p.items())
rss = "/".join(f"{r:.0f}" for r in s["peak_rss_mib"])
print(f"{e['samples_per_s']:.0f} {s['test_accuracy']:.4f} [{share}] rss_mib={rss}")
PYEOF
    rm -rf "$WORK/run" "$out"
}

# A peer's script (then more of its arguments): "samples_per_s test_accuracy".
peer() {
    "$PY" "benches/$1" --batch 64 --epochs 2 "${@:2}" 2>/dev/null | tail -1 |
        sed -E 's/.*samples_per_s=([0-9]+).*test_accuracy=([0-9.]+).*/\1 \2/'
}

RESULTS="$WORK/results"
if [ "$PRECISION" = bf16 ]; then
    for i in $(seq 1 "$REPEATS"); do
        read -r rs ra rest < <(ringflow 1 64 2)
        read -r ks ka < <(peer keras_cnn.py)
        read -r kb kba < <(peer keras_cnn.py --mixed-bfloat16)
        read -r js ja < <(peer jax_cnn.py --matmul-precision bfloat16)
        echo "run $i: ringflow bf16 $rs samples/s (accuracy $ra) $rest; keras f32 $ks ($ka);" \
            "keras mixed_bfloat16 $kb ($kba); jax bfloat16 precision $js ($ja)"
        echo "$rs $ks $kb $js" >>"$RESULTS"
    done
    "$PY" - "$RESULTS" <<'PYEOF'
import statistics, sys
rows = [[float(x) for x in l.split()] for l in open(sys.argv[1])]
r, k, kb, j = (statistics.median(c) for c in zip(*rows))
print(f"median samples/s: ringflow bf16 {r:.0f}, keras f32 {k:.0f} ({r / k:.2f}x), "
      f"keras mixed_bfloat16 {kb:.0f} ({r / kb:.2f}x), jax bfloat16 precision {j:.0f} ({r / j:.2f}x)")
PYEOF
    exit 0
fi
for i in $(seq 1 "$REPEATS"); do
    read -r rs ra rest < <(ringflow 1 64 2)
    read -r ks ka < <(peer keras_cnn.py)
    read -r js ja < <(peer jax_cnn.py)
    echo "run $i: ringflow $rs samples/s (accuracy $ra) $rest; keras $ks ($ka); jax $js ($ja)"
    echo "$rs $ks $js" >>"$RESULTS"
done
"$PY" - "$RESULTS" <<'PYEOF'
import statistics, sys
rows = [[float(x) for x in l.split()] for l in open(sys.argv[1])]
r, k, j = (statistics.median(c) for c in zip(*rows))
print(f"median samples/s: ringflow {r:.0f}, keras {k:.0f}, jax {j:.0f}; "
      f"ringflow / keras = {r / k:.2f}, ringflow / jax = {r / j:.2f}")
PYEOF
# The example as it is (3 epochs) on 1, 2 and 4 executors: the accuracy it promises.
for n in 1 2 4; do
    echo "ringflow, $n executors, batch 64 each, 3 epochs: $(ringflow "$n" 64 3)"
done
echo "ringflow, 1 executor, batch 256, 1 epoch: $(ringflow 1 256 1)"
