//! [`ElementwiseOps`]: functions applied element by element, broadcasting, and in-place updates;
//! and the [`Storage`] methods that dispatch to them.

use super::memory::MemoryOps;
use super::storage::{Storage, dispatch};
use crate::error::Result;

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
    /// GELU, exact: `x·Φ(x)` with the error function (PyTorch's `nn.GELU()`, Keras's
    /// default)
    GeluExact,
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

/// Elementwise kernels. Shapes were checked by the caller (the autodiff ops).
pub trait ElementwiseOps: MemoryOps {
    /// `op(self)` elementwise.
    fn unary(&self, op: UnaryOp) -> Result<Self>;

    /// `grad · op'(x)` where `y = op(x)`.
    fn unary_backward(op: UnaryOp, x: &Self, y: &Self, grad: &Self) -> Result<Self>;

    /// `self op rhs` broadcast to `out_shape`.
    fn binary(&self, op: BinaryOp, rhs: &Self, out_shape: &[usize]) -> Result<Self>;

    /// `self · mul + add` elementwise.
    fn affine(&self, mul: f32, add: f32) -> Result<Self>;

    /// `self += other` (same shape).
    fn add_assign(&mut self, other: &Self) -> Result<()>;

    /// Sets every element to `value`.
    fn fill(&mut self, value: f32) -> Result<()>;

    /// A contiguous copy broadcast to `shape`.
    fn broadcast_to(&self, shape: &[usize]) -> Result<Self>;

    /// Multiplies every element by `factor` in place. Default: [`scale_from_primitives`].
    fn scale(&mut self, factor: f32) -> Result<()> {
        scale_from_primitives(self, factor)
    }
}

/// [`ElementwiseOps::scale`] as an [`ElementwiseOps::affine`] into a new buffer that replaces
/// the old one.
pub fn scale_from_primitives<S: ElementwiseOps>(x: &mut S, factor: f32) -> Result<()> {
    *x = x.affine(factor, 0.0)?;
    Ok(())
}

impl Storage {
    /// `op(self)` elementwise.
    pub fn unary(&self, op: UnaryOp) -> Result<Storage> {
        dispatch!((x = self) => ElementwiseOps::unary(x, op))
    }

    /// `grad · op'(x)` where `y = op(x)`.
    pub fn unary_backward(
        op: UnaryOp,
        x: &Storage,
        y: &Storage,
        grad: &Storage,
    ) -> Result<Storage> {
        dispatch!("unary backward", (x = x, y = y, g = grad) =>
            ElementwiseOps::unary_backward(op, x, y, g))
    }

    /// `self op rhs` broadcast to `out_shape`.
    pub fn binary(&self, op: BinaryOp, rhs: &Storage, out_shape: &[usize]) -> Result<Storage> {
        dispatch!("binary op", (a = self, b = rhs) => ElementwiseOps::binary(a, op, b, out_shape))
    }

    /// `self · mul + add` elementwise.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Storage> {
        dispatch!((x = self) => ElementwiseOps::affine(x, mul, add))
    }

    /// `self += other` (same shape).
    pub fn add_assign(&mut self, other: &Storage) -> Result<()> {
        dispatch!("accumulate", (a = self, b = other) => ElementwiseOps::add_assign(a, b))
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: f32) -> Result<()> {
        dispatch!((x = self) => ElementwiseOps::fill(x, value))
    }

    /// Multiplies every element by `factor` in place.
    pub fn scale(&mut self, factor: f32) -> Result<()> {
        dispatch!((x = self) => ElementwiseOps::scale(x, factor))
    }

    /// A contiguous copy broadcast to `shape`.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Storage> {
        dispatch!((x = self) => ElementwiseOps::broadcast_to(x, shape))
    }
}
