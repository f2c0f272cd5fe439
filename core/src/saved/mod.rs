//! A saved model as ringflow's training writes it: the tensor engine's checkpoint
//! (`checkpoint.json` naming the tensor files and the model's spec, `model`), with the job spec
//! it was trained with (`extra.job`) and the preprocessing its data went through
//! (`extra.preprocessing`) in the checkpoint's `extra`.
//!
//! [`SavedModel::read`] reads a `checkpoint.json` and checks its parts against each other, once,
//! wherever a model is loaded (the driver planning `eval` or `predict`; an executor loading
//! the model runs [`SavedModel::check`] on what the driver sent against what it loaded):
//!
//! - `extra.job` is a job spec that passes every check a submitted spec passes, and its model
//!   passes its kind's builder;
//! - `extra.job.model` is the one source of the model's spec (the driver plans with it,
//!   executors build it); the top-level `model` must equal it, and a disagreement is refused
//!   naming the first place at which they differ;
//! - `extra.preprocessing` reads, and fits the model: as many class names as a cross-entropy
//!   model has outputs (and the same as `data.label_classes` when that is set); a vocabulary
//!   only for a model of token sequences, with as many ids as each of its embeddings has rows;
//!   a normalization exactly when `data.normalize` asks for one, as wide as the model's input,
//!   with finite means and positive standard deviations.
//!
//! The tensors are checked against the model built from the spec as they are restored
//! ([`ringflow_ml::checkpoint::Loaded::build_model`]). Each refusal is one sentence naming the
//! `checkpoint.json` and its field, and what the field disagrees with.

mod diff;

use std::path::Path;

use ringflow_ml::checkpoint::CheckpointMeta;
use ringflow_ml::loss::LossKind;
use ringflow_ml::nn::{ModelRegistry, ModelShape, ModelSpec};
use serde_json::Value;

use crate::data::Preprocessing;
use crate::spec::{JobSpec, ResolvedSpec, SpecError};

/// What ends a refusal of a `checkpoint.json` whose parts disagree.
const DAMAGED: &str = "checkpoint.json no longer describes the model its tensors were saved \
                       with: restore it as training wrote it, or train the model again";

/// A saved model's `checkpoint.json` that cannot be used. Each message is one sentence naming
/// the file and the field at fault.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SavedModelError {
    /// A field that is missing or unreadable, or fails the checks of its kind.
    #[error("{file}: {field} {why}")]
    Field {
        /// The `checkpoint.json` (path or URL).
        file: String,
        /// The field, dotted (`extra.job.train.batch_size`).
        field: String,
        /// What is wrong with it, as the end of a sentence.
        why: String,
    },
    /// A field that disagrees with another.
    #[error("{file}: {field} {found}, but {other} {wants}; {DAMAGED}")]
    Disagree {
        /// The `checkpoint.json` (path or URL).
        file: String,
        /// The field, dotted.
        field: String,
        /// What it holds ("names 1 class (\"setosa\")").
        found: String,
        /// The field it disagrees with.
        other: String,
        /// What that one calls for ("gives 3 outputs").
        wants: String,
    },
    /// The top-level `model` is not `extra.job.model`.
    #[error(
        "{file}: model and extra.job.model disagree at {at}: {model} in model, {job} in \
         extra.job.model (the model's spec is read from extra.job.model); {DAMAGED}"
    )]
    ModelDisagrees {
        /// The `checkpoint.json` (path or URL).
        file: String,
        /// Where they first differ (`layers[1]`, `kind`).
        at: String,
        /// The value in `model` (JSON, shortened), or `nothing`.
        model: String,
        /// The value in `extra.job.model`.
        job: String,
    },
}

/// A saved model's job spec and preprocessing, as checked by [`SavedModel::read`].
#[derive(Clone, Debug, PartialEq)]
pub struct SavedModel {
    /// The job spec it was trained with (`extra.job`), as the driver resolved it: its
    /// `model` is the model's spec.
    pub spec: ResolvedSpec,
    /// The preprocessing its data went through (`extra.preprocessing`), if any.
    pub preprocessing: Option<Preprocessing>,
}

impl SavedModel {
    /// Reads `extra.job` and `extra.preprocessing` of `meta` (read from `file`, a path or URL
    /// that errors name) and checks them against each other, against `meta.model` and against
    /// the model kind's builder in `registry`.
    pub fn read(
        meta: &CheckpointMeta,
        file: &str,
        registry: &ModelRegistry,
    ) -> Result<SavedModel, SavedModelError> {
        let field = |field: &str, why: String| SavedModelError::Field {
            file: file.to_string(),
            field: field.to_string(),
            why,
        };
        let job = match meta.extra.get("job") {
            Some(job) if !job.is_null() => job,
            _ => {
                return Err(field(
                    "extra.job",
                    "is missing; is this the model directory of a finished training job?".into(),
                ));
            }
        };
        let spec: ResolvedSpec = serde_path_to_error::deserialize(job).map_err(|e| {
            let at = e.path().to_string();
            let name = if at == "." {
                "extra.job".to_string()
            } else {
                format!("extra.job.{at}")
            };
            field(&name, format!("cannot be read: {}", e.inner()))
        })?;
        let preprocessing = match meta.extra.get("preprocessing") {
            None | Some(Value::Null) => None,
            Some(p) => Some(serde_path_to_error::deserialize(p).map_err(|e| {
                let at = e.path().to_string();
                let name = if at == "." {
                    "extra.preprocessing".to_string()
                } else {
                    format!("extra.preprocessing.{at}")
                };
                field(&name, format!("cannot be read: {}", e.inner()))
            })?),
        };
        let saved = SavedModel {
            spec,
            preprocessing,
        };
        saved.check(&meta.model, file, registry)?;
        Ok(saved)
    }

    /// Checks this spec and preprocessing (read from the `checkpoint.json` at `file`) against
    /// each other, against that file's top-level `model`, and against the model kind's builder
    /// in `registry`.
    pub fn check(
        &self,
        model: &ModelSpec,
        file: &str,
        registry: &ModelRegistry,
    ) -> Result<(), SavedModelError> {
        let spec = &self.spec;
        spec.validate(Path::new(file))
            .map_err(|e| spec_error(file, e))?;
        if let Some((at, model, job)) = diff::first_difference(model, &spec.model) {
            return Err(SavedModelError::ModelDisagrees {
                file: file.to_string(),
                at,
                model,
                job,
            });
        }
        let shape = registry
            .builder(&spec.model)
            .and_then(|b| b.shape(&spec.model))
            .map_err(|e| SavedModelError::Field {
                file: file.to_string(),
                field: "extra.job.model".into(),
                why: format!("is not a model this ringflow can build: {e}"),
            })?;
        let none = Preprocessing::default();
        let checks = Checks {
            file,
            spec,
            shape: &shape,
            pre: self.preprocessing.as_ref().unwrap_or(&none),
        };
        checks.classes()?;
        checks.vocabulary()?;
        checks.normalization()
    }
}

/// A job spec check's refusal, with the key below `extra.job`.
fn spec_error(file: &str, e: SpecError) -> SavedModelError {
    let (field, why) = match e {
        SpecError::Invalid { key, message, .. } if key.is_empty() => {
            ("extra.job".to_string(), message)
        }
        SpecError::Invalid { key, message, .. } => (format!("extra.job.{key}"), message),
        SpecError::UnknownKey { key, .. } => {
            (format!("extra.job.{key}"), "is not a job spec key".into())
        }
        other => ("extra.job".to_string(), other.to_string()),
    };
    SavedModelError::Field {
        file: file.to_string(),
        field,
        why: format!("fails the job spec's checks: {why}"),
    }
}

/// The checks of the preprocessing against the model.
struct Checks<'a> {
    file: &'a str,
    spec: &'a JobSpec,
    shape: &'a ModelShape,
    pre: &'a Preprocessing,
}

impl Checks<'_> {
    fn disagree(&self, field: &str, found: String, other: &str, wants: String) -> SavedModelError {
        SavedModelError::Disagree {
            file: self.file.to_string(),
            field: field.to_string(),
            found,
            other: other.to_string(),
            wants,
        }
    }

    /// A cross-entropy model's classes are its outputs; given classes are those saved.
    fn classes(&self) -> Result<(), SavedModelError> {
        let Some(classes) = &self.pre.classes else {
            return Ok(());
        };
        let field = "extra.preprocessing.classes";
        let found = format!(
            "names {} ({})",
            classes_count(classes.len()),
            preview(classes)
        );
        if self.spec.train.loss == LossKind::CrossEntropy && classes.len() != self.shape.outputs {
            let wants = format!("gives {} outputs", self.shape.outputs);
            return Err(self.disagree(field, found, "extra.job.model", wants));
        }
        if let Some(given) = &self.spec.data.label_classes
            && given != classes
        {
            let wants = format!("names {} ({})", classes_count(given.len()), preview(given));
            return Err(self.disagree(field, found, "extra.job.data.label_classes", wants));
        }
        Ok(())
    }

    /// A vocabulary belongs to a model of token sequences, one id per embedding row.
    fn vocabulary(&self) -> Result<(), SavedModelError> {
        let Some(vocabulary) = &self.pre.vocabulary else {
            return Ok(());
        };
        let field = "extra.preprocessing.vocabulary";
        let found = format!("has {} ids", vocabulary.len());
        if self.shape.sequence.is_none() {
            let wants = "reads no token sequences".to_string();
            return Err(self.disagree(field, found, "extra.job.model", wants));
        }
        for (at, rows) in embedding_rows(&self.spec.model) {
            if rows != Some(vocabulary.len() as u64) {
                let other = format!("extra.job.model.layers[{at}].vocab");
                let wants = match rows {
                    Some(rows) => format!("gives that embedding {rows} rows"),
                    None => "is not a number of rows".into(),
                };
                return Err(self.disagree(field, found, &other, wants));
            }
        }
        Ok(())
    }

    /// A normalization exactly when asked for, one finite mean and positive standard deviation
    /// per input.
    fn normalization(&self) -> Result<(), SavedModelError> {
        let asked = self.spec.data.normalize.is_some() && self.shape.sequence.is_none();
        let field = "extra.preprocessing.normalize";
        let Some(n) = &self.pre.normalize else {
            if asked {
                return Err(self.disagree(
                    "extra.job.data.normalize",
                    "is \"standard\"".into(),
                    "extra.preprocessing",
                    "holds no normalize".into(),
                ));
            }
            return Ok(());
        };
        if !asked {
            let other = "extra.job.data.normalize";
            let wants = "asks for none".to_string();
            return Err(self.disagree(field, "is given".into(), other, wants));
        }
        let width = self.shape.input_width();
        for (part, values) in [("mean", &n.mean), ("std", &n.std)] {
            if values.len() != width {
                let found = format!("has {} values", values.len());
                let wants = format!("takes {width} inputs");
                return Err(self.disagree(
                    &format!("{field}.{part}"),
                    found,
                    "extra.job.model",
                    wants,
                ));
            }
        }
        let bad_mean = n.mean.iter().position(|m| !m.is_finite());
        let bad_std = n.std.iter().position(|s| !(s.is_finite() && *s > 0.0));
        let bad = match (bad_mean, bad_std) {
            (Some(i), _) => Some(("mean", i, n.mean[i], "finite")),
            (None, Some(i)) => Some(("std", i, n.std[i], "positive finite")),
            (None, None) => None,
        };
        match bad {
            Some((part, i, value, what)) => Err(SavedModelError::Field {
                file: self.file.to_string(),
                field: format!("{field}.{part}[{i}]"),
                why: format!("is {value}, not a {what} number; {DAMAGED}"),
            }),
            None => Ok(()),
        }
    }
}

/// The top-level embeddings of a layer list (the ones the vocabulary sizes): their index and
/// `vocab` (`None` when it is not a whole number).
fn embedding_rows(model: &ModelSpec) -> Vec<(usize, Option<u64>)> {
    let Some(Value::Array(layers)) = model.params.get("layers") else {
        return Vec::new();
    };
    layers
        .iter()
        .enumerate()
        .filter(|(_, l)| l.get("type") == Some(&Value::from("embedding")))
        .map(|(i, l)| (i, l.get("vocab").and_then(Value::as_u64)))
        .collect()
}

/// "1 class", "3 classes".
fn classes_count(n: usize) -> String {
    if n == 1 {
        "1 class".into()
    } else {
        format!("{n} classes")
    }
}

/// The first few of `names`, quoted.
fn preview(names: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut out: Vec<String> = names
        .iter()
        .take(SHOWN)
        .map(|n| diff::short(&format!("{n:?}")))
        .collect();
    if names.len() > SHOWN {
        out.push(format!("… {} more", names.len() - SHOWN));
    }
    out.join(", ")
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
