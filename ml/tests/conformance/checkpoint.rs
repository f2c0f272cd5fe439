//! Checkpoints: an interrupted and resumed run ends bit for bit where an uninterrupted one
//! does, and damaged files are refused with an error naming them.

use std::path::Path;

use ringflow_ml::checkpoint::{self, TrainingState};
use ringflow_ml::nn::{Model, ModelRegistry, ModelSpec};
use ringflow_ml::optim::{Optimizer, OptimizerSpec};
use ringflow_ml::rng::{self, Rng};
use ringflow_ml::{Device, GradStore, Tensor, loss};
use serde_json::json;

use crate::helpers::*;

const STEPS_PER_EPOCH: usize = 5;
const BATCH: usize = 6;

fn spec() -> ModelSpec {
    ModelSpec::new(
        "mlp",
        json!({"layers": [4, 16, 8, 3], "activation": "relu", "dropout": 0.2}),
    )
    .expect("object")
}

fn adam() -> OptimizerSpec {
    OptimizerSpec::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 1e-4,
        groups: Vec::new(),
    }
}

/// A synthetic classification set: `[n, 4]` features and labels in `0..3`, from a seeded rng.
fn data(device: Device) -> (Tensor, Tensor) {
    let n = STEPS_PER_EPOCH * BATCH;
    let x = uniform(&[n, 4], -1.0, 1.0, 77, device);
    let labels: Vec<f32> = uniform(&[n], 0.0, 3.0, 78, device)
        .to_vec()
        .iter()
        .map(|v| v.floor())
        .collect();
    (x, tensor(&labels, &[n], device))
}

/// One epoch of mini-batch training with dropout.
fn epoch(
    model: &Model,
    opt: &mut Optimizer,
    dropout: &mut Rng,
    (x, y): &(Tensor, Tensor),
) -> TestResult {
    let params = model.params().tensors();
    let mut grads = GradStore::new();
    for s in 0..STEPS_PER_EPOCH {
        grads.zero();
        let logits = model.forward(&x.narrow(0, s * BATCH, BATCH)?, true, dropout)?;
        loss::cross_entropy(&logits, &y.narrow(0, s * BATCH, BATCH)?)?.backward_into(&mut grads)?;
        grads.clip_norm(&params, 5.0)?;
        opt.step(0.01, &mut grads)?;
    }
    Ok(())
}

fn bits(model: &Model) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    Ok(model
        .params()
        .flatten_values()?
        .iter()
        .map(|v| v.to_bits())
        .collect())
}

fn fresh(seed: u64, device: Device) -> Result<(Model, Optimizer, Rng), Box<dyn std::error::Error>> {
    let model = Model::build(&spec(), &ModelRegistry::default(), seed, device)?;
    let opt = Optimizer::new(adam(), model.params())?;
    Ok((model, opt, rng::seeded(seed, rng::streams::DROPOUT)))
}

/// Trains one epoch from seed 1 and checkpoints it into `dir`.
fn first_epoch_to(dir: &Path, device: Device) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let d = data(device);
    let (model, mut opt, mut dropout) = fresh(1, device)?;
    epoch(&model, &mut opt, &mut dropout, &d)?;
    let state = TrainingState {
        epoch: 1,
        step: STEPS_PER_EPOCH as u64,
        rng: Some(dropout),
        extra: json!({"classes": ["a", "b", "c"]}),
    };
    checkpoint::save(dir, &model, Some(&opt), &state)?;
    bits(&model)
}

fn resume_is_bit_exact(device: Device) -> TestResult {
    let d = data(device);
    // A: two epochs without interruption.
    let (a, mut opt_a, mut rng_a) = fresh(1, device)?;
    epoch(&a, &mut opt_a, &mut rng_a, &d)?;
    let after_one = bits(&a)?;
    epoch(&a, &mut opt_a, &mut rng_a, &d)?;
    let want = bits(&a)?;

    // B: one epoch, checkpoint, and a fresh process state (other seed) that resumes.
    let dir = tempfile::tempdir()?;
    ensure(
        first_epoch_to(dir.path(), device)? == after_one,
        "the first epoch is not reproducible",
    )?;
    let (b, mut opt_b, _) = fresh(99, device)?;
    ensure(bits(&b)? != after_one, "seed 99 built the trained weights")?;
    let loaded = checkpoint::load(dir.path())?;
    ensure(
        loaded.meta.epoch == 1 && loaded.meta.step == STEPS_PER_EPOCH as u64,
        "epoch and step",
    )?;
    ensure(
        loaded.meta.optimizer_steps == STEPS_PER_EPOCH as u64,
        "optimizer steps",
    )?;
    ensure(
        loaded.meta.model == spec() && loaded.meta.optimizer == Some(adam()),
        "specs",
    )?;
    ensure(
        loaded.meta.extra == json!({"classes": ["a", "b", "c"]}),
        "extra data",
    )?;
    loaded.restore_model(&b)?;
    ensure(
        bits(&b)? == after_one,
        "restore_model did not restore every bit",
    )?;
    loaded.restore_optimizer(&mut opt_b)?;
    ensure(
        opt_b.steps() == STEPS_PER_EPOCH as u64,
        "restored step count",
    )?;
    let mut rng_b = loaded
        .meta
        .rng
        .clone()
        .ok_or("the checkpoint lost the rng")?;
    epoch(&b, &mut opt_b, &mut rng_b, &d)?;
    let got = bits(&b)?;
    let differing = got.iter().zip(&want).filter(|(g, w)| g != w).count();
    ensure(
        differing == 0,
        format!(
            "{differing} of {} weights differ after resuming",
            want.len()
        ),
    )?;

    // The comparison is sensitive: resuming without the rng, or without the optimizer state,
    // ends elsewhere.
    let (c, mut opt_c, mut other_rng) = fresh(99, device)?;
    loaded.restore_model(&c)?;
    loaded.restore_optimizer(&mut opt_c)?;
    epoch(&c, &mut opt_c, &mut other_rng, &d)?;
    ensure(
        bits(&c)? != want,
        "a different dropout rng gave the same weights",
    )?;
    let (e, mut opt_e, _) = fresh(99, device)?;
    loaded.restore_model(&e)?;
    let mut rng_e = loaded.meta.rng.clone().ok_or("rng")?;
    epoch(&e, &mut opt_e, &mut rng_e, &d)?;
    ensure(
        bits(&e)? != want,
        "fresh optimizer state gave the same weights",
    )
}

fn expect_error_naming(
    result: ringflow_ml::Result<checkpoint::Loaded>,
    file: &str,
    what: &str,
) -> TestResult {
    match result {
        Ok(_) => Err(format!("{what}: the checkpoint loaded").into()),
        Err(e) => ensure(
            e.to_string().contains(file),
            format!("{what}: the error does not name {file}: {e}"),
        ),
    }
}

fn damaged_files_are_refused(device: Device) -> TestResult {
    let dir = tempfile::tempdir()?;
    first_epoch_to(dir.path(), device)?;
    checkpoint::load(dir.path())?;
    let meta = checkpoint::load(dir.path())?.meta;
    let files = [meta.model_file(), meta.optimizer_file()];
    for file in files.into_iter().map(|f| f.expect("both files were saved")) {
        let path = dir.path().join(file);
        let original = std::fs::read(&path)?;
        // One flipped byte in the tensor data (past the header), then one in the header.
        for at in [original.len() - 3, 10] {
            let mut flipped = original.clone();
            flipped[at] ^= 0x01;
            std::fs::write(&path, &flipped)?;
            expect_error_naming(
                checkpoint::load(dir.path()),
                file,
                &format!("{file} with byte {at} flipped"),
            )?;
        }
        std::fs::write(&path, &original[..original.len() / 2])?;
        expect_error_naming(
            checkpoint::load(dir.path()),
            file,
            &format!("truncated {file}"),
        )?;
        std::fs::remove_file(&path)?;
        expect_error_naming(
            checkpoint::load(dir.path()),
            file,
            &format!("missing {file}"),
        )?;
        std::fs::write(&path, &original)?;
        checkpoint::load(dir.path())?;
    }
    let meta = dir.path().join("checkpoint.json");
    let json = std::fs::read(&meta)?;
    std::fs::write(&meta, &json[..json.len() / 2])?;
    expect_error_naming(
        checkpoint::load(dir.path()),
        "checkpoint.json",
        "truncated checkpoint.json",
    )?;
    std::fs::remove_file(&meta)?;
    expect_error_naming(
        checkpoint::load(dir.path()),
        "checkpoint.json",
        "missing checkpoint.json",
    )?;
    let empty = tempfile::tempdir()?;
    ensure(
        checkpoint::load(empty.path()).is_err(),
        "an empty directory loaded",
    )?;
    ensure(
        checkpoint::load(&empty.path().join("absent")).is_err(),
        "a missing directory loaded",
    )
}

fn mismatched_restores_are_errors(device: Device) -> TestResult {
    let dir = tempfile::tempdir()?;
    first_epoch_to(&dir.path().join("nested/ckpt"), device)?;
    let loaded = checkpoint::load(&dir.path().join("nested/ckpt"))?;
    let registry = ModelRegistry::default();
    let wider = Model::build(
        &ModelSpec::mlp(&[4, 17, 8, 3], "relu"),
        &registry,
        1,
        device,
    )?;
    ensure(
        loaded.restore_model(&wider).is_err(),
        "restored into a model of other shapes",
    )?;
    let shallower = Model::build(&ModelSpec::mlp(&[4, 3], "relu"), &registry, 1, device)?;
    ensure(
        loaded.restore_model(&shallower).is_err(),
        "restored into a model with fewer parameters",
    )?;
    let (model, _, _) = fresh(1, device)?;
    let mut sgd = Optimizer::new(OptimizerSpec::default(), model.params())?;
    ensure(
        loaded.restore_optimizer(&mut sgd).is_err(),
        "restored Adam state into SGD",
    )?;

    // A bare model checkpoint: loads, restores the model, has no optimizer state.
    let bare = dir.path().join("bare");
    checkpoint::save(&bare, &model, None, &TrainingState::default())?;
    let loaded = checkpoint::load(&bare)?;
    ensure(
        loaded.meta.optimizer_file().is_none(),
        "a bare checkpoint wrote optimizer state",
    )?;
    ensure(
        loaded.meta.optimizer.is_none() && loaded.meta.rng.is_none(),
        "bare metadata",
    )?;
    let (copy, mut opt, _) = fresh(5, device)?;
    loaded.restore_model(&copy)?;
    ensure(bits(&copy)? == bits(&model)?, "bare restore")?;
    ensure(
        loaded.restore_optimizer(&mut opt).is_err(),
        "restored optimizer state that was never saved",
    )?;
    // Saving again over a checkpoint replaces it and leaves no temporary files behind.
    checkpoint::save(&bare, &copy, Some(&opt), &TrainingState::default())?;
    ensure(
        checkpoint::load(&bare)?.meta.optimizer == Some(adam()),
        "overwritten checkpoint",
    )?;
    let leftovers: Vec<_> = std::fs::read_dir(&bare)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    ensure(
        leftovers.is_empty(),
        format!("temporary files left: {leftovers:?}"),
    )
}

/// A sequential model with a batch norm: parameters and two buffers.
fn batch_norm_model(seed: u64, device: Device) -> Result<Model, Box<dyn std::error::Error>> {
    let spec = ModelSpec::new(
        "sequential",
        json!({ "input": [3], "layers": [ { "type": "linear", "out": 4 },
                { "type": "batch_norm" }, { "type": "linear", "out": 2 } ] }),
    )?;
    Ok(Model::build(
        &spec,
        &ModelRegistry::default(),
        seed,
        device,
    )?)
}

fn buffer_bits(model: &Model) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    Ok(model
        .params()
        .flatten_buffers()?
        .iter()
        .map(|v| v.to_bits())
        .collect())
}

/// Builds parameters named like a batch norm's (`layers.0.weight`, `layers.0.bias`) but no
/// buffers.
struct WithoutBuffers;

impl ringflow_ml::nn::ModelBuilder for WithoutBuffers {
    fn shape(&self, _: &ModelSpec) -> ringflow_ml::Result<ringflow_ml::nn::ModelShape> {
        Ok(ringflow_ml::nn::ModelShape::flat(2, 2))
    }

    fn build(
        &self,
        _: &ModelSpec,
        b: &mut ringflow_ml::nn::ParamBuilder<'_>,
    ) -> ringflow_ml::Result<Box<dyn ringflow_ml::nn::Module>> {
        let mut scope = b.sub("layers.0");
        scope.constant("weight", &[2], 1.0)?;
        scope.constant("bias", &[2], 0.0)?;
        Ok(Box::new(ringflow_ml::nn::Flatten))
    }
}

fn buffers_are_saved_and_restored_exactly(device: Device) -> TestResult {
    let model = batch_norm_model(1, device)?;
    let x = uniform(&[5, 3], -2.0, 2.0, 11, device);
    let mut dropout = rng::seeded(1, rng::streams::DROPOUT);
    for _ in 0..3 {
        model.forward(&x, true, &mut dropout)?;
    }
    let trained = buffer_bits(&model)?;
    ensure(
        model.params().flatten_buffers()?[..4]
            .iter()
            .all(|&m| m != 0.0),
        "training moved the running means",
    )?;
    let dir = tempfile::tempdir()?;
    checkpoint::save(dir.path(), &model, None, &TrainingState::default())?;
    let copy = batch_norm_model(2, device)?;
    ensure(
        buffer_bits(&copy)? != trained,
        "a fresh model has other buffers",
    )?;
    ensure(
        copy.params().checksum()? != model.params().checksum()?,
        "the checksum differs before the restore",
    )?;
    checkpoint::load(dir.path())?.restore_model(&copy)?;
    ensure(
        buffer_bits(&copy)? == trained,
        "buffers restored bit for bit",
    )?;
    ensure(
        bits(&copy)? == bits(&model)?,
        "parameters restored bit for bit",
    )?;
    ensure(
        copy.params().checksum()? == model.params().checksum()?,
        "equal after the restore",
    )?;
    // The checksum covers buffers: replicas differing only there do not compare equal.
    copy.params()
        .get_buffer("layers.1.running_var")
        .ok_or("no running_var")?
        .copy_from_slice(&[1.0; 4])?;
    ensure(
        copy.params().checksum()? != model.params().checksum()?,
        "the checksum missed a buffer",
    )?;

    // A checkpoint without the buffers is refused, naming the missing one, and the other way
    // round the extra tensors are named.
    let mut registry = ModelRegistry::default();
    registry.register("without_buffers", WithoutBuffers);
    let spec = ModelSpec::new("without_buffers", json!({}))?;
    let bare = Model::build(&spec, &registry, 1, device)?;
    let bare_dir = tempfile::tempdir()?;
    checkpoint::save(bare_dir.path(), &bare, None, &TrainingState::default())?;
    let norm_only = ModelSpec::new(
        "sequential",
        json!({ "input": [2], "layers": [ { "type": "batch_norm" } ] }),
    )?;
    let with_buffers = Model::build(&norm_only, &registry, 1, device)?;
    let e = checkpoint::load(bare_dir.path())?
        .restore_model(&with_buffers)
        .err()
        .ok_or("restored a checkpoint without buffers")?
        .to_string();
    ensure(
        e.contains("has no buffer \"layers.0.running_mean\""),
        format!("the error does not name the buffer: {e}"),
    )?;
    let full_dir = tempfile::tempdir()?;
    checkpoint::save(
        full_dir.path(),
        &with_buffers,
        None,
        &TrainingState::default(),
    )?;
    let e = checkpoint::load(full_dir.path())?
        .restore_model(&bare)
        .err()
        .ok_or("restored extra buffers")?
        .to_string();
    ensure(
        e.contains("has tensors the model does not") && e.contains("layers.0.running_var"),
        format!("the error does not name the extra buffers: {e}"),
    )
}

device_test!(
    resume_is_bit_exact,
    damaged_files_are_refused,
    mismatched_restores_are_errors,
    buffers_are_saved_and_restored_exactly
);
