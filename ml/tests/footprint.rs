//! A model's memory footprint ([`ModelFootprint`], what the driver's memory estimate counts for
//! activations) against the heap a real training step takes, for a grid of sequence models:
//! recurrent stacks of each kind, direction and depth, attention and a transformer encoder, at
//! several lengths. The heap is counted by this binary's allocator, so the figure is exact and
//! the same on every machine; the estimate must be within 1.5× of it either way.
//!
//! A property test draws models (sequence models of every kind, and MLPs) at random sizes and
//! holds each to the same bound: a few cases in `cargo test`, as many as `PROPTEST_CASES` says
//! under `testing/fuzz-long.sh`, whose long-fuzz switch (`RINGFLOW_LONG_FUZZ`) also runs the
//! grid at longer lengths and wider layers.
//!
//! Set `RINGFLOW_FOOTPRINT_TABLE=1` to print the grid's table (estimate against peak).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use ringflow_ml::nn::{DataFacts, Model, ModelRegistry, ModelSpec, SequenceFacts};
use ringflow_ml::optim::{Optimizer, OptimizerSpec};
use ringflow_ml::{Device, GradStore, Tensor, rng};
use serde_json::{Value, json};

/// The system allocator, counting the bytes in use and their peak.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as the caller gave it.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = IN_USE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: forwarded as the caller gave it.
        unsafe { System.dealloc(p, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as the caller gave it.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            let now = IN_USE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as the caller gave it.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
            let now = IN_USE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Classes of the tagger's labels.
const CLASSES: usize = 5;
/// Distinct token ids.
const VOCAB: usize = 50;

/// One model of the grid: its layers between the embedding and the last linear layer.
struct Case {
    name: String,
    layers: Vec<Value>,
}

fn cases(width: usize) -> Vec<Case> {
    let recurrent = |kind: &str, bidirectional: bool, layers: usize| Case {
        name: format!("{}{kind}×{layers}", if bidirectional { "bi" } else { "" }),
        layers: vec![json!({
            "type": kind, "hidden": width, "bidirectional": bidirectional, "layers": layers,
        })],
    };
    vec![
        recurrent("lstm", false, 1),
        recurrent("lstm", true, 1),
        recurrent("lstm", true, 2),
        recurrent("gru", false, 1),
        recurrent("gru", true, 2),
        Case {
            name: "attention".into(),
            layers: vec![json!({ "type": "multi_head_attention", "heads": 4 })],
        },
        Case {
            name: "transformer".into(),
            layers: vec![json!({ "type": "transformer_encoder", "heads": 4, "ff": 2 * width })],
        },
    ]
}

/// The model registry with the built-in kinds.
fn registry() -> &'static ModelRegistry {
    static REGISTRY: std::sync::OnceLock<ModelRegistry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(ModelRegistry::default)
}

/// A tagger of `middle` layers over sequences of `steps` tokens, resolved as the driver does.
fn tagger(middle: &[Value], width: usize, steps: usize) -> (ModelSpec, &'static ModelRegistry) {
    let registry = registry();
    let mut layers = vec![json!({ "type": "embedding", "dim": width })];
    layers.extend(middle.iter().cloned());
    layers.push(json!({ "type": "linear" }));
    let spec = ModelSpec::new("sequential", json!({ "layers": layers })).unwrap();
    let facts = DataFacts {
        example_shape: None,
        example_shape_from: String::new(),
        feature_width: Err("the tokens are a sequence".into()),
        outputs: Ok(CLASSES),
        sequence: Some(SequenceFacts {
            max_length: steps,
            vocab: Some(VOCAB),
            per_step: true,
        }),
    };
    let builder = registry.builder(&spec).unwrap();
    (builder.resolve(&spec, &facts).unwrap(), registry)
}

/// What a model reads: `n` sequences of `steps` token ids (every step real, a tag each), or
/// `n` rows of `features` values (one class each).
#[derive(Clone, Copy, Debug)]
enum Batch {
    Tokens { n: usize, steps: usize },
    Rows { n: usize, features: usize },
}

impl Batch {
    fn rows(self) -> usize {
        match self {
            Batch::Tokens { n, .. } | Batch::Rows { n, .. } => n,
        }
    }
}

/// The heap one training step of `model` takes above what it holds before the step (the
/// weights, their gradients and the optimizer's state, counted apart by the estimate).
fn step_peak(model: &Model, opt: &mut Optimizer, batch: Batch) -> usize {
    use rand::RngExt;
    let mut data = rng::seeded(7, 0);
    let (shape, labels, lengths) = match batch {
        Batch::Tokens { n, steps } => (vec![n, steps], n * steps, Some(vec![steps; n])),
        Batch::Rows { n, features } => (vec![n, features], n, None),
    };
    let values: Vec<f32> = (0..shape[0] * shape[1])
        .map(|_| match batch {
            Batch::Tokens { .. } => data.random_range(1..VOCAB) as f32,
            Batch::Rows { .. } => data.random_range(-1.0..1.0),
        })
        .collect();
    let y: Vec<f32> = (0..labels).map(|i| (i % CLASSES) as f32).collect();
    let mut peak = 0;
    let mut grads = GradStore::new();
    // The first step allocates the gradients and the optimizer's state; the second is measured.
    for measured in [false, true] {
        let x = Tensor::from_vec(values.clone(), &shape, Device::Cpu).unwrap();
        let y = Tensor::from_vec(y.clone(), &[labels], Device::Cpu).unwrap();
        grads.zero();
        let before = IN_USE.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let mut r = rng::seeded(0, 0);
        let out = match &lengths {
            Some(lengths) => model.forward_sequences(&x, lengths, true, &mut r),
            None => model.forward(&x, true, &mut r),
        };
        let flat = out.unwrap().reshape(&[labels, CLASSES]).unwrap();
        let loss = ringflow_ml::loss::cross_entropy(&flat, &y).unwrap();
        loss.backward_into(&mut grads).unwrap();
        drop((loss, flat, x, y));
        opt.step(0.01, &mut grads).unwrap();
        if measured {
            peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
        }
    }
    peak
}

/// The estimate of `spec`'s activations for `batch` (the footprint per row × rows, and per
/// batch, in bytes)
/// and the measured peak of a training step.
fn estimate_and_peak(spec: &ModelSpec, registry: &ModelRegistry, batch: Batch) -> (f64, f64) {
    let footprint = registry
        .builder(spec)
        .unwrap()
        .footprint(spec)
        .unwrap()
        .unwrap();
    let values = footprint.activations_per_row as f64 * batch.rows() as f64
        + footprint.activations_per_batch as f64;
    let estimate = values * 4.0;
    let model = Model::build(spec, registry, 3, Device::Cpu).unwrap();
    let adam = OptimizerSpec::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        groups: Vec::new(),
    };
    let mut opt = Optimizer::new(adam, model.params()).unwrap();
    (estimate, step_peak(&model, &mut opt, batch) as f64)
}

/// Whether `estimate` is within 1.5× of `peak`, either way, or within 1 MiB of it: a step's
/// graph has fixed costs of its own (a few KiB per op, whatever the batch), which the
/// estimate's runtime share holds and which only a tiny model's activations do not dwarf.
fn within(estimate: f64, peak: f64) -> bool {
    (1.0 / 1.5..=1.5).contains(&(estimate / peak)) || (estimate - peak).abs() < 1048576.0
}

/// The grid: each case at each length, the estimate's activations for a batch against the
/// measured peak of a step; then random models ([`random_models_are_within_bounds`]). One
/// test, so that no other test allocates while a step is measured.
#[test]
fn fuzz_footprint_within_1_5x_of_a_steps_peak() {
    let long = std::env::var_os("RINGFLOW_LONG_FUZZ").is_some();
    let (widths, lengths): (&[usize], &[usize]) = if long {
        (&[32, 128], &[16, 128, 512, 1024])
    } else {
        (&[32], &[16, 128, 512])
    };
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for &width in widths {
        for case in cases(width) {
            for (&steps, n) in lengths.iter().flat_map(|s| [(s, 1), (s, 8)]) {
                let (spec, registry) = tagger(&case.layers, width, steps);
                let (estimate, peak) =
                    estimate_and_peak(&spec, registry, Batch::Tokens { n, steps });
                let row = format!(
                    "{:<14} width {width:>4} T {steps:>5} n {n}: estimate {:>9.2} MiB, peak {:>9.2} \
                     MiB, estimate/peak {:.2}",
                    case.name,
                    estimate / 1048576.0,
                    peak / 1048576.0,
                    estimate / peak
                );
                if !within(estimate, peak) {
                    failures.push(row.clone());
                }
                rows.push(row);
            }
        }
    }
    if std::env::var_os("RINGFLOW_FOOTPRINT_TABLE").is_some() {
        println!("{}", rows.join("\n"));
    }
    assert!(
        failures.is_empty(),
        "the footprint is not within 1.5× of the peak:\n{}\n\nall:\n{}",
        failures.join("\n"),
        rows.join("\n")
    );
    random_models_are_within_bounds();
}

/// A random model: a sequence model of a random kind, or an MLP, and its batch.
fn models() -> impl Strategy<Value = (Vec<Value>, usize, Batch)> {
    let layer = prop_oneof![
        (any::<bool>(), any::<bool>(), 1..3usize).prop_map(|(lstm, bi, layers)| {
            let kind = if lstm { "lstm" } else { "gru" };
            json!({ "type": kind, "bidirectional": bi, "layers": layers })
        }),
        Just(json!({ "type": "multi_head_attention", "heads": 2 })),
        Just(json!({ "type": "transformer_encoder", "heads": 2 })),
        Just(json!({ "type": "mlp" })),
    ];
    (layer, 2..24usize, 4..160usize, 1..12usize).prop_map(|(layer, half, steps, n)| {
        let width = 2 * half;
        let batch = if layer["type"] == "mlp" {
            Batch::Rows { n, features: steps }
        } else {
            Batch::Tokens { n, steps }
        };
        (vec![layer], width, batch)
    })
}

/// Random models at random sizes (as many as `PROPTEST_CASES`, 6 by default): each footprint
/// within 1.5× of a step's peak. Run from the grid's test, one measurement after the other.
fn random_models_are_within_bounds() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&models(), |(layers, width, batch)| {
        let (spec, registry) = match batch {
            Batch::Rows { features, .. } => {
                let spec = json!({ "layers": [features, 4 * width, width, CLASSES] });
                (ModelSpec::new("mlp", spec).unwrap(), registry())
            }
            Batch::Tokens { steps, .. } => {
                let mut layers = layers.clone();
                let layer = &mut layers[0];
                match layer["type"].as_str() {
                    Some("lstm" | "gru") => layer["hidden"] = json!(width),
                    Some("transformer_encoder") => layer["ff"] = json!(2 * width),
                    _ => {}
                }
                tagger(&layers, width, steps)
            }
        };
        let (estimate, peak) = estimate_and_peak(&spec, registry, batch);
        prop_assert!(
            within(estimate, peak),
            "{layers:?} width {width} {batch:?}: estimate {estimate} bytes, peak {peak}"
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
