//! Where `predict` writes (issue 39, item 3): never over what the job reads, and never beside
//! an earlier run. An output that is, contains or lies inside `--data` or `--model` is refused
//! before any executor starts, leaving the data as it was; an output that holds anything is
//! refused unless `--overwrite`, which replaces it whole: on a file system by a rename, so that
//! exactly the new run's parts remain; on S3 by deleting afterwards what the run did not write,
//! which the run says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use ringflow_driver::outputs::LOCK_FILE;

use crate::helpers::{Run, regression_job, ringflow, s, write_regression_data};
use crate::outputs::{files_below, refused_before_executors};
use crate::s3::{BUCKET, Moto, ringflow_s3};

const DEADLINE: Duration = Duration::from_secs(300);

/// Rows of the test data: one file of five row groups, so that several executors each get
/// some.
const ROWS: u64 = 50;

/// A regression model trained in `dir/run` on `dir/data` (one file, [`ROWS`] rows in row
/// groups of 10); returns the model's directory and the data's.
fn trained(dir: &Path) -> (String, PathBuf) {
    let data = dir.join("data");
    std::fs::create_dir(&data).unwrap();
    write_regression_data(&data, &[ROWS as usize], 10);
    let ckpt = format!("checkpoint_dir = \"{}\"", s(&dir.join("run")));
    let spec = regression_job(dir, "preds", &s(&data), "", &ckpt);
    ringflow(&["local", &spec, "--ui", "off"], DEADLINE).assert_success();
    (s(&dir.join("run/model")), data)
}

/// `ringflow predict` of `model` over `data` into `output` on `executors` executors, with
/// `extra` arguments.
fn predict(model: &str, data: &str, output: &str, executors: usize, extra: &[&str]) -> Run {
    let executors = executors.to_string();
    let mut args = vec![
        "predict",
        "--model",
        model,
        "--data",
        data,
        "--output",
        output,
        "--executors",
        &executors,
    ];
    args.extend(extra);
    ringflow(&args, DEADLINE)
}

/// Every file below `dir` with its bytes.
fn contents(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    files_below(dir)
        .into_iter()
        .map(|f| {
            let bytes = std::fs::read(dir.join(&f)).unwrap();
            (f, bytes)
        })
        .collect()
}

/// The rows of each Parquet part in `dir`, by name.
fn part_rows(dir: &Path) -> BTreeMap<String, u64> {
    files_below(dir)
        .into_iter()
        .map(|f| {
            let file = std::fs::File::open(dir.join(&f)).unwrap();
            let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
            let rows = reader.metadata().file_metadata().num_rows() as u64;
            (s(&f), rows)
        })
        .collect()
}

/// `predict --data d --output d` replaced the data with predictions; an output inside or
/// around the data or the model was written too. Each is refused before any executor starts,
/// with or without `--overwrite`, naming both paths, and the data and model are unchanged.
#[test]
fn predict_never_writes_where_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (model, data) = trained(dir.path());
    let d = s(&data);
    let part = s(&data.join("part-0.parquet"));
    let before = (contents(&data), contents(Path::new(&model)));
    let ckpt = s(&dir.path().join("run"));
    let inside = s(&data.join("preds"));
    let cases = [
        (
            d.as_str(),
            d.as_str(),
            format!("--output {d} is the --data {d}"),
        ),
        (
            &part,
            &d,
            format!("--output {d} contains the --data {part}"),
        ),
        (
            &d,
            &inside,
            format!("--output {inside} is inside the --data {d}"),
        ),
        (
            &d,
            &model,
            format!("--output {model} is the --model {model}"),
        ),
        (
            &d,
            &ckpt,
            format!("--output {ckpt} contains the --model {model}"),
        ),
    ];
    for (input, output, needle) in &cases {
        for extra in [&[][..], &["--overwrite"]] {
            let run = predict(&model, input, output, 2, extra);
            let line = refused_before_executors(&run, &[needle]);
            assert!(
                line.contains("give --output a directory outside it"),
                "{line}"
            );
        }
    }
    assert!(!data.join("preds").exists(), "nothing was created");
    assert!(
        before == (contents(&data), contents(Path::new(&model))),
        "the data and the model are unchanged"
    );
    // A sibling of the data is fine.
    let beside = dir.path().join("preds");
    predict(&model, &d, &s(&beside), 2, &[]).assert_success();
    assert_eq!(part_rows(&beside).values().sum::<u64>(), ROWS);
}

/// A second run into an output, on fewer executors, left the first run's `part-00001` beside
/// its own parts (75 rows for 50 predictions), and kept unrelated files silently. It is
/// refused, naming the output and `--overwrite`, leaving the output as it was; with
/// `--overwrite` the output holds exactly the new run's parts and rows, and nothing is left
/// beside it.
#[test]
fn a_second_run_is_refused_unless_overwrite_replaces_the_output_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (model, data) = trained(dir.path());
    let (d, out) = (s(&data), dir.path().join("out"));
    let o = s(&out);
    predict(&model, &d, &o, 3, &[]).assert_success();
    let first = part_rows(&out);
    assert!(first.len() > 1, "several parts: {first:?}");
    assert_eq!(first.values().sum::<u64>(), ROWS, "{first:?}");

    let kept = contents(&out);
    let line = refused_before_executors(
        &predict(&model, &d, &o, 1, &[]),
        &[
            &format!("--output {o} already holds {} entries", first.len()),
            "--overwrite",
        ],
    );
    assert!(line.contains("such as part-00000.parquet"), "{line}");
    assert!(kept == contents(&out), "the refused run changed the output");

    let run = predict(&model, &d, &o, 1, &["--overwrite"]);
    run.assert_success();
    assert_eq!(
        part_rows(&out),
        BTreeMap::from([("part-00000.parquet".to_string(), ROWS)]),
        "exactly the new run's part"
    );
    assert!(
        run.stderr
            .contains(&format!("--overwrite: --output {o} was replaced whole")),
        "{}",
        run.stderr
    );
    let mut beside: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    beside.sort();
    assert!(
        !beside.iter().any(|n| n.starts_with(".out")),
        "nothing left beside the output: {beside:?}"
    );
    assert!(!out.join(LOCK_FILE).exists(), "the lock is released");

    // Files that are not predictions are refused too, and replaced with --overwrite.
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    refused_before_executors(
        &predict(&model, &d, &o, 2, &[]),
        &[&format!(
            "--output {o} already holds 2 entries (such as notes.txt)"
        )],
    );
    assert!(out.join("notes.txt").exists());
    predict(&model, &d, &o, 2, &["--overwrite"]).assert_success();
    let files = files_below(&out);
    assert!(
        !files.contains(&PathBuf::from("notes.txt")) && !files.is_empty(),
        "{files:?}"
    );
    assert_eq!(part_rows(&out).values().sum::<u64>(), ROWS);
}

/// On S3 there is no rename: `--overwrite` writes the new parts, then deletes every object of
/// the output the run did not write (a stale part, an unrelated object) and says so.
#[test]
fn overwrite_on_s3_deletes_what_the_run_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let (model, data) = trained(dir.path());
    let server = Moto::start();
    let preds = format!("s3://{BUCKET}/preds");
    let d = s(&data);
    let run = |executors: &str, extra: &[&str]| {
        let mut args = vec![
            "predict",
            "--model",
            &model,
            "--data",
            &d,
            "--output",
            &preds,
            "--executors",
            executors,
        ];
        args.extend(extra);
        ringflow_s3(&server, &args)
    };
    run("3", &[]).assert_success();
    let keys = |server: &Moto| -> Vec<String> {
        server.list("preds/").into_iter().map(|(k, _)| k).collect()
    };
    let first = keys(&server);
    assert!(first.len() > 1, "{first:?}");
    server.put(&[("preds/notes.txt", "README.md")]);
    let refused = run("1", &[]);
    refused_before_executors(
        &refused,
        &[&format!(
            "--output {preds} already holds {} entries",
            first.len() + 1
        )],
    );
    let replaced = run("1", &["--overwrite"]);
    replaced.assert_success();
    assert_eq!(keys(&server), ["preds/part-00000.parquet"]);
    assert!(
        replaced.stderr.contains(&format!(
            "deleted {} objects of the previous output that this run did not write",
            first.len()
        )) && replaced.stderr.contains("notes.txt"),
        "{}",
        replaced.stderr
    );
}
