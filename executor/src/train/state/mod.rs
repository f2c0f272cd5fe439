//! A training run's state and where it is kept: the in-memory [`CommittedState`] that elastic
//! training goes back to when the ring breaks, and the checkpoint on disk or in an object store
//! ([`Checkpoints`]) that `--resume`, `eval` and `predict` read.

mod checkpoint;
mod commit;

pub use checkpoint::Checkpoints;
pub use commit::CommittedState;
