//! The deployment files in `deploy/`: the Kubernetes manifests against the Kubernetes JSON
//! schemas (`kubernetes-validate --strict`), the compose files against the Compose
//! Specification (`docker compose config`), the Dockerfile against the workspace, every
//! `ringflow` flag they pass against the binary's `--help`, and the Slurm script run for real:
//! a driver and two executors on loopback, started through stand-ins for `srun` and `scontrol`,
//! train a small MNIST job.
//!
//! A validator that is not installed makes its test print why it skipped, or fail when
//! `RINGFLOW_REQUIRE_DEPLOY_TOOLS=1` (as in CI).
//!
//! This module holds what the checks share; each file checks one kind of deployment.

mod compose;
mod docker;
mod k8s;
mod slurm;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{Run, ringflow, run_command};

/// Deadline of one validator or `--help` run.
pub(super) const TOOL: Duration = Duration::from_secs(180);
pub(super) const REQUIRE: &str = "RINGFLOW_REQUIRE_DEPLOY_TOOLS";
/// Kubernetes versions whose schemas the manifests must satisfy: an older and a recent one.
pub(super) const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.35.0"];

/// Says that `what` is missing: a failure under RINGFLOW_REQUIRE_DEPLOY_TOOLS=1, else a skip.
pub(super) fn missing(what: &str) {
    let required = std::env::var(REQUIRE).is_ok_and(|v| v == "1");
    assert!(!required, "{what}, and {REQUIRE}=1 requires it");
    eprintln!("skipped: {what} (with {REQUIRE}=1 this fails)");
}

/// `name` found on PATH.
pub(super) fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Runs `argv` from the repository root with the tool deadline.
pub(super) fn tool<S: AsRef<std::ffi::OsStr>>(argv: &[S]) -> Run {
    run_command(Command::new(&argv[0]).args(&argv[1..]), TOOL)
}

pub(super) fn assert_ran(run: &Run, what: &str) {
    let (out, err) = (&run.stdout, &run.stderr);
    assert!(
        run.status.success(),
        "{what} failed ({}):\n{out}\n{err}",
        run.status
    );
}

/// The elements of a JSON array (none for anything else).
pub(super) fn items(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

pub(super) fn strings(v: &Value) -> Vec<String> {
    items(v)
        .map(|x| x.as_str().unwrap_or_default().to_string())
        .collect()
}

/// The port of an address such as `0.0.0.0:4041`.
pub(super) fn port_of(addr: &str) -> Option<u64> {
    addr.rsplit(':').next()?.parse().ok()
}

/// The documents of each YAML file, as JSON (python3 with PyYAML); None without them.
pub(super) fn yaml_documents(files: &[PathBuf]) -> Option<Vec<Vec<Value>>> {
    let python = on_path("python3")?;
    let code = "import json, sys, yaml\nprint(json.dumps([[d for d in yaml.safe_load_all(open(p)) \
                if d is not None] for p in sys.argv[1:]]))";
    let run = run_command(Command::new(python).arg("-c").arg(code).args(files), TOOL);
    if run.stderr.contains("No module named 'yaml'") {
        return None;
    }
    assert_ran(&run, "parsing YAML");
    Some(serde_json::from_str(&run.stdout).expect("python printed JSON"))
}

/// Checks `ringflow` command lines against the flags that `ringflow SUBCOMMAND --help` lists.
#[derive(Default)]
pub(super) struct Cli(BTreeMap<String, BTreeSet<String>>);

impl Cli {
    /// Checks `SUBCOMMAND ARGS...`: a daemon or client subcommand and only flags its `--help`
    /// lists. Returns each flag's value (the next argument, or what follows `=`).
    pub(super) fn check(
        &mut self,
        at: &str,
        args: &[String],
        errors: &mut Vec<String>,
    ) -> BTreeMap<String, String> {
        let mut values = BTreeMap::new();
        let sub = args.first().map(String::as_str).unwrap_or_default();
        if !["driver", "executor", "submit", "status", "cancel"].contains(&sub) {
            errors.push(format!(
                "{at}: {sub:?} is not a ringflow subcommand it should run"
            ));
            return values;
        }
        let known = self.0.entry(sub.to_string()).or_insert_with(|| {
            let run = ringflow(&[sub, "--help"], TOOL);
            run.assert_success();
            let options = run
                .stdout
                .lines()
                .filter(|l| l.trim_start().starts_with('-'));
            let flags = options.filter_map(|l| l.split_whitespace().find(|t| t.starts_with("--")));
            flags
                .map(|t| {
                    t.trim_end_matches(|c: char| !c.is_alphanumeric())
                        .to_string()
                })
                .collect()
        });
        for (i, arg) in args.iter().enumerate().filter(|(_, a)| a.starts_with("--")) {
            let (flag, value) = match arg.split_once('=') {
                Some((f, v)) => (f.to_string(), v.to_string()),
                None => (arg.clone(), args.get(i + 1).cloned().unwrap_or_default()),
            };
            if !known.contains(&flag) {
                errors.push(format!(
                    "{at}: `ringflow {sub}` has no flag {flag} (it has {known:?})"
                ));
            }
            values.insert(flag, value);
        }
        values
    }
}
