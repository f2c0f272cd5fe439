//! Fuzz target of checkpoint loading: a real checkpoint, damaged in any way (bytes flipped,
//! files cut or extended, a safetensors header rewritten with other dtypes, shapes, offsets or
//! lengths, `checkpoint.json` rewritten with any value at any field), is refused with an error
//! that names a file of the checkpoint, or, when the damage left a consistent checkpoint,
//! restores exactly the tensors its files hold. The model `checkpoint.json` describes (its
//! `model`, damaged too: other widths, small or huge) is built and restored as `eval` and
//! `predict` build it: refused naming a file or the spec, before allocating more than the
//! tensors hold, or restored exactly. Never a panic, and saving over it afterwards works and
//! touches nothing outside the directory.

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use ringflow_ml::checkpoint::{self, CheckpointMeta, TrainingState};
use ringflow_ml::fuzz::config;
use ringflow_ml::nn::{Model, ModelRegistry, ModelSpec};
use ringflow_ml::optim::{Optimizer, OptimizerSpec};
use ringflow_ml::{Device, loss};
use safetensors::{Dtype, SafeTensors};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn model_spec() -> ModelSpec {
    ModelSpec::mlp(&[3, 4, 2], "relu")
}

fn adam() -> OptimizerSpec {
    OptimizerSpec::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        groups: Vec::new(),
    }
}

fn fresh() -> (Model, Optimizer) {
    let model = Model::build(&model_spec(), &ModelRegistry::default(), 1, Device::Cpu).unwrap();
    let opt = Optimizer::new(adam(), model.params()).unwrap();
    (model, opt)
}

/// Saves a checkpoint of a model and its Adam state after one step into `dir`.
fn save_template(dir: &Path) {
    let (model, mut opt) = fresh();
    let x = crate::helpers::tensor(&[0.5; 6], &[2, 3], Device::Cpu);
    let y = crate::helpers::tensor(&[0.0, 1.0], &[2], Device::Cpu);
    let mut rng = ringflow_ml::rng::seeded(1, 0);
    let logits = model.forward(&x, true, &mut rng).unwrap();
    let mut grads = loss::cross_entropy(&logits, &y)
        .unwrap()
        .backward()
        .unwrap();
    opt.step(0.01, &mut grads).unwrap();
    let state = TrainingState {
        epoch: 1,
        step: 1,
        rng: Some(rng),
        extra: json!({"job": {"name": "x"}}),
    };
    checkpoint::save(dir, &model, Some(&opt), &state).unwrap();
}

/// One way to damage a checkpoint.
#[derive(Clone, Debug)]
enum Damage {
    /// Bytes of a tensor file changed, cut or appended; its checksum fixed or not. With
    /// `values`, the edits fall among the tensors' values only (the file stays well formed,
    /// so that only the checksum tells), and the file is not cut.
    Bytes {
        role: &'static str,
        values: bool,
        edits: Vec<(prop::sample::Index, u8)>,
        cut: Option<prop::sample::Index>,
        tail: Vec<u8>,
        fix: bool,
    },
    /// A tensor file's header: the length prefix or a field of one tensor rewritten.
    Header {
        role: &'static str,
        tensor: prop::sample::Index,
        field: &'static str,
        value: Value,
        prefix: Option<u64>,
        fix: bool,
    },
    /// `checkpoint.json` with a field set to a value (`None`: removed).
    Meta {
        path: Vec<&'static str>,
        value: Option<Value>,
    },
    /// `checkpoint.json`'s bytes changed or cut.
    MetaBytes {
        edits: Vec<(prop::sample::Index, u8)>,
        cut: Option<prop::sample::Index>,
    },
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop_oneof![0u64..4, Just(u64::MAX), Just(1 << 40), any::<u64>()].prop_map(Value::from),
        prop_oneof![Just(-1i64), any::<i64>()].prop_map(Value::from),
        prop_oneof![Just(0.5f64), Just(1e300), any::<f64>()].prop_map(Value::from),
        prop::sample::select(vec![
            "",
            ".",
            "..",
            "../outside.txt",
            "/dev/zero",
            "model-000001.safetensors",
            "optimizer-000001.safetensors",
            "checkpoint.json",
            "F16",
            "adam",
            "sgd",
            "mlp",
        ])
        .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Names a damaged `checkpoint.json` may give a tensor file.
const FILE_NAMES: &[&str] = &[
    "",
    ".",
    "..",
    "../outside.txt",
    "/dev/zero",
    "sub/model.safetensors",
    "nul\0byte",
    "model-000001.safetensors",
    "optimizer-000001.safetensors",
    "checkpoint.json",
];

fn role() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["model", "optimizer"])
}

fn damage() -> impl Strategy<Value = Damage> {
    let edits = || prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4);
    let cut = || prop::option::of(any::<prop::sample::Index>());
    let tail = prop_oneof![
        2 => Just(Vec::new()),
        1 => prop::collection::vec(any::<u8>(), 1..16),
    ];
    let bytes = (role(), any::<bool>(), edits(), cut(), tail, any::<bool>()).prop_map(
        |(role, values, edits, cut, tail, fix)| Damage::Bytes {
            role,
            values,
            edits,
            cut,
            tail,
            fix,
        },
    );
    // Dtypes of another size, which the file's lengths then contradict, and of the same size
    // (I32, U32), which only the loader's dtype check refuses.
    let dtype = prop::sample::select(vec![
        "F16", "BF16", "F64", "I32", "U32", "I32", "U32", "U8", "BOOL", "XX",
    ])
    .prop_map(Value::from);
    let numbers =
        prop::collection::vec(prop_oneof![0u64..40, any::<u64>()], 0..4).prop_map(Value::from);
    let field = prop_oneof![
        dtype.prop_map(|v| ("dtype", v)),
        numbers.clone().prop_map(|v| ("shape", v)),
        numbers.prop_map(|v| ("data_offsets", v)),
        json_value().prop_map(|v| ("shape", v)),
    ];
    // Mostly the right length prefix and checksum, so that the rewritten field itself is what
    // the loader must judge.
    let prefix = prop_oneof![
        3 => Just(None),
        1 => prop_oneof![0u64..400, any::<u64>()].prop_map(Some),
    ];
    let header = (
        role(),
        any::<prop::sample::Index>(),
        field,
        prefix,
        prop::bool::weighted(0.8),
    )
        .prop_map(
            |(role, tensor, (field, value), prefix, fix)| Damage::Header {
                role,
                tensor,
                field,
                value,
                prefix,
                fix,
            },
        );
    let paths: Vec<Vec<&'static str>> = vec![
        vec!["format"],
        vec!["generation"],
        vec!["epoch"],
        vec!["step"],
        vec!["optimizer_steps"],
        vec!["files"],
        vec!["files", "model"],
        vec!["files", "model", "name"],
        vec!["files", "model", "sha256"],
        vec!["files", "optimizer"],
        vec!["files", "optimizer", "name"],
        vec!["model"],
        vec!["model", "layers"],
        vec!["model", "kind"],
        vec!["optimizer"],
        vec!["optimizer", "kind"],
        vec!["optimizer", "lr"],
        vec!["rng"],
        vec!["extra"],
    ];
    let meta = (prop::sample::select(paths), prop::option::of(json_value()))
        .prop_map(|(path, value)| Damage::Meta { path, value });
    let meta_bytes = (edits(), cut()).prop_map(|(edits, cut)| Damage::MetaBytes { edits, cut });
    // The model's widths: often still buildable, sometimes far larger than the tensors.
    let width = prop_oneof![4 => 0u64..6, 1 => Just(1u64 << 40), 1 => any::<u64>()];
    let widths = prop::collection::vec(width, 0..5).prop_map(|w| Damage::Meta {
        path: vec!["model", "layers"],
        value: Some(Value::from(w)),
    });
    // A tensor file's name in `checkpoint.json` pointing elsewhere: often, since a loader that
    // follows it reads (or a later save deletes) a file outside the checkpoint.
    let file_name =
        (role(), prop::sample::select(FILE_NAMES)).prop_map(|(role, name)| Damage::Meta {
            path: vec!["files", role, "name"],
            value: Some(name.into()),
        });
    prop_oneof![bytes, header, meta, meta_bytes, file_name, widths]
}

fn meta(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("checkpoint.json")).unwrap()).unwrap()
}

/// The file of `role`, by the (undamaged) metadata.
fn file_of(dir: &Path, role: &str) -> std::path::PathBuf {
    dir.join(meta(dir)["files"][role]["name"].as_str().unwrap())
}

fn set_sha(dir: &Path, role: &str, bytes: &[u8]) {
    let mut m = meta(dir);
    let sha: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    m["files"][role]["sha256"] = sha.into();
    std::fs::write(dir.join("checkpoint.json"), serde_json::to_vec(&m).unwrap()).unwrap();
}

fn edit(
    bytes: &mut Vec<u8>,
    edits: &[(prop::sample::Index, u8)],
    cut: &Option<prop::sample::Index>,
) {
    for (at, v) in edits {
        if !bytes.is_empty() {
            let i = at.index(bytes.len());
            bytes[i] = *v;
        }
    }
    if let Some(c) = cut {
        bytes.truncate(c.index(bytes.len() + 1));
    }
}

/// A safetensors file with the header's tensor that `choose` picks given `field = value`, and
/// the header's length prefix replaced by `prefix`.
fn rewrite_header(
    bytes: &[u8],
    choose: impl FnOnce(&[String]) -> String,
    field: &str,
    value: &Value,
    prefix: Option<u64>,
) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let names: Vec<String> = header
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    header[choose(&names)][field] = value.clone();
    let text = serde_json::to_vec(&header).unwrap();
    let mut out = prefix.unwrap_or(text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(&bytes[8 + n..]);
    out
}

fn apply(dir: &Path, d: &Damage) {
    match d {
        Damage::Bytes {
            role,
            values,
            edits,
            cut,
            tail,
            fix,
        } => {
            let path = file_of(dir, role);
            let mut b = std::fs::read(&path).unwrap();
            if *values {
                let start = 8 + u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
                let mut data = b.split_off(start);
                edit(&mut data, edits, &None);
                b.extend(data);
            } else {
                edit(&mut b, edits, cut);
            }
            b.extend(tail);
            std::fs::write(&path, &b).unwrap();
            if *fix {
                set_sha(dir, role, &b);
            }
        }
        Damage::Header {
            role,
            tensor,
            field,
            value,
            prefix,
            fix,
        } => {
            let path = file_of(dir, role);
            let pick = |names: &[String]| names[tensor.index(names.len())].clone();
            let b = rewrite_header(&std::fs::read(&path).unwrap(), pick, field, value, *prefix);
            std::fs::write(&path, &b).unwrap();
            if *fix {
                set_sha(dir, role, &b);
            }
        }
        Damage::Meta { path, value } => {
            let mut m = meta(dir);
            let (last, parents) = path.split_last().unwrap();
            let mut at = &mut m;
            for p in parents {
                at = &mut at[*p];
            }
            match (value, at.as_object_mut()) {
                (Some(v), Some(o)) => {
                    o.insert(last.to_string(), v.clone());
                }
                (None, Some(o)) => {
                    o.remove(*last);
                }
                (_, None) => {}
            }
            std::fs::write(dir.join("checkpoint.json"), serde_json::to_vec(&m).unwrap()).unwrap();
        }
        Damage::MetaBytes { edits, cut } => {
            let path = dir.join("checkpoint.json");
            let mut b = std::fs::read(&path).unwrap();
            edit(&mut b, edits, cut);
            std::fs::write(&path, &b).unwrap();
        }
    }
}

/// The f32 tensors of the checkpoint's `role` file as bit patterns (a damaged value may be a
/// NaN, which must come back as it is), decoded here independently of the loader, which
/// accepted it: so it must be the file the metadata recorded (the same SHA-256) and hold F32
/// tensors only.
fn held(dir: &Path, meta: &CheckpointMeta, role: &str) -> Result<Tensors, TestCaseError> {
    let file = &meta.files[role];
    let bytes = std::fs::read(dir.join(&file.name)).unwrap();
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    prop_assert_eq!(
        &sha,
        &file.sha256,
        "{} was loaded with another checksum",
        file.name
    );
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out = Tensors::new();
    for (name, view) in st.tensors() {
        prop_assert_eq!(view.dtype(), Dtype::F32, "{} was loaded", name);
        let values = view
            .data()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        out.insert(name, values);
    }
    Ok(out)
}

type Tensors = std::collections::BTreeMap<String, Vec<u32>>;

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn names_a_file(e: &ringflow_ml::MlError, dir: &Path) -> Result<(), TestCaseError> {
    let msg = e.to_string();
    prop_assert!(
        msg.starts_with(&format!("checkpoint {}/", dir.display())),
        "{}",
        msg
    );
    Ok(())
}

/// Builds the model the damaged `checkpoint.json` describes and restores the tensors into it:
/// refused naming a file or the spec, or restored exactly.
fn check_described(dir: &Path, loaded: &checkpoint::Loaded) -> Result<(), TestCaseError> {
    let registry = ModelRegistry::default();
    let model = match loaded.build_model(&loaded.meta.model, &registry, 1, Device::Cpu) {
        Ok(m) => m,
        Err(e @ ringflow_ml::MlError::Spec(_)) => {
            prop_assert!(!e.to_string().contains('\n'), "{}", e);
            return Ok(());
        }
        Err(e) => return names_a_file(&e, dir),
    };
    let want = held(dir, &loaded.meta, "model")?;
    for p in model.params().iter() {
        let got = p.tensor.try_to_vec().unwrap();
        prop_assert_eq!(Some(&bits(&got)), want.get(&p.name), "{}", p.name);
    }
    Ok(())
}

/// Loads the damaged checkpoint in `dir` and restores it into a fresh model and optimizer,
/// and into the model it describes.
fn check(dir: &Path) -> Result<(), TestCaseError> {
    let loaded = match checkpoint::load(dir) {
        Ok(l) => l,
        Err(e) => return names_a_file(&e, dir),
    };
    check_described(dir, &loaded)?;
    let (model, mut opt) = fresh();
    if let Err(e) = loaded.restore_model(&model) {
        return names_a_file(&e, dir);
    }
    let want = held(dir, &loaded.meta, "model")?;
    for p in model.params().iter() {
        let got = p.tensor.try_to_vec().unwrap();
        prop_assert_eq!(Some(&bits(&got)), want.get(&p.name), "{}", p.name);
    }
    if let Err(e) = loaded.restore_optimizer(&mut opt) {
        return names_a_file(&e, dir);
    }
    let want = held(dir, &loaded.meta, "optimizer")?;
    for (name, _, values) in opt.state_tensors().unwrap() {
        prop_assert_eq!(Some(&bits(&values)), want.get(&name), "{}", name);
    }
    Ok(())
}

#[test]
fn fuzz_checkpoint_damage() {
    let root = tempfile::tempdir().unwrap();
    let template = root.path().join("template");
    save_template(&template);
    let outside = root.path().join("outside.txt");
    let mut runner = TestRunner::new(config(256));
    let case = std::sync::atomic::AtomicUsize::new(0);
    runner
        .run(&damage(), |d| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = root.path().join(format!("case-{n}"));
            // Written for every case, so that a case that deletes it fails alone.
            std::fs::write(&outside, "not the checkpoint's").unwrap();
            copy_dir(&template, &dir);
            apply(&dir, &d);
            check(&dir)?;
            // Saving over whatever is there works, touches nothing outside, and loads.
            let (model, opt) = fresh();
            checkpoint::save(&dir, &model, Some(&opt), &TrainingState::default())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(
                outside.exists(),
                "a file outside the checkpoint was deleted"
            );
            prop_assert!(checkpoint::load(&dir).is_ok());
            std::fs::remove_dir_all(&dir).unwrap();
            Ok(())
        })
        .unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A `checkpoint.json` that names a tensor file outside its directory (`../x`, `/dev/zero`) is
/// refused, and the next save deletes nothing outside it: followed, such a name would be read
/// (forever, for a device) and then deleted. A case fuzz_checkpoint_damage found.
#[test]
fn tensor_files_outside_the_directory_are_refused_and_never_deleted() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    save_template(&dir);
    let outside = root.path().join("outside.txt");
    std::fs::write(&outside, "keep me").unwrap();
    for name in ["../outside.txt", "/dev/zero", "", ".."] {
        let mut m = meta(&dir);
        m["files"]["optimizer"]["name"] = name.into();
        std::fs::write(dir.join("checkpoint.json"), serde_json::to_vec(&m).unwrap()).unwrap();
        let e = checkpoint::load(&dir).unwrap_err().to_string();
        assert!(
            e.contains("checkpoint.json") && e.contains("not a file name inside"),
            "{name}: {e}"
        );
        let (model, opt) = fresh();
        checkpoint::save(&dir, &model, Some(&opt), &TrainingState::default()).unwrap();
        assert!(
            outside.exists(),
            "{name}: the next save deleted a file outside"
        );
    }
}

/// A NaN a checkpoint holds is restored as it is, and restored values are compared bit for bit
/// (compared as floats, a NaN never equals itself). A case fuzz_checkpoint_damage found in long
/// mode, shrunk to a model file whose first weight's high byte is 0x7f with a matching checksum.
#[test]
fn a_nan_in_a_checkpoint_is_restored_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    save_template(dir.path());
    let path = file_of(dir.path(), "model");
    let mut b = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    // The tensor whose values come first in the file.
    let (name, _) = header
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, t)| t["data_offsets"][0] == 0)
        .unwrap();
    let start = 8 + n;
    let nan = f32::from_bits(0x7fc0_1234);
    b[start..start + 4].copy_from_slice(&nan.to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    set_sha(dir.path(), "model", &b);
    let (model, _) = fresh();
    checkpoint::load(dir.path())
        .unwrap()
        .restore_model(&model)
        .unwrap();
    let p = model.params().iter().find(|p| &p.name == name).unwrap();
    assert_eq!(p.tensor.try_to_vec().unwrap()[0].to_bits(), 0x7fc0_1234);
}

/// A `checkpoint.json` naming itself as a tensor file is refused, and saving over it gives a
/// loadable checkpoint: trusted, it would make the next save delete that "previous" file — the
/// metadata it had just written — and leave a checkpoint that cannot be loaded. A case
/// fuzz_checkpoint_damage found, shrunk to `files.model.name = "checkpoint.json"`.
#[test]
fn a_checkpoint_naming_itself_as_a_tensor_file_is_refused_and_replaced_whole() {
    let dir = tempfile::tempdir().unwrap();
    save_template(dir.path());
    for role in ["model", "optimizer"] {
        let mut m = meta(dir.path());
        m["files"][role]["name"] = "checkpoint.json".into();
        let meta_file = dir.path().join("checkpoint.json");
        std::fs::write(&meta_file, serde_json::to_vec(&m).unwrap()).unwrap();
        let e = checkpoint::load(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(&meta_file.display().to_string())
                && e.contains(&format!("names itself as the {role} file")),
            "{e}"
        );
        let (model, opt) = fresh();
        checkpoint::save(dir.path(), &model, Some(&opt), &TrainingState::default()).unwrap();
        checkpoint::load(dir.path()).unwrap();
    }
}

/// A save over a `generation` of 2^64 − 1 in `checkpoint.json` starts the numbering of its
/// files again instead of overflowing (which panics in debug builds). A case
/// fuzz_checkpoint_damage found.
#[test]
fn saving_over_the_last_generation_starts_again() {
    let dir = tempfile::tempdir().unwrap();
    save_template(dir.path());
    let mut m = meta(dir.path());
    m["generation"] = u64::MAX.into();
    std::fs::write(
        dir.path().join("checkpoint.json"),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    let (model, opt) = fresh();
    checkpoint::save(dir.path(), &model, Some(&opt), &TrainingState::default()).unwrap();
    assert_eq!(checkpoint::load(dir.path()).unwrap().meta.generation, 1);
}

/// A tensor file or `checkpoint.json` that is a FIFO or a directory is refused by name as not a
/// regular file, without blocking (read, a FIFO would block the loader forever and a directory
/// give a bare OS error). A case found while writing fuzz_checkpoint_damage.
#[test]
fn special_files_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    save_template(dir.path());
    let model_file = file_of(dir.path(), "model");
    std::fs::remove_file(&model_file).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&model_file)
        .status()
        .unwrap();
    assert!(made.success());
    let path = dir.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        tx.send(
            checkpoint::load(&path)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        )
    });
    let e = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("loading a FIFO blocked")
        .unwrap_err();
    assert!(
        e.contains(&model_file.display().to_string()) && e.contains("FIFO"),
        "{e}"
    );
    std::fs::remove_file(&model_file).unwrap();
    std::fs::create_dir(&model_file).unwrap();
    let e = checkpoint::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("not a regular file (it is a directory)"), "{e}");
}

/// A refused optimizer state names its file, and a partial refusal leaves the optimizer as it
/// was rather than half restored. A case fuzz_checkpoint_damage found.
#[test]
fn a_refused_optimizer_state_names_its_file_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    save_template(dir.path());
    let opt_file = file_of(dir.path(), "optimizer");
    let meta = checkpoint::load(dir.path()).unwrap().meta;
    let keep = held(dir.path(), &meta, "optimizer").unwrap();
    let last = keep.keys().last().unwrap().clone();
    let bytes = rewrite_header(
        &std::fs::read(&opt_file).unwrap(),
        |names| names.last().unwrap().clone(),
        "shape",
        &json!([keep[&last].len(), 1]),
        None,
    );
    std::fs::write(&opt_file, &bytes).unwrap();
    set_sha(dir.path(), "optimizer", &bytes);
    let loaded = checkpoint::load(dir.path()).unwrap();
    let (_, mut opt) = fresh();
    let before = opt.state_tensors().unwrap();
    let e = loaded.restore_optimizer(&mut opt).unwrap_err().to_string();
    assert!(
        e.contains(&opt_file.display().to_string()) && e.contains("has shape"),
        "{e}"
    );
    let after = opt.state_tensors().unwrap();
    assert_eq!(before, after, "a refused restore changed the optimizer");
}

/// A damaged spec that describes a larger model than its tensors (`model.layers = [3, 2^40, 2]`
/// in `checkpoint.json`, terabytes) is refused before anything is allocated: its parameter
/// count is checked against the values saved first. A smaller spec is refused by the tensors'
/// shapes, the right one restores. A case fuzz_checkpoint_damage found.
#[test]
fn a_model_spec_larger_than_its_tensors_is_refused_before_it_allocates() {
    let dir = tempfile::tempdir().unwrap();
    save_template(dir.path());
    let loaded = checkpoint::load(dir.path()).unwrap();
    let registry = ModelRegistry::default();
    let build = |layers: &[usize]| {
        loaded
            .build_model(&ModelSpec::mlp(layers, "relu"), &registry, 1, Device::Cpu)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let model_file = file_of(dir.path(), "model").display().to_string();
    let e = build(&[3, 1 << 40, 2]).unwrap_err();
    assert!(
        e.starts_with(&format!(
            "checkpoint {model_file}: holds 26 values, but the model spec"
        )) && e.contains("do not belong together"),
        "{e}"
    );
    let e = build(&[3, 3, 2]).unwrap_err();
    assert!(e.contains(&model_file) && e.contains("has shape"), "{e}");
    build(&[3, 4, 2]).unwrap();
}
