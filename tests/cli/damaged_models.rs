//! A saved model whose `checkpoint.json` no longer matches itself or its tensors (issue 39,
//! item 4): class names shortened below the model's outputs made `predict` panic (status 101)
//! where `eval` gave a sentence. Every such damage — classes, vocabulary, the top-level model
//! disagreeing with the job's, a tensor's shape — is one sentence naming the file and the
//! field, a non-zero exit and no panic, for `eval` and `predict` alike, and no predictions.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{Run, job, repo, ringflow, s};
use crate::outputs::files_below;

const DEADLINE: Duration = Duration::from_secs(300);

/// The line `ringflow local` prints once its executor processes run.
const STARTED: &str = "executor processes (pids";

/// The iris example (string classes, standardized features) trained for two epochs in
/// `dir/iris`; returns its model directory.
fn iris(dir: &Path) -> PathBuf {
    let ckpt = format!("cluster.checkpoint_dir={}", s(&dir.join("iris")));
    ringflow(
        &[
            "local",
            "examples/iris.toml",
            "--set",
            &ckpt,
            "--set",
            "train.epochs=2",
            "--ui",
            "off",
        ],
        DEADLINE,
    )
    .assert_success();
    dir.join("iris/model")
}

/// A small tagger of the shipped corpus (a vocabulary of string tokens, tags) trained for one
/// epoch in `dir/tagger`; returns its model directory.
fn tagger(dir: &Path) -> PathBuf {
    let data = repo().join("examples/data/hironsan-ner");
    let spec = job(
        dir,
        "tagger",
        &format!(
            r#"
[data]
train = "{train}"
features = ["tokens"]
label = "tags"
[model]
kind = "sequential"
layers = [
  {{ type = "embedding", dim = 8 }},
  {{ type = "lstm", hidden = 8 }},
  {{ type = "linear" }},
]
[train]
epochs = 1
batch_size = 64
optimizer = {{ kind = "adam", lr = 0.01 }}
[cluster]
checkpoint_dir = "{ckpt}"
"#,
            train = s(&data.join("train.parquet")),
            ckpt = s(&dir.join("tagger")),
        ),
    );
    ringflow(&["local", &spec, "--ui", "off"], DEADLINE).assert_success();
    dir.join("tagger/model")
}

/// A copy of the model directory `model` in `dir/<name>`, its `checkpoint.json` changed by
/// `damage`.
fn damaged(model: &Path, dir: &Path, name: &str, damage: impl FnOnce(&mut Value)) -> PathBuf {
    let copy = dir.join(name);
    std::fs::create_dir_all(&copy).unwrap();
    for f in std::fs::read_dir(model).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), copy.join(f.file_name())).unwrap();
    }
    let meta = copy.join("checkpoint.json");
    let mut json: Value = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    damage(&mut json);
    std::fs::write(&meta, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    copy
}

/// `eval` and `predict` of `model` over `data`: each fails cleanly with one error line holding
/// every needle (and, when `planning`, before any executor starts), and writes no predictions.
fn refused_alike(model: &Path, data: &str, needles: &[&str], planning: bool) {
    let preds = model.with_file_name(format!(
        "{}-preds",
        model.file_name().unwrap().to_string_lossy()
    ));
    let m = s(model);
    let p = s(&preds);
    let runs: [(&str, Run); 2] = [
        (
            "eval",
            ringflow(&["eval", "--model", &m, "--data", data], DEADLINE),
        ),
        (
            "predict",
            ringflow(
                &["predict", "--model", &m, "--data", data, "--output", &p],
                DEADLINE,
            ),
        ),
    ];
    for (command, run) in &runs {
        let stderr = run.assert_clean_failure();
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("error: "))
            .collect();
        assert_eq!(errors.len(), 1, "{command}: one error line:\n{stderr}");
        for needle in needles {
            assert!(
                errors[0].contains(needle),
                "{command}: {needle:?} in:\n{stderr}"
            );
        }
        assert_eq!(
            stderr.contains(STARTED),
            !planning,
            "{command}: refused {} any executor started:\n{stderr}",
            if planning { "before" } else { "after" }
        );
    }
    let written = if preds.exists() {
        files_below(&preds)
    } else {
        Vec::new()
    };
    assert!(written.is_empty(), "predictions were written: {written:?}");
}

/// The SHA-256 of `path`, in hex.
fn sha256(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// Classes shortened below the model's outputs (the issue's panic), class names that are not
/// the model's, and a top-level model that disagrees with the job's: refused by the driver.
#[test]
fn a_damaged_classifier_is_refused_in_one_sentence_by_eval_and_predict() {
    let dir = tempfile::tempdir().unwrap();
    let model = iris(dir.path());
    let test = s(&repo().join("examples/data/iris/test.parquet"));
    let short = damaged(&model, dir.path(), "short", |m| {
        m["extra"]["preprocessing"]["classes"] = serde_json::json!(["setosa"]);
    });
    let file = s(&short.join("checkpoint.json"));
    refused_alike(
        &short,
        &test,
        &[&format!(
            "{file}: extra.preprocessing.classes names 1 class (\"setosa\"), but \
             extra.job.model gives 3 outputs"
        )],
        true,
    );
    let wider = damaged(&model, dir.path(), "wider", |m| {
        m["model"]["layers"][1] = 17.into();
    });
    let file = s(&wider.join("checkpoint.json"));
    refused_alike(
        &wider,
        &test,
        &[&format!(
            "{file}: model and extra.job.model disagree at layers[1]: 17 in model, 16 in \
             extra.job.model"
        )],
        true,
    );
    let narrow = damaged(&model, dir.path(), "narrow", |m| {
        m["extra"]["preprocessing"]["normalize"]["std"] = serde_json::json!([1.0, 1.0]);
    });
    refused_alike(
        &narrow,
        &test,
        &["extra.preprocessing.normalize.std has 2 values, but extra.job.model takes 4 inputs"],
        true,
    );
}

/// The model's spec changed in both places alike, and a tensor's shape changed (with its
/// checksum fixed): the tensors tell, when the executor restores them.
#[test]
fn tensors_that_do_not_fit_the_spec_are_refused_in_one_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let model = iris(dir.path());
    let test = s(&repo().join("examples/data/iris/test.parquet"));
    let narrower = damaged(&model, dir.path(), "narrower", |m| {
        m["model"]["layers"][1] = 15.into();
        m["extra"]["job"]["model"]["layers"][1] = 15.into();
    });
    refused_alike(
        &narrower,
        &test,
        &[
            "model-000001.safetensors",
            "has shape [",
            "16",
            "the model needs [",
            "15",
        ],
        false,
    );
    let wider = damaged(&model, dir.path(), "wider", |m| {
        m["model"]["layers"][1] = 1000.into();
        m["extra"]["job"]["model"]["layers"][1] = 1000.into();
    });
    refused_alike(
        &wider,
        &test,
        &["model-000001.safetensors", "do not belong together"],
        false,
    );

    // layers.0.weight saved as [4, 16], rewritten as [16, 4] (the same bytes), checksum fixed.
    let reshaped = damaged(&model, dir.path(), "reshaped", |_| {});
    let tensors = reshaped.join("model-000001.safetensors");
    let bytes = std::fs::read(&tensors).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    let mut json: Value = serde_json::from_str(header).unwrap();
    assert_eq!(json["layers.0.weight"]["shape"], serde_json::json!([4, 16]));
    json["layers.0.weight"]["shape"] = serde_json::json!([16, 4]);
    let mut text = serde_json::to_vec(&json).unwrap();
    text.resize(n.max(text.len()), b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(&bytes[8 + n..]);
    std::fs::write(&tensors, out).unwrap();
    let meta = reshaped.join("checkpoint.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    m["files"]["model"]["sha256"] = sha256(&tensors).into();
    std::fs::write(&meta, serde_json::to_vec(&m).unwrap()).unwrap();
    refused_alike(
        &reshaped,
        &test,
        &[&format!(
            "{}: parameter \"layers.0.weight\" has shape [16, 4], the model needs [4, 16]",
            s(&tensors)
        )],
        false,
    );
}

/// A vocabulary shortened below its embedding's rows (tokens that would silently read as
/// unknown), and one with a repeated token.
#[test]
fn a_damaged_vocabulary_is_refused_in_one_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let model = tagger(dir.path());
    let test = s(&repo().join("examples/data/hironsan-ner/test.parquet"));
    let meta: Value =
        serde_json::from_slice(&std::fs::read(model.join("checkpoint.json")).unwrap()).unwrap();
    let rows = meta["extra"]["job"]["model"]["layers"][0]["vocab"]
        .as_u64()
        .unwrap();
    let short = damaged(&model, dir.path(), "short", |m| {
        let tokens = m["extra"]["preprocessing"]["vocabulary"]
            .as_array_mut()
            .unwrap();
        tokens.truncate(10);
    });
    refused_alike(
        &short,
        &test,
        &[&format!(
            "extra.preprocessing.vocabulary has 10 ids, but extra.job.model.layers[0].vocab \
             gives that embedding {rows} rows"
        )],
        true,
    );
    let repeated = damaged(&model, dir.path(), "repeated", |m| {
        let tokens = m["extra"]["preprocessing"]["vocabulary"]
            .as_array_mut()
            .unwrap();
        tokens[3] = tokens[2].clone();
    });
    refused_alike(
        &repeated,
        &test,
        &[
            "extra.preprocessing.vocabulary cannot be read",
            "appears twice",
        ],
        true,
    );
}
