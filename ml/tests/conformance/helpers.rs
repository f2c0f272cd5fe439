//! Shared machinery: the per-device test macro, seeded inputs, value comparisons and the
//! finite-difference gradient checker.

use ringflow_ml::{Device, GradStore, Tensor, no_grad, rng};

/// What every conformance test returns.
pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `device_test!(name)` turns `fn name(device: Device) -> TestResult` into a module `name` with
/// one `#[test]` per device: `name::cpu` and `name::cuda`. A device this build or machine cannot
/// use is skipped with a note on stderr, so the same suite runs wherever a backend exists.
macro_rules! device_test {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[test]
                fn cpu() {
                    $crate::helpers::run_on(::ringflow_ml::Device::Cpu, super::$name);
                }

                #[test]
                fn cuda() {
                    $crate::helpers::run_on(::ringflow_ml::Device::Cuda(0), super::$name);
                }
            }
        )+
    };
}
pub(crate) use device_test;

/// Runs `test` on `device`, or skips it (printing why) if the device is unavailable.
pub fn run_on(device: Device, test: fn(Device) -> TestResult) {
    if !available(device) {
        return;
    }
    if let Err(e) = test(device) {
        panic!("failed on {device}: {e}");
    }
}

/// Whether `device` can run tests here; if not, says why on stderr. Where
/// `RINGFLOW_REQUIRE_GPU` is set (a run on a GPU machine), an unusable GPU fails the test
/// instead, so that a verification cannot pass by skipping.
pub fn available(device: Device) -> bool {
    match device.check_available() {
        Ok(()) => true,
        Err(e) if device != Device::Cpu && std::env::var_os("RINGFLOW_REQUIRE_GPU").is_some() => {
            panic!("RINGFLOW_REQUIRE_GPU is set, but {device} cannot be used: {e}")
        }
        Err(e) => {
            eprintln!("skipping on {device}: {e}");
            false
        }
    }
}

/// A generator for test inputs; `seed` picks the case.
pub fn test_rng(seed: u64) -> rng::Rng {
    rng::seeded(seed, 100)
}

/// A tensor of uniform values in `[low, high)`.
pub fn uniform(shape: &[usize], low: f32, high: f32, seed: u64, device: Device) -> Tensor {
    Tensor::uniform(shape, low, high, &mut test_rng(seed), device).expect("uniform")
}

/// A parameter of uniform values in `[low, high)`.
pub fn param(shape: &[usize], low: f32, high: f32, seed: u64, device: Device) -> Tensor {
    uniform(shape, low, high, seed, device)
        .into_parameter()
        .expect("parameter")
}

/// A parameter whose values have magnitude in `[min, max)` and a random sign: safely away from
/// zero for kinks (relu) and poles (division).
pub fn param_away_from_zero(
    shape: &[usize],
    min: f32,
    max: f32,
    seed: u64,
    device: Device,
) -> Tensor {
    let mag = uniform(shape, min, max, seed, device).to_vec();
    let sign = uniform(shape, -1.0, 1.0, seed + 1_000, device).to_vec();
    let data = mag
        .iter()
        .zip(&sign)
        .map(|(m, s)| if *s < 0.0 { -m } else { *m })
        .collect();
    Tensor::from_vec(data, shape, device)
        .expect("shape")
        .into_parameter()
        .expect("parameter")
}

/// A constant tensor.
pub fn tensor(data: &[f32], shape: &[usize], device: Device) -> Tensor {
    Tensor::from_vec(data.to_vec(), shape, device).expect("shape")
}

/// Fails unless `got` and `want` have the same length and agree within `tol` elementwise.
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) -> TestResult {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, expected {}", got.len(), want.len()).into());
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let within = (g - w).abs() <= tol;
        if !within {
            return Err(format!(
                "{what}: element {i} is {g}, expected {w} (±{tol})\n got {got:?}\nwant {want:?}"
            )
            .into());
        }
    }
    Ok(())
}

/// Fails with `what` unless `cond` holds.
pub fn ensure(cond: bool, what: impl Into<String>) -> TestResult {
    if cond {
        Ok(())
    } else {
        Err(what.into().into())
    }
}

// ----- gradient checking -------------------------------------------------------------------

/// Step of the central differences (f32 values, so not much smaller).
pub const H: f32 = 1e-2;
/// Allowed error: `|analytic - numeric| <= RTOL · max(1, |numeric|)`. Tight enough that a
/// missing factor of 2 or a flipped sign fails (see `grads::checker_catches_wrong_derivatives`).
pub const RTOL: f64 = 5e-3;

/// The function under test: the inputs (parameters) in, any tensor out.
pub type OpFn<'a> = dyn Fn(&[Tensor]) -> ringflow_ml::Result<Tensor> + 'a;

/// `L = Σ y·R` in f64 for an output `y` computed without a graph.
fn weighted_sum(y: &Tensor, r: &[f32]) -> f64 {
    y.to_vec()
        .iter()
        .zip(r)
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum()
}

/// Random weights `R` for the output of `f`, fixed by `seed`: magnitudes in `[0.5, 1.5)` with
/// random signs, so that no output (a loss, say) is weighted by almost nothing.
pub fn output_weights(
    inputs: &[Tensor],
    f: &OpFn<'_>,
    seed: u64,
) -> Result<Tensor, Box<dyn std::error::Error>> {
    let y = no_grad(|| f(inputs))?;
    let r = param_away_from_zero(y.shape(), 0.5, 1.5, seed ^ 0x5eed, y.device());
    Ok(r.detach()?)
}

/// The gradients of `L = sum(f(inputs) · r)` from `backward`, one flat vector per input (zeros
/// for an input the pass did not reach).
pub fn analytic_grads(
    inputs: &[Tensor],
    f: &OpFn<'_>,
    r: &Tensor,
) -> Result<Vec<Vec<f64>>, Box<dyn std::error::Error>> {
    analytic_grads_into(inputs, f, r, &mut GradStore::new())
}

/// [`analytic_grads`] computed in `grads` (zeroed first), which keeps them for further passes.
pub fn analytic_grads_into(
    inputs: &[Tensor],
    f: &OpFn<'_>,
    r: &Tensor,
    grads: &mut GradStore,
) -> Result<Vec<Vec<f64>>, Box<dyn std::error::Error>> {
    grads.zero();
    let loss = f(inputs)?.mul(r)?.sum_all()?;
    loss.backward_into(grads)?;
    let mut out = Vec::new();
    for (i, x) in inputs.iter().enumerate() {
        match grads.get(x) {
            Some(g) => {
                ensure(
                    g.shape() == x.shape(),
                    format!(
                        "input {i}: gradient shape {:?}, value shape {:?}",
                        g.shape(),
                        x.shape()
                    ),
                )?;
                out.push(g.to_vec().iter().map(|&v| v as f64).collect());
            }
            None => out.push(vec![0.0; x.numel()]),
        }
    }
    Ok(out)
}

/// The same gradients by central differences with step `h`, every `L` computed under
/// `no_grad` and summed in f64.
pub fn numeric_grads(
    inputs: &[Tensor],
    f: &OpFn<'_>,
    r: &Tensor,
    h: f32,
) -> Result<Vec<Vec<f64>>, Box<dyn std::error::Error>> {
    let r = r.to_vec();
    let mut out = Vec::new();
    for x in inputs {
        let original = x.to_vec();
        let mut grads = Vec::with_capacity(original.len());
        for j in 0..original.len() {
            let eval = |delta: f32| -> Result<f64, Box<dyn std::error::Error>> {
                let mut v = original.clone();
                v[j] += delta;
                x.copy_from_slice(&v)?;
                let y = no_grad(|| f(inputs))?;
                Ok(weighted_sum(&y, &r))
            };
            let plus = eval(h)?;
            let minus = eval(-h)?;
            grads.push((plus - minus) / (2.0 * h as f64));
        }
        x.copy_from_slice(&original)?;
        out.push(grads);
    }
    Ok(out)
}

/// Compares analytic with numeric gradients elementwise (see [`RTOL`]).
pub fn compare_grads(analytic: &[Vec<f64>], numeric: &[Vec<f64>], rtol: f64) -> Result<(), String> {
    for (i, (a, n)) in analytic.iter().zip(numeric).enumerate() {
        for (j, (&a, &n)) in a.iter().zip(n).enumerate() {
            let within = (a - n).abs() <= rtol * n.abs().max(1.0);
            if !within {
                return Err(format!(
                    "input {i}, element {j}: backward gives {a:.6}, finite differences {n:.6}"
                ));
            }
        }
    }
    Ok(())
}

/// Checks every input's gradient of `f` against central differences, and that the check is
/// not vacuous (some gradient is clearly non-zero).
///
/// It then checks that gradients add up where they meet: a second backward pass, whose graph
/// feeds every input through an intermediate tensor that `f` is applied to twice, must add
/// exactly twice the gradient again (this runs each op's backward into buffers that already
/// hold a gradient, in the graph and in the parameters).
pub fn check_grads(inputs: &[Tensor], f: &OpFn<'_>) -> TestResult {
    for (i, x) in inputs.iter().enumerate() {
        ensure(
            x.requires_grad() && x.is_leaf(),
            format!("input {i} must be a parameter"),
        )?;
    }
    let r = output_weights(inputs, f, inputs.len() as u64)?;
    let mut grads = GradStore::new();
    let analytic = analytic_grads_into(inputs, f, &r, &mut grads)?;
    let numeric = numeric_grads(inputs, f, &r, H)?;
    compare_grads(&analytic, &numeric, RTOL)?;

    let through: Vec<Tensor> = inputs
        .iter()
        .map(|x| x.scale(1.0))
        .collect::<Result<_, _>>()?;
    let once = f(&through)?.mul(&r)?.sum_all()?;
    let twice = f(&through)?.mul(&r)?.sum_all()?;
    once.add(&twice)?.backward_into(&mut grads)?;
    for (i, (x, a)) in inputs.iter().zip(&analytic).enumerate() {
        let total = grads
            .get(x)
            .map(|g| g.to_vec())
            .unwrap_or_else(|| vec![0.0; x.numel()]);
        for (j, (&t, &a)) in total.iter().zip(a).enumerate() {
            let want = 3.0 * a;
            ensure(
                (t as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                format!(
                    "input {i}, element {j}: gradients do not accumulate: {t} after two passes, expected 3 × {a}"
                ),
            )?;
        }
    }
    for (i, n) in numeric.iter().enumerate() {
        let largest = n.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        ensure(
            largest > 2.0 * RTOL,
            format!(
                "input {i}: every gradient is ~0 (largest {largest}); the check proves nothing"
            ),
        )?;
    }
    Ok(())
}
