//! Fuzz target of loading a saved model: a real checkpoint of a classifier (classes and a
//! normalization) or a tagger (a vocabulary and tags), whose `checkpoint.json` is damaged at
//! its classes, vocabulary, normalization, job spec or model (the top-level one, the job's, or
//! both alike), is refused with one sentence naming the `checkpoint.json` or a tensor file, or,
//! when the damage left a consistent checkpoint, loads a model whose preprocessing fits its
//! tensors: one class name per output, one vocabulary id per embedding row, one mean and
//! standard deviation per input. Never a panic, and never an allocation the tensors do not
//! justify.

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use ringflow_ml::checkpoint::{self, TrainingState};
use ringflow_ml::fuzz::config;
use ringflow_ml::loss::LossKind;
use ringflow_ml::nn::{Model, ModelRegistry, ModelSpec};
use ringflow_ml::{Device, MlError};
use serde_json::Value;

use super::SavedModel;
use super::tests::{classifier, tagger};

/// Writes a checkpoint of the model `job` describes, with `job` and `pre` in its `extra`.
fn save_template(dir: &Path, (job, pre): (Value, Value)) {
    let spec: ModelSpec = serde_json::from_value(job["model"].clone()).unwrap();
    let model = Model::build(&spec, &ModelRegistry::default(), 1, Device::Cpu).unwrap();
    let state = TrainingState {
        epoch: 1,
        step: 1,
        rng: None,
        extra: serde_json::json!({"job": job, "preprocessing": pre}),
    };
    checkpoint::save(dir, &model, None, &state).unwrap();
}

/// One way to damage `checkpoint.json`.
#[derive(Clone, Debug)]
enum Damage {
    /// A field set to a value (`None`: removed).
    Set {
        path: Vec<String>,
        value: Option<Value>,
    },
    /// The same field of the top-level `model` and of `extra.job.model` set alike, so that
    /// only the tensors can tell.
    BothModels { path: Vec<String>, value: Value },
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop_oneof![0u64..8, Just(u64::MAX), Just(1 << 40), any::<u64>()].prop_map(Value::from),
        prop_oneof![Just(-1i64), any::<i64>()].prop_map(Value::from),
        prop_oneof![Just(0.0f64), Just(0.5), Just(1e300), any::<f64>()].prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "<pad>",
            "<unk>",
            "O",
            "B-X",
            "mlp",
            "sequential",
            "embedding",
            "lstm",
            "linear",
            "standard",
            "mse",
            "cross_entropy",
            "binary_cross_entropy",
        ])
        .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Lists of names: classes, or a vocabulary (often starting with the reserved ids).
fn names() -> impl Strategy<Value = Value> {
    let name = prop::sample::select(vec!["<pad>", "<unk>", "a", "b", "c", "d", "e", "O", "B-X"]);
    (
        any::<bool>(),
        prop::collection::vec(name.prop_map(String::from), 0..9),
    )
        .prop_map(|(reserved, mut v)| {
            if reserved {
                v.splice(0..0, ["<pad>".to_string(), "<unk>".to_string()]);
            }
            Value::from(v)
        })
}

/// Lists of numbers: normalization statistics.
fn numbers() -> impl Strategy<Value = Value> {
    let x = prop_oneof![
        Just(0.0f64),
        Just(1.0),
        Just(-1.0),
        Just(f64::MAX),
        any::<f64>()
    ];
    prop::collection::vec(x, 0..7).prop_map(Value::from)
}

/// Layer sizes and counts: mostly small, sometimes huge.
fn size() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => 0u64..9,
        1 => Just(1u64 << 33),
        1 => any::<u64>(),
    ]
    .prop_map(Value::from)
}

fn path(p: &[&str]) -> Vec<String> {
    p.iter().map(|s| s.to_string()).collect()
}

fn damage() -> impl Strategy<Value = Damage> {
    let pre = |f: &str| path(&["extra", "preprocessing", f]);
    let listed = prop_oneof![
        names().prop_map(move |v| (pre("classes"), Some(v))),
        names().prop_map(move |v| (pre("vocabulary"), Some(v))),
        numbers().prop_map(|v| (
            path(&["extra", "preprocessing", "normalize", "mean"]),
            Some(v)
        )),
        numbers().prop_map(|v| (
            path(&["extra", "preprocessing", "normalize", "std"]),
            Some(v)
        )),
    ];
    let fields: Vec<Vec<String>> = [
        &["extra"][..],
        &["extra", "job"],
        &["extra", "preprocessing"],
        &["extra", "preprocessing", "classes"],
        &["extra", "preprocessing", "vocabulary"],
        &["extra", "preprocessing", "normalize"],
        &["extra", "job", "model"],
        &["extra", "job", "model", "layers"],
        &["extra", "job", "model", "classes"],
        &["extra", "job", "train", "loss"],
        &["extra", "job", "train", "batch_size"],
        &["extra", "job", "data", "normalize"],
        &["extra", "job", "data", "label_classes"],
        &["extra", "job", "data", "features"],
        &["model"],
        &["model", "layers"],
        &["model", "kind"],
    ]
    .iter()
    .map(|p| path(p))
    .collect();
    let set = (prop::sample::select(fields), prop::option::of(json_value()));
    let model_fields: Vec<Vec<String>> = [
        &["layers", "0"][..],
        &["layers", "1"],
        &["layers", "2"],
        &["layers", "0", "vocab"],
        &["layers", "0", "dim"],
        &["layers", "1", "hidden"],
        &["classes"],
        &["input"],
    ]
    .iter()
    .map(|p| path(p))
    .collect();
    let both = (prop::sample::select(model_fields), size())
        .prop_map(|(path, value)| Damage::BothModels { path, value });
    prop_oneof![
        2 => listed.prop_map(|(path, value)| Damage::Set { path, value }),
        2 => set.prop_map(|(path, value)| Damage::Set { path, value }),
        2 => both,
    ]
}

/// Sets (or removes) the field at `path` below `root`; numbers index arrays. A path through
/// something else changes nothing.
fn set(root: &mut Value, path: &[String], value: Option<&Value>) {
    let (last, parents) = path.split_last().unwrap();
    let mut at = root;
    for p in parents {
        let next = match at {
            Value::Array(a) => p.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            Value::Object(o) => o.get_mut(p.as_str()),
            _ => None,
        };
        match next {
            Some(next) => at = next,
            None => return,
        }
    }
    match (last.parse::<usize>(), at, value) {
        (Ok(i), Value::Array(a), Some(v)) if i < a.len() => a[i] = v.clone(),
        (_, Value::Object(o), Some(v)) => {
            o.insert(last.clone(), v.clone());
        }
        (_, Value::Object(o), None) => {
            o.remove(last);
        }
        _ => {}
    }
}

fn apply(dir: &Path, d: &Damage) {
    let file = dir.join("checkpoint.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    match d {
        Damage::Set { path, value } => set(&mut m, path, value.as_ref()),
        Damage::BothModels { path, value } => {
            let mut top = vec!["model".to_string()];
            top.extend(path.iter().cloned());
            set(&mut m, &top, Some(value));
            let mut job = ["extra", "job", "model"].map(String::from).to_vec();
            job.extend(path.iter().cloned());
            set(&mut m, &job, Some(value));
        }
    }
    std::fs::write(&file, serde_json::to_vec(&m).unwrap()).unwrap();
}

/// The rows of the model's first embedding table, read from its restored parameters.
fn embedding_rows(model: &Model) -> Option<usize> {
    let store = model.params();
    let p = store.iter().find(|p| p.name == "layers.0.weight")?;
    let embeds = model
        .spec()
        .params
        .get("layers")?
        .get(0)?
        .get("type")?
        .as_str()?
        == "embedding";
    embeds.then(|| p.tensor.shape()[0])
}

/// Loads the damaged checkpoint in `dir` as `eval` and `predict` do.
fn check(dir: &Path) -> Result<(), TestCaseError> {
    let file = dir.join("checkpoint.json").display().to_string();
    let named = |e: &MlError| {
        let msg = e.to_string();
        prop_assert!(
            msg.starts_with(&format!("checkpoint {}/", dir.display())),
            "{}",
            msg
        );
        Ok(())
    };
    let loaded = match checkpoint::load(dir) {
        Ok(l) => l,
        Err(e) => return named(&e),
    };
    let registry = ModelRegistry::default();
    let saved = match SavedModel::read(&loaded.meta, &file, &registry) {
        Ok(s) => s,
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(msg.starts_with(&format!("{file}: ")), "{}", msg);
            prop_assert!(!msg.contains('\n'), "one line: {}", msg);
            return Ok(());
        }
    };
    let model = match loaded.build_model(&saved.spec.model, &registry, 1, Device::Cpu) {
        Ok(m) => m,
        Err(e) => return named(&e),
    };
    // What loaded fits the tensors.
    let shape = model.shape();
    let pre = saved.preprocessing.unwrap_or_default();
    if let Some(classes) = &pre.classes
        && saved.spec.train.loss == LossKind::CrossEntropy
    {
        prop_assert_eq!(classes.len(), shape.outputs, "a class name per output");
    }
    if let Some(v) = &pre.vocabulary {
        prop_assert!(
            shape.sequence.is_some(),
            "a vocabulary on a model of tokens"
        );
        if let Some(rows) = embedding_rows(&model) {
            prop_assert_eq!(v.len(), rows, "a vocabulary id per embedding row");
        }
    }
    if let Some(n) = &pre.normalize {
        prop_assert_eq!(n.mean.len(), shape.input_width());
        prop_assert_eq!(n.std.len(), shape.input_width());
        prop_assert!(n.std.iter().all(|s| s.is_finite() && *s > 0.0));
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn fuzz_saved_model_damage() {
    let root = tempfile::tempdir().unwrap();
    let templates = [root.path().join("classifier"), root.path().join("tagger")];
    save_template(&templates[0], classifier());
    save_template(&templates[1], tagger());
    let mut runner = TestRunner::new(config(256));
    let case = std::sync::atomic::AtomicUsize::new(0);
    runner
        .run(&(any::<bool>(), damage()), |(which, d)| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = root.path().join(format!("case-{n}"));
            copy_dir(&templates[usize::from(which)], &dir);
            apply(&dir, &d);
            check(&dir)?;
            std::fs::remove_dir_all(&dir).unwrap();
            Ok(())
        })
        .unwrap();
}

/// The undamaged templates load, so that the target's refusals are the damage's doing.
#[test]
fn the_templates_load() {
    let root = tempfile::tempdir().unwrap();
    for (name, template) in [("c", classifier()), ("t", tagger())] {
        let dir = root.path().join(name);
        save_template(&dir, template);
        let loaded = checkpoint::load(&dir).unwrap();
        let registry = ModelRegistry::default();
        let saved = SavedModel::read(&loaded.meta, "x", &registry).unwrap();
        loaded
            .build_model(&saved.spec.model, &registry, 1, Device::Cpu)
            .unwrap();
    }
}
