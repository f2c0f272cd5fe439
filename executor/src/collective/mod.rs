//! Collective operations among the executors of one job.
//!
//! [`Collective`] is what the train loop needs from its peers: all-reduce (sum or average),
//! broadcast, all-gather and barrier over f32 buffers. [`Solo`] is the world of one, where every
//! collective is the identity; [`Broken`] is a ring that could not be connected, where every
//! collective fails; [`RingCollective`] connects the executors of a job in a ring over
//! raw TCP and runs Horovod's bandwidth-optimal ring algorithms on a background communication
//! thread ([`ring`]), accepting its peers on a [`RingListener`]. With backup workers the ring also carries star connections to rank 0,
//! whose aggregator averages each step's first N−b gradients ([`backup`]). With the `nccl`
//! feature, rings whose ranks all train on GPUs of one host average gradients on the devices
//! (`nccl`). Ranks that share a host all-reduce through shared memory instead, and jobs spanning
//! several hosts hierarchically ([`host`], [`shm`]).

mod algorithms;
mod backup;
mod compressed;
mod handshake;
pub mod host;
mod listener;
#[cfg(feature = "nccl")]
mod nccl;
mod ring;
pub mod shm;
mod wire;

#[cfg(test)]
mod fuzz;

pub use backup::{BackupReduce, StepResult};
pub use handshake::JobSecret;
pub use host::{HostCollective, HostConfig};
pub use listener::RingListener;
#[cfg(feature = "nccl")]
pub use nccl::NcclAllReduce;
pub use ring::{RingCollective, RingConfig};
pub use ringflow_core::spec::Compression;
pub use shm::host_identity;

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::error::{CommError, CommOp, ExecutorError, Peer, Result};

/// How an all-reduce combines the ranks' buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// Elementwise mean over the ranks.
    Average,
}

/// An all-reduce that was started and may still be running on the communication thread.
pub struct PendingReduce {
    state: PendingState,
}

enum PendingState {
    Ready(Result<Vec<f32>>),
    Waiting {
        reply: Receiver<Result<Vec<f32>>>,
        deadline: Duration,
    },
}

impl PendingReduce {
    /// A result that is already known.
    pub fn ready(result: Result<Vec<f32>>) -> Self {
        PendingReduce {
            state: PendingState::Ready(result),
        }
    }

    pub(crate) fn waiting(reply: Receiver<Result<Vec<f32>>>, deadline: Duration) -> Self {
        PendingReduce {
            state: PendingState::Waiting { reply, deadline },
        }
    }

    /// Blocks until the reduced buffer is back (or the collective's deadline passes).
    pub fn wait(self) -> Result<Vec<f32>> {
        match self.state {
            PendingState::Ready(r) => r,
            PendingState::Waiting { reply, deadline } => {
                let start = Instant::now();
                match reply.recv_timeout(deadline) {
                    Ok(r) => r,
                    Err(RecvTimeoutError::Timeout) => Err(CommError::new(
                        Peer::Ring,
                        CommOp::AllReduce,
                        format!(
                            "an all-reduce did not finish within {:.0} s",
                            start.elapsed().as_secs_f64()
                        ),
                    )
                    .into()),
                    Err(RecvTimeoutError::Disconnected) => Err(stopped(CommOp::AllReduce).into()),
                }
            }
        }
    }
}

/// Collective communication among `world()` ranks; every rank must make the same calls in the
/// same order with buffers of the same length.
pub trait Collective: Send {
    /// This executor's rank, `0..world()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world(&self) -> usize;

    /// Combines `buf` across all ranks in place.
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<()> {
        let reduced = self.start_all_reduce(buf.to_vec(), op)?.wait()?;
        buf.copy_from_slice(&reduced);
        Ok(())
    }

    /// Starts combining `buf` across all ranks and returns at once; operations complete in the
    /// order they were started. This is how gradient buckets overlap with the backward pass.
    fn start_all_reduce(&mut self, buf: Vec<f32>, op: ReduceOp) -> Result<PendingReduce>;

    /// [`Collective::start_all_reduce`] for gradients: a ring with `cluster.compression` sends
    /// them as 16-bit floats and sums them in f32, and every rank ends with the same values.
    /// Collectives without compression reduce them as f32.
    fn start_gradient_reduce(&mut self, buf: Vec<f32>, op: ReduceOp) -> Result<PendingReduce> {
        self.start_all_reduce(buf, op)
    }

    /// Replaces `buf` on every rank by `root`'s.
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<()>;

    /// Every rank's `mine`, concatenated in rank order (all of the same length).
    fn all_gather(&mut self, mine: &[f32]) -> Result<Vec<f32>>;

    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<()>;

    /// Backup-worker gradient aggregation, when the job has `cluster.backup_workers` and more
    /// than one rank.
    fn backup(&mut self) -> Option<&mut BackupReduce> {
        None
    }

    /// Closes the connections after a failure, so that peers still waiting learn of it at once;
    /// every later operation fails.
    fn close(&mut self) {}
}

/// The collective of a job with one executor.
#[derive(Clone, Copy, Debug, Default)]
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }

    fn world(&self) -> usize {
        1
    }

    fn start_all_reduce(&mut self, buf: Vec<f32>, _: ReduceOp) -> Result<PendingReduce> {
        Ok(PendingReduce::ready(Ok(buf)))
    }

    fn broadcast(&mut self, _: &mut [f32], _: usize) -> Result<()> {
        Ok(())
    }

    fn all_gather(&mut self, mine: &[f32]) -> Result<Vec<f32>> {
        Ok(mine.to_vec())
    }

    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A ring that could not be connected (`why`): rank `rank` of `world`, where every collective
/// fails with that error, so that an elastic task recovers from it like from a ring that broke
/// later.
#[derive(Clone, Debug)]
pub struct Broken {
    /// This executor's rank in the ring it could not connect.
    pub rank: usize,
    /// That ring's size.
    pub world: usize,
    /// The connection's error.
    pub why: CommError,
}

impl Broken {
    fn fail<T>(&self) -> Result<T> {
        Err(ExecutorError::Comm(self.why.clone()))
    }
}

/// The communication thread ended while `op` waited for it.
fn stopped(op: CommOp) -> CommError {
    CommError::new(Peer::Local, op, "the communication thread stopped")
}

impl Collective for Broken {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn start_all_reduce(&mut self, _: Vec<f32>, _: ReduceOp) -> Result<PendingReduce> {
        self.fail()
    }

    fn broadcast(&mut self, _: &mut [f32], _: usize) -> Result<()> {
        self.fail()
    }

    fn all_gather(&mut self, _: &[f32]) -> Result<Vec<f32>> {
        self.fail()
    }

    fn barrier(&mut self) -> Result<()> {
        self.fail()
    }
}
