//! Reading a partition of a Parquet file in an object store: with the async Parquet reader,
//! fetching only the footer and the column chunks of the partition's row group that the job
//! needs, with range requests.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use datafusion::parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use futures::StreamExt;
use futures::future::BoxFuture;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use super::super::location::Location;
use super::BatchStream;
use super::error::{BatchError, OpenError};
use super::select::{Opened, select, selection};
use crate::pb::Partition;

/// A Parquet file in an object store, read with range requests (the footer once, then only
/// the column chunks asked for).
pub struct StoreReader {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    size: u64,
}

impl StoreReader {
    /// A reader of the `size`-byte object at `location`.
    pub fn new(location: &Location, size: u64) -> StoreReader {
        StoreReader {
            store: location.store().clone(),
            path: location.path().clone(),
            size,
        }
    }
}

impl AsyncFileReader for StoreReader {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> BoxFuture<'_, datafusion::parquet::errors::Result<Bytes>> {
        Box::pin(async move {
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        })
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> BoxFuture<'_, datafusion::parquet::errors::Result<Vec<Bytes>>> {
        Box::pin(async move {
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(|e| ParquetError::External(Box::new(e)))
        })
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, datafusion::parquet::errors::Result<Arc<ParquetMetaData>>> {
        Box::pin(async move {
            let size = self.size;
            let meta = ParquetMetaDataReader::new()
                .with_prefetch_hint(Some(64 << 10))
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(meta))
        })
    }
}

/// Opens a partition of the Parquet file at `location`, reading its footer, in batches of
/// `batch_rows` rows.
pub(super) async fn open_remote(
    location: Location,
    partition: &Partition,
    columns: &[String],
    whole: bool,
    batch_rows: usize,
) -> Result<Opened<BatchStream>, OpenError> {
    let size = location.size().await.map_err(OpenError::Store)?;
    let mut reader = StoreReader::new(&location, size);
    let meta = ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::default())
        .await
        .map_err(OpenError::NotParquet)?;
    let (roots, rows) = select(partition, columns, meta.metadata(), meta.schema(), whole)?;
    let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta);
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let stream = builder
        .with_row_groups(vec![rows.group])
        .with_projection(mask)
        .with_row_selection(selection(&rows))
        .with_batch_size(batch_rows)
        .build()
        .map_err(OpenError::NoReader)?;
    let schema = stream.schema().clone();
    let stream = stream.map(|r| r.map_err(BatchError::from)).boxed();
    Ok((stream, schema, rows.offset))
}
