//! The partition readers over a local file: any range a plan or a ticket could name, and a
//! file swapped for a FIFO.

use std::sync::Arc;

use datafusion::arrow::array::{Int32Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use super::*;
use crate::data::DataError;

/// Rows of the test file, in row groups of [`GROUP_ROWS`].
const ROWS: i32 = 25;
const GROUP_ROWS: usize = 10;

/// Writes a file of [`ROWS`] rows, `n` (0, 1, …) and `s` (`"r<n>"`), in 3 row groups.
fn write_file(path: &std::path::Path) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("n", DataType::Int32, false),
        Field::new("s", DataType::Utf8, false),
    ]));
    let n: Vec<i32> = (0..ROWS).collect();
    let s: Vec<String> = n.iter().map(|i| format!("r{i}")).collect();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int32Array::from(n)),
            Arc::new(StringArray::from(s)),
        ],
    )
    .unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .build();
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// Mostly a number that fits the file (so that reads get going), sometimes one at the edge
/// of `u64`.
fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0u64..12,
        1 => 0u64..30,
        1 => Just(u64::MAX),
        1 => Just(u64::MAX - 5),
        1 => any::<u64>(),
    ]
}

/// Any partition a ticket or a plan could name, read in whole or in part: the rows it
/// names, numbered from its `file_row_start`, or an error naming the file; never a panic.
#[test]
fn fuzz_partition_reader_any_range() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_file(&path);
    let file = path.display().to_string();
    let columns = prop::collection::vec(
        prop::sample::select(vec!["n", "s", "nope", ""]).prop_map(String::from),
        0..3,
    );
    let partition = (
        prop_oneof![0u32..4, any::<u32>()],
        edge_u64(),
        edge_u64(),
        edge_u64(),
    );
    let mut runner = TestRunner::new(ringflow_ml::fuzz::config(1024));
    runner
        .run(
            &(partition, columns, any::<bool>()),
            |((row_group, row_offset, row_count, file_row_start), columns, whole)| {
                let p = Partition {
                    path: file.clone(),
                    row_group,
                    row_offset,
                    row_count,
                    file_row_start,
                    query_rows: None,
                };
                check_read(&p, &columns, whole)
            },
        )
        .unwrap();
}

fn check_read(p: &Partition, columns: &[String], whole: bool) -> Result<(), TestCaseError> {
    let opened = if whole {
        PartitionReader::open_row_group(p, columns)
    } else {
        PartitionReader::open(p, columns)
    };
    let mut reader = match opened {
        Ok(r) => r,
        Err(e) => {
            prop_assert_eq!(&e.what, &p.path);
            return Ok(());
        }
    };
    let group_rows = (ROWS as u64 - p.row_group as u64 * GROUP_ROWS as u64).min(10);
    let (first, count) = match whole {
        true => (0, group_rows),
        false => (p.row_offset, p.row_count),
    };
    prop_assert!(p.row_offset.checked_add(p.row_count) <= Some(group_rows));
    let mut expected_row = p.file_row_start + first;
    while let Some((batch, at)) = reader
        .next_batch()
        .map_err(|e| TestCaseError::fail(e.message))?
    {
        prop_assert_eq!(at, expected_row);
        prop_assert_eq!(
            batch.num_columns(),
            columns
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        );
        if let Some(n) = batch.column_by_name("n") {
            let n = n.as_any().downcast_ref::<Int32Array>().unwrap();
            let group_start = p.row_group as u64 * GROUP_ROWS as u64;
            prop_assert_eq!(n.value(0) as u64, group_start + (at - p.file_row_start));
        }
        expected_row += batch.num_rows() as u64;
    }
    prop_assert_eq!(expected_row - p.file_row_start - first, count);
    Ok(())
}

/// Regression (fuzz_partition_reader_any_range): a partition whose `row_offset +
/// row_count`, or whose `file_row_start` plus its rows, passes 2^64 — which any holder of a
/// job's secret can put into a Flight ticket — overflowed (a panic in debug builds, a
/// wrapped range in release ones) instead of being refused.
#[test]
fn ranges_past_u64_are_refused_by_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.parquet");
    write_file(&path);
    let file = path.display().to_string();
    for (offset, count, start) in [(u64::MAX, 1, 0), (1, u64::MAX, 0), (0, 10, u64::MAX - 3)] {
        let p = Partition {
            path: file.clone(),
            row_group: 0,
            row_offset: offset,
            row_count: count,
            file_row_start: start,
            query_rows: None,
        };
        for whole in [false, true] {
            let e = check_open(&p, whole);
            assert_eq!(e.what, file);
            assert!(e.message.contains("row group 0"), "{}", e.message);
        }
    }
}

fn check_open(p: &Partition, whole: bool) -> DataError {
    let columns = ["n".to_string()];
    let opened = match whole {
        true => PartitionReader::open_row_group(p, &columns),
        false => PartitionReader::open(p, &columns),
    };
    opened.err().expect("the partition was opened")
}

/// A data file swapped for a FIFO after planning is refused when an executor (or the
/// driver's Flight service) opens it, and by the readability probe, instead of hanging.
#[cfg(unix)]
#[test]
fn a_fifo_is_refused_when_opened_for_reading() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("a.parquet");
    crate::data::local::tests::mkfifo(&fifo);
    let path = fifo.display().to_string();
    let partition = Partition {
        path: path.clone(),
        row_group: 0,
        row_offset: 0,
        row_count: 10,
        file_row_start: 0,
        query_rows: None,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let probe = vec![path.clone()];
    std::thread::spawn(move || {
        let opened = PartitionReader::open(&partition, &["x".into()]).map(|_| ());
        let _ = tx.send((opened, unreadable(&probe)));
    });
    // A plain open of a FIFO waits for a writer for ever: fail instead of hanging.
    let (opened, probed) = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("opening the FIFO hung");
    let refusal = format!("{path}: is a FIFO (named pipe), not a regular file");
    assert_eq!(opened.unwrap_err().to_string(), refusal);
    assert_eq!(probed.map(|e| e.to_string()), Some(refusal));
}
