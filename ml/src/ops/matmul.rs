//! Matrix products (2-D), through the backend's GEMM.

use crate::autodiff::{Backward, GradSink};
use crate::backend::Storage;
use crate::error::{MlError, Result};
use crate::ops::same_device;
use crate::tensor::Tensor;

struct MatmulBackward;

impl Backward for MatmulBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let (a, b) = (&inputs[0], &inputs[1]);
        // C = A·B  ⇒  dA = dC·Bᵀ,  dB = Aᵀ·dC. Both are written by GEMM straight into the
        // gradient buffers (accumulating), so a parameter's gradient needs no temporary.
        if sink.wants(a) {
            let b_val = b.read();
            sink.accumulate_with(a, |dst| match dst {
                Some(d) => Storage::matmul_into(d, g, false, &b_val, true, true).map(|_| None),
                None => {
                    let mut d = Storage::zeros(a.shape(), a.device())?;
                    Storage::matmul_into(&mut d, g, false, &b_val, true, false)?;
                    Ok(Some(d))
                }
            })?;
        }
        if sink.wants(b) {
            let a_val = a.read();
            sink.accumulate_with(b, |dst| match dst {
                Some(d) => Storage::matmul_into(d, &a_val, true, g, false, true).map(|_| None),
                None => {
                    let mut d = Storage::zeros(b.shape(), b.device())?;
                    Storage::matmul_into(&mut d, &a_val, true, g, false, false)?;
                    Ok(Some(d))
                }
            })?;
        }
        Ok(())
    }
}

impl Tensor {
    /// The matrix product of `self` (`[m, k]`) and `rhs` (`[k, n]`).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        same_device("matmul", &[self, rhs])?;
        if self.rank() != 2 || rhs.rank() != 2 || self.shape()[1] != rhs.shape()[0] {
            return Err(MlError::ShapeMismatch {
                op: "matmul",
                lhs: self.shape().to_vec(),
                rhs: rhs.shape().to_vec(),
                reason: "are not [m, k] and [k, n] matrices",
            });
        }
        let (m, n) = (self.shape()[0], rhs.shape()[1]);
        let mut out = Storage::zeros(&[m, n], self.device())?;
        Storage::matmul_into(&mut out, &self.read(), false, &rhs.read(), false, false)?;
        Ok(Tensor::from_op(out, &[self, rhs], MatmulBackward))
    }
}
