//! Executor processes started by `ringflow local` and `ringflow bench`, which never outlive it.
//!
//! Each child asks the kernel to kill it when its parent dies (`PR_SET_PDEATHSIG`), and is
//! started with `--exit-with-driver`, so it also exits when it cannot reach the driver. On a
//! normal end or a signal the parent stops them itself: SIGTERM, a grace period, then SIGKILL.
//! Until then a watcher thread ([`Children::watch`]) reports each child that ends, with its
//! exit status, as soon as it ends.

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use ringflow_core::security::{SECRET_ENV, Secret};
use ringflow_driver::scheduler::ProcessEnd;

/// How often the watcher looks for children that ended.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// The running executor processes.
pub struct Children {
    procs: Arc<Mutex<Vec<Child>>>,
    /// The watcher thread and the flag that stops it.
    watcher: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Children {
    /// Starts `n` executors of this very binary against `driver_url`, each with `threads`
    /// compute threads and a ring listener on loopback, proving `secret` to it; with `hosts`
    /// above 1, executor `i` claims to be on simulated host `i mod hosts`.
    pub fn spawn(
        n: usize,
        driver_url: &str,
        secret: &Secret,
        threads: usize,
        log: &str,
        hosts: usize,
    ) -> anyhow::Result<Children> {
        let exe = std::env::current_exe().context("cannot find this program's path")?;
        let mut procs = Vec::with_capacity(n);
        let parent = std::process::id() as libc::pid_t;
        for i in 0..n {
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
            if hosts > 1 {
                cmd.args(["--host-identity", &format!("simulated-host-{}", i % hosts)]);
            }
            cmd.env(SECRET_ENV, std::ffi::OsStr::from_bytes(secret.expose()));
            let child = cmd.spawn().context("cannot start an executor process")?;
            procs.push(child);
        }
        let mut me = Children {
            procs: Arc::new(Mutex::new(procs)),
            watcher: None,
        };
        // An executor that exits at once (bad arguments, no port) is reported immediately.
        std::thread::sleep(Duration::from_millis(50));
        if let Some(msg) = me.exited() {
            me.stop(Duration::from_secs(2));
            anyhow::bail!("{msg}");
        }
        Ok(me)
    }

    fn procs(&self) -> MutexGuard<'_, Vec<Child>> {
        self.procs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.procs().iter().map(Child::id).collect()
    }

    /// A description of the first child that has exited, if any.
    pub fn exited(&mut self) -> Option<String> {
        for c in self.procs().iter_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                return Some(format!(
                    "executor process {} {}",
                    c.id(),
                    ProcessEnd::from(status)
                ));
            }
        }
        None
    }

    /// Calls `on_exit(pid, status)` from a watcher thread as soon as a child ends (within
    /// [`WATCH_EVERY`]), once per child, until [`Children::stop`].
    pub fn watch(&mut self, on_exit: impl Fn(u32, ExitStatus) + Send + 'static) {
        let stop = Arc::new(AtomicBool::new(false));
        let (procs, stopping) = (self.procs.clone(), stop.clone());
        let watcher = std::thread::Builder::new()
            .name("ringflow-children".into())
            .spawn(move || {
                let mut reported = HashSet::new();
                while !stopping.load(Ordering::SeqCst) {
                    let ended: Vec<(u32, ExitStatus)> = procs
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter_mut()
                        .filter(|c| !reported.contains(&c.id()))
                        .filter_map(|c| Some((c.id(), c.try_wait().ok()??)))
                        .collect();
                    for (pid, status) in ended {
                        reported.insert(pid);
                        if !stopping.load(Ordering::SeqCst) {
                            on_exit(pid, status);
                        }
                    }
                    std::thread::sleep(WATCH_EVERY);
                }
            });
        match watcher {
            Ok(handle) => self.watcher = Some((stop, handle)),
            Err(e) => tracing::warn!(
                "cannot watch the executor processes ({e}): their loss is noticed by the driver \
                 alone"
            ),
        }
    }

    /// SIGTERM to every child, then SIGKILL to those still running after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        // Ends that follow are asked for, not losses to report.
        if let Some((stop, handle)) = self.watcher.take() {
            stop.store(true, Ordering::SeqCst);
            let _ = handle.join();
        }
        let mut procs = self.procs();
        for c in procs.iter_mut() {
            if let Ok(None) = c.try_wait() {
                // SAFETY: sending a signal to our own child's pid.
                unsafe {
                    libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
                }
            }
        }
        let deadline = Instant::now() + grace;
        for c in procs.iter_mut() {
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
