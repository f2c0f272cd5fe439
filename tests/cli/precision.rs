//! Matrix products in bf16 (`train.matmul_precision`): jobs whose products round their operands
//! to bfloat16 and sum in f32.

use std::time::Duration;

use crate::helpers::{repo, ringflow, s, small_mnist_job, summary};

const LONG: Duration = Duration::from_secs(900);

/// An MLP trained with bf16 products reaches the accuracy of f32 products on MNIST, along a
/// different path (its loss differs: the products really were rounded); the summary names the
/// precision and the executor's log says how this CPU computes it. `eval` of the saved model
/// multiplies at the model's precision too: it reproduces the training job's test accuracy.
#[test]
fn bf16_products_train_mnist_as_well_as_f32_products() {
    let dir = tempfile::tempdir().unwrap();
    let mut runs = Vec::new();
    for precision in ["f32", "bf16"] {
        let ckpt = dir.path().join(precision);
        let spec = small_mnist_job(dir.path(), precision, 1, 2, 64, &ckpt);
        let out = dir.path().join(format!("{precision}.json"));
        let set = format!("train.matmul_precision=\"{precision}\"");
        let args = ["--log", "info", "local", &spec, "--set", &set];
        let run = ringflow(&[&args[..], &["--summary-json", &s(&out)]].concat(), LONG);
        run.assert_success();
        let said = run.stderr.contains("matrix products in bf16 with f32 sums");
        assert_eq!(said, precision == "bf16", "{precision}: {}", run.stderr);
        let sm = summary(&out);
        assert_eq!(sm["matmul_precision"], precision, "{sm}");
        let accuracy = sm["test_accuracy"].as_f64().unwrap();
        runs.push((accuracy, sm["final_train_loss"].as_f64().unwrap()));
        let model = sm["model_path"].as_str().expect("the model is saved");
        assert_eq!(eval_accuracy(model, dir.path(), precision), accuracy);
    }
    let ((f32_accuracy, f32_loss), (bf16_accuracy, bf16_loss)) = (runs[0], runs[1]);
    assert!(f32_accuracy >= 0.9, "f32 products: {f32_accuracy}");
    assert!(
        (f32_accuracy - bf16_accuracy).abs() <= 0.01,
        "bf16 products reached {bf16_accuracy}, f32 {f32_accuracy}: more than a point apart"
    );
    assert_ne!(f32_loss, bf16_loss, "bf16 products gave f32's very loss");
}

/// `ringflow eval` of `model` on the MNIST test split: its test accuracy, after checking that
/// the executor's log names bf16 products exactly when the model was trained with them.
fn eval_accuracy(model: &str, dir: &std::path::Path, precision: &str) -> f64 {
    let test = s(&repo().join("examples/data/mnist/test.parquet"));
    let out = dir.join(format!("{precision}-eval.json"));
    let args = ["--log", "info", "eval", "--model", model, "--data", &test];
    let run = ringflow(&[&args[..], &["--summary-json", &s(&out)]].concat(), LONG);
    run.assert_success();
    let said = run.stderr.contains("matrix products in bf16 with f32 sums");
    assert_eq!(
        said,
        precision == "bf16",
        "eval of {precision}: {}",
        run.stderr
    );
    summary(&out)["test_accuracy"].as_f64().unwrap()
}

/// A precision the engine does not have is refused before anything runs, naming the key and
/// the values it takes.
#[test]
fn an_unknown_matmul_precision_is_refused_with_the_values_it_takes() {
    let dir = tempfile::tempdir().unwrap();
    let spec = small_mnist_job(dir.path(), "fp8", 1, 1, 64, &dir.path().join("ckpt"));
    let run = ringflow(
        &["local", &spec, "--set", "train.matmul_precision=\"fp8\""],
        LONG,
    );
    let err = run.assert_clean_failure();
    assert!(
        err.contains("matmul_precision") && err.contains("`f32`") && err.contains("`bf16`"),
        "{err}"
    );
}
