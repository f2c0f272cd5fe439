//! A saved model's parts checked against each other: each damage a user or a disk can do to
//! `checkpoint.json` is one sentence naming the field and what it disagrees with.

use std::collections::BTreeMap;
use std::path::Path;

use ringflow_ml::checkpoint::CheckpointMeta;
use ringflow_ml::nn::{ModelRegistry, ModelSpec};
use serde_json::{Value, json};

use super::{SavedModel, SavedModelError};
use crate::spec::JobSpec;

const FILE: &str = "runs/x/model/checkpoint.json";

/// A tabular classifier as training saves it: 4 standardized features, 3 string classes.
pub(super) fn classifier() -> (Value, Value) {
    let spec = JobSpec::parse(
        r#"
name = "iris"
[data]
train = "train.parquet"
features = ["a", "b", "c", "d"]
label = "species"
normalize = "standard"
[model]
kind = "mlp"
layers = [4, 5, 3]
[train]
loss = "cross_entropy"
"#,
        Path::new("iris.toml"),
        &[],
    )
    .unwrap();
    let pre = json!({
        "classes": ["setosa", "versicolor", "virginica"],
        "normalize": {"mean": [1.0, 2.0, 3.0, 4.0], "std": [0.5, 0.5, 1.0, 2.0]},
    });
    (serde_json::to_value(spec).unwrap(), pre)
}

/// A tagger of string tokens as training completes and saves it: a vocabulary of 6 ids for
/// its embedding's 6 rows, 3 tags.
pub(super) fn tagger() -> (Value, Value) {
    let spec = JobSpec::parse(
        r#"
name = "tagger"
[data]
train = "train.parquet"
features = ["tokens"]
label = "tags"
max_length = 16
[model]
kind = "sequential"
classes = 3
input = [16]
sequence = true
layers = [
  { type = "embedding", dim = 4, vocab = 6 },
  { type = "lstm", hidden = 3 },
  { type = "linear" },
]
"#,
        Path::new("tagger.toml"),
        &[],
    )
    .unwrap();
    let pre = json!({
        "classes": ["B-X", "I-X", "O"],
        "vocabulary": ["<pad>", "<unk>", "a", "b", "c", "d"],
    });
    (serde_json::to_value(spec).unwrap(), pre)
}

/// The metadata of a checkpoint whose `extra` holds `job` and `pre`, and whose top-level
/// model is `job`'s.
pub(super) fn meta(job: &Value, pre: &Value) -> CheckpointMeta {
    let model: ModelSpec = serde_json::from_value(job["model"].clone()).unwrap();
    CheckpointMeta {
        format: 1,
        model,
        optimizer: None,
        optimizer_steps: 0,
        epoch: 1,
        step: 1,
        rng: None,
        extra: json!({"job": job, "preprocessing": pre, "job_id": "x-1"}),
        generation: 1,
        files: BTreeMap::new(),
    }
}

fn read(meta: &CheckpointMeta) -> Result<SavedModel, SavedModelError> {
    SavedModel::read(meta, FILE, &ModelRegistry::default())
}

fn refusal(meta: &CheckpointMeta) -> String {
    read(meta).expect_err("refused").to_string()
}

/// `meta` with `extra.<path>` (dotted; numbers index arrays) set to `value`.
fn with(meta: &CheckpointMeta, path: &str, value: Value) -> CheckpointMeta {
    let mut m = meta.clone();
    let mut at = &mut m.extra;
    for part in path.split('.') {
        at = match part.parse::<usize>() {
            Ok(i) => &mut at[i],
            Err(_) => &mut at[part],
        };
    }
    *at = value;
    m
}

#[test]
fn what_training_saves_reads_back() {
    for (job, pre) in [classifier(), tagger()] {
        let m = meta(&job, &pre);
        let saved = read(&m).unwrap();
        assert_eq!(serde_json::to_value(&saved.spec).unwrap(), job);
        assert_eq!(
            serde_json::to_value(saved.preprocessing.as_ref().unwrap()).unwrap(),
            pre
        );
    }
    // No preprocessing at all (a regression model of numbers).
    let (mut job, _) = classifier();
    job["data"]["normalize"] = Value::Null;
    job["train"]["loss"] = "mse".into();
    let saved = read(&meta(&job, &Value::Null)).unwrap();
    assert_eq!(saved.preprocessing, None);
}

/// Issue 39 item 4: classes shortened below the model's outputs made `predict` panic.
#[test]
fn classes_that_are_not_the_outputs_are_refused() {
    let (job, pre) = classifier();
    let m = meta(&job, &pre);
    let short = with(&m, "preprocessing.classes", json!(["setosa"]));
    assert_eq!(
        refusal(&short),
        format!(
            "{FILE}: extra.preprocessing.classes names 1 class (\"setosa\"), but \
             extra.job.model gives 3 outputs; {}",
            super::DAMAGED
        )
    );
    let long = with(
        &m,
        "preprocessing.classes",
        json!(["a", "b", "c", "d", "e"]),
    );
    let e = refusal(&long);
    assert!(
        e.contains("names 5 classes (\"a\", \"b\", \"c\", … 2 more), but extra.job.model gives 3"),
        "{e}"
    );
    // Given classes are the ones saved.
    let given = with(&m, "job.data.label_classes", json!(["x", "y", "z"]));
    let e = refusal(&given);
    assert!(
        e.contains("extra.preprocessing.classes names 3 classes")
            && e.contains("but extra.job.data.label_classes names 3 classes (\"x\", \"y\", \"z\")"),
        "{e}"
    );
}

#[test]
fn a_vocabulary_must_fill_its_embedding() {
    let (job, pre) = tagger();
    let m = meta(&job, &pre);
    for tokens in [
        json!(["<pad>", "<unk>", "a"]),
        json!(["<pad>", "<unk>", "a", "b", "c", "d", "e"]),
    ] {
        let n = tokens.as_array().unwrap().len();
        let e = refusal(&with(&m, "preprocessing.vocabulary", tokens));
        assert!(
            e.starts_with(&format!(
                "{FILE}: extra.preprocessing.vocabulary has {n} ids, but \
                 extra.job.model.layers[0].vocab gives that embedding 6 rows; "
            )),
            "{e}"
        );
    }
    let damaged = with(&m, "preprocessing.vocabulary", json!(["a", "b"]));
    let e = refusal(&damaged);
    assert!(
        e.starts_with(&format!(
            "{FILE}: extra.preprocessing.vocabulary cannot be read: "
        )) && e.contains("must start with"),
        "{e}"
    );
    // A vocabulary on a model that reads no tokens.
    let (job, pre) = classifier();
    let m = with(
        &meta(&job, &pre),
        "preprocessing.vocabulary",
        json!(["<pad>", "<unk>"]),
    );
    let e = refusal(&m);
    assert!(
        e.contains(
            "extra.preprocessing.vocabulary has 2 ids, but extra.job.model reads no token sequences"
        ),
        "{e}"
    );
}

#[test]
fn a_normalization_must_be_asked_for_and_fit_the_input() {
    let (job, pre) = classifier();
    let m = meta(&job, &pre);
    let e = refusal(&with(&m, "preprocessing.normalize.std", json!([1.0, 1.0])));
    assert!(
        e.contains(
            "extra.preprocessing.normalize.std has 2 values, but extra.job.model takes 4 inputs"
        ),
        "{e}"
    );
    let e = refusal(&with(
        &m,
        "preprocessing.normalize.std",
        json!([1.0, 0.0, 1.0, 1.0]),
    ));
    assert!(
        e.starts_with(&format!(
            "{FILE}: extra.preprocessing.normalize.std[1] is 0, not a positive finite number"
        )),
        "{e}"
    );
    let e = refusal(&with(&m, "preprocessing.normalize", Value::Null));
    assert!(
        e.contains(
            "extra.job.data.normalize is \"standard\", but extra.preprocessing holds no normalize"
        ),
        "{e}"
    );
    let e = refusal(&with(&m, "job.data.normalize", Value::Null));
    assert!(
        e.contains(
            "extra.preprocessing.normalize is given, but extra.job.data.normalize asks for none"
        ),
        "{e}"
    );
}

/// `extra.job.model` is the model's spec; the top-level `model` must say the same.
#[test]
fn a_top_level_model_that_disagrees_is_refused_naming_where() {
    let (job, pre) = classifier();
    let mut m = meta(&job, &pre);
    m.model = ModelSpec::mlp(&[4, 7, 3], "relu");
    assert_eq!(
        refusal(&m),
        format!(
            "{FILE}: model and extra.job.model disagree at activation: \"relu\" in model, \
             nothing in extra.job.model (the model's spec is read from extra.job.model); {}",
            super::DAMAGED
        )
    );
    let mut m = meta(&job, &pre);
    m.model.params.insert("layers".into(), json!([4, 6, 3]));
    assert!(
        refusal(&m).contains("disagree at layers[1]: 6 in model, 5 in extra.job.model"),
        "{}",
        refusal(&m)
    );
}

#[test]
fn an_unreadable_or_invalid_job_spec_names_its_field() {
    let (job, pre) = classifier();
    let m = meta(&job, &pre);
    let mut none = m.clone();
    none.extra = json!({});
    assert_eq!(
        refusal(&none),
        format!(
            "{FILE}: extra.job is missing; is this the model directory of a finished training job?"
        )
    );
    let e = refusal(&with(&m, "job.train.batch_size", json!("many")));
    assert!(
        e.starts_with(&format!(
            "{FILE}: extra.job.train.batch_size cannot be read: "
        )),
        "{e}"
    );
    let e = refusal(&with(&m, "job.train.batch_size", json!(0)));
    assert!(
        e.starts_with(&format!(
            "{FILE}: extra.job.train.batch_size fails the job spec's checks: "
        )),
        "{e}"
    );
    let mut unknown = with(&m, "job.model.kind", json!("no-such-kind"));
    unknown.model.kind = "no-such-kind".into();
    let e = refusal(&unknown);
    assert!(
        e.starts_with(&format!(
            "{FILE}: extra.job.model is not a model this ringflow can build: "
        )),
        "{e}"
    );
    let e = refusal(&with(&m, "preprocessing.classes", json!(3)));
    assert!(
        e.starts_with(&format!(
            "{FILE}: extra.preprocessing.classes cannot be read: "
        )),
        "{e}"
    );
}
