//! Matrix products through cuBLAS SGEMM: [`MatmulOps`], and the row-major (batched) product
//! that it and the convolutions (`conv.rs`) share.

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::CudaStorage;
use super::device::Gpu;
use crate::backend::elementwise::ElementwiseOps;
use crate::backend::matmul::{MatmulOps, MatmulOptions};
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

/// How one operand of a [`Product`] is stored: row-major rows of `ld` floats (at least the
/// matrix's width: a submatrix of a wider one has its parent's), read transposed or not, the
/// matrix of batch entry `b` starting `b · stride` floats after the first.
#[derive(Clone, Copy, Debug)]
pub(super) struct Operand {
    /// Read as its transpose.
    pub transposed: bool,
    /// Floats from one stored row to the next.
    pub ld: usize,
    /// Floats from one batch entry's matrix to the next (0: the same matrix for every entry).
    pub stride: usize,
}

impl Operand {
    /// A dense matrix whose stored rows are `ld` floats long, the same for every batch entry.
    pub fn dense(ld: usize, transposed: bool) -> Operand {
        Operand {
            transposed,
            ld: ld.max(1),
            stride: 0,
        }
    }

    /// The same operand, batch entries `stride` floats apart.
    pub fn every(self, stride: usize) -> Operand {
        Operand { stride, ..self }
    }

    /// Floats from the first to one past the last element read, for a stored `rows × cols`
    /// matrix per batch entry (0 when there is nothing to read).
    fn extent(&self, rows: usize, cols: usize, batch: usize) -> usize {
        if rows == 0 || cols == 0 || batch == 0 {
            return 0;
        }
        (batch - 1) * self.stride + (rows - 1) * self.ld + cols
    }
}

/// Row-major products `C_b (=|+=) op(A_b) · op(B_b)` for `b` in `0..batch`, `op(A_b)` being
/// `m × k`, `op(B_b)` `k × n` and `C_b` `m × n` (never transposed).
#[derive(Clone, Copy, Debug)]
pub(super) struct Product {
    /// Rows of `C`.
    pub m: usize,
    /// Columns of `C`.
    pub n: usize,
    /// The summed dimension.
    pub k: usize,
    /// The left operand.
    pub a: Operand,
    /// The right operand.
    pub b: Operand,
    /// The result.
    pub c: Operand,
    /// Products in the batch.
    pub batch: usize,
    /// Add to `C` instead of overwriting it.
    pub accumulate: bool,
}

impl Product {
    /// Fails unless every operand's rows are as long as its width and its last element read
    /// lies inside the view it is given (cuBLAS checks neither against the memory).
    fn check(&self, a_len: usize, b_len: usize, c_len: usize) -> Result<()> {
        let stored = |o: &Operand, rows: usize, cols: usize| {
            if o.transposed {
                (cols, rows)
            } else {
                (rows, cols)
            }
        };
        let (ar, ac) = stored(&self.a, self.m, self.k);
        let (br, bc) = stored(&self.b, self.k, self.n);
        let fits = |o: &Operand, rows: usize, cols: usize, len: usize| {
            o.ld >= cols.max(1) && o.extent(rows, cols, self.batch) <= len
        };
        if fits(&self.a, ar, ac, a_len)
            && fits(&self.b, br, bc, b_len)
            && fits(&self.c, self.m, self.n, c_len)
            && !self.c.transposed
        {
            return Ok(());
        }
        Err(MlError::invalid(
            "matmul",
            format!(
                "the product {self:?} does not fit its operands of {a_len}, {b_len} and {c_len} \
                 floats (a bug in the CUDA backend)"
            ),
        ))
    }
}

impl Gpu {
    /// Queues `p` on this device's stream: one SGEMM, or one strided-batched SGEMM for a batch.
    ///
    /// cuBLAS is column-major and a row-major matrix read column-major is its transpose, so the
    /// row-major product `C = A·B` is computed as the column-major `Cᵀ = Bᵀ·Aᵀ`: the operands
    /// swap places and keep their stored leading dimensions.
    pub(super) fn product<A, B, C>(&self, p: &Product, a: &A, b: &B, c: &mut C) -> Result<()>
    where
        A: DevicePtr<f32>,
        B: DevicePtr<f32>,
        C: DevicePtrMut<f32>,
    {
        p.check(a.len(), b.len(), c.len())?;
        if p.m == 0 || p.n == 0 || p.batch == 0 {
            return Ok(());
        }
        let gemm = GemmConfig {
            transa: operation(p.b.transposed),
            transb: operation(p.a.transposed),
            m: dim(p.n)?,
            n: dim(p.m)?,
            k: dim(p.k)?,
            alpha: 1.0f32,
            lda: dim(p.b.ld)?,
            ldb: dim(p.a.ld)?,
            beta: if p.accumulate { 1.0 } else { 0.0 },
            ldc: dim(p.c.ld)?,
        };
        // cuBLAS works in the calling thread's current context.
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| self.fail("binding the context", e))?;
        let blas = self.blas();
        // SAFETY: `check` showed that every matrix of the batch, as the dimensions, leading
        // dimensions and strides describe it, lies inside the view it is read from or written
        // to; all three views are on this GPU (the callers check), and the handle runs on the
        // device's stream.
        let done = unsafe {
            if p.batch == 1 {
                blas.gemm(gemm, b, a, c)
            } else {
                let cfg = StridedBatchedConfig {
                    gemm,
                    batch_size: dim(p.batch)?,
                    stride_a: p.b.stride as i64,
                    stride_b: p.a.stride as i64,
                    stride_c: p.c.stride as i64,
                };
                blas.gemm_strided_batched(cfg, b, a, c)
            }
        };
        done.map_err(|e| self.fail("cuBLAS SGEMM", e))
    }
}

impl MatmulOps for CudaStorage {
    fn matmul_into(dst: &mut Self, (a, b): (&Self, &Self), opts: MatmulOptions) -> Result<()> {
        let MatmulOptions {
            transpose_a,
            transpose_b,
            accumulate,
        } = opts;
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
        let p = Product {
            m,
            n,
            k,
            a: Operand::dense(a_cols, transpose_a),
            b: Operand::dense(b_cols, transpose_b),
            c: Operand::dense(n, false),
            batch: 1,
            accumulate,
        };
        let gpu = dst.gpu.clone();
        gpu.product(&p, &a.view(), &b.view(), &mut dst.view_mut())
    }

    /// One strided-batched SGEMM over the batch entries, each entry's matrix right after the
    /// previous one's.
    fn bmm_into(dst: &mut Self, (a, b): (&Self, &Self), opts: MatmulOptions) -> Result<()> {
        let MatmulOptions {
            transpose_a,
            transpose_b,
            accumulate,
        } = opts;
        a.on_same_gpu("bmm", &[b.device(), dst.device()])?;
        let (batch, a_rows, a_cols) = (a.shape[0], a.shape[1], a.shape[2]);
        let (b_rows, b_cols) = (b.shape[1], b.shape[2]);
        let (m, k) = if transpose_a {
            (a_cols, a_rows)
        } else {
            (a_rows, a_cols)
        };
        let n = if transpose_b { b_rows } else { b_cols };
        if batch == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return if accumulate { Ok(()) } else { dst.fill(0.0) };
        }
        let p = Product {
            m,
            n,
            k,
            a: Operand::dense(a_cols, transpose_a).every(a_rows * a_cols),
            b: Operand::dense(b_cols, transpose_b).every(b_rows * b_cols),
            c: Operand::dense(n, false).every(m * n),
            batch,
            accumulate,
        };
        let gpu = dst.gpu.clone();
        gpu.product(&p, &a.view(), &b.view(), &mut dst.view_mut())
    }
}
