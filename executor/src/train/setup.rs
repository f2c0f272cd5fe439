//! What a task does with its data before the first step: find out where to read it from
//! (storage or the driver), set up the SQL prep, and, when the spec asks for them, compute
//! whole-data statistics together with the other ranks (a two-phase aggregate merged by the
//! driver).

use ringflow_core::security::ClientSecurity;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ringflow_core::data::partition::{READ_BATCH_ROWS, unreadable};
use ringflow_core::data::prepare::{PartitionSource, ReadCheck};
use ringflow_core::data::stats::{FeatureMoments, MAX_CLASSES};
use ringflow_core::data::{DataStats, Preprocessing};
use ringflow_core::metrics::entities::TagScheme;
use ringflow_core::spec::{JobSpec, Metric};
use ringflow_core::wire::MAX_CLASS_NAME_BYTES;
use ringflow_ml::nn::{ModelShape, SequenceOutput};

use crate::data::augment::Augmenter;
use crate::data::cache::RowGroupCache;
use crate::data::converter::BatchConverter;
use crate::data::features::{LabelKind, string_values};
use crate::data::kinds;
use crate::data::partitions::ReadContext;
use crate::data::prep::SqlPrep;
use crate::data::source::DriverSource;
use crate::error::{ExecutorError, Result, Unrunnable};
use crate::train::context::{Split, TaskContext};

/// The data part of a task, as the driver planned it.
#[derive(Clone, Debug, Default)]
pub struct DataOptions {
    /// The Parquet columns to read (empty: the features and the label).
    pub input_columns: Vec<String>,
    /// Preprocessing known in advance (given label classes; a saved model's).
    pub preprocessing: Option<Preprocessing>,
    /// Compute feature moments before training (`normalize = "standard"`).
    pub collect_moments: bool,
    /// Collect the classes of a string label before training.
    pub collect_labels: bool,
    /// With `data.source = "auto"`: the files to check this executor can read.
    pub probe_files: Option<Vec<String>>,
    /// Read partitions from the driver (`data.source = "driver"`).
    pub source_driver: bool,
    /// The driver's URL (for Arrow Flight).
    pub driver_url: String,
    /// How to reach it: the cluster's secret, TLS.
    pub driver_security: ClientSecurity,
    /// The job's id and ring secret (authorize Flight requests).
    pub job_id: String,
    /// The job's secret.
    pub secret: Vec<u8>,
}

/// A task's data, ready to read.
#[derive(Clone, Debug)]
pub struct TaskData {
    /// How partitions are read and prepared.
    pub read: ReadContext,
    /// Batches to features and labels, with the preprocessing applied: the converter of the
    /// job's data kind.
    pub converter: Arc<dyn BatchConverter>,
    /// The preprocessing (saved with the model).
    pub preprocessing: Preprocessing,
    /// Random crops and flips of training batches (`data.augment`); never applied by
    /// evaluation and prediction.
    pub augment: Option<Augmenter>,
    /// The IOB2 tags of a tagger whose `train.metrics` has `"entity_f1"`.
    pub entities: Option<TagScheme>,
}

/// Sets up reading for `spec` and runs the preparation phases the task asks for. `label` is
/// what the label must hold (`None` for prediction, which reads features only).
pub fn prepare_data(
    spec: &JobSpec,
    options: &DataOptions,
    shape: &ModelShape,
    label: Option<LabelKind>,
    ctx: &mut dyn TaskContext,
) -> Result<TaskData> {
    let data = &spec.data;
    let mut from_driver = options.source_driver;
    if let Some(files) = &options.probe_files {
        let check = ReadCheck {
            unreadable: unreadable(files).map(|e| e.to_string()),
        };
        from_driver = ctx.prepare_source(&check)? == PartitionSource::Driver;
    }
    let driver = if from_driver {
        Some(Arc::new(DriverSource::connect(
            &options.driver_url,
            &options.driver_security,
            &options.job_id,
            &options.secret,
        )?))
    } else {
        None
    };
    let prep = match &data.sql {
        Some(q) => Some(Arc::new(SqlPrep::new(q, &data.tables, data.sql_timeout())?)),
        None => None,
    };
    // The job's data kind, chosen once: every reader, batch and pass below goes through it.
    let converter = kinds::converter(spec, shape, label)?;
    let columns = if options.input_columns.is_empty() {
        converter.columns()
    } else {
        options.input_columns.clone()
    };
    let read = ReadContext {
        columns,
        prep,
        // A budget, not an allocation: the cache holds only row groups really read.
        cache: RowGroupCache::new(data.cache_mb.saturating_mul(1 << 20)),
        driver,
        // The image kind's column of encoded images, decoded as row groups are read.
        images: converter.decoder(),
        // The read-ahead sizes its record batches to the converted row.
        batch_rows: READ_BATCH_ROWS,
        direct: true,
    };
    let mut preprocessing = options.preprocessing.clone().unwrap_or_default();
    if options.collect_moments || options.collect_labels {
        let plan = ctx.epoch_plan(Split::Stats, 0)?;
        let partial = collect_stats(
            &read,
            converter.as_ref(),
            &plan.partitions,
            shape.input_width(),
            options.collect_moments,
            options.collect_labels.then_some(data.label.as_str()),
        )?;
        let merged = ctx.prepare_stats(&partial)?;
        if merged.classes.is_some() {
            preprocessing.classes = merged.classes;
        }
        if merged.normalize.is_some() {
            preprocessing.normalize = merged.normalize;
        }
    }
    let converter = Arc::from(converter.with_preprocessing(&preprocessing)?);
    Ok(TaskData {
        read,
        converter,
        entities: entity_tags(spec, shape, &preprocessing)?,
        preprocessing,
        augment: Augmenter::new(data, spec.train.seed),
    })
}

/// The tag scheme `train.metrics = ["entity_f1"]` reads the classes with; `None` when the
/// metric is not asked for.
fn entity_tags(
    spec: &JobSpec,
    shape: &ModelShape,
    preprocessing: &Preprocessing,
) -> Result<Option<TagScheme>> {
    if !spec.train.metrics.contains(&Metric::EntityF1) {
        return Ok(None);
    }
    if shape.sequence != Some(SequenceOutput::PerStep) {
        return Err(Unrunnable::EntityF1NeedsTagger.into());
    }
    let Some(classes) = &preprocessing.classes else {
        return Err(Unrunnable::EntityF1NeedsTags.into());
    };
    TagScheme::parse(classes)
        .map(Some)
        .map_err(|e| Unrunnable::NotIob2(e).into())
}

/// This rank's partial statistics over `partitions`.
fn collect_stats(
    read: &ReadContext,
    converter: &dyn BatchConverter,
    partitions: &[ringflow_core::pb::Partition],
    width: usize,
    moments: bool,
    label: Option<&str>,
) -> Result<DataStats> {
    let stop = AtomicBool::new(false);
    let raw = converter.features_only();
    let mut m = FeatureMoments::default();
    let mut labels: BTreeSet<String> = BTreeSet::new();
    read.for_each_batch(partitions, &stop, |batch, origin| {
        if moments {
            let rows = raw.convert(batch, origin.file, origin.first_row)?;
            m.add_rows(&rows.features, width);
        }
        if let Some(label) = label {
            let fail = |m: String| ExecutorError::data(origin.file, format!("column `{label}` {m}"));
            let col = batch
                .column_by_name(label)
                .ok_or_else(|| fail("(data.label) is missing from the data".into()))?;
            let values = string_values(col).map_err(|e| fail(e.to_string()))?;
            for (i, v) in values.into_iter().enumerate() {
                match v {
                    Some(v) if v.len() > MAX_CLASS_NAME_BYTES => {
                        return Err(fail(format!(
                            "row {} (0-based): holds a class name of {} bytes, more than the \
                             {MAX_CLASS_NAME_BYTES} bytes a class name may have",
                            origin.first_row + i as u64,
                            v.len()
                        )));
                    }
                    Some(v) => {
                        labels.insert(v);
                    }
                    None => {
                        return Err(fail(format!(
                            "row {} (0-based): the label is null",
                            origin.first_row + i as u64
                        )));
                    }
                }
            }
            if labels.len() > MAX_CLASSES {
                return Err(fail(format!(
                    "(data.label) has more than {MAX_CLASSES} distinct values; is it really a class?"
                )));
            }
        }
        Ok(true)
    })?;
    Ok(DataStats {
        moments: moments.then_some(m),
        labels: label.map(|_| labels),
        tokens: None,
    })
}
