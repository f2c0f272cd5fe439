//! [`Conv2d`]: a 2-D convolution layer over `[n, C, H, W]` images.

use crate::error::{MlError, Result};
use crate::nn::{ActivationKind, Forward, Init, Module, ParamBuilder};
use crate::ops::Conv2dOptions;
use crate::tensor::Tensor;

/// What a [`Conv2d`] layer is: its channels, kernel and options, as `torch.nn.Conv2d` takes
/// them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dConfig {
    /// Channels of the input.
    pub in_channels: usize,
    /// Channels of the output (filters).
    pub out_channels: usize,
    /// `[height, width]` of the kernel.
    pub kernel: [usize; 2],
    /// Stride, zero padding, dilation and groups.
    pub options: Conv2dOptions,
    /// Whether the layer adds a learned bias per output channel (a convolution followed by a
    /// batch norm needs none).
    pub bias: bool,
    /// How the weights are initialized.
    pub init: Init,
    /// The nonlinearity that follows the layer, which `Init::Auto` initializes for.
    pub activation: Option<ActivationKind>,
}

impl Conv2dConfig {
    /// A `kernel × kernel` convolution from `in_channels` to `out_channels` with PyTorch's
    /// defaults (stride 1, no padding, a bias) and He/Glorot initialization chosen by
    /// `activation`.
    pub fn new(in_channels: usize, out_channels: usize, kernel: usize) -> Conv2dConfig {
        Conv2dConfig {
            in_channels,
            out_channels,
            kernel: [kernel, kernel],
            options: Conv2dOptions::default(),
            bias: true,
            init: Init::Auto,
            activation: Some(ActivationKind::Relu),
        }
    }

    /// Checks that the channels, kernel and groups make a convolution.
    fn check(&self) -> Result<()> {
        let o = &self.options;
        let sizes = [self.in_channels, self.out_channels, o.groups];
        if sizes.contains(&0) || self.kernel.contains(&0) {
            return Err(MlError::spec(format!(
                "a conv2d layer needs at least one channel in and out, a kernel of at least 1×1 \
                 and at least one group, not {} → {} channels, kernel {:?}, groups {}",
                self.in_channels, self.out_channels, self.kernel, o.groups
            )));
        }
        if o.stride.contains(&0) || o.dilation.contains(&0) {
            return Err(MlError::spec(format!(
                "a conv2d layer needs a stride and dilation of at least 1, not stride {:?}, \
                 dilation {:?}",
                o.stride, o.dilation
            )));
        }
        if !self.in_channels.is_multiple_of(o.groups) || !self.out_channels.is_multiple_of(o.groups)
        {
            return Err(MlError::spec(format!(
                "conv2d groups = {} must divide both the input channels ({}) and the output \
                 channels ({})",
                o.groups, self.in_channels, self.out_channels
            )));
        }
        Ok(())
    }

    /// The weight's shape, `[out_channels, in_channels / groups, kh, kw]` (PyTorch's).
    pub fn weight_shape(&self) -> [usize; 4] {
        [
            self.out_channels,
            self.in_channels / self.options.groups.max(1),
            self.kernel[0],
            self.kernel[1],
        ]
    }
}

/// A 2-D convolution `y = conv(x, W) + b` of `[n, C, H, W]` inputs, weights `[O, C / groups,
/// kh, kw]` and an optional bias `[O]`.
pub struct Conv2d {
    /// `[out_channels, in_channels / groups, kh, kw]`
    pub weight: Tensor,
    /// `[out_channels]`, or `None` for a layer without bias.
    pub bias: Option<Tensor>,
    /// Stride, padding, dilation and groups.
    pub options: Conv2dOptions,
}

impl Conv2d {
    /// A layer with weights drawn uniformly by `config.init` (fan-in `C / groups · kh · kw`,
    /// fan-out `O · kh · kw`, as PyTorch counts them) and a zero bias.
    pub fn new(b: &mut ParamBuilder<'_>, config: &Conv2dConfig) -> Result<Conv2d> {
        config.check()?;
        let shape = config.weight_shape();
        let receptive = shape[2] * shape[3];
        let fan_in = shape[1] * receptive;
        let fan_out = shape[0] * receptive;
        let relu_like = config.activation.is_some_and(ActivationKind::is_relu_like);
        let bound = config.init.bound(fan_in, fan_out, relu_like);
        let weight = b.uniform("weight", &shape, bound)?;
        let bias = if config.bias {
            Some(b.constant("bias", &[config.out_channels], 0.0)?)
        } else {
            None
        };
        Ok(Conv2d {
            weight,
            bias,
            options: config.options,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        x.conv2d(&self.weight, self.bias.as_ref(), self.options)
    }
}
