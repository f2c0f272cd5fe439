//! The observer trait, and a list of observers that is itself one.

use ringflow_core::pb;

use crate::summary::JobSummary;

/// What a job's events go to while a command follows it.
///
/// [`follow`] calls [`begin`](Observer::begin) once, then one method per event of the job's
/// stream in the order the driver sent them, and [`finish`](Observer::finish) once at the
/// end, however it came: the job's summary, a signal, or a lost driver. Events an observer
/// does not implement are ignored by the defaults.
///
/// Observers run on the task that reads the stream: a method should return quickly (write a
/// line or a record), never wait for something else.
pub trait Observer {
    /// The job is followed from now on; `job_id` is the id the driver gave it.
    ///
    /// The default does nothing.
    fn begin(&mut self, _job_id: &str) {}

    /// A line for people from the driver: "waiting for 4 executors", "rank 2 is …".
    ///
    /// The default does nothing.
    fn message(&mut self, _line: &str) {}

    /// The job entered `state` (queued, waiting, running, …).
    ///
    /// The default does nothing.
    fn state(&mut self, _state: pb::JobState) {}

    /// Progress within an epoch: rank 0's latest step, loss and throughput, about once a
    /// second.
    ///
    /// The default does nothing.
    fn step(&mut self, _step: &pb::StepProgress) {}

    /// Every rank finished an epoch: its loss, rows, throughput and where the steps' time went.
    ///
    /// The default does nothing.
    fn epoch(&mut self, _epoch: &pb::EpochDone) {}

    /// The test split was evaluated after an epoch while training goes on
    /// (`train.eval_every_epochs`).
    ///
    /// The default does nothing.
    fn test(&mut self, _test: &pb::EpochTest) {}

    /// One rank's timed steps (start and phases of each), as the driver forwards them.
    ///
    /// The default does nothing.
    fn spans(&mut self, _spans: &pb::RankSpans) {}

    /// The job ended with this summary: the last event of a training, evaluation or
    /// prediction job (a benchmark's summary has a shape of its own and does not come here).
    ///
    /// The default does nothing.
    fn summary(&mut self, _summary: &JobSummary) {}

    /// Following the job ended, however: after [`summary`](Observer::summary) when the job's
    /// summary arrived, or at a signal or a lost driver, when it did not.
    ///
    /// Required, because the end is where an observer releases or writes what it holds (the
    /// progress bar clears itself, the timeline writes its trace); one that holds nothing says
    /// so with an empty body.
    fn finish(&mut self);
}

impl<O: Observer + ?Sized> Observer for Box<O> {
    fn begin(&mut self, job_id: &str) {
        (**self).begin(job_id);
    }
    fn message(&mut self, line: &str) {
        (**self).message(line);
    }
    fn state(&mut self, state: pb::JobState) {
        (**self).state(state);
    }
    fn step(&mut self, step: &pb::StepProgress) {
        (**self).step(step);
    }
    fn epoch(&mut self, epoch: &pb::EpochDone) {
        (**self).epoch(epoch);
    }
    fn test(&mut self, test: &pb::EpochTest) {
        (**self).test(test);
    }
    fn spans(&mut self, spans: &pb::RankSpans) {
        (**self).spans(spans);
    }
    fn summary(&mut self, summary: &JobSummary) {
        (**self).summary(summary);
    }
    fn finish(&mut self) {
        (**self).finish();
    }
}

/// Several observers as one: each event goes to each of them, in the order they were added.
#[derive(Default)]
pub struct Observers {
    list: Vec<Box<dyn Observer + Send>>,
}

impl Observers {
    /// No observers yet.
    pub fn new() -> Observers {
        Observers::default()
    }

    /// Adds `observer` after those already there.
    pub fn push(&mut self, observer: impl Observer + Send + 'static) {
        self.list.push(Box::new(observer));
    }

    /// These observers and then `observer`, when there is one.
    pub fn with(mut self, observer: Option<impl Observer + Send + 'static>) -> Observers {
        if let Some(o) = observer {
            self.push(o);
        }
        self
    }

    /// How many observers there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn each(&mut self, mut f: impl FnMut(&mut dyn Observer)) {
        for o in &mut self.list {
            f(o.as_mut());
        }
    }
}

impl Observer for Observers {
    fn begin(&mut self, job_id: &str) {
        self.each(|o| o.begin(job_id));
    }
    fn message(&mut self, line: &str) {
        self.each(|o| o.message(line));
    }
    fn state(&mut self, state: pb::JobState) {
        self.each(|o| o.state(state));
    }
    fn step(&mut self, step: &pb::StepProgress) {
        self.each(|o| o.step(step));
    }
    fn epoch(&mut self, epoch: &pb::EpochDone) {
        self.each(|o| o.epoch(epoch));
    }
    fn test(&mut self, test: &pb::EpochTest) {
        self.each(|o| o.test(test));
    }
    fn spans(&mut self, spans: &pb::RankSpans) {
        self.each(|o| o.spans(spans));
    }
    fn summary(&mut self, summary: &JobSummary) {
        self.each(|o| o.summary(summary));
    }
    fn finish(&mut self) {
        self.each(|o| o.finish());
    }
}
