//! A job's preparation before training ([`Prepare`]). This file owns:
//!
//! - the data source: each rank says whether it can read the data itself; once every rank has
//!   said, the job reads it directly, or from the driver over Arrow Flight when any cannot;
//! - the statistics of the training split: each rank's partial (moments, label classes),
//!   merged once every rank has sent its own into the one preprocessing every rank then uses,
//!   checked against the model and against the size a job's preprocessing may have
//!   ([`ringflow_core::wire::MAX_PREPROCESSING_BYTES`]).

use std::sync::Arc;
use std::time::Instant;

use ringflow_core::data::prepare::{PartitionSource, ReadCheck};
use ringflow_core::data::stats::MAX_CLASSES;
use ringflow_core::data::vocab::VocabError;
use ringflow_core::data::{DataStats, Preprocessing};
use ringflow_core::pb;
use ringflow_core::wire::MAX_PREPROCESSING_BYTES;
use ringflow_core::wire::payload::{self, Payload, PayloadError};

use super::Job;
use crate::error::JobError;

/// Partials of the two preparation phases, per rank, and their merged results.
#[derive(Debug, Default)]
pub(super) struct Prepare {
    source: Vec<Option<ReadCheck>>,
    source_merged: Option<PartitionSource>,
    stats: Vec<Option<DataStats>>,
    stats_merged: Option<Arc<str>>,
}

impl Prepare {
    /// Nothing heard yet from `ranks` ranks.
    pub fn for_ranks(ranks: usize) -> Prepare {
        Prepare {
            source: vec![None; ranks],
            stats: vec![None; ranks],
            ..Default::default()
        }
    }

    /// Where every rank reads its partitions from, once decided.
    pub fn source(&self) -> Option<PartitionSource> {
        self.source_merged
    }

    /// The merged preprocessing (a payload), once every rank sent its statistics.
    pub fn statistics(&self) -> Option<&Arc<str>> {
        self.stats_merged.as_ref()
    }

    /// Records what `rank` (which exists) says about reading the data. Once every rank has
    /// said, and the first time only, returns the ranks that cannot, with why.
    fn add_source(
        &mut self,
        rank: usize,
        partial: Option<ReadCheck>,
    ) -> Option<Vec<(usize, String)>> {
        if let Some(p) = partial {
            self.source[rank] = Some(p);
        }
        if self.source_merged.is_some() || !self.source.iter().all(Option::is_some) {
            return None;
        }
        let unreadable = self
            .source
            .iter()
            .enumerate()
            .filter_map(|(r, p)| {
                let why = p.as_ref()?.unreadable.clone()?;
                Some((r, why))
            })
            .collect();
        Some(unreadable)
    }

    /// Records the statistics of `rank` (which exists). Once every rank has sent its own, and
    /// the first time only, returns them merged.
    fn add_stats(
        &mut self,
        rank: usize,
        stats: Option<DataStats>,
    ) -> Result<Option<DataStats>, VocabError> {
        if let Some(s) = stats {
            self.stats[rank] = Some(s);
        }
        if self.stats_merged.is_some() || !self.stats.iter().all(Option::is_some) {
            return Ok(None);
        }
        let mut merged = DataStats::default();
        for s in self.stats.iter_mut() {
            merged.merge(s.take().unwrap_or_default())?;
        }
        Ok(Some(merged))
    }
}

impl Job {
    /// The merged statistics of the training split (the preprocessing every rank of a
    /// training job applies), once every rank sent its own.
    pub fn merged_statistics(&self) -> Option<Arc<str>> {
        self.prepare.statistics().cloned()
    }

    /// A rank's partial for a preparation phase (once, a payload), and the merged result (a
    /// payload) when every rank has sent its own.
    pub fn prepare(
        &mut self,
        rank: usize,
        phase: pb::PreparePhase,
        partial: Option<&str>,
        now: Instant,
    ) -> Result<Option<Arc<str>>, JobError> {
        if rank >= self.members.ranks().len() {
            return Err(JobError::NoSuchRank {
                job: self.id.clone(),
                rank,
            });
        }
        match phase {
            pb::PreparePhase::Source => {
                let check = self.partial::<ReadCheck>(rank, partial)?;
                if let Some(unreadable) = self.prepare.add_source(rank, check) {
                    self.choose_source(unreadable);
                }
                Ok(self
                    .prepare
                    .source_merged
                    .map(|s| payload::encode(&s).into()))
            }
            pb::PreparePhase::Stats => {
                let stats = self.partial::<DataStats>(rank, partial)?;
                let merged = self.prepare.add_stats(rank, stats).map_err(|e| {
                    JobError::UnreadableStatistics {
                        rank: self.members.describe_rank(rank),
                        reason: e.to_string(),
                    }
                })?;
                if let Some(merged) = merged {
                    match self.merge_stats(&merged) {
                        Ok(json) => self.prepare.stats_merged = Some(json.into()),
                        Err(e) => {
                            self.fail(e.clone(), now);
                            return Err(e);
                        }
                    }
                }
                Ok(self.prepare.stats_merged.clone())
            }
        }
    }

    /// `rank`'s partial read from its payload.
    fn partial<T: Payload>(&self, rank: usize, text: Option<&str>) -> Result<Option<T>, JobError> {
        let read = |text| payload::decode("PrepareRequest.partial", text);
        text.map(read)
            .transpose()
            .map_err(|source: PayloadError| JobError::UnreadablePartial {
                rank: self.members.describe_rank(rank),
                source,
            })
    }

    /// Decides how every rank reads the data, now that each has said whether it can: directly,
    /// or from the driver when any of them (`unreadable`: rank and why) cannot.
    fn choose_source(&mut self, unreadable: Vec<(usize, String)>) {
        let merged = if unreadable.is_empty() {
            self.message("every executor can read the data: reading it directly".into());
            PartitionSource::Direct
        } else {
            let why: Vec<String> = unreadable
                .iter()
                .map(|(r, p)| format!("{}: {p}", self.members.describe_rank(*r)))
                .collect();
            self.message(format!(
                "serving the data from the driver over Arrow Flight, because {}",
                why.join("; ")
            ));
            PartitionSource::Driver
        };
        self.prepare.source_merged = Some(merged);
    }

    /// The preprocessing of the merged statistics as a payload, checked against the model's outputs
    /// and the size a preprocessing may have; says what was learned in a message.
    fn merge_stats(&mut self, merged: &DataStats) -> Result<String, JobError> {
        let Some(plan) = self.plan() else {
            return Err(JobError::NotTraining);
        };
        let data = &plan.spec.data;
        let p = Preprocessing::from_stats(merged, data.label_classes.as_deref(), &data.vocab);
        let mut lines = Vec::new();
        if let Some(classes) = &p.classes {
            if classes.len() > MAX_CLASSES {
                return Err(JobError::TooManyClasses {
                    column: data.label.clone(),
                });
            }
            if classes.len() != plan.model.outputs {
                return Err(JobError::ClassCount {
                    column: data.label.clone(),
                    classes: classes.len(),
                    outputs: plan.model.outputs,
                });
            }
            lines.push(format!("{} label classes", classes.len()));
        }
        if let Some(m) = &merged.moments {
            lines.push(format!(
                "feature mean and standard deviation over {} rows",
                m.count
            ));
        }
        let json = payload::encode(&p);
        if json.len() as u64 > MAX_PREPROCESSING_BYTES {
            return Err(JobError::PreprocessingTooLarge {
                what: lines.join(", "),
                bytes: json.len() as u64,
            });
        }
        if !lines.is_empty() {
            self.message(format!("statistics of data.train: {}", lines.join(", ")));
        }
        Ok(json)
    }
}
