//! A job's event log: `<checkpoint_dir>/events.jsonl`, one JSON object per line.
//!
//! Every line is a [`Record`]: `{"event": "epoch_end", "job_id": "mnist-20250501120000-k7x2-0001", "at":
//! "2025-05-01T12:00:03.250Z", "elapsed_s": 3.25, ...fields}`, where `at` is the driver's wall
//! clock (RFC 3339, UTC) and `elapsed_s` the seconds since the job was submitted. The events
//! ([`Event`]) are `submitted`, `started`, `executor_registered`, `executor_lost`, `epoch_end`,
//! `checkpoint`, `recovery`, `evaluated` and `finished`. Readers skip event names they do not
//! know, so later versions may add some.
//!
//! An [`EventLog`] writes on a thread of its own, so the scheduler never waits for storage
//! while it holds its lock. A local file is appended to; an object store (which cannot append)
//! gets the whole file rewritten after each batch of events, starting from what it held before,
//! so a resumed job's events follow the first run's. A log that cannot be written never fails
//! the job: it warns once and the job goes on.
//!
//! [`read`] and [`parse`] are the other half, for `ringflow history`.

use std::fs::OpenOptions;
use std::io::Write;
use std::num::NonZeroU8;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ringflow_core::data::Location;
use ringflow_core::data::runtime::block_on;
use ringflow_core::phases::PhaseTimes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Iso8601;
use time::format_description::well_known::iso8601::{Config, EncodedConfig, TimePrecision};
use time::format_description::{BorrowedFormatItem, Component, modifier};
use tracing::warn;

use crate::figures::EntityFigures;
use crate::planner::memory::MemoryEstimate;
pub use error::{LogError, RecordError, SinkError};

pub mod error;
pub mod history;

/// The file name of an event log within a checkpoint directory.
pub const FILE_NAME: &str = ringflow_core::spec::EVENTS_FILE;

/// One executor of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    /// Its rank in the ring.
    pub rank: usize,
    /// The executor's id.
    pub executor_id: String,
    /// Its machine.
    pub host: String,
}

/// The checkpoint a resumed job continues from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResumedFrom {
    /// Epochs completed.
    pub epochs_done: u64,
    /// Optimizer steps taken.
    pub step: u64,
}

/// Something that happened to a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The driver accepted the job.
    Submitted {
        /// The job's name.
        name: String,
        /// What the job does.
        kind: crate::work::JobWork,
        /// Executors it runs on.
        executors: usize,
        /// Epochs to train.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epochs: Option<u64>,
        /// Steps per epoch on every rank.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        steps_per_epoch: Option<u64>,
        /// Rows of the training split (training) or of the data set (eval, predict).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rows: Option<u64>,
        /// Rows per step and rank.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch_size: Option<usize>,
        /// `model.kind`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// `cluster.device`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        /// The checkpoint a `--resume` continues from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resumed_from: Option<ResumedFrom>,
        /// What one executor needs for the job, estimated before any executor started.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory: Option<MemoryEstimate>,
    },
    /// The job has its executors and runs.
    Started {
        /// Its executors, by rank.
        #[serde(default)]
        ranks: Vec<RankInfo>,
    },
    /// An executor registered with the driver while the job was waiting or running.
    ExecutorRegistered {
        /// The executor's id.
        executor_id: String,
        /// Its machine.
        host: String,
    },
    /// An executor of the job stopped heartbeating.
    ExecutorLost {
        /// Its rank.
        rank: usize,
        /// The executor's id.
        executor_id: String,
        /// Its machine.
        host: String,
        /// What the driver noticed.
        reason: String,
    },
    /// Every rank finished an epoch.
    EpochEnd {
        /// 0-based epoch.
        epoch: u64,
        /// Steps every rank took.
        steps: u64,
        /// Mean training loss.
        loss: f64,
        /// Rows trained on, all ranks together.
        samples: u64,
        /// Rows whose gradients backup workers dropped.
        #[serde(default)]
        dropped_samples: u64,
        /// Wall time of the slowest rank.
        seconds: f64,
        /// `samples / seconds`.
        samples_per_s: f64,
        /// Mean over ranks of the seconds per step phase.
        #[serde(default)]
        phases: PhaseTimes,
        /// Token sequences: the real tokens trained on, all ranks together.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens: Option<u64>,
        /// Token sequences: the padding steps the batches held, all ranks together.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        padding: Option<u64>,
        /// Token sequences: `tokens / seconds`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens_per_s: Option<f64>,
    },
    /// Rank 0 wrote a checkpoint that `--resume` can continue from.
    Checkpoint {
        /// Epochs completed at the checkpoint.
        epochs_done: u64,
        /// Optimizer steps taken.
        step: u64,
        /// Where it was written.
        path: String,
        /// Seconds the save took.
        seconds: f64,
    },
    /// An elastic job re-formed its ring.
    Recovery {
        /// The ring's generation after the re-forming.
        generation: u32,
        /// Executors before and after.
        world_before: usize,
        /// Executors after.
        world_after: usize,
        /// Executors left out (lost), by id.
        #[serde(default)]
        lost: Vec<String>,
        /// Idle executors that joined, by id.
        #[serde(default)]
        joined: Vec<String>,
        /// Seconds from the break to the new ring.
        waited_s: f64,
        /// What broke (empty when executors joined at an epoch boundary).
        #[serde(default)]
        cause: String,
    },
    /// Every rank evaluated its share of the test split: after an epoch while training goes on
    /// (`train.eval_every_epochs`), or after training.
    Evaluated {
        /// The 0-based epoch after which it was evaluated while training went on; absent for
        /// the evaluation after training (and for `eval`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch: Option<u64>,
        /// Rows evaluated.
        rows: u64,
        /// Mean test loss.
        loss: f64,
        /// Test accuracy (classification).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        accuracy: Option<f64>,
        /// Test mean squared error (regression).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mse: Option<f64>,
        /// A tagger: `rows` are its real tokens, and `accuracy` is per token.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        per_token: bool,
        /// An IOB2 tagger (`train.metrics` has "entity_f1"): entity-level figures.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entities: Option<EntityFigures>,
    },
    /// The job ended; the last event of a job.
    Finished {
        /// `"succeeded"`, `"failed"` or `"cancelled"`.
        state: String,
        /// Why it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// The job's final summary (as `--summary-json` writes it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<Value>,
    },
    /// An event this version does not know (written by a later one).
    #[serde(other)]
    Unknown,
}

impl Event {
    /// The event's name, as written in its `event` field.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Submitted { .. } => "submitted",
            Event::Started { .. } => "started",
            Event::ExecutorRegistered { .. } => "executor_registered",
            Event::ExecutorLost { .. } => "executor_lost",
            Event::EpochEnd { .. } => "epoch_end",
            Event::Checkpoint { .. } => "checkpoint",
            Event::Recovery { .. } => "recovery",
            Event::Evaluated { .. } => "evaluated",
            Event::Finished { .. } => "finished",
            Event::Unknown => "unknown",
        }
    }
}

/// One line of an event log.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The job the event belongs to (a checkpoint directory holds every run of a resumed job).
    pub job_id: String,
    /// The driver's wall clock, RFC 3339 in UTC.
    pub at: String,
    /// Seconds since the job was submitted.
    pub elapsed_s: f64,
    /// What happened.
    pub event: Event,
}

impl Record {
    /// The record as one line of JSON (without the newline): `event`, `job_id`, `at` and
    /// `elapsed_s` first, then the event's fields.
    pub fn to_line(&self) -> String {
        let text = |v: &str| Value::from(v).to_string();
        let mut out = format!(
            "{{\"event\":{},\"job_id\":{},\"at\":{},\"elapsed_s\":{}",
            text(self.event.name()),
            text(&self.job_id),
            text(&self.at),
            Value::from(round3(self.elapsed_s))
        );
        if let Ok(Value::Object(fields)) = serde_json::to_value(&self.event) {
            for (k, v) in fields.iter().filter(|(k, _)| k.as_str() != "event") {
                out.push(',');
                out.push_str(&text(k));
                out.push(':');
                out.push_str(&v.to_string());
            }
        }
        out.push('}');
        out
    }

    /// Reads one line written by [`Record::to_line`].
    pub fn from_line(line: &str) -> Result<Record, RecordError> {
        let value: Value = serde_json::from_str(line)?;
        let Value::Object(fields) = &value else {
            return Err(RecordError::NotAnObject);
        };
        let text = |key: &'static str| -> Result<String, RecordError> {
            match fields.get(key) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(RecordError::NotAString(key)),
                None => Err(RecordError::Missing(key)),
            }
        };
        text("event")?;
        let job_id = text("job_id")?;
        let at = text("at")?;
        let elapsed_s = fields
            .get("elapsed_s")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        let event = Event::deserialize(&value)?;
        Ok(Record {
            job_id,
            at,
            elapsed_s,
            event,
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `seconds` rounded to microseconds, for readable logs.
pub fn micros(seconds: f64) -> f64 {
    (seconds * 1e6).round() / 1e6
}

/// RFC 3339 in UTC with milliseconds (`2025-05-01T12:00:03.250Z`): ISO 8601's extended format
/// to the second with three decimals, whose UTC offset is written `Z`.
const UTC_MILLIS: EncodedConfig = Config::DEFAULT
    .set_time_precision(TimePrecision::Second {
        decimal_digits: NonZeroU8::new(3),
    })
    .encode();

/// `yyyyMMddHHmmss`: the date and time, to the second, without separators.
const COMPACT: &[BorrowedFormatItem<'static>] = &[
    BorrowedFormatItem::Component(Component::CalendarYearFullStandardRange(
        modifier::CalendarYearFullStandardRange::default(),
    )),
    BorrowedFormatItem::Component(Component::MonthNumerical(
        modifier::MonthNumerical::default(),
    )),
    BorrowedFormatItem::Component(Component::Day(modifier::Day::default())),
    BorrowedFormatItem::Component(Component::Hour24(modifier::Hour24::default())),
    BorrowedFormatItem::Component(Component::Minute(modifier::Minute::default())),
    BorrowedFormatItem::Component(Component::Second(modifier::Second::default())),
];

/// `t` in UTC; a time before the Unix epoch (or beyond year 9999) counts as the epoch.
fn utc(t: SystemTime) -> OffsetDateTime {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    i128::try_from(since.as_nanos())
        .ok()
        .and_then(|nanos| OffsetDateTime::from_unix_timestamp_nanos(nanos).ok())
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// `t` as RFC 3339 in UTC with milliseconds, e.g. `2025-05-01T12:00:03.250Z`.
pub fn rfc3339(t: SystemTime) -> String {
    // Formatting fails only for years beyond 9999, which `utc` never gives.
    utc(t).format(&Iso8601::<UTC_MILLIS>).unwrap_or_default()
}

/// `t` in UTC as `yyyyMMddHHmmss`, e.g. `20250501120003`: the time in job ids.
pub fn compact_utc(t: SystemTime) -> String {
    utc(t).format(COMPACT).unwrap_or_default()
}

enum Message {
    Line(String),
    /// Write what is pending, then acknowledge and stop.
    Close(mpsc::SyncSender<()>),
}

/// The event log of one job, written on a thread of its own.
pub struct EventLog {
    job_id: String,
    path: String,
    tx: Option<mpsc::Sender<Message>>,
}

impl EventLog {
    /// A log that appends `job_id`'s events to `path` (a local path or an object-store URL).
    /// Nothing is opened before the first event.
    pub fn open(path: String, job_id: String) -> EventLog {
        let (tx, rx) = mpsc::channel();
        let target = path.clone();
        let job = job_id.clone();
        let spawned = std::thread::Builder::new()
            .name("ringflow-events".into())
            .spawn(move || write_loop(&target, &job, rx));
        let tx = match spawned {
            Ok(_) => Some(tx),
            Err(e) => {
                warn!(job = %job_id, "the event log {path} cannot be written: {e}");
                None
            }
        };
        EventLog { job_id, path, tx }
    }

    /// Where the log is written.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Appends `event`, `elapsed_s` seconds after the job's submission. Never blocks on
    /// storage.
    pub fn write(&mut self, elapsed_s: f64, event: Event) {
        let Some(tx) = &self.tx else { return };
        let record = Record {
            job_id: self.job_id.clone(),
            at: rfc3339(SystemTime::now()),
            elapsed_s,
            event,
        };
        if tx.send(Message::Line(record.to_line())).is_err() {
            self.tx = None;
        }
    }

    /// Writes what is pending and stops, waiting at most `wait` for storage (a later write
    /// finishes in the background).
    pub fn close(&mut self, wait: Duration) {
        let Some(tx) = self.tx.take() else { return };
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        if tx.send(Message::Close(done_tx)).is_ok() && done_rx.recv_timeout(wait).is_err() {
            warn!(
                job = %self.job_id,
                "the event log {} is still being written after {:.0} s; the rest is written in \
                 the background",
                self.path,
                wait.as_secs_f64()
            );
        }
    }
}

/// Where a log's lines go.
enum Sink {
    /// A local file, appended to.
    Local {
        path: PathBuf,
        file: Option<std::fs::File>,
    },
    /// An object: everything it held before, then this job's lines, rewritten whole.
    Store {
        location: Location,
        content: Option<Vec<u8>>,
    },
}

impl Sink {
    fn new(path: &str) -> Result<Sink, SinkError> {
        let location = Location::parse(path)?;
        Ok(match location.local_path() {
            Some(path) => Sink::Local { path, file: None },
            None => Sink::Store {
                location,
                content: None,
            },
        })
    }

    fn append(&mut self, lines: &[String]) -> Result<(), SinkError> {
        let mut bytes = Vec::new();
        for l in lines {
            bytes.extend_from_slice(l.as_bytes());
            bytes.push(b'\n');
        }
        match self {
            Sink::Local { path, file } => {
                if file.is_none() {
                    if let Some(dir) = path.parent() {
                        std::fs::create_dir_all(dir).map_err(|source| SinkError::CreateDir {
                            dir: dir.display().to_string(),
                            source,
                        })?;
                    }
                    let opened = OpenOptions::new().create(true).append(true).open(&*path)?;
                    *file = Some(opened);
                }
                let f = file.as_mut().expect("opened above");
                f.write_all(&bytes).map_err(|e| {
                    *file = None;
                    SinkError::from(e)
                })
            }
            Sink::Store { location, content } => {
                if content.is_none() {
                    let l = location.clone();
                    let before = match block_on(async move { l.read().await }) {
                        Ok(b) => b,
                        Err(e) if e.is_not_found() => Vec::new(),
                        // Rewriting without what it held would lose earlier runs' events.
                        Err(e) => return Err(e.into()),
                    };
                    *content = Some(before);
                }
                let all = content.as_mut().expect("read above");
                if !all.is_empty() && !all.ends_with(b"\n") {
                    all.push(b'\n');
                }
                all.extend_from_slice(&bytes);
                let (l, whole) = (location.clone(), all.clone());
                Ok(block_on(async move { l.write(whole).await })?)
            }
        }
    }
}

fn write_loop(path: &str, job_id: &str, rx: mpsc::Receiver<Message>) {
    let mut sink = Sink::new(path);
    let mut warned = false;
    let mut warn_once = |e: &SinkError| {
        if !warned {
            warn!(job = %job_id, "the event log {path} cannot be written ({e}); the job goes on without it");
            warned = true;
        }
    };
    // Lines that could not be written yet (an object store that failed): kept, within a bound,
    // for the next attempt.
    let mut pending: Vec<String> = Vec::new();
    const MAX_PENDING: usize = 100_000;
    while let Ok(first) = rx.recv() {
        let mut done = None;
        for m in std::iter::once(first).chain(rx.try_iter()) {
            match m {
                Message::Line(l) if pending.len() < MAX_PENDING => pending.push(l),
                Message::Line(_) => {}
                Message::Close(ack) => done = Some(ack),
            }
        }
        match &mut sink {
            Ok(s) => match s.append(&pending) {
                Ok(()) => pending.clear(),
                Err(e) => warn_once(&e),
            },
            Err(e) => {
                warn_once(e);
                pending.clear();
            }
        }
        if let Some(ack) = done {
            let _ = ack.send(());
            return;
        }
    }
}

/// Where the event log of `dir` is: `dir/events.jsonl`, or `dir` itself when it names a
/// `.jsonl` file.
pub fn log_path(dir: &str) -> String {
    if dir.ends_with(".jsonl") {
        dir.to_string()
    } else {
        ringflow_core::data::paths::join(dir, FILE_NAME)
    }
}

/// Reads the event log of `dir` (a checkpoint directory, local or an object-store URL, or the
/// log file itself): its path and its records. Errors are one sentence naming the file.
pub fn read(dir: &str) -> Result<(String, Vec<Record>), LogError> {
    let path = log_path(dir);
    let location = Location::parse(&path)?;
    let bytes = match location.local_path() {
        Some(local) => std::fs::read(&local).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => missing(&path, dir),
            _ => LogError::Unreadable {
                path: path.clone(),
                source,
            },
        })?,
        None => read_object(location, &path, dir)?,
    };
    let text = String::from_utf8(bytes).map_err(|_| LogError::NotUtf8 { path: path.clone() })?;
    let records = parse(&text, &path)?;
    Ok((path, records))
}

/// The bytes of the event log in an object store at `location` (`path`, found from `dir`).
fn read_object(location: Location, path: &str, dir: &str) -> Result<Vec<u8>, LogError> {
    block_on(async move { location.read().await }).map_err(|e| match e.is_not_found() {
        true => missing(path, dir),
        false => e.into(),
    })
}

/// The error for the event log `path` (found from `dir`) that is not there.
fn missing(path: &str, dir: &str) -> LogError {
    LogError::Missing {
        path: path.to_string(),
        from_dir: path != dir,
    }
}

/// The records of an event log's text; `file` names it in errors, which give the line number.
pub fn parse(text: &str, file: &str) -> Result<Vec<Record>, LogError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record = Record::from_line(line).map_err(|source| LogError::BadLine {
            file: file.to_string(),
            line: i + 1,
            source,
        })?;
        out.push(record);
    }
    if out.is_empty() {
        return Err(LogError::Empty {
            file: file.to_string(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
