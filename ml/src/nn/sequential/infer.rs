//! Shape inference: each layer of a sequential spec resolved against the shape it receives,
//! from `model.input` to the output, before anything is allocated. A layer that cannot take
//! its input is one error naming it by path and type with both shapes.

use crate::error::Result;
use crate::nn::ActivationKind;
use crate::nn::layers::Conv2dConfig;
use crate::nn::sequential::planned::{
    At, PlannedLayer, RecurrentCell, Resolved, batch_shape, check_sizes,
};
use crate::nn::sequential::sequence;
use crate::nn::sequential::spec::{
    Conv2dSpec, LayerSpec, LinearSpec, Padding, PoolSpec, ResidualSpec,
};
use crate::ops::{Conv2dOptions, Pool2dOptions};

/// The most cells a max-pooled plane may have (its argmax is stored exactly as f32).
const MAX_POOL_PLANE: usize = 1 << 24;

/// Where a list of layers sits in the spec and what follows it.
#[derive(Clone, Copy)]
pub struct ListAt<'a> {
    /// Its path in the spec: `model.layers`.
    pub path: &'a str,
    /// Its parameters' name prefix: `layers`, `layers.4.layers`.
    pub name: &'a str,
    /// That prefix within the list's owner: `layers`.
    pub local: &'a str,
    /// The activation that follows the list's output (for `init = "auto"`).
    pub after: Option<ActivationKind>,
    /// For the model's own list: `model.classes`, the outputs of a last linear without `out`.
    pub classes: Option<Option<usize>>,
    /// Whether the examples are sequences (their first axis is time): a linear layer then maps
    /// the last axis of `[T, features]`.
    pub sequence: bool,
}

/// Resolves a list of layers against `input`; returns them and the list's output shape.
pub fn infer_list(
    list: ListAt<'_>,
    specs: &[LayerSpec],
    input: &[usize],
) -> Result<(Vec<PlannedLayer>, Vec<usize>)> {
    let mut shape = input.to_vec();
    let mut out = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let last = i + 1 == specs.len();
        let at = At {
            path: format!("{}[{i}]", list.path),
            name: format!("{}.{i}", list.name),
            local: format!("{}.{i}", list.local),
            kind: spec.type_name(),
            follows: following_activation(&specs[i + 1..], list.after),
            classes: list.classes.filter(|_| last),
            sequence: list.sequence,
            input: &shape,
        };
        let layer = infer_layer(&at, spec)?;
        shape = layer.output.clone();
        out.push(layer);
    }
    Ok((out, shape))
}

/// The activation a layer feeds, looking past shape-preserving layers (normalization,
/// pooling, dropout, flatten); `after` when the list ends first.
fn following_activation(
    rest: &[LayerSpec],
    after: Option<ActivationKind>,
) -> Option<ActivationKind> {
    for spec in rest {
        match spec {
            LayerSpec::Relu => return Some(ActivationKind::Relu),
            LayerSpec::Gelu => return Some(ActivationKind::Gelu),
            LayerSpec::GeluExact => return Some(ActivationKind::GeluExact),
            LayerSpec::Tanh => return Some(ActivationKind::Tanh),
            LayerSpec::Sigmoid => return Some(ActivationKind::Sigmoid),
            LayerSpec::BatchNorm(_)
            | LayerSpec::MaxPool2d(_)
            | LayerSpec::AvgPool2d(_)
            | LayerSpec::GlobalAvgPool2d
            | LayerSpec::Flatten
            | LayerSpec::Dropout(_)
            | LayerSpec::LayerNorm(_) => {}
            _ => return None,
        }
    }
    after
}

fn infer_layer(at: &At<'_>, spec: &LayerSpec) -> Result<PlannedLayer> {
    let input = at.input;
    match spec {
        LayerSpec::Conv2d(c) => conv2d(at, c),
        LayerSpec::BatchNorm(b) => {
            if !(input.len() == 1 || input.len() == 3) {
                return Err(at.error(format!(
                    "needs an input of [n, channels] or [n, channels, height, width] but gets {}",
                    batch_shape(input)
                )));
            }
            if !(b.eps > 0.0 && b.eps.is_finite() && (0.0..=1.0).contains(&b.momentum)) {
                return Err(at.error(format!(
                    "needs eps > 0 and momentum in [0, 1], not eps = {}, momentum = {}",
                    b.eps, b.momentum
                )));
            }
            let channels = input[0];
            let layer = Resolved::BatchNorm {
                channels,
                eps: b.eps,
                momentum: b.momentum,
            };
            let mut planned = at.planned(input.to_vec(), 2 * channels as u64, layer)?;
            planned.buffers = 2 * channels as u64;
            Ok(planned)
        }
        LayerSpec::Relu => activation(at, ActivationKind::Relu),
        LayerSpec::Gelu => activation(at, ActivationKind::Gelu),
        LayerSpec::GeluExact => activation(at, ActivationKind::GeluExact),
        LayerSpec::Tanh => activation(at, ActivationKind::Tanh),
        LayerSpec::Sigmoid => activation(at, ActivationKind::Sigmoid),
        LayerSpec::MaxPool2d(p) => {
            let (opts, output) = pool(at, p)?;
            if input[1].saturating_mul(input[2]) > MAX_POOL_PLANE {
                return Err(at.error(format!(
                    "gets planes of {}×{} cells, more than the 2^24 max pooling handles",
                    input[1], input[2]
                )));
            }
            at.planned(output, 0, Resolved::MaxPool2d(opts))
        }
        LayerSpec::AvgPool2d(p) => {
            let (opts, output) = pool(at, p)?;
            at.planned(output, 0, Resolved::AvgPool2d(opts))
        }
        LayerSpec::GlobalAvgPool2d => {
            let [c, _, _] = image(at)?;
            at.planned(vec![c], 0, Resolved::GlobalAvgPool2d)
        }
        LayerSpec::Flatten => {
            let n = input.iter().fold(1usize, |a, &d| a.saturating_mul(d));
            at.planned(vec![n], 0, Resolved::Flatten)
        }
        LayerSpec::Linear(l) => linear(at, l),
        LayerSpec::Dropout(d) => {
            if !(0.0..1.0).contains(&d.p) {
                return Err(at.error(format!("has p = {}, outside [0, 1)", d.p)));
            }
            at.planned(input.to_vec(), 0, Resolved::Dropout(d.p))
        }
        LayerSpec::LayerNorm(l) => {
            let dim = *input.last().unwrap_or(&0);
            if !(l.eps > 0.0 && l.eps.is_finite()) {
                return Err(at.error(format!("needs eps > 0, not {}", l.eps)));
            }
            let layer = Resolved::LayerNorm { dim, eps: l.eps };
            at.planned(input.to_vec(), 2 * dim as u64, layer)
        }
        LayerSpec::Embedding(e) => {
            let vocab = e.vocab.ok_or_else(|| {
                at.error(
                    "has no `vocab`: give the number of ids (the driver sets it from the \
                     vocabulary of a column of string tokens)",
                )
            })?;
            check_sizes(at, &[("vocab", vocab), ("dim", e.dim)], 1)?;
            let mut output = input.to_vec();
            output.push(e.dim);
            let params = (vocab as u64).saturating_mul(e.dim as u64);
            let layer = Resolved::Embedding { vocab, dim: e.dim };
            at.planned(output, params, layer)
        }
        LayerSpec::Lstm(r) => sequence::recurrent(at, RecurrentCell::Lstm, r),
        LayerSpec::Gru(r) => sequence::recurrent(at, RecurrentCell::Gru, r),
        LayerSpec::SequencePool(p) => sequence::pool(at, p),
        LayerSpec::MultiHeadAttention(a) => sequence::attention(at, a),
        LayerSpec::TransformerEncoder(t) => sequence::transformer(at, t),
        LayerSpec::PositionEmbedding(p) => sequence::positions(at, p),
        LayerSpec::Residual(r) => residual(at, r),
    }
}

fn activation(at: &At<'_>, kind: ActivationKind) -> Result<PlannedLayer> {
    at.planned(at.input.to_vec(), 0, Resolved::Activation(kind))
}

/// The input as `[channels, height, width]`, or the error saying the layer needs an image.
fn image(at: &At<'_>) -> Result<[usize; 3]> {
    match at.input {
        &[c, h, w] => Ok([c, h, w]),
        other => Err(at.error(format!(
            "needs an image input [n, channels, height, width] but gets {}; give the examples \
             their shape with data.shape (e.g. [1, 28, 28]) or model.input",
            batch_shape(other)
        ))),
    }
}

/// One output side of a window sliding over `input` cells padded by `pad` on each side:
/// `None` when the window does not fit once.
fn slide(input: usize, pad: usize, window: usize, stride: usize) -> Option<usize> {
    let padded = input + 2 * pad;
    (padded >= window).then(|| (padded - window) / stride + 1)
}

fn conv2d(at: &At<'_>, c: &Conv2dSpec) -> Result<PlannedLayer> {
    let [channels, h, w] = image(at)?;
    let (k, s, d) = (c.kernel.0, c.stride.0, c.dilation.0);
    check_sizes(
        at,
        &[
            ("out_channels", c.out_channels),
            ("kernel", k[0]),
            ("kernel", k[1]),
            ("stride", s[0]),
            ("stride", s[1]),
            ("dilation", d[0]),
            ("dilation", d[1]),
            ("groups", c.groups),
        ],
        1,
    )?;
    let span = [d[0] * (k[0] - 1), d[1] * (k[1] - 1)];
    let padding = match c.padding {
        Padding::Explicit(p) => {
            check_sizes(at, &[("padding", p.0[0]), ("padding", p.0[1])], 0)?;
            p.0
        }
        Padding::Same if s != [1, 1] => {
            return Err(at.error(format!(
                "has padding = \"same\" with stride {s:?}; \"same\" needs stride 1 (as in \
                 PyTorch): give the padding as a number"
            )));
        }
        Padding::Same if span[0] % 2 == 1 || span[1] % 2 == 1 => {
            return Err(at.error(format!(
                "has padding = \"same\" with the even kernel {k:?}; \"same\" needs an odd \
                 kernel (equal padding on both sides): give the padding as a number"
            )));
        }
        Padding::Same => [span[0] / 2, span[1] / 2],
    };
    if !channels.is_multiple_of(c.groups) || !c.out_channels.is_multiple_of(c.groups) {
        return Err(at.error(format!(
            "has groups = {}, which must divide both its input channels ({channels}, of {}) \
             and out_channels ({})",
            c.groups,
            batch_shape(at.input),
            c.out_channels
        )));
    }
    let out = [
        slide(h, padding[0], span[0] + 1, s[0]),
        slide(w, padding[1], span[1] + 1, s[1]),
    ];
    let [Some(oh), Some(ow)] = out else {
        return Err(at.error(format!(
            "gets {}, smaller than its kernel {}×{} (dilation {:?}) with padding {padding:?}: \
             the output would be empty",
            batch_shape(at.input),
            k[0],
            k[1],
            d
        )));
    };
    let config = Conv2dConfig {
        in_channels: channels,
        out_channels: c.out_channels,
        kernel: k,
        options: Conv2dOptions {
            stride: s,
            padding,
            dilation: d,
            groups: c.groups,
        },
        bias: c.bias,
        init: c.init,
        activation: at.follows,
    };
    let weights = config
        .weight_shape()
        .iter()
        .fold(1u64, |a, &x| a.saturating_mul(x as u64));
    let params = weights.saturating_add(if c.bias { c.out_channels as u64 } else { 0 });
    at.planned(
        vec![c.out_channels, oh, ow],
        params,
        Resolved::Conv2d(config),
    )
}

fn pool(at: &At<'_>, p: &PoolSpec) -> Result<(Pool2dOptions, Vec<usize>)> {
    let [c, h, w] = image(at)?;
    let k = p.kernel.0;
    let s = p.stride.map_or(k, |s| s.0);
    let pad = p.padding.0;
    check_sizes(
        at,
        &[
            ("kernel", k[0]),
            ("kernel", k[1]),
            ("stride", s[0]),
            ("stride", s[1]),
        ],
        1,
    )?;
    if pad[0] > k[0] / 2 || pad[1] > k[1] / 2 {
        return Err(at.error(format!(
            "has padding {pad:?}; it must be at most half the kernel {k:?} (as in PyTorch)"
        )));
    }
    let (Some(oh), Some(ow)) = (slide(h, pad[0], k[0], s[0]), slide(w, pad[1], k[1], s[1])) else {
        return Err(at.error(format!(
            "gets {}, smaller than its window {}×{}: the output would be empty",
            batch_shape(at.input),
            k[0],
            k[1]
        )));
    };
    let opts = Pool2dOptions {
        kernel: k,
        stride: Some(s),
        padding: pad,
    };
    Ok((opts, vec![c, oh, ow]))
}

fn linear(at: &At<'_>, l: &LinearSpec) -> Result<PlannedLayer> {
    let (steps, inputs) = match at.input {
        &[f] => (None, f),
        &[t, f] if at.sequence => (Some(t), f),
        other => {
            return Err(at.error(format!(
                "needs a flat [n, features] input but gets {}; add {{ type = \"flatten\" }} \
                 before it",
                batch_shape(other)
            )));
        }
    };
    let outputs = match (l.out, at.classes) {
        (Some(out), _) => out,
        (None, Some(Some(classes))) => classes,
        (None, Some(None)) => {
            return Err(at.error(
                "has no `out` and model.classes is not set: set model.classes to the number of \
                 classes (the driver sets it from data.label_classes or the label column when \
                 it can), or give the layer its `out`",
            ));
        }
        (None, None) => {
            return Err(at.error(
                "has no `out`; only the model's last layer may leave it out (it then has \
                 model.classes outputs)",
            ));
        }
    };
    check_sizes(at, &[("out", outputs)], 1)?;
    let params = (inputs as u64)
        .saturating_mul(outputs as u64)
        .saturating_add(if l.bias { outputs as u64 } else { 0 });
    let layer = Resolved::Linear {
        inputs,
        outputs,
        bias: l.bias,
        init: l.init,
        activation: at.follows,
    };
    let output = steps.into_iter().chain([outputs]).collect();
    at.planned(output, params, layer)
}

fn residual(at: &At<'_>, r: &ResidualSpec) -> Result<PlannedLayer> {
    let list = |path: &str, name: &str, specs: &[LayerSpec]| {
        let list = ListAt {
            path: &format!("{}.{path}", at.path),
            name: &format!("{}.{name}", at.name),
            local: name,
            after: at.follows,
            classes: None,
            sequence: at.sequence,
        };
        infer_list(list, specs, at.input)
    };
    let (body, out) = list("layers", "layers", &r.layers)?;
    let (shortcut, added) = match &r.shortcut {
        Some(s) => {
            let (layers, shape) = list("shortcut", "shortcut", s)?;
            (Some(layers), shape)
        }
        None => (None, at.input.to_vec()),
    };
    if out != added {
        let what = if shortcut.is_some() {
            "its shortcut gives"
        } else {
            "its input is"
        };
        return Err(at.error(format!(
            "adds its layers' output and its input, but its layers give {} and {what} {}; \
             they must have one shape: add (or fix) a shortcut = [...] that maps the input to \
             {} (e.g. a 1×1 conv2d with the same stride)",
            batch_shape(&out),
            batch_shape(&added),
            batch_shape(&out)
        )));
    }
    let children = body.iter().chain(shortcut.iter().flatten());
    let (params, buffers) = children.fold((0u64, 0u64), |(p, b), l| {
        (p.saturating_add(l.params), b.saturating_add(l.buffers))
    });
    let mut planned = at.planned(out, params, Resolved::Residual { body, shortcut })?;
    planned.buffers = buffers;
    Ok(planned)
}
