//! # ringflow-driver: planning, scheduling and watching jobs
//!
//! The driver owns a job from submission to summary. Its [`planner`] checks the spec, lists the
//! data and reads Parquet footers (never rows) to split each epoch into per-rank partitions; its
//! [`scheduler`] registers executors, holds the rendezvous, assigns ranks and watches health;
//! [`service`] serves both over gRPC; [`progress`] combines the executors' reports into epochs
//! and a final [`summary`]; [`events`] writes each job's event log and folds it back into a
//! [`events::history::History`] for `ringflow history`; [`figures`] shows the figures of
//! token-sequence jobs (tokens/s, padding, entity F1); [`observe`] follows a running job's
//! event stream for a client (progress on stderr, TensorBoard files, a Chrome trace);
//! [`outputs`] checks where a job writes before any executor starts, and locks it while the job
//! runs.

pub mod error;
pub mod events;
pub mod figures;
pub mod observe;
pub mod outputs;
pub mod planner;
pub mod progress;
pub mod scheduler;
pub mod service;
mod shared;
pub mod summary;
mod tls;
mod ui;
pub mod work;

pub use error::{DriverError, Result};
pub use planner::JobPlan;
pub use summary::{BenchSummary, JobStatus, JobSummary};
pub use work::JobWork;
