//! SQL prep with DataFusion: the sessions, tables and query plans shared by the driver (which
//! plans a job's `data.sql` once to check it), the executors (which run it on their own
//! partitions) and `ringflow sql`.
//!
//! A job's query reads the table `input`, which is one partition of a split at a time, plus the
//! small lookup tables of `[data.tables]`. The driver plans the query against each split's
//! schema: that checks syntax, tables and columns with DataFusion's own messages, gives the
//! output schema (checked against `features` and `label`), and tells which `input` columns the
//! query reads, so executors decode only those from Parquet.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::MemTable;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::DataFusionError;
use datafusion::execution::object_store::ObjectStoreRegistry;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::functions_aggregate::count::count_all;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::prelude::{
    CsvReadOptions, JsonReadOptions, ParquetReadOptions, SessionConfig, SessionContext,
};
use object_store::ObjectStore;
use url::Url;

use super::error::{DataError, Result};
use super::local::{self, FileKind, Skipped, check_regular, is_glob};
use super::location::{Location, is_local, store_for};

mod count;
#[cfg(test)]
mod tests;

pub use count::{distinct_query, read_count, run_count, run_pruned};

/// The name of the table that holds the current partition in a job's `data.sql`.
pub const INPUT_TABLE: &str = "input";

/// A new DataFusion session that resolves every URL the way [`Location`] does.
///
/// `target_partitions = Some(1)` keeps a query on the calling thread's share of the CPU (as an
/// executor wants: its cores train); `None` uses every core (as `ringflow sql` wants).
pub fn session(target_partitions: Option<usize>) -> SessionContext {
    let mut config = SessionConfig::new().with_batch_size(4096);
    if let Some(n) = target_partitions {
        config = config.with_target_partitions(n.max(1));
    }
    let runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(Stores::default()))
        .build_arc()
        .expect("a default runtime environment builds");
    SessionContext::new_with_config_rt(config, runtime)
}

/// DataFusion's view of ringflow's stores: any `s3://`, `gs://`, `az://` or `http(s)://` URL
/// gets the client [`Location`] would build, with the same credential checks.
#[derive(Debug, Default)]
struct Stores {
    registered: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

fn store_key(url: &Url) -> String {
    format!("{}://{}", url.scheme(), url.authority())
}

impl ObjectStoreRegistry for Stores {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(store_key(url), store)
    }

    fn get_store(&self, url: &Url) -> datafusion::error::Result<Arc<dyn ObjectStore>> {
        let key = store_key(url);
        if let Some(s) = self
            .registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(s.clone());
        }
        store_for(url).map_err(|m| DataFusionError::Configuration(format!("{key}: {m}")))
    }
}

/// The first line of a DataFusion error, without the "Error during planning:" noise kept
/// where it helps (the kind of error stays, nested context goes).
pub fn df_message(e: &DataFusionError) -> String {
    let s = e.to_string();
    let s = s.lines().next().unwrap_or(&s).trim().to_string();
    s.strip_prefix("External error: ").unwrap_or(&s).to_string()
}

/// The file extension DataFusion looks for in a directory registered from `path` (written in
/// lower case): `.csv`, `.json`, `.ndjson` or `.parquet`.
fn table_extension(lower: &str) -> &'static str {
    if lower.ends_with(".csv") || lower.ends_with(".csv.gz") {
        ".csv"
    } else if lower.ends_with(".json") {
        ".json"
    } else if lower.ends_with(".ndjson") {
        ".ndjson"
    } else {
        ".parquet"
    }
}

/// The form DataFusion's listing tables want for `path`: absolute for local paths (directories
/// with a trailing slash), the URL otherwise (a prefix with a trailing slash). Checks that the
/// path exists and, for a local path, that a file named directly is a regular file; returns
/// the entries of a local directory or glob that are skipped because they are not (DataFusion
/// lists only regular files).
async fn table_url(path: &str, extension: &str) -> Result<(String, Vec<Skipped>)> {
    let loc = Location::parse(path)?;
    let glob = is_glob(path);
    let Some(p) = loc.local_path() else {
        return remote_table_url(path, &loc, glob)
            .await
            .map(|url| (url, Vec::new()));
    };
    let text = p.display().to_string();
    // Skipped entries are named the way the user wrote the path, where it is a plain path.
    let written = if path.contains("://") { &text } else { path };
    let skipped = || {
        local::list(written, extension)
            .map(|l| l.skipped)
            .map_err(|e| DataError::new(path, e.to_string()))
    };
    if glob {
        let skipped = skipped()?;
        return Ok((text, skipped));
    }
    match local::kind(&p) {
        Ok(FileKind::Directory) => Ok((format!("{text}/"), skipped()?)),
        _ => {
            check_regular(&p).map_err(|e| e.about(path))?;
            Ok((text, Vec::new()))
        }
    }
}

async fn remote_table_url(path: &str, loc: &Location, glob: bool) -> Result<String> {
    if glob {
        return Ok(loc.url().to_string());
    }
    if loc.size().await.is_ok() {
        return Ok(loc.url().to_string());
    }
    if loc.list().await?.is_empty() {
        return Err(DataError::not_found(path, "does not exist"));
    }
    Ok(format!("{}/", loc.url().as_str().trim_end_matches('/')))
}

/// Registers the table `name` over the file, directory or glob at `path`: CSV (with a header
/// row) for `.csv`, newline-delimited JSON for `.json`/`.ndjson`, Parquet otherwise. Returns the
/// entries of a local directory or glob that were skipped because they are not regular files.
pub async fn register_table(ctx: &SessionContext, name: &str, path: &str) -> Result<Vec<Skipped>> {
    let lower = path.to_ascii_lowercase();
    let (url, skipped) = table_url(path, table_extension(&lower)).await?;
    let fail =
        |e: DataFusionError| DataError::new(format!("table `{name}` ({path})"), df_message(&e));
    if lower.ends_with(".csv") || lower.ends_with(".csv.gz") {
        ctx.register_csv(name, &url, CsvReadOptions::new())
            .await
            .map_err(fail)?;
    } else if lower.ends_with(".json") || lower.ends_with(".ndjson") {
        let options = JsonReadOptions::default().file_extension(if lower.ends_with(".json") {
            ".json"
        } else {
            ".ndjson"
        });
        ctx.register_json(name, &url, options).await.map_err(fail)?;
    } else {
        let options = ParquetReadOptions::default();
        let options = if lower.ends_with(".parquet") || !is_local(path) || url.ends_with('/') {
            options
        } else {
            // A single local file with another extension.
            options.file_extension("")
        };
        ctx.register_parquet(name, &url, options)
            .await
            .map_err(fail)?;
    }
    Ok(skipped)
}

/// Registers the lookup tables of `[data.tables]`; with `in_memory` each is read once and kept
/// in memory (executors run the query once per partition and should not re-read them).
/// Returns a warning for each entry of a table's directory or glob that was skipped because it
/// is not a regular file.
pub async fn register_lookup_tables(
    ctx: &SessionContext,
    tables: &BTreeMap<String, String>,
    in_memory: bool,
) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    for (name, path) in tables {
        let what = format!("data.tables.{name}");
        if name.eq_ignore_ascii_case(INPUT_TABLE) {
            return Err(DataError::new(
                what,
                "`input` is the name of the partition being prepared; give the table another name",
            ));
        }
        let skipped = register_table(ctx, name, path)
            .await
            .map_err(|e| DataError::new(&what, e.to_string()))?;
        warnings.extend(skipped.iter().map(|s| format!("{what}: {s}")));
        if in_memory {
            let fail = |e: DataFusionError| DataError::new(&what, df_message(&e));
            let df = ctx.table(name.as_str()).await.map_err(fail)?;
            let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
            let batches = df.collect().await.map_err(fail)?;
            let table = MemTable::try_new(schema, vec![batches]).map_err(fail)?;
            ctx.deregister_table(name.as_str()).map_err(fail)?;
            ctx.register_table(name.as_str(), Arc::new(table))
                .map_err(fail)?;
        }
    }
    Ok(warnings)
}

/// What planning a job's query against an input schema tells.
#[derive(Clone, Debug)]
pub struct PlannedQuery {
    /// The schema of the query's output.
    pub output: SchemaRef,
    /// The columns of `input` that the query reads, in input-schema order.
    pub input_columns: Vec<String>,
    /// Whether the query provably yields exactly its input's rows, in their order: it only
    /// projects `input` (no filter, join, unnest, aggregate, window, sort, limit or union), so
    /// any range of input rows gives the same range of output rows.
    pub keeps_rows: bool,
    /// The columns of `input` that counting the query's output rows reads (those its filters,
    /// joins and unnests depend on), in input-schema order; at least one column.
    pub count_columns: Vec<String>,
}

/// Plans `query` with `input` of the given schema (no rows are read from `input`).
pub async fn plan_query(
    ctx: &SessionContext,
    query: &str,
    input: SchemaRef,
) -> Result<PlannedQuery> {
    let fail = |e: DataFusionError| DataError::new("data.sql", df_message(&e));
    let empty = MemTable::try_new(input.clone(), vec![vec![]]).map_err(fail)?;
    ctx.deregister_table(INPUT_TABLE).map_err(fail)?;
    ctx.register_table(INPUT_TABLE, Arc::new(empty))
        .map_err(fail)?;
    let planned = plan_registered(ctx, query, &input).await;
    ctx.deregister_table(INPUT_TABLE).map_err(fail)?;
    planned
}

/// [`plan_query`] once `input` is registered.
async fn plan_registered(
    ctx: &SessionContext,
    query: &str,
    input: &SchemaRef,
) -> Result<PlannedQuery> {
    let fail = |e: DataFusionError| DataError::new("data.sql", df_message(&e));
    let df = ctx.sql(query).await.map_err(fail)?;
    let output: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let counted = df
        .clone()
        .aggregate(vec![], vec![count_all()])
        .map_err(fail)?;
    let plan = df.into_optimized_plan().map_err(fail)?;
    let (used, scans) = input_columns_read(&plan, input).map_err(fail)?;
    if scans == 0 {
        return Err(DataError::new(
            "data.sql",
            "the query does not read the table `input` (the partition being prepared)",
        ));
    }
    let (mut counting, _) =
        input_columns_read(&counted.into_optimized_plan().map_err(fail)?, input).map_err(fail)?;
    if !counting.iter().any(|&u| u) {
        // Counting rows needs no value, but a stream of no columns carries no rows: read the
        // first column the query reads.
        let first = used.iter().position(|&u| u).unwrap_or(0);
        counting[first] = true;
    }
    Ok(PlannedQuery {
        output,
        input_columns: named(input, &used),
        keeps_rows: keeps_rows(&plan),
        count_columns: named(input, &counting),
    })
}

/// Which of `input`'s columns the scans of `input` in `plan` read, and how many such scans
/// there are.
fn input_columns_read(
    plan: &LogicalPlan,
    input: &SchemaRef,
) -> datafusion::error::Result<(Vec<bool>, usize)> {
    let mut used = vec![false; input.fields().len()];
    let mut scans = 0;
    plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node
            && scan.table_name.table() == INPUT_TABLE
        {
            scans += 1;
            match &scan.projection {
                Some(p) => p.iter().for_each(|&i| used[i] = true),
                None => used.iter_mut().for_each(|u| *u = true),
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok((used, scans))
}

/// The names of `input`'s columns marked in `used`, in schema order.
fn named(input: &SchemaRef, used: &[bool]) -> Vec<String> {
    input
        .fields()
        .iter()
        .zip(used)
        .filter(|(_, u)| **u)
        .map(|(f, _)| f.name().clone())
        .collect()
}

/// Whether the optimized `plan` yields exactly the rows of its one scan of `input`, in order:
/// nothing but projections and aliases above a scan of `input` with no filter or limit.
fn keeps_rows(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => keeps_rows(&p.input),
        LogicalPlan::SubqueryAlias(a) => keeps_rows(&a.input),
        LogicalPlan::TableScan(scan) => {
            scan.table_name.table() == INPUT_TABLE
                && scan.filters.is_empty()
                && scan.fetch.is_none()
        }
        _ => false,
    }
}

/// A partition stream that hands out one prepared stream, once.
struct OnceStream {
    schema: SchemaRef,
    stream: Mutex<Option<SendableRecordBatchStream>>,
}

impl std::fmt::Debug for OnceStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnceStream")
    }
}

impl PartitionStream for OnceStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let taken = self.stream.lock().unwrap_or_else(|p| p.into_inner()).take();
        taken.unwrap_or_else(|| {
            let schema = self.schema.clone();
            Box::pin(
                datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                    schema,
                    futures::stream::once(async {
                        Err(DataFusionError::Execution(
                            "the table `input` can be read only once per query".into(),
                        ))
                    }),
                ),
            )
        })
    }
}

/// Runs `query` with `input` streaming from `rows` (a partition), returning the output as a
/// stream: neither the partition nor the output is ever held whole.
pub async fn run_query(
    ctx: &SessionContext,
    query: &str,
    rows: SendableRecordBatchStream,
) -> Result<SendableRecordBatchStream> {
    let df = query_over(ctx, query, rows).await?;
    df.execute_stream().await.map_err(sql_failed)
}

/// The DataFusion error of running a job's query, as a [`DataError`] about `data.sql`.
pub(super) fn sql_failed(e: DataFusionError) -> DataError {
    DataError::new("data.sql", df_message(&e))
}

/// The plan of `query` with `input` registered as a table streaming from `rows`; bound to
/// those rows once built.
async fn query_over(
    ctx: &SessionContext,
    query: &str,
    rows: SendableRecordBatchStream,
) -> Result<datafusion::dataframe::DataFrame> {
    register_input(ctx, Arc::new(streaming_table(rows)?))?;
    ctx.sql(query).await.map_err(sql_failed)
}

/// A table that streams `rows` once.
pub(super) fn streaming_table(rows: SendableRecordBatchStream) -> Result<StreamingTable> {
    let schema = rows.schema();
    let once = OnceStream {
        schema: schema.clone(),
        stream: Mutex::new(Some(rows)),
    };
    StreamingTable::try_new(schema, vec![Arc::new(once)]).map_err(sql_failed)
}

/// Registers `table` as `input`, in place of the previous one.
pub(super) fn register_input(
    ctx: &SessionContext,
    table: Arc<dyn datafusion::catalog::TableProvider>,
) -> Result<()> {
    ctx.deregister_table(INPUT_TABLE).map_err(sql_failed)?;
    ctx.register_table(INPUT_TABLE, table).map_err(sql_failed)?;
    Ok(())
}

/// A stream over batches already in memory (a cached row group's slices).
pub fn memory_stream(schema: SchemaRef, batches: Vec<RecordBatch>) -> SendableRecordBatchStream {
    Box::pin(
        datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
            schema,
            futures::stream::iter(batches.into_iter().map(Ok)),
        ),
    )
}
