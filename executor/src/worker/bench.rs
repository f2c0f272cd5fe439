//! `ringflow bench allreduce`: timed ring all-reduces, or a check of every collective.

use std::time::Instant;

use ringflow_core::pb;

use crate::collective::{Collective, ReduceOp};
use crate::error::{CommError, CommOp, ExecutorError, Peer, Result};

/// Runs `spec.warmup` untimed and `spec.iters` timed all-reduces of `spec.floats` floats;
/// returns each timed one's seconds. A barrier before each keeps the ranks in step, so that a
/// time measures the all-reduce rather than a rank's late start. With `spec.check`, verifies the
/// collectives instead and returns no times.
pub fn all_reduce(comm: &mut dyn Collective, spec: &pb::BenchSpec) -> Result<Vec<f64>> {
    if spec.check {
        check(comm, spec.floats as usize)?;
        return Ok(Vec::new());
    }
    // The buffer moves to the communication thread and back, as gradient buckets do in
    // training: nothing is copied or allocated per operation.
    let mut buf: Vec<f32> = (0..spec.floats).map(|i| (i % 97) as f32 * 0.01).collect();
    for _ in 0..spec.warmup {
        buf = comm.start_all_reduce(buf, ReduceOp::Average)?.wait()?;
    }
    // Grown as the all-reduces are timed, never reserved from the request's count.
    let mut seconds = Vec::new();
    for _ in 0..spec.iters {
        comm.barrier()?;
        let start = Instant::now();
        buf = comm.start_all_reduce(buf, ReduceOp::Average)?.wait()?;
        seconds.push(start.elapsed().as_secs_f64());
    }
    Ok(seconds)
}

/// Rank `k`'s test data: small integers, so that every sum is exact in f32 whatever the order
/// of additions, and a bitwise comparison with the serial sum is fair.
pub fn rank_data(k: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((k * 7919 + i * 31 + (i >> 7) * 13) % 1001) as f32 - 500.0)
        .collect()
}

/// `op` (`what`) gave `got` at index `i` where the serial computation gives `want`.
fn mismatch(op: CommOp, what: &str, i: usize, got: f32, want: f32) -> ExecutorError {
    let why =
        format!("{what} is wrong at index {i}: got {got}, the serial computation gives {want}");
    CommError::new(Peer::Ring, op, why).into()
}

/// Checks all-reduce (sum and average), broadcast and all-gather against serial computations.
pub fn check(comm: &mut dyn Collective, len: usize) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world());
    let mut want = vec![0.0f32; len];
    for k in 0..world {
        for (w, v) in want.iter_mut().zip(rank_data(k, len)) {
            *w += v;
        }
    }
    let mut buf = rank_data(rank, len);
    comm.all_reduce(&mut buf, ReduceOp::Sum)?;
    if let Some(i) = (0..len).find(|&i| buf[i].to_bits() != want[i].to_bits()) {
        return Err(mismatch(
            CommOp::AllReduce,
            "the all-reduce sum",
            i,
            buf[i],
            want[i],
        ));
    }
    let mut buf = rank_data(rank, len);
    comm.all_reduce(&mut buf, ReduceOp::Average)?;
    let scale = 1.0 / world as f32;
    if let Some(i) =
        (0..len).find(|&i| (buf[i] - want[i] * scale).abs() > 1e-4 * want[i].abs().max(1.0))
    {
        return Err(mismatch(
            CommOp::AllReduce,
            "the all-reduce average",
            i,
            buf[i],
            want[i] * scale,
        ));
    }
    let root = world - 1;
    let mut buf = if rank == root {
        rank_data(root, len)
    } else {
        vec![f32::NAN; len]
    };
    comm.broadcast(&mut buf, root)?;
    let expect = rank_data(root, len);
    if let Some(i) = (0..len).find(|&i| buf[i].to_bits() != expect[i].to_bits()) {
        return Err(mismatch(
            CommOp::Broadcast,
            "the broadcast",
            i,
            buf[i],
            expect[i],
        ));
    }
    let piece = len.min(1000);
    let gathered = comm.all_gather(&rank_data(rank, piece))?;
    let expect: Vec<f32> = (0..world).flat_map(|k| rank_data(k, piece)).collect();
    if let Some(i) = (0..expect.len()).find(|&i| gathered[i].to_bits() != expect[i].to_bits()) {
        return Err(mismatch(
            CommOp::AllGather,
            "the all-gather",
            i,
            gathered[i],
            expect[i],
        ));
    }
    comm.barrier()
}
