//! `data.sql` that drops or multiplies rows: a `WHERE`, joins that drop or multiply rows, an
//! `UNNEST`, and a filter that empties whole row groups train on 1, 2 and 4 executors with the
//! step plan and the remainder rule reckoned in the rows the query yields, on the training and
//! the test split alike; a query that yields other rows than the driver counted fails naming
//! the row group.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, Float32Array, Float64Array, Int32Array};
use rand::{RngExt, SeedableRng};

use crate::helpers::{job, ringflow, s, summary, write_parquet};

const LONG: Duration = Duration::from_secs(600);

/// Rows of each row group the tests write.
const GROUP_ROWS: usize = 40;

/// One row of the tests' data: `y = 2a - b/2`, `b` in -3..=3, `group` the row's row group
/// (numbered over all files of a split).
#[derive(Clone, Copy)]
struct Row {
    a: f64,
    b: i32,
    group: i32,
}

/// Writes `files` Parquet files of `rows` rows each into `dir` (row groups of [`GROUP_ROWS`]),
/// seeded by `seed`; returns every row.
fn write_split(dir: &Path, files: &[usize], seed: u64) -> Vec<Row> {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut all = Vec::new();
    let mut first_group = 0;
    for (f, &n) in files.iter().enumerate() {
        let rows: Vec<Row> = (0..n)
            .map(|i| Row {
                a: rng.random_range(-1.0..1.0),
                b: rng.random_range(-3..=3),
                group: first_group + (i / GROUP_ROWS) as i32,
            })
            .collect();
        first_group += n.div_ceil(GROUP_ROWS) as i32;
        let column = |f: fn(&Row) -> f64| rows.iter().map(f).collect::<Vec<f64>>();
        let y: Vec<f32> = rows
            .iter()
            .map(|r| (2.0 * r.a - 0.5 * f64::from(r.b)) as f32)
            .collect();
        write_parquet(
            &dir.join(format!("part-{f}.parquet")),
            vec![
                (
                    "a",
                    Arc::new(Float64Array::from(column(|r| r.a))) as ArrayRef,
                ),
                (
                    "b",
                    Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.b))),
                ),
                (
                    "grp",
                    Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.group))),
                ),
                ("y", Arc::new(Float32Array::from(y))),
            ],
            GROUP_ROWS,
        );
        all.extend(rows);
    }
    all
}

/// A query, the lookup tables it joins, and the rows it yields from a split's rows.
struct Case {
    name: &'static str,
    sql: &'static str,
    tables: &'static str,
    yields: fn(&[Row]) -> usize,
}

const CASES: [Case; 5] = [
    Case {
        name: "where",
        sql: "SELECT * FROM input WHERE b > 0",
        tables: "",
        yields: |rows| rows.iter().filter(|r| r.b > 0).count(),
    },
    Case {
        name: "join-drops",
        sql: "SELECT input.a, input.b, input.y FROM input JOIN keep ON input.b = keep.b",
        tables: "keep",
        yields: |rows| rows.iter().filter(|r| r.b == 1 || r.b == -2).count(),
    },
    Case {
        name: "join-doubles",
        sql: "SELECT input.a, input.b, input.y FROM input JOIN twice ON input.b = twice.b",
        tables: "twice",
        yields: |rows| 2 * rows.len(),
    },
    Case {
        name: "unnest",
        sql: "SELECT unnest(make_array(a, a, a)) AS a, b, y FROM input",
        tables: "",
        yields: |rows| 3 * rows.len(),
    },
    Case {
        name: "empties-groups",
        sql: "SELECT a, b, y FROM input WHERE grp % 3 <> 1",
        tables: "",
        yields: |rows| rows.iter().filter(|r| r.group % 3 != 1).count(),
    },
];

/// The lookup tables: `keep` holds b = 1 and b = -2; `twice` every b twice.
fn write_tables(dir: &Path) {
    std::fs::write(dir.join("keep.csv"), "b,tag\n1,one\n-2,minus-two\n").unwrap();
    let mut twice = String::from("b,copy\n");
    for b in -3..=3 {
        twice.push_str(&format!("{b},1\n{b},2\n"));
    }
    std::fs::write(dir.join("twice.csv"), twice).unwrap();
}

/// The spec of `case` over the splits in `dir`, on `executors` executors.
fn spec(dir: &Path, case: &Case, executors: usize) -> String {
    let tables = match case.tables {
        "" => String::new(),
        t => format!(
            "tables = {{ {t} = \"{}\" }}",
            s(&dir.join(format!("{t}.csv")))
        ),
    };
    let name = format!("{}-{executors}", case.name);
    job(
        dir,
        &name,
        &format!(
            r#"name = "{name}"
[data]
train = "{train}"
test = "{test}"
sql = "{sql}"
{tables}
features = ["a", "b"]
label = "y"
[model]
kind = "mlp"
layers = [2, 4, 1]
[train]
loss = "mse"
epochs = 2
batch_size = 16
[cluster]
executors = {executors}
checkpoint_dir = "{ckpt}"
"#,
            train = s(&dir.join("train")),
            test = s(&dir.join("test")),
            sql = case.sql,
            ckpt = s(&dir.join("runs").join(&name)),
        ),
    )
}

/// Every query trains on 1, 2 and 4 executors, each executor on `⌊rows / executors⌋` of the
/// rows the query yields per epoch, taking `⌈⌊rows / executors⌋ / batch_size⌉` steps, and the
/// test split is evaluated over exactly the rows the query yields from it.
#[test]
fn queries_that_drop_or_multiply_rows_train_on_the_rows_they_yield() {
    let dir = tempfile::tempdir().unwrap();
    let train = write_split(&dir.path().join("train"), &[300, 230], 1);
    let test = write_split(&dir.path().join("test"), &[130], 2);
    write_tables(dir.path());
    for case in &CASES {
        let (rows, test_rows) = ((case.yields)(&train), (case.yields)(&test));
        for executors in [1, 2, 4] {
            let out = dir.path().join(format!("{}-{executors}.json", case.name));
            let spec = spec(dir.path(), case, executors);
            let run = ringflow(&["local", &spec, "--summary-json", &s(&out)], LONG);
            run.assert_success();
            let what = format!("{} on {executors} executors", case.name);
            let per_rank = rows / executors;
            let sum = summary(&out);
            assert_eq!(sum["samples"], 2 * executors * per_rank, "{what}: {sum}");
            assert_eq!(sum["steps"], 2 * per_rank.div_ceil(16), "{what}: {sum}");
            assert_eq!(sum["test_rows"], test_rows, "{what}: {sum}");
            assert!(
                run.stderr.contains(&format!("data.sql yields {rows} rows")),
                "{what}: the job says what it counted:\n{}",
                run.stderr
            );
        }
    }
}

/// Row groups served by the driver over Arrow Flight give the same rows: the executor asks
/// for the whole row group of a range of the query's output.
#[test]
fn rows_served_by_the_driver_are_counted_alike() {
    let dir = tempfile::tempdir().unwrap();
    let train = write_split(&dir.path().join("train"), &[300, 230], 1);
    let test = write_split(&dir.path().join("test"), &[130], 2);
    write_tables(dir.path());
    let case = &CASES[2];
    let spec = spec(dir.path(), case, 2);
    let text = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(
        &spec,
        text.replace("[data]\n", "[data]\nsource = \"driver\"\n"),
    )
    .unwrap();
    let out = dir.path().join("driver.json");
    let run = ringflow(&["local", &spec, "--summary-json", &s(&out)], LONG);
    run.assert_success();
    let sum = summary(&out);
    assert_eq!(sum["samples"], 2 * 2 * ((case.yields)(&train) / 2), "{sum}");
    assert_eq!(sum["test_rows"], (case.yields)(&test), "{sum}");
}

/// A query that only projects `input` keeps every row: no counting pass, and the file's rows
/// are trained on.
#[test]
fn a_projection_needs_no_count() {
    let dir = tempfile::tempdir().unwrap();
    let train = write_split(&dir.path().join("train"), &[300, 230], 1);
    write_split(&dir.path().join("test"), &[130], 2);
    let case = Case {
        name: "projection",
        sql: "SELECT a * 2 AS a, b, y FROM input",
        tables: "",
        yields: |rows| rows.len(),
    };
    let out = dir.path().join("projection.json");
    let run = ringflow(
        &[
            "local",
            &spec(dir.path(), &case, 2),
            "--summary-json",
            &s(&out),
        ],
        LONG,
    );
    run.assert_success();
    assert_eq!(summary(&out)["samples"], 2 * 2 * (train.len() / 2));
    assert!(!run.stderr.contains("data.sql yields"), "{}", run.stderr);
}

/// A query whose rows change between the driver's count and the executor's run (random())
/// fails the job with a sentence naming the row group and the cause, instead of training on
/// other rows than planned or running out of them.
#[test]
fn a_query_that_yields_other_rows_than_counted_fails_naming_the_row_group() {
    let dir = tempfile::tempdir().unwrap();
    write_split(&dir.path().join("train"), &[2000], 1);
    write_split(&dir.path().join("test"), &[40], 2);
    let case = Case {
        name: "random",
        sql: "SELECT a, b, y FROM input WHERE random() < 0.5",
        tables: "",
        yields: |rows| rows.len(),
    };
    let run = ringflow(&["local", &spec(dir.path(), &case, 1)], LONG);
    let err = run.assert_clean_failure();
    assert!(
        err.contains("(row group ") && err.contains("where the driver counted"),
        "{err}"
    );
    assert!(err.contains("the same rows every time it runs"), "{err}");
}
