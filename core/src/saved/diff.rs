//! Where two model specs first differ, and values shown short enough for one sentence.

use ringflow_ml::nn::ModelSpec;
use serde_json::Value;

/// The longest value a message shows whole.
const SHOWN: usize = 60;

/// Where `a` and `b` first differ, in key order (`layers[1]`, `kind`), with each side's value
/// there (shortened JSON, or `nothing` where one side has no such key); `None` when they are
/// equal.
pub(super) fn first_difference(a: &ModelSpec, b: &ModelSpec) -> Option<(String, String, String)> {
    if a == b {
        return None;
    }
    let a = serde_json::to_value(a).unwrap_or(Value::Null);
    let b = serde_json::to_value(b).unwrap_or(Value::Null);
    let (at, x, y) = differ(&a, &b, String::new())?;
    Some((if at.is_empty() { "the top".into() } else { at }, x, y))
}

fn differ(a: &Value, b: &Value, at: String) -> Option<(String, String, String)> {
    match (a, b) {
        _ if a == b => None,
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let here = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => differ(v, w, here),
                    (v, w) => Some((here, shown(v), shown(w))),
                }
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            let pairs = x.iter().zip(y).enumerate();
            let inner = pairs
                .filter_map(|(i, (v, w))| differ(v, w, format!("{at}[{i}]")))
                .next();
            inner.or_else(|| {
                let i = x.len().min(y.len());
                Some((format!("{at}[{i}]"), shown(x.get(i)), shown(y.get(i))))
            })
        }
        _ => Some((at, shown(Some(a)), shown(Some(b)))),
    }
}

/// A value as JSON, shortened; `nothing` for none.
fn shown(v: Option<&Value>) -> String {
    match v {
        None => "nothing".into(),
        Some(v) => short(&v.to_string()),
    }
}

/// `text` cut to [`SHOWN`] characters (with `…`) and with control characters escaped, so that
/// a message stays one short line.
pub(super) fn short(text: &str) -> String {
    let mut out = String::with_capacity(SHOWN + 4);
    for c in text.chars().take(SHOWN) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if text.chars().count() > SHOWN {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: Value) -> ModelSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn names_the_first_place_the_specs_differ() {
        let a = spec(serde_json::json!({"kind": "mlp", "layers": [4, 16, 3]}));
        let b = spec(serde_json::json!({"kind": "mlp", "layers": [4, 17, 3]}));
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(
            first_difference(&a, &b),
            Some(("layers[1]".into(), "16".into(), "17".into()))
        );
        let c = spec(serde_json::json!({"kind": "mlp", "layers": [4, 16], "dropout": 0.5}));
        assert_eq!(
            first_difference(&a, &c),
            Some(("dropout".into(), "nothing".into(), "0.5".into()))
        );
        assert_eq!(
            first_difference(&c, &a),
            Some(("dropout".into(), "0.5".into(), "nothing".into()))
        );
        let d = spec(serde_json::json!({"kind": "cnn", "layers": [4, 16, 3]}));
        assert_eq!(
            first_difference(&a, &d),
            Some(("kind".into(), "\"mlp\"".into(), "\"cnn\"".into()))
        );
        let long = "x".repeat(500);
        let e = spec(serde_json::json!({"kind": long}));
        let (_, shown, _) = first_difference(&e, &a).unwrap();
        assert!(shown.chars().count() <= SHOWN + 1, "{shown}");
    }
}
