//! From planned layers to modules and a summary.

use crate::error::Result;
use crate::nn::layers::{
    Activation, ActivationKind, AvgPool2d, BatchNorm, Bidirectional, Conv2d, Dropout, Embedding,
    Flatten, GlobalAvgPool2d, Gru, LayerNorm, Linear, Lstm, MaxPool2d, MultiHeadAttention,
    PositionEmbedding, Residual, SequencePool, Sequential, TransformerEncoder,
};
use crate::nn::sequential::planned::{PlannedLayer, RecurrentCell, Resolved};
use crate::nn::{ModelSummary, Module, ParamBuilder, SummaryRow};

/// The modules of `layers`, their parameters created through `b` (a builder at the scope of
/// the list's owner) under each layer's local name.
pub fn build_list(layers: &[PlannedLayer], b: &mut ParamBuilder<'_>) -> Result<Sequential> {
    let mut net = Sequential::new();
    let mut at = 0;
    while at < layers.len() {
        if let [relu, pool, ..] = &layers[at..]
            && pools_after_relu(relu, pool)
        {
            net.push_boxed(build_layer(pool, b)?);
            net.push_boxed(build_layer(relu, b)?);
            at += 2;
            continue;
        }
        net.push_boxed(build_layer(&layers[at], b)?);
        at += 1;
    }
    Ok(net)
}

/// Whether `first` is a ReLU and `second` a max pooling, which are built the other way round:
/// `max(relu(x)) = relu(max(x))`, and the gradient is the same too (it goes to the window's
/// first maximum when that is positive, and is zero otherwise), but pooling first leaves the
/// ReLU, forward and backward, a quarter of the cells (with 2 × 2 windows). Neither has
/// parameters, so nothing else changes.
fn pools_after_relu(first: &PlannedLayer, second: &PlannedLayer) -> bool {
    matches!(first.layer, Resolved::Activation(ActivationKind::Relu))
        && matches!(second.layer, Resolved::MaxPool2d(_))
}

fn build_layer(layer: &PlannedLayer, b: &mut ParamBuilder<'_>) -> Result<Box<dyn Module>> {
    let mut b = b.sub(&layer.local);
    Ok(match &layer.layer {
        Resolved::Conv2d(config) => Box::new(Conv2d::new(&mut b, config)?),
        Resolved::BatchNorm {
            channels,
            eps,
            momentum,
        } => Box::new(BatchNorm::new(&mut b, *channels, *eps, *momentum)?),
        Resolved::Activation(kind) => Box::new(Activation(*kind)),
        Resolved::MaxPool2d(opts) => Box::new(MaxPool2d(*opts)),
        Resolved::AvgPool2d(opts) => Box::new(AvgPool2d(*opts)),
        Resolved::GlobalAvgPool2d => Box::new(GlobalAvgPool2d),
        Resolved::Flatten => Box::new(Flatten),
        Resolved::Linear {
            inputs,
            outputs,
            bias,
            init,
            activation,
        } => Box::new(Linear::with_bias(
            &mut b,
            *inputs,
            *outputs,
            *init,
            *activation,
            *bias,
        )?),
        Resolved::Dropout(p) => Box::new(Dropout { p: *p }),
        Resolved::LayerNorm { dim, eps } => Box::new(LayerNorm::new(&mut b, *dim, *eps)?),
        Resolved::Embedding { vocab, dim } => Box::new(Embedding::new(&mut b, *vocab, *dim)?),
        Resolved::Recurrent {
            cell,
            inputs,
            hidden,
            layers,
            bidirectional,
            dropout,
        } => {
            let stack = RecurrentStack {
                cell: *cell,
                hidden: *hidden,
                bidirectional: *bidirectional,
            };
            Box::new(stack.build(&mut b, *inputs, *layers, *dropout)?)
        }
        Resolved::SequencePool(kind) => Box::new(SequencePool { kind: *kind }),
        Resolved::MultiHeadAttention {
            dim,
            heads,
            dropout,
        } => Box::new(MultiHeadAttention::new(&mut b, *dim, *heads, *dropout)?),
        Resolved::TransformerEncoder {
            dim,
            heads,
            ff,
            dropout,
            activation,
        } => {
            let mut block = TransformerEncoder::new(&mut b, *dim, *heads, *ff, *dropout)?;
            block.activation = *activation;
            Box::new(block)
        }
        Resolved::PositionEmbedding {
            kind,
            max_length,
            dim,
        } => Box::new(PositionEmbedding::new(&mut b, *kind, *max_length, *dim)?),
        Resolved::Residual { body, shortcut } => {
            let body = Box::new(build_list(body, &mut b)?);
            let shortcut = match shortcut {
                Some(s) => Some(Box::new(build_list(s, &mut b)?) as Box<dyn Module>),
                None => None,
            };
            Box::new(Residual { body, shortcut })
        }
    })
}

/// The layers of one `lstm` or `gru` entry: each of a stack reads the previous one's outputs.
struct RecurrentStack {
    cell: RecurrentCell,
    hidden: usize,
    bidirectional: bool,
}

impl RecurrentStack {
    /// `layers` layers (with dropout between them), parameters named `<i>.w_input`, … (and
    /// `<i>.forward.…`, `<i>.backward.…` when bidirectional).
    fn build(
        &self,
        b: &mut ParamBuilder<'_>,
        inputs: usize,
        layers: usize,
        dropout: f32,
    ) -> Result<Sequential> {
        let mut stack = Sequential::new();
        let directions = if self.bidirectional { 2 } else { 1 };
        for i in 0..layers {
            if i > 0 && dropout > 0.0 {
                stack.push_boxed(Box::new(Dropout { p: dropout }));
            }
            let width = if i == 0 {
                inputs
            } else {
                directions * self.hidden
            };
            let mut b = b.sub(i.to_string());
            stack.push_boxed(self.layer(&mut b, width)?);
        }
        Ok(stack)
    }

    fn layer(&self, b: &mut ParamBuilder<'_>, inputs: usize) -> Result<Box<dyn Module>> {
        let hidden = self.hidden;
        Ok(match (self.cell, self.bidirectional) {
            (RecurrentCell::Lstm, false) => Box::new(Lstm::new(b, inputs, hidden)?),
            (RecurrentCell::Gru, false) => Box::new(Gru::new(b, inputs, hidden)?),
            (RecurrentCell::Lstm, true) => Box::new(Bidirectional {
                forward: Lstm::new(&mut b.sub("forward"), inputs, hidden)?,
                backward: Lstm::new(&mut b.sub("backward"), inputs, hidden)?,
            }),
            (RecurrentCell::Gru, true) => Box::new(Bidirectional {
                forward: Gru::new(&mut b.sub("forward"), inputs, hidden)?,
                backward: Gru::new(&mut b.sub("backward"), inputs, hidden)?,
            }),
        })
    }
}

/// The summary rows of `layers` at nesting `depth`, depth first.
fn rows(layers: &[PlannedLayer], depth: usize, out: &mut Vec<SummaryRow>) {
    for layer in layers {
        out.push(SummaryRow {
            name: layer.name.clone(),
            kind: layer.kind.to_string(),
            output: Some(layer.output.clone()),
            params: layer.params.saturating_add(layer.buffers),
            depth,
        });
        if let Resolved::Residual { body, shortcut } = &layer.layer {
            rows(body, depth + 1, out);
            if let Some(s) = shortcut {
                rows(s, depth + 1, out);
            }
        }
    }
}

/// The summary of a model with this input and these layers.
pub fn summary(input: &[usize], layers: &[PlannedLayer]) -> ModelSummary {
    let mut out = vec![SummaryRow {
        name: "input".into(),
        kind: String::new(),
        output: Some(input.to_vec()),
        params: 0,
        depth: 0,
    }];
    rows(layers, 0, &mut out);
    let (trainable, non_trainable) = layers.iter().fold((0u64, 0u64), |(p, b), l| {
        (p.saturating_add(l.params), b.saturating_add(l.buffers))
    });
    ModelSummary {
        rows: out,
        trainable,
        non_trainable,
    }
}
