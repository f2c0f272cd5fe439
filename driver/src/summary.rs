//! The summary of a finished job, printed by the CLI and written by `--summary-json`.

use std::fmt;
use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use ringflow_core::wire::payload::{self, Payload};

use crate::figures::{self, Tokens};
use crate::progress::{EpochSummary, FusionSummary, JobProgress};

/// The message field that carries a job's summary, as errors name it.
pub const SUMMARY_FIELD: &str = "JobEvent.summary";

/// The summary of a benchmark job (`ringflow bench allreduce`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchSummary {
    /// The job id.
    pub job_id: String,
    /// `"succeeded"` or `"failed"`.
    pub status: String,
    /// Why it failed.
    pub error: Option<String>,
    /// Ranks in the ring.
    pub executors: usize,
    /// Floats per all-reduce.
    pub floats: u64,
    /// Seconds of each timed all-reduce on rank 0.
    pub seconds: Vec<f64>,
}

impl Payload for BenchSummary {
    const WHAT: &'static str = "benchmark summary";
}

/// How a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Every epoch ran and the model was saved.
    Succeeded,
    /// It stopped on an error.
    Failed,
    /// A user cancelled it.
    Cancelled,
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        })
    }
}

/// A summary that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    /// What the driver sent is not a job's summary.
    #[error("the driver sent an unreadable summary")]
    Unreadable(#[source] ringflow_core::wire::payload::PayloadError),
    /// The directory of `--summary-json PATH` cannot be created.
    #[error("--summary-json: cannot create {dir}")]
    CreateDir {
        /// The directory.
        dir: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file of `--summary-json PATH` cannot be written.
    #[error("--summary-json: cannot write {path}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Everything worth knowing about a finished job.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct JobSummary {
    /// The job's name.
    pub job: String,
    /// The driver's id for this run.
    pub job_id: String,
    /// How it ended.
    pub status: JobStatus,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// Executors that trained together.
    pub executors: usize,
    /// Epochs completed.
    pub epochs: u64,
    /// Optimizer steps per rank.
    pub steps: u64,
    /// Rows trained on, all ranks and epochs together.
    pub samples: u64,
    /// Rows whose gradients backup workers dropped (`cluster.backup_workers`), all ranks and
    /// epochs together.
    pub dropped_samples: u64,
    /// Wall time from submission to the end, in seconds.
    pub wall_s: f64,
    /// Training throughput: samples over the training loop's time (slowest rank), excluding
    /// setup and evaluation.
    pub train_samples_per_s: f64,
    /// Token sequences: the real tokens trained on, all ranks and finished epochs together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_tokens: Option<u64>,
    /// Token sequences: real tokens per second over the training loop's time (as
    /// `train_samples_per_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_tokens_per_s: Option<f64>,
    /// Token sequences: the share of padding in the batches of the whole run,
    /// `padding / (tokens + padding)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding_fraction: Option<f64>,
    /// Mean training loss of the last epoch.
    pub final_train_loss: Option<f64>,
    /// Test accuracy (classification).
    pub test_accuracy: Option<f64>,
    /// Test mean squared error (regression).
    pub test_mse: Option<f64>,
    /// Mean test loss.
    pub test_loss: Option<f64>,
    /// Rows evaluated (a tagger's real tokens).
    pub test_rows: Option<u64>,
    /// A tagger: the real tokens evaluated (its `test_rows`, over which `test_accuracy` is per
    /// token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_tokens: Option<u64>,
    /// String token sequences: the share of the test split's tokens outside the training
    /// split's vocabulary (they reach the model as `<unk>`), as the planner counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_unknown_token_rate: Option<f64>,
    /// An IOB2 tagger (`train.metrics` has "entity_f1"): entity-level F1 on the test split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_entity_f1: Option<f64>,
    /// Entity-level precision: entities found right over entities predicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_entity_precision: Option<f64>,
    /// Entity-level recall: entities found right over entities in the labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_entity_recall: Option<f64>,
    /// Where the model was saved.
    pub model_path: Option<String>,
    /// Whether every rank ended with bit-identical parameters (compared by checksum).
    pub replicas_identical: Option<bool>,
    /// Per-epoch figures of the epochs every rank of the ring reported.
    pub history: Vec<EpochSummary>,
    /// What the job did.
    pub kind: crate::work::JobWork,
    /// Where executors read the data: `"direct"` or `"driver"` (Arrow Flight).
    pub data_source: Option<String>,
    /// Training: how gradients travelled on the ring (`cluster.compression`: `"none"`,
    /// `"fp16"` or `"bf16"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// Training: the precision of matrix products (`train.matmul_precision`: `"f32"` or
    /// `"bf16"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul_precision: Option<String>,
    /// Training: whether CPU convolutions could run Winograd's algorithm (`train.winograd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub winograd: Option<bool>,
    /// Peak resident memory of each rank's executor process, in MiB.
    pub peak_rss_mib: Vec<f64>,
    /// Prediction: where the parts were written, and how many rows.
    pub output: Option<String>,
    /// Prediction: rows written.
    pub rows_written: Option<u64>,
    /// Times an elastic job re-formed its ring after losing executors.
    pub recoveries: u32,
    /// Executors lost during the job.
    pub executors_lost: usize,
    /// FNV-1a checksum of rank 0's final parameters (equal between runs that trained the same
    /// replicas bit for bit).
    pub param_checksum: Option<u64>,
    /// The model's values, trainable and not (buffers such as batch norm's running
    /// statistics), when its kind says.
    #[serde(default)]
    pub parameters: Option<u64>,
    /// The model's trainable values, when its kind says.
    #[serde(default)]
    pub trainable_parameters: Option<u64>,
    /// On a ring: the gradient buckets (`cluster.fusion`), and what `"auto"` tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fusion: Option<FusionSummary>,
}

/// How a job ended, for its [`JobSummary`].
#[derive(Clone, Debug)]
pub struct JobEnd<'a> {
    /// The job's name.
    pub job: &'a str,
    /// The job's id.
    pub job_id: &'a str,
    /// Executors it ran on (or needed).
    pub executors: usize,
    /// Seconds from submission to the end.
    pub wall_s: f64,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// Whether it was cancelled.
    pub cancelled: bool,
}

impl JobSummary {
    /// Builds the summary of a job that ended as `end` from its collected progress;
    /// `classification` says whether its test figure is an accuracy (else a mean squared
    /// error).
    pub fn new(end: JobEnd<'_>, classification: bool, progress: &JobProgress) -> JobSummary {
        let JobEnd {
            job,
            job_id,
            executors,
            wall_s,
            error,
            cancelled,
        } = end;
        let outcomes = progress.outcomes().unwrap_or_default();
        // Without every rank's outcome (a job that failed after training, e.g. while saving),
        // the finished epochs still tell what was trained.
        let (samples, steps, train_seconds) = if outcomes.is_empty() {
            let e = progress.epochs();
            (
                e.iter().map(|e| e.samples).sum(),
                e.iter().map(|e| e.steps).sum(),
                e.iter().map(|e| e.seconds).sum(),
            )
        } else {
            (
                outcomes.iter().map(|o| o.samples).sum(),
                outcomes.first().map(|o| o.steps).unwrap_or(0),
                outcomes.iter().map(|o| o.train_seconds).fold(0.0, f64::max),
            )
        };
        let eval = progress.evaluation();
        let status = match (&error, cancelled) {
            (_, true) => JobStatus::Cancelled,
            (Some(_), false) => JobStatus::Failed,
            (None, false) => JobStatus::Succeeded,
        };
        let checksums: Vec<u64> = outcomes.iter().map(|o| o.param_checksum).collect();
        let tokens = Tokens::new(
            progress.epochs().iter().map(|e| e.tokens).sum(),
            progress.epochs().iter().map(|e| e.padding).sum(),
        );
        let entities = eval.as_ref().and_then(figures::entities);
        let per_second = |n: u64| {
            if train_seconds > 0.0 {
                n as f64 / train_seconds
            } else {
                0.0
            }
        };
        JobSummary {
            job: job.to_string(),
            job_id: job_id.to_string(),
            status,
            error,
            executors,
            // The ranks' own count when they finished; `history` may lack epochs that a rank
            // lost since never reported (backup workers train on without a hung rank).
            epochs: outcomes
                .first()
                .map_or(progress.epochs().len() as u64, |o| o.epochs),
            steps,
            samples,
            dropped_samples: progress.epochs().iter().map(|e| e.dropped_samples).sum(),
            wall_s,
            train_samples_per_s: per_second(samples),
            train_tokens: tokens.map(|t| t.tokens),
            train_tokens_per_s: tokens.map(|t| per_second(t.tokens)),
            padding_fraction: tokens.map(|t| t.padding_fraction()),
            final_train_loss: progress.epochs().last().map(|e| e.loss),
            test_accuracy: eval
                .filter(|_| classification)
                .map(|e| e.correct as f64 / e.rows.max(1) as f64),
            test_mse: eval
                .filter(|_| !classification)
                .map(|e| e.squared_error / e.rows.max(1) as f64),
            test_loss: eval.map(|e| e.loss_sum / e.rows.max(1) as f64),
            test_rows: eval.map(|e| e.rows),
            test_tokens: eval.filter(|e| e.tokens).map(|e| e.rows),
            test_unknown_token_rate: None,
            test_entity_f1: entities.map(|c| c.f1()),
            test_entity_precision: entities.map(|c| c.precision()),
            test_entity_recall: entities.map(|c| c.recall()),
            model_path: outcomes
                .iter()
                .find(|o| !o.model_dir.is_empty())
                .map(|o| o.model_dir.clone()),
            replicas_identical: (!checksums.is_empty())
                .then(|| checksums.iter().all(|&c| c == checksums[0])),
            history: progress.epochs().to_vec(),
            kind: crate::work::JobWork::Train,
            data_source: None,
            compression: None,
            matmul_precision: None,
            winograd: None,
            peak_rss_mib: outcomes
                .iter()
                .map(|o| (o.peak_rss_bytes as f64 / (1 << 20) as f64 * 10.0).round() / 10.0)
                .collect(),
            output: None,
            rows_written: (!outcomes.is_empty())
                .then(|| outcomes.iter().map(|o| o.rows_written).sum()),
            param_checksum: checksums.first().copied(),
            recoveries: 0,
            executors_lost: 0,
            parameters: None,
            trainable_parameters: None,
            fusion: progress.fusion(),
        }
    }
}

impl Payload for JobSummary {
    const WHAT: &'static str = "job summary";
}

impl JobSummary {
    /// The summary in `text` (a payload), as the driver sends it at the end of a job.
    pub fn from_payload(text: &str) -> Result<JobSummary, SummaryError> {
        payload::decode(SUMMARY_FIELD, text).map_err(SummaryError::Unreadable)
    }

    /// Writes the summary to `path` as pretty JSON (what `--summary-json PATH` holds),
    /// creating its directory if needed.
    pub fn write_json(&self, path: &Path) -> Result<(), SummaryError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| SummaryError::CreateDir {
                dir: dir.display().to_string(),
                source,
            })?;
        }
        let write = || -> std::io::Result<()> {
            let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
            serde_json::to_writer_pretty(&mut w, self)?;
            w.write_all(b"\n")?;
            w.flush()
        };
        write().map_err(|source| SummaryError::Write {
            path: path.display().to_string(),
            source,
        })
    }
}

impl JobSummary {
    /// `accuracy 0.9000` or `token accuracy 0.9412`, `mse 1.5000`, and a tagger's
    /// `entity F1 0.7123 (precision 0.70, recall 0.72)`: the test figures there are.
    fn test_figures(&self) -> Vec<String> {
        let mut figures = Vec::new();
        if let Some(acc) = self.test_accuracy {
            let name = if self.test_tokens.is_some() {
                "token accuracy"
            } else {
                "accuracy"
            };
            figures.push(format!("{name} {acc:.4}"));
        }
        if let Some(mse) = self.test_mse {
            figures.push(format!("mse {mse:.4}"));
        }
        if let (Some(f1), Some(p), Some(r)) = (
            self.test_entity_f1,
            self.test_entity_precision,
            self.test_entity_recall,
        ) {
            figures.push(figures::entity_line(f1, p, r));
        }
        figures
    }

    /// `(1164 tokens)` for a tagger, `(50 rows)` otherwise.
    fn test_count(&self, rows: u64) -> String {
        format!("({})", figures::evaluated(rows, self.test_tokens.is_some()))
    }
}

impl fmt::Display for JobSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = if self.executors == 1 { "" } else { "s" };
        writeln!(
            f,
            "job {} {} in {:.1} s on {} executor{plural}",
            self.job, self.status, self.wall_s, self.executors
        )?;
        if let Some(e) = &self.error {
            writeln!(f, "  error: {e}")?;
        }
        let test = self.test_figures();
        if self.kind != crate::work::JobWork::Train {
            if let (false, Some(rows)) = (test.is_empty(), self.test_rows) {
                writeln!(
                    f,
                    "  {}, loss {:.4} {}",
                    test.join(", "),
                    self.test_loss.unwrap_or(f64::NAN),
                    self.test_count(rows)
                )?;
            }
            if let (Some(out), Some(rows)) = (&self.output, self.rows_written) {
                writeln!(f, "  {rows} predictions written to {out}")?;
            }
            return Ok(());
        }
        write!(
            f,
            "  epochs {}, steps {}, samples {}, training {:.0} samples/s",
            self.epochs, self.steps, self.samples, self.train_samples_per_s
        )?;
        if let (Some(rate), Some(padding)) = (self.train_tokens_per_s, self.padding_fraction) {
            write!(
                f,
                ", {rate:.0} tokens/s, padding {}",
                figures::percent(padding)
            )?;
        }
        writeln!(f)?;
        if let Some(loss) = self.final_train_loss {
            write!(f, "  final train loss {loss:.4}")?;
            if let (false, Some(rows)) = (test.is_empty(), self.test_rows) {
                write!(f, ", test {} {}", test.join(", "), self.test_count(rows))?;
            }
            writeln!(f)?;
        }
        if let Some(fusion) = self.fusion.as_ref().filter(|f| !f.trials.is_empty()) {
            writeln!(f, "  {fusion}")?;
        }
        if let Some(p) = &self.model_path {
            writeln!(f, "  model saved to {p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use ringflow_core::pb;

    use super::*;

    fn sample() -> JobSummary {
        let end = JobEnd {
            job: "j",
            job_id: "j-1",
            executors: 2,
            wall_s: 1.5,
            error: None,
            cancelled: false,
        };
        JobSummary::new(end, true, &JobProgress::new(2))
    }

    /// A summary of a job on 2 ranks that trained one epoch of 2 s on 100 rows each, then
    /// evaluated 50 rows each: `sequence` ranks report tokens and a tagger's entity counts.
    pub(crate) fn trained(sequence: bool) -> JobSummary {
        let mut p = JobProgress::new(2);
        for rank in 0..2 {
            let epoch = pb::EpochReport {
                steps: 4,
                samples: 100,
                loss: 0.5,
                seconds: 2.0,
                tokens: if sequence { 3000 } else { 0 },
                padding: if sequence { 100 + 200 * rank as u64 } else { 0 },
                ..Default::default()
            };
            p.epoch_done(rank, epoch);
            p.evaluated(
                rank,
                pb::EvalReport {
                    rows: if sequence { 600 } else { 50 },
                    correct: if sequence { 540 } else { 45 },
                    loss_sum: 10.0,
                    tokens: sequence,
                    entities: sequence.then_some(pb::EntityCounts {
                        correct: 7 * rank as u64,
                        predicted: 10,
                        gold: 10,
                    }),
                    ..Default::default()
                },
            );
        }
        let end = JobEnd {
            job: "j",
            job_id: "j-1",
            executors: 2,
            wall_s: 5.0,
            error: None,
            cancelled: false,
        };
        JobSummary::new(end, true, &p)
    }

    #[test]
    fn a_sequence_jobs_summary_has_its_token_and_entity_figures() {
        let s = trained(true);
        let json: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(json["train_tokens"], 6000);
        assert_eq!(json["train_tokens_per_s"], 3000.0, "6000 tokens in 2 s");
        assert_eq!(json["padding_fraction"], 0.0625, "400 of 6400 steps");
        assert_eq!(json["test_accuracy"], 0.9, "per token");
        assert_eq!(json["test_tokens"], 1200);
        assert_eq!(json["test_entity_precision"], 0.35);
        assert_eq!(json["test_entity_recall"], 0.35);
        assert!((json["test_entity_f1"].as_f64().unwrap() - 0.35).abs() < 1e-12);
        assert_eq!(json["history"][0]["tokens"], 6000);
        assert_eq!(json["history"][0]["padding"], 400);
        let back: JobSummary = serde_json::from_value(json).unwrap();
        assert_eq!(back.history[0].tokens_per_s(), Some(3000.0));
        let text = s.to_string();
        assert!(
            text.contains(
                "  epochs 1, steps 4, samples 200, training 100 samples/s, 3000 tokens/s, \
                 padding 6.2%\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "  final train loss 0.5000, test token accuracy 0.9000, entity F1 0.3500 \
                 (precision 0.35, recall 0.35) (1200 tokens)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn other_jobs_summaries_have_no_token_or_entity_fields() {
        let s = trained(false);
        let json = serde_json::to_string(&s).unwrap();
        for field in ["tokens", "padding", "entity"] {
            assert!(!json.contains(field), "{field} in {json}");
        }
        let text = s.to_string();
        assert!(
            text.contains("  epochs 1, steps 4, samples 200, training 100 samples/s\n"),
            "{text}"
        );
        assert!(
            text.contains("  final train loss 0.5000, test accuracy 0.9000 (100 rows)\n"),
            "{text}"
        );
    }

    #[test]
    fn the_json_file_reads_back_as_the_summary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/dir/summary.json");
        sample().write_json(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\n  \"job\": \"j\","), "{text}");
        assert!(text.ends_with("}\n"), "{text}");
        let back: JobSummary = serde_json::from_str(&text).unwrap();
        assert_eq!((back.job_id.as_str(), back.executors), ("j-1", 2));
    }

    #[test]
    fn errors_name_the_summary_or_the_path_at_fault() {
        let e = JobSummary::from_payload("{\"job\": 3}").unwrap_err();
        assert_eq!(e.to_string(), "the driver sent an unreadable summary");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = sample().write_json(&file.join("s.json")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("--summary-json: cannot create {}", file.display())
        );
        let e = sample().write_json(dir.path()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("--summary-json: cannot write {}", dir.path().display())
        );
    }
}
