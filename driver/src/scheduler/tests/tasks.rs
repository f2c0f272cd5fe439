//! Tasks on their way to executors: one that does not arrive fails its job at once naming the
//! executor; a preprocessing too large for a task travels by its length and is served whole.

use ringflow_core::data::Preprocessing;

use super::*;

/// A one-executor training job started on `e1` (host `h1`), its task not yet taken.
fn running(kind: JobKind, now: Instant) -> (Scheduler, String) {
    let mut s = sched();
    s.register(info("e1", "h1", 1), now).unwrap();
    let id = s.submit(kind, now);
    s.tick(now);
    assert_eq!(s.job(&id).unwrap().state, pb::JobState::Running);
    (s, id)
}

fn idle(s: &Scheduler, id: &str) -> bool {
    s.executors()
        .find(|e| e.info.executor_id == id)
        .is_some_and(|e| e.assigned.is_none())
}

#[test]
fn a_task_its_executor_could_not_receive_fails_the_job_naming_it() {
    let now = Instant::now();
    let (mut s, id) = running(train_on("cpu", 1), now);
    assert!(s.take_task("e1", now).is_some());
    let cause = "the reply to its poll for tasks could not be read: decoded message length too \
                 large: found 5151367 bytes,\nthe limit is: 4194304 bytes";
    s.task_not_received("e1", cause, now);
    let job = s.job(&id).unwrap();
    assert_eq!(job.state, pb::JobState::Failed);
    assert_eq!(
        job.error().unwrap(),
        "executor e1 (rank 0) on h1 could not receive its task: the reply to its poll for \
         tasks could not be read: decoded message length too large: found 5151367 bytes, the \
         limit is: 4194304 bytes"
    );
    assert!(idle(&s, "e1"), "the executor is free for the next job");
}

#[test]
fn an_executor_that_asks_again_never_received_its_task() {
    let now = Instant::now();
    let (mut s, id) = running(train_on("cpu", 1), now);
    assert!(s.take_task("e1", now).is_some());
    assert!(s.take_task("e1", now).is_none());
    let job = s.job(&id).unwrap();
    assert_eq!(job.state, pb::JobState::Failed);
    let error = job.error().unwrap();
    assert!(
        error.starts_with(
            "executor e1 (rank 0) on h1 could not receive its task: it asked for a task again"
        ),
        "{error}"
    );
    assert!(idle(&s, "e1"));
}

#[test]
fn a_failed_poll_that_held_no_task_changes_nothing() {
    let now = Instant::now();
    let (mut s, id) = running(train_on("cpu", 1), now);
    // The reply that failed was sent before the job's task was taken.
    s.task_not_received("e1", "connection reset", now);
    s.task_not_received("nobody", "connection reset", now);
    assert_eq!(s.job(&id).unwrap().state, pb::JobState::Running);
    assert!(s.take_task("e1", now).is_some());
    assert_eq!(s.job(&id).unwrap().state, pb::JobState::Running);
}

#[test]
fn a_large_preprocessing_travels_by_its_length_and_is_served_whole() {
    let now = Instant::now();
    let small = train_on("cpu", 1);
    let classes: Vec<String> = (0..20_000).map(|i| format!("{i:0>100}")).collect();
    let quoted: Vec<String> = classes.iter().map(|c| format!("{c:?}")).collect();
    let set = format!("data.label_classes=[{}]", quoted.join(","));
    let large = train_with("cpu", 1, &[&set]);
    let mut kinds = vec![("small", small), ("large", large)];
    for (name, kind) in kinds.drain(..) {
        let (mut s, id) = running(kind, now);
        let task = s.take_task("e1", now).unwrap();
        let data = train_work(&task).data.clone().unwrap();
        let served = s.preprocessing(&id, false).unwrap();
        if name == "small" {
            assert_eq!(
                (data.preprocessing.as_str(), data.preprocessing_bytes),
                ("", 0)
            );
            assert_eq!(&*served, "");
            continue;
        }
        // 2 MB of classes: only the length travels in the task, the whole is served apart.
        assert!(data.preprocessing.is_empty());
        assert_eq!(data.preprocessing_bytes, served.len() as u64);
        assert!(served.len() > ringflow_core::wire::INLINE_PREPROCESSING_BYTES);
        let back: Preprocessing = ringflow_core::wire::payload::decode("f", &served).unwrap();
        assert_eq!(back.classes.unwrap(), classes);
        assert!(ringflow_core::wire::check_task(&task).is_ok());
        // The merged statistics exist only once every rank sent its own.
        assert!(matches!(
            s.preprocessing(&id, true),
            Err(Refusal::Invalid(_))
        ));
        assert!(matches!(
            s.preprocessing("no-such-job", false),
            Err(Refusal::NotFound(_))
        ));
    }
}
