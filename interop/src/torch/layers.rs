//! Each layer of a fixed-shape model as a PyTorch module constructor, with its tensors added
//! to the state_dict under the name the module gives them (ringflow's own names: the
//! generated model keeps its layers in `layers`, a block's in `layers` and `shortcut`).

use ringflow_ml::Pool2dOptions;
use ringflow_ml::nn::ActivationKind;
use ringflow_ml::nn::sequential::{PlannedLayer, RecurrentCell, Resolved};

use super::state::StateDict;
use crate::error::ExportError;
use crate::saved::SavedModelDir;

/// The module of one planned layer (`nn.Conv2d(…)`), its tensors added to `state`.
pub fn module(
    saved: &SavedModelDir,
    l: &PlannedLayer,
    state: &mut StateDict,
) -> Result<String, ExportError> {
    let layer = format!("{} ({})", l.name, l.kind);
    let name = |what: &str| format!("{}.{what}", l.name);
    Ok(match &l.layer {
        Resolved::Conv2d(c) => {
            let o = &c.options;
            state.copy(saved, &name("weight"), &layer)?;
            if c.bias {
                state.copy(saved, &name("bias"), &layer)?;
            }
            format!(
                "nn.Conv2d({}, {}, {}, stride={}, padding={}, dilation={}, groups={}, bias={})",
                c.in_channels,
                c.out_channels,
                pair(c.kernel),
                pair(o.stride),
                pair(o.padding),
                pair(o.dilation),
                o.groups,
                py_bool(c.bias)
            )
        }
        Resolved::BatchNorm {
            channels,
            eps,
            momentum,
        } => {
            for what in ["weight", "bias", "running_mean", "running_var"] {
                state.copy(saved, &name(what), &layer)?;
            }
            // PyTorch counts the batches it trained on; ringflow's steps are those batches.
            state.i64_scalar(&name("num_batches_tracked"), saved.meta.step as i64);
            let dims = if l.output.len() == 3 { "2d" } else { "1d" };
            format!("nn.BatchNorm{dims}({channels}, eps={eps:?}, momentum={momentum:?})")
        }
        Resolved::Activation(kind) => activation(*kind).to_string(),
        Resolved::MaxPool2d(p) => format!("nn.MaxPool2d({})", pool(p)),
        Resolved::AvgPool2d(p) => {
            format!("nn.AvgPool2d({}, count_include_pad=False)", pool(p))
        }
        Resolved::GlobalAvgPool2d => "GlobalAvgPool2d()".into(),
        Resolved::Flatten => "nn.Flatten()".into(),
        Resolved::Linear {
            inputs,
            outputs,
            bias,
            ..
        } => {
            state.transposed(saved, &name("weight"), &layer)?;
            if *bias {
                state.copy(saved, &name("bias"), &layer)?;
            }
            format!("nn.Linear({inputs}, {outputs}, bias={})", py_bool(*bias))
        }
        Resolved::Dropout(p) => format!("nn.Dropout({p:?})"),
        Resolved::LayerNorm { dim, eps } => {
            state.copy(saved, &name("weight"), &layer)?;
            state.copy(saved, &name("bias"), &layer)?;
            format!("nn.LayerNorm({dim}, eps={eps:?})")
        }
        Resolved::Residual { body, shortcut } => {
            let body = modules(saved, body, state)?;
            let shortcut = match shortcut {
                Some(s) => format!("[{}]", modules(saved, s, state)?.join(", ")),
                None => "None".into(),
            };
            format!("Residual([{}], {shortcut})", body.join(", "))
        }
        Resolved::Embedding { vocab, dim } => {
            state.copy(saved, &name("weight"), &layer)?;
            format!("nn.Embedding({vocab}, {dim})")
        }
        Resolved::Recurrent {
            cell,
            inputs,
            hidden,
            layers,
            bidirectional,
            dropout,
        } => {
            recurrent_state(saved, l, (*cell, *layers, *bidirectional), state)?;
            let class = match cell {
                RecurrentCell::Lstm => "PackedLSTM",
                RecurrentCell::Gru => "PackedGRU",
            };
            format!(
                "{class}({inputs}, {hidden}, num_layers={layers}, bidirectional={}, \
                 dropout={dropout:?}, batch_first=True)",
                py_bool(*bidirectional)
            )
        }
        _ => return Err(ExportError::sequence_layer("PyTorch", &l.path, l.kind)),
    })
}

/// The tensors of a recurrent stack under PyTorch's names: `weight_ih_l{k}` (`[gates·H,
/// in]`), `weight_hh_l{k}`, `bias_ih_l{k}` and `bias_hh_l{k}`, `_reverse` for the backward
/// direction. The gates are in PyTorch's order already; an LSTM's one bias goes to
/// `bias_ih`, with a zero `bias_hh`.
fn recurrent_state(
    saved: &SavedModelDir,
    l: &PlannedLayer,
    (cell, layers, bidirectional): (RecurrentCell, usize, bool),
    state: &mut StateDict,
) -> Result<(), ExportError> {
    let what = format!("{} ({})", l.name, l.kind);
    let directions: &[(&str, &str)] = match bidirectional {
        true => &[("forward.", ""), ("backward.", "_reverse")],
        false => &[("", "")],
    };
    for k in 0..layers {
        for (dir, suffix) in directions {
            let ours = |what: &str| format!("{}.{k}.{dir}{what}", l.name);
            let theirs = |what: &str| format!("{}.{what}_l{k}{suffix}", l.name);
            state.transposed_as(saved, &ours("w_input"), &theirs("weight_ih"), &what)?;
            state.transposed_as(saved, &ours("w_hidden"), &theirs("weight_hh"), &what)?;
            match cell {
                RecurrentCell::Lstm => {
                    let (shape, bias) = saved.tensor(&ours("bias"), &what)?;
                    state.f32(&theirs("bias_ih"), shape.clone(), &bias);
                    state.f32(&theirs("bias_hh"), shape, &vec![0.0; bias.len()]);
                }
                RecurrentCell::Gru => {
                    state.copy_as(saved, &ours("bias_input"), &theirs("bias_ih"), &what)?;
                    state.copy_as(saved, &ours("bias_hidden"), &theirs("bias_hh"), &what)?;
                }
            }
        }
    }
    Ok(())
}

/// The modules of `layers`, in order.
pub fn modules(
    saved: &SavedModelDir,
    layers: &[PlannedLayer],
    state: &mut StateDict,
) -> Result<Vec<String>, ExportError> {
    layers.iter().map(|l| module(saved, l, state)).collect()
}

/// The module of an activation; each GELU as what it is.
pub fn activation(kind: ActivationKind) -> &'static str {
    match kind {
        ActivationKind::Relu => "nn.ReLU()",
        ActivationKind::Tanh => "nn.Tanh()",
        ActivationKind::Sigmoid => "nn.Sigmoid()",
        ActivationKind::Gelu => "nn.GELU(approximate=\"tanh\")",
        ActivationKind::GeluExact => "nn.GELU()",
    }
}

fn pool(p: &Pool2dOptions) -> String {
    let stride = p.stride.unwrap_or(p.kernel);
    format!(
        "{}, stride={}, padding={}",
        pair(p.kernel),
        pair(stride),
        pair(p.padding)
    )
}

fn pair([a, b]: [usize; 2]) -> String {
    format!("({a}, {b})")
}

fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}
