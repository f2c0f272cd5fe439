//! The primitive kernels of [`super::super::Storage`] on a GPU: each method sizes its output,
//! picks a kernel (a fast path for the common layout, a strided one otherwise) and queues it.

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::driver::PushKernelArg;

use super::device::Gpu;
use super::{CudaStorage, broadcast_strides, contiguous_strides, launch, strided};
use crate::backend::{AdagradStep, AdamStep, BinaryOp, SgdStep, UnaryOp};
use crate::error::{MlError, Result};
use crate::shape::numel;

fn unary_code(op: UnaryOp) -> i32 {
    match op {
        UnaryOp::Neg => 0,
        UnaryOp::Exp => 1,
        UnaryOp::Log => 2,
        UnaryOp::Relu => 3,
        UnaryOp::Tanh => 4,
        UnaryOp::Sigmoid => 5,
        UnaryOp::Gelu => 6,
        UnaryOp::Sqrt => 7,
        UnaryOp::Square => 8,
    }
}

fn binary_code(op: BinaryOp) -> i32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
    }
}

/// `[outer, len, inner]` around `axis`.
fn split_at_axis(shape: &[usize], axis: usize) -> (i64, i64, i64) {
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    (outer as i64, shape[axis] as i64, inner as i64)
}

impl CudaStorage {
    /// `op(self)` elementwise.
    pub fn unary(&self, op: UnaryOp) -> Result<CudaStorage> {
        let mut out = self.alloc_like(&self.shape)?;
        if self.len > 0 {
            let (code, n) = (unary_code(op), self.n());
            launch!(
                self.gpu,
                "unary_fwd",
                Gpu::elementwise(self.len),
                &code,
                &n,
                self.buf(),
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// `grad · op'(x)` where `y = op(x)`.
    pub fn unary_backward(
        op: UnaryOp,
        x: &CudaStorage,
        y: &CudaStorage,
        g: &CudaStorage,
    ) -> Result<CudaStorage> {
        x.same_gpu(g, "unary backward")?;
        let mut out = x.alloc_like(&x.shape)?;
        if x.len > 0 {
            let (code, n) = (unary_code(op), x.n());
            launch!(
                x.gpu,
                "unary_bwd",
                Gpu::elementwise(x.len),
                &code,
                &n,
                x.buf(),
                y.buf(),
                g.buf(),
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// `self op rhs` broadcast to `out_shape`.
    pub fn binary(
        &self,
        op: BinaryOp,
        rhs: &CudaStorage,
        out_shape: &[usize],
    ) -> Result<CudaStorage> {
        self.same_gpu(rhs, "binary op")?;
        let mut out = self.alloc_like(out_shape)?;
        if out.len == 0 {
            return Ok(out);
        }
        let (code, n) = (binary_code(op), out.n());
        let cfg = Gpu::elementwise(out.len);
        let last = out_shape.last().copied().unwrap_or(1);
        if self.shape == out_shape && rhs.shape == out_shape {
            launch!(
                self.gpu,
                "binary_same",
                cfg,
                &code,
                &n,
                self.buf(),
                rhs.buf(),
                out.buf_mut()
            )?;
        } else if self.shape == out_shape && rhs.len == last && rhs.shape.last() == Some(&last) {
            let cols = last as i64;
            launch!(
                self.gpu,
                "binary_row",
                cfg,
                &code,
                &n,
                &cols,
                self.buf(),
                rhs.buf(),
                out.buf_mut()
            )?;
        } else {
            let s = strided(
                "binary op",
                out_shape,
                &broadcast_strides(&self.shape, out_shape),
                &broadcast_strides(&rhs.shape, out_shape),
            )?;
            launch!(
                self.gpu,
                "binary_bcast",
                cfg,
                &code,
                &n,
                &s,
                self.buf(),
                rhs.buf(),
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// `self · mul + add` elementwise.
    pub fn affine(&self, mul: f32, add: f32) -> Result<CudaStorage> {
        let mut out = self.alloc_like(&self.shape)?;
        if self.len > 0 {
            let n = self.n();
            launch!(
                self.gpu,
                "affine",
                Gpu::elementwise(self.len),
                &n,
                &mul,
                &add,
                self.buf(),
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// `self += other` (same shape).
    pub fn add_assign(&mut self, other: &CudaStorage) -> Result<()> {
        self.same_gpu(other, "accumulate")?;
        if self.len == 0 {
            return Ok(());
        }
        let (gpu, n) = (self.gpu.clone(), self.n());
        launch!(
            gpu,
            "add_assign",
            Gpu::elementwise(self.len),
            &n,
            self.buf_mut(),
            other.buf()
        )
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: f32) -> Result<()> {
        self.in_place("fill", value)
    }

    /// Multiplies every element by `factor`.
    pub fn scale(&mut self, factor: f32) -> Result<()> {
        self.in_place("scale", factor)
    }

    /// Runs `kernel(n, value, self)`, an in-place elementwise update with one scalar.
    fn in_place(&mut self, kernel: &'static str, value: f32) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let (gpu, n) = (self.gpu.clone(), self.n());
        launch!(
            gpu,
            kernel,
            Gpu::elementwise(self.len),
            &n,
            &value,
            self.buf_mut()
        )
    }

    /// Sums `self` over its broadcast dimensions into `dst` (adding when `accumulate`).
    pub fn sum_to_shape_into(&self, dst: &mut CudaStorage, accumulate: bool) -> Result<()> {
        self.same_gpu(dst, "broadcast reduction")?;
        if dst.len == 0 {
            return Ok(());
        }
        let acc = accumulate as i32;
        let gpu = self.gpu.clone();
        if self.shape == dst.shape {
            return if accumulate {
                dst.add_assign(self)
            } else {
                self.copy_into(dst)
            };
        }
        let x = &self.shape;
        let pad = x.len() - dst.shape.len();
        let target: Vec<usize> = std::iter::repeat_n(1, pad)
            .chain(dst.shape.iter().copied())
            .collect();
        // Leading dimensions summed away and the rest kept whole: [rows, cols] down to [cols].
        let split = (0..=x.len())
            .find(|&k| target[k..] == x[k..])
            .unwrap_or(x.len());
        if target[..split].iter().all(|&d| d == 1) {
            let rows = numel(&x[..split]) as i64;
            let cols = numel(&x[split..]) as i64;
            return launch!(
                gpu,
                "sum_rows",
                Gpu::elementwise(cols as usize),
                &rows,
                &cols,
                self.buf(),
                dst.buf_mut(),
                &acc
            );
        }
        let flags: Vec<i64> = (0..x.len())
            .map(|d| i64::from(target[d] == 1 && x[d] != 1))
            .collect();
        let s = strided("broadcast reduction", x, &contiguous_strides(x), &flags)?;
        let n_out = dst.n();
        let reduced = (self.len / dst.len.max(1)) as i64;
        launch!(
            gpu,
            "sum_to_shape",
            Gpu::elementwise(dst.len),
            &n_out,
            &reduced,
            &s,
            self.buf(),
            dst.buf_mut(),
            &acc
        )
    }

    /// Copies `self` through a strided view into a new contiguous tensor of `shape`.
    fn strided_copy(
        &self,
        op: &'static str,
        shape: &[usize],
        src_strides: &[i64],
    ) -> Result<CudaStorage> {
        let mut out = self.alloc_like(shape)?;
        if out.len > 0 {
            let s = strided(op, shape, src_strides, &contiguous_strides(shape))?;
            let n = out.n();
            launch!(
                self.gpu,
                "strided_copy",
                Gpu::elementwise(out.len),
                &n,
                &s,
                self.buf(),
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// A contiguous copy broadcast to `shape`.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<CudaStorage> {
        self.strided_copy(
            "broadcast_to",
            shape,
            &broadcast_strides(&self.shape, shape),
        )
    }

    /// The sum of all elements (0-dimensional) or along `axis`.
    pub fn sum(&self, axis: Option<usize>, keepdim: bool) -> Result<CudaStorage> {
        let Some(axis) = axis else {
            let mut out = self.alloc_like(&[])?;
            self.sum_lanes_into(&mut out, 1, self.n(), 1.0)?;
            return Ok(out);
        };
        let (outer, len, inner) = split_at_axis(&self.shape, axis);
        let mut shape = self.shape.clone();
        if keepdim {
            shape[axis] = 1;
        } else {
            shape.remove(axis);
        }
        let mut out = self.alloc_like(&shape)?;
        if out.len == 0 {
            return Ok(out);
        }
        if inner == 1 {
            self.sum_lanes_into(&mut out, outer, len, 1.0)?;
        } else {
            launch!(
                self.gpu,
                "sum_axis",
                Gpu::elementwise(out.len),
                &outer,
                &len,
                &inner,
                self.buf(),
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// `out[r] = scale · Σ self[r, :]` over `rows` contiguous rows of `len`.
    fn sum_lanes_into(&self, out: &mut CudaStorage, rows: i64, len: i64, scale: f32) -> Result<()> {
        launch!(
            self.gpu,
            "sum_lanes",
            Gpu::block_per_row(rows as usize),
            &rows,
            &len,
            &scale,
            self.buf(),
            out.buf_mut()
        )
    }

    /// Repeats a reduced tensor along `axis` to length `len`.
    pub fn expand_axis(&self, axis: usize, len: usize, keepdim: bool) -> Result<CudaStorage> {
        let mut source = self.shape.clone();
        if !keepdim {
            source.insert(axis, 1);
        }
        let mut strides = contiguous_strides(&source);
        strides[axis] = 0;
        let mut shape = source;
        shape[axis] = len;
        self.strided_copy("expand", &shape, &strides)
    }

    /// The sum of squares of all elements (waits for the device).
    pub fn sum_squares(&self) -> Result<f64> {
        if self.len == 0 {
            return Ok(0.0);
        }
        let n = self.n();
        let mut scratch = self.gpu.scratch();
        launch!(
            self.gpu,
            "sum_squares",
            Gpu::block_per_row(1),
            &n,
            self.buf(),
            &mut *scratch
        )?;
        let mut host = [0.0f64];
        self.gpu
            .stream
            .memcpy_dtoh(&*scratch, &mut host)
            .and_then(|()| self.gpu.stream.synchronize())
            .map_err(|e| self.gpu.fail("reading a reduction", e))?;
        Ok(host[0])
    }

    /// `dst (=|+=) op_a(a) · op_b(b)` through cuBLAS SGEMM.
    ///
    /// cuBLAS is column-major and a row-major matrix read column-major is its transpose, so the
    /// row-major product `C = A·B` is computed as the column-major `Cᵀ = Bᵀ·Aᵀ`: the operands
    /// swap places and keep their stored leading dimensions.
    pub fn matmul_into(
        dst: &mut CudaStorage,
        a: &CudaStorage,
        transpose_a: bool,
        b: &CudaStorage,
        transpose_b: bool,
        accumulate: bool,
    ) -> Result<()> {
        a.same_gpu(b, "matmul")?;
        a.same_gpu(dst, "matmul")?;
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
        let dim = |v: usize| {
            i32::try_from(v).map_err(|_| {
                MlError::invalid("matmul", format!("dimension {v} is too large for cuBLAS"))
            })
        };
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        let cfg = GemmConfig {
            transa: op(transpose_b),
            transb: op(transpose_a),
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
        // long), as derived above; the handle runs on the device's stream.
        unsafe { blas.gemm(cfg, b.buf(), a.buf(), dst.buf_mut()) }
            .map_err(|e| gpu.fail("cuBLAS SGEMM", e))
    }

    /// Softmax (or log-softmax) along `axis`.
    pub fn softmax(&self, axis: usize, log: bool) -> Result<CudaStorage> {
        let mut out = self.alloc_like(&self.shape)?;
        let (outer, len, inner) = split_at_axis(&self.shape, axis);
        if out.len > 0 {
            let log = log as i32;
            launch!(
                self.gpu,
                "softmax_fwd",
                Gpu::warp_per_lane((outer * inner) as usize),
                &outer,
                &len,
                &inner,
                &log,
                self.buf(),
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// Backward of softmax (or log-softmax) from its output `y`.
    pub fn softmax_backward(
        y: &CudaStorage,
        g: &CudaStorage,
        axis: usize,
        log: bool,
    ) -> Result<CudaStorage> {
        y.same_gpu(g, "softmax backward")?;
        let mut out = y.alloc_like(&y.shape)?;
        let (outer, len, inner) = split_at_axis(&y.shape, axis);
        if out.len > 0 {
            let log = log as i32;
            launch!(
                y.gpu,
                "softmax_bwd",
                Gpu::warp_per_lane((outer * inner) as usize),
                &outer,
                &len,
                &inner,
                &log,
                y.buf(),
                g.buf(),
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// Mean cross-entropy and the softmax probabilities, fused.
    pub fn cross_entropy(
        logits: &CudaStorage,
        targets: &CudaStorage,
    ) -> Result<(CudaStorage, CudaStorage)> {
        logits.same_gpu(targets, "cross_entropy")?;
        let (n, c) = (logits.shape[0], logits.shape[1]);
        let mut probs = logits.alloc_like(&logits.shape)?;
        let mut rows = logits.alloc_like(&[n])?;
        let mut loss = logits.alloc_like(&[])?;
        let (n64, c64) = (n as i64, c as i64);
        if n > 0 && c > 0 {
            launch!(
                logits.gpu,
                "cross_entropy_fwd",
                Gpu::warp_per_lane(n),
                &n64,
                &c64,
                logits.buf(),
                targets.buf(),
                probs.buf_mut(),
                rows.buf_mut()
            )?;
        }
        let scale = if n == 0 { 0.0 } else { 1.0 / n as f32 };
        rows.sum_lanes_into(&mut loss, 1, n64, scale)?;
        Ok((loss, probs))
    }

    /// Gradient of the mean cross-entropy, scaled by the one-element `g`.
    pub fn cross_entropy_backward(
        probs: &CudaStorage,
        targets: &CudaStorage,
        g: &CudaStorage,
    ) -> Result<CudaStorage> {
        probs.same_gpu(targets, "cross_entropy backward")?;
        let mut out = probs.alloc_like(&probs.shape)?;
        if out.len > 0 {
            let (n, c) = (probs.shape[0] as i64, probs.shape[1] as i64);
            launch!(
                probs.gpu,
                "cross_entropy_bwd",
                Gpu::elementwise(out.len),
                &n,
                &c,
                probs.buf(),
                targets.buf(),
                g.buf(),
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// Mean binary cross-entropy with logits.
    pub fn bce_with_logits(x: &CudaStorage, z: &CudaStorage) -> Result<CudaStorage> {
        x.same_gpu(z, "binary_cross_entropy_with_logits")?;
        let mut terms = x.alloc_like(&x.shape)?;
        let mut loss = x.alloc_like(&[])?;
        let n = x.n();
        if x.len > 0 {
            launch!(
                x.gpu,
                "bce_terms",
                Gpu::elementwise(x.len),
                &n,
                x.buf(),
                z.buf(),
                terms.buf_mut()
            )?;
        }
        terms.sum_lanes_into(&mut loss, 1, n, 1.0 / x.len.max(1) as f32)?;
        Ok(loss)
    }

    /// Gradient of [`CudaStorage::bce_with_logits`], scaled by the one-element `g`.
    pub fn bce_with_logits_backward(
        x: &CudaStorage,
        z: &CudaStorage,
        g: &CudaStorage,
    ) -> Result<CudaStorage> {
        x.same_gpu(z, "binary_cross_entropy_with_logits backward")?;
        let mut out = x.alloc_like(&x.shape)?;
        if x.len > 0 {
            let n = x.n();
            launch!(
                x.gpu,
                "bce_bwd",
                Gpu::elementwise(x.len),
                &n,
                x.buf(),
                z.buf(),
                g.buf(),
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// The axes reordered.
    pub fn permute(&self, axes: &[usize]) -> Result<CudaStorage> {
        let own = contiguous_strides(&self.shape);
        let shape: Vec<usize> = axes.iter().map(|&a| self.shape[a]).collect();
        let strides: Vec<i64> = axes.iter().map(|&a| own[a]).collect();
        self.strided_copy("permute", &shape, &strides)
    }

    /// Joins `parts` along `axis` (shapes checked by the caller).
    pub fn concat(parts: &[&CudaStorage], axis: usize) -> Result<CudaStorage> {
        let first = parts[0];
        let mut shape = first.shape.clone();
        shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
        let mut out = first.alloc_like(&shape)?;
        let out_strides = contiguous_strides(&shape);
        let mut offset = 0usize;
        for part in parts {
            part.same_gpu(first, "concat")?;
            if part.len > 0 {
                let s = strided(
                    "concat",
                    &part.shape,
                    &contiguous_strides(&part.shape),
                    &out_strides,
                )?;
                let n = part.n();
                let start = offset * out_strides[axis] as usize;
                let total = out.len;
                let mut dst = out.buf_mut().slice_mut(start..total);
                launch!(
                    first.gpu,
                    "strided_copy",
                    Gpu::elementwise(part.len),
                    &n,
                    &s,
                    part.buf(),
                    &mut dst
                )?;
            }
            offset += part.shape[axis];
        }
        Ok(out)
    }

    /// The slice `start..start + len` along `axis`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<CudaStorage> {
        let strides = contiguous_strides(&self.shape);
        let mut shape = self.shape.clone();
        shape[axis] = len;
        let mut out = self.alloc_like(&shape)?;
        if out.len > 0 {
            let s = strided("narrow", &shape, &strides, &contiguous_strides(&shape))?;
            let n = out.n();
            let src = self.buf().slice(start * strides[axis] as usize..self.len);
            launch!(
                self.gpu,
                "strided_copy",
                Gpu::elementwise(out.len),
                &n,
                &s,
                &src,
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// Rows of `self` picked by `indices`.
    pub fn index_select(&self, indices: &CudaStorage) -> Result<CudaStorage> {
        self.same_gpu(indices, "index_select")?;
        let mut shape = indices.shape.clone();
        shape.extend_from_slice(&self.shape[1..]);
        let mut out = self.alloc_like(&shape)?;
        if out.len > 0 {
            let rows = indices.n();
            let row_len = numel(&self.shape[1..]) as i64;
            launch!(
                self.gpu,
                "index_select",
                Gpu::elementwise(out.len),
                &rows,
                &row_len,
                self.buf(),
                indices.buf(),
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// `self[indices[j]] += src[j]` row by row.
    pub fn index_add(&mut self, indices: &CudaStorage, src: &CudaStorage) -> Result<()> {
        self.same_gpu(indices, "index_add")?;
        self.same_gpu(src, "index_add")?;
        if src.len == 0 {
            return Ok(());
        }
        let rows = indices.n();
        let row_len = numel(&self.shape[1..]) as i64;
        let gpu = self.gpu.clone();
        launch!(
            gpu,
            "index_add",
            Gpu::elementwise(src.len),
            &rows,
            &row_len,
            self.buf_mut(),
            indices.buf(),
            src.buf()
        )
    }

    /// An inverted-dropout mask generated on device `ordinal`.
    pub fn dropout_mask(shape: &[usize], p: f32, seed: u64, ordinal: usize) -> Result<CudaStorage> {
        let gpu = Gpu::get(ordinal)?;
        let mut out = Self::alloc(&gpu, shape)?;
        if out.len > 0 {
            let (n, keep) = (out.n(), 1.0 / (1.0 - p));
            launch!(
                gpu,
                "dropout_mask",
                Gpu::elementwise(out.len),
                &n,
                &p,
                &keep,
                &seed,
                out.buf_mut()
            )?;
        }
        Ok(out)
    }

    /// One SGD step, fused.
    pub fn sgd_update(
        p: &mut CudaStorage,
        g: &CudaStorage,
        momentum: Option<&mut CudaStorage>,
        s: SgdStep,
    ) -> Result<()> {
        p.same_gpu(g, "optimizer step")?;
        if p.len == 0 {
            return Ok(());
        }
        let (gpu, n, cfg) = (p.gpu.clone(), p.n(), Gpu::elementwise(p.len));
        match momentum {
            None => launch!(
                gpu,
                "sgd_plain",
                cfg,
                &n,
                p.buf_mut(),
                g.buf(),
                &s.lr,
                &s.weight_decay
            ),
            Some(b) => {
                let (nesterov, first) = (s.nesterov as i32, s.first as i32);
                launch!(
                    gpu,
                    "sgd_momentum",
                    cfg,
                    &n,
                    p.buf_mut(),
                    g.buf(),
                    b.buf_mut(),
                    &s.lr,
                    &s.momentum,
                    &s.dampening,
                    &s.weight_decay,
                    &nesterov,
                    &first
                )
            }
        }
    }

    /// One Adagrad step, fused.
    pub fn adagrad_update(
        p: &mut CudaStorage,
        g: &CudaStorage,
        acc: &mut CudaStorage,
        s: AdagradStep,
    ) -> Result<()> {
        p.same_gpu(g, "optimizer step")?;
        if p.len == 0 {
            return Ok(());
        }
        let (gpu, n) = (p.gpu.clone(), p.n());
        launch!(
            gpu,
            "adagrad",
            Gpu::elementwise(p.len),
            &n,
            p.buf_mut(),
            g.buf(),
            acc.buf_mut(),
            &s.lr,
            &s.eps,
            &s.weight_decay
        )
    }

    /// One Adam or AdamW step, fused; the bias corrections are computed on the host exactly as
    /// the CPU backend computes them.
    pub fn adam_update(
        p: &mut CudaStorage,
        g: &CudaStorage,
        m: &mut CudaStorage,
        v: &mut CudaStorage,
        s: AdamStep,
    ) -> Result<()> {
        p.same_gpu(g, "optimizer step")?;
        if p.len == 0 {
            return Ok(());
        }
        let bc1 = 1.0 - s.beta1.powi(s.step as i32);
        let bc2 = 1.0 - s.beta2.powi(s.step as i32);
        let step_size = s.lr / bc1;
        let bc2_sqrt = bc2.sqrt();
        let decoupled = s.decoupled as i32;
        let (gpu, n) = (p.gpu.clone(), p.n());
        launch!(
            gpu,
            "adam",
            Gpu::elementwise(p.len),
            &n,
            p.buf_mut(),
            g.buf(),
            m.buf_mut(),
            v.buf_mut(),
            &s.lr,
            &s.beta1,
            &s.beta2,
            &s.eps,
            &s.weight_decay,
            &decoupled,
            &step_size,
            &bc2_sqrt
        )
    }
}
