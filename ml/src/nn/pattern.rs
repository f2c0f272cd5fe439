//! [`NamePattern`]: which of a model's dotted tensor names a spec entry means, as
//! `model.freeze`, `model.init_skip` and `train.optimizer.groups` write them.
//!
//! A pattern is a prefix of names counted in whole segments: `layers.0` means `layers.0.weight`
//! and `layers.0.bias` (and everything deeper), never `layers.01.weight`. Within one segment `*`
//! matches any run of characters, so `layers.*.bias` means every layer's bias and `*` alone
//! means everything.

use std::fmt;

use crate::error::{MlError, Result};

/// A prefix of dotted tensor names, `*` matching within one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamePattern {
    text: String,
    segments: Vec<String>,
}

impl NamePattern {
    /// Parses `text`; `field` (e.g. `model.freeze`) names the spec entry in the error.
    pub fn parse(field: &str, text: &str) -> Result<NamePattern> {
        let segments: Vec<String> = text.split('.').map(str::to_string).collect();
        if text.trim() != text || segments.iter().any(|s| s.is_empty()) {
            return Err(MlError::spec(format!(
                "{field} entry {text:?} is not a name pattern: write dotted names such as \
                 \"layers.0\" or \"layers.3.*\", without empty segments or spaces"
            )));
        }
        Ok(NamePattern {
            text: text.to_string(),
            segments,
        })
    }

    /// Parses every entry of a list written under `field`.
    pub fn parse_all(field: &str, texts: &[String]) -> Result<Vec<NamePattern>> {
        texts.iter().map(|t| NamePattern::parse(field, t)).collect()
    }

    /// True when `name`'s first segments match all of the pattern's.
    pub fn matches(&self, name: &str) -> bool {
        let mut parts = name.split('.');
        self.segments
            .iter()
            .all(|want| parts.next().is_some_and(|got| segment_matches(want, got)))
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for NamePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// True when any of `patterns` matches `name`.
pub fn any_matches(patterns: &[NamePattern], name: &str) -> bool {
    patterns.iter().any(|p| p.matches(name))
}

/// Glob matching of one segment: `*` matches any run of characters, everything else itself.
fn segment_matches(pattern: &str, text: &str) -> bool {
    let Some((first, rest)) = pattern.split_once('*') else {
        return pattern == text;
    };
    let Some(mut remaining) = text.strip_prefix(first) else {
        return false;
    };
    let mut pieces: Vec<&str> = rest.split('*').collect();
    let last = pieces.pop().unwrap_or("");
    for piece in pieces {
        match remaining.find(piece) {
            Some(at) => remaining = &remaining[at + piece.len()..],
            None => return false,
        }
    }
    remaining.len() >= last.len() && remaining.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> NamePattern {
        NamePattern::parse("model.freeze", text).unwrap()
    }

    #[test]
    fn prefixes_count_whole_segments() {
        assert!(p("layers.0").matches("layers.0.weight"));
        assert!(p("layers.0").matches("layers.0.shortcut.1.running_var"));
        assert!(p("layers.0.weight").matches("layers.0.weight"));
        assert!(!p("layers.0").matches("layers.01.weight"));
        assert!(!p("layers.0").matches("layers"));
        assert!(!p("layers.0.weight.x").matches("layers.0.weight"));
    }

    #[test]
    fn a_star_matches_within_one_segment() {
        assert!(p("*").matches("layers.9.bias"));
        assert!(p("layers.3.*").matches("layers.3.weight"));
        assert!(!p("layers.3.*").matches("layers.3"));
        assert!(p("layers.*.bias").matches("layers.12.bias"));
        assert!(!p("layers.*.bias").matches("layers.12.weight"));
        assert!(p("layers.1*").matches("layers.12.bias"));
        assert!(!p("layers.1*").matches("layers.2.bias"));
        assert!(p("*.w_*").matches("encoder.w_input"));
        assert!(p("a*b*c").matches("aXbYc.z"));
        assert!(!p("a*b*c").matches("aXcYb"));
        assert!(!p("a*bc").matches("abc0"));
        assert!(p("*c*c").matches("cc"));
        assert!(!p("*c*c").matches("c"));
    }

    #[test]
    fn malformed_patterns_are_named() {
        for bad in ["", "layers..0", ".layers", "layers.0.", " layers.0"] {
            let e = NamePattern::parse("model.freeze", bad)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("model.freeze") && e.contains(&format!("{bad:?}")),
                "{e}"
            );
        }
    }
}
