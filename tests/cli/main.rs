//! End-to-end tests of the `ringflow` binary: real processes, real Parquet, real data.

mod backup;
mod chaos;
mod cnn;
mod compression;
#[cfg(feature = "cuda")]
mod cuda;
mod data;
mod data_limits;
mod deploy;
mod distributed;
mod errors;
mod fusion;
mod helpers;
mod history;
mod images;
mod ingest;
mod listeners;
mod load;
mod lost;
mod memory;
mod models;
mod observe;
mod outputs;
mod precision;
mod process;
mod recovery;
mod s3;
mod security;
mod sequences;
mod shared_memory;
mod standalone;
mod status;
mod train;
mod ui;
mod ui_hosts;
