"""The TensorFlow/Keras peer for ringflow's sequence tagging (issue 18's BiLSTM tagger).

    python3 benches/keras_ner.py --batch 32 --epochs 10 [--lr 0.001] [--label tags|pos]

Same data (the shipped Hironsan corpus, `examples/data/hironsan-ner/`), same model (embedding 64
over the training split's vocabulary with padding id 0 and unknown id 1, bidirectional LSTM 128
returning every step, dense to the tag classes), Adam (`--lr`, default 1e-3), softmax cross-entropy averaged
over the real tokens (padding masked by `mask_zero`), on the CPU. As a static graph usually
does, every sentence is padded to the longest one of the training split. Prints the training
tokens/s of the epochs after the first (which includes tracing), counting real tokens only (as
ringflow's `train_tokens_per_s`), the padding fraction, the test token accuracy and, for IOB2
tags, the test entity precision, recall and F1 with conlleval's chunk rules.
"""

import argparse
import collections
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pyarrow.parquet as pq
import tensorflow as tf
from keras_rate import Rate

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--label", default="tags", help="tags (entities) or pos (parts of speech)")
parser.add_argument("--train", default="examples/data/hironsan-ner/train.parquet")
parser.add_argument("--test", default="examples/data/hironsan-ner/test.parquet")
args = parser.parse_args()


def read(path):
    table = pq.read_table(path, columns=["tokens", args.label])
    return table.column("tokens").to_pylist(), table.column(args.label).to_pylist()


tokens, labels = read(args.train)
test_tokens, test_labels = read(args.test)
counts = collections.Counter(t for sentence in tokens for t in sentence)
# Most frequent first, ties by text: the order ringflow's vocabulary uses.
vocab = {t: i + 2 for i, (t, _) in enumerate(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))}
classes = sorted({tag for sentence in labels for tag in sentence})
class_id = {c: i for i, c in enumerate(classes)}
longest = max(len(s) for s in tokens)


def pad(sentences, tags):
    x = np.zeros((len(sentences), longest), np.int32)
    y = np.zeros((len(sentences), longest), np.int32)
    for i, (s, t) in enumerate(zip(sentences, tags)):
        s, t = s[:longest], t[:longest]
        x[i, : len(s)] = [vocab.get(w, 1) for w in s]
        y[i, : len(t)] = [class_id.get(c, 0) for c in t]
    return x, y


x, y = pad(tokens, labels)
xt, yt = pad(test_tokens, test_labels)
real_tokens = sum(len(s) for s in tokens)
padding = 1.0 - real_tokens / x.size

tf.keras.utils.set_random_seed(42)
model = tf.keras.Sequential([
    tf.keras.Input((longest,), dtype="int32"),
    tf.keras.layers.Embedding(len(vocab) + 2, 64, mask_zero=True),
    tf.keras.layers.Bidirectional(tf.keras.layers.LSTM(128, return_sequences=True)),
    tf.keras.layers.Dense(len(classes)),
])
model.compile(
    optimizer=tf.keras.optimizers.Adam(args.lr),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
)


def chunks(tags):
    """conlleval's entities of one sentence: (start, end, type) per chunk."""
    found, open_ = [], None
    for i, tag in enumerate(tags + ["O"]):
        kind = tag[2:] if tag[:2] in ("B-", "I-") else None
        continues = tag.startswith("I-") and open_ is not None and open_[1] == kind
        if continues:
            continue
        if open_ is not None:
            found.append((open_[0], i, open_[1]))
        open_ = (i, kind) if kind is not None else None
    return found


rate = Rate(real_tokens)
model.fit(x, y, batch_size=args.batch, epochs=args.epochs, shuffle=True, verbose=0, callbacks=[rate])
predicted = model.predict(xt, batch_size=256, verbose=0).argmax(-1)
right = total = correct = n_pred = n_gold = 0
for s, gold, p in zip(test_tokens, test_labels, predicted):
    guess = [classes[k] for k in p[: len(s)]]
    gold = gold[: len(s)]
    right += sum(g == q for g, q in zip(gold, guess))
    total += len(gold)
    g_chunks, p_chunks = set(chunks(gold)), set(chunks(guess))
    correct += len(g_chunks & p_chunks)
    n_pred += len(p_chunks)
    n_gold += len(g_chunks)
precision = correct / n_pred if n_pred else 0.0
recall = correct / n_gold if n_gold else 0.0
f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
later = rate.rates[1:] or rate.rates
iob2 = all(c == "O" or c[:2] in ("B-", "I-") for c in classes)
entities = (
    f" entity_precision={precision:.4f} entity_recall={recall:.4f} entity_f1={f1:.4f}" if iob2 else ""
)
print(
    f"keras bilstm label={args.label} batch={args.batch} tokens_per_s={np.median(later):.0f} "
    f"epochs={[round(r) for r in rate.rates]} padding={padding:.3f} "
    f"test_accuracy={right / total:.4f}{entities}"
)
