//! Entity-level precision, recall and F1 of IOB2 tag sequences, with the semantics of CoNLL's
//! `conlleval` script: an entity (a *chunk*) is a maximal run of tags of one type that starts
//! with `B-X`, or with an `I-X` that does not continue a chunk of type `X` (after `O`, or after a
//! tag of another type), and goes on over the `I-X` that follow. A predicted entity is correct
//! when a gold entity has the same first token, last token and type.
//!
//! Counts are sums ([`EntityCounts`]), so ranks count their own sentences and the driver adds
//! them before computing the ratios.

use std::collections::HashMap;
use std::ops::Range;

/// One entity of a sentence: its tokens and its type (an index into [`TagScheme::types`]).
pub type Entity = (Range<usize>, usize);

/// One tag of an IOB2 scheme, its entity type as an index into [`TagScheme::types`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// `O`: outside every entity.
    Outside,
    /// `B-X`: the first token of an entity of type `X`.
    Begin(usize),
    /// `I-X`: a following token of an entity of type `X`.
    Inside(usize),
}

/// A tag class that is not `O`, `B-<type>` or `I-<type>`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "tag class {index} ({name:?}) is not an IOB2 tag: entity F1 needs O, B-<type> or I-<type> \
     for every class"
)]
pub struct NotIob2 {
    /// The class's index among the tag classes.
    pub index: usize,
    /// The class's name.
    pub name: String,
}

/// The tag classes of a model, each read as an IOB2 [`Tag`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagScheme {
    tags: Vec<Tag>,
    types: Vec<String>,
}

impl TagScheme {
    /// Reads each class name (`O`, `B-LOC`, `I-LOC`, ...) as a tag; the error names the first
    /// class that is none of these.
    pub fn parse<S: AsRef<str>>(classes: &[S]) -> Result<TagScheme, NotIob2> {
        let mut types: Vec<String> = Vec::new();
        let mut ids: HashMap<String, usize> = HashMap::new();
        let mut type_id = |name: &str| {
            *ids.entry(name.to_string()).or_insert_with(|| {
                types.push(name.to_string());
                types.len() - 1
            })
        };
        let mut tags = Vec::with_capacity(classes.len());
        for (index, class) in classes.iter().enumerate() {
            let name = class.as_ref();
            let tag = match name.split_once('-') {
                _ if name == "O" => Tag::Outside,
                Some(("B", kind)) if !kind.is_empty() => Tag::Begin(type_id(kind)),
                Some(("I", kind)) if !kind.is_empty() => Tag::Inside(type_id(kind)),
                _ => {
                    return Err(NotIob2 {
                        index,
                        name: name.to_string(),
                    });
                }
            };
            tags.push(tag);
        }
        Ok(TagScheme { tags, types })
    }

    /// The entity types, in the order their first tag appears among the classes.
    pub fn types(&self) -> &[String] {
        &self.types
    }

    /// The tag of class `class`, or `None` for an index that is not a class.
    pub fn tag(&self, class: usize) -> Option<Tag> {
        self.tags.get(class).copied()
    }

    /// The entities of a sentence given as class indices, in order. An index that is not a
    /// class counts as `O`.
    pub fn entities(&self, classes: &[usize]) -> Vec<Entity> {
        let mut found = Vec::new();
        let mut open: Option<(usize, usize)> = None;
        for (at, &class) in classes.iter().enumerate() {
            let tag = self.tag(class).unwrap_or(Tag::Outside);
            let continues =
                matches!((tag, open), (Tag::Inside(t), Some((_, open_t))) if t == open_t);
            if continues {
                continue;
            }
            if let Some((start, kind)) = open.take() {
                found.push((start..at, kind));
            }
            open = match tag {
                Tag::Outside => None,
                Tag::Begin(t) | Tag::Inside(t) => Some((at, t)),
            };
        }
        if let Some((start, kind)) = open {
            found.push((start..classes.len(), kind));
        }
        found
    }

    /// The counts of one sentence: its gold and predicted tags as class indices, one per token
    /// (the shorter length is used if they differ).
    pub fn count(&self, gold: &[usize], predicted: &[usize]) -> EntityCounts {
        let len = gold.len().min(predicted.len());
        let gold = self.entities(&gold[..len]);
        let predicted = self.entities(&predicted[..len]);
        let correct = predicted.iter().filter(|e| gold.contains(e)).count();
        EntityCounts {
            correct: correct as u64,
            predicted: predicted.len() as u64,
            gold: gold.len() as u64,
        }
    }
}

/// Entity counts over any number of sentences; add them across sentences and ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntityCounts {
    /// Predicted entities that match a gold entity exactly (tokens and type).
    pub correct: u64,
    /// Predicted entities.
    pub predicted: u64,
    /// Gold entities.
    pub gold: u64,
}

impl std::ops::AddAssign for EntityCounts {
    fn add_assign(&mut self, other: EntityCounts) {
        self.correct += other.correct;
        self.predicted += other.predicted;
        self.gold += other.gold;
    }
}

impl EntityCounts {
    /// Correct over predicted (0 when nothing was predicted, as conlleval reports it).
    pub fn precision(&self) -> f64 {
        ratio(self.correct, self.predicted)
    }

    /// Correct over gold (0 when there is no gold entity).
    pub fn recall(&self) -> f64 {
        ratio(self.correct, self.gold)
    }

    /// The harmonic mean of precision and recall (0 when both are 0).
    pub fn f1(&self) -> f64 {
        let (p, r) = (self.precision(), self.recall());
        if p + r == 0.0 {
            0.0
        } else {
            2.0 * p * r / (p + r)
        }
    }
}

/// `a / b`, or 0 when `b` is 0.
fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

#[cfg(test)]
mod tests;
