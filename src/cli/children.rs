//! Executor processes started by `ringflow local` and `ringflow bench`, which never outlive it.
//!
//! Each child asks the kernel to kill it when its parent dies (`PR_SET_PDEATHSIG`), and is
//! started with `--exit-with-driver`, so it also exits when it cannot reach the driver. On a
//! normal end or a signal the parent stops them itself: SIGTERM, a grace period, then SIGKILL.

use std::os::unix::ffi::OsStrExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use ringflow_proto::security::{SECRET_ENV, Secret};

/// The running executor processes.
pub struct Children {
    procs: Vec<Child>,
}

impl Children {
    /// Starts `n` executors of this very binary against `driver_url`, each with `threads`
    /// compute threads and a ring listener on loopback, proving `secret` to it.
    pub fn spawn(
        n: usize,
        driver_url: &str,
        secret: &Secret,
        threads: usize,
        log: &str,
    ) -> anyhow::Result<Children> {
        let exe = std::env::current_exe().context("cannot find this program's path")?;
        let mut procs = Vec::with_capacity(n);
        let parent = std::process::id() as libc::pid_t;
        for _ in 0..n {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "executor",
                "--driver",
                driver_url,
                "--cores",
                &threads.to_string(),
                "--ring-bind",
                "127.0.0.1:0",
                "--exit-with-driver",
                "10",
                "--quiet",
                "--log",
                log,
            ])
            // The secret travels in the environment, never on a command line.
            .env_remove("RINGFLOW_SECRET_FILE")
            .env_remove(SECRET_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
            // SAFETY: between fork and exec only async-signal-safe calls are made (prctl,
            // getppid, _exit), and no memory is allocated.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    if libc::getppid() != parent {
                        libc::_exit(1);
                    }
                    Ok(())
                });
            }
            cmd.env(SECRET_ENV, std::ffi::OsStr::from_bytes(secret.expose()));
            let child = cmd.spawn().context("cannot start an executor process")?;
            procs.push(child);
        }
        let mut me = Children { procs };
        // An executor that exits at once (bad arguments, no port) is reported immediately.
        std::thread::sleep(Duration::from_millis(50));
        if let Some(msg) = me.exited() {
            me.stop(Duration::from_secs(2));
            anyhow::bail!("{msg}");
        }
        Ok(me)
    }

    /// The process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(Child::id).collect()
    }

    /// A description of the first child that has exited, if any.
    pub fn exited(&mut self) -> Option<String> {
        for c in &mut self.procs {
            if let Ok(Some(status)) = c.try_wait() {
                return Some(format!("executor process {} exited ({status})", c.id()));
            }
        }
        None
    }

    /// SIGTERM to every child, then SIGKILL to those still running after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        for c in &mut self.procs {
            if let Ok(None) = c.try_wait() {
                // SAFETY: sending a signal to our own child's pid.
                unsafe {
                    libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
                }
            }
        }
        let deadline = Instant::now() + grace;
        for c in &mut self.procs {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}
