//! [`MatmulOps`]: matrix products, single and batched, and a dense layer's product with its
//! bias; and the [`Storage`] methods that dispatch to them.

use super::elementwise::ElementwiseOps;
use super::memory::MemoryOps;
use super::storage::{Storage, dispatch};
use crate::error::Result;

/// Matrix products of 2-D operands, and batches of them as 3-D operands (dimensions checked by
/// the caller).
pub trait MatmulOps: MemoryOps {
    /// `dst (=|+=) op_a(a) · op_b(b)`, `op` being an optional transpose, written straight into
    /// `dst` (a gradient buffer, say) without a temporary.
    fn matmul_into(
        dst: &mut Self,
        a: &Self,
        transpose_a: bool,
        b: &Self,
        transpose_b: bool,
        accumulate: bool,
    ) -> Result<()>;

    /// `dst[i] (=|+=) op_a(a[i]) · op_b(b[i])` for every batch entry `i` of 3-D operands
    /// (`[B, rows, cols]`, each entry's matrix row-major), written straight into `dst`.
    fn bmm_into(
        dst: &mut Self,
        a: &Self,
        transpose_a: bool,
        b: &Self,
        transpose_b: bool,
        accumulate: bool,
    ) -> Result<()>;

    /// `x · w + bias` for 2-D `x` (`[m, k]`) and `w` (`[k, n]`), `bias` (`[n]`) added to every
    /// row: a dense layer's output, as a new array. Default: [`linear_from_primitives`].
    fn linear(x: &Self, w: &Self, bias: &Self) -> Result<Self>
    where
        Self: ElementwiseOps,
    {
        linear_from_primitives(x, w, bias)
    }
}

/// [`MatmulOps::linear`] as the bias broadcast to the output's shape, then the product added
/// onto it.
pub fn linear_from_primitives<S: MatmulOps + ElementwiseOps>(x: &S, w: &S, bias: &S) -> Result<S> {
    let (m, n) = (x.shape()[0], w.shape()[1]);
    let mut out = bias.broadcast_to(&[m, n])?;
    S::matmul_into(&mut out, x, false, w, false, true)?;
    Ok(out)
}

impl Storage {
    /// `x · w + bias`, `bias` added to every row of the product (shapes checked by the caller).
    pub fn linear(x: &Storage, w: &Storage, bias: &Storage) -> Result<Storage> {
        dispatch!("linear", (x = x, w = w, b = bias) => MatmulOps::linear(x, w, b))
    }

    /// `dst (=|+=) op_a(a) · op_b(b)` for 2-D operands, `op` being an optional transpose.
    pub fn matmul_into(
        dst: &mut Storage,
        a: &Storage,
        transpose_a: bool,
        b: &Storage,
        transpose_b: bool,
        accumulate: bool,
    ) -> Result<()> {
        dispatch!("matmul", (d = dst, a = a, b = b) =>
            MatmulOps::matmul_into(d, a, transpose_a, b, transpose_b, accumulate))
    }

    /// `dst[i] (=|+=) op_a(a[i]) · op_b(b[i])` for 3-D operands `[B, rows, cols]`, `op` being an
    /// optional transpose of each entry's matrix.
    pub fn bmm_into(
        dst: &mut Storage,
        a: &Storage,
        transpose_a: bool,
        b: &Storage,
        transpose_b: bool,
        accumulate: bool,
    ) -> Result<()> {
        dispatch!("bmm", (d = dst, a = a, b = b) =>
            MatmulOps::bmm_into(d, a, transpose_a, b, transpose_b, accumulate))
    }
}
