//! What a planned job's messages would carry, checked against their bounds before it is
//! queued ([`check_preprocessing`], [`check_messages`]), so that a job that plans never sends a message its executors
//! cannot receive. The bounds are [`ringflow_core::wire`]'s; the spec's own (`data.sql`, class
//! names, the spec's size) are checked with the spec, the tokens and tags of a sequence job by
//! the planner's pass over them. Each refusal is one sentence naming the part that is too large
//! and the setting or the data that bounds it.

use prost::Message;
use ringflow_core::pb;
use ringflow_core::spec::{DataSource, SpecAsWritten};
use ringflow_core::wire::{
    MAX_EPOCH_PLAN_BYTES, MAX_FILE_LIST_BYTES, MAX_PREPROCESSING_BYTES, MAX_WRITTEN_SPEC_BYTES,
};

use super::bounds_error::TooLarge;
use crate::error::Result;
use crate::planner::JobPlan;
use crate::planner::split::RowGroup;

/// Checks what the tasks and epoch plans of `plan` would carry besides the preprocessing: the
/// files listed for `data.source = "auto"`, and one rank's partitions of each split (the
/// training split, and the test split, which is the data set (`--data`) of an evaluation or a
/// prediction).
pub fn check_messages(plan: &JobPlan) -> Result<()> {
    check_files(plan)?;
    let test = if plan.train.is_empty() {
        "--data"
    } else {
        "data.test"
    };
    check_partitions("data.train", &plan.train)?;
    check_partitions(test, &plan.test)
}

/// Checks the spec as written (text and overrides) against [`MAX_WRITTEN_SPEC_BYTES`]: every
/// training task carries it.
pub fn check_written(written: Option<&SpecAsWritten>) -> Result<()> {
    match written {
        Some(w) if w.bytes() > MAX_WRITTEN_SPEC_BYTES => Err(TooLarge::WrittenSpec {
            file: w.file.clone(),
            bytes: w.bytes(),
        }
        .into()),
        _ => Ok(()),
    }
}

/// Checks a job's preprocessing of `bytes` (as JSON) against [`MAX_PREPROCESSING_BYTES`];
/// `what` names it, `fix` says what makes it smaller.
pub fn check_preprocessing(bytes: usize, what: &str, fix: &str) -> Result<()> {
    if bytes as u64 <= MAX_PREPROCESSING_BYTES {
        return Ok(());
    }
    Err(TooLarge::Preprocessing {
        what: what.to_string(),
        bytes,
        fix: fix.to_string(),
    }
    .into())
}

/// Checks the paths every task lists for `data.source = "auto"` against
/// [`MAX_FILE_LIST_BYTES`].
fn check_files(plan: &JobPlan) -> Result<()> {
    if plan.spec.data.source != DataSource::Auto {
        return Ok(());
    }
    let bytes: usize = plan.files.iter().map(String::len).sum();
    if bytes <= MAX_FILE_LIST_BYTES {
        return Ok(());
    }
    Err(TooLarge::FileList {
        files: plan.files.len(),
        bytes,
    }
    .into())
}

/// Checks that one rank's partitions of the split `key` (at most every row group of it) fit
/// [`MAX_EPOCH_PLAN_BYTES`].
fn check_partitions(key: &str, groups: &[RowGroup]) -> Result<()> {
    let bytes = epoch_plan_bytes(groups);
    if bytes <= MAX_EPOCH_PLAN_BYTES {
        return Ok(());
    }
    Err(TooLarge::Partitions {
        key: key.to_string(),
        groups: groups.len(),
        bytes,
    }
    .into())
}

/// The encoded length of an epoch plan holding one partition of every group.
fn epoch_plan_bytes(groups: &[RowGroup]) -> usize {
    groups
        .iter()
        .map(|g| {
            let p = pb::Partition {
                path: g.path.clone(),
                row_group: g.index,
                row_offset: g.rows,
                row_count: g.rows,
                file_row_start: g.file_row_start,
                query_rows: g.after_sql.then_some(g.rows),
            };
            // The field's tag and length prefix.
            p.encoded_len() + 1 + prost::length_delimiter_len(p.encoded_len())
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(n: usize, path: &str) -> Vec<RowGroup> {
        (0..n)
            .map(|i| RowGroup {
                path: path.into(),
                index: i as u32,
                rows: 1000,
                file_row_start: 1000 * i as u64,
                bytes: 0,
                after_sql: false,
            })
            .collect()
    }

    #[test]
    fn an_epoch_plan_is_estimated_as_it_encodes() {
        let g = groups(3, "data/part-0.parquet");
        let plan = pb::EpochPlan {
            partitions: g
                .iter()
                .map(|g| pb::Partition {
                    path: g.path.clone(),
                    row_group: g.index,
                    row_offset: g.rows,
                    row_count: g.rows,
                    file_row_start: g.file_row_start,
                    query_rows: None,
                })
                .collect(),
            ..Default::default()
        };
        assert_eq!(epoch_plan_bytes(&g), plan.encoded_len());
    }

    #[test]
    fn too_many_row_groups_are_refused_naming_the_split() {
        let long = "d/".repeat(1000);
        let e = check_partitions("data.train", &groups(20_000, &long)).unwrap_err();
        let e = e.to_string();
        assert!(
            e.starts_with("data.train: its 20000 row groups would make an epoch's partitions"),
            "{e}"
        );
        assert!(e.contains("fewer, larger row groups"), "{e}");
        assert!(check_partitions("data.train", &groups(1000, "a.parquet")).is_ok());
    }

    #[test]
    fn a_preprocessing_over_its_bound_names_what_and_the_settings() {
        let fix = "lower data.vocab.max_size or data.vocab.max_token_bytes";
        assert!(check_preprocessing(1 << 30, "the vocabulary", fix).is_ok());
        let what = "data.train: the vocabulary of column `tokens` (3000000 ids)";
        let e = check_preprocessing(3 << 30, what, fix)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "data.train: the vocabulary of column `tokens` (3000000 ids) is 3.0 GiB as JSON, \
             more than the 1.0 GiB a job's preprocessing may have; lower data.vocab.max_size \
             or data.vocab.max_token_bytes"
        );
    }
}
