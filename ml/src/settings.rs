//! serde's messages about settings (a job spec's keys, a model's fields) in the terms of the
//! TOML a user writes: "expected a whole number of 0 or more, not a table" instead of
//! "invalid type: map, expected usize", "a table with a `kind`" instead of "internally tagged
//! enum OptimizerSpec". No Rust type name reaches the user.
//!
//! serde reports a mismatch only as text, in a handful of fixed forms (`invalid type: …,
//! expected …`, `unknown variant …`, …, written by `serde::de::Error`'s provided methods);
//! [`SettingMessage::parse`] reads those forms back and [`SettingMessage::render`] words them.
//! A message of any other form (a setting's own sentence) is kept as it is.

use std::borrow::Cow;

/// What serde said about a setting's value, read back from its message.
#[derive(Clone, Debug, PartialEq)]
pub enum SettingMessage<'a> {
    /// A value of the wrong kind or out of range (`invalid type` and `invalid value`).
    Mismatch {
        /// What was found, as serde describes it.
        found: Found<'a>,
        /// What the setting takes, as serde (or the setting's visitor) describes it.
        expected: &'a str,
    },
    /// A list of the wrong length.
    Length {
        /// The length found.
        found: &'a str,
        /// What the setting takes.
        expected: &'a str,
    },
    /// A name that is not one of a setting's names (`unknown variant`).
    UnknownName {
        /// The name given.
        given: &'a str,
        /// The names allowed.
        allowed: Vec<&'a str>,
    },
    /// A key that a table does not have (`unknown field`).
    UnknownKey {
        /// The key given.
        key: &'a str,
        /// The keys allowed.
        allowed: Vec<&'a str>,
    },
    /// A key that must be given (`missing field`).
    MissingKey(&'a str),
    /// Any other message: a setting's own sentence.
    Other(&'a str),
}

/// A value serde found where another was expected.
#[derive(Clone, Debug, PartialEq)]
pub enum Found<'a> {
    /// `true` or `false`.
    Bool(bool),
    /// A whole number, as written.
    Integer(&'a str),
    /// A number with a fraction or exponent, as written.
    Float(&'a str),
    /// A string (its text as serde quoted it, escapes included).
    Str(&'a str),
    /// A table.
    Table,
    /// A list.
    List,
    /// Something TOML has no word for (a unit, an enum variant).
    Other,
}

impl<'a> SettingMessage<'a> {
    /// Reads serde's `message` back.
    pub fn parse(message: &'a str) -> SettingMessage<'a> {
        let message = message.trim();
        if let Some(rest) = message
            .strip_prefix("invalid type: ")
            .or_else(|| message.strip_prefix("invalid value: "))
            && let Some((found, expected)) = rest.rsplit_once(", expected ")
        {
            return SettingMessage::Mismatch {
                found: Found::parse(found),
                expected,
            };
        }
        if let Some(rest) = message.strip_prefix("invalid length ")
            && let Some((found, expected)) = rest.split_once(", expected ")
        {
            return SettingMessage::Length { found, expected };
        }
        if let Some(rest) = message.strip_prefix("unknown variant `")
            && let Some((given, allowed)) = quoted_then_list(rest)
        {
            return SettingMessage::UnknownName { given, allowed };
        }
        if let Some(rest) = message.strip_prefix("unknown field `")
            && let Some((key, allowed)) = quoted_then_list(rest)
        {
            return SettingMessage::UnknownKey { key, allowed };
        }
        if let Some(rest) = message.strip_prefix("missing field `")
            && let Some(key) = rest.strip_suffix('`')
        {
            return SettingMessage::MissingKey(key);
        }
        SettingMessage::Other(message)
    }

    /// The message in TOML terms. `actual` describes the value really found (by the caller,
    /// who holds the document; see [`describe_json`]) and replaces serde's description of it,
    /// which can be wrong (an integer given for a name reads "unit variant").
    pub fn render(&self, actual: Option<&str>) -> String {
        match self {
            SettingMessage::Mismatch { found, expected } => {
                let found = actual.map_or_else(|| found.describe(), str::to_string);
                format!(
                    "expected {}, not {found}",
                    expected_in_toml(expected, actual)
                )
            }
            SettingMessage::Length { found, expected } => {
                format!(
                    "expected {}, not a list of length {found}",
                    expected_in_toml(expected, None)
                )
            }
            // A table or list given for a name: serde took its first key or item for it.
            SettingMessage::UnknownName { allowed, .. }
                if !allowed.is_empty() && matches!(actual, Some("a table" | "a list")) =>
            {
                format!(
                    "expected one of {} (a string), not {}",
                    quoted(allowed),
                    actual.unwrap_or_default()
                )
            }
            SettingMessage::UnknownName { given, allowed } if allowed.is_empty() => {
                format!("`{given}` is not a name this setting takes")
            }
            SettingMessage::UnknownName { given, allowed } => {
                format!("`{given}` is not one of {}", quoted(allowed))
            }
            SettingMessage::UnknownKey { key, allowed } if allowed.is_empty() => {
                format!("unknown key `{key}`; this table takes no keys")
            }
            SettingMessage::UnknownKey { key, allowed } => {
                format!(
                    "unknown key `{key}` (expected one of: {})",
                    allowed.join(", ")
                )
            }
            SettingMessage::MissingKey(key) => format!("`{key}` is required"),
            SettingMessage::Other(text) => text.to_string(),
        }
    }
}

/// serde's `message` in TOML terms ([`SettingMessage`]); `actual` as in
/// [`SettingMessage::render`].
pub fn in_toml_terms(message: &str, actual: Option<&str>) -> String {
    SettingMessage::parse(message).render(actual)
}

impl<'a> Found<'a> {
    /// Reads serde's description of an unexpected value (`integer `3``, `string "x"`, `map`).
    fn parse(text: &'a str) -> Found<'a> {
        let ticked = |prefix: &str| {
            text.strip_prefix(prefix)
                .and_then(|t| t.strip_prefix('`'))
                .and_then(|t| t.strip_suffix('`'))
        };
        if let Some(b) = ticked("boolean ") {
            return Found::Bool(b == "true");
        }
        if let Some(i) = ticked("integer ") {
            return Found::Integer(i);
        }
        if let Some(f) = ticked("floating point ") {
            return Found::Float(f);
        }
        if let Some(s) = text.strip_prefix("string ") {
            return Found::Str(s);
        }
        if let Some(c) = ticked("character ") {
            return Found::Str(c);
        }
        match text {
            "map" => Found::Table,
            "sequence" => Found::List,
            _ => Found::Other,
        }
    }

    /// The value in TOML terms: `3`, `the string "x"`, `a table`.
    pub fn describe(&self) -> String {
        match self {
            Found::Bool(b) => b.to_string(),
            Found::Integer(i) | Found::Float(i) => i.to_string(),
            Found::Str(s) if s.starts_with('"') => format!("the string {s}"),
            Found::Str(s) => format!("the string \"{s}\""),
            Found::Table => "a table".into(),
            Found::List => "a list".into(),
            Found::Other => "a value of another kind".into(),
        }
    }
}

/// A JSON value (a model's field) in TOML terms, as [`Found::describe`] words it.
pub fn describe_json(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::Null => "a value of another kind".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a table".into(),
    }
}

/// A setting that cannot be read: its full key and what is wrong, in TOML terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingError {
    /// The key with list indices: `model.layers[2].out`.
    pub key: String,
    /// What is wrong and what the key takes.
    pub message: String,
}

/// Reads `value`, the settings at `key` (`model`, `model.layers[2]`), into a `T`; the error
/// names the key at fault by its full path and words serde's message in TOML terms.
pub fn from_json<T: serde::de::DeserializeOwned>(
    key: &str,
    value: &serde_json::Value,
) -> Result<T, SettingError> {
    serde_path_to_error::deserialize(value.clone()).map_err(|e| {
        let mut full = key.to_string();
        let mut at = Some(value);
        for segment in e.path().iter() {
            match segment {
                serde_path_to_error::Segment::Seq { index } => {
                    full.push_str(&format!("[{index}]"));
                    at = at.and_then(|v| v.get(index));
                }
                serde_path_to_error::Segment::Map { key } => {
                    full.push_str(&format!(".{key}"));
                    at = at.and_then(|v| v.get(key));
                }
                _ => at = None,
            }
        }
        let inner = e.inner().to_string();
        let parsed = SettingMessage::parse(&inner);
        // The path of an unknown key may already end at the key, which the message names.
        if let SettingMessage::UnknownKey { key, .. } = &parsed
            && let Some(table) = full.strip_suffix(&format!(".{key}"))
        {
            full.truncate(table.len());
        }
        let actual = at.map(describe_json);
        SettingError {
            key: full,
            message: parsed.render(actual.as_deref()),
        }
    })
}

/// What a setting takes, in TOML terms: serde's names of Rust types become what a user writes.
/// A setting's own description ("\"auto\" or a bucket size in MiB") is kept. `actual` (the
/// value found, described) helps the example of a table with a `kind`.
fn expected_in_toml<'e>(expected: &'e str, actual: Option<&str>) -> Cow<'e, str> {
    let whole = ["u8", "u16", "u32", "u64", "u128", "usize"];
    let signed = ["i8", "i16", "i32", "i64", "i128", "isize"];
    let words = match expected {
        e if whole.contains(&e) => "a whole number of 0 or more",
        e if signed.contains(&e) => "a whole number",
        "f32" | "f64" => "a number",
        "a boolean" | "bool" => "true or false",
        "a string" | "string only" | "a borrowed string" | "a character" | "char"
        | "string or map" | "variant identifier" | "field identifier" => "a string",
        "a sequence" => "a list",
        "a map" => "a table",
        e if e.starts_with("struct ") => "a table",
        e if e.starts_with("internally tagged enum ") => {
            // Every internally tagged setting of the spec (optimizer, schedule) is tagged by
            // `kind`; the layers of a model are read by their own parser.
            return Cow::Owned(match actual.and_then(|a| a.strip_prefix("the string ")) {
                Some(name) => format!("a table with a `kind`, such as {{ kind = {name} }}"),
                None => "a table with a `kind`".into(),
            });
        }
        e if e.starts_with("enum ") => "a name (a string)",
        e if ["an array of length ", "a tuple of size ", "tuple struct "]
            .iter()
            .any(|p| e.starts_with(p)) =>
        {
            let n = e
                .split(' ')
                .find(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()));
            return Cow::Owned(match n {
                Some(n) => format!("a list of {n} values"),
                None => "a list".into(),
            });
        }
        other => return Cow::Borrowed(other),
    };
    Cow::Borrowed(words)
}

/// The rest of "`NAME`, expected one of `a`, `b`" (or "`NAME`, there are no …"): the name
/// and the list. The name is the user's and may hold backticks; the allowed names never do,
/// so the split is at the last separator.
fn quoted_then_list(rest: &str) -> Option<(&str, Vec<&str>)> {
    if let Some(at) = rest.rfind("`, there are no ") {
        return Some((&rest[..at], Vec::new()));
    }
    let at = rest.rfind("`, expected ")?;
    let list = &rest[at + "`, expected ".len()..];
    let allowed = list.split('`').skip(1).step_by(2).collect();
    Some((&rest[..at], allowed))
}

/// `a`, `b` or `c` as "`a`, `b` or `c`".
fn quoted(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.join(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatches_are_worded_in_toml_terms() {
        for (message, actual, worded) in [
            (
                "invalid type: map, expected usize",
                None,
                "expected a whole number of 0 or more, not a table",
            ),
            (
                "invalid value: integer `-1`, expected u64",
                None,
                "expected a whole number of 0 or more, not -1",
            ),
            (
                "invalid type: string \"x\", expected f32",
                None,
                "expected a number, not the string \"x\"",
            ),
            (
                "invalid type: integer `3`, expected struct TrainSpec",
                None,
                "expected a table, not 3",
            ),
            (
                "invalid type: string \"sgd\", expected internally tagged enum OptimizerSpec",
                Some("the string \"sgd\""),
                "expected a table with a `kind`, such as { kind = \"sgd\" }, not the string \
                 \"sgd\"",
            ),
            (
                "invalid type: unit variant, expected string only",
                Some("3"),
                "expected a string, not 3",
            ),
            (
                "invalid type: integer `4`, expected a boolean",
                None,
                "expected true or false, not 4",
            ),
            (
                "invalid type: integer `3`, expected a sequence",
                None,
                "expected a list, not 3",
            ),
            (
                "invalid value: string \"fast\", expected \"auto\" or a bucket size in MiB",
                None,
                "expected \"auto\" or a bucket size in MiB, not the string \"fast\"",
            ),
            (
                "invalid length 3, expected an array of length 2",
                None,
                "expected a list of 2 values, not a list of length 3",
            ),
        ] {
            assert_eq!(in_toml_terms(message, actual), worded, "{message}");
        }
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Layer {
        out: usize,
        #[serde(default)]
        bias: bool,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Model {
        layers: Vec<Layer>,
    }

    #[test]
    fn a_setting_is_named_by_its_full_key_with_list_indices() {
        let value = serde_json::json!({ "layers": [{ "out": 3 }, { "out": { "a": 1 } }] });
        let e = from_json::<Model>("model", &value).unwrap_err();
        assert_eq!(e.key, "model.layers[1].out");
        assert_eq!(
            e.message,
            "expected a whole number of 0 or more, not a table"
        );
        let value = serde_json::json!({ "layers": [{ "out": 3, "bias": "yes" }] });
        let e = from_json::<Model>("model", &value).unwrap_err();
        assert_eq!(e.key, "model.layers[0].bias");
        assert_eq!(e.message, "expected true or false, not the string \"yes\"");
        let value = serde_json::json!({ "layers": [{ "units": 3 }] });
        let e = from_json::<Model>("model", &value).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.message.as_str()),
            (
                "model.layers[0]",
                "unknown key `units` (expected one of: out, bias)"
            )
        );
    }

    #[test]
    fn names_and_keys_are_worded_and_other_messages_kept() {
        assert_eq!(
            in_toml_terms("unknown variant `foo`, expected one of `sgd`, `adam`", None),
            "`foo` is not one of `sgd` or `adam`"
        );
        assert_eq!(
            in_toml_terms(
                "unknown variant `kind`, expected `f32` or `bf16`",
                Some("a table")
            ),
            "expected one of `f32` or `bf16` (a string), not a table"
        );
        assert_eq!(
            in_toml_terms("unknown variant `a`b`, expected `x`", None),
            "`a`b` is not one of `x`"
        );
        assert_eq!(
            in_toml_terms("unknown field `units`, expected one of `out`, `bias`", None),
            "unknown key `units` (expected one of: out, bias)"
        );
        assert_eq!(
            in_toml_terms("missing field `kind`", None),
            "`kind` is required"
        );
        let own = "unknown device \"gpu\": expected \"cpu\", \"cuda\" or \"cuda:N\"";
        assert_eq!(in_toml_terms(own, None), own);
    }
}
