//! Counting the rows a job's query yields over one row group, reading only the columns the
//! count depends on ([`run_count`], [`read_count`]): the driver's counting pass where
//! `data.sql` may drop or multiply rows. The driver's label pass runs a query over such a
//! row group too ([`run_pruned`], with [`distinct_query`]: the query's distinct labels).

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::functions_aggregate::count::count_all;
use datafusion::prelude::SessionContext;

use super::{df_message, register_input, sql_failed, streaming_table};
use crate::data::error::{DataError, Result};

/// Starts counting the rows `query` yields with `input` of schema `full` streaming from `rows`
/// (a row group), which holds only some of its columns: those [`PlannedQuery::count_columns`]
/// names, all the count depends on. A stream of one batch of one count, for [`read_count`]; the
/// query's output is counted as it streams, never held.
pub async fn run_count(
    ctx: &SessionContext,
    query: &str,
    full: SchemaRef,
    rows: SendableRecordBatchStream,
) -> Result<SendableRecordBatchStream> {
    let df = pruned(ctx, query, full, rows).await?;
    let counted = df
        .aggregate(vec![], vec![count_all()])
        .map_err(sql_failed)?;
    counted.execute_stream().await.map_err(sql_failed)
}

/// Starts running `query` with `input` of schema `full` streaming from `rows` (a row group),
/// which holds only the columns the query reads (its `input_columns` as planned against
/// `full`). The output streams, never held.
pub async fn run_pruned(
    ctx: &SessionContext,
    query: &str,
    full: SchemaRef,
    rows: SendableRecordBatchStream,
) -> Result<SendableRecordBatchStream> {
    let df = pruned(ctx, query, full, rows).await?;
    df.execute_stream().await.map_err(sql_failed)
}

/// The query of the distinct values of `column` in the output of `query`.
pub fn distinct_query(query: &str, column: &str) -> String {
    let query = query.trim().trim_end_matches(';');
    let column = column.replace('"', "\"\"");
    format!("SELECT DISTINCT \"{column}\" FROM ({query}) AS labelled")
}

/// `query` planned with `input` of schema `full` reading from `rows`, which holds some of its
/// columns.
async fn pruned(
    ctx: &SessionContext,
    query: &str,
    full: SchemaRef,
    rows: SendableRecordBatchStream,
) -> Result<datafusion::dataframe::DataFrame> {
    let read = rows.schema();
    let table = streaming_table(rows)?;
    let positions = full
        .fields()
        .iter()
        .map(|f| read.index_of(f.name()).ok())
        .collect();
    let input = SomeColumns {
        full,
        read: table,
        positions,
    };
    register_input(ctx, Arc::new(input))?;
    ctx.sql(query).await.map_err(sql_failed)
}

/// The table `input` of a count: the schema of the whole input, the values of the columns read
/// (the ones the count depends on, which are all a pruned plan asks for).
#[derive(Debug)]
struct SomeColumns {
    full: SchemaRef,
    read: StreamingTable,
    /// For each column of `full`, its place among the columns read.
    positions: Vec<Option<usize>>,
}

#[async_trait::async_trait]
impl datafusion::catalog::TableProvider for SomeColumns {
    fn schema(&self) -> SchemaRef {
        self.full.clone()
    }

    fn table_type(&self) -> datafusion::datasource::TableType {
        datafusion::datasource::TableType::View
    }

    async fn scan(
        &self,
        state: &dyn datafusion::catalog::Session,
        projection: Option<&Vec<usize>>,
        filters: &[datafusion::prelude::Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        let all: Vec<usize> = (0..self.full.fields().len()).collect();
        let mapped = projection
            .unwrap_or(&all)
            .iter()
            .map(|&i| {
                self.positions.get(i).copied().flatten().ok_or_else(|| {
                    DataFusionError::Plan(format!(
                        "the query over a row group needs the column `{}`, which was not read",
                        self.full.field(i).name()
                    ))
                })
            })
            .collect::<datafusion::error::Result<Vec<usize>>>()?;
        self.read.scan(state, Some(&mapped), filters, limit).await
    }
}

/// The count that a stream of [`run_count`] yields, or why the query failed: an error about
/// `data.sql` with the reader's message (which names the file), or DataFusion's.
pub async fn read_count(mut counted: SendableRecordBatchStream) -> Result<u64> {
    use futures::StreamExt;
    let failed = |message: String| DataError::new("data.sql", message);
    let mut total = None;
    while let Some(batch) = counted.next().await {
        let batch = batch.map_err(|e| match e.find_root() {
            DataFusionError::External(inner) => failed(inner.to_string()),
            other => failed(df_message(other)),
        })?;
        let column = batch.columns().first().and_then(|c| {
            c.as_any()
                .downcast_ref::<datafusion::arrow::array::Int64Array>()
        });
        if let Some(values) = column {
            total = values.iter().flatten().next().or(total);
        }
    }
    let count = total.ok_or_else(|| failed("counting the query's rows gave no count".into()))?;
    Ok(u64::try_from(count).unwrap_or(0))
}
