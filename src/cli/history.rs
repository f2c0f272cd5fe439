//! `ringflow history DIR`: what happened to the jobs of a checkpoint directory, from their event
//! log (`DIR/events.jsonl`, see [`ringflow_driver::events`]), in one command, like Spark's
//! history server.
//!
//! For each job in the log (a resumed job adds a run to the same log) it prints the job's id,
//! name and state, when it was submitted and finished, its executors (and those lost or joined),
//! one line per epoch (loss, rows, samples/s, seconds and where the steps' time went),
//! checkpoints, recoveries, the test figures and the error of a failed job. `--json` prints the
//! same as one JSON object.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;

use clap::Args;
use ringflow_driver::events::{self, Event, RankInfo, Record, ResumedFrom};
use ringflow_driver::planner::memory::MemoryEstimate;
use ringflow_driver::progress::PhaseSeconds;
use serde::Serialize;
use serde_json::Value;

#[derive(Args)]
pub struct HistoryArgs {
    /// The job's checkpoint directory (`cluster.checkpoint_dir`, default `runs/<name>`; a local
    /// path or an object-store URL), or its `events.jsonl`.
    dir: String,

    /// Print the history as one JSON object instead.
    #[arg(long)]
    json: bool,

    /// Only this job (a checkpoint directory holds every run of a resumed job).
    #[arg(long, value_name = "JOB_ID")]
    job: Option<String>,
}

/// Everything the event log says about a checkpoint directory.
#[derive(Debug, Serialize)]
pub struct History {
    /// The log that was read.
    pub events_file: String,
    /// Its jobs, in the order they were submitted.
    pub jobs: Vec<JobHistory>,
}

/// One job, from its events.
#[derive(Debug, Default, Serialize)]
pub struct JobHistory {
    pub job_id: String,
    pub name: String,
    /// `"train"`, `"eval"` or `"predict"`.
    pub kind: String,
    /// `"succeeded"`, `"failed"`, `"cancelled"`, or `"unfinished"` when the log has no end
    /// (the job runs, or its driver stopped).
    pub state: String,
    pub error: Option<String>,
    pub submitted_at: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// Seconds from submission to the end (or to the last event of an unfinished job).
    pub duration_s: f64,
    /// Epochs, steps per epoch, rows, batch size, model and device, as submitted.
    pub plan: Plan,
    /// The executors it started on, by rank.
    pub executors: Vec<RankInfo>,
    /// Executors that registered with the driver while the job waited or ran.
    pub registered: Vec<Registered>,
    pub lost: Vec<Lost>,
    pub epochs: Vec<EpochRow>,
    pub checkpoints: Vec<Checkpoint>,
    pub recoveries: Vec<Recovery>,
    pub test: Option<Test>,
    /// Where the model was saved.
    pub model_path: Option<String>,
    /// The job's final summary (as `--summary-json` writes it).
    pub summary: Option<Value>,
}

/// The job as submitted.
#[derive(Debug, Default, Serialize)]
pub struct Plan {
    pub executors: usize,
    pub epochs: Option<u64>,
    pub steps_per_epoch: Option<u64>,
    pub rows: Option<u64>,
    pub batch_size: Option<usize>,
    pub model: Option<String>,
    pub device: Option<String>,
    pub resumed_from: Option<ResumedFrom>,
    /// What one executor needed, as estimated at submission.
    pub memory: Option<MemoryEstimate>,
}

#[derive(Debug, Serialize)]
pub struct Registered {
    pub executor_id: String,
    pub host: String,
    pub at: String,
}

#[derive(Debug, Serialize)]
pub struct Lost {
    pub rank: usize,
    pub executor_id: String,
    pub host: String,
    pub reason: String,
    pub at: String,
}

/// One epoch over all ranks.
#[derive(Debug, Serialize)]
pub struct EpochRow {
    /// 0-based, as in summaries.
    pub epoch: u64,
    pub steps: u64,
    pub loss: f64,
    pub samples: u64,
    pub dropped_samples: u64,
    pub seconds: f64,
    pub samples_per_s: f64,
    /// Mean over ranks of the seconds per step phase.
    pub phases: PhaseSeconds,
    /// The phases as percentages of the steps' time.
    pub phase_percent: PhaseSeconds,
    /// The test split's figures after this epoch (`train.eval_every_epochs`; the last epoch's
    /// are the job's `test`).
    pub test: Option<Test>,
}

#[derive(Debug, Serialize)]
pub struct Checkpoint {
    pub epochs_done: u64,
    pub step: u64,
    pub path: String,
    pub seconds: f64,
    pub at: String,
}

#[derive(Debug, Serialize)]
pub struct Recovery {
    pub generation: u32,
    pub world_before: usize,
    pub world_after: usize,
    pub lost: Vec<String>,
    pub joined: Vec<String>,
    pub waited_s: f64,
    pub cause: String,
    pub at: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Test {
    pub rows: u64,
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub mse: Option<f64>,
}

fn percent(p: &PhaseSeconds) -> PhaseSeconds {
    let total = p.data + p.forward + p.backward + p.allreduce + p.optimizer;
    if total <= 0.0 {
        return PhaseSeconds::default();
    }
    let pct = |x: f64| (1000.0 * x / total).round() / 10.0;
    PhaseSeconds {
        data: pct(p.data),
        forward: pct(p.forward),
        backward: pct(p.backward),
        allreduce: pct(p.allreduce),
        optimizer: pct(p.optimizer),
    }
}

impl History {
    /// The jobs of `records`, in the order they were submitted. Each driver numbers its jobs
    /// from 1, so a job resumed under a new driver may reuse an id: a `submitted` event always
    /// starts a new job.
    pub fn from_records(events_file: String, records: Vec<Record>) -> History {
        let mut jobs: Vec<JobHistory> = Vec::new();
        // The latest job of each id.
        let mut current: BTreeMap<String, usize> = BTreeMap::new();
        for r in records {
            let fresh = matches!(r.event, Event::Submitted { .. });
            let index = match current.get(&r.job_id) {
                Some(&i) if !fresh => i,
                _ => {
                    jobs.push(JobHistory {
                        job_id: r.job_id.clone(),
                        state: "unfinished".into(),
                        ..Default::default()
                    });
                    current.insert(r.job_id.clone(), jobs.len() - 1);
                    jobs.len() - 1
                }
            };
            let job = &mut jobs[index];
            job.duration_s = job.duration_s.max(r.elapsed_s);
            let at = r.at.clone();
            match r.event {
                Event::Submitted {
                    name,
                    kind,
                    executors,
                    epochs,
                    steps_per_epoch,
                    rows,
                    batch_size,
                    model,
                    device,
                    resumed_from,
                    memory,
                } => {
                    job.name = name;
                    job.kind = kind;
                    job.submitted_at = Some(at);
                    job.plan = Plan {
                        executors,
                        epochs,
                        steps_per_epoch,
                        rows,
                        batch_size,
                        model,
                        device,
                        resumed_from,
                        memory,
                    };
                }
                Event::Started { ranks } => {
                    job.started_at = Some(at);
                    job.executors = ranks;
                }
                Event::ExecutorRegistered { executor_id, host } => {
                    job.registered.push(Registered {
                        executor_id,
                        host,
                        at,
                    });
                }
                Event::ExecutorLost {
                    rank,
                    executor_id,
                    host,
                    reason,
                } => job.lost.push(Lost {
                    rank,
                    executor_id,
                    host,
                    reason,
                    at,
                }),
                Event::EpochEnd {
                    epoch,
                    steps,
                    loss,
                    samples,
                    dropped_samples,
                    seconds,
                    samples_per_s,
                    phases,
                } => {
                    // An epoch run again after a recovery replaces its earlier run's record.
                    job.epochs.retain(|e| e.epoch < epoch);
                    job.epochs.push(EpochRow {
                        epoch,
                        steps,
                        loss,
                        samples,
                        dropped_samples,
                        seconds,
                        samples_per_s,
                        phases,
                        phase_percent: percent(&phases),
                        test: None,
                    })
                }
                Event::Checkpoint {
                    epochs_done,
                    step,
                    path,
                    seconds,
                } => job.checkpoints.push(Checkpoint {
                    epochs_done,
                    step,
                    path,
                    seconds,
                    at,
                }),
                Event::Recovery {
                    generation,
                    world_before,
                    world_after,
                    lost,
                    joined,
                    waited_s,
                    cause,
                } => job.recoveries.push(Recovery {
                    generation,
                    world_before,
                    world_after,
                    lost,
                    joined,
                    waited_s,
                    cause,
                    at,
                }),
                Event::Evaluated {
                    epoch,
                    rows,
                    loss,
                    accuracy,
                    mse,
                } => {
                    let test = Test {
                        rows,
                        loss,
                        accuracy,
                        mse,
                    };
                    match epoch {
                        // The epoch's row is the latest of that epoch (one may be redone).
                        Some(epoch) => {
                            if let Some(row) =
                                job.epochs.iter_mut().rev().find(|r| r.epoch == epoch)
                            {
                                row.test = Some(test);
                            }
                        }
                        None => {
                            if let Some(row) = job.epochs.last_mut() {
                                row.test = Some(test.clone());
                            }
                            job.test = Some(test);
                        }
                    }
                }
                Event::Finished {
                    state,
                    error,
                    summary,
                } => {
                    job.state = state;
                    job.error = error;
                    job.finished_at = Some(at);
                    job.model_path = summary
                        .as_ref()
                        .and_then(|s| s.get("model_path"))
                        .and_then(Value::as_str)
                        .map(str::to_string);
                    job.summary = summary;
                }
                Event::Unknown => {}
            }
        }
        History { events_file, jobs }
    }
}

impl JobHistory {
    /// The job for people, ending with a newline.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let name = if self.name.is_empty() {
            String::new()
        } else if self.kind.is_empty() {
            format!(" ({})", self.name)
        } else {
            format!(" ({}, {})", self.name, self.kind)
        };
        let _ = writeln!(o, "job {}{name}: {}", self.job_id, self.state);
        let mut when = Vec::new();
        if let Some(s) = &self.submitted_at {
            when.push(format!("submitted {s}"));
        }
        match &self.finished_at {
            Some(f) => when.push(format!("finished {f} ({:.1} s)", self.duration_s)),
            None => when.push(format!(
                "last event {:.1} s after submission",
                self.duration_s
            )),
        }
        let _ = writeln!(o, "  {}", when.join(", "));
        let p = &self.plan;
        let mut plan = Vec::new();
        if let Some(e) = p.epochs {
            plan.push(format!("{e} epochs"));
        }
        if let Some(s) = p.steps_per_epoch {
            plan.push(format!("{s} steps per epoch"));
        }
        if let Some(r) = p.rows {
            plan.push(format!("{r} rows"));
        }
        if let Some(b) = p.batch_size {
            plan.push(format!("batch size {b}"));
        }
        if let Some(m) = &p.model {
            plan.push(format!("model {m}"));
        }
        if let Some(d) = &p.device {
            plan.push(format!("on {d}"));
        }
        if let Some(r) = p.resumed_from {
            plan.push(format!(
                "resumed after epoch {} (step {})",
                r.epochs_done, r.step
            ));
        }
        if !plan.is_empty() {
            let _ = writeln!(o, "  plan: {}", plan.join(", "));
        }
        if let Some(m) = &p.memory {
            let _ = writeln!(o, "  memory: {}", m.summary());
        }
        if self.executors.is_empty() {
            let _ = writeln!(o, "  executors: never started ({} needed)", p.executors);
        } else {
            let ranks: Vec<String> = self
                .executors
                .iter()
                .map(|e| format!("rank {} {} on {}", e.rank, e.executor_id, e.host))
                .collect();
            let _ = writeln!(
                o,
                "  executors ({}): {}",
                self.executors.len(),
                ranks.join(", ")
            );
        }
        let started = self.started_at.as_deref().unwrap_or("~");
        let late: Vec<String> = self
            .registered
            .iter()
            .filter(|r| r.at.as_str() > started)
            .map(|r| format!("{} on {} at {}", r.executor_id, r.host, r.at))
            .collect();
        if !late.is_empty() {
            let _ = writeln!(o, "  registered while running: {}", late.join(", "));
        }
        for l in &self.lost {
            let _ = writeln!(
                o,
                "  lost at {}: rank {} ({} on {}): {}",
                l.at, l.rank, l.executor_id, l.host, l.reason
            );
        }
        if !self.epochs.is_empty() {
            o.push_str(&self.epoch_table());
        }
        if let Some(last) = self.checkpoints.last() {
            let _ = writeln!(
                o,
                "  checkpoints: {}, the last after {} epochs (step {}) in {}",
                self.checkpoints.len(),
                last.epochs_done,
                last.step,
                last.path
            );
        }
        for r in &self.recoveries {
            let mut line = format!(
                "  recovery at {}: ring generation {}, {} -> {} executors",
                r.at, r.generation, r.world_before, r.world_after
            );
            if !r.lost.is_empty() {
                let _ = write!(line, ", without {}", r.lost.join(", "));
            }
            if !r.joined.is_empty() {
                let _ = write!(line, ", joined by {}", r.joined.join(", "));
            }
            if r.cause.is_empty() {
                line.push_str(" at an epoch boundary");
            } else {
                let _ = write!(line, ", {:.1} s after {}", r.waited_s, r.cause);
            }
            let _ = writeln!(o, "{line}");
        }
        if let Some(t) = &self.test {
            let mut figures = Vec::new();
            if let Some(a) = t.accuracy {
                figures.push(format!("accuracy {a:.4}"));
            }
            if let Some(m) = t.mse {
                figures.push(format!("mse {m:.4}"));
            }
            figures.push(format!("loss {:.4}", t.loss));
            let _ = writeln!(o, "  test: {} ({} rows)", figures.join(", "), t.rows);
        }
        if let Some(m) = &self.model_path {
            let _ = writeln!(o, "  model saved to {m}");
        }
        if let Some(e) = &self.error {
            let _ = writeln!(o, "  error: {e}");
        }
        o
    }

    fn epoch_table(&self) -> String {
        let total = self
            .plan
            .epochs
            .map(|e| format!("/{e}"))
            .unwrap_or_default();
        let header = [
            "epoch",
            "loss",
            "rows",
            "samples/s",
            "seconds",
            "data",
            "forward",
            "backward",
            "allreduce",
            "optimizer",
            "test",
        ];
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
        for e in &self.epochs {
            let p = &e.phase_percent;
            let mut samples = e.samples.to_string();
            if e.dropped_samples > 0 {
                let _ = write!(samples, " (-{})", e.dropped_samples);
            }
            rows.push(vec![
                format!("{}{total}", e.epoch + 1),
                format!("{:.4}", e.loss),
                samples,
                format!("{:.0}", e.samples_per_s),
                format!("{:.2}", e.seconds),
                format!("{:.0}%", p.data),
                format!("{:.0}%", p.forward),
                format!("{:.0}%", p.backward),
                format!("{:.0}%", p.allreduce),
                format!("{:.0}%", p.optimizer),
                match &e.test {
                    Some(Test {
                        accuracy: Some(a), ..
                    }) => format!("acc {a:.4}"),
                    Some(Test { mse: Some(m), .. }) => format!("mse {m:.4}"),
                    Some(t) => format!("loss {:.4}", t.loss),
                    None => "-".into(),
                },
            ]);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
            .collect();
        let mut o = String::new();
        for r in rows {
            let cells: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(c, v)| {
                    if c == 0 {
                        format!("{v:<w$}", w = widths[c])
                    } else {
                        format!("{v:>w$}", w = widths[c])
                    }
                })
                .collect();
            let _ = writeln!(o, "  {}", cells.join("  ").trim_end());
        }
        o
    }
}

pub fn run(args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let (path, records) = events::read(&args.dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut history = History::from_records(path, records);
    if let Some(id) = &args.job {
        history.jobs.retain(|j| &j.job_id == id);
        if history.jobs.is_empty() {
            anyhow::bail!("{} has no events of job {id}", history.events_file);
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&history)?);
    } else {
        let text: Vec<String> = history.jobs.iter().map(JobHistory::render).collect();
        print!("{}", text.join("\n"));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(job: &str, elapsed_s: f64, event: Event) -> Record {
        Record {
            job_id: job.into(),
            at: format!("2025-01-01T00:00:{:06.3}Z", elapsed_s),
            elapsed_s,
            event,
        }
    }

    fn epoch(e: u64) -> Event {
        Event::EpochEnd {
            epoch: e,
            steps: 10,
            loss: 1.0 / (e + 1) as f64,
            samples: 640,
            dropped_samples: 0,
            seconds: 2.0,
            samples_per_s: 320.0,
            phases: PhaseSeconds {
                data: 0.5,
                forward: 0.5,
                backward: 0.5,
                allreduce: 0.25,
                optimizer: 0.25,
            },
        }
    }

    fn submitted(resumed_from: Option<ResumedFrom>) -> Event {
        Event::Submitted {
            name: "m".into(),
            kind: "train".into(),
            executors: 2,
            epochs: Some(2),
            steps_per_epoch: Some(10),
            rows: Some(1280),
            batch_size: Some(64),
            model: Some("mlp".into()),
            device: Some("cpu".into()),
            resumed_from,
            memory: None,
        }
    }

    fn sample() -> Vec<Record> {
        vec![
            rec("m-0001", 0.0, submitted(None)),
            rec(
                "m-0001",
                0.5,
                Event::Started {
                    ranks: vec![
                        RankInfo {
                            rank: 0,
                            executor_id: "e1".into(),
                            host: "h".into(),
                        },
                        RankInfo {
                            rank: 1,
                            executor_id: "e2".into(),
                            host: "h".into(),
                        },
                    ],
                },
            ),
            rec("m-0001", 2.5, epoch(0)),
            rec(
                "m-0001",
                2.6,
                Event::Checkpoint {
                    epochs_done: 1,
                    step: 10,
                    path: "runs/m/checkpoint".into(),
                    seconds: 0.1,
                },
            ),
            rec(
                "m-0001",
                2.7,
                Event::Evaluated {
                    epoch: Some(0),
                    rows: 100,
                    loss: 0.5,
                    accuracy: Some(0.8),
                    mse: None,
                },
            ),
            rec("m-0001", 4.5, epoch(1)),
            rec(
                "m-0001",
                5.0,
                Event::Evaluated {
                    epoch: None,
                    rows: 100,
                    loss: 0.3,
                    accuracy: Some(0.9),
                    mse: None,
                },
            ),
            rec(
                "m-0001",
                5.5,
                Event::Finished {
                    state: "succeeded".into(),
                    error: None,
                    summary: Some(serde_json::json!({"model_path": "runs/m/model"})),
                },
            ),
            rec(
                "m-0001",
                0.0,
                submitted(Some(ResumedFrom {
                    epochs_done: 1,
                    step: 10,
                })),
            ),
            rec(
                "m-0002",
                0.0,
                Event::Finished {
                    state: "failed".into(),
                    error: Some("rank 1 failed: boom".into()),
                    summary: None,
                },
            ),
        ]
    }

    #[test]
    fn jobs_are_summarized_in_the_order_they_ran() {
        let h = History::from_records("f".into(), sample());
        assert_eq!(h.jobs.len(), 3);
        // A resumed job under a new driver, with the same id: a job of its own.
        let resumed = &h.jobs[1];
        assert_eq!(
            (resumed.job_id.as_str(), resumed.state.as_str()),
            ("m-0001", "unfinished")
        );
        assert!(resumed.epochs.is_empty());
        assert!(resumed.render().contains("resumed after epoch 1 (step 10)"));
        let j = &h.jobs[0];
        assert_eq!((j.state.as_str(), j.epochs.len()), ("succeeded", 2));
        assert_eq!(j.duration_s, 5.5);
        assert_eq!(j.epochs[1].phase_percent.allreduce, 12.5);
        assert_eq!(j.model_path.as_deref(), Some("runs/m/model"));
        assert_eq!(h.jobs[2].error.as_deref(), Some("rank 1 failed: boom"));

        let text = j.render();
        assert!(
            text.starts_with("job m-0001 (m, train): succeeded\n"),
            "{text}"
        );
        assert!(text.contains("rank 0 e1 on h, rank 1 e2 on h"), "{text}");
        assert!(text.contains("\n  2/2    0.5000"), "{text}");
        assert!(
            text.contains("checkpoints: 1, the last after 1 epochs"),
            "{text}"
        );
        assert!(
            text.contains("test: accuracy 0.9000, loss 0.3000 (100 rows)"),
            "{text}"
        );
        let failed = h.jobs[2].render();
        assert!(failed.contains("  error: rank 1 failed: boom"), "{failed}");
        assert!(failed.contains("never started"), "{failed}");

        // Each epoch's row has its test figure: after epoch 1 while training, after epoch 2
        // the final evaluation.
        let row = |n: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(n))
                .unwrap_or_else(|| panic!("no row {n}: {text}"))
                .to_string()
        };
        assert!(row("1/2").ends_with("acc 0.8000"), "{text}");
        assert!(row("2/2").ends_with("acc 0.9000"), "{text}");

        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json["jobs"][0]["epochs"].as_array().unwrap().len(), 2);
        assert_eq!(json["jobs"][0]["epochs"][0]["test"]["accuracy"], 0.8);
        assert_eq!(json["jobs"][0]["executors"][1]["executor_id"], "e2");
    }
}
