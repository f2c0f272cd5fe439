//! Epoch streams of fixed-width rows: every row once, in the order of one-at-a-time drawing,
//! and no reservation beyond the data; and the helpers other tests read data with.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Float32Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use ringflow_core::pb::Partition;

use super::*;
use crate::data::cache::RowGroupCache;
use crate::data::features::{Converter, LabelKind};

/// How the tests read columns `x` and `y`: no SQL, no cache, no driver, no images.
pub(crate) fn read_context() -> ReadContext {
    ReadContext {
        columns: vec!["x".into(), "y".into()],
        prep: None,
        cache: RowGroupCache::new(0),
        driver: None,
        images: None,
        batch_rows: ringflow_core::data::partition::READ_BATCH_ROWS,
        direct: true,
    }
}

/// A Parquet file with `rows` rows of `x = i` and `y = 2i`, in row groups of 100, and the
/// plan that reads all of it.
pub(crate) fn data(dir: &std::path::Path, rows: usize) -> EpochPlan {
    let path = dir.join("d.parquet");
    let schema = Arc::new(Schema::new(vec![
        Field::new("x", DataType::Float32, false),
        Field::new("y", DataType::Float32, false),
    ]));
    let x: Vec<f32> = (0..rows).map(|i| i as f32).collect();
    let y: Vec<f32> = x.iter().map(|v| 2.0 * v).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Float32Array::from(x)),
        Arc::new(Float32Array::from(y)),
    ];
    let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(100))
        .build();
    let file = std::fs::File::create(&path).unwrap();
    let mut w = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let groups = rows.div_ceil(100);
    let partitions = (0..groups)
        .map(|g| Partition {
            path: path.display().to_string(),
            row_group: g as u32,
            row_offset: 0,
            row_count: (rows - 100 * g).min(100) as u64,
            file_row_start: 100 * g as u64,
            query_rows: None,
        })
        .collect();
    EpochPlan {
        epoch: 0,
        partitions,
        rows: rows as u64,
        steps: 1,
        reform: false,
    }
}

pub(crate) fn stream(plan: &EpochPlan, shuffle: Option<usize>) -> EpochStream {
    let converter = Converter::new(
        &["x".to_string()],
        Some("y"),
        LabelKind::Regression,
        None,
        1,
    );
    let read = read_context();
    let shuffle = shuffle.map(|rows| (rows, ringflow_ml::rng::seeded(7, 0)));
    EpochStream::start(plan, Arc::new(converter), 1, (shuffle, false), None, read)
}

/// Every row of the batch, checked against its label.
fn values(batch: &Batch) -> Vec<u32> {
    for (x, y) in batch.features.iter().zip(&batch.labels) {
        assert_eq!(2.0 * x, *y, "a feature lost its label");
    }
    let mut v: Vec<u32> = batch.features.iter().map(|&x| x as u32).collect();
    v.sort_unstable();
    v
}

#[test]
fn a_batch_far_beyond_the_data_is_the_whole_share() {
    let dir = tempfile::tempdir().unwrap();
    let plan = data(dir.path(), 250);
    for shuffle in [None, Some(64), Some(usize::MAX)] {
        let mut s = stream(&plan, shuffle);
        // Reserving this many rows up front would fail outright.
        let batch = s.next_batch(usize::MAX / 2).unwrap().expect("one batch");
        assert_eq!(batch.rows, 250, "shuffle {shuffle:?}");
        assert_eq!(values(&batch), (0..250).collect::<Vec<_>>());
        assert!(
            batch.features.capacity() <= 250,
            "reserved {} rows for 250",
            batch.features.capacity()
        );
        assert!(s.next_batch(usize::MAX / 2).unwrap().is_none());
    }
}

#[test]
fn batches_cover_the_epoch_once_whatever_the_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let plan = data(dir.path(), 250);
    for shuffle in [None, Some(1), Some(64), Some(usize::MAX)] {
        let mut s = stream(&plan, shuffle);
        let mut seen = Vec::new();
        while let Some(b) = s.next_batch(32).unwrap() {
            assert!(b.rows <= 32);
            seen.extend(values(&b));
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..250).collect::<Vec<_>>(), "shuffle {shuffle:?}");
    }
}

/// The rows come in the order of TensorFlow's `shuffle(buffer_size)` drawing one row at a
/// time (here simulated on the row numbers with the stream's generator), also where rows
/// are drawn several at a time while the current chunk refills them: every batch holds the
/// same rows in the same order.
#[test]
fn batches_draw_rows_in_the_order_of_one_at_a_time() {
    use rand::RngExt;
    let dir = tempfile::tempdir().unwrap();
    let (rows, capacity, size) = (250, 64, 32);
    let plan = data(dir.path(), rows);
    let mut rng = ringflow_ml::rng::seeded(7, 0);
    let mut upcoming = 0..rows as u32;
    let mut buffer: Vec<u32> = upcoming.by_ref().take(capacity).collect();
    let mut want = Vec::new();
    while !buffer.is_empty() {
        let mut batch = Vec::new();
        while batch.len() < size && !buffer.is_empty() {
            let i = rng.random_range(0..buffer.len());
            batch.push(buffer[i]);
            match upcoming.next() {
                Some(row) => buffer[i] = row,
                None => drop(buffer.swap_remove(i)),
            }
        }
        want.push(batch);
    }
    let mut s = stream(&plan, Some(capacity));
    let mut got = Vec::new();
    while let Some(b) = s.next_batch(size).unwrap() {
        values(&b);
        got.push(b.features.iter().map(|&x| x as u32).collect::<Vec<_>>());
    }
    assert_eq!(got, want);
}
