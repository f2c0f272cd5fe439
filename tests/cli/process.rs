//! A long-running `ringflow` process (`local`, `submit`, `driver`, `executor`) that a test
//! follows while it runs: a thread collects its stderr, the test waits for lines, and the
//! process is killed when the value is dropped, so no test leaves one behind.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::helpers::repo;

/// How long [`Process::wait_for`] waits for a line.
const LINE_DEADLINE: Duration = Duration::from_secs(60);

/// A running `ringflow` process and the stderr it printed so far.
pub(crate) struct Process {
    child: Child,
    stderr: Arc<Mutex<String>>,
    /// Set when stderr reached its end (the process exited or closed it).
    closed: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Process {
    /// Starts `ringflow ARGS` in the repository root.
    pub(crate) fn start<S: AsRef<OsStr>>(args: &[S]) -> Process {
        Process::start_in(args, &repo())
    }

    /// Starts `ringflow ARGS` in the working directory `cwd`.
    pub(crate) fn start_in<S: AsRef<OsStr>>(args: &[S], cwd: &Path) -> Process {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringflow"));
        cmd.args(args).current_dir(cwd);
        Process::spawn(cmd)
    }

    /// Starts `cmd`, a `ringflow` command the test prepared (its arguments, working directory,
    /// environment, limits).
    pub(crate) fn spawn(mut cmd: Command) -> Process {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let closed = Arc::new(AtomicBool::new(false));
        let lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (sink, done) = (stderr.clone(), closed.clone());
        let reader = std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
            done.store(true, Ordering::SeqCst);
        });
        Process {
            child,
            stderr,
            closed,
            reader: Some(reader),
        }
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it ended: its stderr reached its end (it exited, and so did every child of its
    /// that shared that stderr).
    pub(crate) fn has_ended(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// What it printed on stderr so far.
    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (at most 60 s) for a stderr line containing `what`; returns that line.
    pub(crate) fn wait_for(&self, what: &str) -> String {
        self.wait_line(what, |l| l.contains(what))
    }

    /// Waits (at most 60 s) for a stderr line starting with `prefix`; returns that line.
    pub(crate) fn wait_for_start(&self, prefix: &str) -> String {
        self.wait_line(prefix, |l| l.starts_with(prefix))
    }

    /// What follows `what` on the first stderr line containing it (waiting as
    /// [`Process::wait_for`] does), trimmed: the URL after "driver listening on ", say.
    pub(crate) fn printed_after(&self, what: &str) -> String {
        let line = self.wait_for(what);
        line.split(what).nth(1).unwrap().trim().to_string()
    }

    fn wait_line(&self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + LINE_DEADLINE;
        loop {
            // Read `closed` first: a line printed before the end is then already collected.
            let closed = self.closed.load(Ordering::SeqCst);
            let stderr = self.stderr();
            if let Some(line) = stderr.lines().find(|l| matches(l)) {
                return line.to_string();
            }
            assert!(
                !closed,
                "ringflow ended without printing {what:?}; it printed:\n{stderr}"
            );
            assert!(
                Instant::now() < deadline,
                "no line with {what:?} within {LINE_DEADLINE:?}; it printed:\n{stderr}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM and waits (at most 20 s) for the process to exit.
    pub(crate) fn terminate(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "ringflow did not exit within 20 s of SIGTERM:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (at most `limit`) for the process to end; returns its status and whole stderr. On
    /// timeout it kills the process (its executors die with it) and fails the test.
    pub(crate) fn finish(mut self, limit: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("ringflow did not end within {limit:?}:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // The rest of stderr, unless a child it left behind still holds the pipe open.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.closed.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(reader) = self.reader.take().filter(|r| r.is_finished()) {
            let _ = reader.join();
        }
        (status, self.stderr())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
