//! `ringflow bench ingest`: Parquet to f32 batches, counted and timed, with clear errors.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, FixedSizeListArray, Int32Array, Int64Array, UInt8Array};
use datafusion::arrow::datatypes::{DataType, Field};

use crate::helpers::{ringflow, s, write_parquet};

const DEADLINE: Duration = Duration::from_secs(120);

/// `rows` rows of an id, 4 pixels and a label, in row groups of 1,000, at `path`.
fn write_pixels(path: &std::path::Path, rows: usize) {
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    let px: Vec<u8> = (0..rows * 4).map(|i| (i % 256) as u8).collect();
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(Int64Array::from_iter_values(0..rows as i64))),
        (
            "px",
            Arc::new(FixedSizeListArray::new(
                item,
                4,
                Arc::new(UInt8Array::from(px)),
                None,
            )),
        ),
        (
            "label",
            Arc::new(Int32Array::from_iter_values(
                (0..rows as i32).map(|i| i % 10),
            )),
        ),
    ];
    write_parquet(path, columns, 1000);
}

/// The value of `key=` in a `key=value` line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
}

/// Every row of every file of a directory is read, in batches of the asked size, with the
/// columns named or, by default, every numeric one but the label.
#[test]
fn bench_ingest_counts_every_row_of_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    write_pixels(&dir.path().join("a.parquet"), 2500);
    write_pixels(&dir.path().join("b.parquet"), 700);
    let path = s(dir.path());
    let run = ringflow(
        &[
            "bench",
            "ingest",
            &path,
            "--columns",
            "px",
            "--label",
            "label",
            "--batch",
            "64",
        ],
        DEADLINE,
    );
    let line = run.assert_success().stdout.trim().to_string();
    assert_eq!(field(&line, "files"), "2", "{line}");
    assert_eq!(field(&line, "columns"), "px,label", "{line}");
    assert_eq!(field(&line, "rows"), "3200", "{line}");
    assert_eq!(field(&line, "width"), "4", "{line}");
    assert_eq!(field(&line, "batches"), "50", "{line}");
    assert!(
        field(&line, "rows_per_s").parse::<f64>().unwrap() > 0.0,
        "{line}"
    );
    assert!(field(&line, "bytes").parse::<u64>().unwrap() > 0, "{line}");

    let run = ringflow(&["bench", "ingest", &path, "--label", "label"], DEADLINE);
    let line = run.assert_success().stdout.trim().to_string();
    assert_eq!(field(&line, "columns"), "id,px,label", "{line}");
    assert_eq!(field(&line, "width"), "5", "{line}");
    assert_eq!(field(&line, "batches"), "25", "{line}");
}

/// A missing column, a path without data and a batch of 0 rows each fail with one sentence.
#[test]
fn bench_ingest_errors_name_the_file_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.parquet");
    write_pixels(&file, 10);
    let file = s(&file);
    let run = ringflow(&["bench", "ingest", &file, "--columns", "pixels"], DEADLINE);
    let err = run.assert_clean_failure();
    assert!(err.contains(&file) && err.contains("`pixels`"), "{err}");

    // A file without rows is checked against its footer all the same.
    let no_rows = dir.path().join("none.parquet");
    write_pixels(&no_rows, 0);
    let no_rows = s(&no_rows);
    let run = ringflow(
        &["bench", "ingest", &no_rows, "--columns", "pixels"],
        DEADLINE,
    );
    let err = run.assert_clean_failure();
    assert!(err.contains(&no_rows) && err.contains("`pixels`"), "{err}");

    let empty = s(&dir.path().join("nothing"));
    std::fs::create_dir(&empty).unwrap();
    let run = ringflow(&["bench", "ingest", &empty], DEADLINE);
    let err = run.assert_clean_failure();
    assert!(err.contains(&empty), "{err}");

    let run = ringflow(&["bench", "ingest", &file, "--batch", "0"], DEADLINE);
    let err = run.assert_clean_failure();
    assert!(err.contains("--batch"), "{err}");
}
