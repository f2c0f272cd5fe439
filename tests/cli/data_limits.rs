//! Data that is not a regular file, and queries that never end: refused, skipped with a
//! warning, or stopped at their limit with one error naming the file or the setting, never a
//! hang. Every run has a deadline, so a regression fails the test instead of hanging it.

use std::path::Path;
use std::time::Duration;

use crate::distributed::executor;
use crate::helpers::{regression_job, ringflow, s, summary, write_regression_data};
use crate::process::Process;

const DEADLINE: Duration = Duration::from_secs(180);

/// A regression job (`y` from `a`, `b`, `v`) over `train`, with `extra` lines in `[data]`.
fn regression_spec(dir: &Path, name: &str, train: &str, extra: &str) -> String {
    let ckpt = s(&dir.join(format!("run-{name}")));
    regression_job(
        dir,
        name,
        train,
        extra,
        &format!("checkpoint_dir = \"{ckpt}\""),
    )
}

/// Makes a FIFO at `path` with `mkfifo`, as a user would.
fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// `mkfifo data/a.parquet`: named directly (as training data, `--data` or `--table`) it is
/// refused by name at once; in a directory or a glob it is skipped with a warning naming it,
/// and the job trains on the regular files.
#[test]
fn a_fifo_is_refused_by_name_or_skipped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let rows = write_regression_data(&data, &[100], 50);
    let fifo = data.join("a.parquet");
    mkfifo(&fifo);
    let (fifo, data) = (s(&fifo), s(&data));
    let refusal = format!("{fifo} is a FIFO (named pipe), not a regular file");
    let skipped = format!("skipped {fifo}: it is a FIFO (named pipe), not a regular file");

    let direct = regression_spec(dir.path(), "direct", &fifo, "");
    let run = ringflow(&["local", &direct], DEADLINE);
    let err = run.assert_clean_failure();
    assert!(err.contains(&format!("data.train: {refusal}")), "{err}");

    let glob = format!("{data}/*.parquet");
    for (name, train) in [("directory", data.as_str()), ("glob", glob.as_str())] {
        let spec = regression_spec(dir.path(), name, train, "");
        let out = dir.path().join(format!("{name}.json"));
        let run = ringflow(&["local", &spec, "--summary-json", &s(&out)], DEADLINE);
        run.assert_success();
        assert!(
            run.stderr
                .contains(&format!("warning: data.train: {skipped}")),
            "{name}: {}",
            run.stderr
        );
        // Every regular file's rows, in each of the job's two epochs.
        assert_eq!(summary(&out)["samples"], 2 * rows, "{name}");
    }

    let model = s(&dir.path().join("run-directory/model"));
    let run = ringflow(&["eval", "--model", &model, "--data", &fifo], DEADLINE);
    let err = run.assert_clean_failure();
    assert!(err.contains(&format!("--data: {refusal}")), "{err}");

    let query = "SELECT count(*) AS n FROM t";
    let run = ringflow(&["sql", query, "--table", &format!("t={fifo}")], DEADLINE);
    let err = run.assert_clean_failure();
    assert!(
        err.contains(&format!("--table t: {fifo}: is a FIFO (named pipe)")),
        "{err}"
    );
    for table in [data.clone(), glob.clone()] {
        let run = ringflow(&["sql", query, "--table", &format!("t={table}")], DEADLINE);
        run.assert_success();
        assert!(
            run.stderr
                .contains(&format!("warning: table `t`: {skipped}")),
            "{table}: {}",
            run.stderr
        );
        assert!(run.stdout.contains(&format!("| {rows} ")), "{}", run.stdout);
    }
}

/// An endless recursive query.
const ENDLESS: &str = "WITH RECURSIVE r(k) AS (SELECT 1 AS k UNION ALL SELECT k + 1 FROM r)";

/// `ringflow sql` stops an endless query at `--timeout`, naming the limit, and leaves no
/// unfinished output behind.
#[test]
fn the_sql_command_stops_an_endless_query_at_its_timeout() {
    let run = ringflow(
        &[
            "sql",
            &format!("{ENDLESS} SELECT count(*) FROM r"),
            "--timeout",
            "2",
        ],
        DEADLINE,
    );
    let err = run.assert_clean_failure();
    assert!(
        err.contains("did not finish within its time limit of 2 s (--timeout)"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out.parquet");
    let run = ringflow(
        &[
            "sql",
            &format!("{ENDLESS} SELECT k FROM r"),
            "--timeout",
            "2",
            "--output",
            &s(&output),
        ],
        DEADLINE,
    );
    run.assert_clean_failure();
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "unfinished output left behind: {left:?}");
}

/// CPU seconds a process has used (user + system), from `/proc/PID/stat`.
#[cfg(target_os = "linux")]
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / per_second
}

/// A job whose `data.sql` never ends on a row group fails naming `data.sql_timeout_s`, and the
/// query is really stopped. The query may drop rows (a filter on a join), so the driver counts
/// the rows it yields before any executor works: the count is what runs past the limit, and the
/// driver, which lives on, goes idle.
#[cfg(target_os = "linux")]
#[test]
fn an_endless_data_sql_fails_naming_its_timeout_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    write_regression_data(&data, &[100], 50);
    let spec = regression_spec(
        dir.path(),
        "endless",
        &s(&data),
        &format!(
            "sql = \"{ENDLESS} SELECT a, b, v, y FROM input CROSS JOIN \
             (SELECT count(*) AS c FROM r) x WHERE x.c > 0\"\nsql_timeout_s = 2"
        ),
    );
    let mut driver = Process::start(&["driver", "--bind", "127.0.0.1:0", "--ui", "127.0.0.1:0"]);
    let url = driver.printed_after("driver listening on ");
    let mut worker = executor(&url, &[]);
    let run = ringflow(&["submit", &spec, "--driver", &url], DEADLINE);
    let err = run.assert_clean_failure();
    let part = s(&data.join("part-0.parquet"));
    // Either row group's count may be the first to run out of time.
    assert!(
        err.contains(&format!("data.train: {part} (row group "))
            && err.contains(
                "): data.sql: counting the query's rows ran longer than data.sql_timeout_s = 2 \
                 s and was stopped"
            ),
        "{err}"
    );
    // A query left running keeps a core busy: over 5 s it would use seconds of CPU (even on
    // a loaded machine), an idle driver a few hundredths.
    let before = cpu_seconds(driver.pid());
    std::thread::sleep(Duration::from_secs(5));
    let used = cpu_seconds(driver.pid()) - before;
    assert!(used < 0.5, "the driver used {used:.2} s of CPU in 5 s");
    worker.terminate();
    driver.terminate();
}
