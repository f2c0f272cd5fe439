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

/// The namespaces' private /24 (they only see each other, so no other network can collide).
const SUBNET: &str = "10.213.7";
const DRIVER_IP: &str = "10.213.7.1";
const EXECUTOR_IPS: [&str; 2] = ["10.213.7.2", "10.213.7.3"];
const SHORT: Duration = Duration::from_secs(30);
const SCRIPT: Duration = Duration::from_secs(180);
const JOB: Duration = Duration::from_secs(900);

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
    let bin = env!("CARGO_BIN_EXE_ringflow");
    let help = run_command(Command::new(bin).args(["executor", "--help"]), SHORT);
    assert!(
        help.stdout.contains("--secret-file"),
        "`ringflow executor` has no --secret-file, which the standalone scripts pass:\n{}",
        help.stdout
    );

    // Keys and an sshd per executor namespace; `ssh` runs in the driver's namespace.
    let ssh_dir = dir.path().join("ssh");
    std::fs::create_dir(&ssh_dir).unwrap();
    let client_key = ssh_dir.join("client");
    keygen(&client_key);
    let authorized = ssh_dir.join("authorized_keys");
    std::fs::copy(client_key.with_extension("pub"), &authorized).unwrap();
    let mut sshds = Vec::new();
    for (ns, ip) in net.executors.iter().zip(EXECUTOR_IPS) {
        sshds.push(Sshd::start(ns, ip, &ssh_dir, &authorized));
    }

    // The configuration: ringflow-env.sh and a hosts file in RINGFLOW_CONF_DIR.
    let conf = dir.path().join("conf");
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
    let run_dir = dir.path().join("run");
    let remote_dir = dir.path().join("remote");
    let ssh_opts = format!(
        "-F /dev/null -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes",
        s(&client_key)
    );
    let env: Vec<(&str, String)> = vec![
        ("RINGFLOW_CONF_DIR", s(&conf)),
        ("RINGFLOW_BIN", bin.to_string()),
        ("RINGFLOW_RUN_DIR", s(&run_dir)),
        ("RINGFLOW_REMOTE_RUN_DIR", s(&remote_dir)),
        ("RINGFLOW_SSH_OPTS", ssh_opts),
        ("RINGFLOW_HOST_TIMEOUT", "120".into()),
    ];
    let script = |name: &str| s(&repo().join("deploy/standalone").join(name));

    // The driver, with a generated secret; it prints the URL executors dial.
    let run = net.run(&net.driver, &script("start-driver.sh"), &[], &env, SCRIPT);
    run.assert_success();
    let url = run.stdout.trim().to_string();
    assert_eq!(url, format!("http://{DRIVER_IP}:7077"), "{}", run.stderr);
    let secret_file = run_dir.join("secret");
    let secret = std::fs::read_to_string(&secret_file).expect("start-driver.sh wrote a secret");
    assert!(secret.trim().len() >= 16, "a short secret: {secret:?}");
    assert_eq!(mode(&secret_file), 0o600);
    let driver_pid = pid_in(&run_dir.join("driver.pid"));
    for (path, code) in [("/healthz", "200"), ("/readyz", "200")] {
        let status = net.http_status(&net.driver, "127.0.0.1:4040", path);
        assert_eq!(status, code, "GET {path} on the driver's web UI");
    }

    // A host without sshd (the driver's own address) fails with a line naming it.
    let bad_hosts = dir.path().join("bad-hosts");
    std::fs::write(&bad_hosts, format!("{DRIVER_IP}\n")).unwrap();
    let run = net.run(
        &net.driver,
        &script("start-executors.sh"),
        &["--hosts", &s(&bad_hosts)],
        &env,
        SCRIPT,
    );
    assert!(!run.status.success(), "no sshd there:\n{}", run.stderr);
    assert!(
        run.stderr
            .lines()
            .any(|l| l.contains(&format!("error: {DRIVER_IP}: ssh failed"))),
        "names the host: {}",
        run.stderr
    );

    // The executors, over ssh, from the driver's namespace.
    let run = net.run(
        &net.driver,
        &script("start-executors.sh"),
        &[],
        &env,
        SCRIPT,
    );
    assert_over_ssh(&run, "start-executors.sh", &sshds);
    let mut executor_pids = Vec::new();
    for (ns, ip) in net.executors.iter().zip(EXECUTOR_IPS) {
        let pid = pid_in(&remote_dir.join(format!("executor-{ip}.pid")));
        assert!(
            net.pids(ns).contains(&pid),
            "the executor for {ip} (pid {pid}) runs in namespace {ns}:\n{}",
            run.stderr
        );
        let copy = remote_dir.join(format!("executor-{ip}.secret"));
        assert_eq!(
            std::fs::read_to_string(&copy).unwrap(),
            secret,
            "the secret reached {ip}"
        );
        assert_eq!(mode(&copy), 0o600, "{}", copy.display());
        executor_pids.push(pid);
    }
    // The secret is on no command line of any process of the cluster.
    for ns in net.all() {
        for pid in net.pids(ns) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            assert!(
                !String::from_utf8_lossy(&cmdline).contains(secret.trim()),
                "the secret is on the command line of pid {pid} in {ns}"
            );
        }
    }

    // The driver lists both, with ring addresses in their own namespaces.
    let status = net.ringflow(
        &net.driver,
        &["status", "--driver", &url],
        &[("RINGFLOW_SECRET_FILE", &s(&secret_file))],
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

    // Without the right secret, neither an executor nor a job gets in.
    let wrong = dir.path().join("wrong-secret");
    std::fs::write(&wrong, "not-the-secret-of-this-driver-0123").unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let run = net.ringflow(
        &net.executors[0],
        &[
            "executor",
            "--driver",
            &url,
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
    let ckpt = dir.path().join("ckpt");
    let spec = small_mnist_job(dir.path(), "standalone", 2, 1, 256, &ckpt);
    for secret_args in [vec!["--secret-file", wrong.to_str().unwrap()], vec![]] {
        let mut args = vec!["submit", spec.as_str(), "--driver", url.as_str()];
        args.extend(secret_args);
        let run = net.ringflow(&net.driver, &args, &[], Duration::from_secs(90));
        let err = run.assert_clean_failure();
        assert!(err.to_lowercase().contains("secret"), "{args:?}: {err}");
    }

    // A job on both executors; its all-reduce traffic crosses the bridge between them.
    let before = net.traffic();
    let out = dir.path().join("summary.json");
    let run = net.ringflow(
        &net.driver,
        &[
            "submit",
            &spec,
            "--driver",
            &url,
            "--secret-file",
            &s(&secret_file),
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
    // Every byte the executors sent went to the driver or to each other: what the driver did not
    // receive went between the executors' namespaces. A ring all-reduce of two ranks sends
    // each rank's whole gradient once per step; ask for half of that.
    let between = (after.executors_sent - before.executors_sent)
        .saturating_sub(after.driver_received - before.driver_received);
    let params = 784 * 32 + 32 + 32 * 10 + 10;
    let steps = sm["steps"].as_u64().unwrap();
    let expected = 4 * params * steps;
    assert!(
        between >= expected,
        "{between} bytes went between the executors; a ring all-reduce of {steps} steps sends \
         at least {expected}"
    );

    // stop-all.sh stops the executors over ssh and the driver; nothing of ringflow remains.
    let run = net.run(&net.driver, &script("stop-all.sh"), &[], &env, SCRIPT);
    assert_over_ssh(&run, "stop-all.sh", &sshds);
    for pid in executor_pids.iter().chain([&driver_pid]) {
        assert!(!alive(*pid), "pid {pid} still runs:\n{}", run.stderr);
    }
    for ns in net.all() {
        let left: Vec<u32> = net
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
            let f = remote_dir.join(format!("executor-{ip}.{ext}"));
            assert!(!f.exists(), "{} is left", f.display());
        }
    }
    assert!(!run_dir.join("driver.pid").exists());
    eprintln!(
        "standalone: driver {url}, executors at {rings:?} over ssh, test accuracy {accuracy:.4}, \
         {between} bytes between the executor namespaces in {steps} steps"
    );
    drop(sshds);
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

/// Four network namespaces: a driver, two executors and a hub holding the bridge that links
/// them, with veth pairs created right inside them (the root namespace is never touched).
/// Dropping it kills every process in them and deletes them, also when the test panics.
struct Hosts {
    driver: String,
    executors: [String; 2],
    hub: String,
}

impl Hosts {
    fn create() -> Result<Hosts, String> {
        let id = std::process::id();
        let hosts = Hosts {
            driver: format!("rf{id}-drv"),
            executors: [format!("rf{id}-ex1"), format!("rf{id}-ex2")],
            hub: format!("rf{id}-hub"),
        };
        for ns in hosts.all().into_iter().chain([&hosts.hub]) {
            // A name left by an earlier run with this pid is deleted first.
            let _ = ip(&["netns", "del", ns]);
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        ip(&["-n", &hosts.hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &hosts.hub, "link", "set", "br0", "up"])?;
        let ips = [DRIVER_IP, EXECUTOR_IPS[0], EXECUTOR_IPS[1]];
        for (i, (ns, addr)) in hosts.all().into_iter().zip(ips).enumerate() {
            let port = format!("v{i}");
            ip(&[
                "link", "add", &port, "netns", &hosts.hub, "type", "veth", "peer", "name", "eth0",
                "netns", ns,
            ])?;
            ip(&[
                "-n", &hosts.hub, "link", "set", &port, "master", "br0", "up",
            ])?;
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(hosts)
    }

    /// The driver's and the executors' namespaces.
    fn all(&self) -> [&String; 3] {
        [&self.driver, &self.executors[0], &self.executors[1]]
    }

    /// Runs `program ARGS` in namespace `ns` with `env` and no inherited RINGFLOW_* variable.
    fn run(
        &self,
        ns: &str,
        program: &str,
        args: &[&str],
        env: &[(&str, String)],
        deadline: Duration,
    ) -> Run {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, program]).args(args);
        for (name, _) in std::env::vars() {
            if name.starts_with("RINGFLOW_") {
                cmd.env_remove(name);
            }
        }
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        run_command(&mut cmd, deadline)
    }

    /// Runs `ringflow ARGS` in namespace `ns`.
    fn ringflow(&self, ns: &str, args: &[&str], env: &[(&str, &str)], deadline: Duration) -> Run {
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.to_string())).collect();
        self.run(ns, env!("CARGO_BIN_EXE_ringflow"), args, &env, deadline)
    }

    /// The HTTP status of `GET http://ADDR/PATH` from inside `ns` (bash's /dev/tcp: no curl).
    fn http_status(&self, ns: &str, addr: &str, path: &str) -> String {
        let (host, port) = addr.split_once(':').unwrap();
        let probe = format!(
            "exec 3<>/dev/tcp/{host}/{port} && printf 'GET {path} HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3 \
             && read -r _ code _ <&3 && echo \"$code\""
        );
        let run = self.run(ns, "bash", &["-c", &probe], &[], SHORT);
        run.stdout.trim().to_string()
    }

    /// The processes in namespace `ns`.
    fn pids(&self, ns: &str) -> Vec<u32> {
        let out = Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
            .expect("ip runs");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// Bytes the executors sent and the driver received, from their interfaces' counters.
    fn traffic(&self) -> Traffic {
        Traffic {
            executors_sent: self.executors.iter().map(|ns| counter(ns, "tx")).sum(),
            driver_received: counter(&self.driver, "rx"),
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let names = [
            &self.driver,
            &self.executors[0],
            &self.executors[1],
            &self.hub,
        ];
        let deadline = Instant::now() + Duration::from_secs(10);
        for ns in names {
            loop {
                let pids = self.pids(ns);
                if pids.is_empty() || Instant::now() > deadline {
                    break;
                }
                for pid in pids {
                    unsafe {
                        libc::kill(pid as i32, libc::SIGKILL);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

struct Traffic {
    executors_sent: u64,
    driver_received: u64,
}

/// The byte counter `rx` or `tx` of `eth0` in namespace `ns`.
fn counter(ns: &str, dir: &str) -> u64 {
    let out = Command::new("ip")
        .args(["-n", ns, "-j", "-s", "link", "show", "dev", "eth0"])
        .output()
        .expect("ip runs");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("ip -j prints JSON ({e}): {:?}", out));
    json[0]["stats64"][dir]["bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {dir} bytes for eth0 in {ns}: {json}"))
}

/// Runs `ip ARGS` with a deadline; its error output when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let run = run_command(Command::new("ip").args(args), SHORT);
    if run.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), run.stderr.trim()))
    }
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
