//! The sequential spec: parsing and its errors, shape inference, summaries, footprints,
//! resolution from data facts, and models that build and learn.

use serde_json::{Value, json};

use super::*;
use crate::nn::{Model, ModelRegistry};
use crate::{Device, Tensor, loss, rng};

/// The issue's example CNN, with `input` and `classes` given.
fn issue_cnn() -> Value {
    json!({
        "input": [1, 28, 28],
        "classes": 10,
        "layers": [
            { "type": "conv2d", "out_channels": 32, "kernel": 3, "padding": 1 },
            { "type": "batch_norm" },
            { "type": "relu" },
            { "type": "max_pool2d", "kernel": 2 },
            { "type": "conv2d", "out_channels": 64, "kernel": 3, "stride": 1, "padding": 1 },
            { "type": "relu" },
            { "type": "max_pool2d", "kernel": 2 },
            { "type": "flatten" },
            { "type": "linear", "out": 128 },
            { "type": "relu" },
            { "type": "dropout", "p": 0.3 },
            { "type": "linear" },
        ],
    })
}

fn spec(fields: Value) -> ModelSpec {
    ModelSpec::new("sequential", fields).unwrap()
}

fn plan(fields: Value) -> Result<SequentialPlan> {
    SequentialSpec::from_spec(&spec(fields))?.plan()
}

fn error(fields: Value) -> String {
    match plan(fields) {
        Ok(p) => panic!("planned: {p:?}"),
        Err(e) => e.to_string(),
    }
}

/// `fields` with `layers[at]` replaced by `layer` (or removed when `layer` is null).
fn with_layer(mut fields: Value, at: usize, layer: Value) -> Value {
    let layers = fields["layers"].as_array_mut().unwrap();
    if layer.is_null() {
        layers.remove(at);
    } else {
        layers[at] = layer;
    }
    fields
}

#[test]
fn the_issue_cnn_infers_every_shape() {
    let p = plan(issue_cnn()).unwrap();
    let shapes: Vec<&[usize]> = p.layers.iter().map(|l| l.output.as_slice()).collect();
    assert_eq!(
        shapes,
        [
            &[32, 28, 28][..],
            &[32, 28, 28],
            &[32, 28, 28],
            &[32, 14, 14],
            &[64, 14, 14],
            &[64, 14, 14],
            &[64, 7, 7],
            &[3136],
            &[128],
            &[128],
            &[128],
            &[10],
        ]
    );
    assert_eq!(
        p.shape(),
        ModelShape {
            input: vec![1, 28, 28],
            outputs: 10,
            sequence: None,
        }
    );
}

#[test]
fn the_summary_counts_what_keras_counts() {
    let s = plan(issue_cnn()).unwrap().summary();
    let params: Vec<(&str, u64)> = s
        .rows
        .iter()
        .filter(|r| r.params > 0)
        .map(|r| (r.name.as_str(), r.params))
        .collect();
    // conv 1→32 3×3: 32·9 + 32; BN 32: 64 trainable + 64 running statistics; conv 32→64:
    // 64·32·9 + 64; linear 3136→128; linear 128→10.
    assert_eq!(
        params,
        [
            ("layers.0", 320),
            ("layers.1", 128),
            ("layers.4", 18_496),
            ("layers.8", 401_536),
            ("layers.11", 1_290),
        ]
    );
    assert_eq!(s.trainable, 320 + 64 + 18_496 + 401_536 + 1_290);
    assert_eq!(s.non_trainable, 64);
    assert_eq!(s.total(), 421_770);
    let text = s.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("Layer (type)"), "{text}");
    assert!(lines[2].starts_with("input") && lines[2].contains("[n, 1, 28, 28]"));
    let conv = lines[3];
    assert!(conv.starts_with("layers.0 (conv2d)"), "{conv}");
    assert!(
        conv.contains("[n, 32, 28, 28]") && conv.ends_with(" 320"),
        "{conv}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("layers.8 (linear)") && l.ends_with("401,536"))
    );
    assert_eq!(
        &lines[lines.len() - 3..],
        [
            "Total params: 421,770",
            "Trainable params: 421,706",
            "Non-trainable params: 64"
        ]
    );
}

#[test]
fn a_built_model_has_the_planned_parameters_and_output() {
    let spec = spec(issue_cnn());
    let model = Model::build(&spec, &ModelRegistry::default(), 3, Device::Cpu).unwrap();
    assert_eq!(model.params().numel(), 421_706);
    assert_eq!(model.params().buffer_numel(), 64);
    assert_eq!(model.summary().total(), 421_770);
    let names: Vec<&str> = model.params().buffers().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["layers.1.running_mean", "layers.1.running_var"]);
    assert!(model.params().get("layers.0.weight").is_some());
    assert_eq!(
        model.params().get("layers.4.weight").unwrap().shape(),
        [64, 32, 3, 3]
    );
    let x = Tensor::zeros(&[2, 1, 28, 28], Device::Cpu).unwrap();
    let mut r = rng::seeded(1, rng::streams::DROPOUT);
    let y = model.forward(&x, false, &mut r).unwrap();
    assert_eq!(y.shape(), [2, 10]);
    // The footprint counts the same parameters.
    let footprint = SequentialBuilder.footprint(&spec).unwrap().unwrap();
    assert_eq!(footprint.parameters, 421_706);
}

#[test]
fn a_mismatch_names_the_layer_and_both_shapes() {
    // Without the flatten, the first linear (now layers[7]) gets the feature maps.
    let e = error(with_layer(issue_cnn(), 7, Value::Null));
    assert_eq!(
        e,
        "model.layers[7] (linear) needs a flat [n, features] input but gets [n, 64, 7, 7]; \
         add { type = \"flatten\" } before it"
    );
    let e = error(json!({ "input": [784], "classes": 10, "layers": [
        { "type": "conv2d", "out_channels": 4, "kernel": 3 }, { "type": "flatten" },
        { "type": "linear" } ] }));
    assert!(
        e.starts_with(
            "model.layers[0] (conv2d) needs an image input [n, channels, height, width] but \
             gets [n, 784]"
        ),
        "{e}"
    );
    let e = error(json!({ "input": [3, 4, 4], "classes": 2, "layers": [
        { "type": "conv2d", "out_channels": 4, "kernel": 5 }, { "type": "flatten" },
        { "type": "linear" } ] }));
    assert!(
        e.starts_with("model.layers[0] (conv2d) gets [n, 3, 4, 4], smaller than its kernel 5×5"),
        "{e}"
    );
    let e = error(json!({ "input": [3, 8, 8], "classes": 2, "layers": [
        { "type": "conv2d", "out_channels": 4, "kernel": 3, "groups": 2 } ] }));
    assert!(
        e.starts_with("model.layers[0] (conv2d) has groups = 2, which must divide"),
        "{e}"
    );
    let e = error(json!({ "input": [3, 8, 8], "layers": [
        { "type": "conv2d", "out_channels": 4, "kernel": 3 } ] }));
    assert!(
        e.starts_with("model.layers[0] (conv2d) is the last layer and gives [n, 4, 6, 6]"),
        "{e}"
    );
}

#[test]
fn unknown_keys_and_types_name_the_layer() {
    let e = error(with_layer(
        issue_cnn(),
        4,
        json!({ "type": "conv2d", "out_channels": 64, "kernal": 3 }),
    ));
    assert!(
        e.starts_with("model.layers[4] (conv2d): unknown key `kernal` (expected one of: "),
        "{e}"
    );
    let e = error(with_layer(
        issue_cnn(),
        2,
        json!({ "type": "relu", "inplace": true }),
    ));
    assert_eq!(
        e,
        "model.layers[2] (relu): unknown key `inplace`; this layer takes no keys besides `type`"
    );
    let e = error(with_layer(issue_cnn(), 2, json!({ "type": "conv3d" })));
    assert!(
        e.starts_with("model.layers[2] has type \"conv3d\", which is not a layer type"),
        "{e}"
    );
    let e = error(with_layer(issue_cnn(), 2, json!({ "out": 3 })));
    assert!(e.starts_with("model.layers[2] has no `type`"), "{e}");
    let e = error(with_layer(
        issue_cnn(),
        0,
        json!({ "type": "conv2d", "out_channels": 8, "kernel": "big" }),
    ));
    assert_eq!(
        e,
        "model.layers[0].kernel (conv2d): expected an integer or [height, width], not the \
         string \"big\""
    );
    let mut fields = issue_cnn();
    fields["optimizer"] = json!("adam");
    assert!(error(fields).starts_with("model: unknown key `optimizer`"));
}

#[test]
fn the_last_linear_takes_its_outputs_from_classes() {
    let mut fields = issue_cnn();
    fields.as_object_mut().unwrap().remove("classes");
    let e = error(fields.clone());
    assert!(
        e.starts_with("model.layers[11] (linear) has no `out` and model.classes is not set"),
        "{e}"
    );
    // Only the last layer may leave `out` out.
    let e = error(with_layer(issue_cnn(), 8, json!({ "type": "linear" })));
    assert!(
        e.starts_with("model.layers[8] (linear) has no `out`; only the model's last"),
        "{e}"
    );
    // `classes` must agree with an explicit last width.
    let mut fields = with_layer(issue_cnn(), 11, json!({ "type": "linear", "out": 5 }));
    let e = error(fields.clone());
    assert_eq!(
        e,
        "model.classes = 10, but the last layer, model.layers[11] (linear), gives 5 outputs"
    );
    fields.as_object_mut().unwrap().remove("classes");
    assert_eq!(plan(fields).unwrap().outputs, 5);
}

/// A small ResNet on `[3, 16, 16]`: a stem, an identity block, a downsampling block with a
/// projection shortcut, global pooling and the classifier.
fn small_resnet() -> Value {
    let conv = |out: usize, stride: usize| {
        json!({ "type": "conv2d", "out_channels": out, "kernel": 3, "stride": stride,
                "padding": 1, "bias": false })
    };
    json!({
        "input": [3, 16, 16],
        "classes": 4,
        "layers": [
            conv(8, 1), { "type": "batch_norm" }, { "type": "relu" },
            { "type": "residual", "layers": [
                conv(8, 1), { "type": "batch_norm" }, { "type": "relu" },
                conv(8, 1), { "type": "batch_norm" } ] },
            { "type": "relu" },
            { "type": "residual",
              "layers": [ conv(16, 2), { "type": "batch_norm" }, { "type": "relu" },
                          conv(16, 1), { "type": "batch_norm" } ],
              "shortcut": [ { "type": "conv2d", "out_channels": 16, "kernel": 1, "stride": 2,
                              "bias": false }, { "type": "batch_norm" } ] },
            { "type": "relu" },
            { "type": "global_avg_pool2d" },
            { "type": "linear" },
        ],
    })
}

#[test]
fn a_small_resnet_infers_its_blocks_and_names_their_parameters() {
    let p = plan(small_resnet()).unwrap();
    assert_eq!(p.layers[3].output, [8, 16, 16]);
    assert_eq!(p.layers[5].output, [16, 8, 8]);
    assert_eq!(p.layers[7].output, [16]);
    assert_eq!(p.outputs, 4);
    // The second block: 8→16 3×3 (1,152), BN 32, 16→16 3×3 (2,304), BN 32; shortcut 8→16
    // 1×1 (128), BN 32.
    assert_eq!(p.layers[5].params, 1_152 + 32 + 2_304 + 32 + 128 + 32);
    assert_eq!(p.layers[5].buffers, 3 * 32);
    let model = Model::build(
        &spec(small_resnet()),
        &ModelRegistry::default(),
        1,
        Device::Cpu,
    )
    .unwrap();
    for name in [
        "layers.3.layers.0.weight",
        "layers.5.layers.4.weight",
        "layers.5.shortcut.0.weight",
        "layers.8.weight",
    ] {
        assert!(model.params().get(name).is_some(), "{name}");
    }
    assert!(
        model
            .params()
            .get_buffer("layers.5.shortcut.1.running_var")
            .is_some()
    );
    assert!(
        model.params().get("layers.0.bias").is_none(),
        "bias = false"
    );
    let s = model.summary();
    assert_eq!(s.trainable, model.params().numel() as u64);
    assert_eq!(s.non_trainable, model.params().buffer_numel() as u64);
    let nested = s
        .rows
        .iter()
        .find(|r| r.name == "layers.5.shortcut.0")
        .unwrap();
    assert_eq!((nested.depth, nested.params), (1, 128));
    let x = Tensor::uniform(
        &[2, 3, 16, 16],
        -1.0,
        1.0,
        &mut rng::seeded(2, 0),
        Device::Cpu,
    );
    let mut r = rng::seeded(1, rng::streams::DROPOUT);
    let y = model.forward(&x.unwrap(), true, &mut r).unwrap();
    assert_eq!(y.shape(), [2, 4]);
}

#[test]
fn a_block_that_changes_shape_needs_a_shortcut() {
    let mut fields = small_resnet();
    fields["layers"][5]
        .as_object_mut()
        .unwrap()
        .remove("shortcut");
    let e = error(fields);
    assert!(
        e.starts_with(
            "model.layers[5] (residual) adds its layers' output and its input, but its layers \
             give [n, 16, 8, 8] and its input is [n, 8, 16, 16]"
        ),
        "{e}"
    );
    let mut fields = small_resnet();
    fields["layers"][5]["layers"][3]["groups"] = json!(3);
    let e = error(fields);
    assert!(
        e.starts_with("model.layers[5].layers[3] (conv2d) has groups = 3"),
        "{e}"
    );
}

#[test]
fn same_padding_keeps_the_size_at_stride_one_only() {
    let fields = |stride: usize, kernel: usize| {
        json!({ "input": [2, 9, 9], "classes": 2, "layers": [
            { "type": "conv2d", "out_channels": 4, "kernel": kernel, "padding": "same",
              "stride": stride, "dilation": 2 },
            { "type": "flatten" }, { "type": "linear" } ] })
    };
    assert_eq!(plan(fields(1, 3)).unwrap().layers[0].output, [4, 9, 9]);
    assert!(error(fields(2, 3)).contains("\"same\" needs stride 1"));
    // dilation 2 makes any kernel's span even: 2·(4 − 1) = 6 is fine too.
    assert_eq!(plan(fields(1, 4)).unwrap().layers[0].output, [4, 9, 9]);
}

#[test]
fn sizes_are_bounded_before_anything_is_allocated() {
    let e = error(json!({ "input": [4], "layers": [
        { "type": "linear", "out": 1 << 24 }, { "type": "linear", "out": 1 << 20 } ] }));
    assert!(e.contains("more than the 2^31 ringflow builds"), "{e}");
    let e = error(json!({ "input": [4], "layers": [ { "type": "linear", "out": (1u64 << 40) } ] }));
    assert!(
        e.starts_with("model.layers[0] (linear) has out = 1099511627776; it must be between"),
        "{e}"
    );
    let e = error(json!({ "input": [0, 3], "layers": [ { "type": "flatten" } ] }));
    assert!(
        e.starts_with("model.input must be the shape of one example"),
        "{e}"
    );
    let e = error(json!({ "input": [8192, 8192, 64], "layers": [ { "type": "flatten" } ] }));
    assert!(
        e.starts_with("model.input must be the shape of one example"),
        "{e}"
    );
}

type Fact = std::result::Result<usize, crate::nn::UnknownFact>;

fn facts(shape: Option<Vec<usize>>, width: Fact, outputs: Fact) -> DataFacts {
    DataFacts {
        example_shape: shape,
        example_shape_from: "data.shape".into(),
        feature_width: width,
        outputs,
        sequence: None,
    }
}

#[test]
fn resolution_fills_in_input_and_classes_from_the_data() {
    let mut fields = issue_cnn();
    let map = fields.as_object_mut().unwrap();
    map.remove("input");
    map.remove("classes");
    let bare = spec(fields);
    let full = SequentialBuilder
        .resolve(&bare, &facts(Some(vec![1, 28, 28]), Ok(784), Ok(10)))
        .unwrap();
    assert_eq!(full, spec(issue_cnn()));
    // Without data.shape, the feature width is the input; a declared shape must agree.
    let flat = SequentialBuilder
        .resolve(
            &spec(json!({ "layers": [ { "type": "linear" } ] })),
            &facts(None, Ok(12), Ok(3)),
        )
        .unwrap();
    assert_eq!(flat.params["input"], json!([12]));
    assert_eq!(flat.params["classes"], json!(3));
    let e = SequentialBuilder
        .resolve(
            &spec(issue_cnn()),
            &facts(Some(vec![28, 28, 1]), Ok(784), Ok(10)),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("model.input = [1, 28, 28] but the data's examples have shape [28, 28, 1]"),
        "{e}"
    );
    let e = SequentialBuilder
        .resolve(
            &bare,
            &facts(
                Some(vec![1, 28, 28]),
                Ok(784),
                Err("the label is a mystery".into()),
            ),
        )
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "model.classes is not set and the label is a mystery: set model.classes to the number \
         of classes (or give the last linear layer its `out`)"
    );
    let e = SequentialBuilder
        .resolve(
            &bare,
            &facts(None, Err("the width is unknown".into()), Ok(10)),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("model.input is not set and the width is unknown: set data.shape"),
        "{e}"
    );
    // Resolution checks the completed model: a bad layer is reported here.
    let e = SequentialBuilder
        .resolve(&bare, &facts(Some(vec![784]), Ok(784), Ok(10)))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("model.layers[0] (conv2d) needs an image input"),
        "{e}"
    );
}

/// Eight 8×8 one-channel images per class: class 0 bright in the top half, class 1 in the
/// bottom half, with noise.
fn halves(n: usize) -> (Tensor, Tensor) {
    let mut r = rng::seeded(9, 0);
    let noise = Tensor::uniform(&[n, 1, 8, 8], -0.5, 0.5, &mut r, Device::Cpu)
        .unwrap()
        .to_vec();
    let mut x = Vec::with_capacity(n * 64);
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let class = i % 2;
        for cell in 0..64 {
            let top = cell < 32;
            let bright = (class == 0) == top;
            x.push(if bright { 1.0 } else { 0.0 } + noise[i * 64 + cell]);
        }
        y.push(class as f32);
    }
    (
        Tensor::from_vec(x, &[n, 1, 8, 8], Device::Cpu).unwrap(),
        Tensor::from_vec(y, &[n], Device::Cpu).unwrap(),
    )
}

#[test]
fn a_sequential_cnn_learns_a_tiny_image_task() {
    let fields = json!({ "input": [1, 8, 8], "classes": 2, "layers": [
        { "type": "conv2d", "out_channels": 4, "kernel": 3, "padding": 1 },
        { "type": "batch_norm" }, { "type": "relu" }, { "type": "max_pool2d", "kernel": 2 },
        { "type": "flatten" }, { "type": "linear" } ] });
    let model = Model::build(&spec(fields), &ModelRegistry::default(), 5, Device::Cpu).unwrap();
    let mut opt = crate::optim::Optimizer::new(
        crate::optim::OptimizerSpec::Adam {
            lr: 0.02,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            groups: Vec::new(),
        },
        model.params(),
    )
    .unwrap();
    let (x, y) = halves(32);
    let mut r = rng::seeded(1, rng::streams::DROPOUT);
    let mut losses = Vec::new();
    let mut grads = crate::GradStore::new();
    for _ in 0..15 {
        grads.zero();
        let l = loss::cross_entropy(&model.forward(&x, true, &mut r).unwrap(), &y).unwrap();
        losses.push(l.item().unwrap());
        l.backward_into(&mut grads).unwrap();
        opt.step(0.02, &mut grads).unwrap();
    }
    assert!(
        losses[14] < 0.5 * losses[0],
        "the loss did not fall: {losses:?}"
    );
    // Evaluation with the running statistics classifies the training images too.
    let logits = crate::no_grad(|| model.forward(&x, false, &mut r))
        .unwrap()
        .to_vec();
    let correct = logits
        .chunks(2)
        .enumerate()
        .filter(|(i, l)| (l[1] > l[0]) == (i % 2 == 1))
        .count();
    assert!(correct >= 28, "{correct} of 32 right in evaluation");
}

#[test]
fn the_footprint_counts_kept_outputs_and_the_unfolded_input() {
    let p = plan(json!({ "input": [1, 4, 4], "classes": 3, "layers": [
        { "type": "conv2d", "out_channels": 2, "kernel": 3, "padding": 1 },
        { "type": "max_pool2d", "kernel": 2 }, { "type": "flatten" }, { "type": "linear" } ] }))
    .unwrap();
    let f = p.footprint();
    assert_eq!(f.parameters, 2 * 9 + 2 + 8 * 3 + 3);
    // Kept: conv 32, max pool 8 and its argmax 8, flatten 8, linear 3; plus the input 16, the
    // loss's 3, gradients of two of the widest outputs (2 × 32) and the conv's unfolded input
    // (1·3·3 per output position, 16 positions).
    assert_eq!(f.activations_per_row, 16 + (32 + 16 + 8 + 3) + 3 + 64 + 144);
    // The input, the widest consecutive pair (16 + 32) and the unfolded input.
    assert_eq!(f.inference_per_row, 16 + 48 + 144);
}

#[test]
fn a_spec_made_in_rust_reads_back_as_itself() {
    for fields in [issue_cnn(), small_resnet()] {
        let seq = SequentialSpec::from_spec(&spec(fields)).unwrap();
        let again = SequentialSpec::from_spec(&seq.to_model_spec()).unwrap();
        assert_eq!(again, seq);
    }
    let same = json!({ "input": [1, 5, 5], "layers": [
        { "type": "conv2d", "out_channels": 2, "kernel": [3, 1], "padding": "same" },
        { "type": "avg_pool2d", "kernel": 2, "stride": [1, 2] },
        { "type": "flatten" }, { "type": "linear", "out": 2 } ] });
    let seq = SequentialSpec::from_spec(&spec(same)).unwrap();
    assert_eq!(
        SequentialSpec::from_spec(&seq.to_model_spec()).unwrap(),
        seq
    );
    assert_eq!(seq.plan().unwrap().layers[1].output, [2, 4, 2]);
}

/// Values in halves from −2.5 to 1.5: windows that tie, that are all negative or all zero.
fn halves_with_ties(n: usize, seed: u64) -> Vec<f32> {
    use rand::RngExt;
    let mut r = rng::seeded(seed, 0);
    (0..n)
        .map(|_| (r.random::<f32>() * 8.0 - 5.0).round() / 2.0)
        .collect()
}

/// What the builder relies on to build a ReLU followed by max pooling as the pooling followed
/// by the ReLU: both orders give the same values and the same gradient, with ties, windows
/// without a positive cell, padding and overlapping windows.
#[test]
fn max_pooling_and_relu_commute_in_values_and_gradients() {
    use crate::Pool2dOptions;
    let overlapping = Pool2dOptions {
        kernel: [3, 3],
        stride: Some([1, 1]),
        padding: [1, 1],
    };
    for opts in [Pool2dOptions::square(2), overlapping] {
        let x = halves_with_ties(2 * 3 * 6 * 6, 11);
        let run = |pool_first: bool| {
            let x = Tensor::from_vec(x.clone(), &[2, 3, 6, 6], Device::Cpu)?.into_parameter()?;
            let y = if pool_first {
                x.max_pool2d(opts)?.relu()?
            } else {
                x.relu()?.max_pool2d(opts)?
            };
            // A weighted sum, so that every output's gradient differs.
            let weights: Vec<f32> = (0..y.numel()).map(|i| 1.0 + i as f32 / 8.0).collect();
            let weights = Tensor::from_vec(weights, y.shape(), Device::Cpu)?;
            let grads = y.mul(&weights)?.sum_all()?.backward()?;
            let grad = grads.get(&x).expect("x has a gradient").to_vec();
            Ok::<_, crate::MlError>((y.to_vec(), grad))
        };
        let (written, built) = (run(false).unwrap(), run(true).unwrap());
        assert_eq!(written.0, built.0, "values, {opts:?}");
        assert_eq!(written.1, built.1, "gradients, {opts:?}");
        assert!(written.1.iter().any(|&g| g != 0.0) && written.0.contains(&0.0));
    }
}

/// A ReLU before average pooling stays where it is written (the two do not commute), and a
/// ReLU before max pooling gives the model the written order's outputs.
#[test]
fn only_max_pooling_trades_places_with_a_relu() {
    let output = |first: Value, second: Value| {
        let layers = json!([first, second, { "type": "flatten" }, { "type": "linear" }]);
        let fields = json!({ "input": [2, 4, 4], "classes": 3, "layers": layers });
        let model = Model::build(&spec(fields), &ModelRegistry::default(), 5, Device::Cpu).unwrap();
        let x = Tensor::from_vec(halves_with_ties(3 * 32, 12), &[3, 2, 4, 4], Device::Cpu);
        let mut r = rng::seeded(1, 0);
        model.forward(&x.unwrap(), true, &mut r).unwrap().to_vec()
    };
    let relu = json!({ "type": "relu" });
    let (max, avg) = (
        json!({ "type": "max_pool2d", "kernel": 2 }),
        json!({ "type": "avg_pool2d", "kernel": 2 }),
    );
    assert_eq!(output(relu.clone(), max.clone()), output(max, relu.clone()));
    assert_ne!(
        output(relu.clone(), avg.clone()),
        output(avg, relu),
        "average pooling traded places with the ReLU"
    );
}

#[test]
fn the_two_gelus_are_layers_of_their_own_with_the_same_initialization() {
    let with = |activation: &str| {
        let fields = json!({
            "input": [4],
            "classes": 3,
            "layers": [
                { "type": "linear", "out": 8 },
                { "type": activation },
                { "type": "linear" },
            ],
        });
        let planned = plan(fields.clone()).unwrap();
        assert_eq!(planned.layers[1].kind, activation);
        Model::build(&spec(fields), &ModelRegistry::default(), 5, Device::Cpu).unwrap()
    };
    let (tanh_form, exact) = (with("gelu"), with("gelu_exact"));
    // Both start from He initialization: the same seed gives the same weights.
    let w = |m: &Model| m.params().get("layers.0.weight").unwrap().to_vec();
    assert_eq!(w(&tanh_form), w(&exact));
    let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.7 - 4.0).collect();
    let x = Tensor::from_vec(values, &[3, 4], Device::Cpu).unwrap();
    let mut r = rng::seeded(1, rng::streams::DROPOUT);
    let a = tanh_form.forward(&x, false, &mut r).unwrap().to_vec();
    let b = exact.forward(&x, false, &mut r).unwrap().to_vec();
    let gap = a
        .iter()
        .zip(&b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(gap > 0.0 && gap < 0.05, "the two GELUs differ by {gap}");
}
