//! [`MatmulOps`]: matrix products, single and batched; and the [`Storage`] methods that
//! dispatch to them.

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
}

impl Storage {
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
