//! What a job tells ([`EventFeed`]). This file owns:
//!
//! - the job's events, streamed to `ringflow submit` and the web UI, and the watch channel
//!   that wakes their followers when more arrive;
//! - the job's messages, the lines people read;
//! - the ranks' step spans (`--timeline`), forwarded up to [`MAX_JOB_SPANS`] per job;
//! - the event log in the job's checkpoint directory ([`crate::events`]): where it goes, its
//!   `submitted` record, every record after it, and its closing when the job ends.

use std::time::{Duration, Instant};

use ringflow_core::data::paths;
use ringflow_core::pb;
use tokio::sync::watch;

use super::{Job, JobKind};
use crate::events::{Event, EventLog, ResumedFrom};
use crate::work::JobWork;

/// Step spans (`--timeline`) a job keeps for its watchers, all ranks together: about 12 MB.
/// Later spans are dropped, with a message.
pub const MAX_JOB_SPANS: usize = 250_000;

/// How long ending a job waits for its event log to reach storage.
const EVENT_LOG_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// A job's events, their followers, and its event log.
pub(super) struct EventFeed {
    job_id: String,
    submitted: Instant,
    events: Vec<pb::JobEvent>,
    event_count: watch::Sender<usize>,
    /// Step spans forwarded to watchers so far.
    spans_kept: usize,
    /// `<checkpoint_dir>/events.jsonl`, once opened.
    log: Option<EventLog>,
}

impl EventFeed {
    /// The feed of job `job_id`, submitted at `submitted`: no events yet.
    pub fn new(job_id: String, submitted: Instant) -> EventFeed {
        let (event_count, _) = watch::channel(0);
        EventFeed {
            job_id,
            submitted,
            events: Vec::new(),
            event_count,
            spans_kept: 0,
            log: None,
        }
    }

    /// Every event so far.
    pub fn events(&self) -> &[pb::JobEvent] {
        &self.events
    }

    /// True while a client follows the events.
    pub fn is_followed(&self) -> bool {
        self.event_count.receiver_count() > 0
    }

    /// Events from `from` on, and a receiver that changes when more arrive.
    pub fn events_since(&self, from: usize) -> (Vec<pb::JobEvent>, watch::Receiver<usize>) {
        (
            self.events.get(from..).unwrap_or_default().to_vec(),
            self.event_count.subscribe(),
        )
    }

    /// Adds `event` and wakes the followers.
    pub fn push(&mut self, event: pb::job_event::Event) {
        let at_s = self.submitted.elapsed().as_secs_f64();
        self.events.push(pb::JobEvent {
            job_id: self.job_id.clone(),
            at_s,
            event: Some(event),
        });
        self.event_count.send_replace(self.events.len());
    }

    /// Adds a line for people.
    pub fn message(&mut self, text: String) {
        self.push(pb::job_event::Event::Message(text));
    }

    /// Forwards the step `spans` of `rank` (held by `executor`, in ring `generation`) to
    /// watchers, up to [`MAX_JOB_SPANS`] per job.
    pub fn forward_spans(
        &mut self,
        rank: usize,
        executor: Option<&pb::ExecutorInfo>,
        generation: u32,
        mut spans: Vec<pb::StepSpan>,
    ) {
        if spans.is_empty() || self.spans_kept >= MAX_JOB_SPANS {
            return;
        }
        let room = MAX_JOB_SPANS - self.spans_kept;
        if spans.len() >= room {
            spans.truncate(room);
            self.message(format!(
                "timeline: the job keeps the first {MAX_JOB_SPANS} step spans of its ranks; later \
                 steps are left out"
            ));
        }
        self.spans_kept += spans.len();
        let (executor_id, host) = executor
            .map(|e| (e.executor_id.clone(), e.host.clone()))
            .unwrap_or_default();
        self.push(pb::job_event::Event::Spans(pb::RankSpans {
            rank: rank as u32,
            executor_id,
            host,
            generation,
            spans,
        }));
    }

    /// Whether the job writes an event log.
    pub fn has_log(&self) -> bool {
        self.log.is_some()
    }

    /// Appends `event` to the event log, if there is one.
    pub fn log(&mut self, event: Event) {
        let elapsed = self.submitted.elapsed().as_secs_f64();
        if let Some(log) = self.log.as_mut() {
            log.write(elapsed, event);
        }
    }

    /// Waits (a bounded time) for the event log to reach storage.
    pub fn close_log(&mut self) {
        if let Some(log) = self.log.as_mut() {
            log.close(EVENT_LOG_CLOSE_WAIT);
        }
    }
}

impl Job {
    /// Every event so far, borrowed (for views that summarize them without copying).
    pub fn events(&self) -> &[pb::JobEvent] {
        self.feed.events()
    }

    /// True while a client follows the job's events ([`Job::events_since`]'s receiver is
    /// alive): the job is not forgotten before its summary reaches that client.
    pub fn is_followed(&self) -> bool {
        self.feed.is_followed()
    }

    /// Events from `from` on, and a receiver that changes when more arrive.
    pub fn events_since(&self, from: usize) -> (Vec<pb::JobEvent>, watch::Receiver<usize>) {
        self.feed.events_since(from)
    }

    /// Adds a line for people to the job's events.
    pub fn message(&mut self, text: String) {
        self.feed.message(text);
    }

    /// Where the job's event log goes: `<checkpoint_dir>/events.jsonl` for training, the
    /// directory above the saved model (`<checkpoint_dir>` again) for evaluation and prediction;
    /// benchmarks have none.
    pub fn event_log_path(&self) -> Option<String> {
        match &self.kind {
            JobKind::Train(plan) => Some(plan.spec.events_path()),
            JobKind::Infer { model_dir, .. } => paths::split_last(model_dir)
                .filter(|(dir, name)| {
                    name == ringflow_core::spec::MODEL_DIR && !paths::is_filesystem_root(dir)
                })
                .map(|(dir, _)| crate::events::log_path(&dir)),
            JobKind::Bench { .. } => None,
        }
    }

    /// Starts the job's event log ([`crate::events`]) with its `submitted` event.
    pub fn open_event_log(&mut self) {
        let Some(path) = self.event_log_path() else {
            return;
        };
        self.feed.log = Some(EventLog::open(path, self.id.clone()));
        if let Some(event) = self.submitted_event() {
            self.feed.log(event);
        }
    }

    /// The event log's first record: what the job is (benchmarks have none).
    fn submitted_event(&self) -> Option<Event> {
        let executors = self.executors_needed();
        let name = self.kind.name();
        let event = match &self.kind {
            JobKind::Train(plan) => Event::Submitted {
                name,
                kind: JobWork::Train,
                executors,
                epochs: Some(plan.spec.train.epochs),
                steps_per_epoch: Some(plan.steps_per_epoch(executors)),
                rows: Some(plan.train_rows()),
                batch_size: Some(plan.spec.train.batch_size),
                model: Some(plan.spec.model.kind.clone()),
                device: Some(plan.spec.cluster.device.to_string()),
                resumed_from: plan.resume.map(|r| ResumedFrom {
                    epochs_done: r.epoch,
                    step: r.step,
                }),
                memory: Some(self.memory.clone()),
            },
            JobKind::Infer { plan, predict, .. } => Event::Submitted {
                name,
                kind: JobWork::inference(predict.is_some()),
                executors,
                epochs: None,
                steps_per_epoch: None,
                rows: Some(plan.test_rows()),
                batch_size: None,
                model: Some(plan.spec.model.kind.clone()),
                device: Some(plan.spec.cluster.device.to_string()),
                resumed_from: None,
                memory: Some(self.memory.clone()),
            },
            JobKind::Bench { .. } => return None,
        };
        Some(event)
    }
}
