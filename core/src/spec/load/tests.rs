//! Tests of loading, overriding and checking job specs.

use super::*;

const MNIST: &str = r#"
name = "mnist-mlp"
[data]
train = "train.parquet"
features = ["image"]
label = "label"
scale = 255.0
[model]
kind = "mlp"
layers = [784, 100, 10]
[train]
epochs = 5
batch_size = 128
optimizer = { kind = "adagrad", lr = 0.05 }
"#;

fn parse(text: &str, sets: &[&str]) -> Result<JobSpec, SpecError> {
    let sets: Vec<Override> = sets.iter().map(|s| s.parse().unwrap()).collect();
    JobSpec::parse(text, Path::new("job.toml"), &sets)
}

#[test]
fn defaults_fill_what_is_missing() {
    let s = parse(MNIST, &[]).unwrap();
    assert_eq!(s.train.seed, 42);
    assert_eq!(s.cluster.executors, 1);
    assert_eq!(s.data.shuffle_buffer, 10_000);
    assert_eq!(s.checkpoint_dir(), "runs/mnist-mlp");
    assert_eq!(s.train.optimizer.lr(), 0.05);
}

#[test]
fn unknown_keys_are_named_with_their_path() {
    let err = parse(&MNIST.replace("epochs = 5", "epochz = 5"), &[]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("unknown key `train.epochz`"), "{msg}");
    assert!(msg.contains("epochs"), "{msg}");
    let err = parse(MNIST, &["train.optimizer.lrr=0.1"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("train.optimizer.lrr"), "{err}");
    let err = parse(MNIST, &["bogus=1"]).unwrap_err().to_string();
    assert!(err.contains("unknown key `bogus`"), "{err}");
}

/// Regression (fuzz_spec_documents and fuzz_spec_overrides in long mode, shrunk to
/// `train.schedule = ["\n"]`): serde's "unknown variant" quoted the user's value raw, so a
/// newline in it split the error over two lines; control characters in keys, values and
/// arguments are shown as escapes.
#[test]
fn control_characters_never_break_an_error_line() {
    let set = parse(MNIST, &["train.schedule=[\"a\\nb\"]"]).unwrap_err();
    let text = MNIST.replace("epochs = 5", "\"ep\\tochs\" = 5");
    let key = parse(&text, &[]).unwrap_err();
    let arg: SpecError = "train.epochs\n2".parse::<Override>().unwrap_err();
    for (err, shows) in [
        (set, "train.schedule[0]: `a\\nb` is not one of"),
        (key, "unknown key `train.ep\\tochs`"),
        (arg, "--set train.epochs\\n2: expected KEY=VALUE"),
    ] {
        let msg = err.to_string();
        assert!(!msg.contains(char::is_control), "{msg:?}");
        assert!(msg.contains(shows), "{msg}");
    }
}

/// Regression (fuzz_spec_documents, shrunk to `model.layers = [nan]`): a NaN or an
/// infinity in a model field became a JSON null without a word (the spec could then not be
/// written back as TOML); it is refused by key.
#[test]
fn non_finite_model_fields_are_refused_by_key() {
    for (set, key) in [
        ("model.layers=[784, nan]", "model.layers[1]"),
        ("model.dropout=inf", "model.dropout"),
        ("model.extra={ a = [1.0, -inf] }", "model.extra.a[1]"),
        // fuzz_spec_documents in long mode: an index inside the key.
        (
            "model.activation=[{ name = nan }]",
            "model.activation[0].name",
        ),
    ] {
        let msg = parse(MNIST, &[set]).unwrap_err().to_string();
        assert!(
            msg.contains(&format!("{key}: is not a finite number")),
            "{set}: {msg}"
        );
    }
}

/// Regression (fuzz_spec_set_argument, shrunk to the argument "`.®="): a key holding a
/// backtick was cut at it, and the refusal named the wrong key with a garbled list.
#[test]
fn unknown_keys_with_backticks_are_named_whole() {
    let err = parse(MNIST, &["`.®=1"]).unwrap_err();
    let SpecError::UnknownKey { key, expected, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(key, "`");
    assert_eq!(expected[..2], ["name".to_string(), "data".to_string()]);
    let err = parse(MNIST, &["train.a`, expected `b=1"]).unwrap_err();
    assert!(
        err.to_string()
            .contains("unknown key `train.a`, expected `b` (expected one of: epochs, "),
        "{err}"
    );
}

#[test]
fn overrides_reach_inline_tables() {
    let s = parse(
        MNIST,
        &["train.optimizer.lr=0.1", "train.optimizer.kind=sgd"],
    )
    .unwrap();
    assert_eq!(s.train.optimizer.kind(), "sgd");
    assert_eq!(s.train.optimizer.lr(), 0.1);
    let s = parse(MNIST, &["train.epochs=2", "cluster.executors=3"]).unwrap();
    assert_eq!(s.train.epochs, 2);
    assert_eq!(s.cluster.executors, 3);
}

#[test]
fn bad_values_name_their_key() {
    let msg = parse(MNIST, &["train.batch_size=0"])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("train.batch_size"), "{msg}");
    let msg = parse(MNIST, &["train.epochs=\"many\""])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("train.epochs"), "{msg}");
    let msg = parse(MNIST, &["train.optimizer.lr=-1"])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("train.optimizer.lr"), "{msg}");
    let msg = parse(&MNIST.replace("label = \"label\"", ""), &[])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("data.label") && msg.contains("required"),
        "{msg}"
    );
    let msg = parse("name = \"x\"\n[data\n", &[]).unwrap_err().to_string();
    assert!(msg.contains("not valid TOML"), "{msg}");
    let msg = parse(MNIST, &["cluster.backup_workers=1"])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("cluster.backup_workers") && msg.contains("less than cluster.executors"),
        "{msg}"
    );
    let ok = parse(MNIST, &["cluster.executors=3", "cluster.backup_workers=2"]).unwrap();
    assert_eq!(ok.cluster.backup_workers, 2);
}

#[test]
fn names_are_plain_names_within_the_limit() {
    for bad in ["..", ".", ".hidden", "a/b", "a\\b", "a b", "/", "näme"] {
        let set = format!("name={}", toml::Value::from(bad));
        let msg = parse(MNIST, &[set.as_str()]).unwrap_err().to_string();
        assert!(msg.contains("name: is not a plain name"), "{bad:?}: {msg}");
        assert!(msg.contains("at most 100 bytes"), "{bad:?}: {msg}");
    }
    let long = "n".repeat(1_000_000);
    let msg = parse(&MNIST.replace("mnist-mlp", &long), &[])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("is 1000000 bytes long, over the limit of 100"),
        "{}",
        &msg[..msg.len().min(300)]
    );
    assert!(
        msg.len() < 400,
        "the name is not repeated: {} bytes",
        msg.len()
    );
    let ok = "n".repeat(100);
    assert_eq!(
        parse(&MNIST.replace("mnist-mlp", &ok), &[]).unwrap().name,
        ok
    );
    assert_eq!(parse(MNIST, &["name=a.b-c_9"]).unwrap().name, "a.b-c_9");
}

#[test]
fn a_default_name_that_is_not_plain_asks_for_a_name() {
    let text = MNIST.replace("name = \"mnist-mlp\"", "");
    let spec = JobSpec::parse(&text, Path::new("dir/my-job.toml"), &[]).unwrap();
    assert_eq!(spec.name, "my-job");
    assert_eq!(spec.checkpoint_dir(), "runs/my-job");
    for file in ["dir/my job.toml", "dir/.toml", "dir/...toml"] {
        let msg = JobSpec::parse(&text, Path::new(file), &[])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("name: is not set") && msg.contains("set `name` in the spec"),
            "{file}: {msg}"
        );
    }
}

#[test]
fn an_empty_checkpoint_dir_or_the_root_is_refused_by_key() {
    for dir in ["", "  ", "/", "//", "/.", "/..", "file:///"] {
        let set = format!("cluster.checkpoint_dir={}", toml::Value::from(dir));
        let msg = parse(MNIST, &[set.as_str()]).unwrap_err().to_string();
        assert!(msg.contains("cluster.checkpoint_dir: "), "{dir:?}: {msg}");
        assert!(
            msg.contains("is empty") || msg.contains("the file system's root"),
            "{dir:?}: {msg}"
        );
    }
    for dir in ["runs/x", "/tmp/x", "s3://bucket", "s3://bucket/runs/x"] {
        let set = format!("cluster.checkpoint_dir={}", toml::Value::from(dir));
        let spec = parse(MNIST, &[set.as_str()]).unwrap();
        assert_eq!(spec.checkpoint_dir(), dir);
    }
}

#[test]
fn output_paths_are_joined_below_the_checkpoint_dir() {
    let s = parse(MNIST, &[]).unwrap();
    assert_eq!(s.model_dir(), "runs/mnist-mlp/model");
    assert_eq!(s.events_path(), "runs/mnist-mlp/events.jsonl");
    let s = parse(MNIST, &["cluster.checkpoint_dir=\"s3://b/x/\""]).unwrap();
    assert_eq!(s.checkpoint_path(), "s3://b/x/checkpoint");
    let s = parse(MNIST, &["cluster.checkpoint_dir=\"/abs/x/\""]).unwrap();
    assert_eq!(s.model_dir(), "/abs/x/model");
}

/// Parses MNIST with `--set` arguments and then `flags` (`(flag, key, value)`), as the
/// command line does.
fn with_flags(sets: &[&str], flags: &[(String, &str, toml::Value)]) -> Result<JobSpec, SpecError> {
    let mut all: Vec<Override> = sets.iter().map(|s| s.parse().unwrap()).collect();
    all.extend(
        flags
            .iter()
            .map(|(flag, key, value)| Override::flag(flag, key, value.clone())),
    );
    JobSpec::parse(MNIST, Path::new("job.toml"), &all)
}

#[test]
fn flags_are_applied_before_the_one_check() {
    let executors = |n: i64| {
        let flag = format!("--executors {n}");
        (flag, "cluster.executors", toml::Value::from(n))
    };
    // The issue's case: min_executors = 2 is checked against the 4 executors of the flag.
    let s = with_flags(&["cluster.min_executors=2"], &[executors(4)]).unwrap();
    assert_eq!((s.cluster.executors, s.cluster.min_executors), (4, Some(2)));
    let s = with_flags(
        &["cluster.backup_workers=3", "cluster.max_executors=6"],
        &[executors(4)],
    )
    .unwrap();
    assert_eq!(s.cluster.backup_workers, 3);
    // A flag wins over --set of the same field.
    let s = with_flags(&["cluster.executors=2"], &[executors(3)]).unwrap();
    assert_eq!(s.cluster.executors, 3);

    // Refusals name both fields and the flag that set one of them.
    let refused = |sets: &[&str], n: i64, key: &str| {
        let msg = with_flags(sets, &[executors(n)]).unwrap_err().to_string();
        assert!(msg.contains(&format!("{key}: ")), "{msg}");
        assert!(msg.contains("cluster.executors"), "{msg}");
        assert!(
            msg.contains(&format!("cluster.executors was set by --executors {n}")),
            "{msg}"
        );
    };
    refused(&["cluster.min_executors=2"], 1, "cluster.min_executors");
    refused(&["cluster.backup_workers=2"], 2, "cluster.backup_workers");
    refused(&["cluster.max_executors=3"], 4, "cluster.max_executors");
    refused(&[], 0, "cluster.executors");
    // A refusal that does not involve the flag's field does not mention it.
    let msg = with_flags(&["train.epochs=0"], &[executors(2)])
        .unwrap_err()
        .to_string();
    assert!(!msg.contains("--executors"), "{msg}");

    // --resume sets the checkpoint directory, checked like any other value of it.
    let resume = |dir: &str| {
        let flag = format!("--resume {dir}");
        (flag, "cluster.checkpoint_dir", toml::Value::from(dir))
    };
    let s = with_flags(&["cluster.checkpoint_dir=a"], &[resume("b")]).unwrap();
    assert_eq!(s.checkpoint_dir(), "b");
    let msg = with_flags(&[], &[resume("/")]).unwrap_err().to_string();
    assert!(
        msg.contains("cluster.checkpoint_dir") && msg.contains("set by --resume"),
        "{msg}"
    );
}

#[test]
fn sql_timeouts_have_a_default_and_a_range() {
    assert_eq!(parse(MNIST, &[]).unwrap().data.sql_timeout_s, 300);
    let s = parse(MNIST, &["data.sql_timeout_s=5"]).unwrap();
    assert_eq!(s.data.sql_timeout(), std::time::Duration::from_secs(5));
    for bad in ["0", "604801"] {
        let msg = parse(MNIST, &[&format!("data.sql_timeout_s={bad}")])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("data.sql_timeout_s") && msg.contains(&format!("not {bad}")),
            "{msg}"
        );
    }
}

#[test]
fn round_trips_through_json_for_executors() {
    let s = parse(MNIST, &[]).unwrap();
    let text = crate::wire::payload::encode(&s);
    assert_eq!(
        crate::wire::payload::decode::<JobSpec>("f", &text).unwrap(),
        s
    );
}

/// `cluster.compression` defaults to f32 gradients, takes the codecs' words, refuses others
/// naming the key, and refuses backup workers, whose gradients bypass the ring.
#[test]
fn gradient_compression_is_a_checked_cluster_key() {
    assert_eq!(
        parse(MNIST, &[]).unwrap().cluster.compression,
        Compression::None
    );
    for c in Compression::ALL {
        let set = format!("cluster.compression={c}");
        assert_eq!(parse(MNIST, &[&set]).unwrap().cluster.compression, c);
    }
    let msg = parse(MNIST, &["cluster.compression=fp8"])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("cluster.compression"), "{msg}");
    let both = [
        "cluster.executors=3",
        "cluster.backup_workers=1",
        "cluster.compression=bf16",
    ];
    let msg = parse(MNIST, &both).unwrap_err().to_string();
    assert!(
        msg.contains("cluster.compression") && msg.contains("cluster.backup_workers"),
        "{msg}"
    );
}

#[test]
fn what_every_task_carries_is_bounded_naming_the_key() {
    let with_data = |line: &str| {
        parse(
            &MNIST.replace("scale = 255.0", &format!("scale = 255.0\n{line}")),
            &[],
        )
        .map_err(|e| e.to_string())
    };
    let query = format!("SELECT * FROM input -- {}", "x".repeat(MAX_SQL_BYTES));
    let e = with_data(&format!("sql = {query:?}")).unwrap_err();
    assert!(
        e.starts_with("job spec job.toml: data.sql: is 1.0 MiB long, more than the 1.0 MiB"),
        "{e}"
    );
    assert!(with_data(&format!("sql = {:?}", &query[..MAX_SQL_BYTES])).is_ok());

    let long = "c".repeat(MAX_CLASS_NAME_BYTES + 1);
    let e = with_data(&format!("label_classes = [\"a\", \"{long}\"]")).unwrap_err();
    assert!(
        e.contains("data.label_classes: class 1 is 257 bytes long, more than the 256 bytes"),
        "{e}"
    );
    let classes: Vec<String> = (0..=MAX_CLASSES).map(|i| format!("\"{i}\"")).collect();
    let e = with_data(&format!("label_classes = [{}]", classes.join(","))).unwrap_err();
    assert!(
        e.contains("lists 100001 classes, more than the 100000"),
        "{e}"
    );
    let e = with_data("label_classes = [\"a\", \"b\", \"a\"]").unwrap_err();
    assert!(e.contains("lists the class \"a\" twice"), "{e}");

    // A path of 17 MiB: the spec is over its bound, and the error names the key.
    let path = "d/".repeat(17 << 19);
    let e = parse(&MNIST.replace("train.parquet", &path), &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "job spec job.toml: data.train: makes the job spec 17.0 MiB as JSON, more than the \
             16.0 MiB a job spec may have (every task carries it); this key alone is 17.0 MiB"
        ),
        "{}",
        &e[..200]
    );
}

/// Regression (issue 39): `--set` refusals showed Rust type names ("expected internally tagged
/// enum OptimizerSpec", "struct TrainSpec", "invalid type: map, expected usize") and no list
/// index; they say in TOML terms what the key takes, naming the key inside tables and lists.
#[test]
fn set_refusals_say_what_the_key_takes_in_toml_terms() {
    for (set, says) in [
        (
            "train.optimizer=sgd",
            "train.optimizer: expected a table with a `kind`, such as { kind = \"sgd\" }, not \
             the string \"sgd\"",
        ),
        ("train=3", "train: expected a table, not 3"),
        (
            "train.epochs={ a = 1 }",
            "train.epochs: expected a whole number of 0 or more, not a table",
        ),
        (
            "train.optimizer.lr=\"x\"",
            "train.optimizer.lr: expected a number, not the string \"x\"",
        ),
        (
            "train.schedule={ kind = \"step\", step_size = -1 }",
            "train.schedule.step_size: expected a whole number of 0 or more, not -1",
        ),
        (
            "data.features=[\"a\", 2]",
            "data.features[1]: expected a string, not 2",
        ),
        ("train.loss=3", "train.loss: expected a string, not 3"),
        (
            "train.optimizer.kind=foo",
            "train.optimizer.kind: `foo` is not one of `sgd`, `adagrad`, `adam` or `adamw`",
        ),
    ] {
        let msg = parse(MNIST, &[set]).unwrap_err().to_string();
        assert_eq!(msg, format!("job spec job.toml: {says}"), "{set}");
    }
    // A model's own keys are read by its builder, with the same words.
    let registry = ringflow_ml::nn::ModelRegistry::default();
    let spec = parse(MNIST, &["model.layers=[784, { a = 1 }, 10]"]).unwrap();
    let shaped = registry
        .builder(&spec.model)
        .and_then(|b| b.shape(&spec.model));
    assert_eq!(
        shaped.err().map(|e| e.to_string()).as_deref(),
        Some("model.layers[1]: expected a whole number of 0 or more, not a table")
    );
}
