//! What the export tests compare against: a model trained a few steps, `ringflow predict`'s
//! class and probability of every test row, and the same rows' features as the data holds
//! them. Shared by the ONNX checks (`tests/cli/export.rs`) and the PyTorch checks
//! (`tests/interop/`, run by `testing/interop.sh`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::{cast, concat_batches};
use datafusion::arrow::datatypes::{DataType, Float32Type, Int64Type};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::helpers::{job, mnist_data, repo, ringflow, s};

/// How long one training, prediction or export may take.
pub const LIMIT: Duration = Duration::from_secs(600);

/// A model the export tests train: a name for files and messages, its spec, the `--set`s that
/// keep its training short, the test data (relative to the repository) and its feature
/// columns in the spec's order.
pub struct Example<'a> {
    pub name: &'a str,
    pub spec: &'a str,
    pub sets: &'a [&'a str],
    pub data: &'a str,
    pub columns: &'a [&'a str],
}

const MNIST_TEST: &str = "examples/data/mnist/test.parquet";

/// `examples/iris.toml`: normalization and class names.
pub const IRIS: Example<'static> = Example {
    name: "iris",
    spec: "examples/iris.toml",
    sets: &["train.epochs=3"],
    data: "examples/data/iris/test.parquet",
    columns: &["sepal_length", "sepal_width", "petal_length", "petal_width"],
};

/// `examples/mnist.toml`: `data.scale`, a list column of 784 values per row.
pub const MNIST_MLP: Example<'static> = Example {
    name: "mnist",
    spec: "examples/mnist.toml",
    sets: &["train.epochs=1"],
    data: MNIST_TEST,
    columns: &["image"],
};

/// `examples/mnist_cnn.toml`: LeNet, `data.shape`.
pub const LENET: Example<'static> = Example {
    name: "lenet",
    spec: "examples/mnist_cnn.toml",
    sets: &["train.epochs=1"],
    data: MNIST_TEST,
    columns: &["image"],
};

/// `examples/mnist_png_cnn.toml` (`data.image`: PNG files) with `sets` (its data among them)
/// and its test split at `data`; the rows are the raw pixels beside each PNG.
pub fn png_cnn<'a>(sets: &'a [&'a str], data: &'a str) -> Example<'a> {
    Example {
        name: "png-cnn",
        spec: "examples/mnist_png_cnn.toml",
        sets,
        data,
        columns: &["image"],
    }
}

/// The CNN of [`every_image_layer_job`] written at `spec`.
pub fn every_image_layer(spec: &str) -> Example<'_> {
    Example {
        name: "cnn",
        spec,
        sets: &["train.epochs=1"],
        data: MNIST_TEST,
        columns: &["image"],
    }
}

/// A model trained a few steps, with `predict`'s answers on its test rows.
pub struct Trained {
    /// Holds everything the run wrote.
    pub dir: tempfile::TempDir,
    /// The saved model's directory.
    pub model: PathBuf,
    /// Each test row's features, by its `id`.
    pub rows: BTreeMap<i64, Vec<f32>>,
    /// `predict`'s class (its name, or its index as text) and probability, by row `id`.
    pub predicted: BTreeMap<i64, (String, f32)>,
}

impl Trained {
    /// Trains `example` on one executor and predicts its test data with it.
    pub fn new(example: &Example<'_>) -> Trained {
        let Example {
            spec,
            sets,
            data,
            columns,
            ..
        } = *example;
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let mut args = vec!["local", spec, "--executors", "1", "--ui", "off"];
        let ckpt = format!("cluster.checkpoint_dir={}", s(&run));
        for set in sets.iter().copied().chain([ckpt.as_str()]) {
            args.extend(["--set", set]);
        }
        ringflow(&args, LIMIT).assert_success();
        let model = run.join("model");
        let preds = dir.path().join("preds");
        let (m, p) = (s(&model), s(&preds));
        let predict = [
            "predict", "--model", &m, "--data", data, "--output", &p, "--id", "id",
        ];
        ringflow(&predict, LIMIT).assert_success();
        Trained {
            rows: feature_rows(&read_all(&repo().join(data)), columns),
            predicted: predictions(&read_all(&preds)),
            dir,
            model,
        }
    }

    /// Writes the rows' features, in `id` order, as a JSON list of lists to `path`.
    pub fn write_rows(&self, path: &Path) {
        let values: Vec<&Vec<f32>> = self.rows.values().collect();
        std::fs::write(path, serde_json::to_vec(&values).unwrap()).unwrap();
    }

    /// Checks `other` — `[class index, probability]` of each row in `id` order, with class
    /// `names` when the model has them — against `predict`: every class equal, probabilities
    /// within 1e-5. Returns the largest probability difference.
    pub fn check(&self, what: &str, other: &serde_json::Value, names: &serde_json::Value) -> f64 {
        assert_eq!(
            self.predicted.len(),
            self.rows.len(),
            "{what}: every row predicted once"
        );
        let mut largest = 0f64;
        for (i, id) in self.rows.keys().enumerate() {
            let row = &other[i];
            let index = row[0].as_u64().unwrap() as usize;
            let want = match names {
                serde_json::Value::Array(names) => names[index].as_str().unwrap().to_string(),
                _ => index.to_string(),
            };
            let (class, probability) = &self.predicted[id];
            assert_eq!(class, &want, "{what}: the class of row id {id}");
            let gap = (row[1].as_f64().unwrap() - f64::from(*probability)).abs();
            largest = largest.max(gap);
        }
        assert!(
            largest <= 1e-5,
            "{what}: probabilities differ by up to {largest}"
        );
        eprintln!("{what}: largest probability difference {largest:e}");
        largest
    }
}

/// Every row of the Parquet files at `path` (a file or a directory of parts) as one batch.
pub fn read_all(path: &Path) -> RecordBatch {
    let files: Vec<_> = if path.is_dir() {
        let mut f: Vec<_> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
            .collect();
        f.sort();
        f
    } else {
        vec![path.to_path_buf()]
    };
    let batches: Vec<RecordBatch> = files
        .iter()
        .flat_map(|f| {
            let file = std::fs::File::open(f).unwrap();
            let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
            reader.build().unwrap().map(|b| b.unwrap())
        })
        .collect();
    concat_batches(&batches[0].schema(), &batches).unwrap()
}

/// The `columns` of `batch` as rows of f32 features (a list column's values in place), by
/// the `id` column.
pub fn feature_rows(batch: &RecordBatch, columns: &[&str]) -> BTreeMap<i64, Vec<f32>> {
    let ids = cast(batch.column_by_name("id").unwrap(), &DataType::Int64).unwrap();
    let ids = ids.as_primitive::<Int64Type>();
    let mut rows: BTreeMap<i64, Vec<f32>> = BTreeMap::new();
    for name in columns {
        let col = batch.column_by_name(name).unwrap();
        for (i, id) in ids.values().iter().enumerate() {
            let values = match col.data_type() {
                DataType::FixedSizeList(..) => col.as_fixed_size_list().value(i),
                DataType::List(_) => col.as_list::<i32>().value(i),
                _ => col.slice(i, 1),
            };
            let values = cast(&values, &DataType::Float32).unwrap();
            let values = values.as_primitive::<Float32Type>();
            rows.entry(*id).or_default().extend(values.values().iter());
        }
    }
    rows
}

/// `predict`'s `(class, probability)` of each row, by `id`.
pub fn predictions(batch: &RecordBatch) -> BTreeMap<i64, (String, f32)> {
    let ids = cast(batch.column_by_name("id").unwrap(), &DataType::Int64).unwrap();
    let ids = ids.as_primitive::<Int64Type>();
    let probability = batch.column_by_name("probability").unwrap();
    let probability = probability.as_primitive::<Float32Type>();
    let class = cast(batch.column_by_name("prediction").unwrap(), &DataType::Utf8).unwrap();
    let class = class.as_string::<i32>();
    (0..batch.num_rows())
        .map(|i| {
            (
                ids.value(i),
                (class.value(i).to_string(), probability.value(i)),
            )
        })
        .collect()
}

/// Writes `<dir>/cnn.toml`: a small CNN on the committed MNIST features (`data.shape`) with
/// every layer of fixed-shape examples — convolutions with stride, padding, dilation and
/// groups, batch norm, both poolings with padding, residual blocks with and without a
/// shortcut, layer norm, every activation, dropout, flatten, linear. Returns its path.
pub fn every_image_layer_job(dir: &Path) -> String {
    let toml = format!(
        r#"name = "cnn-layers"
{data}shape = [1, 28, 28]
[model]
kind = "sequential"
layers = [
  {{ type = "conv2d", out_channels = 8, kernel = 3, padding = 1 }},
  {{ type = "batch_norm" }},
  {{ type = "relu" }},
  {{ type = "max_pool2d", kernel = 3, stride = 2, padding = 1 }},
  {{ type = "residual", layers = [
      {{ type = "conv2d", out_channels = 8, kernel = 3, padding = 2, dilation = 2, groups = 2 }},
      {{ type = "batch_norm" }},
      {{ type = "gelu" }},
  ] }},
  {{ type = "residual", layers = [
      {{ type = "conv2d", out_channels = 12, kernel = 3, stride = 2, padding = 1 }},
      {{ type = "gelu_exact" }},
  ], shortcut = [ {{ type = "conv2d", out_channels = 12, kernel = 1, stride = 2 }} ] }},
  {{ type = "avg_pool2d", kernel = 3, stride = 1, padding = 1 }},
  {{ type = "conv2d", out_channels = 16, kernel = 3 }},
  {{ type = "tanh" }},
  {{ type = "global_avg_pool2d" }},
  {{ type = "layer_norm" }},
  {{ type = "dropout", p = 0.1 }},
  {{ type = "linear", out = 32 }},
  {{ type = "sigmoid" }},
  {{ type = "flatten" }},
  {{ type = "linear" }},
]
[train]
batch_size = 64
optimizer = {{ kind = "adam", lr = 0.003 }}
"#,
        data = mnist_data()
    );
    job(dir, "cnn", &toml)
}

/// Runs the Python `script` with `args` (python3 from PATH) and reads the JSON it prints. A
/// script whose imports fail prints `MISSING: …` and exits 3, and the test fails with
/// `missing`, the sentence saying how to install them.
pub fn python_json(script: &str, args: &[String], missing: &str) -> serde_json::Value {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("python3 cannot be started: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stdout.starts_with("MISSING"), "{missing}: {stdout}");
    assert!(
        out.status.success(),
        "the Python check failed:\n{stdout}\n{stderr}"
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("the check printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

/// The `tokens` of every row of `batch`, by `id`.
pub fn token_rows(batch: &RecordBatch) -> BTreeMap<i64, Vec<String>> {
    let ids = cast(batch.column_by_name("id").unwrap(), &DataType::Int64).unwrap();
    let tokens = batch.column_by_name("tokens").unwrap().as_list::<i32>();
    let mut out = BTreeMap::new();
    for (i, id) in ids.as_primitive::<Int64Type>().values().iter().enumerate() {
        let row = tokens.value(i);
        let row = row.as_string::<i32>();
        out.insert(
            *id,
            (0..row.len()).map(|j| row.value(j).to_string()).collect(),
        );
    }
    out
}

/// `predict`'s tag names and probabilities of every row's tokens, by `id`.
pub fn predicted_tags(batch: &RecordBatch) -> BTreeMap<i64, Vec<(String, f32)>> {
    let ids = cast(batch.column_by_name("id").unwrap(), &DataType::Int64).unwrap();
    let tags = batch.column_by_name("prediction").unwrap().as_list::<i32>();
    let probs = batch
        .column_by_name("probability")
        .unwrap()
        .as_list::<i32>();
    let mut out = BTreeMap::new();
    for (i, id) in ids.as_primitive::<Int64Type>().values().iter().enumerate() {
        let (t, p) = (tags.value(i), probs.value(i));
        let (t, p) = (t.as_string::<i32>(), p.as_primitive::<Float32Type>());
        let row = (0..t.len())
            .map(|j| (t.value(j).to_string(), p.value(j)))
            .collect();
        out.insert(*id, row);
    }
    out
}

/// The shipped corpus's test split, which the tagger checks predict.
pub const TAGGER_TEST: &str = "examples/data/hironsan-ner/test.parquet";

/// `examples/ner_bilstm.toml` trained an epoch with `sets`, exported to `format` (`onnx`,
/// `torch`): the exported file, `predict`'s tags of the test split, and the split's rows of
/// tokens (also as JSON, for the Python runners, at `rows_json`).
pub struct TrainedTagger {
    /// The exported model (`.onnx`, or the `.safetensors` with its `.py` beside it).
    pub exported: PathBuf,
    /// The test split's tokens, by `id`.
    pub rows: BTreeMap<i64, Vec<String>>,
    /// The rows of tokens in `id` order, as JSON.
    pub rows_json: PathBuf,
    /// `predict`'s tag and probability of every token, by `id`.
    pub predicted: BTreeMap<i64, Vec<(String, f32)>>,
}

impl TrainedTagger {
    /// Trains, predicts and exports in `dir`, files named `name`.
    pub fn new(dir: &Path, name: &str, sets: &[&str], format: &str) -> TrainedTagger {
        let run = dir.join(name);
        let ckpt = format!("cluster.checkpoint_dir={}", s(&run));
        let mut args = vec!["local", "examples/ner_bilstm.toml", "--executors", "1"];
        args.extend(["--ui", "off"]);
        for set in ["train.epochs=1", ckpt.as_str()].iter().chain(sets) {
            args.extend(["--set", set]);
        }
        ringflow(&args, LIMIT).assert_success();
        let model = s(&run.join("model"));
        let preds = dir.join(format!("{name}.preds"));
        let (p, data) = (s(&preds), TAGGER_TEST);
        let predict = [
            "predict", "--model", &model, "--data", data, "--output", &p, "--id", "id",
        ];
        ringflow(&predict, LIMIT).assert_success();
        let ext = if format == "onnx" {
            "onnx"
        } else {
            "safetensors"
        };
        let exported = dir.join(format!("{name}.{ext}"));
        let out = s(&exported);
        let export = [
            "export", "--model", &model, "--format", format, "--output", &out,
        ];
        ringflow(&export, LIMIT).assert_success();
        let rows = token_rows(&read_all(&repo().join(TAGGER_TEST)));
        let rows_json = dir.join(format!("{name}.rows.json"));
        let listed: Vec<&Vec<String>> = rows.values().collect();
        std::fs::write(&rows_json, serde_json::to_string(&listed).unwrap()).unwrap();
        TrainedTagger {
            exported,
            rows,
            rows_json,
            predicted: predicted_tags(&read_all(&preds)),
        }
    }

    /// Checks another runtime's answer (`rows`: each row's `[class, probability]` per token;
    /// `classes`: the tag names) against `predict`'s: every tag equal, probabilities within
    /// 1e-5. Returns the largest difference.
    pub fn check(&self, what: &str, other: &serde_json::Value) -> f64 {
        let classes = other["classes"].as_array().unwrap();
        let mut largest = 0f64;
        for (i, (id, tokens)) in self.rows.iter().enumerate() {
            let theirs = other["rows"][i].as_array().unwrap();
            let ours = &self.predicted[id];
            assert_eq!(
                theirs.len(),
                tokens.len(),
                "{what}: row {id} has a tag per token"
            );
            assert_eq!(ours.len(), tokens.len(), "{what}: row {id}");
            for (j, (tag, p)) in ours.iter().enumerate() {
                let class = theirs[j][0].as_u64().unwrap() as usize;
                assert_eq!(
                    classes[class].as_str().unwrap(),
                    tag,
                    "{what}: row {id}, token {j}"
                );
                largest = largest.max((theirs[j][1].as_f64().unwrap() - f64::from(*p)).abs());
            }
        }
        eprintln!("{what}: largest probability difference {largest:e}");
        assert!(
            largest <= 1e-5,
            "{what}: probabilities differ by up to {largest}"
        );
        largest
    }
}

/// MNIST's first 2,000 training and 300 test rows as PNG files in `dir` (with the raw pixels
/// beside them), and the `--set`s that point `examples/mnist_png_cnn.toml` at them for an
/// epoch; the test split's path.
pub fn png_mnist(dir: &Path) -> (Vec<String>, String) {
    let (train, test) = (dir.join("train.parquet"), dir.join("test.parquet"));
    crate::helpers::write_image_mnist(&train, "train", 2000, 500, None);
    crate::helpers::write_image_mnist(&test, "test", 300, 300, None);
    let sets = vec![
        "train.epochs=1".to_string(),
        format!("data.train={}", s(&train)),
        format!("data.test={}", s(&test)),
    ];
    (sets, s(&test))
}
