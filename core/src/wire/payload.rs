//! The documents that travel inside control-plane messages, and their one conversion point.
//!
//! A message field that carries a document (the resolved job spec of a task, the spec a client
//! submits, the job's preprocessing, a rank's statistics, a job's summary) holds a
//! [`Payload`]'s text as [`encode`] writes it and only [`decode`] reads it, wherever the
//! message is received: no receiver parses such a field on its own.
//!
//! The text is JSON that names what it holds and the protocol version that wrote it, then
//! the value: `{"payload":"job spec","version":6,"value":{...}}`. [`decode`] refuses a text
//! of another protocol version, of another kind of document, or one that does not read, in
//! one [`PayloadError`] sentence naming the message field. A document that is stored and read
//! back by a later ringflow (a queued job, a trial) is therefore refused by name rather than
//! misread.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::PROTOCOL_VERSION;

/// A document that travels inside a control-plane message field.
pub trait Payload: Serialize + DeserializeOwned {
    /// What it is, for people and in the text's `payload` field ("job spec").
    const WHAT: &'static str;
}

/// Why a message field's document could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PayloadError {
    /// The text is not a payload at all.
    #[error(
        "{field} does not hold a ringflow {what} (it does not start as ringflow writes one); \
         was it sent by another program?"
    )]
    NotAPayload {
        /// The message field, dotted (`TaskHeader.job`).
        field: &'static str,
        /// The document expected.
        what: &'static str,
    },
    /// Another kind of document.
    #[error("{field} holds a document of kind {found:?} where a {what} belongs")]
    Kind {
        /// The message field, dotted.
        field: &'static str,
        /// The document expected.
        what: &'static str,
        /// The document found.
        found: String,
    },
    /// Written by another protocol version.
    #[error(
        "{field} holds a {what} written by ringflow protocol version {found}, and this \
         ringflow speaks version {PROTOCOL_VERSION}; use the same ringflow version everywhere"
    )]
    Version {
        /// The message field, dotted.
        field: &'static str,
        /// The document expected.
        what: &'static str,
        /// The version that wrote it.
        found: u32,
    },
    /// The value does not read as the document.
    #[error("{field} holds a {what} that cannot be read: {why}")]
    Unreadable {
        /// The message field, dotted.
        field: &'static str,
        /// The document expected.
        what: &'static str,
        /// The reader's sentence, with where in the value it stopped.
        why: String,
    },
}

const HEAD: &str = "{\"payload\":\"";
const VERSION: &str = "\",\"version\":";
const VALUE: &str = ",\"value\":";

/// `value` as the text of a message field: its kind, this protocol version, and its JSON.
pub fn encode<T: Payload>(value: &T) -> String {
    let json = serde_json::to_string(value).expect("a payload serializes to JSON");
    let mut text = String::with_capacity(json.len() + 64);
    text.push_str(HEAD);
    text.push_str(T::WHAT);
    text.push_str(VERSION);
    text.push_str(&PROTOCOL_VERSION.to_string());
    text.push_str(VALUE);
    text.push_str(&json);
    text.push('}');
    text
}

/// Reads the document that [`encode`] wrote into the message field `field` (named by errors).
pub fn decode<T: Payload>(field: &'static str, text: &str) -> Result<T, PayloadError> {
    let what = T::WHAT;
    let not_one = PayloadError::NotAPayload { field, what };
    let rest = text.strip_prefix(HEAD).ok_or(not_one.clone())?;
    let (kind, rest) = rest.split_once(VERSION).ok_or(not_one.clone())?;
    if kind != what {
        return Err(PayloadError::Kind {
            field,
            what,
            found: kind.chars().take(64).collect(),
        });
    }
    let (version, rest) = rest.split_once(VALUE).ok_or(not_one.clone())?;
    let found: u32 = version.parse().map_err(|_| not_one.clone())?;
    if found != PROTOCOL_VERSION {
        return Err(PayloadError::Version { field, what, found });
    }
    let json = rest.strip_suffix('}').ok_or(not_one)?;
    let de = &mut serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        let why = if at == "." {
            e.inner().to_string()
        } else {
            format!("at {at}: {}", e.inner())
        };
        PayloadError::Unreadable { field, what, why }
    })
}

/// Like [`decode`], with the empty text that a field holds when it carries nothing read as
/// `None`.
pub fn decode_optional<T: Payload>(
    field: &'static str,
    text: &str,
) -> Result<Option<T>, PayloadError> {
    if text.is_empty() {
        return Ok(None);
    }
    decode(field, text).map(Some)
}

/// `value`'s text, or the empty text for `None` (read back by [`decode_optional`]).
pub fn encode_optional<T: Payload>(value: Option<&T>) -> String {
    value.map(encode).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Doc {
        lr: f32,
        name: String,
    }

    impl Payload for Doc {
        const WHAT: &'static str = "test document";
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Other {
        n: u32,
    }

    impl Payload for Other {
        const WHAT: &'static str = "other document";
    }

    fn doc() -> Doc {
        Doc {
            lr: 0.05,
            name: "a \"quoted\" name }".into(),
        }
    }

    /// What is encoded reads back, numbers as written (an `f32` keeps its shortest form).
    #[test]
    fn a_payload_reads_back_as_it_was_written() {
        let text = encode(&doc());
        assert!(text.contains("\"lr\":0.05,"), "{text}");
        assert_eq!(decode::<Doc>("T.doc", &text).unwrap(), doc());
        assert_eq!(decode_optional::<Doc>("T.doc", "").unwrap(), None);
        assert_eq!(encode_optional::<Doc>(None), "");
    }

    /// Another protocol version, another document, plain JSON and a damaged value are each
    /// refused by a sentence naming the field.
    #[test]
    fn what_is_not_this_versions_document_is_refused_by_name() {
        let text = encode(&doc());
        let old = text.replace(
            &format!("\"version\":{PROTOCOL_VERSION},"),
            "\"version\":5,",
        );
        let err = decode::<Doc>("T.doc", &old).unwrap_err();
        assert!(
            matches!(err, PayloadError::Version { found: 5, .. }),
            "{err}"
        );
        assert!(
            err.to_string()
                .starts_with("T.doc holds a test document written by")
        );

        let err = decode::<Other>("T.other", &text).unwrap_err();
        assert!(matches!(err, PayloadError::Kind { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("holds a document of kind \"test document\" where a other")
        );

        let plain = serde_json::to_string(&doc()).unwrap();
        let err = decode::<Doc>("T.doc", &plain).unwrap_err();
        assert!(matches!(err, PayloadError::NotAPayload { .. }), "{err}");

        let damaged = text.replace("0.05", "\"fast\"");
        let err = decode::<Doc>("T.doc", &damaged).unwrap_err().to_string();
        assert!(err.contains("at lr:"), "{err}");

        let cut = &text[..text.len() - 1];
        assert!(decode::<Doc>("T.doc", cut).is_err());
    }
}
