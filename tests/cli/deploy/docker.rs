//! The Dockerfile (deploy/docker) against the workspace.

use std::collections::BTreeSet;

use super::*;
use crate::helpers::{repo, s};

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
    let ignore = read("deploy/docker/Dockerfile.dockerignore");
    let ignored = ignored_paths(&ignore);
    check_build_stages(&ins);
    check_dependency_layer(&ins, &read("Cargo.toml"));
    check_copies(&ins, &ignored);
    check_runtime_stage(&ins);
    check_shared_libraries();
}

/// What follows the keyword `k` (upper case) in each of its instructions, in order.
fn arguments_of<'a>(ins: &'a [(String, String)], k: &str) -> Vec<&'a str> {
    ins.iter()
        .filter(|(x, _)| x == k)
        .map(|(_, r)| r.as_str())
        .collect()
}

/// The top-level paths that the .dockerignore text `ignore` leaves out; checks it leaves out
/// the repository's history, build outputs and runs.
fn ignored_paths(ignore: &str) -> BTreeSet<&str> {
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
    ignored
}

/// A builder and a runtime stage, the runtime image and features as build arguments, a
/// dependency layer and a cached build that takes FEATURES.
fn check_build_stages(ins: &[(String, String)]) {
    let froms = arguments_of(ins, "FROM");
    assert_eq!(froms.len(), 2, "a builder and a runtime stage: {froms:?}");
    assert!(
        froms[0].starts_with("rust:") && froms[0].ends_with(" AS builder"),
        "{froms:?}"
    );
    assert!(froms[1].starts_with("${RUNTIME_IMAGE}"), "{froms:?}");
    let args = arguments_of(ins, "ARG");
    assert!(
        args.iter().any(|a| a.starts_with("RUNTIME_IMAGE=debian:")),
        "{args:?}"
    );
    assert!(args.iter().any(|a| a.starts_with("FEATURES=")), "{args:?}");
    let runs = arguments_of(ins, "RUN").join("\n");
    assert!(runs.contains("cargo fetch --locked"), "a dependency layer");
    assert!(
        runs.contains("--mount=type=cache"),
        "a BuildKit cache mount for the build"
    );
    assert!(
        runs.contains("--features \"$FEATURES\""),
        "the build takes FEATURES"
    );
}

/// Every workspace member's manifest (in the workspace manifest `cargo`) goes into the
/// dependency layer, with a stub target; the features the image can build exist.
fn check_dependency_layer(ins: &[(String, String)], cargo: &str) {
    let runs = arguments_of(ins, "RUN").join("\n");
    let members_line = cargo
        .lines()
        .find(|l| l.starts_with("members"))
        .expect("members");
    let members: Vec<&str> = members_line.split('"').skip(1).step_by(2).collect();
    assert!(!members.is_empty(), "{members_line}");
    let copies = arguments_of(ins, "COPY");
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
}

/// Every COPY from the build context names paths that exist and are not `ignored`.
fn check_copies(ins: &[(String, String)], ignored: &BTreeSet<&str>) {
    let root = repo();
    for c in arguments_of(ins, "COPY")
        .iter()
        .filter(|c| !c.starts_with("--from"))
    {
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
}

/// The runtime stage runs as a non-root user with `ringflow` as its entry point, exposes the
/// driver's and the UI's ports and checks `/healthz`.
fn check_runtime_stage(ins: &[(String, String)]) {
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
}

/// The binary needs no shared library that a slim base image lacks (skipped without `ldd`).
fn check_shared_libraries() {
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
