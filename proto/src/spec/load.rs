//! Reading, overriding and checking a job spec.

use std::path::Path;

use toml::Table;

use super::{JobSpec, NAME_RULE, Override, SpecError, check_name};
use crate::data::paths::is_filesystem_root;

impl JobSpec {
    /// Reads the spec in `file`, applies `overrides` in order, and checks it.
    pub fn load(file: &Path, overrides: &[Override]) -> Result<JobSpec, SpecError> {
        let text = std::fs::read_to_string(file).map_err(|source| SpecError::Io {
            file: file.to_path_buf(),
            source,
        })?;
        Self::parse(&text, file, overrides)
    }

    /// Parses spec text (`file` names it in errors and supplies the default job name).
    pub fn parse(text: &str, file: &Path, overrides: &[Override]) -> Result<JobSpec, SpecError> {
        let mut doc: Table = text.parse().map_err(|e: toml::de::Error| SpecError::Toml {
            file: file.to_path_buf(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
        for o in overrides {
            o.apply(&mut doc)?;
        }
        let mut spec: JobSpec =
            serde_path_to_error::deserialize(doc).map_err(|e| field_error(file, e))?;
        if spec.name.is_empty() {
            spec.name = default_name(file)?;
        }
        spec.validate(file).map_err(|e| note_flags(e, overrides))?;
        Ok(spec)
    }

    /// Checks the values that the types alone cannot (ranges, names, consistency).
    pub fn validate(&self, file: &Path) -> Result<(), SpecError> {
        self.check_name_and_outputs(file)?;
        self.check_data()
            .and_then(|()| self.check_train())
            .and_then(|()| self.check_model())
            .and_then(|()| self.check_cluster())
            .map_err(|Invalid(key, message)| SpecError::Invalid {
                file: file.to_path_buf(),
                key,
                message,
            })
    }

    /// The `[data]` table.
    fn check_data(&self) -> Result<(), Invalid> {
        let d = &self.data;
        if d.train.trim().is_empty() {
            return Err(Invalid::new(
                "data.train",
                "must name a file, directory or glob".into(),
            ));
        }
        d.check_examples()
            .map_err(|(key, m)| Invalid::new(key, m))?;
        for (i, f) in d.features.iter().enumerate() {
            if d.features[..i].contains(f) {
                return Err(Invalid::new(
                    "data.features",
                    format!("lists column `{f}` twice"),
                ));
            }
            if *f == d.label {
                return Err(Invalid::new(
                    "data.features",
                    format!("includes the label column `{f}`"),
                ));
            }
        }
        if let Some(s) = d.scale
            && !(s.is_finite() && s > 0.0)
        {
            return Err(Invalid::new(
                "data.scale",
                format!("must be a positive number, not {s}"),
            ));
        }
        if let Some(q) = &d.sql
            && q.trim().is_empty()
        {
            return Err(Invalid::new(
                "data.sql",
                "is empty; remove it or give a query".into(),
            ));
        }
        if !d.tables.is_empty() && d.sql.is_none() {
            return Err(Invalid::new(
                "data.tables",
                "are only read by data.sql, which is not set".into(),
            ));
        }
        check_sql_timeout(d.sql_timeout_s).map_err(|m| Invalid::new("data.sql_timeout_s", m))?;
        if let Some(classes) = &d.label_classes {
            if classes.len() < 2 {
                return Err(Invalid::new(
                    "data.label_classes",
                    "must list at least two classes".into(),
                ));
            }
            for (i, c) in classes.iter().enumerate() {
                if classes[..i].contains(c) {
                    return Err(Invalid::new(
                        "data.label_classes",
                        format!("lists the class {c:?} twice"),
                    ));
                }
            }
        }
        if d.shuffle_buffer == 0 {
            return Err(Invalid::new(
                "data.shuffle_buffer",
                "must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The `[train]` table.
    fn check_train(&self) -> Result<(), Invalid> {
        let t = &self.train;
        if t.epochs == 0 {
            return Err(Invalid::new("train.epochs", "must be at least 1".into()));
        }
        if t.batch_size == 0 {
            return Err(Invalid::new(
                "train.batch_size",
                "must be at least 1".into(),
            ));
        }
        if let Some(c) = t.clip_grad_norm
            && !(c.is_finite() && c > 0.0)
        {
            return Err(Invalid::new(
                "train.clip_grad_norm",
                format!("must be a positive number, not {c}"),
            ));
        }
        let ml_error = |e: ringflow_ml::MlError| Invalid::new("", e.to_string());
        t.optimizer.validate().map_err(ml_error)?;
        t.schedule.validate().map_err(ml_error)?;
        Ok(())
    }

    /// The `[model]` table.
    fn check_model(&self) -> Result<(), Invalid> {
        if self.model.kind.trim().is_empty() {
            return Err(Invalid::new(
                "model.kind",
                "must name a model kind, e.g. \"mlp\"".into(),
            ));
        }
        if let Some(at) = self.model.params.iter().find_map(|(k, v)| null_at(v, k)) {
            return Err(Invalid::new(
                &format!("model.{at}"),
                "is not a finite number (nan and inf cannot be model settings)".into(),
            ));
        }
        Ok(())
    }

    /// The `[cluster]` table.
    fn check_cluster(&self) -> Result<(), Invalid> {
        let c = &self.cluster;
        if c.executors == 0 {
            return Err(Invalid::new(
                "cluster.executors",
                "must be at least 1".into(),
            ));
        }
        if let Some(m) = c.min_executors
            && (m == 0 || m > c.executors)
        {
            return Err(Invalid::new(
                "cluster.min_executors",
                format!(
                    "must be between 1 and cluster.executors ({}), not {m}",
                    c.executors
                ),
            ));
        }
        if let Some(m) = c.max_executors
            && m < c.executors
        {
            return Err(Invalid::new(
                "cluster.max_executors",
                format!(
                    "must be at least cluster.executors ({}), not {m}",
                    c.executors
                ),
            ));
        }
        if c.backup_workers > 0 && c.backup_workers >= c.executors {
            return Err(Invalid::new(
                "cluster.backup_workers",
                format!(
                    "must be less than cluster.executors ({}), not {}: at least one rank's \
                     gradients must make each step",
                    c.executors, c.backup_workers
                ),
            ));
        }
        if c.threads == Some(0) {
            return Err(Invalid::new("cluster.threads", "must be at least 1".into()));
        }
        if c.rendezvous_timeout_s == 0 {
            return Err(Invalid::new(
                "cluster.rendezvous_timeout_s",
                "must be at least 1".into(),
            ));
        }
        if c.comm_timeout_s == 0 {
            return Err(Invalid::new(
                "cluster.comm_timeout_s",
                "must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// A value the spec's types accept but that cannot run: the key at fault and what is wrong.
struct Invalid(String, String);

impl Invalid {
    fn new(key: &str, message: String) -> Invalid {
        Invalid(key.to_string(), message)
    }
}

impl JobSpec {
    /// Checks `name` ([`check_name`]) and `cluster.checkpoint_dir`: never empty, never the file
    /// system's root, which a job would fill with its model, checkpoints and event log.
    fn check_name_and_outputs(&self, file: &Path) -> Result<(), SpecError> {
        let invalid = |key: &str, message: String| SpecError::Invalid {
            file: file.to_path_buf(),
            key: key.to_string(),
            message,
        };
        check_name(&self.name).map_err(|why| {
            invalid(
                "name",
                format!("is not a plain name: it {why}; a job's name may use {NAME_RULE}"),
            )
        })?;
        let key = "cluster.checkpoint_dir";
        if let Some(dir) = &self.cluster.checkpoint_dir {
            if dir.trim().is_empty() {
                return Err(invalid(
                    key,
                    "is empty; give the directory for the job's model, checkpoints and event \
                     log, or leave it out for runs/<name>"
                        .into(),
                ));
            }
            if is_filesystem_root(dir) {
                return Err(invalid(
                    key,
                    format!(
                        "{dir:?} is the file system's root; a job writes model/, checkpoint/, \
                         events.jsonl and its lock into its checkpoint directory, so give it a \
                         directory of its own"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Where `value` (at `path`) holds a JSON null. TOML has no null: a model field is null only
/// when it was a NaN or an infinity, which JSON cannot hold.
fn null_at(value: &serde_json::Value, path: &str) -> Option<String> {
    match value {
        serde_json::Value::Null => Some(path.to_string()),
        serde_json::Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, v)| null_at(v, &format!("{path}[{i}]"))),
        serde_json::Value::Object(o) => o
            .iter()
            .find_map(|(k, v)| null_at(v, &format!("{path}.{k}"))),
        _ => None,
    }
}

/// The name of a job whose spec sets none: the spec file's name without `.toml`, when that is a
/// plain name ([`check_name`]); otherwise an error saying to set `name`.
fn default_name(file: &Path) -> Result<String, SpecError> {
    let stem = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    check_name(&stem).map_err(|why| SpecError::Invalid {
        file: file.to_path_buf(),
        key: "name".into(),
        message: format!(
            "is not set, and the spec file's name, its default, is not a plain name (it {why}); \
             set `name` in the spec, using {NAME_RULE}"
        ),
    })?;
    Ok(stem)
}

/// Adds to a refusal of a key the flags (`--executors`, `--resume`) that set the fields it
/// involves, so that `--executors 1` with `cluster.min_executors = 2` names the flag too.
fn note_flags(e: SpecError, overrides: &[Override]) -> SpecError {
    let SpecError::Invalid { file, key, message } = e else {
        return e;
    };
    let notes: Vec<String> = overrides
        .iter()
        .filter_map(|o| o.flag_note(&key, &message))
        .collect();
    let message = if notes.is_empty() {
        message
    } else {
        format!("{message} ({})", notes.join("; "))
    };
    SpecError::Invalid { file, key, message }
}

/// The longest `data.sql_timeout_s`: a week.
const MAX_SQL_TIMEOUT_S: u64 = 7 * 24 * 3600;

/// Checks `data.sql_timeout_s`: at least a second, at most [`MAX_SQL_TIMEOUT_S`].
fn check_sql_timeout(seconds: u64) -> Result<(), String> {
    if (1..=MAX_SQL_TIMEOUT_S).contains(&seconds) {
        Ok(())
    } else {
        Err(format!(
            "must be between 1 and {MAX_SQL_TIMEOUT_S} (a week), not {seconds}"
        ))
    }
}

/// Turns a deserialization error into one that names the key by its full path.
fn field_error(file: &Path, e: serde_path_to_error::Error<toml::de::Error>) -> SpecError {
    let path = e.path().to_string();
    let path = if path == "." { String::new() } else { path };
    let message = e.inner().message().trim().to_string();
    // The path may or may not already end at the key, depending on where serde noticed it.
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else if path == key || path.ends_with(&format!(".{key}")) {
            path.clone()
        } else {
            format!("{path}.{key}")
        }
    };
    if let Some(rest) = message.strip_prefix("unknown field `")
        && let Some((key, tail)) = unknown_field(rest)
    {
        let expected = tail
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        return SpecError::UnknownKey {
            file: file.to_path_buf(),
            key: join(key),
            expected,
        };
    }
    if let Some(rest) = message.strip_prefix("missing field `")
        && let Some((key, _)) = rest.split_once('`')
    {
        return SpecError::Invalid {
            file: file.to_path_buf(),
            key: join(key),
            message: "is required".into(),
        };
    }
    SpecError::Invalid {
        file: file.to_path_buf(),
        key: path,
        message,
    }
}

/// Splits the rest of serde's "unknown field `KEY`, expected one of `a`, `b`" (or "…`, there
/// are no fields") into the key and the list. The key is the user's and may hold backticks
/// itself; the expected names never do, so the split is at the last separator.
fn unknown_field(rest: &str) -> Option<(&str, &str)> {
    ["`, expected ", "`, there are no fields"]
        .iter()
        .filter_map(|sep| rest.rfind(sep).map(|at| (&rest[..at], &rest[at + 1..])))
        .max_by_key(|(key, _)| key.len())
}

#[cfg(test)]
mod tests {
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
            (set, "train.schedule[0]: unknown variant `a\\nb`"),
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
    fn with_flags(
        sets: &[&str],
        flags: &[(String, &str, toml::Value)],
    ) -> Result<JobSpec, SpecError> {
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
        assert_eq!(JobSpec::from_json(&s.to_json()).unwrap(), s);
    }
}
