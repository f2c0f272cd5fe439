//! `data.sql` on an executor: the job's query runs on each partition as it streams from
//! storage (or from the row-group cache), with the `[data.tables]` read once and kept in
//! memory for the whole task.

use std::collections::BTreeMap;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use ringflow_proto::data::runtime::block_on;
use ringflow_proto::data::sql;

use crate::error::{ExecutorError, Result};

/// A job's SQL prep, ready to run on partitions.
pub struct SqlPrep {
    ctx: SessionContext,
    query: String,
}

impl std::fmt::Debug for SqlPrep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlPrep")
            .field("query", &self.query)
            .finish()
    }
}

impl SqlPrep {
    /// Prepares `query` with the lookup `tables` (name = path) loaded into memory.
    pub fn new(query: &str, tables: &BTreeMap<String, String>) -> Result<SqlPrep> {
        let tables = tables.clone();
        let ctx = block_on(async move {
            let ctx = sql::session(Some(1));
            sql::register_lookup_tables(&ctx, &tables, true).await?;
            Ok::<_, ringflow_proto::data::DataError>(ctx)
        })
        .map_err(|e| ExecutorError::Spec(e.to_string()))?;
        Ok(SqlPrep {
            ctx,
            query: query.to_string(),
        })
    }

    /// Starts the query over one partition's rows.
    pub fn run(&self, input: SendableRecordBatchStream) -> Result<Prepared> {
        let (ctx, query) = (self.ctx.clone(), self.query.clone());
        let stream = block_on(async move { sql::run_query(&ctx, &query, input).await })
            .map_err(|e| ExecutorError::Spec(e.to_string()))?;
        Ok(Prepared {
            stream: Some(stream),
        })
    }
}

/// The output of the query over one partition, batch by batch.
pub struct Prepared {
    stream: Option<SendableRecordBatchStream>,
}

impl Prepared {
    /// The next output batch; errors carry DataFusion's message (or the reader's, which names
    /// the file).
    pub fn next_batch(&mut self) -> std::result::Result<Option<RecordBatch>, String> {
        let Some(mut stream) = self.stream.take() else {
            return Ok(None);
        };
        let (item, stream) = block_on(async move { (stream.next().await, stream) });
        match item {
            None => Ok(None),
            Some(Ok(b)) => {
                self.stream = Some(stream);
                Ok(Some(b))
            }
            Some(Err(e)) => Err(match e.find_root() {
                datafusion::error::DataFusionError::External(inner) => inner.to_string(),
                other => sql::df_message(other),
            }),
        }
    }
}
