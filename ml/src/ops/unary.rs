//! Elementwise functions: neg, exp, log, relu, tanh, sigmoid, gelu (both forms), sqrt, square.

use crate::autodiff::{Backward, GradSink};
use crate::backend::{Storage, UnaryOp};
use crate::error::Result;
use crate::tensor::Tensor;

struct UnaryBackward(UnaryOp);

impl Backward for UnaryBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        out: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let x = &inputs[0];
        let gx = Storage::unary_backward(self.0, &x.read(), &out.read(), g)?;
        sink.add(x, gx)
    }
}

impl Tensor {
    /// Applies an elementwise function.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        let out = self.read().unary(op)?;
        Ok(Tensor::from_op(out, &[self], UnaryBackward(op)))
    }

    /// `-x`
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }

    /// `e^x`
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp)
    }

    /// Natural logarithm.
    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log)
    }

    /// `max(x, 0)`; its derivative at 0 is taken as 0.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }

    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }

    /// Logistic function `1 / (1 + e^-x)`.
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }

    /// GELU in its tanh approximation, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu)
    }

    /// GELU, exact: `0.5·x·(1 + erf(x/√2))` (PyTorch's `nn.GELU()`).
    pub fn gelu_exact(&self) -> Result<Tensor> {
        self.unary(UnaryOp::GeluExact)
    }

    /// Square root.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }

    /// `x²`
    pub fn square(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Square)
    }
}
