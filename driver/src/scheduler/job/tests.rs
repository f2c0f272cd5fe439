//! Unit tests of one [`Job`]'s lifecycle and membership, on a clock the tests hold: every
//! instant is `t0` plus what the test says.

use std::time::{Duration, Instant};

use ringflow_core::pb::{self, JobState};

use super::{Job, JobKind};
use crate::error::JobError;
use crate::scheduler::tests::{bench, elastic_on, header, info, train_on, train_work};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Every message of `job`, in order.
fn messages(job: &Job) -> Vec<String> {
    job.events()
        .iter()
        .filter_map(|e| match &e.event {
            Some(pb::job_event::Event::Message(m)) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

/// How many summaries `job` sent (one when it has ended).
fn summaries(job: &Job) -> usize {
    job.events()
        .iter()
        .filter(|e| matches!(e.event, Some(pb::job_event::Event::Summary(_))))
        .count()
}

/// The executor ids of `job`'s ranks, in rank order.
fn ranks(job: &Job) -> Vec<&str> {
    job.ranks().iter().map(|e| e.executor_id.as_str()).collect()
}

/// A request of `executor` at `rank` of ring `generation` to recover.
fn ask(
    job: &Job,
    executor: &str,
    rank: u32,
    generation: u32,
    awaiting: bool,
) -> pb::RecoverRequest {
    pb::RecoverRequest {
        job_id: job.id.clone(),
        executor_id: executor.into(),
        rank,
        generation,
        error: format!("{executor}: connection reset"),
        awaiting_state: awaiting,
        ..Default::default()
    }
}

/// An elastic job (`min_executors = 1`, growing up to `max`) started at `t0` on `executors`,
/// ranks in the order given; each executor is on a host of its own name.
fn elastic(max: usize, executors: &[&str], t0: Instant) -> Job {
    let mut job = Job::new("job-1".into(), elastic_on("cpu", max), t0);
    let infos = executors
        .iter()
        .map(|e| info(e, &format!("h-{e}"), 1))
        .collect();
    job.start(infos, t0);
    job
}

#[test]
fn start_assigns_ranks_a_secret_and_the_first_generation() {
    let t0 = Instant::now();
    let mut job = Job::new("job-1".into(), train_on("cpu", 2), t0);
    assert_eq!(job.state, JobState::Waiting);
    assert!(job.ranks().is_empty());
    assert_eq!(job.secret(), [0; 32], "no ring, no secret");
    job.start(vec![info("e2", "h1", 2), info("e1", "h1", 1)], t0 + secs(3));
    assert_eq!(job.state, JobState::Running);
    // The ranks are in the order the scheduler chose them.
    assert_eq!(ranks(&job), ["e2", "e1"]);
    assert_eq!(job.generation(), 0);
    assert_ne!(job.secret(), [0; 32], "the ring has a secret");
    let said = messages(&job);
    assert!(
        said.contains(&"rank 0: executor e2 on h1 (ring h1:2)".to_string()),
        "{said:?}"
    );
}

#[test]
fn a_task_carries_its_rank_the_ring_and_the_job_s_secret() {
    let t0 = Instant::now();
    let mut job = Job::new("job-1".into(), train_on("cpu", 2), t0);
    job.start(vec![info("e1", "h1", 1), info("e2", "h2", 1)], t0);
    let task = job.task_for(1);
    let header = header(&task);
    assert_eq!(header.job_id, "job-1");
    assert_eq!(header.rank, 1);
    assert_eq!(header.ring, ["h1:1", "h2:1"]);
    assert_eq!(header.generation, 0);
    assert_eq!(header.secret, job.secret());
    let train = train_work(&task);
    // 40 rows over 2 ranks, in batches of the default size: one step each.
    assert_eq!(train.steps_per_epoch, 1);
    assert_eq!(
        header.ring_timeout_ms,
        job.plan().unwrap().spec.cluster.comm_timeout_s * 1000
    );
    assert!(!train.join && !train.elastic);

    let mut bench_job = Job::new("bench-1".into(), bench(1), t0);
    bench_job.start(vec![info("e1", "h1", 1)], t0);
    let task = bench_job.task_for(0);
    let Some(pb::task::Work::Bench(spec)) = task.work else {
        panic!("not a benchmark task: {task:?}");
    };
    assert_eq!(spec.floats, 10);
}

#[test]
fn failing_ends_the_job_once_at_the_time_given() {
    let t0 = Instant::now();
    let mut job = Job::new("job-1".into(), bench(2), t0);
    assert_eq!(job.ended(), None);
    assert_eq!(job.age(t0 + secs(2)), 2.0, "a job ages until it ends");
    job.fail(JobError::NoResult("rank 0".into()), t0 + secs(3));
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.error(), Some("rank 0 ended without a result"));
    assert_eq!(job.ended(), Some(t0 + secs(3)));
    assert_eq!(job.age(t0 + secs(100)), 3.0, "an ended job ages no more");
    // A later failure is a consequence: logged, never the job's error.
    job.fail(JobError::LockLost("taken over".into()), t0 + secs(4));
    job.cancel(t0 + secs(5));
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.error(), Some("rank 0 ended without a result"));
    assert_eq!(job.ended(), Some(t0 + secs(3)));
    assert_eq!(summaries(&job), 1);
}

#[test]
fn cancelling_ends_the_job_once_without_an_error() {
    let t0 = Instant::now();
    let mut job = Job::new("job-1".into(), bench(2), t0);
    job.cancel(t0 + secs(1));
    assert_eq!(job.state, JobState::Cancelled);
    assert_eq!(job.error(), None);
    assert_eq!(job.ended(), Some(t0 + secs(1)));
    job.cancel(t0 + secs(2));
    job.fail(JobError::NoResult("rank 0".into()), t0 + secs(2));
    assert_eq!(job.state, JobState::Cancelled);
    assert_eq!(job.error(), None);
    let cancelled = messages(&job).iter().filter(|m| *m == "cancelled").count();
    assert_eq!(cancelled, 1);
    assert_eq!(summaries(&job), 1);
}

#[test]
fn the_job_succeeds_once_every_rank_of_the_ring_has_finished() {
    let t0 = Instant::now();
    let mut job = Job::new("job-1".into(), bench(2), t0);
    job.start(vec![info("e1", "h1", 1), info("e2", "h2", 1)], t0);
    let done = || {
        Some(pb::finish_task_request::Result::Bench(
            pb::BenchResult::default(),
        ))
    };
    // The end of an executor that does not hold the rank is ignored.
    job.finish_rank(0, "e2", done(), false, "rank 0", t0 + secs(1));
    job.finish_rank(1, "e2", done(), false, "rank 1", t0 + secs(1));
    assert_eq!(job.state, JobState::Running);
    job.finish_rank(0, "e1", done(), false, "rank 0", t0 + secs(2));
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.ended(), Some(t0 + secs(2)));
}

#[test]
fn a_lost_rank_is_recovered_with_state_holders_first_then_joiners() {
    let t0 = Instant::now();
    // a0 joined the ring before and never received the job's state; it sorts first.
    let mut job = elastic(3, &["e1", "e2", "a0"], t0);
    job.rank_lost(1, "executor e2 died".into(), t0 + secs(5));
    assert!(job.is_recovering());
    assert_eq!(job.state, JobState::Running);
    assert_eq!(
        job.recover(&ask(&job, "a0", 2, 0, true), 1, vec![], t0 + secs(6)),
        Ok(None)
    );
    // The last survivor to ask settles the ring; an idle executor joins after the survivors.
    let idle = vec![info("a1", "h-a1", 1)];
    let task = job
        .recover(&ask(&job, "e1", 0, 0, false), 1, idle, t0 + secs(7))
        .unwrap()
        .expect("the ring is re-formed");
    assert_eq!(ranks(&job), ["e1", "a0", "a1"]);
    assert_eq!((header(&task).rank, header(&task).generation), (0, 1));
    assert_eq!(header(&task).ring, ["h-e1:1", "h-a0:1", "h-a1:1"]);
    assert!(!job.is_recovering());
    assert_eq!(job.generation(), 1);
    assert_eq!(job.recoveries(), (1, 1));
    assert!(train_work(&job.task_for(2)).join, "the idle executor joins");
    assert!(
        !train_work(&job.task_for(1)).join,
        "a0 was in the ring before"
    );
    let said = messages(&job);
    assert!(
        said.contains(
            &"recovery 1: the ring is re-formed with 3 executors 2.0 s after it broke (executor \
              e2 died); the epoch in progress restarts from its beginning"
                .to_string()
        ),
        "{said:?}"
    );
    // a0 asked before the ring was re-formed: its next request gets its new rank.
    let again = job.recover(&ask(&job, "a0", 2, 0, true), 1, vec![], t0 + secs(8));
    assert_eq!(again.unwrap().map(|t| header(&t).rank), Some(1));
    // e2, lost, is no longer in the ring.
    let gone = job.recover(&ask(&job, "e2", 1, 0, false), 1, vec![], t0 + secs(8));
    assert_eq!(gone, Err(JobError::LeftOut));
}

#[test]
fn a_new_ring_has_a_new_secret() {
    let t0 = Instant::now();
    let mut job = elastic(2, &["e1", "e2"], t0);
    let before = job.secret().to_vec();
    assert_eq!(
        job.recover(&ask(&job, "e1", 0, 0, false), 1, vec![], t0),
        Ok(None)
    );
    let task = job
        .recover(&ask(&job, "e2", 1, 0, false), 1, vec![], t0)
        .unwrap()
        .unwrap();
    assert_ne!(job.secret(), before.as_slice());
    assert_eq!(header(&task).secret, job.secret());
}

#[test]
fn too_few_survivors_fail_the_job_with_why() {
    let t0 = Instant::now();
    let mut job = elastic(3, &["e1", "e2", "e3"], t0);
    job.rank_lost(0, "executor e1 died".into(), t0 + secs(1));
    job.rank_lost(1, "executor e2 died".into(), t0 + secs(1));
    let refused = job.recover(&ask(&job, "e3", 2, 0, false), 2, vec![], t0 + secs(2));
    let why = JobError::TooFewRemain {
        remain: 1,
        lost: 2,
        min: 2,
    };
    assert_eq!(refused, Err(why.clone()));
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.error(), Some(why.to_string().as_str()));
    assert_eq!(
        why.to_string(),
        "only 1 executors remain after losing 2, fewer than cluster.min_executors = 2"
    );
    let ended = job.recover(&ask(&job, "e3", 2, 0, false), 2, vec![], t0 + secs(3));
    assert_eq!(ended, Err(JobError::Ended("job-1".into())));
}

#[test]
fn a_lost_rank_fails_a_job_that_is_not_elastic_or_has_ranks_that_finished() {
    let t0 = Instant::now();
    let mut job = Job::new("job-1".into(), train_on("cpu", 2), t0);
    job.start(vec![info("e1", "h1", 1), info("e2", "h2", 1)], t0);
    job.rank_lost(1, "executor e2 died".into(), t0 + secs(1));
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.error(), Some("executor e2 died"));
    assert!(!job.is_recovering());

    let mut job = elastic(2, &["e1", "e2"], t0);
    let done = Some(pb::finish_task_request::Result::Outcome(
        pb::TaskOutcome::default(),
    ));
    job.finish_rank(0, "e1", done, false, "rank 0", t0 + secs(1));
    job.rank_lost(1, "executor e2 died".into(), t0 + secs(2));
    assert_eq!(
        job.error(),
        Some("executor e2 died, after other ranks had finished the job; it cannot be recovered")
    );
}

#[test]
fn a_held_communication_error_fails_the_job_only_after_the_grace() {
    let t0 = Instant::now();
    let grace = Duration::from_millis(1500);
    let mut job = Job::new("job-1".into(), bench(2), t0);
    job.start(vec![info("e1", "h1", 1), info("e2", "h2", 1)], t0);
    let broken = Some(pb::finish_task_request::Result::Error(
        "rank 1 closed".into(),
    ));
    job.finish_rank(0, "e1", broken, true, "rank 0", t0);
    assert!(job.has_held_error());
    job.settle_held_error(t0 + grace - Duration::from_millis(1), grace, false);
    // While a closed connection is being settled, the wait is longer (at most four graces).
    job.settle_held_error(t0 + grace * 3, grace, true);
    assert_eq!(job.state, JobState::Running);
    job.settle_held_error(t0 + grace * 4, grace, true);
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.error(), Some("rank 0 failed: rank 1 closed"));
    assert_eq!(job.ended(), Some(t0 + grace * 4));
}

#[test]
fn idle_executors_join_at_an_epoch_boundary() {
    let t0 = Instant::now();
    let mut job = elastic(3, &["e1", "e2"], t0);
    job.set_joinable(true);
    let plan = |job: &Job, rank, epoch| job.epoch_plan(rank, pb::Split::Train, epoch).unwrap();
    assert!(!plan(&job, 0, 0).reform, "never before the first epoch");
    assert!(plan(&job, 0, 1).reform && plan(&job, 1, 1).reform);
    assert_eq!(
        job.recover(&ask(&job, "e2", 1, 0, false), 1, vec![], t0),
        Ok(None)
    );
    let idle = vec![info("e3", "h-e3", 1)];
    let task = job.recover(&ask(&job, "e1", 0, 0, false), 1, idle, t0 + secs(1));
    assert_eq!(task.unwrap().map(|t| header(&t).ring.len()), Some(3));
    assert_eq!(ranks(&job), ["e1", "e2", "e3"]);
    assert_eq!(job.recoveries(), (0, 0), "nothing was lost");
    let said = messages(&job);
    assert_eq!(
        said[said.len() - 2..],
        [
            "executor e3 on h-e3 joins the job".to_string(),
            "the ring is re-formed with 3 executors at an epoch boundary".to_string()
        ]
    );
    // The full ring re-forms no more.
    assert!(!plan(&job, 0, 2).reform);
}

#[test]
fn kind_is_the_elastic_limits_and_timeouts() {
    let kind: JobKind = elastic_on("cpu", 5);
    assert!(kind.is_elastic());
    assert_eq!((kind.min_executors(), kind.max_executors()), (Some(1), 5));
    assert_eq!(kind.executors_needed(), 2);
    let plain = train_on("cpu", 2);
    assert_eq!((plain.min_executors(), plain.max_executors()), (None, 2));
    assert_eq!(bench(3).rendezvous_timeout(), Duration::from_secs(60));
}

#[test]
fn a_caller_lost_while_it_asked_is_left_out_of_the_new_ring() {
    let t0 = Instant::now();
    let mut job = elastic(2, &["e1", "e2"], t0);
    assert_eq!(
        job.recover(&ask(&job, "e2", 1, 0, false), 1, vec![], t0),
        Ok(None)
    );
    job.rank_lost(
        0,
        "executor e1 stopped sending heartbeats".into(),
        t0 + secs(20),
    );
    // e1 was only slow: its request settles the ring, which is re-formed without it.
    let late = job.recover(&ask(&job, "e1", 0, 0, false), 1, vec![], t0 + secs(21));
    assert_eq!(late, Err(JobError::LeftOut));
    assert_eq!(ranks(&job), ["e2"]);
    let task = job.recover(&ask(&job, "e2", 1, 0, false), 1, vec![], t0 + secs(21));
    assert_eq!(
        task.unwrap()
            .map(|t| (header(&t).rank, header(&t).generation)),
        Some((0, 1))
    );
}

#[test]
fn a_sequence_job_s_epoch_and_test_lines_are_followed_by_its_tokens_and_entities() {
    use pb::report_request::Report;
    let t0 = Instant::now();
    let mut job = Job::new("job-1".into(), train_on("cpu", 2), t0);
    job.start(vec![info("e1", "h1", 1), info("e2", "h1", 2)], t0);
    let before = messages(&job).len();
    let epoch = |epoch, tokens, padding| pb::EpochReport {
        epoch,
        steps: 8,
        samples: 225,
        loss: 0.4,
        seconds: 2.8,
        tokens,
        padding,
        ..Default::default()
    };
    for rank in 0..2 {
        job.report(rank, Some(Report::Epoch(epoch(0, 7178, 315))), t0);
    }
    assert_eq!(
        messages(&job)[before..],
        ["  14356 tokens, 5127 tokens/s, padding 4.2%"]
    );
    for (rank, gold) in [(0, 48), (1, 49)] {
        let share = pb::EvalReport {
            rows: 582,
            correct: 548,
            loss_sum: 100.0,
            epoch: Some(0),
            tokens: true,
            entities: Some(pb::EntityCounts {
                correct: 35,
                predicted: 50,
                gold,
            }),
            ..Default::default()
        };
        job.report(rank, Some(Report::Eval(share)), t0);
    }
    assert_eq!(
        messages(&job)[before + 1..],
        ["  token accuracy 0.9416, entity F1 0.7107 (precision 0.70, recall 0.72) (1164 tokens)"]
    );
    // An epoch without tokens (a job that is not a sequence) says nothing more.
    for rank in 0..2 {
        job.report(rank, Some(Report::Epoch(epoch(1, 0, 0))), t0);
    }
    assert_eq!(messages(&job).len(), before + 2);
}
