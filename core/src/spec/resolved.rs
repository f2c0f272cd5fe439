//! [`ResolvedSpec`]: a job spec as the driver resolved it, the second step of a spec's life
//! cycle. A user writes a spec ([`super::SpecAsWritten`], read into a checked [`JobSpec`]); the
//! driver's planner completes its model from the data (input shape, classes, vocabulary size)
//! and only then is it a `ResolvedSpec`. Executors, checkpoints and saved models take this type
//! and no other, so a spec whose model the data has not completed cannot reach them: on the
//! wire it is its own payload kind, `resolved job spec`, and an executor refuses a plain one.

use std::ops::Deref;

use ringflow_ml::nn::ModelSpec;
use serde::{Deserialize, Serialize};

use super::JobSpec;

/// A checked job spec whose model the driver completed from the job's data.
///
/// It reads as the [`JobSpec`] it holds (through `Deref`); it cannot be changed in place, so
/// what executors train is what the driver planned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ResolvedSpec(JobSpec);

impl ResolvedSpec {
    /// `spec` with its model replaced by `model`, the model the driver's planner completed
    /// from the data and checked against it.
    pub fn completed(spec: JobSpec, model: ModelSpec) -> ResolvedSpec {
        ResolvedSpec(JobSpec { model, ..spec })
    }

    /// `spec` as it is, for a spec whose model needs nothing from the data (every field of
    /// it written, as in a saved model's `extra.job` or a test's plan).
    pub fn as_given(spec: JobSpec) -> ResolvedSpec {
        ResolvedSpec(spec)
    }

    /// The job spec it holds.
    pub fn spec(&self) -> &JobSpec {
        &self.0
    }

    /// The job spec it holds, no longer marked resolved (to be planned again, as `--resume`
    /// does with a saved job).
    pub fn into_spec(self) -> JobSpec {
        self.0
    }
}

impl Deref for ResolvedSpec {
    type Target = JobSpec;

    fn deref(&self) -> &JobSpec {
        &self.0
    }
}

impl crate::wire::payload::Payload for ResolvedSpec {
    const WHAT: &'static str = "resolved job spec";
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::wire::payload::{self, PayloadError};

    fn spec() -> JobSpec {
        let text = r#"
[data]
train = "x.parquet"
features = ["a"]
label = "y"
[model]
kind = "mlp"
layers = [0, 4, 0]
"#;
        JobSpec::parse(text, Path::new("j.toml"), &[]).unwrap()
    }

    #[test]
    fn a_completed_spec_holds_the_planned_model_and_the_rest_as_written() {
        let written = spec();
        let model = ModelSpec::mlp(&[3, 4, 2], "relu");
        assert_ne!(written.model, model);
        let resolved = ResolvedSpec::completed(written.clone(), model.clone());
        assert_eq!(resolved.model, model);
        assert_eq!(resolved.data, written.data);
        assert_eq!(resolved.train, written.train);
        assert_eq!(resolved.into_spec().model, model);
    }

    #[test]
    fn a_resolved_spec_travels_as_its_own_payload_kind() {
        let resolved = ResolvedSpec::as_given(spec());
        let text = payload::encode(&resolved);
        let back: ResolvedSpec = payload::decode("TaskHeader.job", &text).unwrap();
        assert_eq!(back, resolved);
        // Its JSON is the spec's own, so a checkpoint's `extra.job` reads as either.
        assert_eq!(
            serde_json::to_string(&resolved).unwrap(),
            resolved.to_json()
        );
    }

    #[test]
    fn an_executor_refuses_a_spec_the_driver_did_not_resolve() {
        let plain = payload::encode(&spec());
        let err = payload::decode::<ResolvedSpec>("TaskHeader.job", &plain).unwrap_err();
        assert!(matches!(err, PayloadError::Kind { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("TaskHeader.job"), "{text}");
        assert!(text.contains("resolved job spec"), "{text}");
    }
}
