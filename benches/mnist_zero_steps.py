"""How many steps of depth the first layer of an MLP on MNIST skips (README, "Products skip the
steps of depth where a packed panel of `a` is all zero"): the share of all-zero steps in the
8-row panels the packed GEMM makes of its `a` operand.

    python3 benches/mnist_zero_steps.py [--batches 20] [--batch 256]

Forward (`x · W1`): `a` is the batch, a panel is 8 images, a step one pixel of the 8. Weight
gradient (`xᵀ · dH1`): `a` is the batch transposed, a panel is 8 neighbouring pixels, a step one
image's 8 pixels. Random batches of the training split, as an epoch draws them.
"""

import argparse

import numpy as np
import pyarrow.parquet as pq

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="examples/data/mnist/train.parquet")
parser.add_argument("--batches", type=int, default=20)
parser.add_argument("--batch", type=int, default=256)
args = parser.parse_args()

table = pq.read_table(args.data, columns=["image"])
x = np.stack(table.column("image").to_numpy(zero_copy_only=False))
pixels = x.shape[1]
rows = np.random.default_rng(0).permutation(len(x))[: args.batches * args.batch]
batches = x[rows].reshape(args.batches, args.batch, pixels)
forward = (batches.reshape(args.batches, args.batch // 8, 8, pixels) == 0).all(axis=2).mean()
usable = pixels // 8 * 8
groups = batches[:, :, :usable].reshape(args.batches, args.batch, usable // 8, 8)
gradient = (groups == 0).all(axis=3).mean()
print(f"zero pixels {np.mean(x == 0):.3f}; zero steps forward {forward:.3f}, "
      f"weight gradient {gradient:.3f} ({args.batches} batches of {args.batch})")
