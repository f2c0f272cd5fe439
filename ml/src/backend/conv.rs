//! [`ConvOps`]: 2-D convolution and pooling over NCHW batches, with their backward passes; the
//! geometry types that describe them; and the [`Storage`] methods that dispatch to them.
//!
//! Images are laid out NCHW (`[batch, channels, height, width]`) and convolution weights
//! `[out_channels, in_channels / groups, kernel_height, kernel_width]`, as in PyTorch.

use super::matmul::MatmulOps;
use super::storage::{Storage, dispatch};
use crate::error::{MlError, Result};

/// The largest input plane (height · width) max pooling accepts: the winning cell's flat index
/// is carried as an f32, exact up to 2²⁴.
pub const MAX_POOL_PLANE: usize = 1 << 24;

/// A 2-D convolution of `[batch, in_channels, in_size[0], in_size[1]]` input with
/// `[out_channels, in_channels / groups, kernel[0], kernel[1]]` weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dGeometry {
    /// Images in the batch.
    pub batch: usize,
    /// Channels of each input image.
    pub in_channels: usize,
    /// Input [height, width].
    pub in_size: [usize; 2],
    /// Channels of each output image.
    pub out_channels: usize,
    /// Kernel [height, width].
    pub kernel: [usize; 2],
    /// Step between windows [vertical, horizontal].
    pub stride: [usize; 2],
    /// Zero padding on each side: [top and bottom, left and right].
    pub padding: [usize; 2],
    /// Spacing between the kernel's taps [vertical, horizontal] (1: adjacent).
    pub dilation: [usize; 2],
    /// Channel groups: input and output channels are split into `groups` equal parts, and
    /// output group `g` sees input group `g` only (`groups = in_channels`: depthwise).
    pub groups: usize,
}

impl Conv2dGeometry {
    /// Checks that the geometry describes a convolution that has an output: a non-empty input,
    /// positive kernel, stride, dilation and groups, channels divisible by `groups`, padding at
    /// most the input or the kernel's extent (so the output is bounded by the input and the
    /// kernel), and an output of at least one cell. The error names `op` and the sizes at
    /// fault.
    pub fn check(&self, op: &'static str) -> Result<()> {
        let positive = [
            ("kernel", self.kernel),
            ("stride", self.stride),
            ("dilation", self.dilation),
        ];
        for (what, v) in positive {
            if v.contains(&0) {
                return Err(MlError::invalid(
                    op,
                    format!("the {what} {v:?} must be at least 1 in each direction"),
                ));
            }
        }
        if self.groups == 0
            || !self.in_channels.is_multiple_of(self.groups)
            || !self.out_channels.is_multiple_of(self.groups)
        {
            return Err(MlError::invalid(
                op,
                format!(
                    "{} groups must divide both the {} input channels and the {} output channels",
                    self.groups, self.in_channels, self.out_channels
                ),
            ));
        }
        if self.in_size.contains(&0) {
            return Err(MlError::invalid(
                op,
                format!("the input {:?} has no cells", self.in_size),
            ));
        }
        let extent = self.kernel_extent();
        for d in 0..2 {
            if self.padding[d] > self.in_size[d].max(extent[d]) {
                return Err(MlError::invalid(
                    op,
                    format!(
                        "padding {:?} is larger than both the input {:?} and the kernel's extent {:?}",
                        self.padding, self.in_size, extent
                    ),
                ));
            }
            if self.padded(d) < extent[d] {
                return Err(MlError::invalid(
                    op,
                    format!(
                        "the input {:?} padded by {:?} is smaller than the kernel's extent {:?} \
                         (kernel {:?}, dilation {:?}), so there is no output",
                        self.in_size, self.padding, extent, self.kernel, self.dilation
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The kernel's extent on the input, `dilation · (kernel − 1) + 1`, per direction.
    pub fn kernel_extent(&self) -> [usize; 2] {
        [0, 1].map(|d| {
            self.dilation[d]
                .saturating_mul(self.kernel[d].max(1) - 1)
                .saturating_add(1)
        })
    }

    /// Output [height, width]: `(in + 2·pad − dil·(k−1) − 1) / stride + 1` (callers check it is
    /// at least 1 with [`Conv2dGeometry::check`]).
    pub fn out_size(&self) -> [usize; 2] {
        let extent = self.kernel_extent();
        [0, 1].map(|d| self.padded(d).saturating_sub(extent[d]) / self.stride[d].max(1) + 1)
    }

    /// The input's size along `d` with its padding on both sides.
    fn padded(&self, d: usize) -> usize {
        self.in_size[d].saturating_add(self.padding[d].saturating_mul(2))
    }

    /// `[batch, in_channels, height, width]`.
    pub fn input_shape(&self) -> [usize; 4] {
        [
            self.batch,
            self.in_channels,
            self.in_size[0],
            self.in_size[1],
        ]
    }

    /// `[out_channels, in_channels / groups, kernel height, kernel width]`.
    pub fn weight_shape(&self) -> [usize; 4] {
        [
            self.out_channels,
            self.in_channels / self.groups.max(1),
            self.kernel[0],
            self.kernel[1],
        ]
    }

    /// `[batch, out_channels, out height, out width]`.
    pub fn output_shape(&self) -> [usize; 4] {
        let [oh, ow] = self.out_size();
        [self.batch, self.out_channels, oh, ow]
    }
}

/// A pooling window over `[batch, channels, in_size[0], in_size[1]]` input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dGeometry {
    /// Images in the batch.
    pub batch: usize,
    /// Channels of each image (pooled independently).
    pub channels: usize,
    /// Input [height, width].
    pub in_size: [usize; 2],
    /// Window [height, width].
    pub kernel: [usize; 2],
    /// Step between windows (PyTorch's default is the kernel).
    pub stride: [usize; 2],
    /// Implicit padding on each side, at most `kernel / 2` (PyTorch's rule). Padded cells never
    /// win a max and are not counted in an average (`count_include_pad = false`).
    pub padding: [usize; 2],
}

impl Pool2dGeometry {
    /// Checks that the window is valid: a non-empty input, positive kernel and stride, padding
    /// at most half the kernel, a window that fits in the padded input. The error names `op`
    /// and the sizes.
    pub fn check(&self, op: &'static str) -> Result<()> {
        for (what, v) in [("kernel", self.kernel), ("stride", self.stride)] {
            if v.contains(&0) {
                return Err(MlError::invalid(
                    op,
                    format!("the {what} {v:?} must be at least 1 in each direction"),
                ));
            }
        }
        if self.in_size.contains(&0) {
            return Err(MlError::invalid(
                op,
                format!("the input {:?} has no cells", self.in_size),
            ));
        }
        for d in 0..2 {
            if self.padding[d] > self.kernel[d] / 2 {
                return Err(MlError::invalid(
                    op,
                    format!(
                        "padding {:?} must be at most half the kernel {:?}",
                        self.padding, self.kernel
                    ),
                ));
            }
            if self.padded(d) < self.kernel[d] {
                return Err(MlError::invalid(
                    op,
                    format!(
                        "the input {:?} padded by {:?} is smaller than the kernel {:?}, so there \
                         is no output",
                        self.in_size, self.padding, self.kernel
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Output [height, width]: `(in + 2·pad − k) / stride + 1`.
    pub fn out_size(&self) -> [usize; 2] {
        [0, 1].map(|d| self.padded(d).saturating_sub(self.kernel[d]) / self.stride[d].max(1) + 1)
    }

    /// The input's size along `d` with its padding on both sides.
    fn padded(&self, d: usize) -> usize {
        self.in_size[d].saturating_add(self.padding[d].saturating_mul(2))
    }

    /// `[batch, channels, height, width]`.
    pub fn input_shape(&self) -> [usize; 4] {
        [self.batch, self.channels, self.in_size[0], self.in_size[1]]
    }

    /// `[batch, channels, out height, out width]`.
    pub fn output_shape(&self) -> [usize; 4] {
        let [oh, ow] = self.out_size();
        [self.batch, self.channels, oh, ow]
    }

    /// The input rows (or columns, `d = 1`) that window `o` covers, padding left out: a
    /// non-empty range whenever the geometry passed [`Pool2dGeometry::check`].
    pub fn window(&self, d: usize, o: usize) -> std::ops::Range<usize> {
        let start = (o * self.stride[d]) as isize - self.padding[d] as isize;
        let end = start + self.kernel[d] as isize;
        let clamp = |v: isize| v.clamp(0, self.in_size[d] as isize) as usize;
        clamp(start)..clamp(end)
    }
}

/// Convolution and pooling kernels over NCHW batches. Shapes were checked by the caller
/// (against the geometry, which passed its `check`).
pub trait ConvOps: MatmulOps {
    /// `y = conv(x, w) + bias`: `[batch, out_channels, oh, ow]`, each output channel's cells
    /// starting from its `bias` value (`[out_channels]`) when there is one, so the bias costs no
    /// pass of its own.
    fn conv2d(x: &Self, w: &Self, bias: Option<&Self>, g: &Conv2dGeometry) -> Result<Self>;

    /// The gradient with respect to the input, `[batch, in_channels, h, w]`, from the output's
    /// gradient `grad` and the weights.
    fn conv2d_backward_input(grad: &Self, w: &Self, g: &Conv2dGeometry) -> Result<Self>;

    /// `dst (=|+=) dL/dw` from the input and the output's gradient, written straight into the
    /// weight's gradient buffer (`dst` has the weight's shape).
    fn conv2d_backward_weight(
        dst: &mut Self,
        x: &Self,
        grad: &Self,
        g: &Conv2dGeometry,
        accumulate: bool,
    ) -> Result<()>;

    /// Max pooling: the output and, per output cell, the flat index `h * W + w` of the winning
    /// cell within its input plane, stored as f32 (exact: the geometry's plane is at most
    /// [`MAX_POOL_PLANE`] cells).
    fn max_pool2d(x: &Self, p: &Pool2dGeometry) -> Result<(Self, Self)>;

    /// Routes each output gradient to its winning input cell (summing where windows overlap).
    fn max_pool2d_backward(grad: &Self, argmax: &Self, p: &Pool2dGeometry) -> Result<Self>;

    /// Average pooling (padding cells not counted).
    fn avg_pool2d(x: &Self, p: &Pool2dGeometry) -> Result<Self>;

    /// Spreads each output gradient evenly over its window's counted cells.
    fn avg_pool2d_backward(grad: &Self, p: &Pool2dGeometry) -> Result<Self>;
}

impl Storage {
    /// `conv(x, w) + bias`, the bias `[out_channels]` broadcast over the output's planes.
    pub fn conv2d(
        x: &Storage,
        w: &Storage,
        bias: Option<&Storage>,
        g: &Conv2dGeometry,
    ) -> Result<Storage> {
        match bias {
            None => dispatch!("conv2d", (x = x, w = w) => ConvOps::conv2d(x, w, None, g)),
            Some(b) => {
                dispatch!("conv2d", (x = x, w = w, b = b) => ConvOps::conv2d(x, w, Some(b), g))
            }
        }
    }

    /// The input's gradient of a convolution.
    pub fn conv2d_backward_input(
        grad: &Storage,
        w: &Storage,
        g: &Conv2dGeometry,
    ) -> Result<Storage> {
        dispatch!("conv2d backward", (gr = grad, w = w) =>
            ConvOps::conv2d_backward_input(gr, w, g))
    }

    /// `dst (=|+=)` the weight's gradient of a convolution.
    pub fn conv2d_backward_weight(
        dst: &mut Storage,
        x: &Storage,
        grad: &Storage,
        g: &Conv2dGeometry,
        accumulate: bool,
    ) -> Result<()> {
        dispatch!("conv2d backward", (d = dst, x = x, gr = grad) =>
            ConvOps::conv2d_backward_weight(d, x, gr, g, accumulate))
    }

    /// Max pooling: the output and the flat index of each window's winner in its plane.
    pub fn max_pool2d(x: &Storage, p: &Pool2dGeometry) -> Result<(Storage, Storage)> {
        dispatch!((x = x) => ConvOps::max_pool2d(x, p))
    }

    /// The input's gradient of max pooling.
    pub fn max_pool2d_backward(
        grad: &Storage,
        argmax: &Storage,
        p: &Pool2dGeometry,
    ) -> Result<Storage> {
        dispatch!("max_pool2d backward", (gr = grad, a = argmax) =>
            ConvOps::max_pool2d_backward(gr, a, p))
    }

    /// Average pooling (padding cells not counted).
    pub fn avg_pool2d(x: &Storage, p: &Pool2dGeometry) -> Result<Storage> {
        dispatch!((x = x) => ConvOps::avg_pool2d(x, p))
    }

    /// The input's gradient of average pooling.
    pub fn avg_pool2d_backward(grad: &Storage, p: &Pool2dGeometry) -> Result<Storage> {
        dispatch!((gr = grad) => ConvOps::avg_pool2d_backward(gr, p))
    }
}
