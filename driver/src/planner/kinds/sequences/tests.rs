//! Recognizing sequence jobs, the memory estimate at the longest sentence, and the errors of
//! an empty tagged split.

use std::sync::Arc;

use datafusion::arrow::datatypes::Field;

use super::*;
use crate::planner::JobPlan;

fn list(t: DataType) -> DataType {
    DataType::List(Arc::new(Field::new_list_field(t, true)))
}

fn spec(features: &str, model: &str) -> JobSpec {
    let text =
        format!("[data]\ntrain = \"t\"\nfeatures = {features}\nlabel = \"y\"\n[model]\n{model}\n");
    JobSpec::parse(&text, "j.toml".as_ref(), &[]).unwrap()
}

fn schema(x: DataType, y: DataType) -> Schema {
    Schema::new(vec![
        Field::new("x", x, false),
        Field::new("z", DataType::Float32, false),
        Field::new("y", y, false),
    ])
}

const MLP: &str = "kind = \"mlp\"\nlayers = [3, 2]";
const EMBEDDING: &str = "kind = \"sequential\"\nlayers = [{ type = \"embedding\", dim = 4 }]";

/// The memory estimate of the shipped tagger with `max_length`: activations per row.
fn activations(max_length: usize) -> u64 {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/data/hironsan-ner");
    let text = format!(
        "[data]\ntrain = \"{data}/train.parquet\"\nfeatures = [\"tokens\"]\nlabel = \
         \"tags\"\nmax_length = {max_length}\non_too_long = \"truncate\"\n[model]\nkind = \"sequential\"\nlayers = \
         [{{ type = \"embedding\", dim = 8 }}, {{ type = \"lstm\", hidden = 8 }}, {{ type = \
         \"linear\" }}]\n"
    );
    let spec = JobSpec::parse(&text, "j.toml".as_ref(), &[]).unwrap();
    let plan = JobPlan::new(spec, &ringflow_ml::nn::ModelRegistry::default());
    plan.unwrap().footprint.unwrap().activations_per_row
}

#[test]
fn the_memory_estimate_takes_the_longest_sentence_not_max_length() {
    // The corpus's longest sentence has 102 tokens: both estimates are for 102 steps.
    assert_eq!(activations(1024), activations(128));
    assert!(activations(50) < activations(128));
}

#[test]
fn strings_are_tokens_and_integers_only_when_the_job_says_so() {
    let ints = schema(list(DataType::Int32), DataType::Int64);
    // A list of integers under an MLP is a feature vector, as before.
    assert_eq!(detect(&spec("[\"x\"]", MLP), &ints), Ok(None));
    let found = detect(&spec("[\"x\"]", EMBEDDING), &ints).unwrap().unwrap();
    assert_eq!((found.tokens, found.per_step), (TokenType::Ids, false));
    let tagged = schema(list(DataType::Int32), list(DataType::Utf8));
    let found = detect(&spec("[\"x\"]", MLP), &tagged).unwrap().unwrap();
    assert!(found.per_step && found.string_labels);
    let strings = schema(list(DataType::Utf8), DataType::Utf8);
    let found = detect(&spec("[\"x\"]", MLP), &strings).unwrap().unwrap();
    assert_eq!((found.tokens, found.per_step), (TokenType::Strings, false));
    let e = detect(&spec("[\"x\", \"z\"]", MLP), &strings)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`x` must be the only feature"), "{e}");
}

/// Regression (issue 39): an empty training split of a tagger with `"entity_f1"` said the
/// tags "need to be names, not integers"; it says the split has no rows. Integer tags are
/// still told to be names.
#[test]
fn an_empty_tagged_split_is_called_empty_not_integer_tags() {
    let text = format!(
        "[data]\ntrain = \"t\"\nfeatures = [\"x\"]\nlabel = \"y\"\n[model]\n{EMBEDDING}\n\
         [train]\nmetrics = [\"entity_f1\"]\n"
    );
    let spec = JobSpec::parse(&text, "j.toml".as_ref(), &[]).unwrap();
    let columns = |string_labels| SequenceColumns {
        column: "x".into(),
        tokens: TokenType::Strings,
        per_step: true,
        string_labels,
    };
    let empty = Preprocessing::default();
    let e = check_metrics(&spec, Some(&columns(true)), &empty)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("data.train: the training split has no rows") && !e.contains("integers"),
        "{e}"
    );
    let e = check_metrics(&spec, Some(&columns(false)), &empty)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("as names (O, B-<type>, I-<type>), not integers"),
        "{e}"
    );
    let counts = SequenceCounts::default();
    assert_eq!(
        counts.outputs(&empty),
        Err(SequenceError::EmptyTrainingSplit)
    );
}
