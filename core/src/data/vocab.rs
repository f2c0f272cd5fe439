//! Token vocabularies of string sequence columns: counted per executor over its partitions
//! ([`TokenCounts`], a partial of the whole-data statistics), merged by the driver, and turned
//! into a [`Vocabulary`] that maps every token to an id, identically in training, evaluation and
//! prediction (it is saved with the model).
//!
//! Ids 0 and 1 are reserved: [`PAD`] fills the steps after a sequence's end, [`UNK`] stands for
//! every token outside the vocabulary. The other ids go to the most frequent tokens (ties broken
//! by the token's text, so every run builds the same vocabulary).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// The id of padding.
pub const PAD: u32 = 0;
/// The id of a token outside the vocabulary.
pub const UNK: u32 = 1;
/// How padding and unknown tokens are written in a saved vocabulary.
pub const RESERVED: [&str; 2] = ["<pad>", "<unk>"];
/// Most distinct tokens one partial may count: a bound on the memory of the statistics pass and
/// on the size of the partial sent to the driver.
pub const MAX_DISTINCT_TOKENS: usize = 2_000_000;

/// Why token counts or a vocabulary could not be built or read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VocabError {
    /// More distinct tokens than [`MAX_DISTINCT_TOKENS`].
    #[error(
        "the sequence column has more than {limit} distinct tokens; a vocabulary is counted in \
         memory, so split or hash the tokens first"
    )]
    TooManyTokens {
        /// The bound that was passed.
        limit: usize,
    },
    /// A saved vocabulary that does not start with the reserved tokens or repeats a token.
    #[error("the saved vocabulary is damaged: {0}")]
    Damaged(String),
}

/// How often each token occurs (one executor's partial, or the merged whole).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCounts {
    counts: BTreeMap<String, u64>,
}

impl TokenCounts {
    /// Counts one occurrence of `token`; an error once the distinct tokens would pass `limit`.
    pub fn add(&mut self, token: &str, limit: usize) -> Result<(), VocabError> {
        if let Some(n) = self.counts.get_mut(token) {
            *n += 1;
            return Ok(());
        }
        if self.counts.len() >= limit {
            return Err(VocabError::TooManyTokens { limit });
        }
        self.counts.insert(token.to_string(), 1);
        Ok(())
    }

    /// Adds another partial's counts; an error once the distinct tokens would pass `limit`.
    pub fn merge(&mut self, other: TokenCounts, limit: usize) -> Result<(), VocabError> {
        for (token, n) in other.counts {
            if !self.counts.contains_key(&token) && self.counts.len() >= limit {
                return Err(VocabError::TooManyTokens { limit });
            }
            *self.counts.entry(token).or_insert(0) += n;
        }
        Ok(())
    }

    /// Distinct tokens counted.
    pub fn distinct(&self) -> usize {
        self.counts.len()
    }

    /// Occurrences of `token`.
    pub fn count(&self, token: &str) -> u64 {
        self.counts.get(token).copied().unwrap_or(0)
    }
}

/// Token ↔ id, with [`PAD`] and [`UNK`] reserved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vocabulary {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Vocabulary {
    /// The tokens seen at least `min_count` times, most frequent first (ties by text), at most
    /// `max_size` ids in all counting the two reserved ones.
    pub fn build(counts: &TokenCounts, max_size: usize, min_count: u64) -> Vocabulary {
        let mut kept: Vec<(&String, u64)> = counts
            .counts
            .iter()
            .filter(|(_, n)| **n >= min_count)
            .map(|(t, n)| (t, *n))
            .collect();
        // The counts iterate in text order, and the sort is stable: ties stay in text order.
        kept.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        let room = max_size.saturating_sub(RESERVED.len());
        let words = kept.into_iter().take(room).map(|(t, _)| t.clone());
        let tokens: Vec<String> = RESERVED
            .iter()
            .map(|r| r.to_string())
            .chain(words)
            .collect();
        Vocabulary::from_tokens(tokens).expect("a built vocabulary has distinct tokens")
    }

    /// A vocabulary from its tokens in id order (as saved): the first two must be
    /// [`RESERVED`], and no token may repeat.
    pub fn from_tokens(tokens: Vec<String>) -> Result<Vocabulary, VocabError> {
        if tokens.len() < RESERVED.len() || tokens[..2] != RESERVED {
            return Err(VocabError::Damaged(format!(
                "it must start with {RESERVED:?}"
            )));
        }
        let mut ids = HashMap::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate().skip(RESERVED.len()) {
            if ids.insert(token.clone(), id as u32).is_some() {
                return Err(VocabError::Damaged(format!(
                    "token {token:?} appears twice"
                )));
            }
        }
        Ok(Vocabulary { tokens, ids })
    }

    /// The first id (past the reserved ones) whose token `counts` counts `count` times or fewer:
    /// in a vocabulary built from `counts`, ordered by count, every id from it on is as rare.
    pub fn first_with_count(&self, counts: &TokenCounts, count: u64) -> Option<u32> {
        self.tokens
            .iter()
            .enumerate()
            .skip(RESERVED.len())
            .find(|(_, t)| counts.count(t) <= count)
            .map(|(id, _)| id as u32)
    }

    /// The id of `token`: its own, or [`UNK`].
    pub fn id(&self, token: &str) -> u32 {
        self.ids.get(token).copied().unwrap_or(UNK)
    }

    /// The token of `id`, or `None` past the end.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Ids in all, the reserved ones included (an embedding's number of rows).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the vocabulary holds only the reserved ids.
    pub fn is_empty(&self) -> bool {
        self.tokens.len() <= RESERVED.len()
    }

    /// The tokens in id order, as saved.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }
}

impl Serialize for Vocabulary {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.tokens.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Vocabulary {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let tokens = Vec::<String>::deserialize(d)?;
        Vocabulary::from_tokens(tokens).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(text: &str) -> TokenCounts {
        let mut c = TokenCounts::default();
        for t in text.split_whitespace() {
            c.add(t, 100).expect("under the limit");
        }
        c
    }

    #[test]
    fn frequent_tokens_get_the_first_ids_and_ties_go_by_text() {
        let c = counts("b a c a b a d");
        let v = Vocabulary::build(&c, 100, 1);
        assert_eq!(v.tokens(), ["<pad>", "<unk>", "a", "b", "c", "d"]);
        assert_eq!((v.id("a"), v.id("d"), v.id("zzz")), (2, 5, UNK));
        assert_eq!(v.token(3), Some("b"));
        assert_eq!(v.token(6), None);
    }

    #[test]
    fn max_size_counts_the_reserved_ids_and_min_count_drops_rare_tokens() {
        let c = counts("b a c a b a d");
        assert_eq!(
            Vocabulary::build(&c, 4, 1).tokens(),
            ["<pad>", "<unk>", "a", "b"]
        );
        assert_eq!(
            Vocabulary::build(&c, 100, 2).tokens(),
            ["<pad>", "<unk>", "a", "b"]
        );
        let tiny = Vocabulary::build(&c, 1, 1);
        assert!(tiny.is_empty());
        assert_eq!(tiny.len(), 2);
    }

    #[test]
    fn partials_merge_to_the_counts_of_the_whole() {
        let mut a = counts("x y x");
        a.merge(counts("y z x"), 100).expect("under the limit");
        assert_eq!(a, counts("x y x y z x"));
        assert_eq!((a.count("x"), a.count("y"), a.count("w")), (3, 2, 0));
    }

    #[test]
    fn distinct_tokens_are_bounded() {
        let mut c = TokenCounts::default();
        c.add("a", 2).expect("1 of 2");
        c.add("b", 2).expect("2 of 2");
        c.add("a", 2).expect("a repeat costs nothing");
        assert_eq!(c.add("c", 2), Err(VocabError::TooManyTokens { limit: 2 }));
        assert_eq!(
            c.clone().merge(counts("d"), 2),
            Err(VocabError::TooManyTokens { limit: 2 })
        );
        c.merge(counts("a b"), 2).expect("known tokens only");
        assert_eq!(c.distinct(), 2);
    }

    #[test]
    fn a_saved_vocabulary_reads_back_and_damage_is_refused() {
        let v = Vocabulary::build(&counts("東京 に 行く 東京"), 10, 1);
        let json = serde_json::to_string(&v).expect("serializes");
        assert_eq!(json, r#"["<pad>","<unk>","東京","に","行く"]"#);
        let back: Vocabulary = serde_json::from_str(&json).expect("reads back");
        assert_eq!(back, v);
        for bad in [
            r#"["<unk>","<pad>","a"]"#,
            r#"["<pad>"]"#,
            r#"["<pad>","<unk>","a","a"]"#,
        ] {
            let err = serde_json::from_str::<Vocabulary>(bad)
                .expect_err(bad)
                .to_string();
            assert!(
                err.contains("the saved vocabulary is damaged"),
                "{bad}: {err}"
            );
        }
    }
}
