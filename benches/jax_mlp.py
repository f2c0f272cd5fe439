"""The peer for ringflow's MLP throughput: the same MLP, plain SGD and batch in JAX (XLA, CPU).

    python3 benches/jax_mlp.py --layers 784,100,10 --batch 128 --epochs 3

Reads MNIST from the same Parquet file (pyarrow), trains with softmax cross-entropy and plain
SGD (lr 0.05), and prints training samples/s over the epochs after the first (which includes
XLA compilation), comparable to ringflow's samples/s of its later epochs, and over the whole
run (`whole_run_samples_per_s`: every epoch, compilation included, the data already in memory),
comparable to ringflow's `train_samples_per_s` (which includes epoch 1's first read of the data).

`--matmul-precision bfloat16` sets `jax_default_matmul_precision`, JAX's counterpart of
ringflow's `train.matmul_precision = "bf16"` (XLA on the CPU may keep f32 products).
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq

parser = argparse.ArgumentParser()
parser.add_argument("--layers", default="784,100,10")
parser.add_argument("--batch", type=int, default=128)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--data", default="examples/data/mnist/train.parquet")
parser.add_argument("--matmul-precision", default=None, choices=["bfloat16", "float32"])
args = parser.parse_args()
if args.matmul_precision:
    jax.config.update("jax_default_matmul_precision", args.matmul_precision)
layers = [int(x) for x in args.layers.split(",")]

table = pq.read_table(args.data, columns=["image", "label"])
x = np.stack(table.column("image").to_numpy(zero_copy_only=False)).astype(np.float32) / 255.0
y = table.column("label").to_numpy().astype(np.int32)

key = jax.random.PRNGKey(42)
params = []
for fan_in, fan_out in zip(layers[:-1], layers[1:]):
    key, sub = jax.random.split(key)
    bound = (6.0 / fan_in) ** 0.5
    params.append((jax.random.uniform(sub, (fan_in, fan_out), minval=-bound, maxval=bound), jnp.zeros(fan_out)))


def loss_fn(params, xb, yb):
    h = xb
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = jax.nn.relu(h)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(h), yb[:, None], axis=1))


@jax.jit
def step(params, xb, yb):
    loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
    return [(w - 0.05 * gw, b - 0.05 * gb) for (w, b), (gw, gb) in zip(params, grads)], loss


rng = np.random.default_rng(0)
steps = len(x) // args.batch
rates = []
for epoch in range(args.epochs):
    order = rng.permutation(len(x))
    start = time.perf_counter()
    for s in range(steps):
        idx = order[s * args.batch:(s + 1) * args.batch]
        params, loss = step(params, x[idx], y[idx])
    loss.block_until_ready()
    rates.append(steps * args.batch / (time.perf_counter() - start))
later = rates[1:] or rates
whole = len(rates) * steps * args.batch / sum(steps * args.batch / r for r in rates)
print(f"jax layers={args.layers} batch={args.batch} samples_per_s={sum(later) / len(later):.0f} "
      f"whole_run_samples_per_s={whole:.0f} epochs={[round(r) for r in rates]}")
