//! Sequence models in the sequential spec: resolution from the data's sequence facts, shape
//! inference of recurrent layers and pooling, parameter counts against PyTorch's, and a tagger
//! that trains on padded batches.

use serde_json::{Value, json};

use super::*;
use crate::nn::{Model, ModelRegistry, SequenceFacts};
use crate::{Device, Tensor, rng};

fn spec(fields: Value) -> ModelSpec {
    ModelSpec::new("sequential", fields).unwrap()
}

fn facts(vocab: Option<usize>, per_step: bool, classes: usize) -> DataFacts {
    DataFacts {
        example_shape: None,
        example_shape_from: String::new(),
        feature_width: Err("the tokens are a sequence".into()),
        outputs: Ok(classes),
        sequence: Some(SequenceFacts {
            max_length: 40,
            vocab,
            per_step,
        }),
    }
}

/// The tagger: embedding 64, BiLSTM 128, linear.
fn tagger() -> Value {
    json!({ "layers": [
        { "type": "embedding", "dim": 64 },
        { "type": "lstm", "hidden": 128, "bidirectional": true },
        { "type": "linear" },
    ]})
}

/// The plan of the model `fields` once resolved from `facts`.
fn resolve(fields: Value, facts: &DataFacts) -> crate::error::Result<SequentialPlan> {
    let spec = SequentialBuilder.resolve(&spec(fields), facts)?;
    SequentialSpec::from_spec(&spec)?.plan()
}

#[test]
fn the_tagger_takes_its_vocabulary_length_and_classes_from_the_data() {
    let plan = resolve(tagger(), &facts(Some(1000), true, 9)).unwrap();
    assert_eq!(plan.input, [40]);
    assert_eq!(plan.sequence, Some(SequenceOutput::PerStep));
    assert_eq!(plan.outputs, 9);
    let shapes: Vec<&[usize]> = plan.layers.iter().map(|l| l.output.as_slice()).collect();
    assert_eq!(shapes, [&[40, 64][..], &[40, 256], &[40, 9]]);
    // PyTorch: nn.Embedding(1000, 64) 64,000; nn.LSTM(64, 128, bidirectional=True) has
    // 2·(4·128·(64 + 128) + 2·4·128) = 198,656 with two biases per gate, ringflow one:
    // 2·4·128·(64 + 128 + 1) = 197,632; nn.Linear(256, 9) 2,313.
    let params: Vec<u64> = plan.layers.iter().map(|l| l.params).collect();
    assert_eq!(params, [64_000, 197_632, 2_313]);
}

#[test]
fn gru_stacks_count_every_layer_and_direction() {
    let fields = json!({ "layers": [
        { "type": "embedding", "dim": 8 },
        { "type": "gru", "hidden": 5, "layers": 2, "dropout": 0.1 },
        { "type": "sequence_pool", "reduce": "max" },
        { "type": "linear" },
    ]});
    let plan = resolve(fields, &facts(Some(10), false, 2)).unwrap();
    assert_eq!(plan.sequence, Some(SequenceOutput::PerSequence));
    // Layer 0: 3·5·(8 + 5 + 2) = 225; layer 1: 3·5·(5 + 5 + 2) = 180.
    assert_eq!(plan.layers[1].params, 405);
    assert_eq!(plan.layers[2].output, [5]);
}

#[test]
fn a_model_that_puts_its_outputs_elsewhere_than_the_labels_is_refused() {
    let e = resolve(tagger(), &facts(Some(10), false, 3))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("one per sequence") && e.contains("sequence_pool"),
        "{e}"
    );
    let pooled = json!({ "layers": [
        { "type": "embedding", "dim": 8 },
        { "type": "sequence_pool" },
        { "type": "linear" },
    ]});
    let e = resolve(pooled, &facts(Some(10), true, 3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("one per token"), "{e}");
    let e = resolve(tagger(), &facts(None, true, 3))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.layers[0] (embedding) has no `vocab`"),
        "{e}"
    );
    let flat = json!({ "layers": [{ "type": "lstm", "hidden": 4 }] });
    let e = resolve(flat, &facts(Some(10), true, 3))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.layers[0] (lstm) needs a sequence input [n, steps, features]"),
        "{e}"
    );
    let e = resolve(
        json!({ "input": [7], "layers": [{ "type": "linear" }] }),
        &facts(Some(10), true, 3),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("data.max_length = 40"), "{e}");
}

#[test]
fn a_tagger_learns_from_padded_batches() {
    // Tag each token 1 when the token before it (in its own sequence) was 2: only a layer
    // that carries state along the sequence can do it.
    let resolved = SequentialBuilder
        .resolve(
            &spec(json!({ "layers": [
                { "type": "embedding", "dim": 8 },
                { "type": "lstm", "hidden": 16 },
                { "type": "linear" },
            ]})),
            &facts(Some(4), true, 2),
        )
        .unwrap();
    let model = Model::build(&resolved, &ModelRegistry::default(), 3, Device::Cpu).unwrap();
    let adam = crate::optim::OptimizerSpec::Adam {
        lr: 0.05,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        groups: Vec::new(),
    };
    let mut opt = crate::optim::Optimizer::new(adam, model.params()).unwrap();
    let mut data = rng::seeded(5, 0);
    let mut last = f32::INFINITY;
    let mut grads = crate::GradStore::new();
    for _ in 0..150 {
        let (ids, lengths, rows, labels) = padded_batch(&mut data);
        let x = Tensor::from_vec(ids, &[4, 6], Device::Cpu).unwrap();
        grads.zero();
        let mut r = rng::seeded(0, 0);
        let logits = model.forward_sequences(&x, &lengths, true, &mut r).unwrap();
        let real = Tensor::from_vec(rows, &[labels.len()], Device::Cpu).unwrap();
        let picked = logits
            .reshape(&[24, 2])
            .unwrap()
            .index_select(&real)
            .unwrap();
        let y = Tensor::from_vec(labels, &[real.numel()], Device::Cpu).unwrap();
        let loss = crate::loss::cross_entropy(&picked, &y).unwrap();
        loss.backward_into(&mut grads).unwrap();
        opt.step(0.05, &mut grads).unwrap();
        last = loss.item().unwrap();
    }
    assert!(last < 0.05, "the tagger's loss is still {last}");
}

/// Four sequences of lengths 6, 3, 5, 1 over ids 1..=3, padded with 0 to six steps: the ids,
/// the lengths, the flat indices of the real steps, and their labels.
fn padded_batch(r: &mut rng::Rng) -> (Vec<f32>, Vec<usize>, Vec<f32>, Vec<f32>) {
    use rand::RngExt;
    let lengths = vec![6, 3, 5, 1];
    let (mut ids, mut rows, mut labels) = (vec![0.0; 24], Vec::new(), Vec::new());
    for (s, &len) in lengths.iter().enumerate() {
        for t in 0..len {
            let id = r.random_range(1..4) as f32;
            ids[s * 6 + t] = id;
            rows.push((s * 6 + t) as f32);
            let after_two = t > 0 && ids[s * 6 + t - 1] == 2.0;
            labels.push(f32::from(u8::from(after_two)));
        }
    }
    (ids, lengths, rows, labels)
}

#[test]
fn a_transformer_tagger_counts_what_pytorch_counts_and_runs_on_padded_batches() {
    let fields = json!({ "layers": [
        { "type": "embedding", "dim": 64 },
        { "type": "position_embedding", "kind": "learned" },
        { "type": "transformer_encoder", "heads": 4, "ff": 128 },
        { "type": "linear" },
    ]});
    let plan = resolve(fields.clone(), &facts(Some(100), true, 5)).unwrap();
    let params: Vec<u64> = plan.layers.iter().map(|l| l.params).collect();
    // nn.TransformerEncoderLayer(64, 4, 128): in_proj 12,480 + out_proj 4,160 + linear1 8,320
    // + linear2 8,256 + two norms 256 = 33,472; the learned positions 40 × 64.
    assert_eq!(params, [6_400, 2_560, 33_472, 325]);
    let resolved = SequentialBuilder
        .resolve(&spec(fields), &facts(Some(100), true, 5))
        .unwrap();
    let model = Model::build(&resolved, &ModelRegistry::default(), 3, Device::Cpu).unwrap();
    let ids = Tensor::from_vec(vec![5., 6., 7., 8., 9., 0.], &[2, 3], Device::Cpu).unwrap();
    let mut r = rng::seeded(0, 0);
    let out = model
        .forward_sequences(&ids, &[3, 2], false, &mut r)
        .unwrap();
    assert_eq!(out.shape(), [2, 3, 5]);
    let e = resolve(
        json!({ "layers": [
            { "type": "embedding", "dim": 6 },
            { "type": "multi_head_attention", "heads": 4 },
            { "type": "linear" },
        ]}),
        &facts(Some(100), true, 5),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("model.layers[1] (multi_head_attention) has heads = 4, which must divide the 6"),
        "{e}"
    );
}
