//! The test split (`data.test`) is checked when the job is planned, as the training split is:
//! a tagger's test row with tags of another length than its tokens, or with a tag the training
//! split never holds, stops the job before any executor starts. A test split that fails only as
//! the executors evaluate it (a string label the statistics pass never saw) fails the job with
//! the model saved, and says where.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, Float32Array, StringArray};

use crate::helpers::{job, ringflow, s, write_parquet};
use crate::sequences::strings;

const LONG: Duration = Duration::from_secs(600);

/// 40 rows of 1 to 3 tokens tagged `O`, the first `B-LOC`, with row `bad` replaced.
fn tagged(path: &Path, bad: Option<(usize, Vec<&str>, Vec<&str>)>) {
    let mut tokens: Vec<Vec<&str>> = (0..40)
        .map(|i| ["a", "b", "c"][..1 + i % 3].to_vec())
        .collect();
    let mut tags: Vec<Vec<&str>> = tokens.iter().map(|r| vec!["O"; r.len()]).collect();
    tags[0][0] = "B-LOC";
    if let Some((row, t, g)) = bad {
        (tokens[row], tags[row]) = (t, g);
    }
    let columns = vec![("tokens", strings(&tokens)), ("tags", strings(&tags))];
    write_parquet(path, columns, 16);
}

/// A small GRU tagger over `train` and `test`, evaluated only after training.
fn tagger(dir: &Path, train: &Path, test: &Path) -> String {
    job(
        dir,
        "tagger",
        &format!(
            "[data]\ntrain = \"{}\"\ntest = \"{}\"\nfeatures = [\"tokens\"]\nlabel = \"tags\"\n\
             [model]\nkind = \"sequential\"\nlayers = [{{ type = \"embedding\", dim = 4 }}, \
             {{ type = \"gru\", hidden = 4 }}, {{ type = \"linear\" }}]\n[train]\nepochs = 2\n\
             eval_every_epochs = 0\n[cluster]\ncheckpoint_dir = \"{}\"\n",
            s(train),
            s(test),
            s(&dir.join("tagger"))
        ),
    )
}

/// Regression (issue 39): a test tag the training split never holds, or a test row whose tags
/// are not as many as its tokens, failed the job after the last epoch, with no model written.
/// Both now stop it when it is planned, naming the test file, the row and what is wrong.
#[test]
fn a_bad_test_row_stops_the_job_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (
        dir.path().join("train.parquet"),
        dir.path().join("test.parquet"),
    );
    tagged(&train, None);
    let spec = tagger(dir.path(), &train, &test);
    let cases = [
        (
            (23, vec!["a", "b"], vec!["O", "B-ART"]),
            "row 23 (0-based): column `tags` holds the class \"B-ART\", not one of the 2 \
             classes the model has outputs for",
        ),
        (
            (17, vec!["a", "b", "c"], vec!["O", "O"]),
            "row 17 (0-based): column `tokens` has 3 tokens but column `tags` has 2 labels",
        ),
    ];
    for (bad, expected) in cases {
        tagged(&test, Some(bad));
        let run = ringflow(&["local", &spec, "--executors", "2"], LONG);
        let stderr = run.assert_clean_failure();
        let named = format!("data.test: {}: {expected}", s(&test));
        assert!(stderr.contains(&named), "expected {named:?} in:\n{stderr}");
        assert!(
            !stderr.contains("executor processes"),
            "executors were started:\n{stderr}"
        );
    }
    // The same test split without the bad row trains and evaluates.
    tagged(&test, None);
    ringflow(&["local", &spec, "--executors", "2"], LONG).assert_success();
}

/// Two float features and a string label of `classes` in turn, 64 rows; feature `x0` of row
/// `nan` (if any) is NaN.
pub(crate) fn labelled(path: &Path, classes: &[&str], nan: Option<usize>) {
    let x = |k: f32| -> ArrayRef {
        Arc::new(Float32Array::from_iter_values((0..64).map(|i| {
            match Some(i) == nan && k == 1.0 {
                true => f32::NAN,
                false => (i % 7) as f32 * k,
            }
        })))
    };
    let label: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..64).map(|i| classes[i % classes.len()]),
    ));
    write_parquet(
        path,
        vec![("x0", x(1.0)), ("x1", x(-0.5)), ("label", label)],
        32,
    );
}

/// Regression (issue 39): a job whose final evaluation failed wrote no `model/`. Rank 0 now
/// saves the model before any rank evaluates; the job fails saying where the model is, and the
/// saved model evaluates on good data. (The test split's bad value is one that only reading
/// its rows finds: a class training never saw is refused when the job is planned.)
#[test]
fn a_failed_final_evaluation_leaves_the_model_saved() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (
        dir.path().join("train.parquet"),
        dir.path().join("test.parquet"),
    );
    labelled(&train, &["a", "b"], None);
    labelled(&test, &["a", "b"], Some(37));
    let spec = job(
        dir.path(),
        "classes",
        &format!(
            "[data]\ntrain = \"{}\"\ntest = \"{}\"\nfeatures = [\"x0\", \"x1\"]\nlabel = \
             \"label\"\n[model]\nkind = \"mlp\"\nlayers = [2, 8, 2]\n[train]\nepochs = 1\n\
             batch_size = 8\noptimizer = {{ kind = \"sgd\", lr = 0.1 }}\n[cluster]\n\
             checkpoint_dir = \"{}\"\n",
            s(&train),
            s(&test),
            s(&dir.path().join("classes"))
        ),
    );
    let run = ringflow(&["local", &spec, "--executors", "2"], LONG);
    let stderr = run.assert_clean_failure();
    let model = dir.path().join("classes/model");
    for expected in [
        "the final evaluation of the test split failed",
        "NaN",
        &format!("the trained model is saved in {}", s(&model)),
    ] {
        assert!(
            stderr.contains(expected),
            "expected {expected:?} in:\n{stderr}"
        );
    }
    assert!(model.join("checkpoint.json").is_file(), "{stderr}");
    let eval = ringflow(&["eval", "--model", &s(&model), "--data", &s(&train)], LONG);
    eval.assert_success();
}
