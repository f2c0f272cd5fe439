"""The JAX peer for ringflow's CNN throughput (issue 17's LeNet-style network).

    python3 benches/jax_cnn.py --batch 64 --epochs 2

Same data, model, Adam (lr 1e-3, written out: no optax needed) and batch as
`benches/keras_cnn.py`, jit-compiled by XLA on the CPU with channels-last images. Prints training
samples/s of the epochs after the first (which includes compilation) and the test accuracy.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from mnist_parquet import load

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--train", default="examples/data/mnist/train.parquet")
parser.add_argument("--test", default="examples/data/mnist/test.parquet")
parser.add_argument("--matmul-precision", default=None, choices=["bfloat16", "float32"])
args = parser.parse_args()
if args.matmul_precision:
    jax.config.update("jax_default_matmul_precision", args.matmul_precision)


x, y = load(args.train)
xt, yt = load(args.test)
DN = ("NHWC", "HWIO", "NHWC")


def uniform(key, shape, fan_in):
    bound = (6.0 / fan_in) ** 0.5
    return jax.random.uniform(key, shape, minval=-bound, maxval=bound)


keys = jax.random.split(jax.random.PRNGKey(42), 4)
params = {
    "c1": (uniform(keys[0], (5, 5, 1, 32), 25), jnp.zeros(32)),
    "c2": (uniform(keys[1], (5, 5, 32, 64), 800), jnp.zeros(64)),
    "f1": (uniform(keys[2], (1024, 128), 1024), jnp.zeros(128)),
    "f2": (uniform(keys[3], (128, 10), 128), jnp.zeros(10)),
}


def pool(h):
    return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def forward(p, xb):
    h = jax.lax.conv_general_dilated(xb, p["c1"][0], (1, 1), "VALID", dimension_numbers=DN)
    h = pool(jax.nn.relu(h + p["c1"][1]))
    h = jax.lax.conv_general_dilated(h, p["c2"][0], (1, 1), "VALID", dimension_numbers=DN)
    h = pool(jax.nn.relu(h + p["c2"][1]))
    h = h.reshape(h.shape[0], -1)
    h = jax.nn.relu(h @ p["f1"][0] + p["f1"][1])
    return h @ p["f2"][0] + p["f2"][1]


def loss_fn(p, xb, yb):
    logits = forward(p, xb)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), yb[:, None], axis=1))


@jax.jit
def step(p, m, v, t, xb, yb):
    loss, g = jax.value_and_grad(loss_fn)(p, xb, yb)
    t = t + 1
    m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
    v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
    lr = 1e-3 * jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
    p = jax.tree_util.tree_map(lambda p, m, v: p - lr * m / (jnp.sqrt(v) + 1e-7), p, m, v)
    return p, m, v, t, loss


m = jax.tree_util.tree_map(jnp.zeros_like, params)
v = jax.tree_util.tree_map(jnp.zeros_like, params)
t = jnp.zeros((), jnp.float32)
rng = np.random.default_rng(0)
steps = len(x) // args.batch
rates = []
for epoch in range(args.epochs):
    order = rng.permutation(len(x))
    start = time.perf_counter()
    for s in range(steps):
        idx = order[s * args.batch:(s + 1) * args.batch]
        params, m, v, t, loss = step(params, m, v, t, x[idx], y[idx])
    loss.block_until_ready()
    rates.append(steps * args.batch / (time.perf_counter() - start))
predict = jax.jit(forward)
correct = sum(int((np.asarray(predict(params, xt[i:i + 1000])).argmax(1) == yt[i:i + 1000]).sum())
              for i in range(0, len(xt), 1000))
later = rates[1:] or rates
print(f"jax cnn batch={args.batch} samples_per_s={sum(later) / len(later):.0f} "
      f"epochs={[round(r) for r in rates]} test_accuracy={correct / len(xt):.4f}")
