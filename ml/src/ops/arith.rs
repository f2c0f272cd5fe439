//! Broadcasting arithmetic: add, sub, mul, div, and scalar affine maps.

use crate::autodiff::{Backward, GradSink};
use crate::backend::{BinaryOp, Storage};
use crate::error::Result;
use crate::ops::same_device;
use crate::shape::broadcast_shape;
use crate::tensor::Tensor;

struct BinaryBackward(BinaryOp);

impl Backward for BinaryBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let (a, b) = (&inputs[0], &inputs[1]);
        let shape = g.shape().to_vec();
        match self.0 {
            BinaryOp::Add => {
                sink.add_reduced_ref(b, g)?;
                sink.add_reduced_ref(a, g)
            }
            BinaryOp::Sub => {
                if sink.wants(b) {
                    sink.add_reduced(b, g.affine(-1.0, 0.0)?)?;
                }
                sink.add_reduced_ref(a, g)
            }
            BinaryOp::Mul => {
                if sink.wants(a) {
                    let ga = g.binary(BinaryOp::Mul, &b.read(), &shape)?;
                    sink.add_reduced(a, ga)?;
                }
                if sink.wants(b) {
                    let gb = g.binary(BinaryOp::Mul, &a.read(), &shape)?;
                    sink.add_reduced(b, gb)?;
                }
                Ok(())
            }
            BinaryOp::Div => {
                // d(a/b)/da = 1/b;  d(a/b)/db = -a/b²
                if sink.wants(a) {
                    let ga = g.binary(BinaryOp::Div, &b.read(), &shape)?;
                    sink.add_reduced(a, ga)?;
                }
                if sink.wants(b) {
                    let b_val = b.read();
                    let q = a.read().binary(BinaryOp::Div, &b_val, &shape)?;
                    let q = q.binary(BinaryOp::Div, &b_val, &shape)?;
                    let gb = g.binary(BinaryOp::Mul, &q, &shape)?.affine(-1.0, 0.0)?;
                    sink.add_reduced(b, gb)?;
                }
                Ok(())
            }
        }
    }
}

struct AffineBackward(f32);

impl Backward for AffineBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        sink.add(&inputs[0], g.affine(self.0, 0.0)?)
    }
}

impl Tensor {
    fn binary_op(&self, rhs: &Tensor, op: BinaryOp, name: &'static str) -> Result<Tensor> {
        same_device(name, &[self, rhs])?;
        let shape = broadcast_shape(name, self.shape(), rhs.shape())?;
        let out = self.read().binary(op, &rhs.read(), &shape)?;
        Ok(Tensor::from_op(out, &[self, rhs], BinaryBackward(op)))
    }

    /// `self + rhs`, broadcasting.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(rhs, BinaryOp::Add, "add")
    }

    /// `self - rhs`, broadcasting.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(rhs, BinaryOp::Sub, "sub")
    }

    /// `self * rhs` elementwise, broadcasting.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(rhs, BinaryOp::Mul, "mul")
    }

    /// `self / rhs` elementwise, broadcasting.
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(rhs, BinaryOp::Div, "div")
    }

    /// `self * mul + add` with scalars.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Tensor> {
        let out = self.read().affine(mul, add)?;
        Ok(Tensor::from_op(out, &[self], AffineBackward(mul)))
    }

    /// `self * factor`.
    pub fn scale(&self, factor: f32) -> Result<Tensor> {
        self.affine(factor, 0.0)
    }

    /// `self + value`.
    pub fn add_scalar(&self, value: f32) -> Result<Tensor> {
        self.affine(1.0, value)
    }
}
