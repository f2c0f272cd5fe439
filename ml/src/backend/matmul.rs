//! [`MatmulOps`]: matrix products, single and batched, and a dense layer's product with its
//! bias; and the [`Storage`] methods that dispatch to them.

use super::elementwise::ElementwiseOps;
use super::memory::MemoryOps;
use super::storage::{Storage, dispatch};
use crate::error::Result;

/// How a product reads its operands and writes its destination: `dst (=|+=) op_a(a) · op_b(b)`,
/// `op` an optional transpose. The default is `dst = a · b`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulOptions {
    /// Reads `a` transposed (row-major `[k, m]` as `[m, k]`), without copying it.
    pub transpose_a: bool,
    /// Reads `b` transposed (row-major `[n, k]` as `[k, n]`), without copying it.
    pub transpose_b: bool,
    /// Adds the product to what `dst` holds instead of overwriting it.
    pub accumulate: bool,
}

impl MatmulOptions {
    /// `dst += a · b`.
    pub const ACCUMULATE: MatmulOptions = MatmulOptions {
        transpose_a: false,
        transpose_b: false,
        accumulate: true,
    };

    /// `dst = op_a(a) · op_b(b)`, `a` read transposed when `transpose_a`, `b` when
    /// `transpose_b`.
    pub fn transposed(transpose_a: bool, transpose_b: bool) -> MatmulOptions {
        MatmulOptions {
            transpose_a,
            transpose_b,
            accumulate: false,
        }
    }

    /// These options, adding to the destination when `accumulate`.
    pub fn accumulating(self, accumulate: bool) -> MatmulOptions {
        MatmulOptions { accumulate, ..self }
    }
}

/// Matrix products of 2-D operands, and batches of them as 3-D operands (dimensions checked by
/// the caller).
pub trait MatmulOps: MemoryOps {
    /// `dst (=|+=) op_a(a) · op_b(b)` as `opts` say, written straight into `dst` (a gradient
    /// buffer, say) without a temporary.
    fn matmul_into(dst: &mut Self, a_b: (&Self, &Self), opts: MatmulOptions) -> Result<()>;

    /// `dst[i] (=|+=) op_a(a[i]) · op_b(b[i])` for every batch entry `i` of 3-D operands
    /// (`[B, rows, cols]`, each entry's matrix row-major) as `opts` say, written straight into
    /// `dst`.
    fn bmm_into(dst: &mut Self, a_b: (&Self, &Self), opts: MatmulOptions) -> Result<()>;

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
    S::matmul_into(&mut out, (x, w), MatmulOptions::ACCUMULATE)?;
    Ok(out)
}

impl Storage {
    /// `x · w + bias`, `bias` added to every row of the product (shapes checked by the caller).
    pub fn linear(x: &Storage, w: &Storage, bias: &Storage) -> Result<Storage> {
        dispatch!("linear", (x = x, w = w, b = bias) => MatmulOps::linear(x, w, b))
    }

    /// `dst (=|+=) op_a(a) · op_b(b)` for 2-D operands, as `opts` say.
    pub fn matmul_into(
        dst: &mut Storage,
        (a, b): (&Storage, &Storage),
        opts: MatmulOptions,
    ) -> Result<()> {
        dispatch!("matmul", (d = dst, a = a, b = b) => MatmulOps::matmul_into(d, (a, b), opts))
    }

    /// `dst[i] (=|+=) op_a(a[i]) · op_b(b[i])` for 3-D operands `[B, rows, cols]`, as `opts`
    /// say of each entry's matrices.
    pub fn bmm_into(
        dst: &mut Storage,
        (a, b): (&Storage, &Storage),
        opts: MatmulOptions,
    ) -> Result<()> {
        dispatch!("bmm", (d = dst, a = a, b = b) => MatmulOps::bmm_into(d, (a, b), opts))
    }
}
