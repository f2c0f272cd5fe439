//! `kind = "sequential"` in ONNX: each planned layer as the operators that compute it.

use ringflow_ml::Pool2dOptions;
use ringflow_ml::nn::SequentialSpec;
use ringflow_ml::nn::sequential::{PlannedLayer, Resolved};

use super::graph::{Attr, Graph};
use super::ops::{activation, linear, parameter};
use crate::error::ExportError;
use crate::saved::SavedModelDir;

/// The sequential model of `saved` applied to `x`, the flat features `[batch, width]`
/// (reshaped to the model's input, `[batch, C, H, W]` for images).
pub fn lower(g: &mut Graph, saved: &SavedModelDir, x: &str) -> Result<String, ExportError> {
    let load = |source| ExportError::Load {
        dir: saved.dir.display().to_string(),
        source,
    };
    let spec = SequentialSpec::from_spec(&saved.saved.spec.model).map_err(load)?;
    let plan = spec.plan().map_err(load)?;
    let mut h = x.to_string();
    if plan.input.len() > 1 {
        let dims: Vec<i64> = std::iter::once(-1)
            .chain(plan.input.iter().map(|&d| d as i64))
            .collect();
        let shape = g.int64s("shape", &dims);
        h = g.op("Reshape", &[&h, &shape], Vec::new());
    }
    layers(g, saved, &h, &plan.layers)
}

/// `layers` one after the other on `x`.
fn layers(
    g: &mut Graph,
    saved: &SavedModelDir,
    x: &str,
    layers: &[PlannedLayer],
) -> Result<String, ExportError> {
    let mut h = x.to_string();
    for l in layers {
        h = layer(g, saved, &h, l)?;
    }
    Ok(h)
}

/// One layer on `x`.
fn layer(
    g: &mut Graph,
    saved: &SavedModelDir,
    x: &str,
    l: &PlannedLayer,
) -> Result<String, ExportError> {
    let layer = format!("{} ({})", l.name, l.kind);
    let param =
        |g: &mut Graph, what: &str| parameter(g, saved, &format!("{}.{what}", l.name), &layer);
    Ok(match &l.layer {
        Resolved::Conv2d(c) => {
            let o = &c.options;
            let mut inputs = vec![param(g, "weight")?];
            if c.bias {
                inputs.push(param(g, "bias")?);
            }
            let [ph, pw] = o.padding.map(|p| p as i64);
            let attrs = vec![
                Attr::Ints("kernel_shape", c.kernel.iter().map(|&k| k as i64).collect()),
                Attr::Ints("strides", o.stride.iter().map(|&s| s as i64).collect()),
                Attr::Ints("dilations", o.dilation.iter().map(|&d| d as i64).collect()),
                Attr::Ints("pads", vec![ph, pw, ph, pw]),
                Attr::Int("group", o.groups as i64),
            ];
            let mut all = vec![x];
            all.extend(inputs.iter().map(String::as_str));
            g.op("Conv", &all, attrs)
        }
        Resolved::BatchNorm { eps, .. } => {
            let names = ["weight", "bias", "running_mean", "running_var"];
            let p: Vec<String> = names
                .iter()
                .map(|n| param(g, n))
                .collect::<Result<_, _>>()?;
            let inputs = [
                x,
                p[0].as_str(),
                p[1].as_str(),
                p[2].as_str(),
                p[3].as_str(),
            ];
            g.op(
                "BatchNormalization",
                &inputs,
                vec![Attr::Float("epsilon", *eps)],
            )
        }
        Resolved::Activation(kind) => activation(g, x, *kind),
        Resolved::MaxPool2d(p) => g.op("MaxPool", &[x], pool_attrs(p)),
        Resolved::AvgPool2d(p) => {
            // Padded cells are not counted in an average.
            let mut attrs = pool_attrs(p);
            attrs.push(Attr::Int("count_include_pad", 0));
            g.op("AveragePool", &[x], attrs)
        }
        Resolved::GlobalAvgPool2d => {
            let pooled = g.op("GlobalAveragePool", &[x], Vec::new());
            g.op("Flatten", &[&pooled], vec![Attr::Int("axis", 1)])
        }
        Resolved::Flatten => g.op("Flatten", &[x], vec![Attr::Int("axis", 1)]),
        Resolved::Linear { .. } => linear(g, saved, x, &l.name)?,
        // Dropout is the identity at inference.
        Resolved::Dropout(_) => x.to_string(),
        Resolved::LayerNorm { eps, .. } => {
            let (w, b) = (param(g, "weight")?, param(g, "bias")?);
            let attrs = vec![Attr::Int("axis", -1), Attr::Float("epsilon", *eps)];
            g.op("LayerNormalization", &[x, &w, &b], attrs)
        }
        Resolved::Residual { body, shortcut } => {
            let out = layers(g, saved, x, body)?;
            let skip = match shortcut {
                Some(s) => layers(g, saved, x, s)?,
                None => x.to_string(),
            };
            g.op("Add", &[&out, &skip], Vec::new())
        }
        _ => return Err(ExportError::sequence_layer("ONNX", &l.path, l.kind)),
    })
}

/// A pooling window's attributes: its size, stride and padding on each side.
fn pool_attrs(p: &Pool2dOptions) -> Vec<Attr<'static>> {
    let stride = p.stride.unwrap_or(p.kernel);
    let [ph, pw] = p.padding.map(|v| v as i64);
    vec![
        Attr::Ints("kernel_shape", p.kernel.iter().map(|&k| k as i64).collect()),
        Attr::Ints("strides", stride.iter().map(|&s| s as i64).collect()),
        Attr::Ints("pads", vec![ph, pw, ph, pw]),
    ]
}
