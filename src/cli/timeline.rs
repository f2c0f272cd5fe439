//! `--timeline PATH`: every rank's training steps as a Chrome trace (Horovod's timeline), for
//! Perfetto (ui.perfetto.dev) or chrome://tracing.
//!
//! Executors time each step's phases and send them with their progress reports; the driver
//! forwards them as `spans` events of the job. A [`Recorder`] follows the job on a `Watch` stream
//! of its own, so it needs nothing from the progress display, and writes the trace when the job
//! ends, also when it fails or is cancelled (with the steps timed until then).
//!
//! The trace is `{"traceEvents": [...]}` with one process per rank (`pid` = rank, named
//! `rank N (executor ID on HOST)`; an executor that took over a rank in a re-formed ring gets a
//! process of its own) and, for every step, five complete (`"ph": "X"`) events in a row: `data`,
//! `forward`, `backward`, `allreduce` and `optimizer`, with `ts` and `dur` in microseconds and
//! `args` `{epoch, step}` (both 0-based). `ts` counts from the first step of any rank. Start times
//! are each executor's wall clock: ranks on one host line up exactly, ranks on different hosts
//! only as well as their clocks agree (NTP: usually within a millisecond or two).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use ringflow_proto::pb::{self, jobs_client::JobsClient};
use ringflow_proto::security::AuthenticatedChannel;
use serde_json::{Value, json};

/// The phases of a step, in the order they run.
pub const PHASES: [&str; 5] = ["data", "forward", "backward", "allreduce", "optimizer"];

/// How long a recorder waits, once the job's watch ended, for its own stream to catch up.
const CATCH_UP: Duration = Duration::from_secs(10);

/// Where `--timeline` writes.
pub struct Timeline {
    path: PathBuf,
}

impl Timeline {
    /// Creates `path` now, as an empty trace, so that a path that cannot be written fails
    /// before the job starts.
    pub fn create(path: &Path) -> anyhow::Result<Timeline> {
        write_file(path, &Trace::default().to_json("")).map_err(|e| {
            anyhow::anyhow!("--timeline: cannot write {}: {}", path.display(), root(&e))
        })?;
        Ok(Timeline {
            path: path.to_path_buf(),
        })
    }

    /// Starts collecting job `job_id`'s step spans on a watch stream of its own.
    pub fn follow(self, client: &JobsClient<AuthenticatedChannel>, job_id: &str) -> Recorder {
        let trace = Arc::new(Mutex::new(Trace::default()));
        let task = {
            let (mut client, job_id, trace) = (client.clone(), job_id.to_string(), trace.clone());
            tokio::spawn(async move {
                let Ok(stream) = client.watch(pb::WatchRequest { job_id }).await else {
                    return;
                };
                let mut stream = stream.into_inner();
                while let Ok(Some(event)) = stream.message().await {
                    match event.event {
                        Some(pb::job_event::Event::Spans(s)) => {
                            trace.lock().unwrap_or_else(|p| p.into_inner()).add(&s);
                        }
                        Some(pb::job_event::Event::SummaryJson(_)) => return,
                        _ => {}
                    }
                }
            })
        };
        Recorder {
            path: self.path,
            job_id: job_id.to_string(),
            trace,
            task,
        }
    }
}

/// Collects a job's step spans and writes them as a trace when the job ends.
pub struct Recorder {
    path: PathBuf,
    job_id: String,
    trace: Arc<Mutex<Trace>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    /// Waits (briefly) for the job's last spans, then writes the trace; says where on stderr.
    /// A write that fails is reported and does not change how the job ended.
    pub async fn finish(mut self) {
        if tokio::time::timeout(CATCH_UP, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        let trace = std::mem::take(&mut *self.trace.lock().unwrap_or_else(|p| p.into_inner()));
        match write_file(&self.path, &trace.to_json(&self.job_id)) {
            Ok(()) => eprintln!(
                "timeline: {} steps of {} ranks written to {}",
                trace.steps(),
                trace.tracks.len(),
                self.path.display()
            ),
            Err(e) => eprintln!(
                "error: --timeline: cannot write {}: {}",
                self.path.display(),
                root(&e)
            ),
        }
    }
}

fn root(e: &anyhow::Error) -> String {
    e.root_cause().to_string()
}

fn write_file(path: &Path, trace: &Value) -> anyhow::Result<()> {
    let file = std::fs::File::create(path).context("create")?;
    let mut w = std::io::BufWriter::new(file);
    serde_json::to_writer(&mut w, trace).context("write")?;
    std::io::Write::flush(&mut w).context("write")?;
    Ok(())
}

/// One rank's steps, as one process of the trace.
#[derive(Debug, Default)]
struct Track {
    pid: u32,
    label: String,
    spans: Vec<pb::StepSpan>,
}

/// Step spans by (rank, executor).
#[derive(Debug, Default)]
pub struct Trace {
    tracks: BTreeMap<(u32, String), Track>,
}

impl Trace {
    /// Adds spans the driver forwarded.
    pub fn add(&mut self, s: &pb::RankSpans) {
        let key = (s.rank, s.executor_id.clone());
        if !self.tracks.contains_key(&key) {
            // The rank's own number, unless another executor held that rank before.
            let taken = |pid: u32| self.tracks.values().any(|t| t.pid == pid);
            let pid = if taken(s.rank) {
                self.tracks.values().map(|t| t.pid).max().unwrap_or(0) + 1
            } else {
                s.rank
            };
            let mut label = format!("rank {} (executor {} on {})", s.rank, s.executor_id, s.host);
            if s.generation > 0 {
                label = format!("{label}, ring generation {}", s.generation);
            }
            self.tracks.insert(
                key.clone(),
                Track {
                    pid,
                    label,
                    spans: Vec::new(),
                },
            );
        }
        let track = self.tracks.get_mut(&key).expect("inserted above");
        track.spans.extend(s.spans.iter().cloned());
    }

    /// Steps of all ranks together.
    pub fn steps(&self) -> usize {
        self.tracks.values().map(|t| t.spans.len()).sum()
    }

    /// The Chrome trace-event JSON of the steps.
    pub fn to_json(&self, job_id: &str) -> Value {
        let origin = self
            .tracks
            .values()
            .flat_map(|t| t.spans.iter().map(|s| s.start_unix_s))
            .fold(f64::INFINITY, f64::min);
        let origin = if origin.is_finite() { origin } else { 0.0 };
        let us = |seconds: f64| (seconds * 1e9).round() / 1e3;
        let mut events = Vec::with_capacity(self.steps() * PHASES.len() + 3 * self.tracks.len());
        let mut tracks: Vec<&Track> = self.tracks.values().collect();
        tracks.sort_by_key(|t| t.pid);
        for t in tracks {
            events.push(
                json!({"name": "process_name", "ph": "M", "pid": t.pid, "tid": 0,
                "args": {"name": t.label}}),
            );
            events.push(
                json!({"name": "process_sort_index", "ph": "M", "pid": t.pid, "tid": 0,
                "args": {"sort_index": t.pid}}),
            );
            events.push(
                json!({"name": "thread_name", "ph": "M", "pid": t.pid, "tid": 0,
                "args": {"name": "training steps"}}),
            );
            let mut spans: Vec<&pb::StepSpan> = t.spans.iter().collect();
            spans.sort_by(|a, b| a.start_unix_s.total_cmp(&b.start_unix_s));
            for s in spans {
                let phases = [s.data, s.forward, s.backward, s.allreduce, s.optimizer];
                let mut at = s.start_unix_s - origin;
                for (name, seconds) in PHASES.iter().zip(phases) {
                    let seconds = f64::from(seconds).max(0.0);
                    events.push(json!({
                        "name": name, "cat": "step", "ph": "X",
                        "ts": us(at), "dur": us(seconds),
                        "pid": t.pid, "tid": 0,
                        "args": {"epoch": s.epoch, "step": s.step},
                    }));
                    at += seconds;
                }
            }
        }
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {
                "job_id": job_id,
                "origin_unix_s": origin,
                "clock": "ts counts microseconds from the first step; each rank's times come \
                          from its executor's wall clock",
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(epoch: u64, step: u64, start: f64) -> pb::StepSpan {
        pb::StepSpan {
            epoch,
            step,
            start_unix_s: start,
            data: 0.001,
            forward: 0.002,
            backward: 0.003,
            allreduce: 0.004,
            optimizer: 0.0005,
        }
    }

    fn spans(rank: u32, executor: &str, generation: u32, s: Vec<pb::StepSpan>) -> pb::RankSpans {
        pb::RankSpans {
            rank,
            executor_id: executor.into(),
            host: "h".into(),
            generation,
            spans: s,
        }
    }

    #[test]
    fn steps_become_five_phases_in_a_row_per_rank() {
        let mut t = Trace::default();
        t.add(&spans(1, "e2", 0, vec![span(0, 0, 100.0005)]));
        t.add(&spans(
            0,
            "e1",
            0,
            vec![span(0, 0, 100.0), span(0, 1, 100.02)],
        ));
        let v = t.to_json("job-1");
        let events = v["traceEvents"].as_array().unwrap();
        let x: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 15);
        let rank0: Vec<&&Value> = x.iter().filter(|e| e["pid"] == 0).collect();
        let names: Vec<&str> = rank0.iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(&names[..5], PHASES);
        assert_eq!(rank0[0]["ts"], 0.0);
        assert_eq!(rank0[1]["ts"], 1000.0);
        assert_eq!(rank0[4]["dur"], 500.0);
        assert_eq!(rank0[5]["ts"], 20000.0);
        assert_eq!(rank0[5]["args"], json!({"epoch": 0, "step": 1}));
        let ts: Vec<f64> = rank0.iter().map(|e| e["ts"].as_f64().unwrap()).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
        let rank1 = x.iter().find(|e| e["pid"] == 1).unwrap();
        assert_eq!(rank1["ts"], 500.0);
        let label = events
            .iter()
            .find(|e| e["name"] == "process_name" && e["pid"] == 1)
            .unwrap();
        assert_eq!(label["args"]["name"], "rank 1 (executor e2 on h)");
        assert_eq!(v["otherData"]["job_id"], "job-1");
    }

    #[test]
    fn an_executor_taking_over_a_rank_gets_its_own_process() {
        let mut t = Trace::default();
        t.add(&spans(0, "e1", 0, vec![span(0, 0, 1.0)]));
        t.add(&spans(1, "e2", 0, vec![span(0, 0, 1.0)]));
        t.add(&spans(0, "e2", 1, vec![span(1, 0, 2.0)]));
        t.add(&spans(0, "e2", 1, vec![span(1, 1, 2.1)]));
        assert_eq!(t.steps(), 4);
        let v = t.to_json("j");
        let names: Vec<(u64, String)> = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "process_name")
            .map(|e| {
                (
                    e["pid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                (0, "rank 0 (executor e1 on h)".to_string()),
                (1, "rank 1 (executor e2 on h)".to_string()),
                (
                    2,
                    "rank 0 (executor e2 on h), ring generation 1".to_string()
                ),
            ]
        );
    }

    #[test]
    fn an_unwritable_path_fails_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing/t.json");
        let e = Timeline::create(&path).err().unwrap().to_string();
        assert!(
            e.starts_with(&format!("--timeline: cannot write {}: ", path.display())),
            "{e}"
        );
        let ok = dir.path().join("t.json");
        Timeline::create(&ok).unwrap();
        let v: Value = serde_json::from_slice(&std::fs::read(&ok).unwrap()).unwrap();
        assert_eq!(v["traceEvents"], json!([]));
    }
}
