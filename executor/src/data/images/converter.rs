//! The image kind's converter ([`ImageConverter`]): the decoded pixels of `data.image.column`
//! (a `[C, H, W]` list of bytes per row, which reading decodes before the row-group cache with
//! the converter's [`ImageColumn`]) as rows of `C · H · W` numbers, read as the feature kind
//! reads a list column, so that `data.scale` and `data.normalize` apply as to other features.

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use ringflow_core::data::Preprocessing;

use super::ImageColumn;
use crate::data::converter::{BatchConverter, RowLayout};
use crate::data::features::Converter;
use crate::data::rows::Rows;
use crate::error::Result;

/// Record batches of decoded images to rows of pixels and labels.
#[derive(Clone, Debug)]
pub struct ImageConverter {
    /// The converter of the decoded column, as of any list of numbers.
    pixels: Converter,
    /// The decoder of the encoded column, applied as row groups are read.
    decoder: Arc<ImageColumn>,
}

impl ImageConverter {
    /// The converter of the column `decoder` decodes, whose pixels `pixels` converts (a
    /// converter of that column and the label, as of any list of numbers).
    pub fn new(pixels: Converter, decoder: ImageColumn) -> ImageConverter {
        ImageConverter {
            pixels,
            decoder: Arc::new(decoder),
        }
    }
}

impl BatchConverter for ImageConverter {
    fn columns(&self) -> Vec<String> {
        self.pixels.columns()
    }

    fn convert_into(
        &self,
        batch: &RecordBatch,
        file: &str,
        first_row: u64,
        out: &mut Rows,
    ) -> Result<()> {
        self.pixels.convert_into(batch, file, first_row, out)
    }

    fn layout(&self) -> RowLayout {
        RowLayout::Fixed
    }

    fn with_preprocessing(&self, p: &Preprocessing) -> Result<Box<dyn BatchConverter>> {
        Ok(Box::new(ImageConverter {
            pixels: self.pixels.clone().with_preprocessing(p)?,
            decoder: self.decoder.clone(),
        }))
    }

    fn features_only(&self) -> Box<dyn BatchConverter> {
        Box::new(ImageConverter {
            pixels: self.pixels.features_only(),
            decoder: self.decoder.clone(),
        })
    }

    fn decoder(&self) -> Option<Arc<ImageColumn>> {
        Some(self.decoder.clone())
    }
}
