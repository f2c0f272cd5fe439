//! Combining the ranks' reports into a job's progress and final summary.

use std::collections::BTreeMap;

use ringflow_core::pb::{self, EpochReport, EvalReport, TaskOutcome};
use ringflow_core::phases::PhaseTimes;
use serde::{Deserialize, Serialize};

use crate::figures::Tokens;

/// One epoch over all ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochSummary {
    /// 0-based epoch.
    pub epoch: u64,
    /// Steps every rank took.
    pub steps: u64,
    /// Rows trained on, all ranks together.
    pub samples: u64,
    /// Rows whose gradients backup workers dropped, all ranks together.
    #[serde(default)]
    pub dropped_samples: u64,
    /// Mean training loss (mean over ranks of each rank's mean).
    pub loss: f64,
    /// Wall time of the slowest rank.
    pub seconds: f64,
    /// `samples / seconds`.
    pub samples_per_s: f64,
    /// Mean over ranks of the time per phase, in seconds.
    pub phases: PhaseTimes,
    /// Token sequences: the real tokens of the rows trained, all ranks together (0 otherwise).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens: u64,
    /// Token sequences: the padding steps the batches held, all ranks together.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub padding: u64,
}

impl EpochSummary {
    /// The epoch's real tokens and padding; `None` for a job that is not a sequence.
    pub fn tokens(&self) -> Option<Tokens> {
        Tokens::new(self.tokens, self.padding)
    }

    /// Real tokens per second of a sequence job (`tokens / seconds`).
    pub fn tokens_per_s(&self) -> Option<f64> {
        self.tokens().map(|t| t.per_second(self.seconds))
    }

    /// The share of padding in a sequence job's batches: `padding / (tokens + padding)`.
    pub fn padding_fraction(&self) -> Option<f64> {
        self.tokens().map(|t| t.padding_fraction())
    }
}

/// The gradient buckets of a job on a ring (`cluster.fusion`), in its summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FusionSummary {
    /// The buckets' size limit, in MiB.
    pub bucket_mib: f64,
    /// The first bucket's limit, in MiB.
    pub first_bucket_mib: f64,
    /// False while `cluster.fusion = "auto"` was still trying sizes (a short job).
    pub tuned: bool,
    /// The sizes `"auto"` tried, with their time per step (empty for a fixed size).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trials: Vec<FusionTrial>,
}

/// One bucket size `cluster.fusion = "auto"` tried.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FusionTrial {
    /// The size tried, in MiB.
    pub bucket_mib: f64,
    /// Its median time per step of backward and gradient exchange (mean over the ranks), in
    /// milliseconds.
    pub step_ms: f64,
}

impl std::fmt::Display for FusionSummary {
    /// `fusion autotune kept 4 MiB buckets (1 MiB 30.1 ms, 4 MiB 21.0 ms, 16 MiB 24.9 ms per step)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tried: Vec<String> = self
            .trials
            .iter()
            .map(|t| format!("{} MiB {:.1} ms", t.bucket_mib, t.step_ms))
            .collect();
        let verb = if self.tuned { "kept" } else { "was trying" };
        write!(
            f,
            "fusion autotune {verb} {} MiB buckets ({} per step)",
            self.bucket_mib,
            tried.join(", ")
        )
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

impl From<&pb::FusionReport> for FusionSummary {
    fn from(f: &pb::FusionReport) -> Self {
        FusionSummary {
            bucket_mib: mib(f.bucket_bytes),
            first_bucket_mib: mib(f.first_bucket_bytes),
            tuned: f.tuned,
            trials: f
                .trials
                .iter()
                .map(|t| FusionTrial {
                    bucket_mib: mib(t.bucket_bytes),
                    step_ms: 1000.0 * t.step_seconds,
                })
                .collect(),
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Collects per-rank reports of one job.
#[derive(Debug)]
pub struct JobProgress {
    world: usize,
    epochs: BTreeMap<u64, Vec<Option<EpochReport>>>,
    eval: Vec<Option<EvalReport>>,
    /// Evaluations after epochs while training goes on, by epoch: each rank's share.
    epoch_evals: BTreeMap<u64, Vec<Option<EvalReport>>>,
    /// Those evaluations once every rank reported its share, added up, by epoch.
    epoch_tests: BTreeMap<u64, EvalReport>,
    outcomes: Vec<Option<TaskOutcome>>,
    finished_epochs: Vec<EpochSummary>,
    /// Each rank's phase times in the latest epoch it reported.
    last_phases: Vec<Option<pb::PhaseTimes>>,
    /// Rank 0's gradient buckets in the latest epoch it reported.
    fusion: Option<pb::FusionReport>,
}

impl JobProgress {
    /// The phase times `rank` reported for the latest epoch it finished.
    pub fn latest_phases(&self, rank: usize) -> Option<pb::PhaseTimes> {
        self.last_phases.get(rank).copied().flatten()
    }

    /// Progress of a job on `world` ranks.
    pub fn new(world: usize) -> Self {
        JobProgress {
            world,
            epochs: BTreeMap::new(),
            eval: vec![None; world],
            epoch_evals: BTreeMap::new(),
            epoch_tests: BTreeMap::new(),
            outcomes: vec![None; world],
            finished_epochs: Vec::new(),
            last_phases: vec![None; world],
            fusion: None,
        }
    }

    /// Continues on a re-formed ring of `world` ranks: reports of epochs that no longer finish
    /// on every rank are dropped (the epoch restarts), finished epochs stay.
    pub fn regroup(&mut self, world: usize) {
        self.world = world;
        self.epochs.clear();
        self.eval = vec![None; world];
        self.epoch_evals.clear();
        self.outcomes = vec![None; world];
        self.last_phases = vec![None; world];
    }

    /// Records a rank's epoch; returns the epoch's summary once every rank has reported it.
    pub fn epoch_done(&mut self, rank: usize, report: EpochReport) -> Option<EpochSummary> {
        let epoch = report.epoch;
        if rank == 0 && report.fusion.is_some() {
            self.fusion.clone_from(&report.fusion);
        }
        if let Some(slot) = self.last_phases.get_mut(rank) {
            *slot = report.phases;
        }
        let slots = self
            .epochs
            .entry(epoch)
            .or_insert_with(|| vec![None; self.world]);
        slots[rank] = Some(report);
        if slots.iter().any(Option::is_none) {
            return None;
        }
        let reports: Vec<EpochReport> = self.epochs.remove(&epoch)?.into_iter().flatten().collect();
        let n = reports.len() as f64;
        let samples = reports.iter().map(|r| r.samples).sum();
        let seconds = reports.iter().map(|r| r.seconds).fold(0.0, f64::max);
        let mut phases = PhaseTimes::default();
        for r in &reports {
            phases += PhaseTimes::from(r.phases.unwrap_or_default()).map(|x| x / n);
        }
        let summary = EpochSummary {
            epoch,
            steps: reports[0].steps,
            samples,
            dropped_samples: reports.iter().map(|r| r.dropped_samples).sum(),
            loss: reports.iter().map(|r| r.loss).sum::<f64>() / n,
            seconds,
            samples_per_s: samples as f64 / seconds.max(1e-9),
            phases,
            tokens: reports.iter().map(|r| r.tokens).sum(),
            padding: reports.iter().map(|r| r.padding).sum(),
        };
        // An epoch run again after a recovery (the ring went back to its start) replaces the
        // record of its earlier run.
        self.finished_epochs.retain(|e| e.epoch < epoch);
        self.finished_epochs.push(summary.clone());
        Some(summary)
    }

    /// The gradient buckets rank 0 reported last (a job on a ring).
    pub fn fusion(&self) -> Option<FusionSummary> {
        self.fusion.as_ref().map(FusionSummary::from)
    }

    /// Records a rank's evaluation.
    pub fn evaluated(&mut self, rank: usize, report: EvalReport) {
        self.eval[rank] = Some(report);
    }

    /// Records a rank's evaluation after `epoch` while training goes on; returns every rank's
    /// shares together once all have reported it.
    pub fn epoch_evaluated(
        &mut self,
        rank: usize,
        epoch: u64,
        report: EvalReport,
    ) -> Option<EvalReport> {
        let slots = self
            .epoch_evals
            .entry(epoch)
            .or_insert_with(|| vec![None; self.world]);
        *slots.get_mut(rank)? = Some(report);
        if slots.iter().any(Option::is_none) {
            return None;
        }
        let shares = self.epoch_evals.remove(&epoch)?;
        let sum = total(shares.iter().flatten());
        self.epoch_tests.insert(epoch, sum);
        Some(sum)
    }

    /// The evaluations after epochs while training went on, every rank's shares added up, by
    /// 0-based epoch.
    pub fn epoch_tests(&self) -> &BTreeMap<u64, EvalReport> {
        &self.epoch_tests
    }

    /// Records a rank's outcome.
    pub fn outcome(&mut self, rank: usize, outcome: TaskOutcome) {
        self.outcomes[rank] = Some(outcome);
    }

    /// The finished epochs so far.
    pub fn epochs(&self) -> &[EpochSummary] {
        &self.finished_epochs
    }

    /// The test split's evaluation, once every rank has reported it.
    pub fn evaluation(&self) -> Option<EvalReport> {
        if self.eval.iter().any(Option::is_none) {
            return None;
        }
        Some(total(self.eval.iter().flatten()))
    }

    /// The ranks' outcomes, once all have finished.
    pub fn outcomes(&self) -> Option<Vec<&TaskOutcome>> {
        self.outcomes.iter().map(Option::as_ref).collect()
    }
}

/// The ranks' evaluation shares added up: counts and sums add, a tagger's shares count tokens,
/// and entity counts add where any rank counted them.
fn total<'a>(shares: impl Iterator<Item = &'a EvalReport>) -> EvalReport {
    let mut sum = EvalReport::default();
    for r in shares {
        sum.rows += r.rows;
        sum.loss_sum += r.loss_sum;
        sum.correct += r.correct;
        sum.squared_error += r.squared_error;
        sum.tokens |= r.tokens;
        if let Some(c) = r.entities {
            let s = sum.entities.get_or_insert_default();
            s.correct += c.correct;
            s.predicted += c.predicted;
            s.gold += c.gold;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(epoch: u64, samples: u64) -> EpochReport {
        EpochReport {
            epoch,
            steps: 1,
            samples,
            loss: 0.5,
            seconds: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn an_epoch_run_again_after_a_recovery_replaces_its_record() {
        let mut p = JobProgress::new(2);
        assert!(p.epoch_done(0, report(0, 10)).is_none());
        assert!(p.epoch_done(1, report(0, 10)).is_some());
        // The ring breaks at the barrier after epoch 0 and goes back to its start.
        p.regroup(2);
        p.epoch_done(0, report(0, 12));
        p.epoch_done(1, report(0, 8));
        p.epoch_done(0, report(1, 10));
        p.epoch_done(1, report(1, 10));
        let done: Vec<(u64, u64)> = p.epochs().iter().map(|e| (e.epoch, e.samples)).collect();
        assert_eq!(done, [(0, 20), (1, 20)]);
    }

    #[test]
    fn epochs_add_the_ranks_tokens_and_padding() {
        let mut p = JobProgress::new(2);
        let seq = |tokens, padding| EpochReport {
            tokens,
            padding,
            seconds: 2.0,
            ..report(0, 10)
        };
        p.epoch_done(0, seq(300, 20));
        let e = p.epoch_done(1, seq(500, 180)).unwrap();
        assert_eq!((e.tokens, e.padding), (800, 200));
        assert_eq!(e.tokens_per_s(), Some(400.0));
        assert_eq!(e.padding_fraction(), Some(0.2));
        // Not a sequence job: no token figures, and none in its JSON.
        let mut p = JobProgress::new(1);
        let e = p.epoch_done(0, report(0, 10)).unwrap();
        assert_eq!((e.tokens_per_s(), e.padding_fraction()), (None, None));
        let json = serde_json::to_string(&e).unwrap();
        assert!(
            !json.contains("tokens") && !json.contains("padding"),
            "{json}"
        );
    }

    #[test]
    fn the_fusion_figures_are_rank_zeros_latest() {
        let fused = |bucket_mib: u64, trials: &[(u64, f64)]| EpochReport {
            fusion: Some(pb::FusionReport {
                first_bucket_bytes: 1 << 20,
                bucket_bytes: bucket_mib << 20,
                tuned: !trials.is_empty(),
                trials: trials
                    .iter()
                    .map(|&(mib, s)| pb::FusionTrial {
                        bucket_bytes: mib << 20,
                        step_seconds: s,
                    })
                    .collect(),
            }),
            ..report(0, 10)
        };
        let mut p = JobProgress::new(2);
        assert_eq!(p.fusion(), None);
        p.epoch_done(0, fused(1, &[]));
        p.epoch_done(1, fused(64, &[]));
        assert_eq!(p.fusion().unwrap().bucket_mib, 1.0);
        p.epoch_done(1, report(1, 10));
        p.epoch_done(0, fused(4, &[(1, 0.0301), (4, 0.021), (16, 0.0249)]));
        let f = p.fusion().unwrap();
        assert_eq!(
            (f.bucket_mib, f.first_bucket_mib, f.tuned),
            (4.0, 1.0, true)
        );
        assert_eq!(
            f.to_string(),
            "fusion autotune kept 4 MiB buckets (1 MiB 30.1 ms, 4 MiB 21.0 ms, 16 MiB 24.9 ms \
             per step)"
        );
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["trials"][1]["bucket_mib"], 4.0);
        assert_eq!(json["trials"][1]["step_ms"], 21.0);
    }

    #[test]
    fn evaluations_add_the_ranks_entity_counts() {
        let share = |correct, predicted, gold| EvalReport {
            rows: 100,
            correct: 90,
            tokens: true,
            entities: Some(pb::EntityCounts {
                correct,
                predicted,
                gold,
            }),
            ..Default::default()
        };
        let mut p = JobProgress::new(3);
        p.evaluated(0, share(7, 10, 9));
        p.evaluated(1, share(3, 5, 6));
        assert_eq!(p.evaluation(), None, "rank 2 has not reported");
        // A rank whose share held no sentence with entities (no counts) adds nothing.
        p.evaluated(
            2,
            EvalReport {
                rows: 4,
                tokens: true,
                ..Default::default()
            },
        );
        let e = p.evaluation().unwrap();
        assert_eq!((e.rows, e.correct, e.tokens), (204, 180, true));
        assert_eq!(
            e.entities,
            Some(pb::EntityCounts {
                correct: 10,
                predicted: 15,
                gold: 15,
            })
        );
        // Rows of a job that is not a tagger: no tokens, no entities.
        let mut p = JobProgress::new(2);
        for rank in 0..2 {
            let rows = EvalReport {
                rows: 50,
                ..Default::default()
            };
            assert!(p.epoch_evaluated(rank, 0, rows).is_none() == (rank == 0));
        }
        let e = p.epoch_tests()[&0];
        assert_eq!((e.rows, e.tokens, e.entities), (100, false, None));
    }
}
