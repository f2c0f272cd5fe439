//! The `cuda` feature end to end, on the CUDA emulator of `testing/cuda-emulator` (this module is
//! built only with `--features cuda`; `testing/run-tests.sh` runs it with `--features nccl`, which adds the
//! NCCL test).
//!
//! The emulator stands in for `libcuda` and cuBLAS, so the same binary that runs on a GPU machine
//! opens devices, compiles `kernels.cu` with the real NVRTC, and trains through every kernel and
//! the caching allocator, on the CPU. It proves the GPU path's logic (placement, staging through
//! the ring, results equal to the CPU's, errors), not its speed: `benches/gpu_verify.sh` is the
//! check on real GPUs.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use crate::helpers::*;

const DEADLINE: Duration = Duration::from_secs(300);

/// The emulator, built by the tests, and NVRTC's directory.
struct Libraries {
    emulator: PathBuf,
    nvrtc: PathBuf,
}

impl Libraries {
    /// The library path that makes the emulator the CUDA driver and cuBLAS, with NVRTC beside it.
    fn cuda(&self) -> String {
        format!("{}:{}", s(&self.emulator), s(&self.nvrtc))
    }

    /// [`Libraries::cuda`] with the emulator's NCCL too.
    fn cuda_and_nccl(&self) -> String {
        format!("{}:{}", self.cuda(), s(&self.emulator.join("nccl")))
    }

    /// NVRTC alone: no CUDA driver library.
    fn no_driver(&self) -> String {
        s(&self.nvrtc)
    }
}

/// The emulator's libraries, or `None` (after saying why) where NVRTC is not installed, unless
/// `RINGFLOW_REQUIRE_CUDA_EMULATOR` is set, which turns that into a failure.
fn libraries() -> Option<&'static Libraries> {
    static LIBRARIES: OnceLock<Option<Libraries>> = OnceLock::new();
    LIBRARIES
        .get_or_init(|| {
            let Some(nvrtc) = nvrtc_dir() else {
                assert!(
                    std::env::var_os("RINGFLOW_REQUIRE_CUDA_EMULATOR").is_none(),
                    "RINGFLOW_REQUIRE_CUDA_EMULATOR is set, but no libnvrtc.so was found in \
                     target/nvrtc or on LD_LIBRARY_PATH"
                );
                eprintln!(
                    "skipping: NVRTC (libnvrtc.so) is not installed; see testing/cuda-emulator"
                );
                return None;
            };
            let emulator = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-emulator");
            let build = run_program(
                &repo().join("testing/cuda-emulator/build.sh"),
                &[&s(&emulator)],
                DEADLINE,
            );
            assert!(
                build.status.success(),
                "the CUDA emulator did not build:\n{}",
                build.stderr
            );
            Some(Libraries { emulator, nvrtc })
        })
        .as_ref()
}

/// A directory holding `libnvrtc.so.12`: pip's wheel under `target/nvrtc` (as
/// `testing/run-tests.sh` installs it), or one on `LD_LIBRARY_PATH`.
fn nvrtc_dir() -> Option<PathBuf> {
    let wheel = repo().join("target/nvrtc/nvidia/cuda_nvrtc/lib");
    let inherited = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    std::iter::once(wheel)
        .chain(
            inherited
                .split(':')
                .filter(|d| !d.is_empty())
                .map(PathBuf::from),
        )
        .find(|d| d.join("libnvrtc.so.12").exists() || d.join("libnvrtc.so").exists())
}

/// Whether the dynamic loader knows a real `libcuda` (a GPU machine).
fn system_has_libcuda() -> bool {
    std::process::Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so"))
        .unwrap_or(false)
}

/// Runs `ringflow ARGS` with the emulator as its CUDA and `extra` in its environment.
fn on_emulator(library_path: &str, args: &[&str], extra: &[(&str, Option<&str>)]) -> Run {
    let mut env = vec![("LD_LIBRARY_PATH", Some(library_path))];
    env.extend_from_slice(extra);
    ringflow_env(args, &env, DEADLINE)
}

/// Trains the small MNIST job for one epoch on two executors on `device` with `libs` as the
/// library path and two emulated GPUs; returns the summary and the log (executors' debug lines
/// included).
fn train_mnist(libs: &str, device: &str) -> (serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let spec = small_mnist_job(dir.path(), device, 2, 1, 128, &dir.path().join("ckpt"));
    let out = dir.path().join("summary.json");
    let device_setting = format!("cluster.device={device}");
    let run = on_emulator(
        libs,
        &[
            "local",
            &spec,
            "--set",
            &device_setting,
            "--ui",
            "off",
            "--log",
            "info,ringflow_executor=debug",
            "--summary-json",
            &s(&out),
        ],
        &[("CUDA_EMULATOR_DEVICES", Some("2"))],
    );
    run.assert_success();
    (summary(&out), run.stderr)
}

/// The checks every emulated-GPU run must pass against the CPU's run of the same job.
fn assert_same_training(gpu: &serde_json::Value, cpu: &serde_json::Value, log: &str) {
    // Each executor took the GPU of its local rank and compiled the kernels for it.
    for rank in 0..2 {
        assert!(
            log.contains(&format!("trains on cuda:{rank} (local rank {rank} of 2")),
            "executor of local rank {rank} is not on cuda:{rank}:\n{log}"
        );
        assert!(
            log.contains(&format!("cuda:{rank} is ringflow CUDA emulator")),
            "{log}"
        );
        assert!(
            log.lines().any(|l| l
                .contains(&format!("rank {rank} epoch 0: cuda:{rank} allocator: "))
                && l.contains("requests this epoch reused a cached block")),
            "no allocator report of rank {rank}:\n{log}"
        );
    }
    assert!(
        !log.contains("cuda-emulator:"),
        "the emulator refused a call:\n{log}"
    );
    assert_eq!(gpu["status"], "succeeded");
    assert_eq!(gpu["replicas_identical"], true, "{gpu}");
    let acc = |v: &serde_json::Value| v["test_accuracy"].as_f64().expect("an accuracy");
    let loss = |v: &serde_json::Value| v["final_train_loss"].as_f64().expect("a loss");
    assert!(
        acc(cpu) > 0.85,
        "the CPU reference learned too little: {cpu}"
    );
    assert!(
        (acc(gpu) - acc(cpu)).abs() <= 0.01,
        "accuracy on cuda {} against {} on the cpu",
        acc(gpu),
        acc(cpu)
    );
    assert!(
        (loss(gpu) - loss(cpu)).abs() <= 1e-3 * loss(cpu).abs().max(1.0),
        "final loss on cuda {} against {} on the cpu",
        loss(gpu),
        loss(cpu)
    );
    // Float32 on two backends: equal results to the tolerance, not bit for bit.
    assert_ne!(
        gpu["param_checksum"], cpu["param_checksum"],
        "was cuda used?"
    );
}

#[test]
fn mnist_trains_on_two_emulated_gpus_to_the_cpus_result() {
    let Some(libs) = libraries() else {
        return;
    };
    // Without NCCL on the library path the gradients cross the TCP ring, staged through
    // page-locked buckets.
    let (cpu, _) = train_mnist(&libs.cuda(), "cpu");
    let (gpu, log) = train_mnist(&libs.cuda(), "cuda");
    assert_same_training(&gpu, &cpu, &log);
    for rank in 0..2 {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("rank {rank} epoch 0: "))
                    && l.contains(&format!("the ring's buckets on cuda:{rank}) took"))),
            "no staging report of rank {rank}:\n{log}"
        );
    }
    assert!(!log.contains("with NCCL"), "{log}");
}

/// With the `nccl` feature and NCCL on the library path, the two executors (one host, a GPU
/// each) average gradients with NCCL on the devices instead of the TCP ring.
#[cfg(feature = "nccl")]
#[test]
fn nccl_averages_gradients_between_emulated_gpus_of_one_host() {
    let Some(libs) = libraries() else {
        return;
    };
    let (cpu, _) = train_mnist(&libs.cuda(), "cpu");
    let (gpu, log) = train_mnist(&libs.cuda_and_nccl(), "cuda");
    assert_same_training(&gpu, &cpu, &log);
    for rank in 0..2 {
        assert!(
            log.contains(&format!(
                "rank {rank} all-reduces gradients with NCCL on cuda:{rank}"
            )),
            "{log}"
        );
    }
    assert!(!log.contains("gradient staging"), "{log}");
}

#[test]
fn cuda_jobs_without_a_visible_gpu_or_with_too_little_memory_fail_in_one_sentence() {
    let Some(libs) = libraries() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spec = small_mnist_job(dir.path(), "gpu", 2, 1, 128, &dir.path().join("ckpt"));
    let args = [
        "local",
        &spec,
        "--set",
        "cluster.device=cuda",
        "--ui",
        "off",
    ];

    // No driver library at all (unless the machine has a real one): refused before any
    // executor starts, naming the library.
    if !system_has_libcuda() {
        let run = on_emulator(&libs.no_driver(), &args, &[]);
        let err = run.assert_clean_failure();
        assert!(
            err.contains(
                "the CUDA driver library (libcuda.so; is the NVIDIA driver installed?) \
                          was not found"
            ),
            "{err}"
        );
    }

    // A driver but no device: refused before any executor starts.
    let run = on_emulator(&libs.cuda(), &args, &[("CUDA_VISIBLE_DEVICES", Some(""))]);
    let err = run.assert_clean_failure();
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(lines.len(), 1, "one error line:\n{err}");
    assert!(
        lines[0].contains("cluster.device = \"cuda\"")
            && lines[0].contains("no CUDA device with CUDA_VISIBLE_DEVICES=\"\""),
        "{err}"
    );

    // A device too small for the model: the job fails naming the executor and the device.
    let run = on_emulator(
        &libs.cuda(),
        &args,
        &[("CUDA_EMULATOR_MEMORY_MB", Some("1"))],
    );
    let err = run.assert_clean_failure();
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .expect("an error line");
    assert!(
        line.contains("executor exec-") && line.contains("cuda:0 is out of memory"),
        "{err}"
    );
}

#[test]
fn bench_train_on_an_emulated_gpu_matches_the_cpu_and_reuses_cached_blocks() {
    let Some(libs) = libraries() else {
        return;
    };
    let report = |device: &str| {
        let run = on_emulator(
            &libs.cuda(),
            &[
                "bench",
                "train",
                "--device",
                device,
                "--layers",
                "784,64,10",
                "--batch",
                "64",
                "--steps",
                "30",
                "--warmup",
                "5",
                "--optimizer",
                "adam",
                "--json",
            ],
            &[],
        );
        run.assert_success();
        serde_json::from_str::<serde_json::Value>(run.stdout.trim()).expect("one JSON line")
    };
    let (gpu, cpu) = (report("cuda"), report("cpu"));
    let f = |v: &serde_json::Value, key: &str| v[key].as_f64().expect(key);
    for key in ["first_loss", "final_loss"] {
        assert!(
            (f(&gpu, key) - f(&cpu, key)).abs() <= 1e-4,
            "{key}: {gpu}\n{cpu}"
        );
    }
    assert!(f(&gpu, "final_loss") < f(&gpu, "first_loss") - 0.3, "{gpu}");
    // After the first step every block comes from the pool: 35 steps of the same sizes leave
    // only the first step's requests as misses.
    let hit_rate = f(&gpu, "allocator_hit_rate");
    assert!(hit_rate >= 0.9, "allocator hit rate {hit_rate}: {gpu}");
    assert!(cpu["allocator_hit_rate"].is_null(), "{cpu}");
}
