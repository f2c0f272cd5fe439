//! Who may use a driver: the cluster's shared secret on registration, submission and the web
//! UI's cancel action, TLS and mutual TLS with certificates made here (rcgen), and the health
//! probes of drivers and executors.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

use crate::helpers::*;
use crate::process::Process;
use crate::ui::{http_get, http_request};

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

pub(crate) fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    s(&path)
}

/// A driver on OS-chosen ports with `extra` options: it, its control-plane URL and its UI URL.
pub(crate) fn driver(extra: &[&str]) -> (Process, String, String) {
    let mut a = args(&["driver", "--bind", "127.0.0.1:0", "--ui", "127.0.0.1:0"]);
    a.extend(args(extra));
    let run = Process::start(&a);
    let url = run.printed_after("driver listening on ");
    let ui = run.printed_after("web UI at ");
    (run, url, ui)
}

/// A small two-executor MNIST job; `source` is its `data.source`.
fn two_executor_job(dir: &Path, name: &str, source: &str) -> String {
    job(
        dir,
        name,
        &format!(
            r#"name = "{name}"
{data}source = "{source}"
[model]
kind = "mlp"
layers = [784, 32, 10]
[train]
epochs = 1
batch_size = 128
optimizer = {{ kind = "sgd", lr = 0.1, momentum = 0.9 }}
[cluster]
executors = 2
rendezvous_timeout_s = 60
checkpoint_dir = "{ckpt}"
"#,
            data = mnist_data(),
            ckpt = s(&dir.join(name)),
        ),
    )
}

/// An executor of the driver at `url` with `secret_file` and `extra` options, once registered.
fn executor(url: &str, secret_file: &str, extra: &[&str]) -> Process {
    let mut options = vec!["--secret-file", secret_file];
    options.extend(extra);
    crate::distributed::executor(url, &options)
}

/// Asserts that an executor run with `extra` options against `url` exits non-zero with a line
/// containing `expected`.
fn executor_is_refused(url: &str, extra: &[&str], expected: &str) {
    let mut a = vec!["executor", "--driver", url, "--cores", "1"];
    a.extend(extra);
    let run = ringflow(&a, Duration::from_secs(60));
    let stderr = run.assert_clean_failure();
    assert!(stderr.contains(expected), "{expected:?} not in:\n{stderr}");
}

/// A driver with a shared secret: health probes need none; executors, clients and the UI's
/// cancel action without it (or with a wrong one) are refused and logged; executors with it
/// register and train a job submitted with it.
#[test]
fn a_driver_with_a_secret_admits_only_those_who_hold_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let secret = "5f2b8e1c9a7d4f3e6b0a1c2d3e4f5a6b";
    let secret_file = write(d, "secret", &format!("{secret}\n"));
    let wrong = write(d, "wrong", "0000000000000000000000000000000000\n");
    let (driver, url, ui) = driver(&["--secret-file", &secret_file]);

    // The health probes need no secret.
    assert_eq!(http_get(&format!("{ui}healthz")).0, 200);
    assert_eq!(http_get(&format!("{ui}readyz")), (200, "ready\n".into()));

    callers_without_the_secret_are_refused(&driver, &url, &wrong, d);
    let (e1, mut e2) = executors_with_the_secret(&url, &secret_file, secret);
    let job_id = a_job_with_the_secret_succeeds(d, &url, &secret_file);
    cancel_needs_the_secret(&ui, &job_id, secret);

    let _ = e2.kill();
    let _ = e2.wait();
    drop(e1);
    drop(driver);
}

/// Executors, `ringflow status` and `ringflow submit` without the secret, or with the `wrong`
/// one, are refused, each saying why; the driver logs each refusal with the caller's address.
fn callers_without_the_secret_are_refused(driver: &Process, url: &str, wrong: &str, d: &Path) {
    executor_is_refused(
        url,
        &[],
        "refused this executor: the driver requires the cluster's shared secret and none was sent",
    );
    executor_is_refused(
        url,
        &["--secret-file", wrong],
        "the shared secret sent does not match the driver's",
    );
    let status = ringflow(&["status", "--driver", url], Duration::from_secs(30));
    let stderr = status.assert_clean_failure();
    assert!(
        stderr.contains("the driver refused this request"),
        "{stderr}"
    );
    let spec = two_executor_job(d, "refused", "direct");
    let submit = ringflow(
        &["submit", &spec, "--driver", url, "--secret-file", wrong],
        Duration::from_secs(30),
    );
    assert!(
        submit
            .assert_clean_failure()
            .contains("does not match the driver's")
    );
    // The driver logged each refusal with the caller's address.
    let log = driver.wait_for("refused a client call from 127.0.0.1:");
    assert!(
        log.contains("does not match") || log.contains("none was sent"),
        "{log}"
    );
    assert!(
        driver
            .stderr()
            .contains("refused an executor call from 127.0.0.1:")
    );
}

/// Executors with the secret (one from `secret_file`, one from RINGFLOW_SECRET) register and
/// report ready on their health address; returns both (the second one for the caller to kill).
fn executors_with_the_secret(
    url: &str,
    secret_file: &str,
    secret: &str,
) -> (Process, std::process::Child) {
    let health = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let e1 = executor(url, secret_file, &["--health", &health.to_string()]);
    let e2 = std::process::Command::new(env!("CARGO_BIN_EXE_ringflow"))
        .args(["executor", "--driver", url, "--cores", "1"])
        .env("RINGFLOW_SECRET", secret)
        .current_dir(repo())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert_eq!(http_get(&format!("http://{health}/healthz")).0, 200);
    assert_eq!(
        http_get(&format!("http://{health}/readyz")),
        (200, "ready\n".into())
    );
    (e1, e2)
}

/// A job submitted with the secret trains to success on the admitted executors; returns its id.
fn a_job_with_the_secret_succeeds(d: &Path, url: &str, secret_file: &str) -> String {
    let spec = two_executor_job(d, "admitted", "direct");
    let summary = d.join("admitted.json");
    let run = ringflow(
        &[
            "submit",
            &spec,
            "--driver",
            url,
            "--secret-file",
            secret_file,
            "--summary-json",
            &s(&summary),
        ],
        Duration::from_secs(240),
    );
    run.assert_success();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(summary["status"], "succeeded", "{summary}");
    summary["job_id"].as_str().expect("a job id").to_string()
}

/// The web UI's only write action (cancelling job `job_id`) needs the secret too.
fn cancel_needs_the_secret(ui: &str, job_id: &str, secret: &str) {
    let cancel = format!("{ui}api/v1/jobs/{job_id}/cancel");
    let (code, body) = http_request("POST", &cancel, &[]);
    assert_eq!(code, 401, "{body}");
    assert!(
        body.contains("requires the cluster's shared secret"),
        "{body}"
    );
    let (code, _) = http_request(
        "POST",
        &cancel,
        &["Authorization: Bearer 0000000000000000000000"],
    );
    assert_eq!(code, 401);
    let (code, body) = http_request(
        "POST",
        &cancel,
        &[&format!("Authorization: Bearer {secret}")],
    );
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"cancelled":false}"#),
        "a finished job is not cancelled again"
    );
}

/// A CA and the files made with it: the driver's certificate (for 127.0.0.1 and localhost), a
/// client certificate, and an unrelated CA.
struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
    other_ca: String,
}

fn ca(name: &str) -> (CertificateParams, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    (params, KeyPair::generate().unwrap())
}

fn pki(dir: &Path) -> Pki {
    let (ca_params, ca_key) = ca("ringflow test CA");
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |sans: Vec<String>, usage: ExtendedKeyUsagePurpose, cn: &str| {
        let mut p = CertificateParams::new(sans).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        (
            p.signed_by(&key, &issuer).unwrap().pem(),
            key.serialize_pem(),
        )
    };
    let (server_cert, server_key) = leaf(
        vec!["127.0.0.1".into(), "localhost".into()],
        ExtendedKeyUsagePurpose::ServerAuth,
        "driver",
    );
    let (client_cert, client_key) = leaf(vec![], ExtendedKeyUsagePurpose::ClientAuth, "executor");
    let (other_params, other_key) = ca("another CA");
    let other = other_params.self_signed(&other_key).unwrap().pem();
    Pki {
        ca: write(dir, "ca.pem", &ca_pem),
        server_cert: write(dir, "driver.pem", &server_cert),
        server_key: write(dir, "driver.key", &server_key),
        client_cert: write(dir, "client.pem", &client_cert),
        client_key: write(dir, "client.key", &client_key),
        other_ca: write(dir, "other-ca.pem", &other),
    }
}

/// `GET url` over HTTPS trusting `ca`, with Python's TLS client (a second implementation):
/// the status code and body.
fn https_get(url: &str, ca: &str) -> (u16, String) {
    let script = "import ssl, sys, urllib.request\n\
        ctx = ssl.create_default_context(cafile=sys.argv[2])\n\
        r = urllib.request.urlopen(sys.argv[1], context=ctx, timeout=10)\n\
        print(r.status); print(r.read().decode(), end='')\n";
    let run = run_program(
        Path::new("python3"),
        &["-c", script, url, ca],
        Duration::from_secs(30),
    );
    run.assert_success();
    let (code, body) = run.stdout.split_once('\n').unwrap();
    (code.parse().unwrap(), body.to_string())
}

/// A driver with TLS and a client CA serves its control plane and UI over HTTPS, refuses
/// clients that do not trust it or bring no certificate of its CA, and trains a job for
/// executors with client certificates.
#[test]
fn tls_and_mutual_tls_protect_the_control_plane_and_the_ui() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pki = pki(d);
    let secret_file = write(d, "secret", "a3c1e5f7b9d2a4c6e8f0b1d3c5e7a9f2\n");
    let (driver, url, ui) = driver(&[
        "--secret-file",
        &secret_file,
        "--tls-cert",
        &pki.server_cert,
        "--tls-key",
        &pki.server_key,
        "--tls-ca",
        &pki.ca,
    ]);
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    assert!(ui.starts_with("https://127.0.0.1:"), "{ui}");
    assert_eq!(
        https_get(&format!("{ui}readyz"), &pki.ca),
        (200, "ready\n".into())
    );
    clients_without_trusted_tls_are_refused(&driver, &url, &secret_file, &pki);
    mutual_tls_executors_train_a_job(d, &url, &secret_file, &pki);
    drop(driver);
}

/// `ringflow status` against the driver at `url` with the secret and `extra` options.
fn status_over_tls(url: &str, secret_file: &str, extra: &[&str]) -> Run {
    let mut a = vec!["status", "--driver", url, "--secret-file", secret_file];
    a.extend(extra);
    ringflow(&a, Duration::from_secs(30))
}

/// A driver certificate from an unknown CA, no client certificate, a client certificate of
/// another CA, plain HTTP and a certificate without its key are all refused, each saying why;
/// the driver logs the handshakes it refused, with the client's address and the cause.
fn clients_without_trusted_tls_are_refused(
    driver: &Process,
    url: &str,
    secret_file: &str,
    pki: &Pki,
) {
    let client = |extra: &[&str]| status_over_tls(url, secret_file, extra);
    let run = client(&["--tls-ca", &pki.other_ca]);
    assert!(
        run.assert_clean_failure()
            .contains("invalid peer certificate: UnknownIssuer"),
        "{}",
        run.stderr
    );
    let run = client(&["--tls-ca", &pki.ca]);
    assert!(
        run.assert_clean_failure()
            .contains("pass --tls-cert and --tls-key"),
        "{}",
        run.stderr
    );
    let plain = url.replacen("https://", "http://", 1);
    let run = ringflow(
        &["status", "--driver", &plain, "--secret-file", secret_file],
        Duration::from_secs(30),
    );
    assert!(
        run.assert_clean_failure().contains("use an https:// URL"),
        "{}",
        run.stderr
    );
    executor_is_refused(
        url,
        &["--secret-file", secret_file, "--tls-ca", &pki.other_ca],
        "the TLS connection to the driver at",
    );
    // The driver logged the handshakes it refused, with the client's address and the cause.
    let refused = "refused a TLS connection to the control plane from 127.0.0.1:";
    driver.wait_for(refused);
    let log = driver.stderr();
    for cause in [
        "the client sent no certificate",
        "the client did not speak TLS",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains(refused) && l.contains(cause)),
            "no refusal saying {cause:?} in the driver's log: {log}"
        );
    }
    let run = client(&["--tls-ca", &pki.ca, "--tls-cert", &pki.client_cert]);
    assert!(
        run.assert_clean_failure()
            .contains("--tls-cert is given without --tls-key"),
        "{}",
        run.stderr
    );
}

/// With the CA and a client certificate, executors register and train a job whose data they
/// fetch from the driver over Flight, through the same TLS; `ringflow status` then shows both
/// idle.
fn mutual_tls_executors_train_a_job(d: &Path, url: &str, secret_file: &str, pki: &Pki) {
    let tls = [
        "--tls-ca",
        pki.ca.as_str(),
        "--tls-cert",
        pki.client_cert.as_str(),
        "--tls-key",
        pki.client_key.as_str(),
    ];
    let executors: Vec<Process> = (0..2).map(|_| executor(url, secret_file, &tls)).collect();
    let spec = two_executor_job(d, "over-tls", "driver");
    let summary = d.join("over-tls.json");
    let mut a = vec![
        "submit",
        spec.as_str(),
        "--driver",
        url,
        "--secret-file",
        secret_file,
        "--summary-json",
    ];
    let summary_arg = s(&summary);
    a.push(&summary_arg);
    a.extend(tls);
    ringflow(&a, Duration::from_secs(240)).assert_success();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(summary["status"], "succeeded", "{summary}");
    assert!(
        summary["test_accuracy"].as_f64().unwrap_or(0.0) > 0.5,
        "{summary}"
    );
    let run = status_over_tls(url, secret_file, &tls);
    run.assert_success();
    assert_eq!(run.stdout.matches(" idle ").count(), 2, "{}", run.stdout);
    drop(executors);
}

/// Files a driver cannot use are named in one sentence before it serves anything.
#[test]
fn unusable_secret_and_certificate_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let short = write(d, "short", "hunter2\n");
    let not_pem = write(d, "not.pem", "hello\n");
    let missing: PathBuf = d.join("missing.pem");
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            args(&["--secret-file", &short]),
            format!("the secret in {short} is 7 bytes long"),
        ),
        (
            args(&["--tls-cert", &not_pem, "--tls-key", &not_pem]),
            format!("--tls-cert {not_pem} holds no PEM certificate"),
        ),
        (
            args(&["--tls-cert", &s(&missing), "--tls-key", &not_pem]),
            format!(
                "cannot read the certificate file (--tls-cert) {}",
                s(&missing)
            ),
        ),
        (
            args(&["--tls-ca", &not_pem]),
            "--tls-ca on the driver requires --tls-cert and --tls-key".into(),
        ),
    ];
    for (extra, expected) in cases {
        let mut a = vec!["driver", "--bind", "127.0.0.1:0", "--ui", "off"];
        a.extend(extra.iter().map(String::as_str));
        let run = ringflow(&a, Duration::from_secs(30));
        let stderr = run.assert_clean_failure();
        assert!(stderr.contains(&expected), "{expected:?} not in:\n{stderr}");
        assert_eq!(
            stderr.lines().filter(|l| l.starts_with("error: ")).count(),
            1,
            "{stderr}"
        );
    }
}
