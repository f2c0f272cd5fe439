"""The peer for `ringflow bench allreduce`: OpenMPI's MPI_Allreduce over TCP, via mpi4py.

    mpirun --allow-run-as-root --oversubscribe -np N --mca btl tcp,self \
        python3 benches/mpi_allreduce.py --size-mb 64 --iters 10

Prints one line in the same format as ringflow's (median time; nccl-tests definitions:
algbw = bytes / time, busbw = algbw * 2(N-1)/N).
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--size-mb", type=float, default=64.0)
parser.add_argument("--iters", type=int, default=10)
parser.add_argument("--warmup", type=int, default=3)
args = parser.parse_args()

comm = MPI.COMM_WORLD
n = comm.Get_size()
floats = int(round(args.size_mb * 1048576 / 4))
send = np.full(floats, 0.5, dtype=np.float32)
recv = np.empty_like(send)
for _ in range(args.warmup):
    comm.Allreduce(send, recv, op=MPI.SUM)
times = []
for _ in range(args.iters):
    comm.Barrier()
    start = time.perf_counter()
    comm.Allreduce(send, recv, op=MPI.SUM)
    times.append(time.perf_counter() - start)
# Each rank's median; report rank 0's, as ringflow does.
times.sort()
median = times[len(times) // 2]
if comm.Get_rank() == 0:
    nbytes = floats * 4
    algbw = nbytes / median / 1e9
    busbw = algbw * 2 * (n - 1) / n
    print(
        f"mpi_allreduce ranks={n} bytes={nbytes} time_ms={median * 1e3:.3f} "
        f"algbw_GBps={algbw:.3f} busbw_GBps={busbw:.3f}"
    )
