//! `ringflow export --format torch` of taggers: the state_dict in `nn.LSTM`'s and `nn.GRU`'s
//! names (`weight_ih_l0`, `weight_hh_l0_reverse`, both biases) loads into the generated module
//! strictly, and its forward over packed sequences gives `ringflow predict`'s tag and
//! probability of every token of the shipped corpus.

use std::path::Path;

use crate::helpers::{ringflow, s};
use crate::parity::{LIMIT, TAGGER_TEST, TrainedTagger, predicted_tags, python_json, read_all};
use crate::{LOAD_EXPORTED, NEED_TORCH};

/// Loads the module `module` with `state` strictly and tags the rows of tokens at `rows`:
/// each token's `[class, probability]`, the module's tag names and the state_dict's names.
fn torch_tags(module: &Path, state: &Path, rows: &Path) -> serde_json::Value {
    const REST: &str = r#"
rows = json.load(open(rows))
ids = {t: i for i, t in enumerate(m.VOCABULARY)}
longest = max(len(r) for r in rows)
tokens = torch.zeros(len(rows), longest, dtype=torch.int64)
for i, r in enumerate(rows):
    tokens[i, :len(r)] = torch.tensor([ids.get(t, 1) for t in r])
lengths = torch.tensor([len(r) for r in rows])
with torch.no_grad():
    p = model(tokens, lengths).softmax(-1)
print(json.dumps({
    "classes": m.CLASSES,
    "rows": [[[int(t.argmax()), float(t.max())] for t in p[i, :len(r)]] for i, r in enumerate(rows)],
    "tensors": sorted(tensors),
}))
"#;
    python_json(
        &format!("{LOAD_EXPORTED}{REST}"),
        &[s(module), s(state), s(rows)],
        NEED_TORCH,
    )
}

/// Trains, predicts and exports the BiLSTM tagger with `sets` for PyTorch, and compares
/// PyTorch's tags with `predict`'s; returns torch's answer.
fn parity(dir: &Path, name: &str, sets: &[&str]) -> serde_json::Value {
    let trained = TrainedTagger::new(dir, name, sets, "torch");
    let state = &trained.exported;
    let torch = torch_tags(&state.with_extension("py"), state, &trained.rows_json);
    trained.check(&format!("{name} in PyTorch"), &torch);
    torch
}

/// The exported state_dict of a tagger is a source of weights too: `model.init_from` reads
/// `nn.LSTM`'s names back, and the job (its layers frozen, its head at a rate too small to move
/// an f32) predicts as the tagger it came from.
fn read_back(dir: &Path, trained: &TrainedTagger) {
    let run = dir.join("back");
    let sets = [
        "train.epochs=1".to_string(),
        format!("cluster.checkpoint_dir={}", s(&run)),
        format!("model.init_from={}", s(&trained.exported)),
        "model.freeze=[\"layers.0\", \"layers.1\"]".to_string(),
        "train.optimizer={ kind = \"sgd\", lr = 1e-30 }".to_string(),
    ];
    let mut args = vec![
        "local",
        "examples/ner_bilstm.toml",
        "--executors",
        "1",
        "--ui",
        "off",
    ];
    for set in &sets {
        args.extend(["--set", set.as_str()]);
    }
    let run_out = ringflow(&args, LIMIT);
    run_out.assert_success();
    assert!(
        run_out.stderr.contains("model.init_from"),
        "{}",
        run_out.stderr
    );
    let preds = dir.join("back.preds");
    let model = s(&run.join("model"));
    let predict = [
        "predict",
        "--model",
        &model,
        "--data",
        TAGGER_TEST,
        "--output",
        &s(&preds),
        "--id",
        "id",
    ];
    ringflow(&predict, LIMIT).assert_success();
    let again = predicted_tags(&read_all(&preds));
    for (id, row) in &trained.predicted {
        for (j, ((tag, p), (tag2, p2))) in row.iter().zip(&again[id]).enumerate() {
            assert_eq!(tag, tag2, "row {id}, token {j}");
            assert!((p - p2).abs() <= 1e-6, "row {id}, token {j}: {p} then {p2}");
        }
    }
}

#[test]
fn a_bilstm_tagger_exports_to_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    let trained = TrainedTagger::new(dir.path(), "bilstm", &[], "torch");
    let state = &trained.exported;
    let torch = torch_tags(&state.with_extension("py"), state, &trained.rows_json);
    trained.check("bilstm in PyTorch", &torch);
    read_back(dir.path(), &trained);
    let names = torch["tensors"].as_array().unwrap();
    for name in [
        "layers.1.weight_ih_l0",
        "layers.1.weight_hh_l0_reverse",
        "layers.1.bias_hh_l0",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }
}

#[test]
fn a_stacked_bidirectional_gru_tagger_exports_to_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    let layers = "model.layers=[{ type = \"embedding\", dim = 32 }, { type = \"gru\", hidden = \
                  24, layers = 2, bidirectional = true, dropout = 0.2 }, { type = \"relu\" }, \
                  { type = \"linear\" }]";
    let torch = parity(dir.path(), "gru", &[layers]);
    let names = torch["tensors"].as_array().unwrap();
    assert!(
        names.iter().any(|n| n == "layers.1.weight_ih_l1_reverse"),
        "{names:?}"
    );
}
