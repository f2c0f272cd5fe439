//! What a job tells: its events (streamed to `ringflow submit` and the UI, and written to the
//! event log in its checkpoint directory), its messages, and the lock it holds on that directory.

use super::*;

impl Job {
    /// Every event so far, borrowed (for views that summarize them without copying).
    pub fn events(&self) -> &[pb::JobEvent] {
        &self.events
    }

    /// True while a client follows the job's events ([`Job::events_since`]'s receiver is
    /// alive): the job is not forgotten before its summary reaches that client.
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

    pub(super) fn push(&mut self, event: pb::job_event::Event) {
        let at_s = self.submitted.elapsed().as_secs_f64();
        self.events.push(pb::JobEvent {
            job_id: self.id.clone(),
            at_s,
            event: Some(event),
        });
        self.event_count.send_replace(self.events.len());
    }

    /// Where the job's event log goes: `<checkpoint_dir>/events.jsonl` for training, the
    /// directory above the saved model (`<checkpoint_dir>` again) for evaluation and prediction;
    /// benchmarks have none.
    pub fn event_log_path(&self) -> Option<String> {
        match &self.kind {
            JobKind::Train(plan) => Some(plan.spec.events_path()),
            JobKind::Infer { model_dir, .. } => paths::split_last(model_dir)
                .filter(|(dir, name)| {
                    name == ringflow_proto::spec::MODEL_DIR && !paths::is_filesystem_root(dir)
                })
                .map(|(dir, _)| crate::events::log_path(&dir)),
            JobKind::Bench { .. } => None,
        }
    }

    /// Holds `lock`, the lock on the job's output directory, until the job ends; what it says
    /// (a takeover, a store that cannot be locked) goes to the job's messages.
    pub fn hold(&mut self, lock: DirLock) {
        if let Some(note) = lock.note() {
            self.message(note.to_string());
        }
        self.lock = Some(lock);
    }

    /// Fails the job when another job took over the lock on its output directory.
    pub fn check_lock(&mut self, now: Instant) {
        if self.is_finished() {
            return;
        }
        if let Some(why) = self.lock.as_ref().and_then(DirLock::lost) {
            self.lock = None;
            self.fail(why, now);
        }
    }

    /// Removes the lock on the job's output directory, if it holds one.
    pub fn release_lock(&mut self) {
        if let Some(mut lock) = self.lock.take() {
            lock.release(LOCK_RELEASE_WAIT);
        }
    }

    /// Starts the job's event log ([`crate::events`]) with its `submitted` event.
    pub fn open_event_log(&mut self) {
        let Some(path) = self.event_log_path() else {
            return;
        };
        self.log = Some(EventLog::open(path, self.id.clone()));
        let executors = self.executors_needed();
        let name = self.kind.name();
        let event = match &self.kind {
            JobKind::Train(plan) => Event::Submitted {
                name,
                kind: "train".into(),
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
                kind: if predict.is_some() { "predict" } else { "eval" }.into(),
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
            JobKind::Bench { .. } => return,
        };
        self.log(event);
    }

    /// Appends `event` to the job's event log, if it has one.
    pub(super) fn log(&mut self, event: Event) {
        let elapsed = self.submitted.elapsed().as_secs_f64();
        if let Some(log) = self.log.as_mut() {
            log.write(elapsed, event);
        }
    }
}
