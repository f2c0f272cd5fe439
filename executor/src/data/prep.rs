//! `data.sql` on an executor: the job's query runs on each partition as it streams from
//! storage (or from the row-group cache), with the `[data.tables]` read once and kept in
//! memory for the whole task.
//!
//! `data.sql_timeout_s` bounds the loading of the tables and the time the query spends on one
//! partition: the time spent inside the query (planning it, reading its input, computing its
//! output), not the time training spends on the batches it hands out. At the limit the query's
//! stream is dropped, which stops DataFusion (its operators yield to the runtime, so even an
//! endless recursive query is cancelled there).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use ringflow_core::data::deadline::block_on_timeout;
use ringflow_core::data::sql;

use crate::data::error::QueryError;
use crate::error::{Result, Unrunnable};

/// A job's SQL prep, ready to run on partitions.
pub struct SqlPrep {
    ctx: SessionContext,
    query: String,
    timeout: Duration,
    /// Held while a partition's rows are registered as the table `input` and the query is
    /// planned over them: the decoder threads share the session, and a plan must bind to its
    /// own partition's table, not to one another thread registered in between.
    planning: Mutex<()>,
}

impl std::fmt::Debug for SqlPrep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlPrep")
            .field("query", &self.query)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Work on `data.sql` (`what`) that ran past `data.sql_timeout_s`.
fn timed_out(what: &'static str, timeout: Duration) -> QueryError {
    QueryError::TimedOut {
        what,
        timeout_s: timeout.as_secs(),
    }
}

impl SqlPrep {
    /// Prepares `query` with the lookup `tables` (name = path) loaded into memory, each within
    /// `timeout` (`data.sql_timeout_s`), which then also bounds the query on each partition.
    pub fn new(
        query: &str,
        tables: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<SqlPrep> {
        let tables = tables.clone();
        let ctx = block_on_timeout(timeout, async move {
            let ctx = sql::session(Some(1));
            // The driver already warned about the tables' skipped entries.
            sql::register_lookup_tables(&ctx, &tables, true).await?;
            Ok::<_, ringflow_core::data::DataError>(ctx)
        })
        .map_err(|_| timed_out("loading data.tables", timeout))?
        .map_err(Unrunnable::Sql)?;
        Ok(SqlPrep {
            ctx,
            query: query.to_string(),
            timeout,
            planning: Mutex::new(()),
        })
    }

    /// Starts the query over one partition's rows.
    pub fn run(&self, input: SendableRecordBatchStream) -> Result<Prepared> {
        let (ctx, query) = (self.ctx.clone(), self.query.clone());
        let start = Instant::now();
        let planning = self.planning.lock().unwrap_or_else(|p| p.into_inner());
        let stream = block_on_timeout(self.timeout, async move {
            sql::run_query(&ctx, &query, input).await
        })
        .map_err(|_| timed_out("planning the query", self.timeout))?
        .map_err(Unrunnable::Sql)?;
        drop(planning);
        Ok(Prepared {
            stream: Some(stream),
            failed: None,
            timeout: self.timeout,
            spent: start.elapsed(),
        })
    }
}

/// The output of the query over one partition, batch by batch.
pub struct Prepared {
    /// The query's output; `None` once it ended or failed.
    stream: Option<SendableRecordBatchStream>,
    /// Why the query failed, repeated to any later call.
    failed: Option<QueryError>,
    /// `data.sql_timeout_s`.
    timeout: Duration,
    /// Time spent in the query so far.
    spent: Duration,
}

impl Prepared {
    /// The next output batch; errors carry DataFusion's message (or the reader's, which names
    /// the file), or say that the query ran past `data.sql_timeout_s` on this partition.
    pub fn next_batch(&mut self) -> std::result::Result<Option<RecordBatch>, QueryError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let Some(stream) = self.stream.take() else {
            return Ok(None);
        };
        let next = self.next_within_limit(stream);
        if let Err(e) = &next {
            self.failed = Some(e.clone());
        }
        next
    }

    fn next_within_limit(
        &mut self,
        mut stream: SendableRecordBatchStream,
    ) -> std::result::Result<Option<RecordBatch>, QueryError> {
        let over = timed_out("the query on this partition", self.timeout);
        let Some(left) = self.timeout.checked_sub(self.spent) else {
            return Err(over);
        };
        let start = Instant::now();
        // Past the limit the stream is dropped inside, which cancels the query.
        let (item, stream) = block_on_timeout(left, async move { (stream.next().await, stream) })
            .map_err(|_| over)?;
        self.spent += start.elapsed();
        match item {
            None => Ok(None),
            Some(Ok(b)) => {
                self.stream = Some(stream);
                Ok(Some(b))
            }
            Some(Err(e)) => Err(QueryError::Failed(match e.find_root() {
                datafusion::error::DataFusionError::External(inner) => inner.to_string(),
                other => sql::df_message(other),
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn input() -> SendableRecordBatchStream {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![1, 2]))])
                .unwrap();
        sql::memory_stream(schema, vec![batch])
    }

    /// The decoder threads run the query over their partitions at the same time through one
    /// session: each output comes from its own partition's rows.
    #[test]
    fn partitions_prepared_at_once_on_two_threads_keep_their_own_rows() {
        let prep = Arc::new(
            SqlPrep::new(
                "SELECT n * 2 AS m FROM input",
                &BTreeMap::new(),
                Duration::from_secs(30),
            )
            .unwrap(),
        );
        let rows = |first: i64| {
            let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
            let values = Int64Array::from((first..first + 3).collect::<Vec<i64>>());
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(values)]).unwrap();
            sql::memory_stream(schema, vec![batch])
        };
        let threads: Vec<_> = (0..2i64)
            .map(|t| {
                let prep = Arc::clone(&prep);
                std::thread::spawn(move || {
                    for i in 0..100 {
                        let first = 1000 * t + 10 * i;
                        let mut out = prep.run(rows(first)).unwrap();
                        let batch = out.next_batch().unwrap().expect("one batch");
                        let m = batch
                            .column(0)
                            .as_any()
                            .downcast_ref::<Int64Array>()
                            .unwrap();
                        assert_eq!(m.values(), &[2 * first, 2 * first + 2, 2 * first + 4]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("every partition got its own rows back");
        }
    }

    /// A query that never ends on a partition is stopped at `data.sql_timeout_s`, with the
    /// setting named (and named again if asked for more); a query that ends is not.
    #[test]
    fn an_endless_query_is_stopped_at_its_limit() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let prep = SqlPrep::new(
                "WITH RECURSIVE r(n) AS (SELECT n FROM input UNION ALL SELECT n + 1 FROM r) \
                 SELECT count(*) AS c FROM r",
                &BTreeMap::new(),
                Duration::from_secs(1),
            )
            .unwrap();
            let mut prepared = prep.run(input()).unwrap();
            let _ = tx.send((prepared.next_batch(), prepared.next_batch()));
        });
        // Without the limit the query would never answer: the test fails instead of hanging.
        let (first, again) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the endless query was not stopped");
        let e = first.unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("data.sql_timeout_s = 1 s") && text.contains("on this partition"),
            "{text}"
        );
        assert_eq!(again, Err(e));

        let prep = SqlPrep::new(
            "SELECT n * 2 AS m FROM input",
            &BTreeMap::new(),
            Duration::from_secs(60),
        )
        .unwrap();
        let mut prepared = prep.run(input()).unwrap();
        let batch = prepared.next_batch().unwrap().unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(prepared.next_batch(), Ok(None));
    }
}
