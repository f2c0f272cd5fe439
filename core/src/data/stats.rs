//! Whole-data statistics, computed by a distributed two-phase aggregate: each executor
//! summarizes its own partitions ([`DataStats`], the partial), the driver merges the partials,
//! and the result ([`Preprocessing`]) travels to every rank and is saved with the model.
//!
//! Feature moments use Chan et al.'s pairwise update, so partials merge exactly in any order
//! and stay accurate over billions of rows (no sum-of-squares cancellation).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::data::vocab::{MAX_DISTINCT_TOKENS, TokenCounts, VocabError, Vocabulary};
use crate::spec::VocabSpec;
use crate::wire::payload::Payload;

/// Most distinct string labels a classification job may have.
pub const MAX_CLASSES: usize = 100_000;

/// Count, mean and sum of squared deviations of every feature.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FeatureMoments {
    /// Rows seen.
    pub count: u64,
    /// Per-feature mean.
    pub mean: Vec<f64>,
    /// Per-feature sum of squared deviations from the mean.
    pub m2: Vec<f64>,
}

impl FeatureMoments {
    /// Adds `rows` rows of `width` features (row-major).
    pub fn add_rows(&mut self, features: &[f32], width: usize) {
        if width == 0 || features.is_empty() {
            return;
        }
        let rows = features.len() / width;
        // Summarize the chunk on its own, then merge: two passes over cache-hot data.
        let mut chunk = FeatureMoments {
            count: rows as u64,
            mean: vec![0.0; width],
            m2: vec![0.0; width],
        };
        for row in features.chunks_exact(width) {
            for (m, &v) in chunk.mean.iter_mut().zip(row) {
                *m += v as f64;
            }
        }
        chunk.mean.iter_mut().for_each(|m| *m /= rows as f64);
        for row in features.chunks_exact(width) {
            for ((s, &m), &v) in chunk.m2.iter_mut().zip(&chunk.mean).zip(row) {
                let d = v as f64 - m;
                *s += d * d;
            }
        }
        self.merge(&chunk);
    }

    /// Merges another partial into this one.
    pub fn merge(&mut self, other: &FeatureMoments) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = other.clone();
            return;
        }
        let (n_a, n_b) = (self.count as f64, other.count as f64);
        let n = n_a + n_b;
        for i in 0..self.mean.len().min(other.mean.len()) {
            let delta = other.mean[i] - self.mean[i];
            self.mean[i] += delta * n_b / n;
            self.m2[i] += other.m2[i] + delta * delta * n_a * n_b / n;
        }
        self.count += other.count;
    }

    /// Per-feature population standard deviation; a constant feature gets 1 (so that
    /// normalizing leaves it at 0 instead of dividing by zero).
    pub fn std(&self) -> Vec<f64> {
        self.m2
            .iter()
            .map(|&m2| {
                let s = (m2 / self.count.max(1) as f64).sqrt();
                if s > 1e-12 { s } else { 1.0 }
            })
            .collect()
    }
}

/// One executor's partial statistics over its partitions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DataStats {
    /// Feature moments (when `normalize = "standard"`).
    pub moments: Option<FeatureMoments>,
    /// Distinct string labels seen (when the label column holds strings and no
    /// `label_classes` were given; for a list label, the distinct elements).
    pub labels: Option<BTreeSet<String>>,
    /// How often each token of a string sequence column occurs (for its vocabulary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenCounts>,
}

impl Payload for DataStats {
    const WHAT: &'static str = "statistics partial";
}

impl DataStats {
    /// Merges another executor's partial into this one; an error once the tokens counted
    /// together pass [`MAX_DISTINCT_TOKENS`].
    pub fn merge(&mut self, other: DataStats) -> Result<(), VocabError> {
        if let Some(m) = other.moments {
            self.moments.get_or_insert_with(Default::default).merge(&m);
        }
        if let Some(l) = other.labels {
            self.labels.get_or_insert_with(Default::default).extend(l);
        }
        if let Some(t) = other.tokens {
            let mine = self.tokens.get_or_insert_with(Default::default);
            mine.merge(t, MAX_DISTINCT_TOKENS)?;
        }
        Ok(())
    }
}

/// Feature normalization: `(x − mean) / std`, per feature, after `scale`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Normalization {
    /// Per-feature mean over the training split.
    pub mean: Vec<f32>,
    /// Per-feature standard deviation over the training split.
    pub std: Vec<f32>,
}

/// What the training data's statistics decided, applied identically in training, evaluation
/// and prediction, and saved with the model (`extra.preprocessing` in `checkpoint.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Preprocessing {
    /// Standardization of the features, when `normalize = "standard"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<Normalization>,
    /// Class names of a string label, in class-index order (sorted, or as `label_classes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<Vec<String>>,
    /// Token ids of a string sequence column, as `data.vocab` chose them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocabulary: Option<Vocabulary>,
    /// The first id of the vocabulary's tokens that the training split holds only once: ids
    /// from it to the end (the vocabulary is ordered by count). Training replaces each of them
    /// by `<unk>` with probability `data.vocab.singleton_unk`. `None`: no such token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub singletons_from: Option<u32>,
}

impl Payload for Preprocessing {
    const WHAT: &'static str = "preprocessing";
}

impl Preprocessing {
    /// Decides the preprocessing from merged statistics (`given_classes` are `label_classes`;
    /// `vocab` chooses the tokens that get ids).
    pub fn from_stats(
        stats: &DataStats,
        given_classes: Option<&[String]>,
        vocab: &VocabSpec,
    ) -> Preprocessing {
        let normalize = stats.moments.as_ref().map(|m| Normalization {
            mean: m.mean.iter().map(|&v| v as f32).collect(),
            std: m.std().iter().map(|&v| v as f32).collect(),
        });
        let classes = match given_classes {
            Some(c) => Some(c.to_vec()),
            None => stats.labels.as_ref().map(|l| l.iter().cloned().collect()),
        };
        let vocabulary = stats
            .tokens
            .as_ref()
            .map(|t| Vocabulary::build(t, vocab.max_size, vocab.min_count));
        let singletons_from = match (&vocabulary, &stats.tokens) {
            (Some(v), Some(counts)) => v.first_with_count(counts, 1),
            _ => None,
        };
        Preprocessing {
            normalize,
            classes,
            vocabulary,
            singletons_from,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::payload;

    fn exact(rows: &[[f32; 2]]) -> (Vec<f64>, Vec<f64>) {
        let n = rows.len() as f64;
        let mean: Vec<f64> = (0..2)
            .map(|j| rows.iter().map(|r| r[j] as f64).sum::<f64>() / n)
            .collect();
        let var: Vec<f64> = (0..2)
            .map(|j| {
                rows.iter()
                    .map(|r| (r[j] as f64 - mean[j]).powi(2))
                    .sum::<f64>()
                    / n
            })
            .collect();
        (mean, var.iter().map(|v| v.sqrt()).collect())
    }

    #[test]
    fn partials_merge_to_the_whole_data_moments() {
        let rows: Vec<[f32; 2]> = (0..101)
            .map(|i| [i as f32 * 0.5 + 1e4, (i % 7) as f32])
            .collect();
        let flat = |r: &[[f32; 2]]| r.iter().flatten().copied().collect::<Vec<f32>>();
        let mut parts = Vec::new();
        for chunk in [&rows[..10], &rows[10..11], &rows[11..60], &rows[60..]] {
            let mut m = FeatureMoments::default();
            m.add_rows(&flat(chunk), 2);
            parts.push(DataStats {
                moments: Some(m),
                ..DataStats::default()
            });
        }
        let mut merged = DataStats::default();
        for p in parts.into_iter().rev() {
            merged.merge(p).unwrap();
        }
        let m = merged.moments.unwrap();
        let (mean, std) = exact(&rows);
        assert_eq!(m.count, 101);
        for j in 0..2 {
            assert!(
                (m.mean[j] - mean[j]).abs() < 1e-9,
                "{} vs {}",
                m.mean[j],
                mean[j]
            );
            assert!(
                (m.std()[j] - std[j]).abs() < 1e-9,
                "{} vs {}",
                m.std()[j],
                std[j]
            );
        }
    }

    #[test]
    fn constant_features_keep_unit_std_and_labels_are_sorted() {
        let mut m = FeatureMoments::default();
        m.add_rows(&[3.0, 3.0, 3.0], 1);
        assert_eq!(m.std(), [1.0]);
        let mut a = DataStats {
            labels: Some(["virginica".into(), "setosa".into()].into()),
            ..DataStats::default()
        };
        a.merge(DataStats {
            labels: Some(["versicolor".into(), "setosa".into()].into()),
            ..DataStats::default()
        })
        .unwrap();
        let vocab = VocabSpec::default();
        let p = Preprocessing::from_stats(&a, None, &vocab);
        assert_eq!(p.classes.unwrap(), ["setosa", "versicolor", "virginica"]);
        assert!(p.vocabulary.is_none());
        let given = ["b".to_string(), "a".to_string()];
        assert_eq!(
            Preprocessing::from_stats(&a, Some(&given), &vocab)
                .classes
                .unwrap(),
            ["b", "a"]
        );
    }

    #[test]
    fn token_counts_merge_into_a_vocabulary_that_travels_as_json() {
        let partial = |tokens: &[&str]| {
            let mut t = TokenCounts::default();
            for tok in tokens {
                t.add(tok, MAX_DISTINCT_TOKENS).unwrap();
            }
            DataStats {
                tokens: Some(t),
                ..DataStats::default()
            }
        };
        let mut merged = partial(&["東京", "に", "行く"]);
        merged.merge(partial(&["東京", "へ", "東京"])).unwrap();
        let spec = VocabSpec {
            max_size: 4,
            min_count: 1,
            ..VocabSpec::default()
        };
        let p = Preprocessing::from_stats(&merged, None, &spec);
        let v = p.vocabulary.as_ref().unwrap();
        // 東京 (3) first, then the ties in text order: に before へ; 行く has no room.
        assert_eq!(v.tokens(), ["<pad>", "<unk>", "東京", "に"]);
        let back: Preprocessing = payload::decode("f", &payload::encode(&p)).unwrap();
        assert_eq!(back, p);
    }
}
