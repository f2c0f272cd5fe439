//! Shared helpers: running the binary with a deadline, writing Parquet, reading summaries.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;

/// The repository root (tests run the binary from here, so example paths resolve).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A finished run of the binary.
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Fails the test, showing the output, unless the run exited 0.
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.status.success(),
            "ringflow failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Fails unless the run exited non-zero with an error line and no panic; returns stderr.
    pub fn assert_clean_failure(&self) -> &str {
        assert!(
            !self.status.success(),
            "ringflow unexpectedly succeeded:\n{}",
            self.stdout
        );
        assert!(
            !self.stderr.contains("panicked") && !self.stderr.contains("RUST_BACKTRACE"),
            "ringflow panicked:\n{}",
            self.stderr
        );
        assert!(
            self.stderr.contains("error: "),
            "no error line:\n{}",
            self.stderr
        );
        &self.stderr
    }
}

/// Runs `ringflow ARGS` from the repository root, killing it if it outlives `deadline`.
pub fn ringflow(args: &[&str], deadline: Duration) -> Run {
    run_program(Path::new(env!("CARGO_BIN_EXE_ringflow")), args, deadline)
}

/// Runs `ringflow ARGS` like [`ringflow`] with its environment changed by `env`, in order:
/// `(NAME, Some(value))` sets a variable, `(NAME, None)` removes an inherited one. Executor
/// processes of `ringflow local` inherit the result.
pub fn ringflow_env(args: &[&str], env: &[(&str, Option<&str>)], deadline: Duration) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringflow"));
    cmd.args(args);
    for (name, value) in env {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    run_command(&mut cmd, deadline)
}

/// Runs `ringflow ARGS` like [`ringflow`], in the working directory `cwd`.
pub fn ringflow_in(cwd: &Path, args: &[&str], deadline: Duration) -> Run {
    run_command(
        Command::new(env!("CARGO_BIN_EXE_ringflow"))
            .args(args)
            .current_dir(cwd),
        deadline,
    )
}

/// Runs `program ARGS` from the repository root, killing it if it outlives `deadline`.
pub fn run_program(program: &Path, args: &[&str], deadline: Duration) -> Run {
    run_command(Command::new(program).args(args), deadline)
}

/// Runs `cmd` (its program, arguments and environment) with no input, capturing its output,
/// killing it if it outlives `deadline`; from the repository root unless `cmd` has a working
/// directory.
pub fn run_command(cmd: &mut Command, deadline: Duration) -> Run {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if cmd.get_current_dir().is_none() {
        cmd.current_dir(repo());
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} cannot be started: {e}"));
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waitable") {
            break status;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{program} {args:?} ran longer than {deadline:?}; killed it. stderr so far:\n{}",
                err_reader.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

/// Reads a `--summary-json` file.
pub fn summary(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no summary at {}: {e}", path.display()));
    serde_json::from_str(&text).expect("the summary is JSON")
}

/// Writes `columns` as a Parquet file with row groups of at most `row_group_rows` rows.
pub fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>, row_group_rows: usize) {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .expect("columns of equal length");
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(row_group_rows))
        .build();
    let file = std::fs::File::create(path).expect("writable temp dir");
    let mut w = ArrowWriter::try_new(file, schema, Some(props)).expect("parquet writer");
    w.write(&batch).expect("write");
    w.close().expect("close");
}

/// Writes a job spec into `dir` and returns its path as a string.
pub fn job(dir: &Path, name: &str, toml: &str) -> String {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml).expect("writable temp dir");
    path.display().to_string()
}

/// Writes `dir/<name>.toml`: a small regression job (`y` from `a`, `b`, `v`, as
/// [`write_regression_data`] writes them) over `train`, with `data_extra` lines in `[data]` and
/// `cluster` lines in `[cluster]`; a second or two of training on a few hundred rows.
pub fn regression_job(
    dir: &Path,
    name: &str,
    train: &str,
    data_extra: &str,
    cluster: &str,
) -> String {
    let train_lines = "epochs = 2\nbatch_size = 20";
    let toml = regression_toml(name, train, data_extra, 8, train_lines, cluster);
    job(dir, name, &toml)
}

/// The spec of a regression job named `name` over `train` (`y` from `a`, `b`, `v`): `[data]`
/// with `data_extra` lines, an MLP with `hidden` units, mean squared error and `train_lines`
/// in `[train]`, and `cluster` lines in `[cluster]`.
pub fn regression_toml(
    name: &str,
    train: &str,
    data_extra: &str,
    hidden: usize,
    train_lines: &str,
    cluster: &str,
) -> String {
    format!(
        r#"name = "{name}"
[data]
train = "{train}"
features = ["a", "b", "v"]
label = "y"
{data_extra}
[model]
kind = "mlp"
layers = [4, {hidden}, 1]
[train]
loss = "mse"
{train_lines}
[cluster]
{cluster}
"#
    )
}

/// The `[data]` table of a job on the committed MNIST example data, for specs written by tests.
pub fn mnist_data() -> String {
    format!(
        r#"[data]
train = "{repo}/examples/data/mnist/train.parquet"
test = "{repo}/examples/data/mnist/test.parquet"
features = ["image"]
label = "label"
scale = 255.0
"#,
        repo = s(&repo())
    )
}

/// Writes `<dir>/<name>.toml`: a small MLP (784-32-10) on the committed MNIST data with SGD,
/// checkpoints in `ckpt`. Returns the spec's path.
pub fn small_mnist_job(
    dir: &Path,
    name: &str,
    executors: usize,
    epochs: u64,
    batch_size: usize,
    ckpt: &Path,
) -> String {
    job(
        dir,
        name,
        &format!(
            r#"name = "{name}"
{data}
[model]
kind = "mlp"
layers = [784, 32, 10]
activation = "relu"
[train]
epochs = {epochs}
batch_size = {batch_size}
optimizer = {{ kind = "sgd", lr = 0.1, momentum = 0.9 }}
[cluster]
executors = {executors}
checkpoint_dir = "{ckpt}"
"#,
            data = mnist_data(),
            ckpt = s(ckpt),
        ),
    )
}

/// A temporary directory's path as a string, for specs and arguments.
pub fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Writes files `part-<i>.parquet` with `rows[i]` rows of a noiseless regression problem,
/// `y = 2a − b/2 + v₀ − v₁`, with a float64 column `a`, an int32 column `b` and a
/// list<float32> column `v` of length 2; returns the total row count.
pub fn write_regression_data(dir: &Path, rows: &[usize], row_group_rows: usize) -> usize {
    use datafusion::arrow::array::{Float32Array, Float64Array, Int32Array, ListArray};
    use datafusion::arrow::datatypes::Float32Type;
    use rand::{RngExt, SeedableRng};

    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for (f, &n) in rows.iter().enumerate() {
        let a: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let b: Vec<i32> = (0..n).map(|_| rng.random_range(-3..=3)).collect();
        let v: Vec<[f32; 2]> = (0..n)
            .map(|_| [rng.random_range(-1.0..1.0), rng.random_range(-1.0..1.0)])
            .collect();
        let y: Vec<f32> = (0..n)
            .map(|i| (2.0 * a[i] - 0.5 * b[i] as f64) as f32 + v[i][0] - v[i][1])
            .collect();
        let list = ListArray::from_iter_primitive::<Float32Type, _, _>(
            v.iter()
                .map(|p| Some(p.iter().map(|&x| Some(x)).collect::<Vec<_>>())),
        );
        write_parquet(
            &dir.join(format!("part-{f}.parquet")),
            vec![
                ("a", Arc::new(Float64Array::from(a)) as ArrayRef),
                ("b", Arc::new(Int32Array::from(b))),
                ("v", Arc::new(list)),
                ("y", Arc::new(Float32Array::from(y))),
            ],
            row_group_rows,
        );
    }
    rows.iter().sum()
}

/// The committed MNIST `split` ("train" or "test") as one record batch (`id`, `label`,
/// `image`), or its first `limit` rows.
pub fn read_mnist(split: &str, limit: Option<usize>) -> RecordBatch {
    use datafusion::arrow::compute::concat_batches;
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let source = repo().join(format!("examples/data/mnist/{split}.parquet"));
    let mut reader =
        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(source).unwrap()).unwrap();
    if let Some(limit) = limit {
        reader = reader.with_limit(limit);
    }
    let batches: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
    concat_batches(&batches[0].schema(), &batches).unwrap()
}

/// Writes the first `rows` rows of the committed MNIST `split` ("train" or "test") to `path`
/// in row groups of `row_group_rows`, with `id`, `label`, the raw `image` (784 bytes) and
/// `png`: the same pixels as a 28 × 28 grey PNG (lossless, so both give the same features).
/// The PNG of row `truncated` (if any) is cut in half.
pub fn write_image_mnist(
    path: &Path,
    split: &str,
    rows: usize,
    row_group_rows: usize,
    truncated: Option<usize>,
) {
    use datafusion::arrow::array::{Array, AsArray, BinaryArray};
    use datafusion::arrow::datatypes::UInt8Type;
    use image::ImageEncoder;
    use image::codecs::png::PngEncoder;

    let all = read_mnist(split, Some(rows));
    let images = all.column_by_name("image").unwrap().as_fixed_size_list();
    let png: Vec<Vec<u8>> = (0..images.len())
        .map(|row| {
            let pixels = images.value(row);
            let mut bytes = Vec::new();
            PngEncoder::new(&mut bytes)
                .write_image(
                    pixels.as_primitive::<UInt8Type>().values(),
                    28,
                    28,
                    image::ExtendedColorType::L8,
                )
                .unwrap();
            if truncated == Some(row) {
                bytes.truncate(bytes.len() / 2);
            }
            bytes
        })
        .collect();
    let png = BinaryArray::from_iter_values(png.iter());
    let column = |name: &str| all.column_by_name(name).unwrap().clone();
    write_parquet(
        path,
        vec![
            ("id", column("id")),
            ("label", column("label")),
            ("image", column("image")),
            ("png", Arc::new(png)),
        ],
        row_group_rows,
    );
}
