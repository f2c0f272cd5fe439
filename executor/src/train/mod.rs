//! The train loop that every executor runs, alone or as one rank of many.
//!
//! A [`Trainer`] builds the model from the job spec, makes every replica start from rank 0's
//! weights, then for each epoch asks its [`TaskContext`] (the driver) for this rank's
//! partitions, streams them through the shuffle buffer, and runs forward, backward, gradient
//! averaging through the [`Collective`], and the optimizer step. After training it evaluates its
//! share of the test split, and rank 0 saves the model. [`sync`] is how a step's gradients
//! become common: ring all-reduce, or backup workers. [`state`] is what a run keeps to go back
//! to (the elastic commit, checkpoints). [`timeline`] records each step's phases for
//! `--timeline`.
//!
//! [`Collective`]: crate::collective::Collective

pub mod autotune;
mod context;
mod eval;
pub(crate) mod forward;
pub mod fusion;
pub mod hooks;
mod numerics;
mod report;
pub mod setup;
pub mod state;
pub mod sync;
pub mod timeline;
mod trainer;

pub use context::{EpochStats, EvalStats, PhaseTimes, Recovered, Split, TaskContext, TrainEvent};
pub use eval::evaluate;
pub use numerics::task_numerics;
pub use report::Report;
pub use trainer::{
    EpochEnd, Position, ReformCause, TrainOutcome, TrainTask, Trainer, label_kind, run_task,
};

/// Runs `f` with a compute pool of `threads` threads (GEMM and other data-parallel kernels use
/// the current pool), so that executors sharing a machine do not oversubscribe its cores.
pub fn with_compute_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|i| format!("ringflow-compute-{i}"))
        .build()
    {
        Ok(pool) => pool.install(f),
        Err(_) => f(),
    }
}
