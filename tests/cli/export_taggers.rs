//! `ringflow export --format onnx` of taggers of token sequences: a BiLSTM and a stacked
//! bidirectional GRU trained a few steps on the shipped corpus give, in onnxruntime (token ids
//! from the sidecar's vocabulary, rows padded to the batch's longest with their lengths as an
//! input), `ringflow predict`'s tag and probability of every token (the PyTorch checks are in
//! `tests/interop/taggers.rs`); attention layers are refused by name for now.

use std::path::Path;

use crate::helpers::{ringflow, s};
use crate::parity::{LIMIT, TrainedTagger, python_json};

/// Runs the exported tagger at `model` in onnxruntime on the rows of tokens at `rows` (JSON,
/// a list of lists of strings): each token's `[class, probability]`, row by row.
fn onnxruntime_tags(model: &Path, rows: &Path) -> serde_json::Value {
    const SCRIPT: &str = r#"
import json, sys
try:
    import numpy as np, onnx, onnxruntime as ort
except ImportError as e:
    print(f"MISSING: {e}")
    sys.exit(3)
path, rows = sys.argv[1], json.load(open(sys.argv[2]))
onnx.checker.check_model(onnx.load(path), full_check=True)
sidecar = json.load(open(path + ".json"))
ids = {t: i for i, t in enumerate(sidecar["vocabulary"])}
longest = max(len(r) for r in rows)
tokens = np.zeros((len(rows), longest), dtype=np.int64)
for i, r in enumerate(rows):
    tokens[i, :len(r)] = [ids.get(t, 1) for t in r]
lengths = np.asarray([len(r) for r in rows], dtype=np.int64)
session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
(p,) = session.run(["probabilities"], {"tokens": tokens, "lengths": lengths})
print(json.dumps({
    "classes": sidecar["classes"],
    "rows": [[[int(t.argmax()), float(t.max())] for t in p[i, :len(r)]] for i, r in enumerate(rows)],
}))
"#;
    python_json(
        SCRIPT,
        &[s(model), s(rows)],
        "the onnx and onnxruntime Python packages are needed (testing/run-tests.sh installs \
         them; or python3 -m pip install onnx==1.23.2 onnxruntime==1.31.1)",
    )
}

/// Trains, predicts and exports the BiLSTM tagger with `sets`, and compares onnxruntime's
/// tags with `predict`'s.
fn tagger_parity(dir: &Path, name: &str, sets: &[&str]) -> f64 {
    let trained = TrainedTagger::new(dir, name, sets, "onnx");
    let ort = onnxruntime_tags(&trained.exported, &trained.rows_json);
    trained.check(&format!("{name} in onnxruntime"), &ort)
}

#[test]
fn an_exported_bilstm_tagger_tags_as_ringflow_does_in_onnxruntime() {
    let dir = tempfile::tempdir().unwrap();
    tagger_parity(dir.path(), "bilstm", &[]);
}

/// Two bidirectional GRU layers with dropout between them (the identity at inference).
#[test]
fn an_exported_stacked_bidirectional_gru_tagger_tags_as_ringflow_does() {
    let dir = tempfile::tempdir().unwrap();
    let layers = "model.layers=[{ type = \"embedding\", dim = 32 }, { type = \"gru\", hidden = \
                  24, layers = 2, bidirectional = true, dropout = 0.2 }, { type = \"relu\" }, \
                  { type = \"linear\" }]";
    tagger_parity(dir.path(), "gru", &[layers]);
}

/// A tagger with attention layers is refused by both formats in one sentence naming the
/// layer, and nothing is written.
#[test]
fn a_transformer_tagger_is_refused_by_name_for_now() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let ckpt = format!("cluster.checkpoint_dir={}", s(&run));
    let train = [
        "local",
        "examples/ner_transformer.toml",
        "--executors",
        "1",
        "--ui",
        "off",
    ];
    let sets = ["--set", "train.epochs=1", "--set", &ckpt];
    let args: Vec<&str> = train.iter().chain(sets.iter()).copied().collect();
    ringflow(&args, LIMIT).assert_success();
    let model = s(&run.join("model"));
    for (format, file, name) in [
        ("onnx", "m.onnx", "ONNX"),
        ("torch", "m.safetensors", "PyTorch"),
    ] {
        let out = dir.path().join(file);
        let export = [
            "export",
            "--model",
            &model,
            "--format",
            format,
            "--output",
            &s(&out),
        ];
        let err = ringflow(&export, LIMIT).assert_clean_failure().to_string();
        let want = format!("model.layers[1] (position_embedding) cannot be exported to {name}");
        assert!(err.contains(&want), "{err}");
        assert!(!out.exists(), "{format}: nothing is written");
    }
}
