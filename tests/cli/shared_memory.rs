//! Same-host all-reduce through shared memory, and the hierarchical all-reduce across hosts
//! (executors given simulated host identities), on real executor processes.

use std::time::Duration;

use crate::helpers::{regression_job, ringflow, s, summary, write_regression_data};

const LONG: Duration = Duration::from_secs(600);
/// What an executor logs when it joins its host's shared memory.
const JOINED: &str = "all-reduces through shared memory";

/// Trains a small regression job on `executors` local executors spread over `hosts` simulated
/// hosts, with `cluster.shared_memory = shared`; returns the summary and stderr.
fn train(executors: usize, hosts: usize, shared: bool) -> (serde_json::Value, String) {
    train_compressed(executors, hosts, shared, "none")
}

/// [`train`] with `cluster.compression = compression`.
fn train_compressed(
    executors: usize,
    hosts: usize,
    shared: bool,
    compression: &str,
) -> (serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    write_regression_data(&data, &[400, 400], 50);
    let spec = regression_job(dir.path(), "shm", &s(&data), "", "");
    let out = dir.path().join("summary.json");
    let run = ringflow(
        &[
            "--log",
            "warn,ringflow_executor::collective=info",
            "local",
            &spec,
            "--executors",
            &executors.to_string(),
            "--simulate-hosts",
            &hosts.to_string(),
            "--set",
            &format!("cluster.shared_memory={shared}"),
            "--set",
            &format!("cluster.compression={compression}"),
            "--set",
            &format!("cluster.checkpoint_dir={}", s(&dir.path().join("run"))),
            "--summary-json",
            &s(&out),
        ],
        LONG,
    );
    run.assert_success();
    (summary(&out), run.stderr)
}

/// The same job with and without shared memory: the same samples and, up to the order of
/// additions, the same losses; replicas identical either way.
fn assert_same_training(tcp: &serde_json::Value, shm: &serde_json::Value) {
    for sm in [tcp, shm] {
        assert_eq!(sm["replicas_identical"], true, "{sm}");
    }
    assert_eq!(tcp["samples"], shm["samples"]);
    let loss = |v: &serde_json::Value| v["final_train_loss"].as_f64().expect("a loss");
    let (a, b) = (loss(tcp), loss(shm));
    assert!(
        (a - b).abs() <= 1e-3 * a.abs().max(1e-3),
        "final train loss over TCP {a} vs through shared memory {b}"
    );
}

#[test]
fn local_jobs_train_through_shared_memory_as_over_tcp() {
    for n in [2, 4] {
        let (tcp, tcp_log) = train(n, 1, false);
        let (shm, shm_log) = train(n, 1, true);
        assert_eq!(tcp_log.matches(JOINED).count(), 0, "{tcp_log}");
        let line = format!("with the {n} ranks of its host (1 hosts)");
        assert_eq!(
            shm_log.matches(&line).count(),
            n,
            "every rank joins: {shm_log}"
        );
        assert_same_training(&tcp, &shm);
    }
}

#[test]
fn a_job_over_two_hosts_reduces_within_each_then_among_them() {
    let (tcp, _) = train(4, 2, false);
    let (shm, log) = train(4, 2, true);
    let line = "with the 2 ranks of its host (2 hosts)";
    assert_eq!(log.matches(line).count(), 4, "every rank joins: {log}");
    assert_same_training(&tcp, &shm);
}

/// With fp16 compression over two hosts, each host sums through shared memory and only its
/// leader sends fp16 to the other: the job trains as over the flat compressed ring, with
/// identical replicas.
#[test]
fn compressed_gradients_cross_hosts_from_their_leaders() {
    let (flat, _) = train_compressed(4, 2, false, "fp16");
    let (hier, log) = train_compressed(4, 2, true, "fp16");
    let line = "with the 2 ranks of its host (2 hosts)";
    assert_eq!(log.matches(line).count(), 4, "every rank joins: {log}");
    for sm in [&flat, &hier] {
        assert_eq!(sm["replicas_identical"], true, "{sm}");
        assert_eq!(sm["compression"], "fp16", "{sm}");
    }
    assert_eq!(flat["samples"], hier["samples"]);
    let loss = |v: &serde_json::Value| v["final_train_loss"].as_f64().expect("a loss");
    let (a, b) = (loss(&flat), loss(&hier));
    assert!(
        (a - b).abs() <= 1e-2 * a.abs().max(1e-3),
        "final train loss over the flat fp16 ring {a} vs hierarchically {b}"
    );
}

/// `bench allreduce --check` verifies sums, averages, broadcast and all-gather through shared
/// memory and hierarchically, for lengths that are not multiples of anything and span several
/// pieces.
#[test]
fn shared_memory_collectives_equal_the_serial_computation() {
    for (ranks, hosts, floats) in [(2, 1, 1), (3, 1, 600_001), (4, 2, 262_147), (5, 2, 7)] {
        let run = ringflow(
            &[
                "--log",
                "warn,ringflow_executor::collective=info",
                "bench",
                "allreduce",
                "--ranks",
                &ranks.to_string(),
                "--hosts",
                &hosts.to_string(),
                "--floats",
                &floats.to_string(),
                "--check",
            ],
            LONG,
        );
        run.assert_success();
        let ok = format!("allreduce check ranks={ranks} floats={floats} ok");
        assert!(run.stdout.contains(&ok), "{}", run.stdout);
        let joined = run.stderr.matches(JOINED).count();
        assert_eq!(joined, ranks, "every rank joins: {}", run.stderr);
    }
}
