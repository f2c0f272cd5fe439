//! Pooling of NCHW batches (max, average, global average) and flattening images to vectors.

use crate::autodiff::{Backward, GradSink};
use crate::backend::conv::MAX_POOL_PLANE;
use crate::backend::{Pool2dGeometry, Storage};
use crate::error::{MlError, Result};
use crate::tensor::Tensor;

/// Pooling options: the window, its stride (`None`: the window, PyTorch's default) and the
/// implicit padding on each side (at most half the window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dOptions {
    /// Window [height, width].
    pub kernel: [usize; 2],
    /// Step between windows; `None` for the window itself (non-overlapping windows).
    pub stride: Option<[usize; 2]>,
    /// Padding on each side [top and bottom, left and right], at most `kernel / 2`; padded cells
    /// never win a max and are not counted in an average.
    pub padding: [usize; 2],
}

impl Pool2dOptions {
    /// A `kernel × kernel` window with stride `kernel` and no padding (`nn.MaxPool2d(k)`).
    pub fn square(kernel: usize) -> Self {
        Pool2dOptions {
            kernel: [kernel, kernel],
            stride: None,
            padding: [0, 0],
        }
    }
}

/// The gradient goes to each window's maximum.
struct MaxPool2dBackward {
    geometry: Pool2dGeometry,
    /// The flat index of each window's winner in its plane.
    argmax: Storage,
}

impl Backward for MaxPool2dBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let dx = Storage::max_pool2d_backward(g, &self.argmax, &self.geometry)?;
        sink.add(&inputs[0], dx)
    }
}

/// The gradient is shared evenly by each window's cells.
struct AvgPool2dBackward(Pool2dGeometry);

impl Backward for AvgPool2dBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let dx = Storage::avg_pool2d_backward(g, &self.0)?;
        sink.add(&inputs[0], dx)
    }
}

/// The pooling geometry of `x`, or an error naming `op` and the shape.
fn geometry(op: &'static str, x: &Tensor, opts: Pool2dOptions) -> Result<Pool2dGeometry> {
    let s = x.shape();
    if s.len() != 4 {
        return Err(MlError::invalid(
            op,
            format!("the input {s:?} is not a [batch, channels, height, width] batch of images"),
        ));
    }
    let p = Pool2dGeometry {
        batch: s[0],
        channels: s[1],
        in_size: [s[2], s[3]],
        kernel: opts.kernel,
        stride: opts.stride.unwrap_or(opts.kernel),
        padding: opts.padding,
    };
    p.check(op)?;
    Ok(p)
}

impl Tensor {
    /// Max pooling of a batch of images `[n, C, H, W]` over `opts`' windows: `[n, C, oh, ow]`
    /// with `oh = (H + 2·padding − kernel) / stride + 1`. The gradient goes to each window's
    /// first maximum.
    pub fn max_pool2d(&self, opts: Pool2dOptions) -> Result<Tensor> {
        let p = geometry("max_pool2d", self, opts)?;
        let plane = p.in_size[0].saturating_mul(p.in_size[1]);
        if plane > MAX_POOL_PLANE {
            return Err(MlError::invalid(
                "max_pool2d",
                format!(
                    "the input {:?} has {plane} cells per plane, more than the {MAX_POOL_PLANE} \
                     it can index",
                    self.shape()
                ),
            ));
        }
        let (out, argmax) = Storage::max_pool2d(&self.read(), &p)?;
        let backward = MaxPool2dBackward {
            geometry: p,
            argmax,
        };
        Ok(Tensor::from_op(out, &[self], backward))
    }

    /// Average pooling of a batch of images `[n, C, H, W]` over `opts`' windows (shapes as
    /// [`Tensor::max_pool2d`]); padding cells are not counted.
    pub fn avg_pool2d(&self, opts: Pool2dOptions) -> Result<Tensor> {
        let p = geometry("avg_pool2d", self, opts)?;
        let out = Storage::avg_pool2d(&self.read(), &p)?;
        Ok(Tensor::from_op(out, &[self], AvgPool2dBackward(p)))
    }

    /// The mean of each channel over its whole plane: `[n, C, H, W]` → `[n, C]` (global
    /// average pooling, as at the end of a ResNet).
    pub fn global_avg_pool2d(&self) -> Result<Tensor> {
        let s = self.shape();
        if s.len() != 4 || s[2] == 0 || s[3] == 0 {
            return Err(MlError::invalid(
                "global_avg_pool2d",
                format!(
                    "the input {s:?} is not a [batch, channels, height, width] batch of non-empty \
                     images"
                ),
            ));
        }
        self.reshape(&[s[0], s[1], s[2] * s[3]])?.mean(2, false)
    }

    /// Each example as one vector: `[n, d1, d2, ...]` → `[n, d1·d2·...]` (`[n]` → `[n, 1]`).
    pub fn flatten(&self) -> Result<Tensor> {
        let s = self.shape();
        if s.is_empty() {
            return Err(MlError::invalid(
                "flatten",
                "a 0-dimensional tensor has no batch axis to keep",
            ));
        }
        self.reshape(&[s[0], s[1..].iter().product()])
    }
}
