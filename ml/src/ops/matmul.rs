//! Matrix products (2-D), the fused affine layer `x·W + b` and `x + a·b`, through the backend's
//! GEMM.

use crate::autodiff::{Backward, GradSink};
use crate::backend::Storage;
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
        let x = &inputs[0];
        if sink.wants(x) {
            sink.add(x, g.duplicate()?)?;
        }
        Ok(())
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
        let bias = &inputs[2];
        if sink.wants(bias) {
            sink.add_reduced(bias, g.duplicate()?)?;
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

impl Tensor {
    /// The matrix product of `self` (`[m, k]`) and `rhs` (`[k, n]`).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let (m, n) = check_matmul("matmul", self, rhs)?;
        let mut out = Storage::zeros(&[m, n], self.device())?;
        Storage::matmul_into(&mut out, &self.read(), false, &rhs.read(), false, false)?;
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
        Storage::matmul_into(&mut out, &a.read(), false, &b.read(), false, true)?;
        Ok(Tensor::from_op(out, &[self, a, b], AddmmBackward))
    }

    /// `self · weight + bias` for `self` `[m, k]`, `weight` `[k, n]` and `bias` `[n]`, in one
    /// pass: the output starts as the bias rows and GEMM adds the product into it.
    pub fn linear(&self, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let (m, n) = check_matmul("linear", self, weight)?;
        same_device("linear", &[self, bias])?;
        if bias.shape() != [n] {
            return Err(MlError::ShapeMismatch {
                op: "linear",
                lhs: weight.shape().to_vec(),
                rhs: bias.shape().to_vec(),
                reason: "need a bias with one value per output column",
            });
        }
        let mut out = bias.read().broadcast_to(&[m, n])?;
        Storage::matmul_into(&mut out, &self.read(), false, &weight.read(), false, true)?;
        Ok(Tensor::from_op(out, &[self, weight, bias], LinearBackward))
    }
}
