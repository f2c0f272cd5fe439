#!/usr/bin/env bash
# Issue 18's figures: the BiLSTM tagger (embedding 64, bidirectional LSTM 128, dense; Adam,
# batch 32) trained by ringflow and by TensorFlow/Keras (CPU) on the shipped Japanese corpus,
# alternating runs, with nothing else running; then ringflow alone on 2 executors, the
# part-of-speech tagger, and the Transformer tagger.
#
#   benches/ner_vs_keras.sh BIN [REPEATS] [PYTHON] [EPOCHS] [LR]
#       # REPEATS 3; PYTHON with tensorflow-cpu and pyarrow; EPOCHS 20; LR 0.002
#
# tokens/s count real tokens only (not padding), median over the epochs after the first (the
# first includes Keras's tracing and ringflow's first read of the data); Keras pads every
# sentence to the longest of the training split, ringflow each batch to its own longest, with
# length buckets. Both report the test token accuracy and entity precision/recall/F1 with
# CoNLL's rules after the last epoch.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ]; then
    echo "usage: benches/ner_vs_keras.sh BIN [REPEATS] [PYTHON] [EPOCHS] [LR]" >&2
    exit 2
fi
BIN="$1" REPEATS="${2:-3}" PY="${3:-python3}" EPOCHS="${4:-20}" LR="${5:-0.002}"
[ -x "$BIN" ] || { echo "$BIN is not an executable" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# ringflow EXAMPLE on EXECUTORS executors: "tokens_per_s padding accuracy f1 precision recall".
ringflow() {
    local example="$1" executors="$2" out="$WORK/summary.json"
    shift 2
    "$BIN" local "examples/$example.toml" --executors "$executors" --ui off \
        --set "cluster.checkpoint_dir=$WORK/run" --summary-json "$out" "$@" >/dev/null 2>&1
    "$PY" - "$out" <<'PYEOF'
import json, statistics, sys
s = json.load(open(sys.argv[1]))
rates = [e["tokens"] / e["seconds"] for e in s["history"]]
later = rates[1:] or rates
print(f"{statistics.median(later):.0f} {s['padding_fraction']:.3f} {s['test_accuracy']:.4f} "
      f"{s.get('test_entity_f1', 0):.4f} {s.get('test_entity_precision', 0):.4f} "
      f"{s.get('test_entity_recall', 0):.4f}")
PYEOF
    rm -rf "$WORK/run" "$out"
}

keras() {
    "$PY" benches/keras_ner.py --batch 32 --epochs "$EPOCHS" --lr "$LR" "$@" 2>/dev/null | tail -1 |
        sed -E 's/.*tokens_per_s=([0-9]+).*padding=([0-9.]+) test_accuracy=([0-9.]+)( entity_precision=([0-9.]+) entity_recall=([0-9.]+) entity_f1=([0-9.]+))?.*/\1 \2 \3 \7 \5 \6/'
}

SETTINGS=(--set "train.epochs=$EPOCHS" --set "train.optimizer.lr=$LR")
RESULTS="$WORK/results"
echo "BiLSTM tagger, entities, $EPOCHS epochs, Adam lr $LR, batch 32, 1 executor"
echo "(tokens/s padding token_accuracy entity_f1 precision recall)"
for i in $(seq 1 "$REPEATS"); do
    r=$(ringflow ner_bilstm 1 "${SETTINGS[@]}")
    k=$(keras --label tags)
    echo "run $i: ringflow $r; keras $k"
    echo "$r | $k" >>"$RESULTS"
done
"$PY" - "$RESULTS" <<'PYEOF'
import statistics, sys
rows = [line.split("|") for line in open(sys.argv[1])]
r = [list(map(float, a.split())) for a, _ in rows]
k = [list(map(float, b.split())) for _, b in rows]
med = lambda xs, i: statistics.median(x[i] for x in xs)
print(f"median tokens/s: ringflow {med(r, 0):.0f}, keras {med(k, 0):.0f}, ratio {med(r, 0) / med(k, 0):.2f}")
print(f"padding: ringflow {med(r, 1):.3f}, keras {med(k, 1):.3f}")
print(f"token accuracy: ringflow {med(r, 2):.4f}, keras {med(k, 2):.4f}")
print(f"entity F1: ringflow {med(r, 3):.4f}, keras {med(k, 3):.4f}")
PYEOF

echo "BiLSTM tagger on 2 executors (same settings):"
echo "  ringflow $(ringflow ner_bilstm 2 "${SETTINGS[@]}")"
echo "Part-of-speech tagger (examples/pos_tagger.toml as it is, and Keras at its settings):"
echo "  ringflow $(ringflow pos_tagger 1)"
echo "  keras $(keras --label pos --epochs 10 --lr 0.005)"
echo "Transformer tagger (examples/ner_transformer.toml as it is):"
echo "  ringflow $(ringflow ner_transformer 1)"
