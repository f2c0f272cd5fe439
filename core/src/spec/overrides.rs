//! `--set a.b.c=value` and flags such as `--executors 4`: command-line overrides applied to the
//! parsed TOML document, all of them before the spec is checked once.

use std::str::FromStr;

use toml::{Table, Value};

use super::SpecError;

/// One `--set KEY=VALUE` argument, or a command-line flag that sets a spec field
/// ([`Override::flag`]).
///
/// The value of `--set` is read as a TOML value (`2`, `0.1`, `true`, `[784, 10]`, `"text"`,
/// `{ kind = "sgd" }`) and, when it is not one, taken as a string, so
/// `--set train.optimizer.kind=sgd` works without quotes.
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    /// The dotted path, split.
    pub path: Vec<String>,
    /// The value to put there.
    pub value: Value,
    /// The argument as given (`--set train.epochs=2`, `--executors 4`), for error messages.
    given: String,
    /// Whether a flag (rather than `--set`) gave it: checks that refuse the field then say so.
    from_flag: bool,
}

impl FromStr for Override {
    type Err = SpecError;

    fn from_str(arg: &str) -> Result<Self, SpecError> {
        let fail = |message: &str| SpecError::Override {
            arg: format!("--set {arg}"),
            message: message.to_string(),
        };
        let (key, raw_value) = arg
            .split_once('=')
            .ok_or_else(|| fail("expected KEY=VALUE, e.g. train.epochs=2"))?;
        let path: Vec<String> = key
            .trim()
            .split('.')
            .map(|s| s.trim().to_string())
            .collect();
        if path.iter().any(String::is_empty) {
            return Err(fail("the key has an empty part; write it as a.b.c"));
        }
        let value = parse_value(raw_value.trim());
        Ok(Override {
            path,
            value,
            given: format!("--set {arg}"),
            from_flag: false,
        })
    }
}

/// `raw` as one TOML value, or as a string when it is not exactly one (a bare word, or text
/// that would also assign other keys, such as `2\nx = 3`, which is never half applied).
fn parse_value(raw: &str) -> Value {
    match format!("v = {raw}").parse::<Table>() {
        Ok(mut t) if t.len() == 1 => t
            .remove("v")
            .unwrap_or_else(|| Value::String(raw.to_string())),
        _ => Value::String(raw.to_string()),
    }
}

impl Override {
    /// The override of the spec field `key` (dotted) by the command-line flag `flag` with
    /// `value`: `Override::flag("--executors 4", "cluster.executors", 4)`. It is applied with
    /// the `--set` overrides (after them, so the flag wins) before the spec is checked.
    pub fn flag(flag: &str, key: &str, value: impl Into<Value>) -> Override {
        Override {
            path: key.split('.').map(str::to_string).collect(),
            value: value.into(),
            given: flag.to_string(),
            from_flag: true,
        }
    }

    /// The argument as given (`--set train.epochs=2`, `--executors 4`).
    pub fn given(&self) -> &str {
        &self.given
    }

    /// The dotted key it sets.
    pub fn key(&self) -> String {
        self.path.join(".")
    }

    /// For a flag whose field takes part in a refusal of `key` (`message` names the fields it
    /// compares): a note saying that the flag set it.
    pub(super) fn flag_note(&self, key: &str, message: &str) -> Option<String> {
        let own = self.key();
        let involved = key == own || message.contains(&own);
        (self.from_flag && involved).then(|| format!("{own} was set by {}", self.given))
    }

    /// Sets the value in `doc`, creating missing tables along the path.
    pub fn apply(&self, doc: &mut Table) -> Result<(), SpecError> {
        let mut table = doc;
        let (last, parents) = self.path.split_last().expect("paths are never empty");
        for (depth, part) in parents.iter().enumerate() {
            let entry = table
                .entry(part.clone())
                .or_insert_with(|| Value::Table(Table::new()));
            table = match entry {
                Value::Table(t) => t,
                other => {
                    return Err(SpecError::Override {
                        arg: self.given.clone(),
                        message: format!(
                            "`{}` is a {}, not a table, so it has no field `{}`",
                            self.path[..=depth].join("."),
                            other.type_str(),
                            self.path[depth + 1]
                        ),
                    });
                }
            };
        }
        table.insert(last.clone(), self.value.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(s: &str) -> Table {
        s.parse().unwrap()
    }

    #[test]
    fn values_are_typed_and_bare_words_are_strings() {
        assert_eq!("a=2".parse::<Override>().unwrap().value, Value::Integer(2));
        assert_eq!(
            "a=0.5".parse::<Override>().unwrap().value,
            Value::Float(0.5)
        );
        assert_eq!(
            "a=true".parse::<Override>().unwrap().value,
            Value::Boolean(true)
        );
        assert_eq!(
            "a=sgd".parse::<Override>().unwrap().value,
            Value::String("sgd".into())
        );
        assert!(matches!(
            "a=[1, 2]".parse::<Override>().unwrap().value,
            Value::Array(_)
        ));
        assert!("novalue".parse::<Override>().is_err());
        assert!("a..b=1".parse::<Override>().is_err());
    }

    /// Regression (found while writing the fuzz targets of `--set`): a value followed by a
    /// newline and another assignment was cut at the newline, so `train.epochs=2\nx=3` set
    /// the epochs and silently dropped the rest; it is one string, refused by the field.
    #[test]
    fn a_value_that_is_more_than_one_value_is_a_string() {
        let o: Override = "train.epochs=2\ncluster.executors = 5".parse().unwrap();
        assert_eq!(o.value, Value::String("2\ncluster.executors = 5".into()));
        let o: Override = "a=[1,\n 2] # two".parse().unwrap();
        assert!(matches!(o.value, Value::Array(_)), "{:?}", o.value);
    }

    #[test]
    fn reaches_into_inline_tables_and_creates_missing_ones() {
        let mut d = doc("[train]\noptimizer = { kind = \"adagrad\", lr = 0.05 }\n");
        "train.optimizer.lr=0.1"
            .parse::<Override>()
            .unwrap()
            .apply(&mut d)
            .unwrap();
        "cluster.executors=4"
            .parse::<Override>()
            .unwrap()
            .apply(&mut d)
            .unwrap();
        assert_eq!(d["train"]["optimizer"]["lr"].as_float(), Some(0.1));
        assert_eq!(d["train"]["optimizer"]["kind"].as_str(), Some("adagrad"));
        assert_eq!(d["cluster"]["executors"].as_integer(), Some(4));
    }

    #[test]
    fn refuses_to_descend_into_a_value() {
        let mut d = doc("[train]\nepochs = 2\n");
        let err = "train.epochs.x=1"
            .parse::<Override>()
            .unwrap()
            .apply(&mut d)
            .unwrap_err()
            .to_string();
        assert!(err.contains("train.epochs"), "{err}");
    }
}
