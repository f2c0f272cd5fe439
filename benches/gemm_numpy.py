"""The peer for ringflow's GEMM: numpy's matmul (OpenBLAS in the usual wheels) on the shapes of
benches/gemm_shapes.txt, timed like ml/examples/gemm_bench.rs (best of the repetitions within a
time budget, after a warm-up).

    python3 benches/gemm_numpy.py [--shapes benches/gemm_shapes.txt] [--seconds 0.3]

OpenBLAS uses every core by default (OPENBLAS_NUM_THREADS / OMP_NUM_THREADS limit it). A
transposed operand is a transposed view (`x.T`), which numpy hands to BLAS as a transposition
flag, without a copy, as ringflow reads it. Prints `name gflops` per shape.
"""

import argparse
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--shapes", default="benches/gemm_shapes.txt")
parser.add_argument("--seconds", type=float, default=0.3)
args = parser.parse_args()


def best_time(f, budget):
    f()
    start = time.perf_counter()
    best, runs = float("inf"), 0
    while runs < 3 or time.perf_counter() - start < budget:
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
        runs += 1
    return best


rng = np.random.default_rng(0)
for line in open(args.shapes):
    line = line.split("#")[0].split()
    if not line:
        continue
    name, m, k, n, a_t, b_t = line[0], *map(int, line[1:])
    a = rng.uniform(-0.5, 0.5, (k, m) if a_t else (m, k)).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, (n, k) if b_t else (k, n)).astype(np.float32)
    a = a.T if a_t else a
    b = b.T if b_t else b
    out = np.empty((m, n), dtype=np.float32)
    secs = best_time(lambda: np.matmul(a, b, out=out), args.seconds)
    print(f"{name} {2 * m * k * n / secs / 1e9:.1f}", flush=True)
