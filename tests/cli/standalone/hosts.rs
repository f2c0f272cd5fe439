//! The "hosts" of the standalone test: Linux network namespaces linked by a bridge, the
//! commands run inside them, and the traffic between them.

use std::process::Command;
use std::time::{Duration, Instant};

use super::{DRIVER_IP, EXECUTOR_IPS, SHORT};
use crate::helpers::{Run, run_command};

/// Four network namespaces: a driver, two executors and a hub holding the bridge that links
/// them, with veth pairs created right inside them (the root namespace is never touched).
/// Dropping it kills every process in them and deletes them, also when the test panics.
pub(super) struct Hosts {
    pub(super) driver: String,
    pub(super) executors: [String; 2],
    hub: String,
}

impl Hosts {
    /// Creates the four namespaces (deleting any left by an earlier run with this pid) and
    /// links them; what `ip` said when it cannot.
    pub(super) fn create() -> Result<Hosts, String> {
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
    pub(super) fn all(&self) -> [&String; 3] {
        [&self.driver, &self.executors[0], &self.executors[1]]
    }

    /// Runs `program ARGS` in namespace `ns` with `env` and no inherited RINGFLOW_* variable.
    pub(super) fn run(
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
    pub(super) fn ringflow(
        &self,
        ns: &str,
        args: &[&str],
        env: &[(&str, &str)],
        deadline: Duration,
    ) -> Run {
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.to_string())).collect();
        self.run(ns, env!("CARGO_BIN_EXE_ringflow"), args, &env, deadline)
    }

    /// The HTTP status of `GET http://ADDR/PATH` from inside `ns` (bash's /dev/tcp: no curl).
    pub(super) fn http_status(&self, ns: &str, addr: &str, path: &str) -> String {
        let (host, port) = addr.split_once(':').unwrap();
        let probe = format!(
            "exec 3<>/dev/tcp/{host}/{port} && printf 'GET {path} HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3 \
             && read -r _ code _ <&3 && echo \"$code\""
        );
        let run = self.run(ns, "bash", &["-c", &probe], &[], SHORT);
        run.stdout.trim().to_string()
    }

    /// The processes in namespace `ns`.
    pub(super) fn pids(&self, ns: &str) -> Vec<u32> {
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
    pub(super) fn traffic(&self) -> Traffic {
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

/// Bytes counted on the namespaces' interfaces.
pub(super) struct Traffic {
    /// Sent by the executors.
    pub(super) executors_sent: u64,
    /// Received by the driver.
    pub(super) driver_received: u64,
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
