//! Gradient compression (`cluster.compression`): jobs whose gradients travel as 16-bit floats.

use std::time::Duration;

use crate::helpers::{
    regression_job, ringflow, s, small_mnist_job, summary, write_regression_data,
};

const LONG: Duration = Duration::from_secs(900);

/// Two executors sending gradients as fp16 reach the accuracy of f32 gradients, and both
/// replicas end bit-identical; the summary says which format the gradients travelled in.
#[test]
fn fp16_gradients_train_mnist_as_well_with_identical_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let mut accuracy = Vec::new();
    for codec in ["none", "fp16"] {
        let ckpt = dir.path().join(codec);
        let spec = small_mnist_job(dir.path(), codec, 2, 2, 64, &ckpt);
        let out = dir.path().join(format!("{codec}.json"));
        let set = format!("cluster.compression={codec}");
        ringflow(
            &["local", &spec, "--set", &set, "--summary-json", &s(&out)],
            LONG,
        )
        .assert_success();
        let sm = summary(&out);
        assert_eq!(sm["compression"], codec, "{sm}");
        assert_eq!(sm["executors"], 2, "{sm}");
        assert_eq!(sm["replicas_identical"], true, "{codec}: {sm}");
        let model = sm["model_path"].as_str().expect("the model is saved");
        assert!(std::path::Path::new(model).is_dir(), "{model}");
        accuracy.push(sm["test_accuracy"].as_f64().unwrap());
    }
    assert!(accuracy[0] >= 0.9, "f32 gradients: {}", accuracy[0]);
    assert!(
        (accuracy[0] - accuracy[1]).abs() <= 0.01,
        "fp16 gradients reached {}, f32 {}: more than a point apart",
        accuracy[1],
        accuracy[0]
    );
}

/// Gradients beyond fp16's range (a regression onto labels in the millions) fail the job
/// with a sentence that names the cause and the way out, not a hang or a panic: on one host,
/// and on two simulated hosts whose leaders send the host sums compressed.
#[test]
fn gradients_beyond_fp16s_range_fail_the_job_with_a_sentence() {
    let dir = tempfile::tempdir().unwrap();
    write_regression_data(dir.path(), &[200, 200], 100);
    let train = s(&dir.path().join("*.parquet"));
    let sql = r#"sql = "SELECT a, b, v, y * 1000000.0 AS y FROM input""#;
    let ckpt = format!("checkpoint_dir = \"{}\"", s(&dir.path().join("ckpt")));
    let cluster = format!("compression = \"fp16\"\n{ckpt}");
    let spec = regression_job(dir.path(), "huge", &train, sql, &cluster);
    for placement in [
        &["--executors", "2"][..],
        &["--executors", "4", "--simulate-hosts", "2"],
    ] {
        let mut args = vec!["local", spec.as_str()];
        args.extend(placement);
        let run = ringflow(&args, LONG);
        let err = run.assert_clean_failure();
        assert!(
            err.contains("sent as fp16 (cluster.compression)")
                && err.contains("65504")
                && err.contains("cluster.compression = \"bf16\""),
            "{placement:?}: {err}"
        );
    }
}
