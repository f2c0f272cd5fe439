//! Layers, models built from specs, parameter stores, and a model that actually learns.

use ringflow_ml::nn::{
    Embedding, Forward, Linear, Model, ModelBuilder, ModelRegistry, ModelShape, ModelSpec, Module,
    ParamBuilder, ParamStore,
};
use ringflow_ml::optim::{Optimizer, OptimizerSpec};
use ringflow_ml::{Device, GradStore, Tensor, loss, no_grad, rng};
use serde_json::json;

use crate::helpers::*;

fn build(spec: &ModelSpec, seed: u64, device: Device) -> ringflow_ml::Result<Model> {
    Model::build(spec, &ModelRegistry::default(), seed, device)
}

fn mlp_learns_xor(device: Device) -> TestResult {
    let model = build(&ModelSpec::mlp(&[2, 8, 2], "tanh"), 1, device)?;
    let x = tensor(&[0., 0., 0., 1., 1., 0., 1., 1.], &[4, 2], device);
    let y = tensor(&[0., 1., 1., 0.], &[4], device);
    let spec: OptimizerSpec = serde_json::from_value(json!({"kind": "adam", "lr": 0.05}))?;
    let mut opt = Optimizer::new(spec, model.params())?;
    let mut dropout = rng::seeded(1, rng::streams::DROPOUT);
    let mut last = f32::INFINITY;
    let mut grads = GradStore::new();
    for _ in 0..300 {
        grads.zero();
        let l = loss::cross_entropy(&model.forward(&x, true, &mut dropout)?, &y)?;
        l.backward_into(&mut grads)?;
        opt.step(0.05, &mut grads)?;
        last = l.item()?;
    }
    let logits = no_grad(|| model.forward(&x, false, &mut dropout))?.to_vec();
    let predicted: Vec<f32> = logits
        .chunks(2)
        .map(|r| if r[1] > r[0] { 1.0 } else { 0.0 })
        .collect();
    ensure(
        predicted == y.to_vec(),
        format!("XOR predictions {predicted:?} (logits {logits:?})"),
    )?;
    let final_loss =
        no_grad(|| loss::cross_entropy(&model.forward(&x, false, &mut dropout)?, &y))?.item()?;
    ensure(
        final_loss < 0.05,
        format!("XOR loss {final_loss} (last training loss {last})"),
    )
}

fn mlp_structure_and_names(device: Device) -> TestResult {
    let spec = ModelSpec::new(
        "mlp",
        json!({"layers": [4, 6, 5, 3], "activation": "relu", "dropout": 0.1}),
    )?;
    let model = build(&spec, 7, device)?;
    let names: Vec<&str> = model.params().iter().map(|p| p.name.as_str()).collect();
    let want = [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.bias",
        "layers.2.weight",
        "layers.2.bias",
    ];
    ensure(names == want, format!("parameter names {names:?}"))?;
    ensure(
        *model.shape() == ModelShape::flat(4, 3),
        format!("shape {:?}", model.shape()),
    )?;
    ensure(
        model.params().numel() == 4 * 6 + 6 + 6 * 5 + 5 + 5 * 3 + 3,
        "numel",
    )?;
    ensure(
        model
            .params()
            .get("layers.1.weight")
            .expect("weight")
            .shape()
            == [6, 5],
        "weights are [in, out]",
    )?;
    ensure(model.spec() == &spec, "spec kept")?;
    for p in model.params().iter() {
        ensure(
            p.tensor.requires_grad() && p.tensor.is_leaf(),
            format!("{} is not a parameter", p.name),
        )?;
        ensure(
            p.tensor.device() == device,
            format!("{} is on another device", p.name),
        )?;
    }
    // Biases start at zero; He bounds for relu: √(6/fan_in).
    ensure(
        model
            .params()
            .get("layers.0.bias")
            .expect("bias")
            .to_vec()
            .iter()
            .all(|&v| v == 0.0),
        "bias is zero",
    )?;
    let w = model
        .params()
        .get("layers.0.weight")
        .expect("weight")
        .to_vec();
    let bound = (6.0f32 / 4.0).sqrt();
    ensure(
        w.iter().all(|v| v.abs() <= bound) && w.iter().any(|v| v.abs() > bound / 2.0),
        "He-uniform range",
    )?;
    // Same seed: same weights; another seed: other weights.
    ensure(
        build(&spec, 7, device)?.params().checksum()? == model.params().checksum()?,
        "seed 7 twice differs",
    )?;
    ensure(
        build(&spec, 8, device)?.params().checksum()? != model.params().checksum()?,
        "seeds 7 and 8 agree",
    )?;
    // Output shape; evaluation is deterministic (no dropout), training with dropout is not.
    let x = uniform(&[3, 4], -1.0, 1.0, 1, device);
    let mut r = rng::seeded(1, rng::streams::DROPOUT);
    let e1 = model.forward(&x, false, &mut r)?;
    ensure(
        e1.shape() == [3, 3],
        format!("output shape {:?}", e1.shape()),
    )?;
    ensure(
        e1.to_vec() == model.forward(&x, false, &mut r)?.to_vec(),
        "eval forward is not deterministic",
    )?;
    let t1 = model.forward(&x, true, &mut r)?.to_vec();
    let t2 = model.forward(&x, true, &mut r)?.to_vec();
    ensure(t1 != t2, "dropout masks repeat across training steps")
}

fn model_spec_errors(device: Device) -> TestResult {
    let bad = [
        json!({"layers": [4]}),
        json!({"layers": [4, 0, 2]}),
        json!({"layers": [4, 2], "dropout": 1.0}),
        json!({"layers": [4, 2], "activation": "swish"}),
        json!({"layers": [4, 2], "hidden": 3}),
        json!({}),
    ];
    for fields in bad {
        let spec = ModelSpec::new("mlp", fields.clone())?;
        ensure(
            build(&spec, 1, device).is_err(),
            format!("mlp {fields} was accepted"),
        )?;
    }
    ensure(
        ModelSpec::new("mlp", json!([1, 2])).is_err(),
        "non-object fields accepted",
    )?;
    match build(&ModelSpec::new("transformer", json!({}))?, 1, device) {
        Ok(_) => Err("an unknown kind was built".into()),
        Err(e) => ensure(
            e.to_string().contains("mlp"),
            format!("the error does not list the known kinds: {e}"),
        ),
    }?;
    let spec: ModelSpec =
        serde_json::from_value(json!({"kind": "mlp", "layers": [3, 2], "activation": "gelu"}))?;
    ensure(
        spec == ModelSpec::mlp(&[3, 2], "gelu"),
        format!("spec from JSON: {spec:?}"),
    )
}

/// A user-registered model kind: one linear layer followed by a sigmoid.
struct Logistic;

impl ModelBuilder for Logistic {
    fn shape(&self, spec: &ModelSpec) -> ringflow_ml::Result<ModelShape> {
        let inputs = spec
            .params
            .get("inputs")
            .and_then(|v| v.as_u64())
            .unwrap_or(0) as usize;
        Ok(ModelShape::flat(inputs, 1))
    }

    fn build(
        &self,
        spec: &ModelSpec,
        params: &mut ParamBuilder<'_>,
    ) -> ringflow_ml::Result<Box<dyn Module>> {
        let inputs = self.shape(spec)?.input_width();
        Ok(Box::new(Linear::new(
            &mut params.sub("linear"),
            inputs,
            1,
            Default::default(),
            None,
        )?))
    }
}

fn custom_model_kinds(device: Device) -> TestResult {
    let mut registry = ModelRegistry::default();
    registry.register("logistic", Logistic);
    ensure(
        registry.kinds().collect::<Vec<_>>() == ["logistic", "mlp", "sequential"],
        "registered kinds",
    )?;
    let model = Model::build(
        &ModelSpec::new("logistic", json!({"inputs": 3}))?,
        &registry,
        1,
        device,
    )?;
    let names: Vec<&str> = model.params().iter().map(|p| p.name.as_str()).collect();
    ensure(
        names == ["linear.weight", "linear.bias"],
        format!("names {names:?}"),
    )?;
    let out = model.forward(
        &Tensor::ones(&[5, 3], device)?,
        false,
        &mut rng::seeded(0, 2),
    )?;
    ensure(
        out.shape() == [5, 1],
        format!("output shape {:?}", out.shape()),
    )?;
    ensure(
        Model::build(
            &ModelSpec::new("logistic", json!({"inputs": 0}))?,
            &registry,
            1,
            device,
        )
        .is_err(),
        "0 inputs",
    )
}

fn layers_by_hand(device: Device) -> TestResult {
    let mut store = ParamStore::new();
    let mut init = rng::seeded(1, rng::streams::INIT);
    let mut b = ParamBuilder::new(&mut store, &mut init, device);
    let lin = Linear::new(&mut b.sub("fc"), 2, 3, Default::default(), None)?;
    let emb = Embedding::new(&mut b.sub("emb"), 4, 2)?;
    ensure(
        b.sub("fc")
            .param("weight", Tensor::zeros(&[1], device)?)
            .is_err(),
        "a duplicate name was accepted",
    )?;
    lin.weight.copy_from_slice(&[1., 2., 3., 4., 5., 6.])?;
    let bias = lin.bias.as_ref().ok_or("Linear::new made no bias")?;
    bias.copy_from_slice(&[0.5, 0., -0.5])?;
    let mut r = rng::seeded(0, 2);
    let mut ctx = Forward::new(true, &mut r);
    // [1, -1]·[[1,2,3],[4,5,6]] + b = [-3, -3, -3] + b
    let y = lin.forward(&tensor(&[1., -1.], &[1, 2], device), &mut ctx)?;
    assert_close(&y.to_vec(), &[-2.5, -3., -3.5], 1e-6, "linear")?;
    let table = emb.table.to_vec();
    let e = emb.forward(&tensor(&[3., 0.], &[2], device), &mut ctx)?;
    assert_close(
        &e.to_vec(),
        &[table[6], table[7], table[0], table[1]],
        0.0,
        "embedding",
    )?;
    let names: Vec<&str> = store.iter().map(|p| p.name.as_str()).collect();
    ensure(
        names == ["fc.weight", "fc.bias", "emb.weight"],
        format!("names {names:?}"),
    )
}

fn layer_norm_values(device: Device) -> TestResult {
    let mut store = ParamStore::new();
    let mut init = rng::seeded(1, rng::streams::INIT);
    let ln = ringflow_ml::nn::LayerNorm::new(
        &mut ParamBuilder::new(&mut store, &mut init, device),
        4,
        0.0,
    )?;
    let mut r = rng::seeded(0, 2);
    // Row [1, 2, 3, 4]: mean 2.5, biased variance 1.25 → (x - 2.5)/√1.25.
    let y = ln.forward(
        &tensor(&[1., 2., 3., 4., 2., 2., 2., 6.], &[2, 4], device),
        &mut Forward::new(false, &mut r),
    )?;
    let s = 1.25f32.sqrt();
    // Row [2, 2, 2, 6]: mean 3, variance 3 → [-1, -1, -1, 3]/√3.
    let t = 3f32.sqrt();
    assert_close(
        &y.to_vec(),
        &[
            -1.5 / s,
            -0.5 / s,
            0.5 / s,
            1.5 / s,
            -1. / t,
            -1. / t,
            -1. / t,
            3. / t,
        ],
        1e-5,
        "layer norm",
    )
}

fn param_store_flat_round_trip(device: Device) -> TestResult {
    let model = build(&ModelSpec::mlp(&[3, 4, 2], "relu"), 1, device)?;
    let flat = model.params().flatten_values()?;
    ensure(flat.len() == model.params().numel(), "flat length")?;
    ensure(
        flat[..12] == model.params().get("layers.0.weight").expect("w").to_vec()[..],
        "store order",
    )?;
    let other = build(&ModelSpec::mlp(&[3, 4, 2], "relu"), 2, device)?;
    ensure(
        other.params().checksum()? != model.params().checksum()?,
        "different seeds",
    )?;
    other.params().load_flat_values(&flat)?;
    ensure(
        other.params().checksum()? == model.params().checksum()?,
        "load_flat_values restores the checksum",
    )?;
    ensure(
        other.params().load_flat_values(&flat[1..]).is_err(),
        "a short buffer was accepted",
    )
}

device_test!(
    mlp_learns_xor,
    mlp_structure_and_names,
    model_spec_errors,
    custom_model_kinds,
    layers_by_hand,
    layer_norm_values,
    param_store_flat_round_trip,
);
