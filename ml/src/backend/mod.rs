//! Backends: where the numbers live and the kernels that transform them.
//!
//! [`Storage`] is a tensor's data on one device. Its methods are the complete set of primitive
//! kernels that the autodiff layer ([`crate::ops`]) is written against; each one dispatches on the
//! device. Nothing here knows about gradients or graphs: the backward pass of every op is
//! expressed with these same kernels (burn's separation of backend and autodiff).

pub mod cpu;
pub mod cuda;

use cpu::CpuArray;
use cpu::gemm::MatRef;
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
            Storage::Cuda(c) => match *c {},
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        match self {
            Storage::Cpu(a) => a.shape(),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// Zeros of this shape on `device`.
    pub fn zeros(shape: &[usize], device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(cpu::zeros(shape))),
            Device::Cuda(i) => cuda::check_available(i).map(|_| unreachable!()),
        }
    }

    /// Uploads host data to `device` (no copy for the CPU).
    pub fn from_host(a: CpuArray, device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(cpu::standard(a))),
            Device::Cuda(i) => cuda::check_available(i).map(|_| unreachable!()),
        }
    }

    /// A host copy of the data.
    pub fn to_host(&self) -> CpuArray {
        match self {
            Storage::Cpu(a) => a.clone(),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// A copy on the same device.
    pub fn duplicate(&self) -> Storage {
        match self {
            Storage::Cpu(a) => Storage::Cpu(a.clone()),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// Borrows the host array of a CPU storage.
    pub fn as_cpu(&self) -> Option<&CpuArray> {
        match self {
            Storage::Cpu(a) => Some(a),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// `op(self)` elementwise.
    pub fn unary(&self, op: UnaryOp) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::elementwise::unary(op, a))),
            Storage::Cuda(c) => match *c {},
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
            _ => Err(mixed("unary backward")),
        }
    }

    /// `self op rhs` broadcast to `out_shape`.
    pub fn binary(&self, op: BinaryOp, rhs: &Storage, out_shape: &[usize]) -> Result<Storage> {
        match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => {
                Ok(Storage::Cpu(cpu::elementwise::binary(op, a, b, out_shape)))
            }
            _ => Err(mixed("binary op")),
        }
    }

    /// `self · mul + add` elementwise.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::elementwise::affine(a, mul, add))),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// `self += other` (same shape).
    pub fn add_assign(&mut self, other: &Storage) -> Result<()> {
        match (self, other) {
            (Storage::Cpu(a), Storage::Cpu(b)) => {
                cpu::elementwise::add_assign(a, b);
                Ok(())
            }
            _ => Err(mixed("accumulate")),
        }
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: f32) {
        match self {
            Storage::Cpu(a) => cpu::slice_mut(a).fill(value),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// Multiplies every element by `factor` in place.
    pub fn scale(&mut self, factor: f32) {
        match self {
            Storage::Cpu(a) => cpu::slice_mut(a).iter_mut().for_each(|v| *v *= factor),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// Sums `self` over its broadcast dimensions into `dst` (adding when `accumulate`).
    pub fn sum_to_shape_into(&self, dst: &mut Storage, accumulate: bool) -> Result<()> {
        match (self, dst) {
            (Storage::Cpu(x), Storage::Cpu(d)) => {
                cpu::elementwise::sum_to_shape_into(x, d, accumulate);
                Ok(())
            }
            _ => Err(mixed("broadcast reduction")),
        }
    }

    /// A contiguous copy broadcast to `shape`.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::elementwise::broadcast_to(a, shape))),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// The sum of all elements (0-dimensional) or along `axis`.
    pub fn sum(&self, axis: Option<usize>, keepdim: bool) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(match axis {
                None => cpu::reduce::sum_all(a),
                Some(ax) => cpu::reduce::sum_axis(a, ax, keepdim),
            })),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// Repeats a reduced tensor along `axis` to length `len` (backward of an axis sum).
    pub fn expand_axis(&self, axis: usize, len: usize, keepdim: bool) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::reduce::expand_axis(
                a, axis, len, keepdim,
            ))),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// The sum of squares of all elements.
    pub fn sum_squares(&self) -> f64 {
        match self {
            Storage::Cpu(a) => cpu::reduce::sum_squares(a),
            Storage::Cuda(c) => match *c {},
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
            _ => Err(mixed("matmul")),
        }
    }

    /// Softmax (or log-softmax) along `axis`.
    pub fn softmax(&self, axis: usize, log: bool) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::softmax::softmax(a, axis, log))),
            Storage::Cuda(c) => match *c {},
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
            _ => Err(mixed("cross_entropy")),
        }
    }

    /// Gradient of the mean cross-entropy with respect to the logits, scaled by `grad`.
    pub fn cross_entropy_backward(
        probs: &Storage,
        targets: &Storage,
        grad: f32,
    ) -> Result<Storage> {
        match (probs, targets) {
            (Storage::Cpu(p), Storage::Cpu(t)) => {
                Ok(Storage::Cpu(cpu::loss::cross_entropy_backward(p, t, grad)))
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
            _ => Err(mixed("binary_cross_entropy_with_logits")),
        }
    }

    /// Gradient of [`Storage::bce_with_logits`] with respect to the logits.
    pub fn bce_with_logits_backward(
        logits: &Storage,
        targets: &Storage,
        grad: f32,
    ) -> Result<Storage> {
        match (logits, targets) {
            (Storage::Cpu(x), Storage::Cpu(z)) => Ok(Storage::Cpu(
                cpu::loss::bce_with_logits_backward(x, z, grad),
            )),
            _ => Err(mixed("binary_cross_entropy_with_logits backward")),
        }
    }

    /// The same elements with a new shape (element count checked by the caller).
    pub fn reshape(&self, shape: &[usize]) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::from_vec(shape, cpu::slice(a).to_vec()))),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// The axes reordered.
    pub fn permute(&self, axes: &[usize]) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::index::permute(a, axes))),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// Joins storages along `axis` (shapes checked by the caller).
    pub fn concat(parts: &[&Storage], axis: usize) -> Result<Storage> {
        let mut arrays = Vec::with_capacity(parts.len());
        for p in parts {
            match p {
                Storage::Cpu(a) => arrays.push(a),
                Storage::Cuda(_) => return Err(mixed("concat")),
            }
        }
        Ok(Storage::Cpu(cpu::index::concat(&arrays, axis)))
    }

    /// The slice `start..start + len` along `axis`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Storage> {
        match self {
            Storage::Cpu(a) => Ok(Storage::Cpu(cpu::index::narrow(a, axis, start, len))),
            Storage::Cuda(c) => match *c {},
        }
    }

    /// Rows of `self` picked by `indices` (range-checked by the caller).
    pub fn index_select(&self, indices: &Storage) -> Result<Storage> {
        match (self, indices) {
            (Storage::Cpu(t), Storage::Cpu(i)) => Ok(Storage::Cpu(cpu::index::index_select(t, i))),
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
            _ => Err(mixed("index_add")),
        }
    }
}
