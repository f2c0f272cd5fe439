//! The figures of token-sequence jobs, and how lines show them.
//!
//! Executors training on token sequences report the real tokens of the rows they trained and
//! the padding their batches held ([`Tokens`]); a tagger's evaluation counts tokens rather than
//! rows, and an IOB2 tagger's also counts entities ([`EntityCounts`]). Jobs that are not
//! sequences report none of these, and nothing here shows for them.

use ringflow_core::metrics::entities::EntityCounts;
use ringflow_core::pb;
use serde::{Deserialize, Serialize};

/// The real tokens of the rows trained, and the padding steps their batches held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tokens {
    /// Real tokens.
    pub tokens: u64,
    /// Padding steps (a batch is padded to its longest sequence).
    pub padding: u64,
}

impl Tokens {
    /// The counts of a sequence job; `None` when both are 0 (a job that is not a sequence).
    pub fn new(tokens: u64, padding: u64) -> Option<Tokens> {
        (tokens > 0 || padding > 0).then_some(Tokens { tokens, padding })
    }

    /// Real tokens per second over `seconds`.
    pub fn per_second(&self, seconds: f64) -> f64 {
        self.tokens as f64 / seconds.max(1e-9)
    }

    /// The share of the batches' steps that were padding: `padding / (tokens + padding)`.
    pub fn padding_fraction(&self) -> f64 {
        let all = self.tokens + self.padding;
        if all == 0 {
            0.0
        } else {
            self.padding as f64 / all as f64
        }
    }

    /// `14356 tokens, 5210 tokens/s, padding 4.2%`: the tokens trained in `seconds`.
    pub fn line(&self, seconds: f64) -> String {
        format!(
            "{} tokens, {:.0} tokens/s, padding {}",
            self.tokens,
            self.per_second(seconds),
            percent(self.padding_fraction())
        )
    }
}

/// `4.2%`.
pub fn percent(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

/// The entity counts of an evaluation (ranks' shares added up), if it counted entities.
pub fn entities(e: &pb::EvalReport) -> Option<EntityCounts> {
    e.entities.map(|c| EntityCounts {
        correct: c.correct,
        predicted: c.predicted,
        gold: c.gold,
    })
}

/// An IOB2 tagger's entity-level figures, as the event log, `ringflow history` and the web UI
/// give them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntityFigures {
    /// The harmonic mean of precision and recall.
    pub f1: f64,
    /// Entities found right over entities predicted.
    pub precision: f64,
    /// Entities found right over entities in the labels.
    pub recall: f64,
    /// Predicted entities that match a labelled one exactly (tokens and type).
    pub correct: u64,
    /// Entities predicted.
    pub predicted: u64,
    /// Entities in the labels.
    pub gold: u64,
}

impl From<EntityCounts> for EntityFigures {
    fn from(c: EntityCounts) -> EntityFigures {
        EntityFigures {
            f1: c.f1(),
            precision: c.precision(),
            recall: c.recall(),
            correct: c.correct,
            predicted: c.predicted,
            gold: c.gold,
        }
    }
}

impl EntityFigures {
    /// `entity F1 0.7123 (precision 0.70, recall 0.72)`.
    pub fn line(&self) -> String {
        entity_line(self.f1, self.precision, self.recall)
    }
}

/// `entity F1 0.7123 (precision 0.70, recall 0.72)`.
pub fn entity_line(f1: f64, precision: f64, recall: f64) -> String {
    format!("entity F1 {f1:.4} (precision {precision:.2}, recall {recall:.2})")
}

/// What an evaluation counted: `1164 tokens` for a tagger, `50 rows` otherwise.
pub fn evaluated(rows: u64, per_token: bool) -> String {
    let unit = if per_token { "tokens" } else { "rows" };
    format!("{rows} {unit}")
}

/// The line that follows a tagger's test line (whose accuracy is per token and whose rows are
/// tokens): `token accuracy 0.9412, entity F1 0.7123 (precision 0.70, recall 0.72) (1164
/// tokens)`; `None` for an evaluation of rows without entity counts. `accuracy` is the test
/// line's (none for a regression).
pub fn tagger_test_line(e: &pb::EvalReport, accuracy: Option<f64>) -> Option<String> {
    let entities = entities(e);
    if !e.tokens && entities.is_none() {
        return None;
    }
    let mut figures = Vec::new();
    if let Some(a) = accuracy {
        let name = if e.tokens {
            "token accuracy"
        } else {
            "accuracy"
        };
        figures.push(format!("{name} {a:.4}"));
    }
    if let Some(c) = entities {
        figures.push(entity_line(c.f1(), c.precision(), c.recall()));
    }
    Some(format!(
        "{} ({})",
        figures.join(", "),
        evaluated(e.rows, e.tokens)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_lines_show_the_rate_and_the_padding_share() {
        assert_eq!(Tokens::new(0, 0), None, "not a sequence job");
        let t = Tokens::new(14_356, 630).unwrap();
        assert_eq!(t.line(2.8), "14356 tokens, 5127 tokens/s, padding 4.2%");
        assert_eq!(Tokens::new(0, 5).unwrap().padding_fraction(), 1.0);
    }

    #[test]
    fn a_taggers_test_line_counts_tokens_and_entities() {
        let mut e = pb::EvalReport {
            rows: 1164,
            tokens: true,
            ..Default::default()
        };
        assert_eq!(
            tagger_test_line(&e, Some(0.94123)).unwrap(),
            "token accuracy 0.9412 (1164 tokens)"
        );
        e.entities = Some(pb::EntityCounts {
            correct: 70,
            predicted: 100,
            gold: 97,
        });
        assert_eq!(
            tagger_test_line(&e, Some(0.94123)).unwrap(),
            "token accuracy 0.9412, entity F1 0.7107 (precision 0.70, recall 0.72) (1164 tokens)"
        );
        let rows = pb::EvalReport {
            rows: 50,
            ..Default::default()
        };
        assert_eq!(
            tagger_test_line(&rows, Some(0.9)),
            None,
            "rows, no entities"
        );
    }
}
