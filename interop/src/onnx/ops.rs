//! The layers every model kind lowers through: a linear map and the activations, written with
//! opset-17 operators so that any ONNX runtime of the last years runs them.

use ringflow_ml::nn::ActivationKind;

use super::graph::Graph;
use crate::error::ExportError;
use crate::saved::SavedModelDir;

/// `√(2/π)`, as the engine's tanh GELU uses it.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044_715;

/// The saved parameter `name` as an initializer of the graph; `layer` names who needs it.
pub fn parameter(
    g: &mut Graph,
    saved: &SavedModelDir,
    name: &str,
    layer: &str,
) -> Result<String, ExportError> {
    let (shape, values) = saved.tensor(name, layer)?;
    Ok(g.parameter(name, &shape, &values))
}

/// `x·W + b` of the `linear` layer whose parameters are `<name>.weight` (`[in, out]`, as
/// ringflow stores it) and `<name>.bias` (when it has one).
pub fn linear(
    g: &mut Graph,
    saved: &SavedModelDir,
    x: &str,
    name: &str,
) -> Result<String, ExportError> {
    let layer = format!("{name} (linear)");
    let weight = parameter(g, saved, &format!("{name}.weight"), &layer)?;
    let product = g.op("MatMul", &[x, &weight], Vec::new());
    let bias_name = format!("{name}.bias");
    if saved.model.params().get_named(&bias_name).is_none() {
        return Ok(product);
    }
    let bias = parameter(g, saved, &bias_name, &layer)?;
    Ok(g.op("Add", &[&product, &bias], Vec::new()))
}

/// `kind(x)`; each GELU as what it is (the tanh form, or the exact one with `Erf`).
pub fn activation(g: &mut Graph, x: &str, kind: ActivationKind) -> String {
    match kind {
        ActivationKind::Relu => g.op("Relu", &[x], Vec::new()),
        ActivationKind::Tanh => g.op("Tanh", &[x], Vec::new()),
        ActivationKind::Sigmoid => g.op("Sigmoid", &[x], Vec::new()),
        ActivationKind::Gelu => {
            // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
            let x2 = g.op("Mul", &[x, x], Vec::new());
            let x3 = g.op("Mul", &[&x2, x], Vec::new());
            let cubic = g.scalar(GELU_CUBIC);
            let term = g.op("Mul", &[&x3, &cubic], Vec::new());
            let inner = g.op("Add", &[x, &term], Vec::new());
            let k = g.scalar(SQRT_2_OVER_PI);
            let u = g.op("Mul", &[&inner, &k], Vec::new());
            let t = g.op("Tanh", &[&u], Vec::new());
            half_x_times_one_plus(g, x, &t)
        }
        ActivationKind::GeluExact => {
            // 0.5·x·(1 + erf(x/√2))
            let k = g.scalar(std::f32::consts::FRAC_1_SQRT_2);
            let scaled = g.op("Mul", &[x, &k], Vec::new());
            let e = g.op("Erf", &[&scaled], Vec::new());
            half_x_times_one_plus(g, x, &e)
        }
    }
}

/// `0.5·x·(1 + t)`, the GELUs' last steps in the engine's order.
fn half_x_times_one_plus(g: &mut Graph, x: &str, t: &str) -> String {
    let one = g.scalar(1.0);
    let half = g.scalar(0.5);
    let one_plus = g.op("Add", &[&one, t], Vec::new());
    let half_x = g.op("Mul", &[&half, x], Vec::new());
    g.op("Mul", &[&half_x, &one_plus], Vec::new())
}
