//! The standalone deployment (`deploy/standalone`) on "hosts" made of Linux network namespaces:
//! `start-driver.sh` starts a driver in one namespace, `start-executors.sh` starts executors over
//! ssh (a real sshd in each of two other namespaces) with the secret sent over ssh's stdin, a job
//! trains across the three, and `stop-all.sh` leaves no process behind.
//!
//! Needs root, iproute2 (`ip netns`) and OpenSSH (`/usr/sbin/sshd`, `ssh`, `ssh-keygen`);
//! without them the test says why and passes, unless `RINGFLOW_REQUIRE_NETNS=1` (CI), where it
//! fails.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::{Run, repo, run_command, s, small_mnist_job, summary};

mod hosts;

use hosts::Hosts;

/// The namespaces' private /24 (they only see each other, so no other network can collide).
const SUBNET: &str = "10.213.7";
const DRIVER_IP: &str = "10.213.7.1";
const EXECUTOR_IPS: [&str; 2] = ["10.213.7.2", "10.213.7.3"];
const SHORT: Duration = Duration::from_secs(30);
const SCRIPT: Duration = Duration::from_secs(180);
const JOB: Duration = Duration::from_secs(900);
/// The ringflow binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_ringflow");

/// The standalone scripts start a driver with a generated secret, executors over ssh on two
/// other hosts (the secret over ssh's stdin, on no command line), refuse a host without sshd
/// and callers without the secret, train a job whose all-reduce crosses between the executors'
/// hosts, and `stop-all.sh` leaves no process, pid file or secret behind.
#[test]
fn standalone_scripts_start_a_cluster_over_ssh_across_network_namespaces() {
    if let Some(why) = missing_prerequisite() {
        return skip(&why);
    }
    let dir = tempfile::tempdir().unwrap();
    let net = match Hosts::create() {
        Ok(net) => net,
        Err(why) => return skip(&format!("cannot create network namespaces: {why}")),
    };
    let help = run_command(Command::new(BIN).args(["executor", "--help"]), SHORT);
    assert!(
        help.stdout.contains("--secret-file"),
        "`ringflow executor` has no --secret-file, which the standalone scripts pass:\n{}",
        help.stdout
    );
    let cluster = Standalone::set_up(net, dir.path());
    let driver = cluster.start_driver();
    cluster.a_host_without_sshd_is_named();
    let executor_pids = cluster.start_executors(&driver.secret);
    cluster.the_secret_is_on_no_command_line(&driver.secret);
    let rings = cluster.the_driver_lists_both_executors(&driver);
    let ckpt = cluster.dir.join("ckpt");
    let spec = small_mnist_job(&cluster.dir, "standalone", 2, 1, 256, &ckpt);
    cluster.a_wrong_secret_is_refused(&driver.url, &spec);
    let (accuracy, between, steps) = cluster.a_job_crosses_between_the_executors(&driver, &spec);
    cluster.stop_all_leaves_nothing(&executor_pids, driver.pid);
    eprintln!(
        "standalone: driver {url}, executors at {rings:?} over ssh, test accuracy {accuracy:.4}, \
         {between} bytes between the executor namespaces in {steps} steps",
        url = driver.url
    );
}

/// The path of the standalone script `name`.
fn script(name: &str) -> String {
    s(&repo().join("deploy/standalone").join(name))
}

/// What the phases of the standalone test share: the sshds on the executors' hosts, the hosts,
/// and the scripts' environment and directories. The sshds go before the hosts are deleted.
struct Standalone {
    sshds: Vec<Sshd>,
    net: Hosts,
    env: Vec<(&'static str, String)>,
    /// The test's temporary directory.
    dir: PathBuf,
    /// The driver host's RINGFLOW_RUN_DIR.
    run_dir: PathBuf,
    /// The executor hosts' RINGFLOW_REMOTE_RUN_DIR.
    remote_dir: PathBuf,
}

/// The driver that `start-driver.sh` started: its URL, secret file, secret and pid.
struct StartedDriver {
    url: String,
    secret_file: PathBuf,
    secret: String,
    pid: u32,
}

impl Standalone {
    /// Keys and an sshd per executor namespace (`ssh` runs in the driver's), and the
    /// configuration in `dir`: ringflow-env.sh and a hosts file in RINGFLOW_CONF_DIR.
    fn set_up(net: Hosts, dir: &Path) -> Standalone {
        let ssh_dir = dir.join("ssh");
        std::fs::create_dir(&ssh_dir).unwrap();
        let client_key = ssh_dir.join("client");
        keygen(&client_key);
        let authorized = ssh_dir.join("authorized_keys");
        std::fs::copy(client_key.with_extension("pub"), &authorized).unwrap();
        let mut sshds = Vec::new();
        for (ns, ip) in net.executors.iter().zip(EXECUTOR_IPS) {
            sshds.push(Sshd::start(ns, ip, &ssh_dir, &authorized));
        }
        let conf = dir.join("conf");
        std::fs::create_dir(&conf).unwrap();
        std::fs::write(
            conf.join("ringflow-env.sh"),
            "# read by the standalone scripts\nRINGFLOW_DRIVER_BIND=0.0.0.0:7077\nRINGFLOW_UI=0.0.0.0:4040\n",
        )
        .unwrap();
        std::fs::write(
            conf.join("hosts"),
            format!(
                "# the test's executor namespaces\nroot@{} 1   # user@host and cores\n\n{} --cores 1\n",
                EXECUTOR_IPS[0], EXECUTOR_IPS[1]
            ),
        )
        .unwrap();
        let run_dir = dir.join("run");
        let remote_dir = dir.join("remote");
        let ssh_opts = format!(
            "-F /dev/null -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes",
            s(&client_key)
        );
        let env: Vec<(&str, String)> = vec![
            ("RINGFLOW_CONF_DIR", s(&conf)),
            ("RINGFLOW_BIN", BIN.to_string()),
            ("RINGFLOW_RUN_DIR", s(&run_dir)),
            ("RINGFLOW_REMOTE_RUN_DIR", s(&remote_dir)),
            ("RINGFLOW_SSH_OPTS", ssh_opts),
            ("RINGFLOW_HOST_TIMEOUT", "120".into()),
        ];
        Standalone {
            sshds,
            net,
            env,
            dir: dir.to_path_buf(),
            run_dir,
            remote_dir,
        }
    }

    /// Runs the standalone script `name` with `args` in the driver's namespace.
    fn run_script(&self, name: &str, args: &[&str]) -> Run {
        let net = &self.net;
        net.run(&net.driver, &script(name), args, &self.env, SCRIPT)
    }

    /// `start-driver.sh` starts the driver with a generated 0600 secret; it prints the URL
    /// executors dial, and its web UI answers the health probes.
    fn start_driver(&self) -> StartedDriver {
        let net = &self.net;
        let run = self.run_script("start-driver.sh", &[]);
        run.assert_success();
        let url = run.stdout.trim().to_string();
        assert_eq!(url, format!("http://{DRIVER_IP}:7077"), "{}", run.stderr);
        let secret_file = self.run_dir.join("secret");
        let secret = std::fs::read_to_string(&secret_file).expect("start-driver.sh wrote a secret");
        assert!(secret.trim().len() >= 16, "a short secret: {secret:?}");
        assert_eq!(mode(&secret_file), 0o600);
        let pid = pid_in(&self.run_dir.join("driver.pid"));
        for (path, code) in [("/healthz", "200"), ("/readyz", "200")] {
            let status = net.http_status(&net.driver, "127.0.0.1:4040", path);
            assert_eq!(status, code, "GET {path} on the driver's web UI");
        }
        StartedDriver {
            url,
            secret_file,
            secret,
            pid,
        }
    }

    /// A host without sshd (the driver's own address) fails with a line naming it.
    fn a_host_without_sshd_is_named(&self) {
        let bad_hosts = self.dir.join("bad-hosts");
        std::fs::write(&bad_hosts, format!("{DRIVER_IP}\n")).unwrap();
        let run = self.run_script("start-executors.sh", &["--hosts", &s(&bad_hosts)]);
        assert!(!run.status.success(), "no sshd there:\n{}", run.stderr);
        assert!(
            run.stderr
                .lines()
                .any(|l| l.contains(&format!("error: {DRIVER_IP}: ssh failed"))),
            "names the host: {}",
            run.stderr
        );
    }

    /// `start-executors.sh` starts an executor in each executor namespace over ssh, from the
    /// driver's, with a 0600 copy of the `secret`; returns their pids.
    fn start_executors(&self, secret: &str) -> Vec<u32> {
        let run = self.run_script("start-executors.sh", &[]);
        assert_over_ssh(&run, "start-executors.sh", &self.sshds);
        let mut executor_pids = Vec::new();
        for (ns, ip) in self.net.executors.iter().zip(EXECUTOR_IPS) {
            let pid = pid_in(&self.remote_dir.join(format!("executor-{ip}.pid")));
            assert!(
                self.net.pids(ns).contains(&pid),
                "the executor for {ip} (pid {pid}) runs in namespace {ns}:\n{}",
                run.stderr
            );
            let copy = self.remote_dir.join(format!("executor-{ip}.secret"));
            assert_eq!(
                std::fs::read_to_string(&copy).unwrap(),
                secret,
                "the secret reached {ip}"
            );
            assert_eq!(mode(&copy), 0o600, "{}", copy.display());
            executor_pids.push(pid);
        }
        executor_pids
    }

    /// The `secret` is on no command line of any process of the cluster.
    fn the_secret_is_on_no_command_line(&self, secret: &str) {
        for ns in self.net.all() {
            for pid in self.net.pids(ns) {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                assert!(
                    !String::from_utf8_lossy(&cmdline).contains(secret.trim()),
                    "the secret is on the command line of pid {pid} in {ns}"
                );
            }
        }
    }

    /// The driver lists both executors, with ring addresses in their own namespaces; returns
    /// those addresses.
    fn the_driver_lists_both_executors(&self, driver: &StartedDriver) -> BTreeSet<String> {
        let status = self.net.ringflow(
            &self.net.driver,
            &["status", "--driver", &driver.url],
            &[("RINGFLOW_SECRET_FILE", &s(&driver.secret_file))],
            SHORT,
        );
        status.assert_success();
        assert!(status.stdout.contains("EXECUTORS (2)"), "{}", status.stdout);
        let rings: BTreeSet<String> = status
            .stdout
            .lines()
            .skip_while(|l| !l.starts_with("EXECUTORS"))
            .flat_map(|l| l.split_whitespace())
            .filter_map(|w| w.strip_prefix(&format!("{SUBNET}.")))
            .filter_map(|w| {
                w.split_once(':')
                    .map(|(host, _)| format!("{SUBNET}.{host}"))
            })
            .collect();
        assert_eq!(
            rings,
            EXECUTOR_IPS.iter().map(|ip| ip.to_string()).collect(),
            "ring addresses: {}",
            status.stdout
        );
        rings
    }

    /// Without the right secret, neither an executor nor the job `spec` gets into the driver at
    /// `url`.
    fn a_wrong_secret_is_refused(&self, url: &str, spec: &str) {
        let net = &self.net;
        let wrong = self.dir.join("wrong-secret");
        std::fs::write(&wrong, "not-the-secret-of-this-driver-0123").unwrap();
        std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
        let run = net.ringflow(
            &net.executors[0],
            &[
                "executor",
                "--driver",
                url,
                "--cores",
                "1",
                "--secret-file",
                &s(&wrong),
            ],
            &[],
            Duration::from_secs(90),
        );
        let err = run.assert_clean_failure();
        assert!(err.to_lowercase().contains("secret"), "{err}");
        for secret_args in [vec!["--secret-file", wrong.to_str().unwrap()], vec![]] {
            let mut args = vec!["submit", spec, "--driver", url];
            args.extend(secret_args);
            let run = net.ringflow(&net.driver, &args, &[], Duration::from_secs(90));
            let err = run.assert_clean_failure();
            assert!(err.to_lowercase().contains("secret"), "{args:?}: {err}");
        }
    }

    /// The job `spec` trains on both executors, and its all-reduce traffic crosses the bridge
    /// between them; returns its test accuracy, the bytes sent between the executors and its
    /// steps.
    fn a_job_crosses_between_the_executors(
        &self,
        driver: &StartedDriver,
        spec: &str,
    ) -> (f64, u64, u64) {
        let net = &self.net;
        let before = net.traffic();
        let out = self.dir.join("summary.json");
        let run = net.ringflow(
            &net.driver,
            &[
                "submit",
                spec,
                "--driver",
                &driver.url,
                "--secret-file",
                &s(&driver.secret_file),
                "--set",
                "data.source=direct",
                "--summary-json",
                &s(&out),
            ],
            &[],
            JOB,
        );
        run.assert_success();
        let after = net.traffic();
        let sm = summary(&out);
        assert_eq!(sm["executors"], 2, "{sm}");
        assert_eq!(sm["replicas_identical"], true, "{sm}");
        let accuracy = sm["test_accuracy"].as_f64().unwrap();
        assert!(accuracy > 0.9, "test accuracy {accuracy}");
        // Every byte the executors sent went to the driver or to each other: what the driver
        // did not receive went between the executors' namespaces. A ring all-reduce of two
        // ranks sends each rank's whole gradient once per step; ask for half of that.
        let between = (after.executors_sent - before.executors_sent)
            .saturating_sub(after.driver_received - before.driver_received);
        let params = 784 * 32 + 32 + 32 * 10 + 10;
        let steps = sm["steps"].as_u64().unwrap();
        let expected = 4 * params * steps;
        assert!(
            between >= expected,
            "{between} bytes went between the executors; a ring all-reduce of {steps} steps \
             sends at least {expected}"
        );
        (accuracy, between, steps)
    }

    /// `stop-all.sh` stops the executors (`executor_pids`) over ssh and the driver
    /// (`driver_pid`); nothing of ringflow remains, nor their pid files and secrets.
    fn stop_all_leaves_nothing(&self, executor_pids: &[u32], driver_pid: u32) {
        let run = self.run_script("stop-all.sh", &[]);
        assert_over_ssh(&run, "stop-all.sh", &self.sshds);
        for pid in executor_pids.iter().chain([&driver_pid]) {
            assert!(!alive(*pid), "pid {pid} still runs:\n{}", run.stderr);
        }
        for ns in self.net.all() {
            let left: Vec<u32> = self
                .net
                .pids(ns)
                .into_iter()
                .filter(|p| is_ringflow(*p))
                .collect();
            assert!(
                left.is_empty(),
                "ringflow processes left in {ns}: {left:?}\n{}",
                run.stderr
            );
        }
        for ip in EXECUTOR_IPS {
            for ext in ["pid", "secret"] {
                let f = self.remote_dir.join(format!("executor-{ip}.{ext}"));
                assert!(!f.exists(), "{} is left", f.display());
            }
        }
        assert!(!self.run_dir.join("driver.pid").exists());
    }
}

/// Why this machine cannot run the test, if it cannot.
fn missing_prerequisite() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("network namespaces need root".into());
    }
    if !Path::new("/usr/sbin/sshd").is_file() {
        return Some("/usr/sbin/sshd is missing (apt-get install openssh-server)".into());
    }
    for (program, args) in [
        ("ip", &["netns", "list"][..]),
        ("ssh", &["-V"][..]),
        ("ssh-keygen", &["-?"][..]),
    ] {
        let found = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match found {
            Ok(status) if program != "ip" || status.success() => {}
            Ok(status) => return Some(format!("`{program} {args:?}` failed ({status})")),
            Err(e) => return Some(format!("{program} cannot be run: {e}")),
        }
    }
    None
}

/// Returns from the test with a message, or fails it when `RINGFLOW_REQUIRE_NETNS=1`.
fn skip(why: &str) {
    if std::env::var("RINGFLOW_REQUIRE_NETNS").as_deref() == Ok("1") {
        panic!("RINGFLOW_REQUIRE_NETNS=1 but {why}");
    }
    eprintln!("skipping the standalone deployment test: {why}");
}

/// Generates an ed25519 key pair without a passphrase at `path` (and `path.pub`).
fn keygen(path: &Path) {
    let run = run_command(
        Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f", &s(path)]),
        SHORT,
    );
    assert!(run.status.success(), "ssh-keygen: {}", run.stderr);
}

/// An sshd in a namespace, listening on its address, with a host key and authorized keys of
/// its own; killed when dropped (the namespace's cleanup kills what it started).
struct Sshd {
    child: Child,
    log: PathBuf,
}

impl Sshd {
    fn start(ns: &str, ip: &str, dir: &Path, authorized: &Path) -> Sshd {
        // sshd refuses to start without its privilege separation directory, which the package
        // creates only through its service unit.
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd can be created");
        let host_key = dir.join(format!("host-{ip}"));
        keygen(&host_key);
        let config = dir.join(format!("sshd-{ip}.conf"));
        let log = dir.join(format!("sshd-{ip}.log"));
        std::fs::write(
            &config,
            format!(
                "ListenAddress {ip}\nPort 22\nHostKey {key}\nAuthorizedKeysFile {auth}\n\
                 PidFile {pid}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\nLogLevel VERBOSE\n",
                key = s(&host_key),
                auth = s(authorized),
                pid = s(&dir.join(format!("sshd-{ip}.pid"))),
            ),
        )
        .unwrap();
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, "/usr/sbin/sshd", "-D", "-f"])
            .arg(&config)
            .arg("-E")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sshd starts");
        let deadline = Instant::now() + SHORT;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Server listening on") {
                return Sshd { child, log };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("sshd in {ns} exited ({status}):\n{text}");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("sshd in {ns} did not listen within {SHORT:?}:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Fails unless a script that uses ssh succeeded, showing its output and the sshds' logs (which
/// say why a login was refused).
fn assert_over_ssh(run: &Run, script: &str, sshds: &[Sshd]) {
    if run.status.success() {
        return;
    }
    let logs: Vec<String> = sshds
        .iter()
        .map(|d| {
            let text = std::fs::read_to_string(&d.log).unwrap_or_default();
            format!("{}:\n{text}", d.log.display())
        })
        .collect();
    panic!(
        "{script} failed ({}):\nstdout:\n{}\nstderr:\n{}\nsshd logs:\n{}",
        run.status,
        run.stdout,
        run.stderr,
        logs.join("\n")
    );
}

/// The pid in a pid file.
fn pid_in(file: &Path) -> u32 {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("no pid file {}: {e}", file.display()));
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{} holds {text:?}", file.display()))
}

/// The permission bits of a file.
fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A process that exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Whether live process `pid` runs the ringflow binary.
fn is_ringflow(pid: u32) -> bool {
    let exe: PathBuf = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    alive(pid)
        && exe
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("ringflow"))
}
