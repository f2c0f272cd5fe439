//! Token sequences end to end: a tagger of the shipped Japanese corpus on 1 and 2 executors
//! (vocabulary and tags from the statistics pass, metrics, `eval`, `predict` writing one list
//! of tags per row), a sequence classifier of integer tokens, and rows that break the rules
//! (tags of another length, empty, too long, null) refused by file, row and lengths.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{
    ArrayRef, AsArray, Int64Array, Int64Builder, ListBuilder, StringBuilder,
};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::helpers::{job, repo, ringflow, s, summary, write_parquet};

const LONG: Duration = Duration::from_secs(600);

/// A small BiLSTM tagger of the corpus's `label` column (`tags` or `pos`).
fn tagger(dir: &Path, name: &str, label: &str, extra: &str) -> String {
    let data = repo().join("examples/data/hironsan-ner");
    job(
        dir,
        name,
        &format!(
            r#"
[data]
train = "{train}"
test = "{test}"
features = ["tokens"]
label = "{label}"
{extra}
[model]
kind = "sequential"
layers = [
  {{ type = "embedding", dim = 32 }},
  {{ type = "lstm", hidden = 32, bidirectional = true }},
  {{ type = "linear" }},
]
[train]
epochs = 3
batch_size = 32
optimizer = {{ kind = "adam", lr = 0.01 }}
metrics = ["accuracy", "entity_f1"]
[cluster]
checkpoint_dir = "{ckpt}"
"#,
            train = s(&data.join("train.parquet")),
            test = s(&data.join("test.parquet")),
            ckpt = s(&dir.join(name)),
        ),
    )
}

fn train(spec: &str, executors: &str, out: &Path) -> serde_json::Value {
    ringflow(
        &[
            "local",
            spec,
            "--executors",
            executors,
            "--summary-json",
            &s(out),
        ],
        LONG,
    )
    .assert_success();
    summary(out)
}

/// The shipped tagger trains on 1 and on 2 executors with the same figures reported;
/// `eval` reproduces the test figures and `predict` writes one tag per token.
#[test]
fn a_tagger_trains_on_one_and_two_executors_and_predicts_a_tag_per_token() {
    let dir = tempfile::tempdir().unwrap();
    let spec = tagger(dir.path(), "ner", "tags", "");
    let one = train(&spec, "1", &dir.path().join("one.json"));
    for key in [
        "test_accuracy",
        "test_entity_f1",
        "test_entity_precision",
        "test_entity_recall",
        "train_tokens_per_s",
        "padding_fraction",
    ] {
        assert!(one[key].is_number(), "{key} missing: {one}");
    }
    // The test split's 1,164 real tokens, not its padded steps.
    assert_eq!(one["test_rows"], 1164, "{one}");
    let accuracy = one["test_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.8, "token accuracy {accuracy}");
    let padding = one["padding_fraction"].as_f64().unwrap();
    assert!((0.0..0.2).contains(&padding), "bucketed padding {padding}");
    let two = train(&spec, "2", &dir.path().join("two.json"));
    assert_eq!(two["replicas_identical"], true, "{two}");
    assert!(two["test_accuracy"].as_f64().unwrap() > 0.8, "{two}");

    let model = s(&dir.path().join("ner/model"));
    let test = repo().join("examples/data/hironsan-ner/test.parquet");
    let eval_out = dir.path().join("eval.json");
    ringflow(
        &[
            "eval",
            "--model",
            &model,
            "--data",
            &s(&test),
            "--summary-json",
            &s(&eval_out),
        ],
        LONG,
    )
    .assert_success();
    let eval = summary(&eval_out);
    for key in ["test_accuracy", "test_entity_f1"] {
        assert_eq!(eval[key], two[key], "{key}: {eval} vs {two}");
    }
    let preds = dir.path().join("preds");
    ringflow(
        &[
            "predict",
            "--model",
            &model,
            "--data",
            &s(&test),
            "--output",
            &s(&preds),
            "--id",
            "id",
        ],
        LONG,
    )
    .assert_success();
    check_predicted_tags(&preds, &test);
    a_checkpoint_without_preprocessing_is_named(&dir.path().join("ner/model"), &test);
}

/// Regression (issue 39): `eval` of the tagger's model whose checkpoint.json lost its
/// preprocessing blamed `"entity_f1"`; it says that the checkpoint holds no preprocessing.
fn a_checkpoint_without_preprocessing_is_named(model: &Path, test: &Path) {
    let stripped = model.with_file_name("stripped");
    std::fs::create_dir(&stripped).unwrap();
    for entry in std::fs::read_dir(model).unwrap() {
        let from = entry.unwrap().path();
        assert!(
            from.is_file(),
            "a model directory holds files: {}",
            from.display()
        );
        std::fs::copy(&from, stripped.join(from.file_name().unwrap())).unwrap();
    }
    let meta = stripped.join("checkpoint.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
    assert!(json["extra"]["preprocessing"].is_object(), "{json}");
    json["extra"]
        .as_object_mut()
        .unwrap()
        .remove("preprocessing");
    std::fs::write(&meta, json.to_string()).unwrap();
    let run = ringflow(
        &["eval", "--model", &s(&stripped), "--data", &s(test)],
        LONG,
    );
    let stderr = run.assert_clean_failure();
    assert!(
        stderr.contains(
            "its checkpoint.json holds no preprocessing, but the model needs the tag \
                         classes"
        ) && !stderr.contains("\"entity_f1\" needs"),
        "{stderr}"
    );
}

/// Every prediction row is a list of tags as long as its sentence, each a tag of the corpus.
fn check_predicted_tags(preds: &Path, test: &Path) {
    let lengths = |path: &Path, column: &str| -> Vec<(i64, usize)> {
        let file = std::fs::File::open(path).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap();
        let mut out = Vec::new();
        for batch in reader {
            let batch = batch.unwrap();
            let ids = batch.column_by_name("id").unwrap();
            let ids = datafusion::arrow::compute::cast(
                ids,
                &datafusion::arrow::datatypes::DataType::Int64,
            )
            .unwrap();
            let ids = ids.as_primitive::<datafusion::arrow::datatypes::Int64Type>();
            let list = batch.column_by_name(column).unwrap().as_list::<i32>();
            for (i, id) in ids.iter().enumerate() {
                if column == "prediction" {
                    let tags = list.value(i);
                    for t in tags.as_string::<i32>().iter() {
                        let t = t.unwrap();
                        assert!(
                            t == "O" || t.starts_with("B-") || t.starts_with("I-"),
                            "{t}"
                        );
                    }
                }
                out.push((id.unwrap(), list.value_length(i) as usize));
            }
        }
        out.sort_unstable();
        out
    };
    let part = std::fs::read_dir(preds)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .expect("a predictions file");
    assert_eq!(lengths(&part, "prediction"), lengths(test, "tokens"));
}

/// Lists of `values` per row, as a list<string> column.
pub(crate) fn strings(rows: &[Vec<&str>]) -> ArrayRef {
    strings_with_null(rows, None)
}

/// Lists of `values` per row, as a list<string> column, with row `null` (if any) null.
fn strings_with_null(rows: &[Vec<&str>], null: Option<usize>) -> ArrayRef {
    let mut b = ListBuilder::new(StringBuilder::new());
    for (i, row) in rows.iter().enumerate() {
        let valid = Some(i) != null;
        if valid {
            for v in row {
                b.values().append_value(v);
            }
        }
        b.append(valid);
    }
    Arc::new(b.finish())
}

/// Rows of tokens and tags where row `bad` is replaced by `tokens`/`tags`.
fn tagged_file(path: &Path, bad: usize, tokens: Vec<&str>, tags: Vec<&str>) {
    let mut t: Vec<Vec<&str>> = (0..40)
        .map(|i| vec!["a", "b", "c"][..1 + i % 3].to_vec())
        .collect();
    let mut g: Vec<Vec<&str>> = t.iter().map(|r| vec!["O"; r.len()]).collect();
    g[0][0] = "B-LOC";
    t[bad] = tokens;
    g[bad] = tags;
    write_parquet(
        path,
        vec![("tokens", strings(&t)), ("tags", strings(&g))],
        16,
    );
}

/// Tags of another length than their tokens, an empty sentence, one longer than
/// `data.max_length`, and a null list fail before training with one sentence naming file, row
/// and lengths; `on_too_long = "truncate"` trains on the long one's first steps.
#[test]
fn bad_sequences_are_refused_by_file_row_and_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.parquet");
    let spec = |extra: &str| {
        job(
            dir.path(),
            "bad",
            &format!(
                "[data]\ntrain = \"{}\"\nfeatures = [\"tokens\"]\nlabel = \"tags\"\nmax_length = \
                 4\n{extra}\n[model]\nkind = \"sequential\"\nlayers = [{{ type = \"embedding\", \
                 dim = 4 }}, {{ type = \"gru\", hidden = 4 }}, {{ type = \"linear\" }}]\n\
                 [cluster]\ncheckpoint_dir = \"{}\"\n",
                s(&file),
                s(&dir.path().join("bad"))
            ),
        )
    };
    let cases: [(usize, Vec<&str>, Vec<&str>, &str); 3] = [
        (
            17,
            vec!["a", "b", "c"],
            vec!["O", "O"],
            "row 17 (0-based): column `tokens` has 3 tokens but column `tags` has 2 labels",
        ),
        (
            22,
            vec![],
            vec![],
            "row 22 (0-based): the sequence in column `tokens` is empty",
        ),
        (
            35,
            vec!["a"; 6],
            vec!["O"; 6],
            "row 35 (0-based): the sequence in column `tokens` has 6 tokens, more than \
             data.max_length = 4",
        ),
    ];
    for (row, tokens, tags, expected) in cases {
        tagged_file(&file, row, tokens, tags);
        let run = ringflow(&["local", &spec("")], LONG);
        let stderr = run.assert_clean_failure();
        assert!(
            stderr.contains(&s(&file)) && stderr.contains(expected),
            "row {row}: {stderr}"
        );
    }
    let run = ringflow(&["local", &spec("on_too_long = \"truncate\"")], LONG);
    run.assert_success();

    // Regression (issue 39): a null list in the third row group (rows 32 to 47) was "row 5
    // of the batch"; it is named by its row in the file.
    let tokens: Vec<Vec<&str>> = (0..40).map(|_| vec!["a"]).collect();
    let tags: Vec<Vec<&str>> = (0..40).map(|_| vec!["O"]).collect();
    let columns = vec![
        ("tokens", strings_with_null(&tokens, Some(37))),
        ("tags", strings(&tags)),
    ];
    write_parquet(&file, columns, 16);
    let run = ringflow(&["local", &spec("")], LONG);
    let stderr = run.assert_clean_failure();
    assert!(
        stderr.contains(&s(&file))
            && stderr.contains("column `tokens` is null at row 37 (0-based)"),
        "{stderr}"
    );

    // Regression (issue 39): an empty training split of a tagger with "entity_f1" said the
    // tags "need to be names, not integers"; it says that the split has no rows.
    write_parquet(
        &file,
        vec![("tokens", strings(&[])), ("tags", strings(&[]))],
        16,
    );
    let run = ringflow(
        &["local", &spec("[train]\nmetrics = [\"entity_f1\"]")],
        LONG,
    );
    let stderr = run.assert_clean_failure();
    assert!(
        stderr.contains("data.train: the training split has no rows")
            && !stderr.contains("integers"),
        "{stderr}"
    );
}

/// Integer tokens with one label per sequence: a GRU and max pooling over the real steps learn
/// whether a sequence holds the token 7, on 2 executors.
#[test]
fn a_sequence_classifier_of_integer_tokens_learns() {
    let dir = tempfile::tempdir().unwrap();
    let mut tokens = ListBuilder::new(Int64Builder::new());
    let mut labels = Vec::new();
    let mut state = 12345u64;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    for _ in 0..800 {
        let len = 2 + next(10) as usize;
        let row: Vec<i64> = (0..len).map(|_| 1 + next(15) as i64).collect();
        labels.push(i64::from(row.contains(&7)));
        for t in &row {
            tokens.values().append_value(*t);
        }
        tokens.append(true);
    }
    let tokens: ArrayRef = Arc::new(tokens.finish());
    let labels: ArrayRef = Arc::new(Int64Array::from(labels));
    let file = dir.path().join("seq.parquet");
    write_parquet(&file, vec![("tokens", tokens), ("label", labels)], 200);
    let spec = job(
        dir.path(),
        "cls",
        &format!(
            r#"
[data]
train = "{f}"
test = "{f}"
features = ["tokens"]
label = "label"
[model]
kind = "sequential"
layers = [
  {{ type = "embedding", dim = 8 }},
  {{ type = "gru", hidden = 16 }},
  {{ type = "sequence_pool", reduce = "max" }},
  {{ type = "linear" }},
]
[train]
epochs = 8
batch_size = 32
optimizer = {{ kind = "adam", lr = 0.02 }}
[cluster]
checkpoint_dir = "{ckpt}"
"#,
            f = s(&file),
            ckpt = s(&dir.path().join("cls"))
        ),
    );
    let out = dir.path().join("cls.json");
    let summary = train(&spec, "2", &out);
    let accuracy = summary["test_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.95, "{summary}");
    assert_eq!(
        summary["test_rows"], 800,
        "one label per sequence: {summary}"
    );
    assert!(summary.get("test_entity_f1").is_none(), "{summary}");
}
