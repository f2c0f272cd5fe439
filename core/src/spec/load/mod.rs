//! Reading, overriding and checking a job spec.

mod data_error;

use std::path::Path;

use ringflow_ml::settings::{Found, SettingMessage};
use toml::Table;

use super::{Compression, JobSpec, NAME_RULE, Override, SpecError, check_name};
use crate::data::paths::is_filesystem_root;
use crate::data::stats::MAX_CLASSES;
use crate::size::format_bytes;
use crate::wire::{MAX_CLASS_NAME_BYTES, MAX_SPEC_BYTES, MAX_SQL_BYTES};
use data_error::{ClassesError, SqlError, SqlTimeoutError};

impl JobSpec {
    /// Reads the spec in `file`, applies `overrides` in order, and checks it.
    pub fn load(file: &Path, overrides: &[Override]) -> Result<JobSpec, SpecError> {
        super::SpecAsWritten::read(file, overrides)?.spec(overrides)
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
        let mut spec: JobSpec = serde_path_to_error::deserialize(doc.clone())
            .map_err(|e| field_error(file, &doc, e))?;
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
            .and_then(|()| self.check_size())
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
            .and_then(|()| d.check_sequences())
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
        if let Some(q) = &d.sql {
            check_sql(q).map_err(|e| Invalid::new("data.sql", e.to_string()))?;
        }
        if !d.tables.is_empty() && d.sql.is_none() {
            return Err(Invalid::new(
                "data.tables",
                "are only read by data.sql, which is not set".into(),
            ));
        }
        check_sql_timeout(d.sql_timeout_s)
            .map_err(|e| Invalid::new("data.sql_timeout_s", e.to_string()))?;
        if let Some(classes) = &d.label_classes {
            check_label_classes(classes)
                .map_err(|e| Invalid::new("data.label_classes", e.to_string()))?;
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
        if c.compression != Compression::None && c.backup_workers > 0 {
            return Err(Invalid::new(
                "cluster.compression",
                format!(
                    "is \"{}\", but with cluster.backup_workers gradients go to rank 0's \
                     aggregator as f32, not over the ring; set one of them only",
                    c.compression
                ),
            ));
        }
        c.fusion
            .check()
            .map_err(|e| Invalid::new("cluster.fusion", e.to_string()))?;
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

/// Checks `data.sql`: not empty, at most [`MAX_SQL_BYTES`].
fn check_sql(query: &str) -> Result<(), SqlError> {
    if query.trim().is_empty() {
        return Err(SqlError::Empty);
    }
    if query.len() > MAX_SQL_BYTES {
        return Err(SqlError::TooLong {
            bytes: query.len() as u64,
            max: MAX_SQL_BYTES as u64,
        });
    }
    Ok(())
}

/// Checks `data.label_classes`: 2 to [`MAX_CLASSES`] distinct names, each at most
/// [`MAX_CLASS_NAME_BYTES`].
fn check_label_classes(classes: &[String]) -> Result<(), ClassesError> {
    if classes.len() < 2 {
        return Err(ClassesError::TooFew);
    }
    if classes.len() > MAX_CLASSES {
        return Err(ClassesError::TooMany {
            count: classes.len(),
            max: MAX_CLASSES,
        });
    }
    let mut seen = std::collections::HashSet::with_capacity(classes.len());
    for (i, c) in classes.iter().enumerate() {
        if c.len() > MAX_CLASS_NAME_BYTES {
            return Err(ClassesError::NameTooLong {
                index: i,
                bytes: c.len(),
                max: MAX_CLASS_NAME_BYTES,
            });
        }
        if !seen.insert(c.as_str()) {
            return Err(ClassesError::Twice { class: c.clone() });
        }
    }
    Ok(())
}

impl JobSpec {
    /// Checks that the spec, as the JSON every task carries, is at most [`MAX_SPEC_BYTES`];
    /// the error names its largest key.
    fn check_size(&self) -> Result<(), Invalid> {
        let json = self.to_json();
        if json.len() <= MAX_SPEC_BYTES {
            return Ok(());
        }
        let value = serde_json::to_value(self).unwrap_or_default();
        let (key, bytes) = largest_key(&value);
        Err(Invalid::new(
            &key,
            format!(
                "makes the job spec {} as JSON, more than the {} a job spec may have (every \
                 task carries it); this key alone is {}",
                format_bytes(json.len() as u64),
                format_bytes(MAX_SPEC_BYTES as u64),
                format_bytes(bytes as u64)
            ),
        ))
    }
}

/// The key of `spec` (a section's field, `data.label_classes`, or a top-level one) whose
/// value is the longest as JSON, with that length.
fn largest_key(spec: &serde_json::Value) -> (String, usize) {
    let len = |v: &serde_json::Value| serde_json::to_string(v).map_or(0, |s| s.len());
    let mut best = (String::new(), 0);
    let Some(sections) = spec.as_object() else {
        return best;
    };
    for (section, value) in sections {
        let fields: Vec<(String, usize)> = match value.as_object() {
            Some(fields) => fields
                .iter()
                .map(|(k, v)| (format!("{section}.{k}"), len(v)))
                .collect(),
            None => vec![(section.clone(), len(value))],
        };
        for (key, n) in fields {
            if n > best.1 {
                best = (key, n);
            }
        }
    }
    best
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
fn check_sql_timeout(seconds: u64) -> Result<(), SqlTimeoutError> {
    if (1..=MAX_SQL_TIMEOUT_S).contains(&seconds) {
        Ok(())
    } else {
        Err(SqlTimeoutError {
            seconds,
            max: MAX_SQL_TIMEOUT_S,
        })
    }
}

/// Turns a deserialization error into one that names the key by its full path (with list
/// indices) and says in TOML terms what the key takes ([`ringflow_ml::settings`]); `doc` is
/// the document that was read, for the value really found.
fn field_error(
    file: &Path,
    doc: &Table,
    e: serde_path_to_error::Error<toml::de::Error>,
) -> SpecError {
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
    let invalid = |key: String, message: String| SpecError::Invalid {
        file: file.to_path_buf(),
        key,
        message,
    };
    match SettingMessage::parse(&message) {
        SettingMessage::UnknownKey { key, allowed } => SpecError::UnknownKey {
            file: file.to_path_buf(),
            key: join(key),
            expected: allowed.into_iter().map(str::to_string).collect(),
        },
        SettingMessage::MissingKey(key) => invalid(join(key), "is required".into()),
        parsed @ SettingMessage::Mismatch { .. } => {
            let (key, actual) = mismatched(doc, e.path(), path, &parsed);
            invalid(key, parsed.render(actual.as_deref()))
        }
        parsed => {
            let actual = value_at(doc, e.path()).map(describe_toml);
            invalid(path, parsed.render(actual.as_deref()))
        }
    }
}

/// The key at fault in a mismatch that serde noticed at `path` (`at`, in the document `doc`)
/// and the value found there, described. Inside a table that serde read as a whole (an
/// optimizer or schedule, tagged by `kind`), the path ends at the table: the key is then the
/// one field of the table that holds the value serde found, when there is exactly one.
fn mismatched(
    doc: &Table,
    at: &serde_path_to_error::Path,
    path: String,
    parsed: &SettingMessage<'_>,
) -> (String, Option<String>) {
    let SettingMessage::Mismatch { found, expected } = parsed else {
        return (path, None);
    };
    let Some(value) = value_at(doc, at) else {
        return (path, None);
    };
    let takes_a_table = expected.starts_with("struct ")
        || expected.starts_with("internally tagged enum ")
        || *expected == "a map";
    match value {
        // A table where a value was expected is the mismatch itself.
        toml::Value::Table(table) if !takes_a_table && *found != Found::Table => {
            let wanted = found.describe();
            let mut holding = table.iter().filter(|(_, v)| describe_toml(v) == wanted);
            match (holding.next(), holding.next()) {
                (Some((k, v)), None) => (format!("{path}.{k}"), Some(describe_toml(v))),
                _ => (path, None),
            }
        }
        v => (path, Some(describe_toml(v))),
    }
}

/// The value at `path` in `doc`, if the path leads to one.
fn value_at<'a>(doc: &'a Table, path: &serde_path_to_error::Path) -> Option<&'a toml::Value> {
    let mut segments = path.iter();
    let mut value = match segments.next()? {
        serde_path_to_error::Segment::Map { key } => doc.get(key)?,
        _ => return None,
    };
    for segment in segments {
        value = match (segment, value) {
            (serde_path_to_error::Segment::Map { key }, toml::Value::Table(t)) => t.get(key)?,
            (serde_path_to_error::Segment::Seq { index }, toml::Value::Array(a)) => {
                a.get(*index)?
            }
            _ => return None,
        };
    }
    Some(value)
}

/// A TOML value as an error names it: `3`, `2.0`, `true`, `the string "x"`, `a table`.
fn describe_toml(value: &toml::Value) -> String {
    match value {
        toml::Value::String(_) => format!("the string {value}"),
        toml::Value::Array(_) => "a list".into(),
        toml::Value::Table(_) => "a table".into(),
        toml::Value::Datetime(d) => format!("the date {d}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
