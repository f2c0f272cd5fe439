//! The web UI answers only the `Host`s it is meant for: IP addresses, `localhost` and the names
//! of `--ui-host`, so that a web page cannot read it through DNS rebinding (issue 39).

use std::time::Duration;

use crate::helpers::*;
use crate::security::{driver, write};
use crate::ui::http_exchange;

/// The rebinding attacker's name, as a browser sends it after the rebinding.
const REBOUND: &str = "rebind.attacker.example";

/// `METHOD path` sent to `addr` with `host` as its `Host` header (`None`: an HTTP/1.0 request
/// without one), and `extra` header lines.
fn request(addr: &str, method: &str, path: &str, host: Option<&str>, extra: &str) -> (u16, String) {
    let (version, host_line) = match host {
        Some(h) => ("1.1", format!("Host: {h}\r\n")),
        None => ("1.0", String::new()),
    };
    http_exchange(
        addr,
        &format!(
            "{method} {path} HTTP/{version}\r\n{host_line}{extra}Content-Length: 0\r\nConnection: \
             close\r\n\r\n"
        ),
    )
}

fn get(addr: &str, path: &str, host: Option<&str>) -> (u16, String) {
    request(addr, "GET", path, host, "")
}

/// A driver with a secret and two `--ui-host` names: the page, its script, the read API and
/// `/metrics` refuse a rebinding attacker's `Host` (403, naming `--ui-host`), answer IP
/// addresses, `localhost` and the names given (any case, any port) and requests without a
/// `Host`; the probes answer any `Host`; cancel is refused for the attacker's `Host` and still
/// needs the secret for an allowed one; the driver logs the refusals.
#[test]
fn the_ui_answers_ip_addresses_localhost_and_its_names_only() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "5f2b8e1c9a7d4f3e6b0a1c2d3e4f5a6b";
    let secret_file = write(dir.path(), "secret", &format!("{secret}\n"));
    let (run, _url, ui) = driver(&[
        "--secret-file",
        &secret_file,
        "--ui-host",
        "ringflow.example.com",
        "--ui-host",
        "driver-0",
    ]);
    let addr = ui
        .strip_prefix("http://")
        .and_then(|a| a.strip_suffix('/'))
        .expect("the UI's URL")
        .to_string();
    let port = addr.rsplit(':').next().unwrap().to_string();
    let reads = [
        "/",
        "/app.js",
        "/api/v1/jobs",
        "/api/v1/executors",
        "/metrics",
    ];

    for host in [
        REBOUND.to_string(),
        format!("{REBOUND}:{port}"),
        "evil.localhost".into(),
    ] {
        for path in reads {
            let (code, body) = get(&addr, path, Some(&host));
            assert_eq!(code, 403, "{path} for {host}: {body}");
            assert!(
                body.contains("--ui-host") && !body.contains("ringflow_"),
                "{path} for {host}: {body}"
            );
        }
    }
    let allowed = [
        format!("127.0.0.1:{port}"),
        "127.0.0.1".into(),
        format!("[::1]:{port}"),
        "10.0.0.7:4040".into(),
        format!("localhost:{port}"),
        "LOCALHOST".into(),
        "ringflow.example.com".into(),
        format!("RingFlow.Example.com:{port}"),
        "driver-0:4040".into(),
    ];
    for host in &allowed {
        for path in reads {
            let (code, body) = get(&addr, path, Some(host));
            assert_eq!(code, 200, "{path} for {host}: {body}");
        }
    }
    // An HTTP/1.0 request without a Host, as health checkers and scripts send.
    let (code, metrics) = get(&addr, "/metrics", None);
    assert!(
        code == 200 && metrics.contains("ringflow_jobs"),
        "{code}: {metrics}"
    );
    // The probes say only whether the driver serves: any Host.
    assert_eq!(get(&addr, "/healthz", Some(REBOUND)), (200, "ok\n".into()));
    assert_eq!(
        get(&addr, "/readyz", Some(REBOUND)),
        (200, "ready\n".into())
    );

    cancel_stays_protected(&addr, secret);
    let log = run.wait_for("the web UI refused a request for ");
    assert!(log.contains(REBOUND), "{log}");
    drop(run);
}

/// Cancel is refused for the attacker's `Host` even with the secret, and for an allowed one
/// still needs the secret.
fn cancel_stays_protected(addr: &str, secret: &str) {
    let bearer = format!("Authorization: Bearer {secret}\r\n");
    let path = "/api/v1/jobs/nope/cancel";
    let (code, body) = request(addr, "POST", path, Some(REBOUND), &bearer);
    assert_eq!(code, 403, "{body}");
    let (code, body) = request(addr, "POST", path, Some("127.0.0.1"), "");
    assert_eq!(code, 401, "{body}");
    assert!(
        body.contains("requires the cluster's shared secret"),
        "{body}"
    );
    let (code, body) = request(addr, "POST", path, Some("localhost"), &bearer);
    assert_eq!(code, 404, "an unknown job, with the secret: {body}");
}

/// A `--ui-host` that is not a host name stops `ringflow driver` and `ringflow local` with one
/// sentence naming the flag and the value.
#[test]
fn a_ui_host_that_is_not_a_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let driver = ringflow(
        &[
            "driver",
            "--bind",
            "127.0.0.1:0",
            "--ui",
            "127.0.0.1:0",
            "--ui-host",
            "ringflow:4040",
        ],
        Duration::from_secs(30),
    );
    let stderr = driver.assert_clean_failure();
    assert!(
        stderr.contains("--ui-host \"ringflow:4040\" is not a host name: it has a port"),
        "{stderr}"
    );
    let spec = small_mnist_job(dir.path(), "hosts", 1, 1, 128, &dir.path().join("run"));
    let local = ringflow(
        &[
            "local",
            &spec,
            "--ui",
            "127.0.0.1:0",
            "--ui-host",
            "http://ringflow",
        ],
        Duration::from_secs(60),
    );
    let stderr = local.assert_clean_failure();
    assert!(
        stderr.contains("--ui-host \"http://ringflow\" is not a host name: it has a scheme"),
        "{stderr}"
    );
}
