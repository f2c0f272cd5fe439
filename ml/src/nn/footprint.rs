//! [`ModelFootprint`]: how much memory a model needs, known from its spec alone, so that a
//! driver can refuse a job that cannot fit an executor before anything is allocated.

use serde::{Deserialize, Serialize};

/// What a model holds in memory, in `f32` values: its weights, and what one example's forward
/// pass keeps for the backward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFootprint {
    /// Scalar weights (every parameter tensor's elements together).
    pub parameters: u64,
    /// Values one example's training step keeps alive at its peak: the input, every layer's
    /// output (and dropout mask) kept for the backward pass, and the gradients of the layer
    /// outputs in flight.
    pub activations_per_row: u64,
    /// Values one example's forward pass without gradients (evaluation, prediction) holds at
    /// its peak: the input and the widest two consecutive layer outputs.
    pub inference_per_row: u64,
    /// Values a training step holds whatever its rows: what a recurrent layer keeps for each
    /// step of the longest sequence besides the rows' values (the step's small tensors and its
    /// links in the backward graph). Add it once per batch.
    #[serde(default)]
    pub activations_per_batch: u64,
}

impl ModelFootprint {
    /// The footprint of a stack of linear layers with these widths (input first), an
    /// activation after every hidden layer, and dropout (a mask and an output per hidden
    /// value) when `dropout`.
    pub fn linear_stack(widths: &[usize], dropout: bool) -> ModelFootprint {
        let w: Vec<u64> = widths.iter().map(|&x| x as u64).collect();
        let parameters = w
            .windows(2)
            .map(|p| p[0].saturating_mul(p[1]).saturating_add(p[1]))
            .fold(0u64, u64::saturating_add);
        let hidden = w.len().saturating_sub(2);
        // Per layer: the linear output, and for hidden layers the activation's output and,
        // with dropout, its mask and output.
        let per_hidden = 2 + if dropout { 2 } else { 0 };
        let mut kept = w.first().copied().unwrap_or(0);
        for (i, &out) in w.iter().enumerate().skip(1) {
            let copies = if i <= hidden { per_hidden } else { 1 };
            kept = kept.saturating_add(out.saturating_mul(copies));
        }
        // The loss keeps its probabilities; backward holds the gradients of about two layer
        // outputs at a time (the input needs none).
        let widest = w.iter().skip(1).copied().max().unwrap_or(0);
        let last = w.last().copied().unwrap_or(0);
        let activations_per_row = kept
            .saturating_add(last)
            .saturating_add(widest.saturating_mul(2));
        let widest_pair = w
            .windows(2)
            .map(|p| p[0].saturating_add(p[1]))
            .max()
            .unwrap_or(0);
        ModelFootprint {
            parameters,
            activations_per_row,
            inference_per_row: widest_pair.saturating_add(w.first().copied().unwrap_or(0)),
            activations_per_batch: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;
    use crate::nn::{Model, ModelRegistry, ModelSpec};

    #[test]
    fn parameters_match_a_built_model() {
        for (layers, dropout) in [
            (vec![784, 100, 10], 0.0),
            (vec![4, 8, 8, 3], 0.5),
            (vec![3, 1], 0.0),
        ] {
            let mut spec = ModelSpec::mlp(&layers, "relu");
            spec.params
                .insert("dropout".into(), serde_json::json!(dropout));
            let registry = ModelRegistry::default();
            let footprint = registry
                .builder(&spec)
                .unwrap()
                .footprint(&spec)
                .unwrap()
                .expect("the MLP knows its footprint");
            let model = Model::build(&spec, &registry, 1, Device::Cpu).unwrap();
            assert_eq!(
                footprint.parameters,
                model.params().numel() as u64,
                "{layers:?}"
            );
        }
    }

    #[test]
    fn activations_count_every_kept_layer_output() {
        // 784 inputs; hidden 100: linear + relu = 200; output 10; loss 10; gradients of two
        // outputs of the widest layer, 2 × 100 (the input needs none).
        let f = ModelFootprint::linear_stack(&[784, 100, 10], false);
        assert_eq!(f.activations_per_row, 784 + 200 + 10 + 10 + 2 * 100);
        // Dropout adds a mask and an output per hidden value.
        let d = ModelFootprint::linear_stack(&[784, 100, 10], true);
        assert_eq!(d.activations_per_row, f.activations_per_row + 200);
        assert_eq!(f.inference_per_row, 784 + 784 + 100);
    }

    #[test]
    fn absurd_widths_saturate_instead_of_overflowing() {
        let f = ModelFootprint::linear_stack(&[usize::MAX, usize::MAX, 10], true);
        assert_eq!(f.parameters, u64::MAX);
        assert_eq!(f.activations_per_row, u64::MAX);
    }
}
