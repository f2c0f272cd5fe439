//! Invalid arguments: every one is an `Err` with a useful message, never a panic.

use ndarray::{ArrayD, IxDyn};
use ringflow_ml::backend::{BinaryOp, Storage};
use ringflow_ml::loss;
use ringflow_ml::{Device, MlError, Tensor};

use crate::helpers::*;

/// Every invalid call is an `Err`; a panic fails the test.
fn invalid_arguments_are_errors(device: Device) -> TestResult {
    let m23 = Tensor::zeros(&[2, 3], device)?;
    let m32 = Tensor::zeros(&[3, 2], device)?;
    let v3 = Tensor::zeros(&[3], device)?;
    let v2 = Tensor::zeros(&[2], device)?;
    let scalar = Tensor::scalar(1.0, device)?;
    let cases: Vec<(&str, ringflow_ml::Result<Tensor>)> = vec![
        ("matmul [2,3]·[2,3]", m23.matmul(&m23)),
        ("matmul [3]·[3,2]", v3.matmul(&m32)),
        ("matmul []·[3,2]", scalar.matmul(&m32)),
        ("add [2,3]+[3,2]", m23.add(&m32)),
        ("add [2,3]+[2]", m23.add(&v2)),
        ("mul [3,2]*[3]", m32.mul(&v3)),
        ("reshape to 5 elements", m23.reshape(&[5])),
        ("permute with a repeated axis", m23.permute(&[0, 0])),
        ("permute with too few axes", m23.permute(&[1])),
        ("permute with a bad axis", m23.permute(&[0, 2])),
        ("transpose axis 2 of a matrix", m23.transpose(0, 2)),
        ("transpose axis -3 of a matrix", m23.transpose(-3, 0)),
        ("narrow past the end", m23.narrow(1, 2, 2)),
        ("narrow on a missing axis", m23.narrow(2, 0, 1)),
        (
            "narrow with start + len overflowing",
            m23.narrow(1, usize::MAX, 2),
        ),
        ("concat of nothing", Tensor::concat(&[], 0)),
        (
            "concat [2,3] with [3,2] on axis 0",
            Tensor::concat(&[&m23, &m32], 0),
        ),
        (
            "concat [2,3] with [3] on axis 0",
            Tensor::concat(&[&m23, &v3], 0),
        ),
        ("concat on axis 2", Tensor::concat(&[&m23, &m23], 2)),
        ("softmax on axis 2", m23.softmax(2)),
        ("log_softmax on axis -3", m23.log_softmax(-3)),
        ("sum on axis 2", m23.sum(2, false)),
        ("mean on axis -3", m23.mean(-3, true)),
        (
            "index_select with index 3 of 3 rows",
            m32.index_select(&tensor(&[0., 3.], &[2], device)),
        ),
        (
            "index_select with index -1",
            m32.index_select(&tensor(&[-1.], &[1], device)),
        ),
        (
            "index_select with index 0.5",
            m32.index_select(&tensor(&[0.5], &[1], device)),
        ),
        (
            "index_select of a scalar",
            scalar.index_select(&tensor(&[0.], &[1], device)),
        ),
        (
            "from_vec with 5 values for [2,3]",
            Tensor::from_vec(vec![0.0; 5], &[2, 3], device),
        ),
        (
            "bce with shapes [3] and [2]",
            loss::binary_cross_entropy_with_logits(&v3, &v2),
        ),
        ("cross_entropy of [3] logits", loss::cross_entropy(&v3, &v3)),
        (
            "cross_entropy with 3 labels for 2 rows",
            loss::cross_entropy(&m23, &v3),
        ),
        ("mse with shapes [2,3] and [3,2]", loss::mse(&m23, &m32)),
    ];
    for (what, result) in cases {
        ensure(result.is_err(), format!("{what} must be an error"))?;
    }
    ensure(m23.item().is_err(), "item of 6 elements must be an error")?;
    ensure(
        m23.copy_from_slice(&[1.0; 5]).is_err(),
        "copy_from_slice of 5 values into 6",
    )?;
    Ok(())
}

/// Axis ops on a 0-dimensional tensor: a value or an error, but never a panic.
fn axis_ops_on_scalars_do_not_panic(device: Device) -> TestResult {
    let s = Tensor::scalar(2.0, device)?.into_parameter()?;
    let results = [
        ("sum(0)", s.sum(0, false)),
        ("mean(-1, keepdim)", s.mean(-1, true)),
        ("softmax(0)", s.softmax(0)),
        ("log_softmax(-1)", s.log_softmax(-1)),
        ("narrow(0, 0, 1)", s.narrow(0, 0, 1)),
        ("transpose(0, 0)", s.transpose(0, 0)),
        ("concat(0)", Tensor::concat(&[&s, &s], 0)),
        ("permute([])", s.permute(&[])),
        ("reshape([1, 1])", s.reshape(&[1, 1])),
    ];
    for (what, r) in results {
        if let Ok(t) = r {
            // Whatever the op returns must also be differentiable without panicking.
            if t.numel() == 1 {
                t.sum_all()?
                    .backward()
                    .map_err(|e| format!("{what}: {e}"))?;
            }
        }
    }
    Ok(())
}

fn cross_entropy_label_errors_name_the_label(device: Device) -> TestResult {
    let logits = Tensor::zeros(&[3, 4], device)?;
    for (bad, shown) in [(7.0, "7"), (4.0, "4"), (-1.0, "-1"), (1.5, "1.5")] {
        let labels = tensor(&[0., bad, 2.], &[3], device);
        match loss::cross_entropy(&logits, &labels) {
            Ok(_) => return Err(format!("label {bad} with 4 classes was accepted").into()),
            Err(e) => ensure(
                e.to_string().contains(shown),
                format!("the error for label {bad} does not name it: {e}"),
            )?,
        }
    }
    Ok(())
}

/// Labels checked on the host as they are made: bad ones are refused there, naming the
/// position, and good ones serve the loss (which then skips its own check).
fn indices_are_checked_on_the_host(device: Device) -> TestResult {
    for (bad, at) in [(vec![0.0, 3.0], 1), (vec![1.5], 0), (vec![-1.0], 0)] {
        let message = match Tensor::from_indices(bad.clone(), &[bad.len()], 3, device) {
            Err(e) => e.to_string(),
            Ok(_) => return Err(format!("{bad:?} was accepted below 3").into()),
        };
        ensure(
            message.contains(&format!("position {at}")) && message.contains("0..3"),
            format!("unclear error: {message}"),
        )?;
    }
    let labels = Tensor::from_indices(vec![2.0, 0.0], &[2], 3, device)?;
    let logits = tensor(&[0., 0., 5., 5., 0., 0.], &[2, 3], device);
    let by_check = loss::cross_entropy(&logits, &tensor(&[2., 0.], &[2], device))?.item()?;
    let checked_before = loss::cross_entropy(&logits, &labels)?.item()?;
    ensure(by_check == checked_before, "the same loss either way")?;
    // A bound checked for more classes than the loss has does not skip the loss's own check.
    let wide = Tensor::from_indices(vec![2.0, 5.0], &[2], 6, device)?;
    ensure(
        loss::cross_entropy(&logits, &wide).is_err(),
        "label 5 of 3 classes is refused",
    )
}

device_test!(
    indices_are_checked_on_the_host,
    invalid_arguments_are_errors,
    axis_ops_on_scalars_do_not_panic,
    cross_entropy_label_errors_name_the_label,
);

/// `(op, first, other)` must be a device error that names `op` and both devices.
fn names_both(result: ringflow_ml::Result<impl Sized>, op: &str, first: &str, other: &str) {
    match result {
        Err(MlError::Device(message)) => assert_eq!(
            message,
            format!(
                "{op}: tensors on {first} and {other} cannot be combined; move them to one device first"
            )
        ),
        Err(e) => panic!("{op}: not a device error: {e}"),
        Ok(_) => panic!("{op}: tensors on {first} and {other} were combined"),
    }
}

/// Operands on two devices are refused with one sentence naming both, whether the tensors
/// (the autodiff ops), the backends (the dispatch of `Storage`) or two GPUs (the CUDA backend's
/// launch) differ. Runs where a GPU can be used; the two-GPU case where there are two (the
/// CUDA emulator with `CUDA_EMULATOR_DEVICES=2`).
#[test]
fn operands_on_two_devices_are_refused_naming_both() {
    let gpu = Device::Cuda(0);
    if !available(gpu) {
        return;
    }
    let on = |device| Storage::from_host(ArrayD::ones(IxDyn(&[2, 3])), device).expect("upload");
    let (host, first_gpu) = (on(Device::Cpu), on(gpu));
    names_both(
        host.binary(BinaryOp::Add, &first_gpu, &[2, 3]),
        "binary op",
        "cpu",
        "cuda",
    );
    let (a, b) = (
        Tensor::zeros(&[2], Device::Cpu).expect("cpu"),
        Tensor::zeros(&[2], gpu).expect("gpu"),
    );
    names_both(a.add(&b), "add", "cpu", "cuda");
    if Device::cuda_devices().len() < 2 {
        eprintln!("skipping the two-GPU case: one CUDA device");
        return;
    }
    let mut second_gpu = on(Device::Cuda(1));
    names_both(
        second_gpu.add_assign(&first_gpu),
        "accumulate",
        "cuda:1",
        "cuda",
    );
    names_both(
        first_gpu.binary(BinaryOp::Mul, &second_gpu, &[2, 3]),
        "binary op",
        "cuda",
        "cuda:1",
    );
}
