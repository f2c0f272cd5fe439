//! Which executors a job may run on: the devices they advertise (`cluster.device`).

use super::*;

/// An executor advertising `devices`.
fn with_devices(id: &str, host: &str, port: u16, devices: &[&str]) -> pb::ExecutorInfo {
    pb::ExecutorInfo {
        devices: devices.iter().map(|d| d.to_string()).collect(),
        ..info(id, host, port)
    }
}

#[test]
fn a_cuda_job_waits_for_executors_with_a_gpu() {
    let now = Instant::now();
    let mut s = sched();
    s.register(info("cpu-1", "host-1", 5), now).unwrap();
    s.register(info("cpu-2", "host-1", 6), now).unwrap();
    let id = s.submit(train_on("cuda", 2), now);
    s.tick(now);
    assert_eq!(s.job(&id).unwrap().state, pb::JobState::Waiting);
    assert!(
        s.take_task("cpu-1", Instant::now()).is_none()
            && s.take_task("cpu-2", Instant::now()).is_none()
    );

    // One GPU executor is not enough for two ranks; a second one starts the job.
    s.register(with_devices("gpu-1", "host-2", 5, &["cpu", "cuda:0"]), now)
        .unwrap();
    s.tick(now);
    assert_eq!(s.job(&id).unwrap().state, pb::JobState::Waiting);
    s.register(
        with_devices("gpu-2", "host-2", 6, &["cpu", "cuda:0", "cuda:1"]),
        now,
    )
    .unwrap();
    s.tick(now);
    let job = s.job(&id).unwrap();
    assert_eq!(job.state, pb::JobState::Running);
    let ranks: Vec<&str> = job.ranks().iter().map(|e| e.executor_id.as_str()).collect();
    assert_eq!(ranks, ["gpu-1", "gpu-2"]);
    assert!(
        s.take_task("gpu-1", Instant::now()).is_some()
            && s.take_task("gpu-2", Instant::now()).is_some()
    );
    assert!(s.take_task("cpu-1", Instant::now()).is_none());
}

#[test]
fn cpu_jobs_and_benchmarks_run_on_any_executor() {
    let now = Instant::now();
    for kind in [train_on("cpu", 2), bench(2)] {
        let mut s = sched();
        s.register(with_devices("gpu-1", "host-1", 5, &["cpu", "cuda:0"]), now)
            .unwrap();
        s.register(info("cpu-1", "host-2", 5), now).unwrap();
        let id = s.submit(kind, now);
        s.tick(now);
        assert_eq!(s.job(&id).unwrap().state, pb::JobState::Running);
    }
}

#[test]
fn a_pinned_ordinal_needs_executors_that_advertise_it() {
    let now = Instant::now();
    let mut s = sched();
    s.register(with_devices("gpu-1", "host-1", 5, &["cpu", "cuda:0"]), now)
        .unwrap();
    let id = s.submit(train_on("cuda:1", 1), now);
    s.tick(now);
    assert_eq!(s.job(&id).unwrap().state, pb::JobState::Waiting);
    s.register(
        with_devices("gpu-2", "host-2", 5, &["cpu", "cuda:0", "cuda:1"]),
        now,
    )
    .unwrap();
    s.tick(now);
    let job = s.job(&id).unwrap();
    assert_eq!(job.state, pb::JobState::Running);
    assert_eq!(job.ranks()[0].executor_id, "gpu-2");
}

#[test]
fn a_cuda_job_that_waits_too_long_names_the_executors_without_a_gpu() {
    let start = Instant::now();
    let mut s = sched();
    s.register(info("cpu-1", "host-1", 5), start).unwrap();
    s.register(
        with_devices("gpu-1", "host-2", 5, &["cpu", "cuda:0"]),
        start,
    )
    .unwrap();
    let id = s.submit(train_on("cuda", 2), start);
    s.tick(start);
    let later = start + Duration::from_secs(61);
    s.heartbeat(info("cpu-1", "host-1", 5), "", later).unwrap();
    s.heartbeat(
        with_devices("gpu-1", "host-2", 5, &["cpu", "cuda:0"]),
        "",
        later,
    )
    .unwrap();
    s.tick(later);
    let job = s.job(&id).unwrap();
    assert_eq!(job.state, pb::JobState::Failed);
    let err = job.error().unwrap();
    assert!(
        err.contains("for 2 executors with a CUDA device (cluster.device = \"cuda\")"),
        "{err}"
    );
    assert!(
        err.contains("without a CUDA device: cpu-1 on host-1 (devices: cpu)"),
        "{err}"
    );
    assert!(!err.contains("gpu-1 on host-2 (devices"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn only_executors_with_a_gpu_join_a_cuda_job() {
    let now = Instant::now();
    let mut s = sched();
    s.register(with_devices("gpu-1", "host-1", 5, &["cpu", "cuda:0"]), now)
        .unwrap();
    s.register(with_devices("gpu-2", "host-1", 6, &["cpu", "cuda:0"]), now)
        .unwrap();
    let id = start(&mut s, elastic_on("cuda", 3), &["gpu-1", "gpu-2"], now);
    // A CPU-only executor registers while the job runs: the job is not joinable for it,
    // and the re-formed ring after a loss leaves it out.
    s.register(info("cpu-1", "host-2", 5), now).unwrap();
    s.tick(now);
    let recover = |rank: u32, executor: &str| pb::RecoverRequest {
        job_id: id.clone(),
        executor_id: executor.into(),
        rank,
        generation: 0,
        error: "connection closed".into(),
        wait_ms: 0,
        ..Default::default()
    };
    assert_eq!(s.recover(&recover(0, "gpu-1"), now), Ok(None));
    let task = s.recover(&recover(1, "gpu-2"), now).unwrap().unwrap();
    assert_eq!(header(&task).ring.len(), 2, "{:?}", header(&task).ring);
    let ranks: Vec<&str> = s
        .job(&id)
        .unwrap()
        .ranks()
        .iter()
        .map(|e| e.executor_id.as_str())
        .collect();
    assert_eq!(ranks, ["gpu-1", "gpu-2"]);
}
