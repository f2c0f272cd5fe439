//! The one loop that reads a job's event stream and hands each event to an observer.

use std::future::Future;

use futures::{Stream, StreamExt};
use ringflow_core::pb::{self, job_event::Event};

use super::observer::Observer;
use crate::summary::JobSummary;

/// How following a job ended, when it did not fail.
#[derive(Debug, PartialEq)]
pub enum Followed<S> {
    /// The job ended: its summary as the driver sent it (a payload; a benchmark's summary has
    /// a shape of its own, so the caller reads it).
    Summary(String),
    /// The `stop` future completed first, with this value (e.g. the signal that arrived).
    Stopped(S),
}

/// Following a job failed before its summary arrived.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// The stream broke: the driver stopped or the connection to it was lost.
    #[error("lost the driver while watching job {job_id}: {message}")]
    LostDriver {
        /// The job followed.
        job_id: String,
        /// What the connection said.
        message: String,
    },
    /// The stream ended without the job's summary.
    #[error("the driver ended job {job_id}'s events without a summary")]
    NoSummary {
        /// The job followed.
        job_id: String,
    },
}

/// Follows job `job_id` on `events` (the driver's `Watch` stream of it) until its summary or
/// until `stop` completes, handing every event to `observer`: [`Observer::begin`] first, then
/// one call per event in stream order, and [`Observer::finish`] at the end, also when the
/// stream fails.
pub async fn follow<E, S>(
    events: E,
    job_id: &str,
    observer: &mut dyn Observer,
    stop: impl Future<Output = S>,
) -> Result<Followed<S>, FollowError>
where
    E: Stream<Item = Result<pb::JobEvent, tonic::Status>>,
{
    observer.begin(job_id);
    let followed = until_the_end(events, job_id, observer, stop).await;
    observer.finish();
    followed
}

async fn until_the_end<E, S>(
    events: E,
    job_id: &str,
    observer: &mut dyn Observer,
    stop: impl Future<Output = S>,
) -> Result<Followed<S>, FollowError>
where
    E: Stream<Item = Result<pb::JobEvent, tonic::Status>>,
{
    let mut events = std::pin::pin!(events);
    let mut stop = std::pin::pin!(stop);
    loop {
        let next = tokio::select! {
            s = &mut stop => return Ok(Followed::Stopped(s)),
            e = events.next() => e,
        };
        let event = match next {
            Some(Ok(e)) => e,
            Some(Err(s)) => {
                return Err(FollowError::LostDriver {
                    job_id: job_id.to_string(),
                    message: s.message().to_string(),
                });
            }
            None => {
                return Err(FollowError::NoSummary {
                    job_id: job_id.to_string(),
                });
            }
        };
        if let Some(text) = event.event.and_then(|e| deliver(observer, e)) {
            return Ok(Followed::Summary(text));
        }
    }
}

/// Hands `event` to the observer's method for it; returns the summary's payload when it is the
/// job's last event.
fn deliver(observer: &mut dyn Observer, event: Event) -> Option<String> {
    match event {
        Event::Message(m) => observer.message(&m),
        Event::State(s) => {
            if let Ok(state) = pb::JobState::try_from(s) {
                observer.state(state);
            }
        }
        Event::Step(s) => observer.step(&s),
        Event::Epoch(e) => observer.epoch(&e),
        Event::Test(t) => observer.test(&t),
        Event::Spans(s) => observer.spans(&s),
        Event::Summary(text) => {
            if let Ok(summary) = JobSummary::from_payload(&text) {
                observer.summary(&summary);
            }
            return Some(text);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::observe::observer::Observers;
    use crate::progress::JobProgress;

    type Log = Arc<Mutex<Vec<String>>>;

    /// Writes down every call it gets.
    struct Recorder(Log);

    impl Recorder {
        fn note(&self, what: String) {
            self.0.lock().unwrap().push(what);
        }
    }

    impl Observer for Recorder {
        fn begin(&mut self, job_id: &str) {
            self.note(format!("begin {job_id}"));
        }
        fn message(&mut self, line: &str) {
            self.note(format!("message {line}"));
        }
        fn state(&mut self, state: pb::JobState) {
            self.note(format!("state {}", state.as_str_name()));
        }
        fn step(&mut self, step: &pb::StepProgress) {
            self.note(format!("step {}", step.step));
        }
        fn epoch(&mut self, epoch: &pb::EpochDone) {
            self.note(format!("epoch {}", epoch.epoch));
        }
        fn test(&mut self, test: &pb::EpochTest) {
            self.note(format!("test {}", test.epoch));
        }
        fn spans(&mut self, spans: &pb::RankSpans) {
            self.note(format!("spans {}", spans.rank));
        }
        fn summary(&mut self, summary: &JobSummary) {
            self.note(format!("summary {}", summary.job_id));
        }
        fn finish(&mut self) {
            self.note("finish".into());
        }
    }

    /// Implements one event (and the required end) only.
    struct EpochCounter(Log);

    impl Observer for EpochCounter {
        fn epoch(&mut self, epoch: &pb::EpochDone) {
            self.0
                .lock()
                .unwrap()
                .push(format!("epoch {}", epoch.epoch));
        }
        fn finish(&mut self) {
            self.0.lock().unwrap().push("finish".into());
        }
    }

    fn summary_json() -> String {
        let end = crate::summary::JobEnd {
            job: "j",
            job_id: "j-1",
            executors: 1,
            wall_s: 1.0,
            error: None,
            cancelled: false,
        };
        let s = JobSummary::new(end, true, &JobProgress::new(1));
        ringflow_core::wire::payload::encode(&s)
    }

    /// Every kind of event once (epochs twice), then the summary, then an event that must not
    /// be delivered.
    fn events() -> Vec<Result<pb::JobEvent, tonic::Status>> {
        let epoch = |epoch| {
            Event::Epoch(pb::EpochDone {
                epoch,
                ..Default::default()
            })
        };
        [
            Event::Message("waiting".into()),
            Event::State(pb::JobState::Running as i32),
            Event::Step(pb::StepProgress {
                step: 3,
                ..Default::default()
            }),
            epoch(0),
            Event::Test(pb::EpochTest::default()),
            Event::Spans(pb::RankSpans {
                rank: 1,
                ..Default::default()
            }),
            epoch(1),
            Event::Summary(summary_json()),
            Event::Message("after the end".into()),
        ]
        .into_iter()
        .map(|e| {
            Ok(pb::JobEvent {
                event: Some(e),
                ..Default::default()
            })
        })
        .collect()
    }

    fn run<S>(
        events: impl Stream<Item = Result<pb::JobEvent, tonic::Status>>,
        observer: &mut dyn Observer,
        stop: impl Future<Output = S>,
    ) -> Result<Followed<S>, FollowError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(follow(events, "j-1", observer, stop))
    }

    fn never() -> impl Future<Output = ()> {
        std::future::pending()
    }

    fn taken(log: &Log) -> Vec<String> {
        std::mem::take(&mut *log.lock().unwrap())
    }

    #[test]
    fn an_observer_gets_only_the_events_it_implements() {
        let log = Log::default();
        let followed = run(
            futures::stream::iter(events()),
            &mut EpochCounter(log.clone()),
            never(),
        );
        assert_eq!(followed.unwrap(), Followed::Summary(summary_json()));
        assert_eq!(taken(&log), ["epoch 0", "epoch 1", "finish"]);
    }

    #[test]
    fn every_observer_of_a_list_gets_every_event_in_order() {
        let (first, second) = (Log::default(), Log::default());
        let mut list = Observers::new();
        list.push(Recorder(first.clone()));
        list.push(Recorder(second.clone()));
        run(futures::stream::iter(events()), &mut list, never()).unwrap();
        let want = [
            "begin j-1",
            "message waiting",
            "state JOB_STATE_RUNNING",
            "step 3",
            "epoch 0",
            "test 0",
            "spans 1",
            "epoch 1",
            "summary j-1",
            "finish",
        ];
        assert_eq!(taken(&first), want);
        assert_eq!(taken(&second), want);
    }

    #[test]
    fn a_summary_of_another_shape_ends_the_job_without_reaching_observers() {
        let log = Log::default();
        let bench = &ringflow_core::wire::payload::encode(&crate::summary::BenchSummary {
            job_id: "j-1".into(),
            status: "succeeded".into(),
            error: None,
            executors: 1,
            floats: 4,
            seconds: vec![0.5],
        });
        let stream = futures::stream::iter([Ok(pb::JobEvent {
            event: Some(Event::Summary(bench.clone())),
            ..Default::default()
        })]);
        let followed = run(stream, &mut Recorder(log.clone()), never());
        assert_eq!(followed.unwrap(), Followed::Summary(bench.clone()));
        assert_eq!(taken(&log), ["begin j-1", "finish"]);
    }

    #[test]
    fn a_stream_that_ends_or_breaks_early_is_an_error_after_finish() {
        let log = Log::default();
        let mut few = events();
        few.truncate(2);
        let e = run(
            futures::stream::iter(few),
            &mut Recorder(log.clone()),
            never(),
        );
        assert_eq!(
            e.unwrap_err().to_string(),
            "the driver ended job j-1's events without a summary"
        );
        assert_eq!(taken(&log).last().map(String::as_str), Some("finish"));

        let broken = futures::stream::iter([Err(tonic::Status::unavailable("gone"))]);
        let e = run(broken, &mut Recorder(log.clone()), never());
        assert_eq!(
            e.unwrap_err().to_string(),
            "lost the driver while watching job j-1: gone"
        );
        assert_eq!(taken(&log), ["begin j-1", "finish"]);
    }

    #[test]
    fn stopping_ends_the_following_with_the_stop_value() {
        let log = Log::default();
        let followed = run(
            futures::stream::pending(),
            &mut Recorder(log.clone()),
            async { 130 },
        );
        assert_eq!(followed.unwrap(), Followed::Stopped(130));
        assert_eq!(taken(&log), ["begin j-1", "finish"]);
    }
}
