//! The driver's web UI while a real job runs: the JSON API the page uses, Prometheus metrics,
//! and (with Chromium installed, as `testing/run-tests.sh` does) the page itself rendered headless.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::helpers::*;
use crate::process::Process;

/// `GET url` over a plain HTTP/1.1 connection: the status code and the body.
pub(crate) fn http_get(url: &str) -> (u16, String) {
    http_request("GET", url, &[])
}

/// `METHOD url` with extra `headers` (`Name: value` lines) over a plain HTTP/1.1 connection:
/// the status code and the body.
pub(crate) fn http_request(method: &str, url: &str, headers: &[&str]) -> (u16, String) {
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    http_exchange(
        host,
        &format!(
            "{method} /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n{extra}Connection: close\r\n\r\n"
        ),
    )
}

/// Sends `request`, a whole HTTP/1 request as written, to `addr` (`HOST:PORT`) and reads the
/// response to its end: the status code and the body.
pub(crate) fn http_exchange(addr: &str, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("headers end");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    // A chunked body: join the chunks.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        out
    } else {
        body.to_string()
    };
    (status, body)
}

fn json(url: &str) -> serde_json::Value {
    let (status, body) = http_get(url);
    assert_eq!(status, 200, "{url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{url}: {e}: {body}"))
}

/// Long enough that the job is still training while the test looks.
fn start_job(dir: &std::path::Path) -> (Process, String) {
    // Far more epochs than the test needs, so that the job is still running at its end.
    let spec = small_mnist_job(dir, "ui", 2, 500, 128, &dir.join("run"));
    let run = Process::start(&["local", &spec, "--ui", "127.0.0.1:0"]);
    let url = run.printed_after("web UI at ");
    run.wait_for("test after epoch 1/");
    (run, url)
}

/// While a two-executor job runs, the UI serves its page and script, the JSON API describes the
/// job, its executors and its metrics (one evaluation per epoch, in order), `/metrics` has the
/// Prometheus series, and (with Chromium) the page renders the executors and charts.
#[test]
fn the_ui_api_and_metrics_describe_a_running_job() {
    let dir = tempfile::tempdir().unwrap();
    let (run, url) = start_job(dir.path());

    let (status, page) = http_get(&url);
    assert_eq!(status, 200);
    assert!(page.contains("id=\"executors\"") && page.contains("/app.js"));
    let (status, script) = http_get(&format!("{url}app.js"));
    assert!(status == 200 && script.contains("/api/v1/jobs"));

    let id = the_api_describes_the_running_job(&url);
    the_api_describes_both_executors(&url);
    the_api_has_the_job_metrics(&url, &id);
    the_prometheus_metrics_describe_the_job(&url);
    // Browser check: Chromium renders the page against the live job.
    if let Some(chromium) = chromium() {
        the_page_renders_in_chromium(&chromium, &url, &dir.path().join("ui.png"));
    }
    evaluations_come_one_per_epoch(&url, &id);

    // All of it was seen live: the job is still running (the run is killed on drop).
    let jobs = json(&format!("{url}api/v1/jobs"));
    assert_eq!(jobs[0]["state"], "running", "{jobs}");
    drop(run);
}

/// `/api/v1/jobs` shows the job running on two executors past epoch 1, with a memory estimate
/// of one executor, biggest part first; returns the job's id.
fn the_api_describes_the_running_job(url: &str) -> String {
    let jobs = json(&format!("{url}api/v1/jobs"));
    let job = &jobs[0];
    assert_eq!(job["state"], "running", "{jobs}");
    assert_eq!(job["executors"], 2, "{jobs}");
    assert!(job["progress"]["epoch"].as_u64().unwrap() >= 1, "{jobs}");
    // The memory estimate of one executor, biggest part first.
    let memory = &job["memory"];
    let parts = memory["parts"].as_array().unwrap();
    assert!(
        memory["bytes"].as_u64().unwrap() > 0 && !parts.is_empty(),
        "{jobs}"
    );
    assert!(
        parts
            .windows(2)
            .all(|w| w[0]["bytes"].as_u64() >= w[1]["bytes"].as_u64()),
        "{jobs}"
    );
    job["id"].as_str().unwrap().to_string()
}

/// `/api/v1/executors` shows two busy executors with ranks, fresh heartbeats, their memory and
/// phase shares that add up to 1.
fn the_api_describes_both_executors(url: &str) {
    let executors = json(&format!("{url}api/v1/executors"));
    let ranks: Vec<u64> = executors
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["rank"].as_u64())
        .collect();
    assert_eq!(ranks.len(), 2, "{executors}");
    for e in executors.as_array().unwrap() {
        assert_eq!(e["state"], "busy", "{executors}");
        assert!(e["last_heartbeat_s"].as_f64().unwrap() < 5.0, "{executors}");
        assert!(e["memory_bytes"].as_u64().unwrap() > 0, "{executors}");
        let shares = &e["phases"];
        let total: f64 = ["data", "forward", "backward", "allreduce", "optimizer"]
            .iter()
            .map(|p| shares[p].as_f64().unwrap())
            .sum();
        assert!((total - 1.0).abs() < 1e-6, "{executors}");
    }
}

/// `/api/v1/jobs/<id>/metrics` has the epochs' losses and the test split's evaluation after
/// epoch 1; an unknown job is a 404.
fn the_api_has_the_job_metrics(url: &str, id: &str) {
    let series = json(&format!("{url}api/v1/jobs/{id}/metrics"));
    assert!(!series["epochs"].as_array().unwrap().is_empty(), "{series}");
    assert!(
        series["epochs"][0]["loss"].as_f64().unwrap() > 0.0,
        "{series}"
    );

    // The test split was evaluated after epoch 1 while the job runs on.
    let test = &series["tests"][0];
    assert_eq!(test["epoch"], 1, "{series}");
    let accuracy = test["accuracy"].as_f64().unwrap_or(0.0);
    assert!(accuracy > 0.5 && accuracy <= 1.0, "{series}");

    let (status, missing) = http_get(&format!("{url}api/v1/jobs/nope"));
    assert_eq!(status, 404, "{missing}");
}

/// `/metrics` has the job, executor, phase-histogram, all-reduce, loss and accuracy series, and
/// forward phases counted.
fn the_prometheus_metrics_describe_the_job(url: &str) {
    let (status, metrics) = http_get(&format!("{url}metrics"));
    assert_eq!(status, 200);
    for needle in [
        "ringflow_jobs{state=\"running\"} 1",
        "ringflow_executors{state=\"busy\"} 2",
        "# TYPE ringflow_step_phase_seconds histogram",
        "ringflow_allreduce_bytes_total{job=",
        "ringflow_job_loss{job=",
        "ringflow_job_test_accuracy{job=",
    ] {
        assert!(metrics.contains(needle), "{needle} missing:\n{metrics}");
    }
    let forward_steps: f64 = metrics
        .lines()
        .find(|l| {
            l.starts_with("ringflow_step_phase_seconds_count{") && l.contains("phase=\"forward\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no forward-phase histogram:\n{metrics}"));
    assert!(forward_steps > 0.0, "{metrics}");
}

/// Chromium renders the page at `url` against the live job: two executor rows, loss and
/// accuracy charts with points, the memory estimate, and a screenshot at `screenshot` (copied
/// to `RINGFLOW_UI_SCREENSHOT` when set).
fn the_page_renders_in_chromium(chromium: &str, url: &str, screenshot: &std::path::Path) {
    let dom = render(chromium, url, screenshot);
    assert!(
        dom.matches("data-executor=").count() == 2,
        "two executor rows: {dom}"
    );
    // The loss chart and the test-accuracy chart have points while the job runs.
    for chart in ["loss-chart", "accuracy-chart"] {
        let svg = dom
            .split(&format!("id=\"{chart}\""))
            .nth(1)
            .and_then(|rest| rest.split("</svg>").next())
            .unwrap_or_default();
        assert!(svg.contains("<circle"), "{chart} with points: {dom}");
    }
    assert!(
        dom.contains("memory per executor: about "),
        "the job's memory estimate: {dom}"
    );
    assert!(screenshot.exists(), "a screenshot was taken");
    if let Ok(keep) = std::env::var("RINGFLOW_UI_SCREENSHOT") {
        std::fs::copy(screenshot, keep).unwrap();
    }
}

/// Later evaluations of job `id` come one per epoch, in order (waiting at most 60 s for three).
fn evaluations_come_one_per_epoch(url: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let tests = loop {
        let series = json(&format!("{url}api/v1/jobs/{id}/metrics"));
        let tests = series["tests"].as_array().unwrap().clone();
        if tests.len() >= 3 || Instant::now() > deadline {
            break tests;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let epochs: Vec<u64> = tests.iter().map(|t| t["epoch"].as_u64().unwrap()).collect();
    assert!(
        epochs.len() >= 3 && epochs.iter().zip(1..).all(|(&e, want)| e == want),
        "{tests:?}"
    );
}

/// Chromium for the browser check: required where `RINGFLOW_REQUIRE_BROWSER` is set (as
/// `testing/run-tests.sh` does after installing it), optional elsewhere.
fn chromium() -> Option<String> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        if found.is_some() {
            return found;
        }
    }
    assert!(
        std::env::var_os("RINGFLOW_REQUIRE_BROWSER").is_none(),
        "RINGFLOW_REQUIRE_BROWSER is set but no Chromium is installed"
    );
    eprintln!("no Chromium: the browser check of the UI is skipped");
    None
}

/// The page's DOM after its scripts ran for a few seconds, and a screenshot of it.
fn render(chromium: &str, url: &str, screenshot: &std::path::Path) -> String {
    let profile = tempfile::tempdir().unwrap();
    let common = [
        "--headless".to_string(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-quic".into(),
        "--no-first-run".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        format!("--user-data-dir={}", s(profile.path())),
        "--virtual-time-budget=4000".into(),
        "--window-size=1400,1000".into(),
    ];
    let shot = Command::new(chromium)
        .args(&common)
        .arg(format!("--screenshot={}", s(screenshot)))
        .arg(url)
        .output()
        .unwrap();
    assert!(
        shot.status.success(),
        "chromium screenshot: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let dump = Command::new(chromium)
        .args(&common)
        .arg("--dump-dom")
        .arg(url)
        .output()
        .unwrap();
    assert!(
        dump.status.success(),
        "chromium --dump-dom: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    String::from_utf8_lossy(&dump.stdout).into_owned()
}
