//! Batched matrix products (the attention layers' products): `bmm` and `bmm_t` against nested
//! loops and finite differences, and their errors.

use ringflow_ml::{Device, Tensor};

use crate::helpers::*;

/// `a[i]·op(b[i])` by the definition, in f64.
fn bmm_reference(a: &[f32], b: &[f32], [batch, m, k, p]: [usize; 4], t: bool) -> Vec<f32> {
    let mut out = Vec::with_capacity(batch * m * p);
    for i in 0..batch {
        for r in 0..m {
            for c in 0..p {
                let sum: f64 = (0..k)
                    .map(|j| {
                        let bv = if t {
                            b[(i * p + c) * k + j]
                        } else {
                            b[(i * k + j) * p + c]
                        };
                        a[(i * m + r) * k + j] as f64 * bv as f64
                    })
                    .sum();
                out.push(sum as f32);
            }
        }
    }
    out
}

fn bmm_matches_nested_loops(device: Device) -> TestResult {
    // One entry (a plain GEMM on CUDA), a few, and more entries than threads (in parallel on
    // the CPU).
    for (seed, dims) in [(1, [1, 3, 4, 2]), (2, [3, 2, 5, 3]), (3, [17, 4, 3, 5])] {
        let [batch, m, k, p] = dims;
        let a = uniform(&[batch, m, k], -1.0, 1.0, seed, device);
        let b = uniform(&[batch, k, p], -1.0, 1.0, seed + 10, device);
        let bt = uniform(&[batch, p, k], -1.0, 1.0, seed + 20, device);
        let got = a.bmm(&b)?;
        ensure(
            got.shape() == [batch, m, p],
            format!("shape {:?}", got.shape()),
        )?;
        let want = bmm_reference(&a.to_vec(), &b.to_vec(), dims, false);
        assert_close(&got.to_vec(), &want, 1e-5, &format!("bmm {dims:?}"))?;
        let got = a.bmm_t(&bt)?;
        let want = bmm_reference(&a.to_vec(), &bt.to_vec(), dims, true);
        assert_close(&got.to_vec(), &want, 1e-5, &format!("bmm_t {dims:?}"))?;
    }
    Ok(())
}

fn grad_bmm(device: Device) -> TestResult {
    let a = param(&[3, 2, 4], -1.0, 1.0, 31, device);
    let b = param(&[3, 4, 3], -1.0, 1.0, 32, device);
    check_grads(&[a.clone(), b], &|t: &[Tensor]| t[0].bmm(&t[1]))
        .map_err(|e| format!("bmm: {e}"))?;
    let bt = param(&[3, 5, 4], -1.0, 1.0, 33, device);
    check_grads(&[a, bt], &|t: &[Tensor]| t[0].bmm_t(&t[1]))
        .map_err(|e| format!("bmm_t: {e}").into())
}

fn bmm_errors(device: Device) -> TestResult {
    let z = |shape: &[usize]| Tensor::zeros(shape, device);
    let cases = [
        (
            z(&[2, 3, 4])?.bmm(&z(&[2, 3, 4])?),
            "bmm: shapes [2, 3, 4] and [2, 3, 4] are not",
        ),
        (
            z(&[2, 3, 4])?.bmm(&z(&[3, 4, 5])?),
            "bmm: shapes [2, 3, 4] and [3, 4, 5]",
        ),
        (
            z(&[3, 4])?.bmm(&z(&[4, 5])?),
            "bmm: shapes [3, 4] and [4, 5] are not batches",
        ),
        (
            z(&[2, 3, 4])?.bmm_t(&z(&[2, 4, 5])?),
            "bmm_t: shapes [2, 3, 4] and [2, 4, 5]",
        ),
    ];
    for (got, want) in cases {
        let err = got.err().ok_or(format!("accepted: {want}"))?.to_string();
        ensure(err.contains(want), format!("{err:?} does not say {want:?}"))?;
    }
    Ok(())
}

device_test!(bmm_matches_nested_loops, grad_bmm, bmm_errors);
