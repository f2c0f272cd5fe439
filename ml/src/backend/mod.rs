//! Backends: where the numbers live and the kernels that transform them.
//!
//! [`Storage`] is a tensor's data on one device. Its methods are the complete set of primitive
//! kernels that the autodiff layer ([`crate::ops`]) is written against; each one dispatches on the
//! device. Nothing here knows about gradients or graphs: the backward pass of every op is
//! expressed with these same kernels (burn's separation of backend and autodiff).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub mod cuda;

use cpu::CpuArray;
use cpu::gemm::MatRef;
pub use cpu::optim::{AdagradStep, AdamStep, SgdStep};
pub use cuda::CudaStorage;

use crate::device::Device;
use crate::error::{MlError, Result};

/// Elementwise functions of one argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `e^x`
    Exp,
    /// natural logarithm
    Log,
    /// `max(x, 0)`
    Relu,
    /// hyperbolic tangent
    Tanh,
    /// logistic function
    Sigmoid,
    /// GELU, tanh approximation (JAX's default, PyTorch's `approximate="tanh"`)
    Gelu,
    /// square root
    Sqrt,
    /// `x²`
    Square,
}

/// Elementwise functions of two arguments, with broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`
    Div,
}

/// A tensor's elements on one device, always dense and row-major.
#[derive(Debug)]
pub enum Storage {
    /// Host memory.
    Cpu(CpuArray),
    /// GPU memory (uninhabited unless built with the `cuda` feature).
    Cuda(CudaStorage),
}

fn mat_ref(x: &CpuArray, transposed: bool) -> MatRef<'_> {
    MatRef {
        data: cpu::slice(x),
        rows: x.shape()[0],
        cols: x.shape()[1],
        transposed,
    }
}

/// The value of a one-element host array.
fn scalar(a: &CpuArray) -> f32 {
    cpu::slice(a).first().copied().unwrap_or(0.0)
}

fn mixed(op: &'static str) -> MlError {
    MlError::Device(format!(
        "{op}: tensors are on different devices; move them to one device first"
    ))
}

impl Storage {
    /// The device holding the data.
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(c) => c.device(),
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        match self {
            Storage::Cpu(a) => a.shape(),
            Storage::Cuda(c) => c.shape(),
        }
    }

    /// Zeros of this shape on `device`.
    pub fn zeros(shape: &[usize], device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(cpu::zeros(shape))),
            Device::Cuda(i) => Ok(Storage::Cuda(CudaStorage::zeros(shape, i)?)),
        }
    }

    /// Uploads host data to `device` (no copy for the CPU).
    pub fn from_host(a: CpuArray, device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(cpu::standard(a))),
            Device::Cuda(i) => Ok(Storage::Cuda(CudaStorage::from_host(&cpu::standard(a), i)?)),
        }
    }

    /// A host copy of the data (a download from a GPU).
    pub fn to_host(&self) -> Result<CpuArray> {
        match self {
            Storage::Cpu(a) => Ok(a.clone()),
            Storage::Cuda(c) => c.to_host(),
        }
    }

    /// Copies the elements into `dst` (row-major; the caller checked the length).
    pub fn copy_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        match self {
            Storage::Cpu(a) => {
                dst.copy_from_slice(cpu::slice(a));
                Ok(())
            }
            Storage::Cuda(c) => c.copy_to_slice(dst),
        }
    }

    /// Like [`Storage::copy_to_slice`], but a GPU copy into page-locked memory is only queued:
    /// `dst` holds the values after [`Device::synchronize`].
    pub fn queue_copy_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        match self {
            Storage::Cpu(_) => self.copy_to_slice(dst),
            Storage::Cuda(c) => c.queue_copy_to_slice(dst),
        }
    }

    /// Overwrites the elements from `src` (row-major; the caller checked the length). A GPU
    /// copy from page-locked memory is only queued: `src` must not change before
    /// [`Device::synchronize`].
    pub fn copy_from_slice(&mut self, src: &[f32]) -> Result<()> {
        match self {
            Storage::Cpu(a) => {
                cpu::slice_mut(a).copy_from_slice(src);
                Ok(())
            }
            Storage::Cuda(c) => c.copy_from_slice(src),
        }
    }

    /// A copy on the same device.
    pub fn duplicate(&self) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(a.clone())),
            Storage::Cuda(c) => Ok(Storage::Cuda(c.duplicate()?)),
        }
    }

    /// Borrows the host array of a CPU storage.
    pub fn as_cpu(&self) -> Option<&CpuArray> {
        match self {
            Storage::Cpu(a) => Some(a),
            Storage::Cuda(_) => None,
        }
    }

    /// `op(self)` elementwise.
    pub fn unary(&self, op: UnaryOp) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::elementwise::unary(op, a))),
            Storage::Cuda(c) => Ok(Storage::Cuda(c.unary(op)?)),
        }
    }

    /// `grad · op'(x)` where `y = op(x)`.
    pub fn unary_backward(
        op: UnaryOp,
        x: &Storage,
        y: &Storage,
        grad: &Storage,
    ) -> Result<Storage> {
        match (x, y, grad) {
            (Storage::Cpu(x), Storage::Cpu(y), Storage::Cpu(g)) => {
                Ok(Storage::Cpu(cpu::elementwise::unary_backward(op, x, y, g)))
            }
            (Storage::Cuda(x), Storage::Cuda(y), Storage::Cuda(g)) => {
                Ok(Storage::Cuda(CudaStorage::unary_backward(op, x, y, g)?))
            }
            _ => Err(mixed("unary backward")),
        }
    }

    /// `self op rhs` broadcast to `out_shape`.
    pub fn binary(&self, op: BinaryOp, rhs: &Storage, out_shape: &[usize]) -> Result<Storage> {
        match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => {
                Ok(Storage::Cpu(cpu::elementwise::binary(op, a, b, out_shape)))
            }
            (Storage::Cuda(a), Storage::Cuda(b)) => Ok(Storage::Cuda(a.binary(op, b, out_shape)?)),
            _ => Err(mixed("binary op")),
        }
    }

    /// `self · mul + add` elementwise.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::elementwise::affine(a, mul, add))),
            Storage::Cuda(c) => Ok(Storage::Cuda(c.affine(mul, add)?)),
        }
    }

    /// `self += other` (same shape).
    pub fn add_assign(&mut self, other: &Storage) -> Result<()> {
        match (self, other) {
            (Storage::Cpu(a), Storage::Cpu(b)) => {
                cpu::elementwise::add_assign(a, b);
                Ok(())
            }
            (Storage::Cuda(a), Storage::Cuda(b)) => a.add_assign(b),
            _ => Err(mixed("accumulate")),
        }
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: f32) -> Result<()> {
        match self {
            Storage::Cpu(a) => {
                cpu::slice_mut(a).fill(value);
                Ok(())
            }
            Storage::Cuda(c) => c.fill(value),
        }
    }

    /// Multiplies every element by `factor` in place.
    pub fn scale(&mut self, factor: f32) -> Result<()> {
        match self {
            Storage::Cpu(a) => {
                cpu::slice_mut(a).iter_mut().for_each(|v| *v *= factor);
                Ok(())
            }
            Storage::Cuda(c) => c.scale(factor),
        }
    }

    /// Sums `self` over its broadcast dimensions into `dst` (adding when `accumulate`).
    pub fn sum_to_shape_into(&self, dst: &mut Storage, accumulate: bool) -> Result<()> {
        match (self, dst) {
            (Storage::Cpu(x), Storage::Cpu(d)) => {
                cpu::elementwise::sum_to_shape_into(x, d, accumulate);
                Ok(())
            }
            (Storage::Cuda(x), Storage::Cuda(d)) => x.sum_to_shape_into(d, accumulate),
            _ => Err(mixed("broadcast reduction")),
        }
    }

    /// A contiguous copy broadcast to `shape`.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::elementwise::broadcast_to(a, shape))),
            Storage::Cuda(c) => Ok(Storage::Cuda(c.broadcast_to(shape)?)),
        }
    }

    /// The sum of all elements (0-dimensional) or along `axis`.
    pub fn sum(&self, axis: Option<usize>, keepdim: bool) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(match axis {
                None => cpu::reduce::sum_all(a),
                Some(ax) => cpu::reduce::sum_axis(a, ax, keepdim),
            })),
            Storage::Cuda(c) => Ok(Storage::Cuda(c.sum(axis, keepdim)?)),
        }
    }

    /// Repeats a reduced tensor along `axis` to length `len` (backward of an axis sum).
    pub fn expand_axis(&self, axis: usize, len: usize, keepdim: bool) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::reduce::expand_axis(
                a, axis, len, keepdim,
            ))),
            Storage::Cuda(c) => Ok(Storage::Cuda(c.expand_axis(axis, len, keepdim)?)),
        }
    }

    /// The sum of squares of all elements.
    pub fn sum_squares(&self) -> Result<f64> {
        match self {
            Storage::Cpu(a) => Ok(cpu::reduce::sum_squares(a)),
            Storage::Cuda(c) => c.sum_squares(),
        }
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
        match (dst, a, b) {
            (Storage::Cpu(d), Storage::Cpu(a), Storage::Cpu(b)) => {
                let a_ref = mat_ref(a, transpose_a);
                let b_ref = mat_ref(b, transpose_b);
                cpu::gemm::matmul_into(cpu::slice_mut(d), a_ref, b_ref, accumulate);
                Ok(())
            }
            (Storage::Cuda(d), Storage::Cuda(a), Storage::Cuda(b)) => {
                CudaStorage::matmul_into(d, a, transpose_a, b, transpose_b, accumulate)
            }
            _ => Err(mixed("matmul")),
        }
    }

    /// Softmax (or log-softmax) along `axis`.
    pub fn softmax(&self, axis: usize, log: bool) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::softmax::softmax(a, axis, log))),
            Storage::Cuda(c) => Ok(Storage::Cuda(c.softmax(axis, log)?)),
        }
    }

    /// Backward of softmax (or log-softmax) from its output `y`.
    pub fn softmax_backward(
        y: &Storage,
        grad: &Storage,
        axis: usize,
        log: bool,
    ) -> Result<Storage> {
        match (y, grad) {
            (Storage::Cpu(y), Storage::Cpu(g)) => Ok(Storage::Cpu(cpu::softmax::softmax_backward(
                y, g, axis, log,
            ))),
            (Storage::Cuda(y), Storage::Cuda(g)) => Ok(Storage::Cuda(
                CudaStorage::softmax_backward(y, g, axis, log)?,
            )),
            _ => Err(mixed("softmax backward")),
        }
    }

    /// Mean cross-entropy and the softmax probabilities (targets range-checked by the caller).
    pub fn cross_entropy(logits: &Storage, targets: &Storage) -> Result<(Storage, Storage)> {
        match (logits, targets) {
            (Storage::Cpu(x), Storage::Cpu(t)) => {
                let (loss, probs) = cpu::loss::cross_entropy(x, t);
                Ok((Storage::Cpu(loss), Storage::Cpu(probs)))
            }
            (Storage::Cuda(x), Storage::Cuda(t)) => {
                let (loss, probs) = CudaStorage::cross_entropy(x, t)?;
                Ok((Storage::Cuda(loss), Storage::Cuda(probs)))
            }
            _ => Err(mixed("cross_entropy")),
        }
    }

    /// Gradient of the mean cross-entropy with respect to the logits, scaled by the one-element
    /// `grad` (read on the device: no synchronization).
    pub fn cross_entropy_backward(
        probs: &Storage,
        targets: &Storage,
        grad: &Storage,
    ) -> Result<Storage> {
        match (probs, targets, grad) {
            (Storage::Cpu(p), Storage::Cpu(t), Storage::Cpu(g)) => Ok(Storage::Cpu(
                cpu::loss::cross_entropy_backward(p, t, scalar(g)),
            )),
            (Storage::Cuda(p), Storage::Cuda(t), Storage::Cuda(g)) => {
                Ok(Storage::Cuda(CudaStorage::cross_entropy_backward(p, t, g)?))
            }
            _ => Err(mixed("cross_entropy backward")),
        }
    }

    /// Mean binary cross-entropy with logits.
    pub fn bce_with_logits(logits: &Storage, targets: &Storage) -> Result<Storage> {
        match (logits, targets) {
            (Storage::Cpu(x), Storage::Cpu(z)) => {
                Ok(Storage::Cpu(cpu::loss::bce_with_logits(x, z)))
            }
            (Storage::Cuda(x), Storage::Cuda(z)) => {
                Ok(Storage::Cuda(CudaStorage::bce_with_logits(x, z)?))
            }
            _ => Err(mixed("binary_cross_entropy_with_logits")),
        }
    }

    /// Gradient of [`Storage::bce_with_logits`] with respect to the logits, scaled by the
    /// one-element `grad`.
    pub fn bce_with_logits_backward(
        logits: &Storage,
        targets: &Storage,
        grad: &Storage,
    ) -> Result<Storage> {
        match (logits, targets, grad) {
            (Storage::Cpu(x), Storage::Cpu(z), Storage::Cpu(g)) => Ok(Storage::Cpu(
                cpu::loss::bce_with_logits_backward(x, z, scalar(g)),
            )),
            (Storage::Cuda(x), Storage::Cuda(z), Storage::Cuda(g)) => Ok(Storage::Cuda(
                CudaStorage::bce_with_logits_backward(x, z, g)?,
            )),
            _ => Err(mixed("binary_cross_entropy_with_logits backward")),
        }
    }

    /// The same elements with a new shape (element count checked by the caller).
    pub fn reshape(&self, shape: &[usize]) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::from_vec(shape, cpu::slice(a).to_vec()))),
            Storage::Cuda(c) => Ok(Storage::Cuda(c.reshape(shape)?)),
        }
    }

    /// The axes reordered.
    pub fn permute(&self, axes: &[usize]) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::index::permute(a, axes))),
            Storage::Cuda(c) => Ok(Storage::Cuda(c.permute(axes)?)),
        }
    }

    /// Joins storages along `axis` (shapes checked by the caller).
    pub fn concat(parts: &[&Storage], axis: usize) -> Result<Storage> {
        let mut host = Vec::with_capacity(parts.len());
        let mut gpu = Vec::with_capacity(parts.len());
        for p in parts {
            match p {
                Storage::Cpu(a) => host.push(a),
                Storage::Cuda(c) => gpu.push(c),
            }
        }
        match (host.is_empty(), gpu.is_empty()) {
            (_, true) => Ok(Storage::Cpu(cpu::index::concat(&host, axis))),
            (true, false) => Ok(Storage::Cuda(CudaStorage::concat(&gpu, axis)?)),
            (false, false) => Err(mixed("concat")),
        }
    }

    /// The slice `start..start + len` along `axis`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::index::narrow(a, axis, start, len))),
            Storage::Cuda(c) => Ok(Storage::Cuda(c.narrow(axis, start, len)?)),
        }
    }

    /// Rows of `self` picked by `indices` (range-checked by the caller).
    pub fn index_select(&self, indices: &Storage) -> Result<Storage> {
        match (self, indices) {
            (Storage::Cpu(t), Storage::Cpu(i)) => Ok(Storage::Cpu(cpu::index::index_select(t, i))),
            (Storage::Cuda(t), Storage::Cuda(i)) => Ok(Storage::Cuda(t.index_select(i)?)),
            _ => Err(mixed("index_select")),
        }
    }

    /// `self[indices[j]] += src[j]` row by row.
    pub fn index_add(&mut self, indices: &Storage, src: &Storage) -> Result<()> {
        match (self, indices, src) {
            (Storage::Cpu(d), Storage::Cpu(i), Storage::Cpu(s)) => {
                cpu::index::index_add(d, i, s);
                Ok(())
            }
            (Storage::Cuda(d), Storage::Cuda(i), Storage::Cuda(s)) => d.index_add(i, s),
            _ => Err(mixed("index_add")),
        }
    }

    /// An inverted-dropout mask of `shape` on `device`: each element is 0 with probability `p`
    /// and `1 / (1 - p)` otherwise, drawn from the counter-based generator
    /// [`cpu::random::uniform_at`]`(seed, i)`, so every device draws the same mask.
    pub fn dropout_mask(shape: &[usize], p: f32, seed: u64, device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(cpu::random::dropout_mask(shape, p, seed))),
            Device::Cuda(i) => Ok(Storage::Cuda(CudaStorage::dropout_mask(shape, p, seed, i)?)),
        }
    }

    /// One SGD step on parameter `p` from gradient `g`, with the momentum buffer when there is
    /// one.
    pub fn sgd_update(
        p: &mut Storage,
        g: &Storage,
        momentum: Option<&mut Storage>,
        step: SgdStep,
    ) -> Result<()> {
        match (p, g, momentum) {
            (Storage::Cpu(p), Storage::Cpu(g), None) => {
                cpu::optim::sgd(cpu::slice_mut(p), cpu::slice(g), None, step);
                Ok(())
            }
            (Storage::Cpu(p), Storage::Cpu(g), Some(Storage::Cpu(b))) => {
                let b = cpu::slice_mut(b);
                cpu::optim::sgd(cpu::slice_mut(p), cpu::slice(g), Some(b), step);
                Ok(())
            }
            (Storage::Cuda(p), Storage::Cuda(g), None) => CudaStorage::sgd_update(p, g, None, step),
            (Storage::Cuda(p), Storage::Cuda(g), Some(Storage::Cuda(b))) => {
                CudaStorage::sgd_update(p, g, Some(b), step)
            }
            _ => Err(mixed("optimizer step")),
        }
    }

    /// One Adagrad step on `p` with accumulator `acc`.
    pub fn adagrad_update(
        p: &mut Storage,
        g: &Storage,
        acc: &mut Storage,
        step: AdagradStep,
    ) -> Result<()> {
        match (p, g, acc) {
            (Storage::Cpu(p), Storage::Cpu(g), Storage::Cpu(a)) => {
                cpu::optim::adagrad(
                    cpu::slice_mut(p),
                    cpu::slice(g),
                    cpu::slice_mut(a),
                    step.lr,
                    step.eps,
                    step.weight_decay,
                );
                Ok(())
            }
            (Storage::Cuda(p), Storage::Cuda(g), Storage::Cuda(a)) => {
                CudaStorage::adagrad_update(p, g, a, step)
            }
            _ => Err(mixed("optimizer step")),
        }
    }

    /// One Adam or AdamW step on `p` with moments `m` and `v`.
    pub fn adam_update(
        p: &mut Storage,
        g: &Storage,
        m: &mut Storage,
        v: &mut Storage,
        step: AdamStep,
    ) -> Result<()> {
        match (p, g, m, v) {
            (Storage::Cpu(p), Storage::Cpu(g), Storage::Cpu(m), Storage::Cpu(v)) => {
                cpu::optim::adam(
                    cpu::slice_mut(p),
                    cpu::slice(g),
                    cpu::slice_mut(m),
                    cpu::slice_mut(v),
                    step,
                );
                Ok(())
            }
            (Storage::Cuda(p), Storage::Cuda(g), Storage::Cuda(m), Storage::Cuda(v)) => {
                CudaStorage::adam_update(p, g, m, v, step)
            }
            _ => Err(mixed("optimizer step")),
        }
    }
}
