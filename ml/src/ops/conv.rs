//! 2-D convolution of NCHW batches, with an optional bias.

use crate::autodiff::{Backward, GradSink, GradWrite};
use crate::backend::{Conv2dGeometry, Storage};
use crate::error::{MlError, Result};
use crate::ops::same_device;
use crate::tensor::Tensor;

/// Convolution options with PyTorch's defaults (stride 1, padding 0, dilation 1, groups 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// Step between windows [vertical, horizontal].
    pub stride: [usize; 2],
    /// Zero padding on each side [top and bottom, left and right].
    pub padding: [usize; 2],
    /// Spacing between the kernel's taps (1: adjacent).
    pub dilation: [usize; 2],
    /// Channel groups (`groups = in_channels`: a depthwise convolution).
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// `y = conv(x, w) (+ b)`: `dx = conv_backward_input(dy, w)`, `dw = Σ dy · unrolled(x)ᵀ`
/// (written straight into the weight's gradient buffer), `db = Σ dy` per channel.
struct Conv2dBackward(Conv2dGeometry);

impl Backward for Conv2dBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let (x, w, geometry) = (&inputs[0], &inputs[1], &self.0);
        if sink.wants(x) {
            let dx = Storage::conv2d_backward_input(g, &w.read(), geometry)?;
            sink.add(x, dx)?;
        }
        if sink.wants(w) {
            let x_val = x.read();
            sink.accumulate_with(w, |slot| match slot {
                GradWrite::Add(d) => {
                    Storage::conv2d_backward_weight(d, &x_val, g, geometry, true).map(|_| None)
                }
                GradWrite::Overwrite(d) => {
                    Storage::conv2d_backward_weight(d, &x_val, g, geometry, false).map(|_| None)
                }
                GradWrite::New => {
                    let mut d = Storage::zeros(w.shape(), w.device())?;
                    Storage::conv2d_backward_weight(&mut d, &x_val, g, geometry, false)?;
                    Ok(Some(d))
                }
            })?;
        }
        if let Some(bias) = inputs.get(2)
            && sink.wants(bias)
        {
            sink.add(bias, Storage::channel_sum(g)?)?;
        }
        Ok(())
    }
}

/// The geometry of `x` convolved with `weight`, or an error naming the op and the shapes.
fn geometry(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    opts: Conv2dOptions,
) -> Result<Conv2dGeometry> {
    let mut tensors = vec![x, weight];
    tensors.extend(bias);
    same_device("conv2d", &tensors)?;
    let (xs, ws) = (x.shape(), weight.shape());
    if xs.len() != 4 {
        return Err(MlError::invalid(
            "conv2d",
            format!("the input {xs:?} is not a [batch, channels, height, width] batch of images"),
        ));
    }
    if ws.len() != 4 {
        return Err(MlError::invalid(
            "conv2d",
            format!(
                "the weight {ws:?} is not [out_channels, in_channels / groups, kernel height, \
                 kernel width]"
            ),
        ));
    }
    let groups = opts.groups;
    if groups == 0 {
        return Err(MlError::invalid(
            "conv2d",
            "the number of groups must be at least 1",
        ));
    }
    if Some(xs[1]) != ws[1].checked_mul(groups) {
        return Err(MlError::invalid(
            "conv2d",
            format!(
                "input {xs:?} has {} channels but the weight {ws:?} expects {} (groups {groups})",
                xs[1],
                ws[1].saturating_mul(groups)
            ),
        ));
    }
    if let Some(b) = bias
        && b.shape() != [ws[0]]
    {
        return Err(MlError::invalid(
            "conv2d",
            format!(
                "the bias {:?} does not have one value per output channel of the weight {ws:?}",
                b.shape()
            ),
        ));
    }
    let g = Conv2dGeometry {
        batch: xs[0],
        in_channels: xs[1],
        in_size: [xs[2], xs[3]],
        out_channels: ws[0],
        kernel: [ws[2], ws[3]],
        stride: opts.stride,
        padding: opts.padding,
        dilation: opts.dilation,
        groups,
    };
    g.check("conv2d")?;
    Ok(g)
}

impl Tensor {
    /// The 2-D convolution (PyTorch's `conv2d`, a cross-correlation) of `self`, a batch of images
    /// `[n, C, H, W]`, with `weight` `[O, C / groups, kh, kw]` and an optional `bias` `[O]`:
    /// `[n, O, oh, ow]` with `oh = (H + 2·padding − dilation·(kh − 1) − 1) / stride + 1` (and so
    /// for `ow`).
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv2dOptions,
    ) -> Result<Tensor> {
        let g = geometry(self, weight, bias, opts)?;
        let b_val = bias.map(Tensor::read);
        let out = Storage::conv2d(&self.read(), &weight.read(), b_val.as_deref(), &g)?;
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        Ok(Tensor::from_op(out, &inputs, Conv2dBackward(g)))
    }
}
