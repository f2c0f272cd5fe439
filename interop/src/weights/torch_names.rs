//! PyTorch's names of recurrent layers read back in ringflow's: `nn.LSTM`'s and `nn.GRU`'s
//! `<m>.weight_ih_l<k>[_reverse]`, `weight_hh_…`, `bias_ih_…` and `bias_hh_…` become the
//! tensors of ringflow's stack `<m>`: `<m>.<k>.[forward.|backward.]w_input` (transposed back to
//! `[in, gates·H]`), `w_hidden`, and an LSTM's one `bias` (`bias_ih + bias_hh`) or a GRU's
//! `bias_input` and `bias_hidden`. A module is an LSTM when its `weight_hh` has four gates per
//! hidden unit, a GRU with three; bidirectional when it has `_reverse` tensors. The gates are in
//! PyTorch's order in both.

use std::collections::BTreeMap;

use ringflow_ml::nn::init::{SourceLayout, SourceTensor, transpose};

/// `tensors` with every recurrent layer's tensors under ringflow's names, in ringflow's layout.
pub fn to_ringflow(mut tensors: BTreeMap<String, SourceTensor>) -> BTreeMap<String, SourceTensor> {
    let layers: Vec<(String, usize, String)> = tensors
        .keys()
        .filter_map(|k| parse(k, "weight_hh"))
        .collect();
    for (module, k, suffix) in layers {
        let bidirectional = tensors.contains_key(&format!("{module}.weight_hh_l0_reverse"));
        let dir = match (bidirectional, suffix.is_empty()) {
            (false, _) => "",
            (true, true) => "forward.",
            (true, false) => "backward.",
        };
        let theirs = |what: &str| format!("{module}.{what}_l{k}{suffix}");
        let ours = |what: &str| format!("{module}.{k}.{dir}{what}");
        let Some(hh) = tensors.get(&theirs("weight_hh")) else {
            continue;
        };
        let [rows, hidden] = hh.shape[..] else {
            continue;
        };
        let lstm = rows == 4 * hidden;
        for (from, to) in [("weight_ih", "w_input"), ("weight_hh", "w_hidden")] {
            if let Some(t) = tensors.remove(&theirs(from)) {
                tensors.insert(ours(to), transposed(t));
            }
        }
        let (ih, hh) = (
            tensors.remove(&theirs("bias_ih")),
            tensors.remove(&theirs("bias_hh")),
        );
        match (lstm, ih, hh) {
            (true, Some(ih), Some(hh)) if ih.shape == hh.shape => {
                let values = ih
                    .values
                    .iter()
                    .zip(&hh.values)
                    .map(|(a, b)| a + b)
                    .collect();
                tensors.insert(
                    ours("bias"),
                    SourceTensor {
                        values,
                        ..ringflow(ih)
                    },
                );
            }
            (false, Some(ih), Some(hh)) => {
                tensors.insert(ours("bias_input"), ringflow(ih));
                tensors.insert(ours("bias_hidden"), ringflow(hh));
            }
            (_, ih, hh) => {
                // Not PyTorch's recurrent layer after all: put them back as they were.
                for (what, t) in [("bias_ih", ih), ("bias_hh", hh)] {
                    if let Some(t) = t {
                        tensors.insert(theirs(what), t);
                    }
                }
            }
        }
    }
    tensors
}

/// `(module, layer, "" or "_reverse")` of a name `<module>.<what>_l<k>[_reverse]`.
fn parse(name: &str, what: &str) -> Option<(String, usize, String)> {
    let (module, last) = name.rsplit_once('.')?;
    let rest = last.strip_prefix(what)?.strip_prefix("_l")?;
    let (k, suffix) = match rest.strip_suffix("_reverse") {
        Some(k) => (k, "_reverse"),
        None => (rest, ""),
    };
    Some((module.to_string(), k.parse().ok()?, suffix.to_string()))
}

/// A `[rows, cols]` tensor as `[cols, rows]`, in ringflow's layout.
fn transposed(t: SourceTensor) -> SourceTensor {
    let [rows, cols] = t.shape[..] else {
        return t;
    };
    SourceTensor {
        shape: vec![cols, rows],
        values: transpose(&t.values, rows, cols),
        layout: SourceLayout::Ringflow,
    }
}

fn ringflow(t: SourceTensor) -> SourceTensor {
    SourceTensor {
        layout: SourceLayout::Ringflow,
        ..t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], start: f32) -> SourceTensor {
        let n = shape.iter().product::<usize>();
        SourceTensor {
            shape: shape.to_vec(),
            values: (0..n).map(|i| start + i as f32).collect(),
            layout: SourceLayout::Torch,
        }
    }

    #[test]
    fn a_bidirectional_lstm_gets_ringflows_names_one_bias_and_its_layout() {
        let mut sd = BTreeMap::new();
        for s in ["", "_reverse"] {
            sd.insert(format!("layers.1.weight_ih_l0{s}"), t(&[8, 3], 0.0));
            sd.insert(format!("layers.1.weight_hh_l0{s}"), t(&[8, 2], 0.0));
            sd.insert(format!("layers.1.bias_ih_l0{s}"), t(&[8], 1.0));
            sd.insert(format!("layers.1.bias_hh_l0{s}"), t(&[8], 10.0));
        }
        sd.insert("layers.0.weight".into(), t(&[5, 3], 0.0));
        let out = to_ringflow(sd);
        let names: Vec<&str> = out.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "layers.0.weight",
                "layers.1.0.backward.bias",
                "layers.1.0.backward.w_hidden",
                "layers.1.0.backward.w_input",
                "layers.1.0.forward.bias",
                "layers.1.0.forward.w_hidden",
                "layers.1.0.forward.w_input",
            ]
        );
        let w = &out["layers.1.0.forward.w_input"];
        assert_eq!(
            (w.shape.as_slice(), w.layout),
            (&[3, 8][..], SourceLayout::Ringflow)
        );
        // PyTorch's [8, 3] row r, column c is ringflow's (c, r).
        assert_eq!(&w.values[..3], &[0.0, 3.0, 6.0]);
        assert_eq!(out["layers.1.0.forward.bias"].values[0], 11.0);
        assert_eq!(out["layers.0.weight"].layout, SourceLayout::Torch);
    }

    #[test]
    fn a_stacked_gru_keeps_both_biases() {
        let mut sd = BTreeMap::new();
        for k in 0..2 {
            sd.insert(format!("rnn.weight_ih_l{k}"), t(&[6, 2], 0.0));
            sd.insert(format!("rnn.weight_hh_l{k}"), t(&[6, 2], 0.0));
            sd.insert(format!("rnn.bias_ih_l{k}"), t(&[6], 0.0));
            sd.insert(format!("rnn.bias_hh_l{k}"), t(&[6], 5.0));
        }
        let out = to_ringflow(sd);
        assert_eq!(out["rnn.1.bias_hidden"].values[0], 5.0);
        assert_eq!(out["rnn.1.w_hidden"].shape, [2, 6]);
        assert_eq!(out.len(), 8);
    }
}
