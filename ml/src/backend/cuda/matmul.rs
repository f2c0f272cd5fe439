//! Matrix products through cuBLAS SGEMM.

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm, GemmConfig};

use super::CudaStorage;
use crate::backend::elementwise::ElementwiseOps;
use crate::backend::matmul::MatmulOps;
use crate::backend::memory::MemoryOps;
use crate::error::{MlError, Result};

/// A dimension as cuBLAS takes it.
fn dim(v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| MlError::invalid("matmul", format!("dimension {v} is too large for cuBLAS")))
}

/// cuBLAS's name for an optional transpose.
fn operation(transposed: bool) -> cublasOperation_t {
    if transposed {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

impl MatmulOps for CudaStorage {
    /// cuBLAS is column-major and a row-major matrix read column-major is its transpose, so the
    /// row-major product `C = A·B` is computed as the column-major `Cᵀ = Bᵀ·Aᵀ`: the operands
    /// swap places and keep their stored leading dimensions.
    fn matmul_into(
        dst: &mut Self,
        a: &Self,
        transpose_a: bool,
        b: &Self,
        transpose_b: bool,
        accumulate: bool,
    ) -> Result<()> {
        a.on_same_gpu("matmul", &[b.device(), dst.device()])?;
        let (a_rows, a_cols) = (a.shape[0], a.shape[1]);
        let (b_rows, b_cols) = (b.shape[0], b.shape[1]);
        let (m, k) = if transpose_a {
            (a_cols, a_rows)
        } else {
            (a_rows, a_cols)
        };
        let n = if transpose_b { b_rows } else { b_cols };
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return if accumulate { Ok(()) } else { dst.fill(0.0) };
        }
        let cfg = GemmConfig {
            transa: operation(transpose_b),
            transb: operation(transpose_a),
            m: dim(n)?,
            n: dim(m)?,
            k: dim(k)?,
            alpha: 1.0f32,
            lda: dim(b_cols)?,
            ldb: dim(a_cols)?,
            beta: if accumulate { 1.0 } else { 0.0 },
            ldc: dim(n)?,
        };
        let gpu = dst.gpu.clone();
        // cuBLAS works in the calling thread's current context.
        gpu.stream
            .context()
            .bind_to_thread()
            .map_err(|e| gpu.fail("binding the context", e))?;
        let blas = gpu.blas();
        // SAFETY: the dimensions and leading dimensions describe exactly the stored operands
        // (a: a_rows × a_cols, b: b_rows × b_cols, dst: m × n, all row-major and at least that
        // long), as derived above, all three on this GPU; the handle runs on the device's stream.
        unsafe { blas.gemm(cfg, b.buf(), a.buf(), dst.buf_mut()) }
            .map_err(|e| gpu.fail("cuBLAS SGEMM", e))
    }
}
