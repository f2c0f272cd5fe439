//! The data kinds a task reads, each with one converter ([`BatchConverter`]) in a folder of its
//! own: feature columns ([`features`]), encoded images ([`images`]) and token sequences
//! ([`sequences`]). [`converter`] picks the job's once, at setup; everything after it (the
//! reader's decoder threads, the batcher, statistics, evaluation and prediction) goes through
//! the trait, and the batcher cuts rows as the converter's layout says.
//!
//! A new kind is a folder beside these with its converter, and one line in [`converter`]. The
//! streamed Arrow input of the Spark issue (record batches handed to the job instead of read
//! from Parquet files) is to be such a kind, picked here from the spec's source: its converter
//! takes the stream's record batches as the others take a file's; it is not implemented yet.
//!
//! [`features`]: crate::data::features
//! [`images`]: crate::data::images
//! [`sequences`]: crate::data::sequences

use ringflow_core::spec::JobSpec;
use ringflow_ml::nn::ModelShape;

use crate::data::converter::BatchConverter;
use crate::data::features::{Converter, LabelKind};
use crate::data::images::ImageColumn;
use crate::data::images::converter::ImageConverter;
use crate::data::sequences::SequenceConverter;
use crate::error::Result;

/// The converter of the job's features and label (`label`: what it must hold, `None` when
/// prediction reads none), by the kind of data the model reads: token sequences for a sequence
/// model, decoded images with `data.image`, numeric feature columns otherwise.
pub fn converter(
    spec: &JobSpec,
    shape: &ModelShape,
    label: Option<LabelKind>,
) -> Result<Box<dyn BatchConverter>> {
    let data = &spec.data;
    let label_column = label.map(|_| data.label.as_str());
    if let Some(output) = shape.sequence {
        let sequences = SequenceConverter::for_job(spec, label_column, output, shape.outputs)?;
        return Ok(Box::new(sequences));
    }
    let kind = label.unwrap_or(LabelKind::Regression);
    let features = Converter::for_job(spec, label_column, kind, shape.input_width());
    let Some(image) = &data.image else {
        return Ok(Box::new(features));
    };
    // Decoding runs on as many threads as the task computes with (this runs inside its
    // compute pool).
    let decoder = ImageColumn::new(image, rayon::current_num_threads());
    Ok(Box::new(ImageConverter::new(features, decoder)))
}
