//! Unit tests of the scheduler: placement, health, recovery and the jobs' lifecycle.

use std::path::Path;

use ringflow_core::spec::{JobSpec, Override, ResolvedSpec};

use super::*;
use crate::planner::JobPlan;

mod devices;
mod tasks;

/// A task's header (every task the driver hands out has one).
pub(super) fn header(task: &pb::Task) -> &pb::TaskHeader {
    task.header.as_ref().expect("a task has a header")
}

/// A training task's work.
pub(super) fn train_work(task: &pb::Task) -> &pb::TrainWork {
    match &task.work {
        Some(pb::task::Work::Train(work)) => work,
        other => panic!("not a training task: {other:?}"),
    }
}

pub(crate) fn info(id: &str, host: &str, port: u16) -> pb::ExecutorInfo {
    pb::ExecutorInfo {
        executor_id: id.into(),
        host: host.into(),
        ring_address: format!("{host}:{port}"),
        cores: 1,
        devices: vec!["cpu".into()],
        protocol_version: ringflow_core::PROTOCOL_VERSION,
        version: "test".into(),
        pid: 1,
        ..Default::default()
    }
}

pub(super) fn sched() -> Scheduler {
    Scheduler::new(SchedulerConfig::default(), ModelRegistry::default()).without_event_logs()
}

pub(super) fn bench(executors: usize) -> JobKind {
    JobKind::Bench {
        executors,
        spec: pb::BenchSpec {
            floats: 10,
            warmup: 0,
            iters: 1,
            check: false,
            shared_memory: false,
        },
    }
}

#[test]
fn another_protocol_version_is_refused_naming_both() {
    let mut s = sched();
    let mut old = info("e1", "h1", 1);
    old.protocol_version = 99;
    let Err(Refusal::Version(msg)) = s.register(old, Instant::now()) else {
        panic!("a version mismatch was accepted");
    };
    assert!(msg.contains("version 99"), "{msg}");
    assert!(
        msg.contains(&format!("version {}", ringflow_core::PROTOCOL_VERSION)),
        "{msg}"
    );
    assert_eq!(s.executors().count(), 0);
}

#[test]
fn a_heartbeat_registers_an_executor_a_restarted_driver_never_saw() {
    let mut s = sched();
    let cancel = s
        .heartbeat(info("e1", "h1", 1), "", Instant::now())
        .unwrap();
    assert!(!cancel);
    assert_eq!(s.executors().count(), 1);
    // A heartbeat about a job this driver does not know tells the executor to stop it.
    assert!(
        s.heartbeat(info("e1", "h1", 1), "job-from-before", Instant::now())
            .unwrap()
    );
}

#[test]
fn ranks_follow_host_and_address_whatever_the_registration_order() {
    let now = Instant::now();
    let mut orders = Vec::new();
    for order in [["a", "b", "c"], ["c", "a", "b"]] {
        let mut s = sched();
        for (i, name) in order.iter().enumerate() {
            s.register(
                info(
                    &format!("exec-{name}"),
                    &format!("host-{name}"),
                    10 + i as u16,
                ),
                now,
            )
            .unwrap();
        }
        let id = s.submit(bench(3), now);
        s.tick(now);
        let ranks: Vec<String> = s
            .job(&id)
            .unwrap()
            .ranks()
            .iter()
            .map(|e| e.executor_id.clone())
            .collect();
        orders.push(ranks);
    }
    assert_eq!(orders[0], ["exec-a", "exec-b", "exec-c"]);
    assert_eq!(orders[0], orders[1]);
}

#[test]
fn waiting_too_long_fails_naming_who_registered() {
    let start = Instant::now();
    let mut s = sched();
    s.register(info("exec-1", "host-1", 5), start).unwrap();
    let id = s.submit(bench(2), start);
    s.tick(start);
    assert_eq!(s.job(&id).unwrap().state, pb::JobState::Waiting);
    let later = start + Duration::from_secs(61);
    s.heartbeat(info("exec-1", "host-1", 5), "", later).unwrap();
    s.tick(later);
    let job = s.job(&id).unwrap();
    assert_eq!(job.state, pb::JobState::Failed);
    let err = job.error().unwrap();
    assert!(
        err.contains("2 executors, but 1 registered: exec-1 from host-1"),
        "{err}"
    );
}

#[test]
fn a_silent_executor_fails_its_job_by_name() {
    let start = Instant::now();
    let mut s = sched();
    s.register(info("exec-1", "host-1", 5), start).unwrap();
    s.register(info("exec-2", "host-2", 6), start).unwrap();
    let id = s.submit(bench(2), start);
    s.tick(start);
    assert!(
        s.take_task("exec-1", Instant::now()).is_some()
            && s.take_task("exec-2", Instant::now()).is_some()
    );
    let later = start + Duration::from_secs(20);
    s.heartbeat(info("exec-1", "host-1", 5), &id, later)
        .unwrap();
    s.tick(later);
    let job = s.job(&id).unwrap();
    assert_eq!(job.state, pb::JobState::Failed);
    let err = job.error().unwrap();
    assert!(err.contains("exec-2 (rank 1) on host-2"), "{err}");
    assert_eq!(s.executors().count(), 1);
}

#[test]
fn planning_refuses_unknown_model_kinds() {
    let text = r#"
[data]
train = "x.parquet"
features = ["a"]
label = "y"
[model]
kind = "transformer"
"#;
    let spec = JobSpec::parse(text, Path::new("j.toml"), &[]).unwrap();
    let err = Scheduler::plan_job(
        s_registry(),
        &ringflow_core::wire::payload::encode(&spec),
        false,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("model.kind \"transformer\" is not known"),
        "{err}"
    );
}

/// A planned training job on `executors` executors with `cluster.device = device` (the plan
/// is made up: no data is read).
pub(crate) fn train_on(device: &str, executors: usize) -> JobKind {
    train_with(device, executors, &[])
}

/// [`train_on`]'s job with the `--set` overrides `sets` (`"train.epochs=1"`) applied to its
/// spec before it is planned.
pub(crate) fn train_with(device: &str, executors: usize, sets: &[&str]) -> JobKind {
    let text = format!(
        r#"
[data]
train = "x.parquet"
features = ["a"]
label = "y"
[model]
kind = "mlp"
layers = [1, 2]
[cluster]
executors = {executors}
device = "{device}"
"#
    );
    let sets: Vec<Override> = sets.iter().map(|s| s.parse().unwrap()).collect();
    let spec = JobSpec::parse(&text, Path::new("j.toml"), &sets).unwrap();
    let train = (0..4)
        .map(|i| crate::planner::split::RowGroup {
            path: "x.parquet".into(),
            index: i,
            rows: 10,
            file_row_start: 10 * u64::from(i),
            bytes: 400,
            after_sql: false,
        })
        .collect();
    JobKind::Train(Box::new(JobPlan {
        spec: ResolvedSpec::as_given(spec),
        model: ringflow_ml::nn::ModelShape::flat(1, 2),
        train,
        test: Vec::new(),
        input_columns: vec!["a".into(), "y".into()],
        string_label: false,
        sequence: None,
        files: vec!["x.parquet".into()],
        resume: None,
        written: None,
        footprint: Some(ringflow_ml::nn::ModelFootprint::linear_stack(
            &[1, 2],
            false,
        )),
        summary: None,
        warnings: Vec::new(),
        notes: Vec::new(),
        test_tokens: None,
    }))
}

#[test]
fn a_training_job_writes_its_event_log_and_forwards_step_spans() {
    let dir = tempfile::tempdir().unwrap();
    let now = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default(), ModelRegistry::default());
    s.register(info("e1", "h1", 1), now).unwrap();
    s.register(info("e2", "h1", 2), now).unwrap();
    let checkpoint_dir = format!("cluster.checkpoint_dir={}", dir.path().display());
    let kind = train_with("cpu", 2, &[&checkpoint_dir, "train.epochs=1"]);
    let id = s.submit(kind, now);
    s.tick(now);
    assert!(
        s.take_task("e1", Instant::now()).is_some() && s.take_task("e2", Instant::now()).is_some()
    );
    s.register(info("e3", "h2", 1), now).unwrap();
    report_one_epoch_and_finish(&mut s, &id, now);
    let job = s.job(&id).unwrap();
    assert_eq!(job.state, pb::JobState::Succeeded);
    let (events, _) = job.events_since(0);
    let spans: Vec<(u32, String)> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(pb::job_event::Event::Spans(s)) => Some((s.rank, s.executor_id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(spans, [(0, "e1".to_string()), (1, "e2".to_string())]);

    let (_, records) = crate::events::read(dir.path().to_str().unwrap()).unwrap();
    let names: Vec<&str> = records.iter().map(|r| r.event.name()).collect();
    assert_eq!(
        names,
        [
            "submitted",
            "started",
            "executor_registered",
            "epoch_end",
            "checkpoint",
            "finished"
        ]
    );
    assert!(records.iter().all(|r| r.job_id == id));
    let crate::events::Event::Started { ranks } = &records[1].event else {
        unreachable!()
    };
    assert_eq!(ranks[1].executor_id, "e2");
    let crate::events::Event::Finished { state, summary, .. } = &records[5].event else {
        unreachable!()
    };
    assert_eq!(state, "succeeded");
    assert_eq!(summary.as_ref().unwrap()["job_id"], id.as_str());
}

/// Both ranks of job `id` report epoch 0 (with one step span each), rank 0 its checkpoint, and
/// both finish.
fn report_one_epoch_and_finish(s: &mut Scheduler, id: &str, now: Instant) {
    for rank in 0..2u32 {
        let span = pb::StepSpan {
            epoch: 0,
            step: 0,
            start_unix_s: 1.0,
            ..Default::default()
        };
        let epoch = pb::EpochReport {
            epoch: 0,
            steps: 1,
            samples: 10,
            loss: 0.5,
            seconds: 1.0,
            phases: Some(pb::PhaseTimes::default()),
            spans: vec![span],
            ..Default::default()
        };
        s.report(
            pb::ReportRequest {
                job_id: id.to_string(),
                rank,
                report: Some(pb::report_request::Report::Epoch(epoch)),
                generation: 0,
            },
            now,
        )
        .unwrap();
    }
    s.report(
        pb::ReportRequest {
            job_id: id.to_string(),
            rank: 0,
            report: Some(pb::report_request::Report::Checkpoint(
                pb::CheckpointReport {
                    epochs_done: 1,
                    step: 1,
                    path: "ckpt".into(),
                    seconds: 0.1,
                },
            )),
            generation: 0,
        },
        now,
    )
    .unwrap();
    for (rank, e) in [(0u32, "e1"), (1, "e2")] {
        s.finish_task(
            pb::FinishTaskRequest {
                job_id: id.to_string(),
                rank,
                executor_id: e.into(),
                result: Some(pb::finish_task_request::Result::Outcome(
                    pb::TaskOutcome::default(),
                )),
                communication: false,
            },
            now,
        )
        .unwrap();
    }
}

/// A training job on `device` with 2 ranks that survives lost executors (`min_executors = 1`)
/// and grows up to `max` executors.
pub(super) fn elastic_on(device: &str, max: usize) -> JobKind {
    let max = format!("cluster.max_executors={max}");
    train_with(device, 2, &["cluster.min_executors=1", &max])
}

/// Submits `kind` at `now` and hands its tasks to `executors`; returns the job's id.
fn start(s: &mut Scheduler, kind: JobKind, executors: &[&str], now: Instant) -> String {
    let id = s.submit(kind, now);
    s.tick(now);
    for e in executors {
        assert!(s.take_task(e, Instant::now()).is_some(), "no task for {e}");
    }
    id
}

/// An elastic job (`min_executors = 1`) logging into `dir`, running on executors e1 and e2;
/// returns the scheduler, the job's id and when it started.
fn elastic_pair_running(dir: &Path) -> (Scheduler, String, Instant) {
    let start = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig::default(), ModelRegistry::default());
    s.register(info("e1", "h1", 1), start).unwrap();
    s.register(info("e2", "h2", 1), start).unwrap();
    let checkpoint_dir = format!("cluster.checkpoint_dir={}", dir.display());
    let kind = train_with(
        "cpu",
        2,
        &[
            "cluster.min_executors=1",
            "cluster.max_executors=2",
            &checkpoint_dir,
        ],
    );
    let id = self::start(&mut s, kind, &["e1", "e2"], start);
    (s, id, start)
}

/// A ring that broke with no executor lost (a rank stopped for less than the heartbeat
/// timeout) is logged with its cause, not as a re-forming at an epoch boundary.
#[test]
fn a_ring_that_broke_without_a_loss_is_logged_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, id, start) = elastic_pair_running(dir.path());
    let ask = |executor: &str, rank: u32, error: &str| pb::RecoverRequest {
        job_id: id.clone(),
        executor_id: executor.into(),
        rank,
        generation: 0,
        error: error.into(),
        wait_ms: 0,
        ..Default::default()
    };
    let later = start + Duration::from_secs(1);
    let timed_out = "rank 1 sent nothing for 4 s";
    assert!(
        s.recover(&ask("e1", 0, timed_out), later)
            .unwrap()
            .is_none()
    );
    let task = s.recover(&ask("e2", 1, "connection reset"), later).unwrap();
    assert_eq!(header(&task.unwrap()).ring.len(), 2);
    s.cancel(&id, later).unwrap();

    let (_, records) = crate::events::read(dir.path().to_str().unwrap()).unwrap();
    let recovery = records.iter().find(|r| r.event.name() == "recovery");
    let Some(crate::events::Event::Recovery {
        world_before,
        world_after,
        lost,
        cause,
        ..
    }) = recovery.map(|r| &r.event)
    else {
        panic!("no recovery in {records:?}")
    };
    assert_eq!((*world_before, *world_after), (2, 2));
    assert!(lost.is_empty(), "{lost:?}");
    assert_eq!(cause, timed_out);
}

#[test]
fn an_elastic_job_logs_the_executor_it_lost_and_its_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, id, start) = elastic_pair_running(dir.path());
    let later = start + Duration::from_secs(20);
    s.heartbeat(info("e1", "h1", 1), &id, later).unwrap();
    s.tick(later);
    let req = pb::RecoverRequest {
        job_id: id.clone(),
        executor_id: "e1".into(),
        rank: 0,
        generation: 0,
        error: "connection reset".into(),
        wait_ms: 0,
        ..Default::default()
    };
    let task = s.recover(&req, later).unwrap().unwrap();
    assert_eq!(header(&task).ring.len(), 1);
    s.cancel(&id, later).unwrap();

    let (_, records) = crate::events::read(dir.path().to_str().unwrap()).unwrap();
    let names: Vec<&str> = records.iter().map(|r| r.event.name()).collect();
    assert_eq!(
        names,
        [
            "submitted",
            "started",
            "executor_lost",
            "recovery",
            "finished"
        ]
    );
    let crate::events::Event::ExecutorLost {
        rank, executor_id, ..
    } = &records[2].event
    else {
        unreachable!()
    };
    assert_eq!((*rank, executor_id.as_str()), (1, "e2"));
    let crate::events::Event::Recovery {
        generation,
        world_before,
        world_after,
        lost,
        cause,
        ..
    } = &records[3].event
    else {
        unreachable!()
    };
    assert_eq!((*generation, *world_before, *world_after), (1, 2, 1));
    assert_eq!(lost, &["e2".to_string()]);
    // The root cause, not the survivor's broken ring.
    assert_eq!(
        cause,
        "executor e2 (rank 1) on h2 stopped sending heartbeats 20 s ago (killed, hung, or cut off)"
    );
    let crate::events::Event::Finished { state, .. } = &records[4].event else {
        unreachable!()
    };
    assert_eq!(state, "cancelled");
}

/// A report from a ring that has been re-formed since (a rank stopped, then continued) is not
/// counted for the rank that holds its number now.
#[test]
fn a_report_from_an_older_ring_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, id, start) = elastic_pair_running(dir.path());
    let epoch_end = |rank: u32, generation: u32| pb::ReportRequest {
        job_id: id.clone(),
        rank,
        report: Some(pb::report_request::Report::Epoch(pb::EpochReport {
            epoch: 0,
            steps: 1,
            samples: 10,
            ..Default::default()
        })),
        generation,
    };
    let ask = |executor: &str, rank: u32| pb::RecoverRequest {
        job_id: id.clone(),
        executor_id: executor.into(),
        rank,
        error: "connection reset".into(),
        ..Default::default()
    };
    s.report(epoch_end(1, 0), start).unwrap();
    assert!(s.recover(&ask("e1", 0), start).unwrap().is_none());
    assert!(s.recover(&ask("e2", 1), start).unwrap().is_some());
    s.report(epoch_end(0, 1), start).unwrap();
    // Rank 1's report from generation 0 arrives late.
    s.report(epoch_end(1, 0), start).unwrap();
    assert_eq!(s.job(&id).unwrap().epochs_done(), 0);
    s.report(epoch_end(1, 1), start).unwrap();
    assert_eq!(s.job(&id).unwrap().epochs_done(), 1);
}

/// A joiner whose first ring breaks before it received the job's state goes after the
/// executors that hold it, so it never becomes rank 0; with none of them left, the job fails.
#[test]
fn a_joiner_without_the_jobs_state_is_never_rank_0() {
    let start = Instant::now();
    let mut s = sched();
    s.register(info("e1", "h1", 1), start).unwrap();
    s.register(info("e2", "h2", 1), start).unwrap();
    let id = self::start(&mut s, elastic_on("cpu", 3), &["e1", "e2"], start);
    // An idle executor on a host that sorts first joins when the ring is re-formed.
    s.register(info("a0", "h0", 1), start).unwrap();
    let ask =
        |executor: &str, rank: u32, generation: u32, awaiting_state: bool| pb::RecoverRequest {
            job_id: id.clone(),
            executor_id: executor.into(),
            rank,
            generation,
            error: "connection reset".into(),
            awaiting_state,
            ..Default::default()
        };
    let ranks = |s: &Scheduler| -> Vec<String> {
        let job = s.job(&id).unwrap();
        job.ranks().iter().map(|e| e.executor_id.clone()).collect()
    };
    assert_eq!(s.recover(&ask("e1", 0, 0, false), start), Ok(None));
    assert!(s.recover(&ask("e2", 1, 0, false), start).unwrap().is_some());
    assert_eq!(ranks(&s), ["e1", "e2", "a0"]);
    assert!(train_work(&s.take_task("a0", Instant::now()).unwrap()).join);
    // The new ring breaks while the joiner connects: it asks without the job's state.
    assert_eq!(s.recover(&ask("a0", 2, 1, true), start), Ok(None));
    assert_eq!(s.recover(&ask("e1", 0, 1, false), start), Ok(None));
    assert!(s.recover(&ask("e2", 1, 1, false), start).unwrap().is_some());
    assert_eq!(ranks(&s), ["e1", "e2", "a0"]);
    // Both executors that hold the state are lost before the joiner received it.
    let later = start + Duration::from_secs(20);
    s.heartbeat(info("a0", "h0", 1), &id, later).unwrap();
    s.tick(later);
    let refused = s
        .recover(&ask("a0", 2, 2, true), later)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("every executor that held the job's state was lost"),
        "{refused}"
    );
    assert_eq!(s.job(&id).unwrap().state, pb::JobState::Failed);
}

#[test]
fn job_ids_name_the_time_and_differ_between_drivers() {
    let mut a = sched();
    let mut b = sched();
    let (a1, a2, b1) = (a.new_job_id("m"), a.new_job_id("m"), b.new_job_id("m"));
    for (id, n) in [(&a1, "0001"), (&a2, "0002"), (&b1, "0001")] {
        let parts: Vec<&str> = id.split('-').collect();
        assert_eq!(parts.len(), 4, "{id}");
        assert_eq!(parts[0], "m");
        assert!(parts[1].len() == 14 && parts[1].starts_with("20"), "{id}");
        assert_eq!(parts[2].len(), 4, "{id}");
        assert_eq!(parts[3], n, "{id}");
    }
    // Two fresh drivers never number alike: their tags differ.
    assert_ne!(a1, b1);
    assert_eq!(
        a1.split('-').nth(2),
        a2.split('-').nth(2),
        "one tag per driver"
    );
}

#[test]
fn a_job_holds_its_lock_until_it_ends_and_fails_if_it_loses_it() {
    use crate::outputs::{DirLock, LOCK_FILE, LockOwner, LockTiming};
    let timing = LockTiming {
        refresh_every: Duration::from_millis(50),
        stale_after: Duration::from_secs(60),
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let file = dir.path().join(LOCK_FILE);
    let now = Instant::now();
    let mut s = sched();
    let id = s.new_job_id("lock");
    let lock = DirLock::acquire("cluster.checkpoint_dir", &d, &id, timing).unwrap();
    let id = s.submit_as(id, train_on("cpu", 1), Some(lock), now);
    assert!(file.exists());
    s.cancel(&id, now).unwrap();
    assert!(!file.exists(), "an ended job releases its lock");

    let id = s.new_job_id("lock");
    let lock = DirLock::acquire("cluster.checkpoint_dir", &d, &id, timing).unwrap();
    let id = s.submit_as(id, train_on("cpu", 1), Some(lock), now);
    let mut thief = LockOwner::this_process("thief-1");
    thief.host = "another-host.invalid".into();
    std::fs::write(&file, serde_json::to_vec(&thief).unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.job(&id).unwrap().is_finished() {
        assert!(Instant::now() < deadline, "the loss was not noticed");
        std::thread::sleep(Duration::from_millis(20));
        s.tick(Instant::now());
    }
    let job = s.job(&id).unwrap();
    assert_eq!(job.state, pb::JobState::Failed);
    let err = job.error().unwrap();
    assert!(
        err.contains(&format!(
            "lost its lock on cluster.checkpoint_dir {d}: job thief-1"
        )),
        "{err}"
    );
    assert!(file.exists(), "the other job's lock stays");
}

fn s_registry() -> &'static ModelRegistry {
    static REGISTRY: std::sync::OnceLock<ModelRegistry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(ModelRegistry::default)
}
