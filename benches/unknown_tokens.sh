#!/usr/bin/env bash
# Issue 41, item 5: the shipped taggers (examples/ner_bilstm.toml, pos_tagger.toml,
# ner_transformer.toml) on the shipped Japanese corpus with <unk> untrained
# (data.vocab.singleton_unk = 0, the behaviour before) and trained (the default, 0.5), and with
# data.vocab.min_count = 2: test token accuracy, entity F1 (the NER taggers) and the test
# split's share of tokens outside the vocabulary. Accuracy figures, not speed: any build of
# the binary gives them, and runs may overlap other work.
#
#   benches/unknown_tokens.sh BIN [SEEDS]      # SEEDS "42 7 1"
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ]; then
    echo "usage: benches/unknown_tokens.sh BIN [SEEDS]" >&2
    exit 2
fi
BIN="$1" SEEDS="${2:-42 7 1}"
[ -x "$BIN" ] || { echo "$BIN is not an executable" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# One run: "accuracy f1 unknown_rate".
run() {
    local example="$1" seed="$2" out="$WORK/summary.json"
    shift 2
    "$BIN" local "examples/$example.toml" --executors 1 --ui off --set "train.seed=$seed" \
        --set "cluster.checkpoint_dir=$WORK/run-$RANDOM" --summary-json "$out" "$@" >/dev/null 2>&1
    python3 - "$out" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{s['test_accuracy']:.4f} {s.get('test_entity_f1', float('nan')):.4f} "
      f"{s.get('test_unknown_token_rate', float('nan')):.4f}")
PYEOF
}

printf '%-16s %-28s %5s %9s %9s %9s\n' example setting seed accuracy entity_f1 unk_rate
for example in ner_bilstm pos_tagger ner_transformer; do
    for seed in $SEEDS; do
        for setting in "data.vocab.singleton_unk=0" "data.vocab.singleton_unk=0.5" "data.vocab.min_count=2"; do
            read -r acc f1 unk < <(run "$example" "$seed" --set "$setting")
            printf '%-16s %-28s %5s %9s %9s %9s\n' "$example" "$setting" "$seed" "$acc" "$f1" "$unk"
        done
    done
done
