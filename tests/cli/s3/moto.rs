//! The S3 server of the tests (moto, on a port the OS picks, killed when dropped), a boto3
//! client to fill and list its bucket, and `ringflow` runs that see only the `AWS_*`
//! variables a test sets.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::helpers::{Run, ringflow_env, run_command};

/// Deadline of one `ringflow` or boto3 run.
const DEADLINE: Duration = Duration::from_secs(120);
/// The bucket that [`Moto::start`] creates.
pub(crate) const BUCKET: &str = "ringflow-test";

/// The client side of the tests: create a bucket, upload files, list keys (with sizes).
const BOTO: &str = r#"
import os, sys, boto3
c = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
op, bucket, *rest = sys.argv[1:]
if op == "mb":
    c.create_bucket(Bucket=bucket)
elif op == "put":
    for item in rest:
        key, path = item.split("=", 1)
        c.upload_file(path, bucket, key)
elif op == "ls":
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=rest[0]):
        for o in page.get("Contents", []):
            print(o["Key"], o["Size"])
else:
    sys.exit("unknown op " + op)
"#;

/// A moto S3 server on 127.0.0.1, killed when dropped.
pub(crate) struct Moto {
    child: Child,
    /// Its endpoint: `http://127.0.0.1:PORT`.
    pub(super) url: String,
}

impl Moto {
    /// Starts the server and creates the bucket [`BUCKET`].
    pub(crate) fn start() -> Moto {
        static INSTALLED: OnceLock<()> = OnceLock::new();
        INSTALLED.get_or_init(check_moto_installed);
        // Port 0: the OS picks a free port, and werkzeug prints the address it bound.
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        without_aws_vars(&mut cmd);
        let mut child = cmd.spawn().expect("python3 starts");
        let (tx, rx) = mpsc::channel::<String>();
        // Both streams are drained for the server's whole life (it logs every request), and
        // every line is offered to the channel until nobody listens.
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().expect("piped"));
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().expect("piped"));
        for stream in [out, err] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    let _ = tx.send(line);
                }
            });
        }
        drop(tx);
        let mut server = Moto {
            child,
            url: String::new(),
        };
        let start = Instant::now();
        let limit = Duration::from_secs(30);
        let mut seen = Vec::new();
        while server.url.is_empty() {
            let left = limit.saturating_sub(start.elapsed());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find("Running on http://") {
                        let rest = &line[at + "Running on ".len()..];
                        let url = rest.split_whitespace().next().unwrap_or(rest);
                        server.url = url.trim_end_matches('/').to_string();
                    }
                    seen.push(line);
                }
                Err(_) => panic!(
                    "moto's server printed no address within {limit:?} (or exited: {:?}); its \
                     output:\n{}",
                    server.child.try_wait(),
                    seen.join("\n")
                ),
            }
        }
        drop(rx);
        let addr = server.url.trim_start_matches("http://").to_string();
        while TcpStream::connect(&addr).is_err() {
            assert!(
                start.elapsed() < limit,
                "moto's server at {} accepts no connections after {limit:?}",
                server.url
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server.boto(&["mb", BUCKET]);
        server
    }

    /// Runs the boto3 client script with `args` (`OP BUCKET ...`); returns its stdout.
    fn boto(&self, args: &[&str]) -> String {
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(BOTO).args(args);
        without_aws_vars(&mut cmd);
        for (name, value) in self.credentials() {
            cmd.env(name, value);
        }
        let run = run_command(&mut cmd, DEADLINE);
        assert!(
            run.status.success(),
            "boto3 {args:?} failed:\n{}",
            run.stderr
        );
        run.stdout
    }

    /// Uploads local files (relative to the repository root): `(key, path)`.
    pub(crate) fn put(&self, files: &[(&str, &str)]) {
        let items: Vec<String> = files.iter().map(|(k, p)| format!("{k}={p}")).collect();
        let mut args = vec!["put", BUCKET];
        args.extend(items.iter().map(String::as_str));
        self.boto(&args);
    }

    /// The keys below `prefix`, sorted, with their sizes.
    pub(crate) fn list(&self, prefix: &str) -> Vec<(String, u64)> {
        let mut keys: Vec<(String, u64)> = self
            .boto(&["ls", BUCKET, prefix])
            .lines()
            .map(|l| {
                let (k, n) = l.rsplit_once(' ').expect("KEY SIZE");
                (k.to_string(), n.parse().expect("a size"))
            })
            .collect();
        keys.sort();
        keys
    }

    /// The endpoint and the dummy credentials that the server accepts.
    pub(crate) fn credentials(&self) -> [(&'static str, String); 4] {
        [
            ("AWS_ENDPOINT_URL", self.url.clone()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
        ]
    }
}

/// Fails, saying how CI installs it, unless python3 can import moto's server and boto3.
fn check_moto_installed() {
    let check = Command::new("python3")
        .args(["-c", "import moto.server, boto3"])
        .stdin(Stdio::null())
        .output();
    match check {
        Ok(o) if o.status.success() => {}
        other => panic!(
            "moto's S3 server is not installed for python3 (`python3 -c \"import moto.server, \
             boto3\"` failed: {}); testing/run-tests.sh installs it; or run `python3 -m pip \
             install \"moto[server]==5.2.1\" boto3`",
            match other {
                Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
                Err(e) => format!("python3 cannot be started: {e}"),
            }
        ),
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The names of the `AWS_*` variables this test process holds.
fn aws_vars() -> Vec<String> {
    std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("AWS_"))
        .collect()
}

/// Removes every `AWS_*` variable of this test process from `cmd`'s environment.
fn without_aws_vars(cmd: &mut Command) {
    for k in aws_vars() {
        cmd.env_remove(k);
    }
}

/// Runs `ringflow ARGS` with no inherited `AWS_*` variable and then `set` set.
pub(crate) fn ringflow_aws(args: &[&str], set: &[(&str, String)]) -> Run {
    let removed = aws_vars();
    let mut env: Vec<(&str, Option<&str>)> = removed.iter().map(|k| (k.as_str(), None)).collect();
    env.extend(set.iter().map(|(k, v)| (*k, Some(v.as_str()))));
    ringflow_env(args, &env, DEADLINE)
}

/// Runs `ringflow ARGS` against `server`'s endpoint with its credentials.
pub(crate) fn ringflow_s3(server: &Moto, args: &[&str]) -> Run {
    ringflow_aws(args, &server.credentials())
}
