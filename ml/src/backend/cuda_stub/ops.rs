//! The backend traits for the uninhabited [`CudaStorage`]: constructors fail with the error of
//! [`check_available`](super::check_available), every other method is unreachable (there is no
//! value to call it on). Default methods need no line here.

use ndarray::ArrayD;

use super::{CudaStorage, unavailable};
use crate::backend::conv::{Conv2dGeometry, ConvOps, Pool2dGeometry};
use crate::backend::elementwise::{BinaryOp, ElementwiseOps, UnaryOp};
use crate::backend::index::IndexOps;
use crate::backend::loss::LossOps;
use crate::backend::matmul::{MatmulOps, MatmulOptions};
use crate::backend::memory::MemoryOps;
use crate::backend::norm::NormOps;
use crate::backend::optim::OptimOps;
use crate::backend::random::RandomOps;
use crate::backend::recurrent::RecurrentOps;
use crate::backend::reduce::ReduceOps;
use crate::backend::softmax::SoftmaxOps;
use crate::device::Device;
use crate::error::Result;

impl MemoryOps for CudaStorage {
    type Location = usize;

    fn zeros(_: &[usize], ordinal: usize) -> Result<Self> {
        unavailable(ordinal)
    }
    fn from_host(_: ArrayD<f32>, ordinal: usize) -> Result<Self> {
        unavailable(ordinal)
    }
    fn device(&self) -> Device {
        match *self {}
    }
    fn shape(&self) -> &[usize] {
        match *self {}
    }
    fn copy_to_slice(&self, _: &mut [f32]) -> Result<()> {
        match *self {}
    }
    fn copy_from_slice(&mut self, _: &[f32]) -> Result<()> {
        match *self {}
    }
    fn duplicate(&self) -> Result<Self> {
        match *self {}
    }
    fn reshape(&self, _: &[usize]) -> Result<Self> {
        match *self {}
    }
}

impl ElementwiseOps for CudaStorage {
    fn unary(&self, _: UnaryOp) -> Result<Self> {
        match *self {}
    }
    fn unary_backward(_: UnaryOp, x: &Self, _: &Self, _: &Self) -> Result<Self> {
        match *x {}
    }
    fn binary(&self, _: BinaryOp, _: &Self, _: &[usize]) -> Result<Self> {
        match *self {}
    }
    fn affine(&self, _: f32, _: f32) -> Result<Self> {
        match *self {}
    }
    fn add_assign(&mut self, _: &Self) -> Result<()> {
        match *self {}
    }
    fn fill(&mut self, _: f32) -> Result<()> {
        match *self {}
    }
    fn broadcast_to(&self, _: &[usize]) -> Result<Self> {
        match *self {}
    }
}

impl ReduceOps for CudaStorage {
    fn sum(&self, _: Option<usize>, _: bool) -> Result<Self> {
        match *self {}
    }
    fn sum_squares(&self) -> Result<f64> {
        match *self {}
    }
}

impl MatmulOps for CudaStorage {
    fn matmul_into(d: &mut Self, _: (&Self, &Self), _: MatmulOptions) -> Result<()> {
        match *d {}
    }
    fn bmm_into(d: &mut Self, _: (&Self, &Self), _: MatmulOptions) -> Result<()> {
        match *d {}
    }
}

impl ConvOps for CudaStorage {
    fn conv2d(x: &Self, _: &Self, _: Option<&Self>, _: &Conv2dGeometry) -> Result<Self> {
        match *x {}
    }
    fn conv2d_backward_input(g: &Self, _: &Self, _: &Conv2dGeometry) -> Result<Self> {
        match *g {}
    }
    fn conv2d_backward_weight(
        d: &mut Self,
        _: &Self,
        _: &Self,
        _: &Conv2dGeometry,
        _: bool,
    ) -> Result<()> {
        match *d {}
    }
    fn max_pool2d(x: &Self, _: &Pool2dGeometry) -> Result<(Self, Self)> {
        match *x {}
    }
    fn max_pool2d_backward(g: &Self, _: &Self, _: &Pool2dGeometry) -> Result<Self> {
        match *g {}
    }
    fn avg_pool2d(x: &Self, _: &Pool2dGeometry) -> Result<Self> {
        match *x {}
    }
    fn avg_pool2d_backward(g: &Self, _: &Pool2dGeometry) -> Result<Self> {
        match *g {}
    }
}

impl NormOps for CudaStorage {}

impl SoftmaxOps for CudaStorage {
    fn softmax(&self, _: usize, _: bool) -> Result<Self> {
        match *self {}
    }
}

impl LossOps for CudaStorage {
    fn cross_entropy(x: &Self, _: &Self) -> Result<(Self, Self)> {
        match *x {}
    }
    fn cross_entropy_backward(p: &Self, _: &Self, _: &Self) -> Result<Self> {
        match *p {}
    }
}

impl IndexOps for CudaStorage {
    fn permute(&self, _: &[usize]) -> Result<Self> {
        match *self {}
    }
    fn concat(parts: &[&Self], _: usize) -> Result<Self> {
        match *parts[0] {}
    }
    fn narrow(&self, _: usize, _: usize, _: usize) -> Result<Self> {
        match *self {}
    }
    fn index_select(&self, _: &Self) -> Result<Self> {
        match *self {}
    }
    fn index_add(&mut self, _: &Self, _: &Self) -> Result<()> {
        match *self {}
    }
}

impl RandomOps for CudaStorage {
    fn dropout_mask(_: &[usize], _: f32, _: u64, ordinal: usize) -> Result<Self> {
        unavailable(ordinal)
    }
}

impl OptimOps for CudaStorage {}

impl RecurrentOps for CudaStorage {}
