//! `ringflow sql`: a DataFusion query over Parquet, CSV or JSON tables on any store, printed as a
//! table or written as Parquet.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use datafusion::dataframe::DataFrameWriteOptions;
use ringflow_core::data::deadline::block_on_timeout;
use ringflow_core::data::{Location, sql};

#[derive(Args)]
pub struct SqlArgs {
    /// The query, e.g. "SELECT label, count(*) FROM train GROUP BY label ORDER BY label".
    query: String,

    /// A table the query reads: NAME=PATH (a Parquet, CSV or JSON file, directory, glob or URL).
    #[arg(long = "table", value_name = "NAME=PATH")]
    tables: Vec<String>,

    /// Write the result as Parquet here (a file path or URL) instead of printing it.
    #[arg(long, value_name = "PATH")]
    output: Option<String>,

    /// Stop the query after this many seconds (reading the tables and writing the output
    /// included) and fail, naming the limit.
    #[arg(long, value_name = "SECS", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_S))]
    timeout: u64,
}

/// The longest `--timeout`: a week.
const MAX_TIMEOUT_S: u64 = 7 * 24 * 3600;

pub fn run(args: SqlArgs) -> anyhow::Result<ExitCode> {
    let mut tables = Vec::new();
    for t in &args.tables {
        let (name, path) = t
            .split_once('=')
            .filter(|(n, p)| !n.trim().is_empty() && !p.trim().is_empty())
            .with_context(|| format!("--table {t}: expected NAME=PATH"))?;
        tables.push((name.trim().to_string(), path.trim().to_string()));
    }
    if let Some(out) = &args.output {
        Location::parse(out)?;
    }
    let SqlArgs {
        query,
        output,
        timeout,
        ..
    } = args;
    let limit = Duration::from_secs(timeout);
    // Past the limit the query is dropped, which stops DataFusion and removes an unfinished
    // output.
    let printed = block_on_timeout(limit, async move {
        let ctx = sql::session(None);
        for (name, path) in &tables {
            let skipped = sql::register_table(&ctx, name, path).await.map_err(|e| {
                ringflow_core::data::DataError::new(format!("--table {name}"), e.to_string())
            })?;
            for skipped in skipped {
                eprintln!("warning: table `{name}`: {skipped}");
            }
        }
        let fail = |e: datafusion::error::DataFusionError| {
            ringflow_core::data::DataError::new("query", sql::df_message(&e))
        };
        let df = ctx.sql(&query).await.map_err(fail)?;
        match output {
            Some(out) => {
                let location = Location::parse(&out)?;
                let target = match location.local_path() {
                    Some(p) => p.display().to_string(),
                    None => location.url().to_string(),
                };
                let written = df
                    .write_parquet(
                        &target,
                        DataFrameWriteOptions::new().with_single_file_output(true),
                        None,
                    )
                    .await
                    .map_err(fail)?;
                let rows: u64 = count_rows(&written);
                Ok(format!("wrote {rows} rows to {out}\n"))
            }
            None => {
                let batches = df.collect().await.map_err(fail)?;
                let table = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                    .map_err(|e| ringflow_core::data::DataError::new("query", e.to_string()))?;
                let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
                Ok(format!("{table}\n{rows} rows\n"))
            }
        }
    })
    .map_err(|_| {
        anyhow::anyhow!(
            "query: did not finish within its time limit of {timeout} s (--timeout) and was \
             stopped; raise --timeout if it needs longer"
        )
    })?
    .map_err(|e: ringflow_core::data::DataError| anyhow::anyhow!("{e}"))?;
    print!("{printed}");
    Ok(ExitCode::SUCCESS)
}

/// The row count that DataFusion's writers report (a one-column `count` batch).
fn count_rows(batches: &[datafusion::arrow::record_batch::RecordBatch]) -> u64 {
    use datafusion::arrow::array::{Array, UInt64Array};
    batches
        .iter()
        .filter_map(|b| b.column(0).as_any().downcast_ref::<UInt64Array>().cloned())
        .map(|a| (0..a.len()).map(|i| a.value(i)).sum::<u64>())
        .sum()
}
