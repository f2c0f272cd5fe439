//! A column of encoded images (`data.image`): PNG or JPEG bytes that executors decode into
//! `[channels, height, width]` pixels. The planning step declares that shape to the model; the
//! schema check wants the column to hold bytes; and the memory estimate counts what decoding
//! holds ([`decoding_bytes`]) and the pixels the row-group cache keeps ([`cached_bytes`]).

use datafusion::arrow::datatypes::{DataType, Schema};
use ringflow_core::spec::{ImageSpec, JobSpec};
use ringflow_ml::nn::{DataFacts, ModelShape};

use super::columns::{check_example_shape, check_label, no_column};
use super::facts::data_facts;
use super::{KindInput, KindPlan};
use crate::planner::schema_error::SchemaError;
use crate::planner::split::LabelType;

/// The planning step's result for images: the facts of the files' rows, their shape declared
/// by `data.image`.
#[derive(Debug)]
pub(crate) struct ImagesPlan {
    facts: DataFacts,
}

impl ImagesPlan {
    /// Plans the image column of `input`'s job.
    pub(crate) fn new(input: &KindInput<'_>) -> ImagesPlan {
        ImagesPlan {
            facts: data_facts(input, "data.image"),
        }
    }
}

impl KindPlan for ImagesPlan {
    fn facts(&self) -> &DataFacts {
        &self.facts
    }
}

/// Checks `schema` for the image column `image` and the label of `spec`, against `model`:
/// every image gives `channels · height · width` values.
pub(super) fn check_schema(
    schema: &Schema,
    spec: &JobSpec,
    image: &ImageSpec,
    model: &ModelShape,
    label_required: bool,
) -> Result<LabelType, SchemaError> {
    check_image_column(schema, &image.column)?;
    // Saturating: a saved model's spec (eval, predict) was not checked on loading.
    let width = image
        .channels
        .saturating_mul(image.size[0])
        .saturating_mul(image.size[1]);
    check_example_shape(
        Some(width),
        (spec.data.example_shape(), "data.image"),
        model,
    )?;
    check_label(schema, spec, label_required)
}

/// Checks that `schema` has the image column `column` (`data.image.column`) and that it holds
/// bytes.
fn check_image_column(schema: &Schema, column: &str) -> Result<(), SchemaError> {
    let field = schema
        .field_with_name(column)
        .map_err(|_| no_column(column, "data.image.column", schema))?;
    match field.data_type() {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => Ok(()),
        t => Err(SchemaError::NotImageBytes {
            column: column.to_string(),
            ty: t.to_string(),
        }),
    }
}

/// The threads of an executor that decode images at once: its compute threads,
/// `cluster.threads`, or where that is not set, this machine's cores divided among the
/// `world` executors (as `ringflow local` runs them).
pub fn decoding_threads(spec: &JobSpec, world: usize) -> u64 {
    let threads = spec.cluster.threads.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        (cores / world.max(1)).max(1)
    });
    threads.max(1) as u64
}

/// What decoding images holds on one of `world` executors: [`ImageSpec::decoding_bytes`] for
/// each decoding thread (0 without `data.image`).
pub fn decoding_bytes(spec: &JobSpec, world: usize) -> u64 {
    spec.data.image.as_ref().map_or(0, |image: &ImageSpec| {
        image
            .decoding_bytes()
            .saturating_mul(decoding_threads(spec, world))
    })
}

/// What a share of `rows` rows and `bytes` decoded bytes takes in the row-group cache: its
/// decoded size, or, for a column of encoded images that executors decode before caching (no
/// `data.sql`), at least its pixels (one byte per channel).
pub fn cached_bytes(spec: &JobSpec, rows: u64, bytes: u64) -> u64 {
    match &spec.data.image {
        Some(image) if spec.data.sql.is_none() => {
            let pixels = (image.channels as u64)
                .saturating_mul(image.size[0] as u64)
                .saturating_mul(image.size[1] as u64);
            bytes.max(rows.saturating_mul(pixels))
        }
        _ => bytes,
    }
}
