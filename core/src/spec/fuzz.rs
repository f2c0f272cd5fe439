//! Fuzz targets of the job-spec parser and `--set`: any TOML document, any override, any text
//! gives a spec or one error sentence that names the key (or, for text that is not TOML, the
//! file); never a panic. Valid specs survive a round trip through TOML and through `--set`.

use std::path::Path;

use proptest::prelude::*;
use toml::{Table, Value};

use super::error::shown;
use super::{JobSpec, Override, SpecError};
use ringflow_ml::fuzz::config;

/// A valid spec that the generated assignments change.
const BASE: &str = r#"
name = "fuzz"
[data]
train = "train.parquet"
features = ["image"]
label = "label"
[model]
kind = "mlp"
layers = [784, 10]
"#;

/// Every key of the spec's shape (and a few inside `model` that the MLP builder reads).
const KEYS: &[&str] = &[
    "name",
    "data",
    "data.train",
    "data.test",
    "data.sql",
    "data.tables",
    "data.tables.lookup",
    "data.features",
    "data.label",
    "data.label_classes",
    "data.scale",
    "data.normalize",
    "data.source",
    "data.shuffle_buffer",
    "data.cache_mb",
    "data.sql_timeout_s",
    "data.vocab",
    "data.vocab.max_size",
    "data.vocab.min_count",
    "data.vocab.max_token_bytes",
    "data.max_length",
    "data.on_too_long",
    "data.bucket_by_length",
    "model",
    "model.kind",
    "model.layers",
    "model.activation",
    "model.dropout",
    "train",
    "train.epochs",
    "train.batch_size",
    "train.optimizer",
    "train.optimizer.kind",
    "train.optimizer.lr",
    "train.optimizer.momentum",
    "train.optimizer.dampening",
    "train.optimizer.nesterov",
    "train.optimizer.weight_decay",
    "train.optimizer.initial_accumulator",
    "train.optimizer.eps",
    "train.optimizer.beta1",
    "train.optimizer.beta2",
    "train.schedule",
    "train.schedule.kind",
    "train.schedule.step_size",
    "train.schedule.gamma",
    "train.schedule.warmup_steps",
    "train.schedule.min_lr",
    "train.loss",
    "train.seed",
    "train.clip_grad_norm",
    "train.lr_scaling",
    "train.eval_every_epochs",
    "train.metrics",
    "train.matmul_precision",
    "train.winograd",
    "cluster",
    "cluster.executors",
    "cluster.device",
    "cluster.checkpoint_dir",
    "cluster.threads",
    "cluster.rendezvous_timeout_s",
    "cluster.comm_timeout_s",
    "cluster.min_executors",
    "cluster.max_executors",
    "cluster.checkpoint_every_steps",
    "cluster.fusion",
    "cluster.backup_workers",
    "cluster.compression",
    "cluster.shared_memory",
];

/// Words that are valid somewhere in a spec, and some that are valid nowhere.
const WORDS: &[&str] = &[
    "mlp",
    "relu",
    "tanh",
    "sgd",
    "adagrad",
    "adam",
    "adamw",
    "step",
    "cosine",
    "constant",
    "cross_entropy",
    "mse",
    "binary_cross_entropy",
    "none",
    "fp16",
    "bf16",
    "f32",
    "linear",
    "sqrt",
    "standard",
    "auto",
    "direct",
    "driver",
    "cpu",
    "cuda",
    "cuda:1",
    "cuda:-1",
    "image",
    "label",
    "x",
    "runs/x",
    "s3://bucket/x",
    "/",
    "",
    " ",
    ".",
    "..",
    "a/b",
    "SELECT * FROM input",
    "näme",
    "\n",
    "tab\there",
    "\"",
];

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(WORDS).prop_map(str::to_string),
        1 => any::<String>(),
    ]
}

/// Any TOML scalar, biased towards the edges of every range.
fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop_oneof![
            Just(0i64),
            Just(1),
            Just(2),
            Just(3),
            Just(-1),
            Just(i64::MAX),
            Just(i64::MIN),
            Just(u32::MAX as i64 + 1),
            0i64..1000,
            any::<i64>(),
        ]
        .prop_map(Value::Integer),
        prop_oneof![
            Just(0.05),
            Just(0.0),
            Just(-0.0),
            Just(-1.0),
            Just(1e-45),
            Just(1e39),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            any::<f64>(),
        ]
        .prop_map(Value::Float),
        any::<bool>().prop_map(Value::Boolean),
        word().prop_map(Value::String),
        Just(Value::Datetime("1979-05-27T07:32:00Z".parse().unwrap())),
    ]
}

/// Any TOML value: scalars, arrays and inline tables, a few levels deep.
fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key_part(), inner, 0..4)
                .prop_map(|m| Value::Table(m.into_iter().collect())),
        ]
    })
}

fn key_part() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(KEYS).prop_map(|k| k.rsplit('.').next().unwrap().to_string()),
        1 => "[a-z_]{1,8}",
        1 => Just("new\nline".to_string()),
        1 => any::<String>().prop_filter("a key has a name", |s| !s.is_empty()),
    ]
}

/// A dotted path: mostly a key of the spec, sometimes one a level below it or made up.
fn path() -> impl Strategy<Value = Vec<String>> {
    let known = prop::sample::select(KEYS).prop_map(|k| k.split('.').map(String::from).collect());
    prop_oneof![
        6 => known.clone(),
        1 => (known, key_part()).prop_map(|(mut p, k): (Vec<String>, String)| {
            p.push(k);
            p
        }),
        1 => prop::collection::vec(key_part(), 1..4),
    ]
}

fn assignments() -> impl Strategy<Value = Vec<(Vec<String>, Value)>> {
    prop::collection::vec((path(), value()), 0..6)
}

/// The base spec with `assignments` applied (those that do not fit the document's shape are
/// left out), and the paths that were set.
fn document(assignments: &[(Vec<String>, Value)]) -> (Table, Vec<String>) {
    let mut doc: Table = BASE.parse().unwrap();
    let mut set = Vec::new();
    for (path, value) in assignments {
        let key = path.join(".");
        if Override::flag("--fuzz", &key, value.clone())
            .apply(&mut doc)
            .is_ok()
        {
            set.push(key);
        }
    }
    (doc, set)
}

fn parse(text: &str, overrides: &[Override]) -> Result<JobSpec, SpecError> {
    JobSpec::parse(text, Path::new("fuzz/job.toml"), overrides)
}

/// Whether `key` is a key a refusal may name: a key of the spec, one that was set, or one
/// inside a value that was set (an inline table's field).
fn nameable(key: &str, set: &[String]) -> bool {
    // An element of an array is named by its index (`data.features[0]`, `model.x[0].y`).
    let key = without_indices(key);
    let key = key.as_str();
    KEYS.contains(&key)
        || set.iter().any(|s| {
            key == s || key.starts_with(&format!("{s}.")) || s.starts_with(&format!("{key}."))
        })
}

/// `key` without the array indices in it: `a[0].b[12]` → `a.b`.
fn without_indices(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut rest = key;
    while let Some(open) = rest.find('[') {
        let close = rest[open..].find(']').map(|c| open + c);
        match close {
            Some(close)
                if close > open + 1
                    && rest[open + 1..close].bytes().all(|b| b.is_ascii_digit()) =>
            {
                out.push_str(&rest[..open]);
                rest = &rest[close + 1..];
            }
            _ => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The property every parse must have: a checked spec that survives a round trip, or one
/// sentence that names the file and a key that is really there (or missing).
fn check(result: Result<JobSpec, SpecError>, set: &[String]) -> Result<(), TestCaseError> {
    let e = match result {
        Ok(spec) => return check_round_trip(&spec),
        Err(e) => e,
    };
    let msg = e.to_string();
    prop_assert!(!msg.contains('\n'), "more than one line: {msg}");
    prop_assert!(
        msg.contains("fuzz/job.toml"),
        "the file is not named: {msg}"
    );
    match &e {
        SpecError::UnknownKey { key, .. } => {
            prop_assert!(
                nameable(key, set),
                "unknown key {key:?} was never set: {msg}"
            );
        }
        SpecError::Invalid { key, .. } if key.is_empty() => {
            prop_assert!(
                KEYS.iter().any(|k| k.contains('.') && msg.contains(k)),
                "no key named: {msg}"
            );
        }
        SpecError::Invalid { key, .. } => {
            prop_assert!(
                nameable(key, set),
                "refused key {key:?} was never set: {msg}"
            );
            prop_assert!(msg.contains(&format!("{}: ", shown(key))), "{msg}");
        }
        other => prop_assert!(false, "unexpected refusal of a TOML document: {other}"),
    }
    Ok(())
}

/// A valid spec written as TOML reads back equal, and so does an empty spec with every field
/// of it given as a `--set` argument.
fn check_round_trip(spec: &JobSpec) -> Result<(), TestCaseError> {
    let text = toml::to_string(spec).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let back = parse(&text, &[]);
    prop_assert_eq!(back.as_ref().ok(), Some(spec), "{}\n{:?}", text, back);
    let doc: Table = text.parse().unwrap();
    let mut sets = Vec::new();
    leaves(&doc, &mut Vec::new(), &mut sets);
    // `--set a.b.c` addresses bare keys only (letters, digits, '_' and '-').
    let bare = |k: &str| {
        k.split('.').all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
        })
    };
    if !sets.iter().all(|(k, _)| bare(k)) {
        return Ok(());
    }
    let overrides: Vec<Override> = sets
        .iter()
        .map(|(k, v)| format!("{k}={v}").parse().unwrap())
        .collect();
    let via_set = parse("", &overrides);
    prop_assert_eq!(via_set.as_ref().ok(), Some(spec), "{:?}", via_set);
    Ok(())
}

/// Every leaf of `table` as `(dotted key, value)`; an empty table is a leaf.
fn leaves(table: &Table, prefix: &mut Vec<String>, out: &mut Vec<(String, Value)>) {
    for (k, v) in table {
        prefix.push(k.clone());
        match v {
            // `data.tables` holds arbitrary names: it is set whole.
            Value::Table(t) if !t.is_empty() && prefix.join(".") != "data.tables" => {
                leaves(t, prefix, out)
            }
            _ => out.push((prefix.join("."), v.clone())),
        }
        prefix.pop();
    }
}

/// Fragments of Rust's words for types (serde's `expected usize`, `struct TrainSpec`,
/// `internally tagged enum OptimizerSpec`, `unit variant`) that no refusal may show a user.
const RUST_WORDS: &[&str] = &[
    "struct ",
    "enum ",
    "variant",
    "usize",
    "isize",
    "u8",
    "u16",
    "u32",
    "u64",
    "i8",
    "i16",
    "i32",
    "i64",
    "f32",
    "f64",
    "Spec",
    "Option",
    "a map",
    "a sequence",
    "unit value",
    "invalid type",
    "invalid value",
];

/// A sequential model for the `--set` values of [`plain_value`] to change.
const SEQUENTIAL: &str = r#"
name = "fuzz"
[data]
train = "train.parquet"
features = ["x"]
label = "y"
[model]
kind = "sequential"
input = [4]
layers = [{ type = "linear", out = 3 }, { type = "relu" }, { type = "linear", out = 2 }]
"#;

/// Values a user may give by mistake, none of whose text holds one of [`RUST_WORDS`]: numbers,
/// words, lists and tables of them.
fn plain_value() -> impl Strategy<Value = Value> {
    const WORDS: &[&str] = &[
        "x", "fast", "sgd", "step", "auto", "relu", "linear", "lstm", "",
    ];
    const KEYS: &[&str] = &[
        "kind",
        "type",
        "lr",
        "out",
        "hidden",
        "bias",
        "step_size",
        "a",
    ];
    let scalar = prop_oneof![
        prop_oneof![Just(-1i64), Just(0), Just(3), Just(1 << 40)].prop_map(Value::Integer),
        prop_oneof![Just(1.5), Just(-0.5), Just(2.0)].prop_map(Value::Float),
        any::<bool>().prop_map(Value::Boolean),
        prop::sample::select(WORDS).prop_map(|w| Value::String(w.to_string())),
    ];
    scalar.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(prop::sample::select(KEYS), inner, 0..3).prop_map(|m| {
                Value::Table(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

/// Parses `base` with `overrides` and, when the spec is valid, builds its model's shape: the
/// refusal's sentence, if any.
fn refusal(base: &str, overrides: &[Override]) -> Option<String> {
    let spec = match parse(base, overrides) {
        Ok(spec) => spec,
        Err(e) => return Some(e.to_string()),
    };
    let registry = ringflow_ml::nn::ModelRegistry::default();
    let shaped = registry
        .builder(&spec.model)
        .and_then(|b| b.shape(&spec.model));
    shaped.err().map(|e| e.to_string())
}

proptest! {
    #![proptest_config(config(1024))]

    /// Regression (issue 39): `--set` refusals showed serde's Rust type names ("expected
    /// internally tagged enum OptimizerSpec", "struct TrainSpec", "invalid type: map,
    /// expected usize"). Any plain value at any key of the spec, or of a model's layers, is
    /// refused in TOML terms.
    #[test]
    fn set_refusals_speak_toml_not_rust(
        key in prop::sample::select(KEYS),
        value in plain_value(),
        layer in plain_value(),
    ) {
        let at_key = Override::flag("--set", key, value);
        let layers = Override::flag("--set", "model.layers", Value::Array(vec![layer]));
        for (base, set) in [(BASE, &at_key), (SEQUENTIAL, &at_key), (SEQUENTIAL, &layers)] {
            if let Some(msg) = refusal(base, std::slice::from_ref(set)) {
                // Names and keys are quoted (`f32` is a name of train.matmul_precision).
                let unquoted: String = msg.split('`').step_by(2).collect();
                let rusty = RUST_WORDS.iter().find(|w| unquoted.contains(*w));
                prop_assert!(rusty.is_none(), "{rusty:?} in: {msg}");
            }
        }
    }

    /// A spec changed by any assignments of any TOML values, at the spec's keys and beside
    /// them: a valid spec (which round-trips) or an error naming a key that is there.
    #[test]
    fn fuzz_spec_documents(assignments in assignments()) {
        let (doc, set) = document(&assignments);
        let text = toml::to_string(&doc).unwrap();
        check(parse(&text, &[]), &set)?;
    }

    /// The same assignments given as `--set KEY=VALUE` arguments to the base spec.
    #[test]
    fn fuzz_spec_overrides(assignments in assignments()) {
        let mut overrides = Vec::new();
        let mut set = Vec::new();
        for (path, value) in &assignments {
            let arg = format!("{}={value}", path.join("."));
            match arg.parse::<Override>() {
                Ok(o) => {
                    set.push(o.key());
                    overrides.push(o);
                }
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(msg.starts_with("--set ") && !msg.contains('\n'), "{msg}");
                }
            }
        }
        match parse(BASE, &overrides) {
            Err(e @ SpecError::Override { .. }) => {
                let msg = e.to_string();
                prop_assert!(msg.starts_with("--set ") && !msg.contains('\n'), "{msg}");
            }
            other => check(other, &set)?,
        }
    }

    /// Any `--set` argument at all: parsed or refused in one sentence that quotes it.
    #[test]
    fn fuzz_spec_set_argument(arg in any::<String>()) {
        match arg.parse::<Override>() {
            Ok(o) => {
                let set = vec![o.key()];
                match parse(BASE, &[o]) {
                    Err(SpecError::Override { arg: given, .. }) => {
                        prop_assert_eq!(given, format!("--set {arg}"));
                    }
                    other => check(other, &set)?,
                }
            }
            Err(e) => prop_assert!(!e.to_string().contains('\n'), "{e}"),
        }
    }

    /// Any text, and the base spec with bytes changed: a spec or an error naming the file.
    #[test]
    fn fuzz_spec_text(
        text in prop_oneof![
            any::<String>(),
            prop::collection::vec((0..BASE.len(), any::<char>()), 1..4).prop_map(|edits| {
                let mut chars: Vec<char> = BASE.chars().collect();
                let last = chars.len() - 1;
                for (at, c) in edits {
                    chars[at.min(last)] = c;
                }
                chars.into_iter().collect()
            }),
        ]
    ) {
        if let Err(e) = parse(&text, &[]) {
            let msg = e.to_string();
            prop_assert!(msg.contains("fuzz/job.toml") && !msg.contains('\n'), "{msg}");
        }
    }
}
