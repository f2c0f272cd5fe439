//! The Kubernetes manifests (deploy/k8s) against the Kubernetes schemas and the CLI.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use super::*;
use crate::helpers::{repo, s};

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
