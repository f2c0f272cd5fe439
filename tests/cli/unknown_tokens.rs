//! Unknown tokens are trained (issue 41, item 5): on a generated corpus whose test split's
//! names are all new, a tagger trained with the default `data.vocab.singleton_unk` tags them
//! about as well as names it saw, because the `<unk>` row it gives them was trained; the job
//! reports the test split's share of tokens outside the vocabulary.

use std::path::Path;
use std::time::Duration;

use rand::{RngExt, SeedableRng};

use crate::helpers::{job, ringflow, s, summary, write_parquet};
use crate::sequences::strings;

const LONG: Duration = Duration::from_secs(600);

/// The frequent words between the names (tag `O`).
const FILLERS: [&str; 12] = [
    "the", "a", "went", "saw", "and", "then", "was", "very", "it", "on", "we", "they",
];

/// `rows` sentences of fillers with one or two names each (tag `B-PER`); a name is
/// `name_of(k)` for the `k`-th name written, so only rarity tells a name: there is no word
/// that announces one. Returns the tokens and tags.
fn sentences(
    rows: usize,
    seed: u64,
    mut name_of: impl FnMut(usize) -> String,
) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut tokens, mut tags) = (Vec::new(), Vec::new());
    let mut names = 0;
    for _ in 0..rows {
        let (mut t, mut g) = (Vec::new(), Vec::new());
        for _ in 0..rng.random_range(1..=2) {
            for _ in 0..rng.random_range(1..4) {
                t.push(FILLERS[rng.random_range(0..FILLERS.len())].to_string());
                g.push("O".to_string());
            }
            t.push(name_of(names));
            g.push("B-PER".to_string());
            names += 1;
        }
        tokens.push(t);
        tags.push(g);
    }
    (tokens, tags)
}

/// The rows of `rows` as string slices.
fn borrow(rows: &[Vec<String>]) -> Vec<Vec<&str>> {
    rows.iter()
        .map(|r| r.iter().map(String::as_str).collect())
        .collect()
}

/// Writes `tokens` and `tags` as list<string> columns.
fn write(path: &Path, (tokens, tags): (Vec<Vec<String>>, Vec<Vec<String>>)) {
    let columns = vec![
        ("tokens", strings(&borrow(&tokens))),
        ("tags", strings(&borrow(&tags))),
    ];
    write_parquet(path, columns, 500);
}

/// Test accuracy of the model in `model` on `data`.
fn accuracy(dir: &Path, model: &Path, data: &Path) -> f64 {
    let out = dir.join(format!(
        "{}.json",
        data.file_stem().unwrap().to_string_lossy()
    ));
    let args = [
        "eval",
        "--model",
        &s(model),
        "--data",
        &s(data),
        "--summary-json",
        &s(&out),
    ];
    ringflow(&args, LONG).assert_success();
    summary(&out)["test_accuracy"].as_f64().unwrap()
}

#[test]
fn names_never_seen_in_training_are_tagged_as_well_as_those_seen() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    // Every training name is written once: the vocabulary's tail, seen once.
    write(
        &p("train.parquet"),
        sentences(2000, 1, |k| format!("name{k}")),
    );
    // The test split's names are all new; the same sentences with names training saw are the
    // in-vocabulary twin.
    write(
        &p("unseen.parquet"),
        sentences(300, 2, |k| format!("new{k}")),
    );
    write(
        &p("seen.parquet"),
        sentences(300, 2, |k| format!("name{}", k * 3)),
    );
    let spec = job(
        dir.path(),
        "tagger",
        &format!(
            r#"[data]
train = "{train}"
test = "{test}"
features = ["tokens"]
label = "tags"
[model]
kind = "sequential"
layers = [
  {{ type = "embedding", dim = 32 }},
  {{ type = "lstm", hidden = 16, bidirectional = true }},
  {{ type = "linear" }},
]
[train]
epochs = 4
batch_size = 32
optimizer = {{ kind = "adam", lr = 0.01 }}
[cluster]
executors = 2
"#,
            train = s(&p("train.parquet")),
            test = s(&p("unseen.parquet")),
        ),
    );
    let mut unk_rows = Vec::new();
    for rate in ["0.5", "0"] {
        let out = p(&format!("summary-{rate}.json"));
        let set = format!("data.vocab.singleton_unk={rate}");
        let run_dir = format!("cluster.checkpoint_dir={}", s(&p(&format!("run-{rate}"))));
        let args = [
            "local", &spec, "--ui", "off", "--set", &set, "--set", &run_dir,
        ];
        let run = ringflow(&[&args[..], &["--summary-json", &s(&out)]].concat(), LONG);
        run.assert_success();
        let model = p(&format!("run-{rate}/model"));
        unk_rows.push(unk_row(&model));
        if rate == "0" {
            continue;
        }
        // One or two new names in every 3 to 10 tokens.
        let share = summary(&out)["test_unknown_token_rate"].as_f64().unwrap();
        assert!((0.15..0.45).contains(&share), "{share}");
        let line = "are not in the vocabulary and reach the model as <unk>";
        assert!(run.stderr.contains(line), "{}", run.stderr);
        let unseen = accuracy(dir.path(), &model, &p("unseen.parquet"));
        let seen = accuracy(dir.path(), &model, &p("seen.parquet"));
        eprintln!("test accuracy {unseen} on unseen names, {seen} on seen ones");
        assert!(
            seen - unseen <= 0.02,
            "unseen names {unseen}, seen ones {seen}"
        );
    }
    // The same seed starts both runs from the same weights: only the trained <unk> row moved.
    assert_ne!(
        unk_rows[0], unk_rows[1],
        "the <unk> row trains only with singleton_unk > 0"
    );
}

/// The `<unk>` row (id 1) of the saved model's embedding.
fn unk_row(model: &Path) -> Vec<u32> {
    let loaded = ringflow_ml::checkpoint::load(model).unwrap();
    let (_, shape, values) = loaded
        .model_tensors()
        .find(|(name, _, _)| *name == "layers.0.weight")
        .expect("an embedding");
    let dim = shape[1];
    values[dim..2 * dim].iter().map(|v| v.to_bits()).collect()
}
