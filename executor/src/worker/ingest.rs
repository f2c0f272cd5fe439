//! `ringflow bench ingest`: Parquet row groups turned into `f32` batches exactly as training
//! reads them — the same readers, decoder threads, converter and batching — and timed.
//!
//! Nothing is cached (the row-group cache is off), so the figure is that of an epoch's first
//! read of its data; nothing trains, so it is the most rows per second ingest can feed.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use ringflow_core::pb::{EpochPlan, Partition};

use crate::data::batches::EpochStream;
use crate::data::cache::RowGroupCache;
use crate::data::features::{Converter, LabelKind};
use crate::data::partitions::ReadContext;
use crate::error::{Result, Unrunnable};

/// What to read.
#[derive(Clone, Debug)]
pub struct IngestSpec {
    /// The row groups to read, in this order.
    pub partitions: Vec<Partition>,
    /// Columns converted into the feature matrix, in this order: numbers and (fixed-size)
    /// lists of numbers.
    pub features: Vec<String>,
    /// A column read as the label (any finite number), besides the features.
    pub label: Option<String>,
    /// Rows per batch.
    pub batch: usize,
}

/// What was read, and how long it took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IngestReport {
    /// Rows converted.
    pub rows: u64,
    /// Batches cut.
    pub batches: u64,
    /// Feature values per row.
    pub width: usize,
    /// Seconds from opening the first partition to the last batch.
    pub seconds: f64,
}

/// Reads every partition of `spec` into batches of `spec.batch` rows and times it.
pub fn measure(spec: &IngestSpec) -> Result<IngestReport> {
    if spec.batch == 0 {
        return Err(Unrunnable::NoBatch.into());
    }
    let mut columns = spec.features.clone();
    columns.extend(spec.label.clone());
    let read = ReadContext {
        columns,
        prep: None,
        cache: RowGroupCache::new(0),
        driver: None,
        images: None,
        // Chunks of whole batches where rows are narrow enough: each is handed over as a
        // batch without a copy.
        batch_rows: spec.batch,
        direct: true,
    };
    let width = width(spec, &read)?;
    let converter = Converter::new(
        &spec.features,
        spec.label.as_deref(),
        LabelKind::Regression,
        None,
        width,
    );
    let plan = EpochPlan {
        epoch: 0,
        rows: spec.partitions.iter().map(|p| p.row_count).sum(),
        partitions: spec.partitions.clone(),
        steps: 1,
        reform: false,
    };
    let start = Instant::now();
    let mut stream =
        EpochStream::start(&plan, Arc::new(converter), width, (None, false), None, read);
    let (mut rows, mut batches) = (0u64, 0u64);
    while let Some(batch) = stream.next_batch(spec.batch)? {
        rows += batch.rows as u64;
        batches += 1;
    }
    Ok(IngestReport {
        rows,
        batches,
        width,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The feature values per row, from the first batch of the first partition (0 without rows).
fn width(spec: &IngestSpec, read: &ReadContext) -> Result<usize> {
    let Some(first) = spec.partitions.first() else {
        return Ok(0);
    };
    let probe = Converter::new(
        &spec.features,
        spec.label.as_deref(),
        LabelKind::Regression,
        None,
        0,
    );
    let mut width = 0;
    read.for_each_batch(
        std::slice::from_ref(first),
        &AtomicBool::new(false),
        |batch, origin| {
            width = probe.width_of(batch, origin.file, origin.first_row)?;
            Ok(false)
        },
    )?;
    Ok(width)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, FixedSizeListArray, Int64Array, UInt8Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::WriterProperties;

    use super::*;

    /// `rows` rows of 3 pixels and a label, in row groups of 1000, and one partition per group.
    fn file(dir: &std::path::Path, rows: usize) -> Vec<Partition> {
        let path = dir.join("p.parquet");
        let item = Arc::new(Field::new("item", DataType::UInt8, false));
        let schema = Arc::new(Schema::new(vec![
            Field::new("label", DataType::Int64, false),
            Field::new("px", DataType::FixedSizeList(item.clone(), 3), false),
        ]));
        let px: Vec<u8> = (0..rows * 3).map(|i| (i % 251) as u8).collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(
                (0..rows as i64).map(|i| i % 10),
            )),
            Arc::new(FixedSizeListArray::new(
                item,
                3,
                Arc::new(UInt8Array::from(px)),
                None,
            )),
        ];
        let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(1000))
            .build();
        let mut w =
            ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(props))
                .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        (0..rows.div_ceil(1000))
            .map(|g| Partition {
                path: path.display().to_string(),
                row_group: g as u32,
                row_offset: 0,
                row_count: (rows - 1000 * g).min(1000) as u64,
                file_row_start: 1000 * g as u64,
                query_rows: None,
            })
            .collect()
    }

    #[test]
    fn every_row_is_read_into_batches_of_the_width_the_columns_give() {
        let dir = tempfile::tempdir().unwrap();
        let spec = IngestSpec {
            partitions: file(dir.path(), 4500),
            features: vec!["px".into(), "label".into()],
            label: Some("label".into()),
            batch: 256,
        };
        let r = measure(&spec).unwrap();
        assert_eq!(
            (r.rows, r.width, r.batches),
            (4500, 4, 4500u64.div_ceil(256))
        );
        // Features alone, without a label.
        let alone = IngestSpec {
            features: vec!["label".into()],
            label: None,
            ..spec
        };
        let r = measure(&alone).unwrap();
        assert_eq!(
            (r.rows, r.width, r.batches),
            (4500, 1, 4500u64.div_ceil(256))
        );
    }

    #[test]
    fn a_missing_column_is_named_with_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let spec = IngestSpec {
            partitions: file(dir.path(), 10),
            features: vec!["pixels".into()],
            label: None,
            batch: 8,
        };
        let e = measure(&spec).unwrap_err().to_string();
        assert!(e.contains("p.parquet") && e.contains("`pixels`"), "{e}");
    }
}
