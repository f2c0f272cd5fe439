//! Pooling and reshaping layers for images: [`MaxPool2d`], [`AvgPool2d`],
//! [`GlobalAvgPool2d`] and [`Flatten`].

use crate::error::Result;
use crate::nn::{Forward, Module};
use crate::ops::Pool2dOptions;
use crate::tensor::Tensor;

/// Max pooling of `[n, C, H, W]` inputs over windows of `options.kernel`.
pub struct MaxPool2d(pub Pool2dOptions);

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        x.max_pool2d(self.0)
    }
}

/// Average pooling of `[n, C, H, W]` inputs over windows of `options.kernel` (padding cells
/// are not counted).
pub struct AvgPool2d(pub Pool2dOptions);

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        x.avg_pool2d(self.0)
    }
}

/// The mean of each channel over its whole plane: `[n, C, H, W]` → `[n, C]` (ResNet's last
/// pooling, Keras' `GlobalAveragePooling2D`).
pub struct GlobalAvgPool2d;

impl Module for GlobalAvgPool2d {
    fn forward(&self, x: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        x.global_avg_pool2d()
    }
}

/// `[n, d1, d2, ...]` → `[n, d1·d2·...]`: one flat feature vector per example.
pub struct Flatten;

impl Module for Flatten {
    fn forward(&self, x: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        x.flatten()
    }
}
