//! A job's `data.sql` planned by the driver against each distinct file schema, within
//! `data.sql_timeout_s`: [`SqlPlanner`] and why it could not plan ([`SqlPlanError`]).

use std::collections::BTreeMap;
use std::time::Duration;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::prelude::SessionContext;
use ringflow_core::data::deadline::block_on_timeout;
use ringflow_core::data::{DataError, sql};
use ringflow_core::spec::JobSpec;

/// Why `data.sql` could not be planned; every message starts with `data.sql`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SqlPlanError {
    /// Planning (or reading the schemas of `data.tables`) ran past `data.sql_timeout_s`.
    #[error(
        "data.sql: {what} did not finish within data.sql_timeout_s = {seconds} s; raise \
         data.sql_timeout_s if it needs longer"
    )]
    TimedOut {
        /// What did not finish.
        what: &'static str,
        /// `data.sql_timeout_s`.
        seconds: u64,
    },
    /// The query or its tables cannot be used.
    #[error(transparent)]
    Data(#[from] DataError),
}

/// A job's `data.sql` with its lookup tables registered once (their schemas are read, their
/// rows are not), planned against each distinct file schema. Registering the tables and each
/// planning must finish within `data.sql_timeout_s`.
pub(crate) struct SqlPlanner {
    ctx: SessionContext,
    query: String,
    timeout: Duration,
    /// Entries of the tables' directories or globs skipped because they are not regular files.
    pub(crate) warnings: Vec<String>,
}

impl SqlPlanner {
    /// The planner of `spec`'s query, if it has one.
    pub(crate) fn new(spec: &JobSpec) -> Result<Option<SqlPlanner>, SqlPlanError> {
        let Some(query) = &spec.data.sql else {
            return Ok(None);
        };
        let tables: BTreeMap<String, String> = spec.data.tables.clone();
        let timeout = spec.data.sql_timeout();
        let (ctx, warnings) = block_on_timeout(timeout, async move {
            let ctx = sql::session(Some(1));
            let warnings = sql::register_lookup_tables(&ctx, &tables, false).await?;
            Ok::<_, DataError>((ctx, warnings))
        })
        .map_err(|_| timed_out("reading the schemas of data.tables", timeout))??;
        Ok(Some(SqlPlanner {
            ctx,
            query: query.clone(),
            timeout,
            warnings,
        }))
    }

    /// A planner of `query` (one made from the job's, such as its distinct labels) over the same
    /// tables.
    pub(crate) fn with_query(&self, query: &str) -> SqlPlanner {
        SqlPlanner {
            ctx: self.ctx.clone(),
            query: query.to_string(),
            timeout: self.timeout,
            warnings: Vec::new(),
        }
    }

    /// Plans the query with `input` of the given schema.
    pub(crate) fn plan(&self, input: SchemaRef) -> Result<sql::PlannedQuery, SqlPlanError> {
        let (ctx, query) = (self.ctx.clone(), self.query.clone());
        block_on_timeout(self.timeout, async move {
            sql::plan_query(&ctx, &query, input).await
        })
        .map_err(|_| timed_out("planning the query", self.timeout))?
        .map_err(SqlPlanError::from)
    }
}

/// The error for `what` (planning, reading tables) that ran past `data.sql_timeout_s`.
pub(crate) fn timed_out(what: &'static str, timeout: Duration) -> SqlPlanError {
    SqlPlanError::TimedOut {
        what,
        seconds: timeout.as_secs(),
    }
}
