//! Counting the rows `data.sql` yields, where the query may drop or multiply them (a filter, a
//! join, an unnest): the step plan, the remainder rule and every rank's share are then reckoned
//! in the rows training really sees, not in the rows of the files.
//!
//! The pass runs in the planner, on every core of the driver, before any executor works (as
//! the sequence statistics pass does): the steps of an epoch must be known to plan it. It runs
//! the query over each whole row group, as executors then do, reading only the columns that
//! the count depends on (a filter's columns, a join's keys: DataFusion prunes the rest), and
//! counts its output as it streams. A query that provably keeps every row (it only projects
//! `input`) needs no pass. Executors check that the query yields the counted rows again.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::prelude::SessionContext;
use ringflow_core::data::deadline::block_on_timeout;
use ringflow_core::data::partition::PartitionReader;
use ringflow_core::data::sql;
use ringflow_core::spec::JobSpec;

pub use super::count_error::CountError;
use super::parallel::{each_group, lock};
use super::split::RowGroup;
use super::sql_planner::{SqlPlanError, timed_out};
use crate::error::{DriverError, Result};

/// What the counting pass over one split found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counted {
    /// Rows of the split's files.
    pub file_rows: u64,
    /// Rows the query yields over them.
    pub query_rows: u64,
    /// How long the pass took.
    pub took: Duration,
}

impl Counted {
    /// The line the job's messages show for split `key`.
    pub fn describe(&self, key: &str) -> String {
        format!(
            "{key}: data.sql yields {} rows from the {} rows of its files (counted on the \
             driver in {:.1} s, reading only the columns the count depends on)",
            self.query_rows,
            self.file_rows,
            self.took.as_secs_f64()
        )
    }
}

/// A job's query, ready to run over row groups on the driver (to count the rows it yields, or,
/// as a [`sql::distinct_query`], to list its labels): its lookup tables read once into memory.
pub struct RowCounter {
    ctx: SessionContext,
    query: String,
    timeout: Duration,
    /// Held while a row group is registered as `input` and its count planned: the threads
    /// share the session, and a plan must bind to its own row group.
    planning: Mutex<()>,
}

impl RowCounter {
    /// The counter of `spec`'s query (which it has).
    pub fn new(spec: &JobSpec, query: &str) -> Result<RowCounter> {
        let tables: BTreeMap<String, String> = spec.data.tables.clone();
        let timeout = spec.data.sql_timeout();
        let ctx = block_on_timeout(timeout, async move {
            let ctx = sql::session(Some(1));
            sql::register_lookup_tables(&ctx, &tables, true).await?;
            Ok::<_, ringflow_core::data::DataError>(ctx)
        })
        .map_err(|_| timed_out("loading data.tables to count the query's rows", timeout))?
        .map_err(SqlPlanError::from)?;
        Ok(RowCounter {
            ctx,
            query: query.to_string(),
            timeout,
            planning: Mutex::new(()),
        })
    }

    /// Replaces the rows of every group of split `key` by the rows the query yields over it,
    /// reading `columns` (the ones the count depends on) of files whose schemas `schemas`
    /// gives, on every core of the driver. Groups the query empties are dropped.
    pub fn count(
        &self,
        key: &str,
        groups: &mut Vec<RowGroup>,
        columns: &[String],
        schemas: &[(String, SchemaRef)],
    ) -> Result<Counted> {
        let start = Instant::now();
        let file_rows = groups.iter().map(|g| g.rows).sum();
        let read = Read { columns, schemas };
        let counts = self.count_each(key, groups, &read)?;
        for (g, rows) in groups.iter_mut().zip(counts) {
            g.rows = rows;
            g.after_sql = true;
        }
        groups.retain(|g| g.rows > 0);
        Ok(Counted {
            file_rows,
            query_rows: groups.iter().map(|g| g.rows).sum(),
            took: start.elapsed(),
        })
    }

    /// The count of every group, in order, from as many threads as the driver has cores.
    fn count_each(&self, key: &str, groups: &[RowGroup], read: &Read<'_>) -> Result<Vec<u64>> {
        each_group(groups, |group| self.count_group(group, read)).map_err(|(source, group)| {
            let site = format!("{key}: {} (row group {})", group.path, group.index);
            DriverError::RowCount { site, source }
        })
    }

    /// The rows the query yields over the whole of `group`, or why it could not say.
    fn count_group(
        &self,
        group: &RowGroup,
        read: &Read<'_>,
    ) -> std::result::Result<u64, CountError> {
        let (counting, left) = self.start(group, read, true)?;
        let over = |_| self.timed_out(true);
        Ok(block_on_timeout(left, sql::read_count(counting)).map_err(over)??)
    }

    /// Runs the query over the whole of `group`, reading `columns` (those it reads) of a file
    /// of one of `schemas`, within `data.sql_timeout_s`: the first column of its output, in
    /// batches, up to `limit` values (the rest is not read).
    pub fn first_column(
        &self,
        group: &RowGroup,
        (columns, schemas): (&[String], &[(String, SchemaRef)]),
        limit: usize,
    ) -> std::result::Result<Vec<ArrayRef>, CountError> {
        let read = Read { columns, schemas };
        let (mut stream, left) = self.start(group, &read, false)?;
        let over = |_| self.timed_out(false);
        let reading = async move {
            use futures::StreamExt;
            let (mut out, mut values) = (Vec::new(), 0usize);
            while values <= limit
                && let Some(batch) = stream.next().await
            {
                let batch = batch.map_err(|e| {
                    let why = sql::df_message(&e);
                    CountError::Data(ringflow_core::data::DataError::new("data.sql", why))
                })?;
                if let Some(column) = batch.columns().first() {
                    values += column.len();
                    out.push(column.clone());
                }
            }
            Ok::<_, CountError>(out)
        };
        block_on_timeout(left, reading).map_err(over)?
    }

    /// The error of a query that ran past `data.sql_timeout_s`, counting rows (`count`) or
    /// listing labels.
    fn timed_out(&self, count: bool) -> CountError {
        CountError::TimedOut {
            what: match count {
                true => "counting the query's rows",
                false => "reading the labels the query makes",
            },
            seconds: self.timeout.as_secs(),
        }
    }

    /// Starts the query (counting its rows when `count`) over the whole of `group`; returns
    /// its output and the time left of `data.sql_timeout_s`.
    fn start(
        &self,
        group: &RowGroup,
        read: &Read<'_>,
        count: bool,
    ) -> std::result::Result<(SendableRecordBatchStream, Duration), CountError> {
        let full = read
            .schemas
            .iter()
            .find(|(file, _)| *file == group.path)
            .map(|(_, schema)| schema.clone())
            .ok_or(CountError::NoSchema)?;
        let partition = group.file_rows();
        let rows = PartitionReader::open(&partition, read.columns)?.into_stream();
        let (ctx, query) = (self.ctx.clone(), self.query.clone());
        let over = |_| self.timed_out(count);
        let started = Instant::now();
        let stream = {
            let _planning = lock(&self.planning);
            let started = async move {
                match count {
                    true => sql::run_count(&ctx, &query, full, rows).await,
                    false => sql::run_pruned(&ctx, &query, full, rows).await,
                }
            };
            block_on_timeout(self.timeout, started).map_err(over)??
        };
        Ok((stream, self.timeout.saturating_sub(started.elapsed())))
    }
}

/// What the pass reads of each row group: the columns the count depends on, of files of these
/// schemas.
struct Read<'a> {
    columns: &'a [String],
    schemas: &'a [(String, SchemaRef)],
}
