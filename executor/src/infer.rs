//! Evaluation and prediction with a saved model: each executor loads the model, reads its
//! share of the data set (through the model's own SQL prep and preprocessing) and either
//! reports loss and accuracy or writes its predictions as a Parquet part.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use datafusion::arrow::array::{ArrayRef, Float32Array, Int64Array, ListArray, StringArray};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use ringflow_core::data::Location;
use ringflow_core::data::location::download_dir;
use ringflow_core::data::paths;
use ringflow_core::data::runtime::block_on;
use ringflow_core::saved::SavedModel;
use ringflow_core::spec::ResolvedSpec;
use ringflow_ml::checkpoint;
use ringflow_ml::loss::LossKind;
use ringflow_ml::nn::{Model, ModelRegistry, SequenceOutput};
use ringflow_ml::{Device, no_grad};

use crate::data::rows::{Batch, Rows};
use crate::data::sequences;
use crate::error::{ExecutorError, Result, Unrunnable};
use crate::train::forward::forward_batch;
use crate::train::setup::{DataOptions, TaskData, prepare_data};
use crate::train::{Split, TaskContext, TrainEvent, evaluate, label_kind};

/// Rows per prediction batch.
const PREDICT_BATCH: usize = ringflow_core::data::PREDICT_BATCH_ROWS;

/// One rank's evaluation or prediction task.
#[derive(Clone, Debug)]
pub struct InferTask {
    /// The job's id.
    pub job_id: String,
    /// The saved model's job spec (resolved when it was trained).
    pub spec: ResolvedSpec,
    /// The saved model's directory (a path or URL).
    pub model_dir: String,
    /// How the task reads its data (the model's preprocessing included).
    pub data: DataOptions,
    /// For prediction: the output directory and the id column (may be empty).
    pub predict: Option<(String, String)>,
    /// This executor's rank.
    pub rank: usize,
    /// Where the model lives: the saved spec's `cluster.device` as placed on this executor (see
    /// [`crate::placement`]).
    pub device: Device,
}

/// Reads and verifies the checkpoint in `dir` (downloading it first when it is in an object
/// store).
pub fn load_checkpoint(dir: &str) -> Result<checkpoint::Loaded> {
    let location = Location::parse(dir).map_err(ExecutorError::Storage)?;
    match location.local_path() {
        Some(local) => Ok(checkpoint::load(&local)?),
        None => {
            let staging = tempfile::tempdir().map_err(|e| {
                ExecutorError::output(format!("create a staging directory for {dir}"), e)
            })?;
            download_dir(&location, staging.path()).map_err(ExecutorError::Storage)?;
            Ok(checkpoint::load(staging.path())?)
        }
    }
}

/// Loads the task's saved model onto its device, once its spec and preprocessing (which the
/// driver read from the same `checkpoint.json`) are checked against that file's own `model`
/// and the model kinds of `registry` ([`SavedModel::check`]); the tensors are checked against
/// the model as they are restored.
pub fn load_model(task: &InferTask, registry: &ModelRegistry) -> Result<Model> {
    let loaded = load_checkpoint(&task.model_dir)?;
    let file = paths::join(&task.model_dir, "checkpoint.json");
    let saved = SavedModel {
        spec: task.spec.clone(),
        preprocessing: task.data.preprocessing.clone(),
    };
    saved.check(&loaded.meta.model, &file, registry)?;
    let spec = &task.spec;
    Ok(loaded.build_model(&spec.model, registry, spec.train.seed, task.device)?)
}

/// Runs an evaluation (reports [`TrainEvent::Evaluated`]) or a prediction (returns the rows
/// written) on this rank's share of the data, with the spec's numerics on this thread.
pub fn run_inference(
    task: &InferTask,
    registry: &ModelRegistry,
    ctx: &mut dyn TaskContext,
) -> Result<u64> {
    let spec = &task.spec;
    let _numerics = crate::train::task_numerics(&spec.train, task.device).enter();
    let model = load_model(task, registry)?;
    let shape = model.shape();
    let label = match task.predict {
        Some(_) => None,
        None => Some(label_kind(spec.train.loss, shape.outputs)),
    };
    let TaskData {
        read,
        converter,
        preprocessing,
        entities,
        ..
    } = prepare_data(spec, &task.data, shape, label, ctx)?;
    let plan = ctx.epoch_plan(Split::Test, 0)?;
    let Some((output, id_column)) = &task.predict else {
        let stats = evaluate(
            &model,
            spec.train.loss,
            &plan,
            (converter, read),
            entities.as_ref(),
        )?;
        ctx.report(TrainEvent::Evaluated(stats))?;
        return Ok(0);
    };
    let id_column = (!id_column.is_empty()).then_some(id_column.as_str());
    let classes = preprocessing.classes.clone();
    let mut writer: Option<ArrowWriter<std::fs::File>> = None;
    let staging = tempfile::NamedTempFile::new()
        .map_err(|e| ExecutorError::output("create a staging file", e))?;
    let mut rows_written = 0u64;
    let device = task.device;
    let stop = AtomicBool::new(false);
    read.for_each_batch(&plan.partitions, &stop, |batch, origin| {
        for start in (0..batch.num_rows()).step_by(PREDICT_BATCH) {
            let part = batch.slice(start, PREDICT_BATCH.min(batch.num_rows() - start));
            let rows = converter.convert(&part, origin.file, origin.first_row + start as u64)?;
            let columns = predict(&model, rows, (spec.train.loss, classes.as_deref()), device)?;
            let mut fields = Vec::new();
            let mut arrays: Vec<ArrayRef> = Vec::new();
            if let Some(id) = id_column {
                let col = part.column_by_name(id).ok_or_else(|| {
                    ExecutorError::data(
                        origin.file,
                        format!(
                            "has no column `{id}` (the --id column) to keep with the predictions"
                        ),
                    )
                })?;
                fields.push(Field::new(id, col.data_type().clone(), true));
                arrays.push(col.clone());
            }
            for (name, array) in columns {
                fields.push(Field::new(name, array.data_type().clone(), false));
                arrays.push(array);
            }
            let out_batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
                .map_err(|e| ExecutorError::output("assemble predictions", e))?;
            if writer.is_none() {
                let file = staging
                    .reopen()
                    .map_err(|e| ExecutorError::output("open the staging file", e))?;
                writer = Some(
                    ArrowWriter::try_new(file, out_batch.schema(), None)
                        .map_err(|e| ExecutorError::output("write predictions", e))?,
                );
            }
            writer
                .as_mut()
                .expect("just created")
                .write(&out_batch)
                .map_err(|e| ExecutorError::output("write predictions", e))?;
            rows_written += out_batch.num_rows() as u64;
        }
        Ok(!ctx.cancelled())
    })?;
    if ctx.cancelled() {
        return Err(ExecutorError::Cancelled);
    }
    let Some(writer) = writer else {
        return Ok(0);
    };
    writer
        .close()
        .map_err(|e| ExecutorError::output("finish the predictions file", e))?;
    let part = Location::parse(output)
        .map_err(ExecutorError::Storage)?
        .join(&format!("part-{:05}.parquet", task.rank));
    let bytes = std::fs::read(staging.path())
        .map_err(|e| ExecutorError::output("read the staged predictions", e))?;
    block_on(async move { part.write(bytes).await }).map_err(ExecutorError::Storage)?;
    Ok(rows_written)
}

/// The prediction columns of converted `rows` (one list per row for a tagger).
fn predict(
    model: &Model,
    rows: Rows,
    (loss, classes): (LossKind, Option<&[String]>),
    device: Device,
) -> Result<Vec<(&'static str, ArrayRef)>> {
    // Prediction is deterministic: dropout is off, so its generator is never drawn from.
    let mut rng = ringflow_ml::rng::seeded(0, 0);
    let shape = model.shape();
    let tagged = (shape.sequence == Some(SequenceOutput::PerStep)).then(|| rows.lengths.clone());
    let mut batch = as_batch(rows, tagged.is_some());
    let out =
        no_grad(|| forward_batch(model, &mut batch, false, &mut rng, device))?.try_to_vec()?;
    let columns = prediction_columns(&out, shape.outputs, loss, classes)?;
    Ok(match tagged {
        Some(lengths) => per_sequence(columns, &lengths),
        None => columns,
    })
}

/// Converted rows as one batch: as they are, or sequences padded to their longest.
fn as_batch(rows: Rows, per_step: bool) -> Batch {
    if rows.lengths.is_empty() {
        return Batch {
            features: rows.features,
            rows: rows.rows,
            ..Batch::default()
        };
    }
    let mut offset = 0;
    let sequences: Vec<_> = (0..rows.rows)
        .map(|i| {
            let s = rows.sequence(i, offset, per_step);
            offset += rows.lengths[i];
            s
        })
        .collect();
    sequences::pad(&sequences, per_step)
}

/// A tagger's per-token prediction columns as one list per row (`lengths` tokens each).
fn per_sequence(
    columns: Vec<(&'static str, ArrayRef)>,
    lengths: &[usize],
) -> Vec<(&'static str, ArrayRef)> {
    columns
        .into_iter()
        .map(|(name, values)| {
            let field = Arc::new(Field::new_list_field(values.data_type().clone(), false));
            let offsets = OffsetBuffer::from_lengths(lengths.iter().copied());
            let list: ArrayRef = Arc::new(ListArray::new(field, offsets, values, None));
            (name, list)
        })
        .collect()
}

/// The prediction columns for `out` (rows × outputs): `prediction` (class name, class index
/// or value) and, for classifiers, `probability` of the predicted class.
fn prediction_columns(
    out: &[f32],
    outputs: usize,
    loss: LossKind,
    classes: Option<&[String]>,
) -> Result<Vec<(&'static str, ArrayRef)>> {
    Ok(match loss {
        LossKind::CrossEntropy => {
            let mut best = Vec::with_capacity(out.len() / outputs);
            let mut prob = Vec::with_capacity(out.len() / outputs);
            for row in out.chunks_exact(outputs) {
                let (mut arg, mut max) = (0, f32::NEG_INFINITY);
                for (i, &v) in row.iter().enumerate() {
                    if v > max {
                        (arg, max) = (i, v);
                    }
                }
                let z: f32 = row.iter().map(|v| (v - max).exp()).sum();
                best.push(arg);
                prob.push(1.0 / z);
            }
            let prediction: ArrayRef = match classes {
                Some(c) => Arc::new(StringArray::from_iter_values(class_names(&best, c)?)),
                None => Arc::new(Int64Array::from_iter_values(best.iter().map(|&i| i as i64))),
            };
            vec![
                ("prediction", prediction),
                ("probability", Arc::new(Float32Array::from(prob))),
            ]
        }
        LossKind::BinaryCrossEntropy => {
            let p: Vec<f32> = out.iter().map(|&z| 1.0 / (1.0 + (-z).exp())).collect();
            let class = Int64Array::from_iter_values(p.iter().map(|&p| (p >= 0.5) as i64));
            vec![
                ("prediction", Arc::new(class) as ArrayRef),
                ("probability", Arc::new(Float32Array::from(p))),
            ]
        }
        LossKind::Mse => vec![(
            "prediction",
            Arc::new(Float32Array::from(out.to_vec())) as ArrayRef,
        )],
    })
}

/// The names of the predicted class indices `best`; an error (never a panic) for an index
/// that `classes` does not name, which the check on load rules out.
fn class_names<'a>(best: &[usize], classes: &'a [String]) -> Result<Vec<&'a str>> {
    best.iter()
        .map(|&i| {
            classes.get(i).map(String::as_str).ok_or_else(|| {
                Unrunnable::UnnamedClass {
                    class: i,
                    classes: classes.len(),
                }
                .into()
            })
        })
        .collect()
}
