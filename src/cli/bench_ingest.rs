//! `ringflow bench ingest PATH`: Parquet to `f32` batches as training reads them, timed.

use std::process::ExitCode;

use clap::Args;
use ringflow_driver::planner::split::Split;
use ringflow_driver::planner::{assign, discover, footer};
use ringflow_executor::worker::ingest::{self, IngestReport, IngestSpec};

#[derive(Args)]
pub struct IngestArgs {
    /// A Parquet file, directory or glob; a local path or an object-store URL.
    path: String,

    /// Feature columns, comma-separated (default: every column of numbers or lists of numbers,
    /// but the label).
    #[arg(long, value_delimiter = ',')]
    columns: Vec<String>,

    /// A column read as the label, besides the features.
    #[arg(long)]
    label: Option<String>,

    /// Rows per batch.
    #[arg(long, default_value_t = 128)]
    batch: usize,
}

pub fn run(args: IngestArgs) -> anyhow::Result<ExitCode> {
    let listing = discover::files("PATH", &args.path)?;
    anyhow::ensure!(
        !listing.files.is_empty(),
        "PATH: {} holds no Parquet files",
        args.path
    );
    let split = footer::read_footers("PATH", &listing.files)?;
    let features = if args.columns.is_empty() {
        default_columns(&split, args.label.as_deref())
    } else {
        args.columns.clone()
    };
    anyhow::ensure!(
        !features.is_empty(),
        "{} has no column of numbers or lists of numbers to read (name some with --columns)",
        listing.files[0]
    );
    let mut read = features.clone();
    read.extend(args.label.clone());
    check_columns(&split, &read)?;
    let bytes = footer::column_bytes(&split, &read);
    let partitions = assign::evaluation(&split.groups, 1)
        .pop()
        .map(|plan| plan.partitions)
        .unwrap_or_default();
    let report = ingest::measure(&IngestSpec {
        partitions,
        features: features.clone(),
        label: args.label.clone(),
        batch: args.batch,
    })?;
    println!("{}", line(&listing.files, &read, bytes, &report));
    Ok(ExitCode::SUCCESS)
}

/// Fails unless every file has every column of `columns` (even a file without rows).
fn check_columns(split: &Split, columns: &[String]) -> anyhow::Result<()> {
    for (file, schema) in &split.schemas {
        if let Some(missing) = columns.iter().find(|c| schema.index_of(c).is_err()) {
            let have: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            anyhow::bail!(
                "{file} has no column `{missing}` (its columns: {})",
                have.join(", ")
            );
        }
    }
    Ok(())
}

/// Every column of the first file that can be a feature, but the label.
fn default_columns(split: &Split, label: Option<&str>) -> Vec<String> {
    let Some((_, schema)) = split.schemas.first() else {
        return Vec::new();
    };
    schema
        .fields()
        .iter()
        .filter(|f| Some(f.name().as_str()) != label)
        .filter(|f| footer::feature_width(f.data_type()).is_ok())
        .map(|f| f.name().clone())
        .collect()
}

/// The `key=value` line of a report.
fn line(files: &[String], columns: &[String], bytes: u64, r: &IngestReport) -> String {
    let seconds = r.seconds.max(1e-9);
    format!(
        "ingest files={} columns={} rows={} width={} batches={} seconds={:.3} rows_per_s={:.0} \
         bytes={bytes} MB_per_s={:.1}",
        files.len(),
        columns.join(","),
        r.rows,
        r.width,
        r.batches,
        r.seconds,
        r.rows as f64 / seconds,
        bytes as f64 / 1e6 / seconds,
    )
}
