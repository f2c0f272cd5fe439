use std::path::Path;

use super::*;

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

fn overlap(output: &str, input: &str) -> Option<String> {
    let inputs = [("--data".to_string(), input.to_string())];
    check_inputs(output, &inputs).err().map(|e| e.to_string())
}

#[test]
fn an_output_that_is_inside_or_around_an_input_is_refused_naming_both() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("part-00000.parquet"), "x").unwrap();
    let d = s(&data);
    let e = overlap(&d, &d).unwrap();
    assert_eq!(
        e,
        format!(
            "--output {d} is the --data {d}; predictions are never written where the job reads \
             (--overwrite does not change that), so give --output a directory outside it"
        )
    );
    // The same directory written another way, through `..` and a symbolic link.
    let dotted = format!("{d}/../d/.");
    assert!(overlap(&dotted, &d).unwrap().contains(" is the --data "));
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    assert!(overlap(&s(&link), &d).unwrap().contains(" is the --data "));
    // Inside it (not there yet), around it, and around a file or glob in it.
    let below = format!("{}/preds/new", s(&link));
    assert!(
        overlap(&below, &d)
            .unwrap()
            .contains(&format!("--output {below} is inside the --data {d}"))
    );
    let file = s(&data.join("part-00000.parquet"));
    let around = s(tmp.path());
    assert!(
        overlap(&around, &file)
            .unwrap()
            .contains("contains the --data")
    );
    assert!(overlap(&file, &file).unwrap().contains(" is the --data "));
    let glob = format!("{d}/*.parquet");
    assert!(
        overlap(&format!("{d}/preds"), &glob)
            .unwrap()
            .contains("is inside the --data")
    );
    assert!(
        overlap(&d, &format!("file://{d}"))
            .unwrap()
            .contains(" is the --data ")
    );
    // Beside it is fine: a sibling, or a name that only starts like it.
    assert_eq!(overlap(&s(&tmp.path().join("preds")), &d), None);
    assert_eq!(overlap(&format!("{d}-preds"), &d), None);
    assert_eq!(overlap(&format!("{d}/preds"), &file), None);
    // Every input is checked, and each named by its key.
    let spec: JobSpec = serde_json::from_value(serde_json::json!({
        "data": {"train": "t.parquet", "features": ["a"], "label": "y", "tables": {"names": file}},
        "model": {"kind": "mlp", "layers": [1, 1]},
    }))
    .unwrap();
    let ins = inputs("runs/m/model", "other.parquet", &spec);
    let e = check_inputs(&d, &ins).unwrap_err().to_string();
    assert!(e.contains("contains the model's data.tables.names"), "{e}");
}

#[test]
fn an_output_that_holds_anything_is_refused_without_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = s(&out);
    check_existing(&o, false).unwrap();
    std::fs::create_dir(&out).unwrap();
    check_existing(&o, false).unwrap();
    std::fs::write(out.join(LOCK_FILE), "{}").unwrap();
    check_existing(&o, false).unwrap();
    std::fs::write(out.join("part-00001.parquet"), "x").unwrap();
    std::fs::write(out.join("notes.txt"), "x").unwrap();
    assert_eq!(
        check_existing(&o, false).unwrap_err().to_string(),
        format!(
            "--output {o} already holds 2 entries (such as notes.txt); give --output a new or \
             empty directory, or pass --overwrite to replace everything in it with this run's \
             predictions"
        )
    );
    check_existing(&o, true).unwrap();
}

#[test]
fn overwrite_swaps_the_new_parts_in_whole_and_keeps_the_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir_all(out.join("sub")).unwrap();
    for old in [
        "part-00000.parquet",
        "part-00001.parquet",
        "notes.txt",
        "sub/x",
    ] {
        std::fs::write(out.join(old), "old").unwrap();
    }
    std::fs::write(out.join(LOCK_FILE), "the lock").unwrap();
    let o = s(&out);
    let dir = write_dir(&o, true, "job-1");
    assert_eq!(dir, s(&tmp.path().join(".out.ringflow-job-1")));
    assert_eq!(
        write_dir(&o, false, "job-1"),
        o,
        "without --overwrite: the output"
    );
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(Path::new(&dir).join("part-00000.parquet"), "new").unwrap();
    // The output is untouched until the commit.
    assert_eq!(
        std::fs::read_to_string(out.join("part-00000.parquet")).unwrap(),
        "old"
    );
    let note = commit(&o, "job-1", &[]).unwrap();
    assert_eq!(names(&out), ["part-00000.parquet", LOCK_FILE]);
    assert_eq!(
        std::fs::read_to_string(out.join("part-00000.parquet")).unwrap(),
        "new"
    );
    assert_eq!(
        std::fs::read_to_string(out.join(LOCK_FILE)).unwrap(),
        "the lock"
    );
    assert_eq!(names(tmp.path()), ["out"], "nothing left beside the output");
    assert!(
        note.contains("replaced whole") && note.contains("4 entries"),
        "{note}"
    );

    // A run that wrote nothing leaves an empty output; a failed run leaves it as it was.
    let note = commit(&o, "job-2", &[]).unwrap();
    assert_eq!(names(&out), [LOCK_FILE], "{note}");
    std::fs::write(out.join("part-00000.parquet"), "kept").unwrap();
    let dir = write_dir(&o, true, "job-3");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(Path::new(&dir).join("part-00000.parquet"), "lost").unwrap();
    assert!(abandon(&o, "job-3"));
    assert_eq!(names(tmp.path()), ["out"]);
    assert_eq!(
        std::fs::read_to_string(out.join("part-00000.parquet")).unwrap(),
        "kept"
    );
}

/// Without an atomic exchange (another system, or a file system without it) the old output
/// is renamed aside first; `swap` itself works whichever way this system does it.
#[test]
fn the_swap_without_an_exchange_renames_aside() {
    let tmp = tempfile::tempdir().unwrap();
    let (new, out) = (tmp.path().join(".new"), tmp.path().join("out"));
    for (dir, file) in [(&new, "a"), (&out, "b")] {
        std::fs::create_dir(dir).unwrap();
        std::fs::write(dir.join(file), file).unwrap();
    }
    let aside = swap_by_renames(&new, &out).unwrap();
    assert_eq!(aside, tmp.path().join(".new.old"));
    assert_eq!(
        (names(&out), names(&aside)),
        (vec!["a".to_string()], vec!["b".to_string()])
    );
    assert!(!new.exists());
    // When the second rename fails, the output is put back.
    let missing = tmp.path().join(".missing");
    std::fs::remove_dir_all(&aside).unwrap();
    assert!(swap_by_renames(&missing, &out).is_err());
    assert_eq!(names(&out), ["a"]);
    std::fs::create_dir(&new).unwrap();
    std::fs::write(new.join("c"), "c").unwrap();
    let old = swap(&new, &out).unwrap();
    assert_eq!(
        (names(&out), names(&old)),
        (vec!["c".to_string()], vec!["a".to_string()])
    );
}
