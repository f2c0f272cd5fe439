//! The summary of a finished job, printed by the CLI and written by `--summary-json`.

use std::fmt;
use std::io::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::progress::{EpochSummary, JobProgress};

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
    /// The JSON the driver sent is not a job's summary.
    #[error("the driver sent an unreadable summary")]
    Unreadable(#[source] serde_json::Error),
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
    /// Mean training loss of the last epoch.
    pub final_train_loss: Option<f64>,
    /// Test accuracy (classification).
    pub test_accuracy: Option<f64>,
    /// Test mean squared error (regression).
    pub test_mse: Option<f64>,
    /// Mean test loss.
    pub test_loss: Option<f64>,
    /// Rows evaluated.
    pub test_rows: Option<u64>,
    /// Where the model was saved.
    pub model_path: Option<String>,
    /// Whether every rank ended with bit-identical parameters (compared by checksum).
    pub replicas_identical: Option<bool>,
    /// Per-epoch figures of the epochs every rank of the ring reported.
    pub history: Vec<EpochSummary>,
    /// `"train"`, `"eval"` or `"predict"`.
    pub kind: String,
    /// Where executors read the data: `"direct"` or `"driver"` (Arrow Flight).
    pub data_source: Option<String>,
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
            train_samples_per_s: if train_seconds > 0.0 {
                samples as f64 / train_seconds
            } else {
                0.0
            },
            final_train_loss: progress.epochs().last().map(|e| e.loss),
            test_accuracy: eval
                .filter(|_| classification)
                .map(|e| e.correct as f64 / e.rows.max(1) as f64),
            test_mse: eval
                .filter(|_| !classification)
                .map(|e| e.squared_error / e.rows.max(1) as f64),
            test_loss: eval.map(|e| e.loss_sum / e.rows.max(1) as f64),
            test_rows: eval.map(|e| e.rows),
            model_path: outcomes
                .iter()
                .find(|o| !o.model_dir.is_empty())
                .map(|o| o.model_dir.clone()),
            replicas_identical: (!checksums.is_empty())
                .then(|| checksums.iter().all(|&c| c == checksums[0])),
            history: progress.epochs().to_vec(),
            kind: "train".into(),
            data_source: None,
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
        }
    }
}

impl JobSummary {
    /// The summary in `json`, as the driver sends it at the end of a job.
    pub fn from_json(json: &str) -> Result<JobSummary, SummaryError> {
        serde_json::from_str(json).map_err(SummaryError::Unreadable)
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
        if self.kind != "train" {
            if let (Some(acc), Some(rows)) = (self.test_accuracy, self.test_rows) {
                writeln!(
                    f,
                    "  accuracy {acc:.4}, loss {:.4} ({rows} rows)",
                    self.test_loss.unwrap_or(f64::NAN)
                )?;
            }
            if let (Some(mse), Some(rows)) = (self.test_mse, self.test_rows) {
                writeln!(
                    f,
                    "  mse {mse:.4}, loss {:.4} ({rows} rows)",
                    self.test_loss.unwrap_or(f64::NAN)
                )?;
            }
            if let (Some(out), Some(rows)) = (&self.output, self.rows_written) {
                writeln!(f, "  {rows} predictions written to {out}")?;
            }
            return Ok(());
        }
        writeln!(
            f,
            "  epochs {}, steps {}, samples {}, training {:.0} samples/s",
            self.epochs, self.steps, self.samples, self.train_samples_per_s
        )?;
        if let Some(loss) = self.final_train_loss {
            write!(f, "  final train loss {loss:.4}")?;
            if let (Some(acc), Some(rows)) = (self.test_accuracy, self.test_rows) {
                write!(f, ", test accuracy {acc:.4} ({rows} rows)")?;
            }
            if let (Some(mse), Some(rows)) = (self.test_mse, self.test_rows) {
                write!(f, ", test mse {mse:.4} ({rows} rows)")?;
            }
            writeln!(f)?;
        }
        if let Some(p) = &self.model_path {
            writeln!(f, "  model saved to {p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn the_json_file_reads_back_as_the_summary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new/dir/summary.json");
        sample().write_json(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\n  \"job\": \"j\","), "{text}");
        assert!(text.ends_with("}\n"), "{text}");
        let back = JobSummary::from_json(&text).unwrap();
        assert_eq!((back.job_id.as_str(), back.executors), ("j-1", 2));
    }

    #[test]
    fn errors_name_the_summary_or_the_path_at_fault() {
        let e = JobSummary::from_json("{\"job\": 3}").unwrap_err();
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
