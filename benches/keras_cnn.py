"""The TensorFlow/Keras peer for ringflow's CNN throughput (issue 17's LeNet-style network).

    python3 benches/keras_cnn.py --batch 64 --epochs 2

Same data (MNIST from the shipped Parquet, pixels / 255), same model (conv 5x5 32 - max pool 2 -
conv 5x5 64 - max pool 2 - dense 128 ReLU - dense 10; 'valid' padding, Keras' default), Adam
(lr 1e-3), softmax cross-entropy, batch 64, on the CPU (oneDNN, channels-last as Keras lays
images out). Prints training samples/s of the epochs after the first (which includes tracing),
comparable to ringflow's `train_samples_per_s` of its later epochs, and the test accuracy.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from mnist_parquet import load
import tensorflow as tf
from keras_rate import Rate

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--train", default="examples/data/mnist/train.parquet")
parser.add_argument("--test", default="examples/data/mnist/test.parquet")
parser.add_argument("--mixed-bfloat16", action="store_true",
                    help="Keras's mixed_bfloat16 policy (bf16 compute, f32 weights)")
args = parser.parse_args()
if args.mixed_bfloat16:
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")


x, y = load(args.train)
xt, yt = load(args.test)
tf.keras.utils.set_random_seed(42)
model = tf.keras.Sequential([
    tf.keras.Input((28, 28, 1)),
    tf.keras.layers.Conv2D(32, 5, activation="relu"),
    tf.keras.layers.MaxPooling2D(2),
    tf.keras.layers.Conv2D(64, 5, activation="relu"),
    tf.keras.layers.MaxPooling2D(2),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dense(10, dtype="float32"),
])
model.compile(
    optimizer=tf.keras.optimizers.Adam(1e-3),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)


rate = Rate(len(x))
model.fit(x, y, batch_size=args.batch, epochs=args.epochs, shuffle=True, verbose=0, callbacks=[rate])
_, acc = model.evaluate(xt, yt, batch_size=1000, verbose=0)
later = rate.rates[1:] or rate.rates
print(f"keras cnn batch={args.batch} samples_per_s={sum(later) / len(later):.0f} "
      f"epochs={[round(r) for r in rate.rates]} test_accuracy={acc:.4f}")
