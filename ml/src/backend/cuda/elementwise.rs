//! Elementwise kernels: unary functions and their derivatives, broadcasting binary operations,
//! affine maps and in-place updates.

use cudarc::driver::PushKernelArg;

use super::CudaStorage;
use super::device::Gpu;
use super::launch::launch;
use super::layout::{broadcast_strides, strided};
use crate::backend::elementwise::{BinaryOp, ElementwiseOps, UnaryOp};
use crate::backend::memory::MemoryOps;
use crate::error::Result;

/// The code `kernels.cu` gives a [`UnaryOp`].
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
        UnaryOp::GeluExact => 9,
    }
}

/// The code `kernels.cu` gives a [`BinaryOp`].
fn binary_code(op: BinaryOp) -> i32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
    }
}

impl CudaStorage {
    /// Runs `kernel(n, value, self)`, an in-place elementwise update with one scalar.
    fn in_place_scalar(&mut self, kernel: &'static str, value: f32) -> Result<()> {
        let (n, cfg) = (self.n(), Gpu::elementwise(self.len));
        self.launch_in_place(kernel, &[], |gpu, x| {
            launch!(gpu, kernel, cfg, &n, &value, x)
        })
    }

    /// `self op rhs` into `out` of the broadcast shape `out_shape`: a fast path for equal shapes
    /// and for a row vector against a matrix (a bias), a strided kernel otherwise.
    fn binary_into(
        &self,
        op: BinaryOp,
        rhs: &CudaStorage,
        out_shape: &[usize],
        out: &mut CudaStorage,
    ) -> Result<()> {
        let (code, n) = (binary_code(op), out.n());
        let cfg = Gpu::elementwise(out.len);
        let last = out_shape.last().copied().unwrap_or(1);
        let (a, b, o) = (self.buf(), rhs.buf(), out.buf_mut());
        if self.shape == out_shape && rhs.shape == out_shape {
            launch!(self.gpu, "binary_same", cfg, &code, &n, a, b, o)
        } else if self.shape == out_shape && rhs.len == last && rhs.shape.last() == Some(&last) {
            let cols = last as i64;
            launch!(self.gpu, "binary_row", cfg, &code, &n, &cols, a, b, o)
        } else {
            let s = strided(
                "binary op",
                out_shape,
                &broadcast_strides(&self.shape, out_shape),
                &broadcast_strides(&rhs.shape, out_shape),
            )?;
            launch!(self.gpu, "binary_bcast", cfg, &code, &n, &s, a, b, o)
        }
    }
}

impl ElementwiseOps for CudaStorage {
    fn unary(&self, op: UnaryOp) -> Result<Self> {
        let (code, n) = (unary_code(op), self.n());
        self.launch_new("unary", &[], &self.shape, |gpu, out| {
            let cfg = Gpu::elementwise(self.len);
            launch!(gpu, "unary_fwd", cfg, &code, &n, self.buf(), out.buf_mut())
        })
    }

    fn unary_backward(op: UnaryOp, x: &Self, y: &Self, g: &Self) -> Result<Self> {
        let (code, n) = (unary_code(op), x.n());
        let operands = [y.device(), g.device()];
        x.launch_new("unary backward", &operands, &x.shape, |gpu, out| {
            let cfg = Gpu::elementwise(x.len);
            let (x, y, g, o) = (x.buf(), y.buf(), g.buf(), out.buf_mut());
            launch!(gpu, "unary_bwd", cfg, &code, &n, x, y, g, o)
        })
    }

    fn binary(&self, op: BinaryOp, rhs: &Self, out_shape: &[usize]) -> Result<Self> {
        self.launch_new("binary op", &[rhs.device()], out_shape, |_, out| {
            self.binary_into(op, rhs, out_shape, out)
        })
    }

    fn affine(&self, mul: f32, add: f32) -> Result<Self> {
        let n = self.n();
        self.launch_new("affine", &[], &self.shape, |gpu, out| {
            let cfg = Gpu::elementwise(self.len);
            launch!(
                gpu,
                "affine",
                cfg,
                &n,
                &mul,
                &add,
                self.buf(),
                out.buf_mut()
            )
        })
    }

    fn add_assign(&mut self, other: &Self) -> Result<()> {
        let (n, cfg) = (self.n(), Gpu::elementwise(self.len));
        self.launch_in_place("accumulate", &[other.device()], |gpu, dst| {
            launch!(gpu, "add_assign", cfg, &n, dst, other.buf())
        })
    }

    fn fill(&mut self, value: f32) -> Result<()> {
        self.in_place_scalar("fill", value)
    }

    /// In place, one kernel.
    fn scale(&mut self, factor: f32) -> Result<()> {
        self.in_place_scalar("scale", factor)
    }

    fn broadcast_to(&self, shape: &[usize]) -> Result<Self> {
        self.strided_copy(
            "broadcast_to",
            shape,
            &broadcast_strides(&self.shape, shape),
        )
    }
}
