//! `model.init_from`: loading weights made elsewhere into a freshly built model, by name.
//!
//! The file formats are read outside the engine (`ringflow-interop`); what reaches here is a
//! set of [`Weights`]: named tensors as `f32`, each with the layout it was written in. Every
//! tensor of the model (trainable, frozen and buffers) is looked up under its own name; a
//! tensor PyTorch stores transposed ([`TorchLayout::Transposed`]) is transposed when the
//! weights are in PyTorch's layout. A shape that does not fit is always an error; a tensor the
//! weights lack is an error unless `model.init_strict = false` (it keeps its initialization),
//! and those `model.init_skip` names are never loaded. Nothing changes in the model unless
//! every check passes.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{MlError, Result};
use crate::nn::params::Param;
use crate::nn::pattern::{NamePattern, any_matches};
use crate::nn::{ParamStore, TorchLayout};

/// How a source tensor's values are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceLayout {
    /// As ringflow keeps it (a ringflow model directory; an ONNX `MatMul` operand).
    Ringflow,
    /// As PyTorch keeps it (a state_dict; an ONNX `Gemm` operand with `transB = 1`).
    Torch,
}

/// One named tensor of the weights, converted to `f32`.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceTensor {
    /// Its shape as written.
    pub shape: Vec<usize>,
    /// Its values, row-major.
    pub values: Vec<f32>,
    /// The layout they are written in.
    pub layout: SourceLayout,
}

/// Named tensors read from `model.init_from`.
#[derive(Clone, Debug, Default)]
pub struct Weights {
    /// The file or directory they come from, as errors name it.
    pub origin: String,
    /// The tensors by name.
    pub tensors: BTreeMap<String, SourceTensor>,
}

/// What [`load_into`] did: the tensors loaded and those left as the model initialized them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InitReport {
    /// Where the weights came from.
    pub origin: String,
    /// How many of the model's tensors were loaded, and their values.
    pub loaded: usize,
    /// The values of the tensors loaded.
    pub loaded_values: u64,
    /// The model's tensors `model.init_skip` kept from loading.
    pub skipped: Vec<String>,
    /// The model's tensors the weights lack (allowed by `model.init_strict = false`).
    pub missing: Vec<String>,
    /// The weights' tensors the model has no use for.
    pub unused: Vec<String>,
}

impl fmt::Display for InitReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "model.init_from {}: loaded {} tensors ({} values)",
            self.origin,
            self.loaded,
            crate::nn::thousands(self.loaded_values)
        )?;
        if !self.skipped.is_empty() {
            write!(
                f,
                "; left initialized by model.init_skip: {}",
                list(&self.skipped)
            )?;
        }
        if !self.missing.is_empty() {
            write!(
                f,
                "; not in the file, left initialized: {}",
                list(&self.missing)
            )?;
        }
        if !self.unused.is_empty() {
            write!(
                f,
                "; in the file but not in the model: {}",
                list(&self.unused)
            )?;
        }
        Ok(())
    }
}

/// Up to eight names and how many more.
fn list(names: &[String]) -> String {
    let shown = names.iter().take(8).cloned().collect::<Vec<_>>().join(", ");
    match names.len() {
        n if n > 8 => format!("{shown} and {} more", n - 8),
        _ => shown,
    }
}

/// PyTorch's batch counters: a state_dict holds one per batch norm, ringflow keeps none (its
/// steps count the batches), so they are neither loaded nor reported unused.
const TORCH_ONLY: &str = "num_batches_tracked";

/// Copies `weights` into the tensors of `store` by name, as the module docs say; `skip` are
/// the `model.init_skip` patterns. On any error the store is unchanged.
pub fn load_into(
    store: &ParamStore,
    weights: &Weights,
    skip: &[NamePattern],
    strict: bool,
) -> Result<InitReport> {
    let fail = |message: String| MlError::init_from(&weights.origin, message);
    for pattern in skip {
        if !store.named().any(|(_, p)| pattern.matches(&p.name)) {
            return Err(fail(format!(
                "model.init_skip entry {:?} names no tensor of the model",
                pattern.as_str()
            )));
        }
    }
    let mut report = InitReport {
        origin: weights.origin.clone(),
        ..InitReport::default()
    };
    let mut copies: Vec<(&Param, Vec<f32>)> = Vec::new();
    for (what, p) in store.named() {
        if any_matches(skip, &p.name) {
            report.skipped.push(p.name.clone());
            continue;
        }
        let Some(source) = weights.tensors.get(&p.name) else {
            report.missing.push(p.name.clone());
            continue;
        };
        let values = fitted(what, p, source).map_err(fail)?;
        report.loaded += 1;
        report.loaded_values += values.len() as u64;
        copies.push((p, values));
    }
    if strict && let Some(first) = report.missing.first() {
        return Err(fail(missing_sentence(first, &report.missing, weights)));
    }
    report.unused = weights
        .tensors
        .keys()
        .filter(|k| store.get_named(k).is_none() && !k.ends_with(TORCH_ONLY))
        .cloned()
        .collect();
    for (p, values) in copies {
        p.tensor.copy_from_slice(&values)?;
    }
    Ok(report)
}

/// The values of `source` in the layout of `p`, or the sentence saying why they do not fit.
fn fitted(what: &str, p: &Param, source: &SourceTensor) -> std::result::Result<Vec<f32>, String> {
    let want = p.tensor.shape();
    let transposed = source.layout == SourceLayout::Torch && p.torch == TorchLayout::Transposed;
    let expected: Vec<usize> = match transposed {
        true => want.iter().rev().copied().collect(),
        false => want.to_vec(),
    };
    if source.shape != expected {
        let layout = match transposed {
            true => format!(" (PyTorch's layout of the model's {want:?})"),
            false => String::new(),
        };
        return Err(format!(
            "tensor {:?} has shape {:?}, the model's {what} needs {expected:?}{layout}; a shape \
             that does not fit is never loaded (list the tensor in model.init_skip to leave it \
             initialized)",
            p.name, source.shape
        ));
    }
    match transposed {
        true => Ok(transpose(&source.values, expected[0], expected[1])),
        false => Ok(source.values.clone()),
    }
}

/// The row-major `[rows, cols]` matrix `values` as its transpose, `[cols, rows]`: how PyTorch's
/// `[out, in]` weights and ringflow's `[in, out]` ones turn into each other.
pub fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}

/// The sentence for tensors of the model that the weights lack.
fn missing_sentence(first: &str, missing: &[String], weights: &Weights) -> String {
    let near: Vec<&str> = weights.tensors.keys().take(4).map(String::as_str).collect();
    format!(
        "has no tensor {first:?} ({} of the model's tensors are missing: {}); the file's \
         tensors begin {near:?}. Save the state_dict of a module whose names match the model's \
         (a PyTorch model keeps ringflow's layers in a ModuleList called `layers`), or set \
         model.init_strict = false to leave the missing ones initialized",
        missing.len(),
        list(missing)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::{ModelRegistry, ModelSpec};
    use crate::{Device, nn::Model};

    fn model(freeze: &[&str]) -> Model {
        let spec = ModelSpec::new(
            "mlp",
            serde_json::json!({ "layers": [3, 4, 2], "activation": "relu", "freeze": freeze }),
        )
        .unwrap();
        Model::build(&spec, &ModelRegistry::with_builtins(), 7, Device::Cpu).unwrap()
    }

    fn tensor(shape: &[usize], layout: SourceLayout) -> SourceTensor {
        let n = shape.iter().product::<usize>();
        SourceTensor {
            shape: shape.to_vec(),
            values: (0..n).map(|i| i as f32).collect(),
            layout,
        }
    }

    fn torch_weights() -> Weights {
        let mut tensors = BTreeMap::new();
        tensors.insert(
            "layers.0.weight".into(),
            tensor(&[4, 3], SourceLayout::Torch),
        );
        tensors.insert("layers.0.bias".into(), tensor(&[4], SourceLayout::Torch));
        tensors.insert(
            "layers.1.weight".into(),
            tensor(&[2, 4], SourceLayout::Torch),
        );
        tensors.insert("layers.1.bias".into(), tensor(&[2], SourceLayout::Torch));
        tensors.insert(
            "layers.1.num_batches_tracked".into(),
            tensor(&[], SourceLayout::Torch),
        );
        Weights {
            origin: "head.safetensors".into(),
            tensors,
        }
    }

    #[test]
    fn pytorch_linear_weights_are_transposed_into_place() {
        let m = model(&[]);
        let report = load_into(m.params(), &torch_weights(), &[], true).unwrap();
        assert_eq!((report.loaded, report.loaded_values), (4, 12 + 4 + 8 + 2));
        assert!(report.unused.is_empty() && report.missing.is_empty());
        // PyTorch's [out = 4, in = 3] row r, column c lands at ringflow's [in, out] (c, r).
        let w = m.params().get("layers.0.weight").unwrap().to_vec();
        assert_eq!(&w[..4], &[0.0, 3.0, 6.0, 9.0]);
        assert_eq!(
            m.params().get("layers.1.bias").unwrap().to_vec(),
            vec![0.0, 1.0]
        );
    }

    #[test]
    fn frozen_parameters_are_loaded_too() {
        let m = model(&["layers.0"]);
        load_into(m.params(), &torch_weights(), &[], true).unwrap();
        let frozen: Vec<&str> = m.params().frozen().map(|p| p.name.as_str()).collect();
        assert_eq!(frozen, ["layers.0.weight", "layers.0.bias"]);
        assert_eq!(
            m.params().get_named("layers.0.bias").unwrap().to_vec(),
            vec![0., 1., 2., 3.]
        );
    }

    #[test]
    fn a_shape_that_does_not_fit_is_refused_and_nothing_changes() {
        let m = model(&[]);
        let before = m.params().checksum().unwrap();
        let mut w = torch_weights();
        w.tensors.insert(
            "layers.1.weight".into(),
            tensor(&[3, 4], SourceLayout::Torch),
        );
        let e = load_into(m.params(), &w, &[], false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("head.safetensors") && e.contains("\"layers.1.weight\""),
            "{e}"
        );
        assert!(e.contains("[3, 4]") && e.contains("[2, 4]"), "{e}");
        assert_eq!(m.params().checksum().unwrap(), before);
        // Skipped, it keeps its initialization and the rest loads.
        let skip = [NamePattern::parse("model.init_skip", "layers.1").unwrap()];
        let report = load_into(m.params(), &w, &skip, true).unwrap();
        assert_eq!(report.skipped, ["layers.1.weight", "layers.1.bias"]);
        assert_eq!(report.loaded, 2);
        assert!(
            report
                .to_string()
                .contains("left initialized by model.init_skip")
        );
    }

    #[test]
    fn missing_tensors_need_init_strict_false() {
        let m = model(&[]);
        let mut w = torch_weights();
        w.tensors.remove("layers.1.bias");
        w.tensors
            .insert("extra.weight".into(), tensor(&[1], SourceLayout::Torch));
        let e = load_into(m.params(), &w, &[], true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no tensor \"layers.1.bias\"") && e.contains("init_strict"),
            "{e}"
        );
        let report = load_into(m.params(), &w, &[], false).unwrap();
        assert_eq!(report.missing, ["layers.1.bias"]);
        assert_eq!(report.unused, ["extra.weight"]);
    }

    #[test]
    fn ringflow_layout_is_copied_as_is() {
        let m = model(&[]);
        let mut w = torch_weights();
        w.tensors.insert(
            "layers.0.weight".into(),
            tensor(&[3, 4], SourceLayout::Ringflow),
        );
        load_into(m.params(), &w, &[], true).unwrap();
        let got = m.params().get("layers.0.weight").unwrap().to_vec();
        assert_eq!(got, (0..12).map(|i| i as f32).collect::<Vec<_>>());
    }
}
