//! Sessions, lookup tables, planning (columns read, rows kept, the count's columns), queries
//! over streamed row groups, and counts.

use std::sync::Arc;

use datafusion::arrow::array::{Float32Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use futures::TryStreamExt;

use super::*;
use crate::data::runtime::block_on;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("a", DataType::Float32, false),
        Field::new("b", DataType::Int64, false),
        Field::new("unused", DataType::Utf8, true),
    ]))
}

#[test]
fn planning_finds_the_input_columns_and_the_output_schema() {
    let planned = block_on(async {
        let ctx = session(Some(1));
        plan_query(
            &ctx,
            "SELECT a * 2 AS x, b FROM input WHERE b > 0",
            schema(),
        )
        .await
    })
    .unwrap();
    assert_eq!(planned.input_columns, ["a", "b"]);
    let names: Vec<_> = planned
        .output
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["x", "b"]);
}

/// Only queries that do nothing but project `input` keep its rows; a filter, join, unnest,
/// aggregate, limit, sort or union may change them and needs them counted.
#[test]
fn only_projections_keep_every_row() {
    let ctx = session(Some(1));
    ctx.register_table("names", schema_with_names()).unwrap();
    let keeps = |query: &str| {
        let (ctx, owned) = (ctx.clone(), query.to_string());
        block_on(async move { plan_query(&ctx, &owned, schema()).await })
            .unwrap_or_else(|e| panic!("{query}: {e}"))
            .keeps_rows
    };
    for query in [
        "SELECT a, b FROM input",
        "SELECT * FROM input",
        "SELECT a * 2 AS x, CAST(b AS FLOAT) AS y FROM input AS i",
        "SELECT x FROM (SELECT a AS x FROM input) AS sub",
        "SELECT a FROM input WHERE true",
    ] {
        assert!(keeps(query), "{query} keeps every row");
    }
    for query in [
        "SELECT a FROM input WHERE b > 0",
        "SELECT a FROM input LIMIT 2",
        "SELECT a FROM input ORDER BY b",
        "SELECT sum(a) AS a FROM input",
        "SELECT unnest(make_array(a, a)) AS a FROM input",
        "SELECT a, row_number() OVER () AS r FROM input",
        "SELECT a FROM input UNION ALL SELECT a FROM input",
        "SELECT input.a, names.n FROM input JOIN names ON input.b = names.b",
        "SELECT DISTINCT a FROM input",
    ] {
        assert!(!keeps(query), "{query} may change the rows");
    }
}

/// Counting reads only what the count depends on: a filter's columns, a join's keys.
#[test]
fn counting_reads_only_the_columns_the_count_depends_on() {
    let ctx = session(Some(1));
    ctx.register_table("names", schema_with_names()).unwrap();
    let count_columns = |query: &str| {
        let (ctx, query) = (ctx.clone(), query.to_string());
        block_on(async move { plan_query(&ctx, &query, schema()).await })
            .unwrap()
            .count_columns
    };
    assert_eq!(
        count_columns("SELECT a, unused FROM input WHERE b > 0"),
        ["b"]
    );
    assert_eq!(
        count_columns("SELECT input.a, names.n FROM input JOIN names ON input.b = names.b"),
        ["b"]
    );
    // A count that depends on no value still reads one column, to see the rows.
    assert_eq!(count_columns("SELECT a, b FROM input"), ["a"]);
}

/// The count is the number of rows the query yields, filtered, joined or multiplied, from
/// a stream of only the columns the count depends on.
#[test]
fn counts_are_the_rows_the_query_yields() {
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0])),
            Arc::new(Int64Array::from(vec![-1, 5, 7])),
            Arc::new(StringArray::from(vec![Some("x"), None, Some("z")])),
        ],
    )
    .unwrap();
    let names_schema = Arc::new(Schema::new(vec![
        Field::new("b", DataType::Int64, false),
        Field::new("n", DataType::Utf8, false),
    ]));
    let names = RecordBatch::try_new(
        names_schema.clone(),
        vec![
            Arc::new(Int64Array::from(vec![5, 5, 7, 9])),
            Arc::new(StringArray::from(vec!["five", "cinq", "seven", "nine"])),
        ],
    )
    .unwrap();
    let count = |query: &str| {
        let (batch, names) = (batch.clone(), names.clone());
        let (names_schema, query) = (names_schema.clone(), query.to_string());
        block_on(async move {
            let query = query.as_str();
            let ctx = session(Some(1));
            let table = MemTable::try_new(names_schema, vec![vec![names]]).unwrap();
            ctx.register_table("names", Arc::new(table)).unwrap();
            let planned = plan_query(&ctx, query, schema()).await.unwrap();
            let read: Vec<usize> = planned
                .count_columns
                .iter()
                .map(|c| schema().index_of(c).unwrap())
                .collect();
            let part = batch.project(&read).unwrap();
            let stream = memory_stream(part.schema(), vec![part]);
            read_count(run_count(&ctx, query, schema(), stream).await.unwrap()).await
        })
        .unwrap()
    };
    assert_eq!(count("SELECT a, unused FROM input WHERE b > 0"), 2);
    assert_eq!(
        count("SELECT unnest(make_array(a, a, a)) AS a FROM input"),
        9
    );
    assert_eq!(count("SELECT a FROM input WHERE b > 100"), 0);
    assert_eq!(count("SELECT * FROM input"), 3);
    let joined = "SELECT input.a, input.unused, names.n FROM input \
                  JOIN names ON input.b = names.b";
    assert_eq!(count(joined), 3);
}

/// A lookup table `names(b, n)` as a table provider.
fn schema_with_names() -> Arc<MemTable> {
    let names = Arc::new(Schema::new(vec![
        Field::new("b", DataType::Int64, false),
        Field::new("n", DataType::Utf8, false),
    ]));
    Arc::new(MemTable::try_new(names, vec![vec![]]).unwrap())
}

#[test]
fn unknown_columns_and_syntax_errors_carry_datafusion_messages() {
    let e =
        block_on(async { plan_query(&session(Some(1)), "SELECT nope FROM input", schema()).await })
            .unwrap_err();
    assert!(e.to_string().starts_with("data.sql: "), "{e}");
    assert!(e.to_string().contains("nope"), "{e}");
    let e = block_on(async { plan_query(&session(Some(1)), "SELEC a FROM input", schema()).await })
        .unwrap_err();
    assert!(e.to_string().contains("SELEC"), "{e}");
    let e =
        block_on(async { plan_query(&session(Some(1)), "SELECT 1", schema()).await }).unwrap_err();
    assert!(
        e.to_string().contains("does not read the table `input`"),
        "{e}"
    );
}

#[test]
fn queries_stream_over_a_partition() {
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0])),
            Arc::new(Int64Array::from(vec![-1, 5, 7])),
            Arc::new(StringArray::from(vec![Some("x"), None, Some("z")])),
        ],
    )
    .unwrap();
    let out: Vec<RecordBatch> = block_on(async move {
        let ctx = session(Some(1));
        let stream = memory_stream(batch.schema(), vec![batch]);
        let s = run_query(&ctx, "SELECT a + b AS s FROM input WHERE b > 0", stream).await?;
        s.try_collect()
            .await
            .map_err(|e| DataError::new("x", e.to_string()))
    })
    .unwrap();
    let values: Vec<f64> = out
        .iter()
        .flat_map(|b| {
            let c = datafusion::arrow::compute::cast(b.column(0), &DataType::Float64).unwrap();
            c.as_any()
                .downcast_ref::<datafusion::arrow::array::Float64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(values, [7.0, 10.0]);
}
