//! Taggers of token sequences in ONNX: `tokens` (`[batch, length]` int64 ids, the vocabulary's
//! in the sidecar; padding any id) and `lengths` (`[batch]` int64, each row's real tokens) in,
//! one output per token out (`[batch, length, classes]`). The recurrent layers are ONNX's
//! `LSTM` and `GRU` with `sequence_lens`, so padding changes no real token's output, as in
//! ringflow: the backward direction of a bidirectional layer starts at each row's last real
//! token.
//!
//! Lowered: `embedding`, `lstm` and `gru` (stacked, bidirectional), and the per-token layers
//! `linear`, the activations, `dropout` (the identity) and `layer_norm`. Other layers (the
//! attention layers, positions, `sequence_pool`) are refused by name.

use ringflow_ml::nn::SequentialSpec;
use ringflow_ml::nn::sequential::{PlannedLayer, RecurrentCell, Resolved};

use super::graph::{Attr, Graph};
use super::ops::{activation, linear, parameter};
use crate::error::ExportError;
use crate::saved::SavedModelDir;

/// The graph input of the token ids.
pub const TOKENS: &str = "tokens";
/// The graph input of each row's real tokens.
pub const LENGTHS: &str = "lengths";

/// The tagger of `saved` on the graph inputs [`TOKENS`] and [`LENGTHS`]: its output,
/// `[batch, length, classes]`.
pub fn lower(g: &mut Graph, saved: &SavedModelDir) -> Result<String, ExportError> {
    let load = |source| ExportError::Load {
        dir: saved.dir.display().to_string(),
        source,
    };
    let spec = SequentialSpec::from_spec(&saved.saved.spec.model).map_err(load)?;
    let plan = spec.plan().map_err(load)?;
    let lengths = g.op("Cast", &[LENGTHS], vec![Attr::Int("to", INT32)]);
    let mut h = TOKENS.to_string();
    for l in &plan.layers {
        h = layer(g, saved, (&h, &lengths), l)?;
    }
    Ok(h)
}

/// ONNX's code of int32, which `sequence_lens` takes.
const INT32: i64 = 6;

/// One layer on `x` (`[batch, length, …]`), with the rows' `lengths` (int32).
fn layer(
    g: &mut Graph,
    saved: &SavedModelDir,
    (x, lengths): (&str, &str),
    l: &PlannedLayer,
) -> Result<String, ExportError> {
    let what = format!("{} ({})", l.name, l.kind);
    Ok(match &l.layer {
        Resolved::Embedding { .. } => {
            let table = parameter(g, saved, &format!("{}.weight", l.name), &what)?;
            g.op("Gather", &[&table, x], vec![Attr::Int("axis", 0)])
        }
        Resolved::Recurrent {
            cell,
            hidden,
            layers,
            bidirectional,
            ..
        } => {
            let shape = Recurrent {
                cell: *cell,
                hidden: *hidden,
                bidirectional: *bidirectional,
            };
            let mut h = g.op("Transpose", &[x], vec![Attr::Ints("perm", vec![1, 0, 2])]);
            for i in 0..*layers {
                h = shape.layer(g, saved, (&h, lengths), &format!("{}.{i}", l.name))?;
            }
            g.op("Transpose", &[&h], vec![Attr::Ints("perm", vec![1, 0, 2])])
        }
        Resolved::Linear { .. } => linear(g, saved, x, &l.name)?,
        Resolved::Activation(kind) => activation(g, x, *kind),
        Resolved::Dropout(_) => x.to_string(),
        Resolved::LayerNorm { eps, .. } => {
            let w = parameter(g, saved, &format!("{}.weight", l.name), &what)?;
            let b = parameter(g, saved, &format!("{}.bias", l.name), &what)?;
            let attrs = vec![Attr::Int("axis", -1), Attr::Float("epsilon", *eps)];
            g.op("LayerNormalization", &[x, &w, &b], attrs)
        }
        _ => return Err(ExportError::sequence_layer("ONNX", &l.path, l.kind)),
    })
}

/// What every layer of a recurrent stack shares.
struct Recurrent {
    cell: RecurrentCell,
    hidden: usize,
    bidirectional: bool,
}

impl Recurrent {
    /// Gates per cell, and where each of ONNX's gates is among ringflow's (PyTorch's order:
    /// LSTM input, forget, cell, output; GRU reset, update, new) in ONNX's order (LSTM input,
    /// output, forget, cell; GRU update, reset, hidden).
    fn gates(&self) -> &'static [usize] {
        match self.cell {
            RecurrentCell::Lstm => &[0, 3, 1, 2],
            RecurrentCell::Gru => &[1, 0, 2],
        }
    }

    /// One layer of the stack, parameters under `prefix`, on `x` (`[length, batch, in]`):
    /// `[length, batch, directions · hidden]`.
    fn layer(
        &self,
        g: &mut Graph,
        saved: &SavedModelDir,
        (x, lengths): (&str, &str),
        prefix: &str,
    ) -> Result<String, ExportError> {
        let directions: &[&str] = match self.bidirectional {
            true => &["forward.", "backward."],
            false => &[""],
        };
        let (mut w, mut r, mut b) = (Vec::new(), Vec::new(), Vec::new());
        let mut inputs = 0;
        for d in directions {
            let name = |what: &str| format!("{prefix}.{d}{what}");
            let layer = format!("{prefix} ({})", self.kind());
            let (shape, w_input) = saved.tensor(&name("w_input"), &layer)?;
            inputs = shape[0];
            let (_, w_hidden) = saved.tensor(&name("w_hidden"), &layer)?;
            w.extend(self.rows(&w_input, inputs));
            r.extend(self.rows(&w_hidden, self.hidden));
            let (wb, rb) = match self.cell {
                RecurrentCell::Lstm => {
                    let (_, bias) = saved.tensor(&name("bias"), &layer)?;
                    (bias, vec![0.0; 4 * self.hidden])
                }
                RecurrentCell::Gru => (
                    saved.tensor(&name("bias_input"), &layer)?.1,
                    saved.tensor(&name("bias_hidden"), &layer)?.1,
                ),
            };
            b.extend(self.reordered(&wb));
            b.extend(self.reordered(&rb));
        }
        let (nd, gh) = (directions.len(), self.gates().len() * self.hidden);
        let w = g.constant(&format!("{prefix}.W"), &[nd, gh, inputs], &w);
        let r = g.constant(&format!("{prefix}.R"), &[nd, gh, self.hidden], &r);
        let b = g.constant(&format!("{prefix}.B"), &[nd, 2 * gh], &b);
        let mut attrs = vec![Attr::Int("hidden_size", self.hidden as i64)];
        if self.cell == RecurrentCell::Gru {
            attrs.push(Attr::Int("linear_before_reset", 1));
        }
        if self.bidirectional {
            attrs.push(Attr::Str("direction", "bidirectional"));
        }
        let op = match self.cell {
            RecurrentCell::Lstm => "LSTM",
            RecurrentCell::Gru => "GRU",
        };
        let y = g.op(op, &[x, &w, &r, &b, lengths], attrs);
        // [length, directions, batch, hidden] → [length, batch, directions · hidden]: the
        // forward direction's units first, as ringflow's.
        let y = g.op(
            "Transpose",
            &[&y],
            vec![Attr::Ints("perm", vec![0, 2, 1, 3])],
        );
        let shape = g.int64s("shape", &[0, 0, -1]);
        Ok(g.op("Reshape", &[&y, &shape], Vec::new()))
    }

    fn kind(&self) -> &'static str {
        match self.cell {
            RecurrentCell::Lstm => "lstm",
            RecurrentCell::Gru => "gru",
        }
    }

    /// A ringflow weight `[rows, gates · hidden]` as ONNX's `[gates · hidden, rows]`, its gate
    /// blocks in ONNX's order.
    fn rows(&self, weight: &[f32], rows: usize) -> Vec<f32> {
        let cols = self.gates().len() * self.hidden;
        let mut out = Vec::with_capacity(weight.len());
        for &gate in self.gates() {
            for unit in 0..self.hidden {
                let col = gate * self.hidden + unit;
                out.extend((0..rows).map(|row| weight[row * cols + col]));
            }
        }
        out
    }

    /// A bias `[gates · hidden]` with its gate blocks in ONNX's order.
    fn reordered(&self, bias: &[f32]) -> Vec<f32> {
        let h = self.hidden;
        self.gates()
            .iter()
            .flat_map(|&gate| bias[gate * h..(gate + 1) * h].iter().copied())
            .collect()
    }
}
