//! Matrix products (2-D), batched matrix products (3-D, with the right operand optionally read
//! transposed), the fused affine layer `x·W + b` and `x + a·b`, through the backend's GEMM.

use crate::autodiff::{Backward, GradSink};
use crate::backend::{MatmulOptions, Storage};
use crate::error::{MlError, Result};
use crate::ops::same_device;
use crate::tensor::Tensor;

/// `C = A·B  ⇒  dA = dC·Bᵀ,  dB = Aᵀ·dC`, written by GEMM straight into the gradient buffers.
fn matmul_grads(a: &Tensor, b: &Tensor, g: &Storage, sink: &mut GradSink) -> Result<()> {
    if sink.wants(a) {
        let b_val = b.read();
        sink.add_matmul(a, g, false, &b_val, true)?;
    }
    if sink.wants(b) {
        let a_val = a.read();
        sink.add_matmul(b, &a_val, true, g, false)?;
    }
    Ok(())
}

struct MatmulBackward;

impl Backward for MatmulBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        matmul_grads(&inputs[0], &inputs[1], g, sink)
    }
}

/// `C = X + A·B  ⇒  dX = dC`, and the product's gradients.
struct AddmmBackward;

impl Backward for AddmmBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        matmul_grads(&inputs[1], &inputs[2], g, sink)?;
        sink.add_reduced_ref(&inputs[0], g)
    }
}

struct LinearBackward;

impl Backward for LinearBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        matmul_grads(&inputs[0], &inputs[1], g, sink)?;
        sink.add_reduced_ref(&inputs[2], g)
    }
}

/// `C[i] = A[i]·op(B[i])`, `op` a transpose when `transpose_b`:
/// `dA = dC·op(B)ᵀ` and `dB = Aᵀ·dC` (`dB = dCᵀ·A` for a transposed `B`), each one batched GEMM
/// straight into the gradient buffers.
struct BmmBackward {
    transpose_b: bool,
}

impl Backward for BmmBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let (a, b) = (&inputs[0], &inputs[1]);
        if sink.wants(a) {
            let b_val = b.read();
            sink.add_bmm(a, g, false, &b_val, !self.transpose_b)?;
        }
        if sink.wants(b) {
            let a_val = a.read();
            if self.transpose_b {
                sink.add_bmm(b, g, true, &a_val, false)?;
            } else {
                sink.add_bmm(b, &a_val, true, g, false)?;
            }
        }
        Ok(())
    }
}

fn check_matmul(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(usize, usize)> {
    same_device(op, &[a, b])?;
    if a.rank() != 2 || b.rank() != 2 || a.shape()[1] != b.shape()[0] {
        return Err(MlError::ShapeMismatch {
            op,
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
            reason: "are not [m, k] and [k, n] matrices",
        });
    }
    Ok((a.shape()[0], b.shape()[1]))
}

/// `[B, m, p]` for `a` `[B, m, k]` and `b` `[B, k, p]` (`[B, p, k]` when `transpose_b`), or an
/// error naming `op` and both shapes.
fn check_bmm(op: &'static str, a: &Tensor, b: &Tensor, transpose_b: bool) -> Result<[usize; 3]> {
    same_device(op, &[a, b])?;
    if let (&[batch, m, k], &[b_batch, b_rows, b_cols]) = (a.shape(), b.shape()) {
        let (inner, p) = if transpose_b {
            (b_cols, b_rows)
        } else {
            (b_rows, b_cols)
        };
        if batch == b_batch && k == inner {
            return Ok([batch, m, p]);
        }
    }
    Err(MlError::ShapeMismatch {
        op,
        lhs: a.shape().to_vec(),
        rhs: b.shape().to_vec(),
        reason: if transpose_b {
            "are not batches [B, m, k] and [B, p, k] of matrices"
        } else {
            "are not batches [B, m, k] and [B, k, p] of matrices"
        },
    })
}

impl Tensor {
    fn bmm_impl(&self, rhs: &Tensor, transpose_b: bool) -> Result<Tensor> {
        let op = if transpose_b { "bmm_t" } else { "bmm" };
        let shape = check_bmm(op, self, rhs, transpose_b)?;
        let mut out = Storage::zeros(&shape, self.device())?;
        let opts = MatmulOptions::transposed(false, transpose_b);
        Storage::bmm_into(&mut out, (&self.read(), &rhs.read()), opts)?;
        Ok(Tensor::from_op(
            out,
            &[self, rhs],
            BmmBackward { transpose_b },
        ))
    }

    /// The batched matrix product of `self` (`[B, m, k]`) and `rhs` (`[B, k, p]`): `[B, m, p]`,
    /// entry `i` being `self[i]·rhs[i]`.
    pub fn bmm(&self, rhs: &Tensor) -> Result<Tensor> {
        self.bmm_impl(rhs, false)
    }

    /// The batched product of `self` (`[B, m, k]`) and the transpose of each matrix of `rhs`
    /// (`[B, p, k]`): `[B, m, p]`, entry `i` being `self[i]·rhs[i]ᵀ` (attention's `Q·Kᵀ`),
    /// without materializing the transpose.
    pub fn bmm_t(&self, rhs: &Tensor) -> Result<Tensor> {
        self.bmm_impl(rhs, true)
    }

    /// The matrix product of `self` (`[m, k]`) and `rhs` (`[k, n]`).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let (m, n) = check_matmul("matmul", self, rhs)?;
        let mut out = Storage::zeros(&[m, n], self.device())?;
        Storage::matmul_into(
            &mut out,
            (&self.read(), &rhs.read()),
            MatmulOptions::default(),
        )?;
        Ok(Tensor::from_op(out, &[self, rhs], MatmulBackward))
    }

    /// `self + a · b` for `self` `[m, n]`, `a` `[m, k]` and `b` `[k, n]` (PyTorch's `addmm`), in
    /// one pass: the output starts as a copy of `self` and GEMM adds the product into it (a
    /// recurrent step's input projection plus `h·W_h`).
    pub fn addmm(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let (m, n) = check_matmul("addmm", a, b)?;
        same_device("addmm", &[self, a])?;
        if self.shape() != [m, n] {
            return Err(MlError::ShapeMismatch {
                op: "addmm",
                lhs: self.shape().to_vec(),
                rhs: vec![m, n],
                reason: "differ: the addend must have the product's shape",
            });
        }
        let mut out = self.read().duplicate()?;
        Storage::matmul_into(&mut out, (&a.read(), &b.read()), MatmulOptions::ACCUMULATE)?;
        Ok(Tensor::from_op(out, &[self, a, b], AddmmBackward))
    }

    /// `self · weight + bias` for `self` `[m, k]`, `weight` `[k, n]` and `bias` `[n]`, in one
    /// pass: the output starts as the bias rows and GEMM adds the product into it (on the CPU,
    /// each thread writes the bias into its part of the output just before multiplying into it).
    pub fn linear(&self, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let (_, n) = check_matmul("linear", self, weight)?;
        same_device("linear", &[self, bias])?;
        if bias.shape() != [n] {
            return Err(MlError::ShapeMismatch {
                op: "linear",
                lhs: weight.shape().to_vec(),
                rhs: bias.shape().to_vec(),
                reason: "need a bias with one value per output column",
            });
        }
        let out = Storage::linear(&self.read(), &weight.read(), &bias.read())?;
        Ok(Tensor::from_op(out, &[self, weight, bias], LinearBackward))
    }
}
