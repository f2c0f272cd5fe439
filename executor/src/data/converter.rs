//! What every data kind's converter does ([`BatchConverter`]): the rows of an Arrow record
//! batch to the numbers the kind's model input is cut from, and how the batcher cuts them
//! ([`RowLayout`]). Each kind's converter is in its kind's folder ([`features`], [`images`],
//! [`sequences`]), and one is chosen per task, at setup ([`kinds`]).
//!
//! [`features`]: crate::data::features
//! [`images`]: crate::data::images
//! [`sequences`]: crate::data::sequences
//! [`kinds`]: crate::data::kinds

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use ringflow_core::data::Preprocessing;
use ringflow_core::pb::Partition;

use crate::data::images::ImageColumn;
use crate::data::rows::Rows;
use crate::error::Result;

/// How a kind's converted rows are cut into batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowLayout {
    /// Rows of one width, the model's input width (feature columns, images): a fixed-width
    /// shuffle buffer, and batches of `rows × width` values.
    Fixed,
    /// Rows of lengths of their own ([`Rows::lengths`]): token sequences, each batch padded to
    /// its own longest; with `per_step`, one label per token.
    Sequences {
        /// The labels are one per token (tagging).
        per_step: bool,
        /// The first token id of those the training split holds once (see
        /// [`crate::data::sequences::unknown`]).
        singletons_from: Option<u32>,
    },
}

/// A partition's rows read straight from a local file's pages, chunk by chunk, instead of
/// through Arrow (see [`DirectReader`](crate::data::features::DirectReader)).
pub trait DirectRows {
    /// Reads the next `rows` rows into `out`; false, with `out` unspecified, where they cannot
    /// be read this way (the caller then reads them through Arrow).
    fn read(&mut self, rows: usize, out: &mut Rows) -> bool;
}

/// One data kind's converter: record batches with the job's columns to converted [`Rows`],
/// which the batcher cuts into the model's input batches as the kind's [`RowLayout`] says.
/// Conversion is deterministic, and every value that cannot be converted is an error naming its
/// file, column and row.
pub trait BatchConverter: std::fmt::Debug + Send + Sync {
    /// The columns a reader must provide.
    fn columns(&self) -> Vec<String>;

    /// Converts `batch`, whose first row is row `first_row` of `file`, into `out`, whose
    /// buffers may be reused (what it held is replaced).
    fn convert_into(
        &self,
        batch: &RecordBatch,
        file: &str,
        first_row: u64,
        out: &mut Rows,
    ) -> Result<()>;

    /// Converts `batch`, whose first row is row `first_row` of `file`.
    fn convert(&self, batch: &RecordBatch, file: &str, first_row: u64) -> Result<Rows> {
        let mut rows = Rows::default();
        self.convert_into(batch, file, first_row, &mut rows)?;
        Ok(rows)
    }

    /// How the batcher cuts the converted rows.
    fn layout(&self) -> RowLayout;

    /// The same converter with the whole-data preprocessing applied (label classes,
    /// standardization, a vocabulary), or why the model cannot take it.
    fn with_preprocessing(&self, p: &Preprocessing) -> Result<Box<dyn BatchConverter>>;

    /// The converter of the statistics pass: the same features, without the label and without
    /// standardization.
    fn features_only(&self) -> Box<dyn BatchConverter>;

    /// A direct reader of `partition` of the local file at `path`, positioned at its first
    /// row; `None` (the default) where this kind or the file does not allow one.
    fn direct_rows(&self, path: &Path, partition: &Partition) -> Option<Box<dyn DirectRows + '_>> {
        let _ = (path, partition);
        None
    }

    /// The column of encoded images that reading decodes before the row-group cache, so that
    /// later epochs find pixels (the image kind's); `None` (the default) for kinds read as
    /// stored.
    fn decoder(&self) -> Option<Arc<ImageColumn>> {
        None
    }
}
