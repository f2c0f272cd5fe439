//! `--timeline PATH`: every rank's training steps as a Chrome trace (Horovod's timeline), for
//! Perfetto (ui.perfetto.dev) or chrome://tracing.
//!
//! Executors time each step's phases and send them with their progress reports; the driver
//! forwards them as `spans` events of the job. [`Timeline`] is an [`Observer`] of those events
//! that writes the trace when following the job ends, also when it failed or was cancelled
//! (with the steps timed until then).
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

use ringflow_core::pb;
use ringflow_core::phases::PhaseTimes;
use serde_json::{Value, json};

use super::observer::Observer;

/// The `--timeline` file cannot be written.
#[derive(Debug, thiserror::Error)]
#[error("--timeline: cannot write {path}: {cause}")]
pub struct TimelineError {
    /// The file.
    pub path: String,
    /// Why (in the message, which is the whole sentence).
    pub cause: std::io::Error,
}

/// Collects a job's step spans and writes them to a file as a Chrome trace when following the
/// job ends.
pub struct Timeline {
    path: PathBuf,
    job_id: String,
    trace: Trace,
}

impl Timeline {
    /// Creates `path` now, as an empty trace, so that a path that cannot be written fails
    /// before the job starts.
    pub fn create(path: &Path) -> Result<Timeline, TimelineError> {
        write_file(path, &Trace::default().to_json(""))?;
        Ok(Timeline {
            path: path.to_path_buf(),
            job_id: String::new(),
            trace: Trace::default(),
        })
    }
}

impl Observer for Timeline {
    fn begin(&mut self, job_id: &str) {
        self.job_id = job_id.to_string();
    }

    fn spans(&mut self, spans: &pb::RankSpans) {
        self.trace.add(spans);
    }

    /// Writes the trace and says where on stderr. A write that fails is reported and does not
    /// change how the job ended.
    fn finish(&mut self) {
        let trace = std::mem::take(&mut self.trace);
        match write_file(&self.path, &trace.to_json(&self.job_id)) {
            Ok(()) => eprintln!(
                "timeline: {} steps of {} ranks written to {}",
                trace.steps(),
                trace.tracks.len(),
                self.path.display()
            ),
            Err(e) => eprintln!("error: {e}"),
        }
    }
}

/// Writes `trace` to `path` as JSON.
fn write_file(path: &Path, trace: &Value) -> Result<(), TimelineError> {
    let write = || -> std::io::Result<()> {
        let file = std::fs::File::create(path)?;
        let mut w = std::io::BufWriter::new(file);
        serde_json::to_writer(&mut w, trace)?;
        std::io::Write::flush(&mut w)
    };
    write().map_err(|cause| TimelineError {
        path: path.display().to_string(),
        cause,
    })
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
struct Trace {
    tracks: BTreeMap<(u32, String), Track>,
}

impl Trace {
    /// Adds spans the driver forwarded.
    fn add(&mut self, s: &pb::RankSpans) {
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
    fn steps(&self) -> usize {
        self.tracks.values().map(|t| t.spans.len()).sum()
    }

    /// The Chrome trace-event JSON of the steps.
    fn to_json(&self, job_id: &str) -> Value {
        let origin = self
            .tracks
            .values()
            .flat_map(|t| t.spans.iter().map(|s| s.start_unix_s))
            .fold(f64::INFINITY, f64::min);
        let origin = if origin.is_finite() { origin } else { 0.0 };
        let us = |seconds: f64| (seconds * 1e9).round() / 1e3;
        let mut events =
            Vec::with_capacity(self.steps() * PhaseTimes::NAMES.len() + 3 * self.tracks.len());
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
                let mut at = s.start_unix_s - origin;
                for (name, seconds) in PhaseTimes::NAMES.iter().zip(PhaseTimes::from(s).seconds()) {
                    let seconds = seconds.max(0.0);
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
        assert_eq!(&names[..5], PhaseTimes::NAMES);
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

    #[test]
    fn following_a_job_writes_its_spans_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let mut timeline = Timeline::create(&path).unwrap();
        timeline.begin("job-7");
        timeline.spans(&spans(0, "e1", 0, vec![span(0, 0, 1.0), span(0, 1, 1.1)]));
        timeline.spans(&spans(1, "e2", 0, vec![span(0, 0, 1.0)]));
        let read = || -> Value { serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap() };
        assert_eq!(
            read()["traceEvents"],
            json!([]),
            "nothing written before the end"
        );
        timeline.finish();
        let v = read();
        assert_eq!(v["otherData"]["job_id"], "job-7");
        let steps = v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .count();
        assert_eq!(steps, 3 * PhaseTimes::NAMES.len());
    }
}
