//! `ringflow status` and `ringflow cancel` against a standalone driver: a running job is listed
//! with its busy executors, cancelled from another process, and its executors become idle and
//! take the next job; an unknown job is named in the refusal.

use std::time::{Duration, Instant};

use crate::distributed::executor;
use crate::helpers::*;
use crate::process::Process;

const LIMIT: Duration = Duration::from_secs(240);

/// `ringflow status`'s output once `ready` says it is what the test waits for (at most 60 s).
fn status_until(url: &str, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let run = ringflow(&["status", "--driver", url], Duration::from_secs(30));
        run.assert_success();
        if ready(&run.stdout) {
            return run.stdout.clone();
        }
        assert!(Instant::now() < deadline, "never {what}:\n{}", run.stdout);
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_running_job_is_listed_and_cancelled_from_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let driver = Process::start(&["driver", "--bind", "127.0.0.1:0", "--ui", "127.0.0.1:0"]);
    let url = driver.printed_after("driver listening on ");
    let _executors: Vec<Process> = (0..2).map(|_| executor(&url, &[])).collect();

    // A job far longer than the test: 200 epochs.
    let long = small_mnist_job(d, "long", 2, 200, 128, &d.join("long"));
    let out = d.join("long.json");
    let submit = Process::start(&[
        "submit",
        &long,
        "--driver",
        &url,
        "--summary-json",
        &s(&out),
    ]);
    submit.wait_for("epoch 1/200");

    let listed = status_until(&url, "listed the job running on 2 busy executors", |out| {
        out.lines().any(|l| l.contains(" running ")) && out.matches(" busy ").count() == 2
    });
    let job_id = listed
        .lines()
        .find(|l| l.contains(" running "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    assert!(job_id.starts_with("long-"), "{listed}");

    let cancel = ringflow(
        &["cancel", &job_id, "--driver", &url],
        Duration::from_secs(30),
    );
    cancel.assert_success();
    assert_eq!(cancel.stdout.trim(), format!("cancelled job {job_id}"));

    // The submitting process ends with the job: non-zero, a cancelled summary.
    let (status, stderr) = submit.finish(LIMIT);
    assert!(
        !status.success(),
        "a cancelled job is not a success: {stderr}"
    );
    let sm = summary(&out);
    assert_eq!(sm["status"], "cancelled", "{sm}");
    assert!(sm["epochs"].as_u64().unwrap() < 200, "{sm}");

    // The executors are free again, and the job is listed as cancelled.
    let after = status_until(&url, "listed both executors idle", |out| {
        out.matches(" idle ").count() == 2
    });
    let line = after.lines().find(|l| l.starts_with(&job_id)).unwrap();
    assert!(line.contains(" cancelled "), "{after}");

    // Cancelling it again says it had ended; an unknown job is named.
    let again = ringflow(
        &["cancel", &job_id, "--driver", &url],
        Duration::from_secs(30),
    );
    again.assert_success();
    assert_eq!(
        again.stdout.trim(),
        format!("job {job_id} had already ended")
    );
    let unknown = ringflow(
        &["cancel", "nope-0001", "--driver", &url],
        Duration::from_secs(30),
    );
    let err = unknown.assert_clean_failure();
    assert!(
        err.contains(&format!("the driver at {url} has no job \"nope-0001\"")),
        "{err}"
    );

    // The freed executors take the next job.
    let next = small_mnist_job(d, "next", 2, 1, 256, &d.join("next"));
    let out = d.join("next.json");
    ringflow(
        &[
            "submit",
            &next,
            "--driver",
            &url,
            "--summary-json",
            &s(&out),
        ],
        LIMIT,
    )
    .assert_success();
    assert_eq!(summary(&out)["status"], "succeeded");
}
