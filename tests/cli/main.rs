//! End-to-end tests of the `ringflow` binary: real processes, real Parquet, real data.

mod distributed;
mod errors;
mod helpers;
mod train;
