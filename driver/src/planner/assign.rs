//! Splitting row groups into per-rank partitions.
//!
//! **Training.** Each epoch the row groups are put in an order shuffled by `(seed, epoch)` and
//! dealt out as contiguous row ranges: every rank gets exactly `⌊rows / N⌋` rows, so every rank
//! runs the same number of steps, `⌈⌊rows / N⌋ / batch_size⌉` (the last batch of an epoch may be
//! smaller, equally on every rank). The remainder, `rows mod N` rows (fewer than N), is left
//! out of that epoch; because the order changes every epoch, a different tail is left out
//! each time. A row group that straddles two ranks is split at a row boundary.
//!
//! **Evaluation.** Row groups in file order; every row is evaluated exactly once, ranks taking
//! `⌊rows / N⌋` or one more.
//!
//! Where `data.sql` may drop or multiply rows, a row group's rows are the rows the query yields
//! over it (counted when the job was planned, [`counting`](super::counting)), and a partition's
//! range is a range of that output ([`Partition::query_rows`] set): the rules above then hold
//! for the rows training really sees.

use rand::seq::SliceRandom;
use ringflow_core::pb::{EpochPlan, Partition};
use ringflow_ml::rng::{self, streams};

use crate::error::Result;
use crate::planner::plan_error::TooFewRows;
use crate::planner::split::RowGroup;

/// Fails unless the split has at least one row per rank (`after_sql`: rows that `data.sql`
/// yields).
pub fn check_enough_rows(
    key: &str,
    groups: &[RowGroup],
    world: usize,
    after_sql: bool,
) -> Result<()> {
    let rows: u64 = groups.iter().map(|g| g.rows).sum();
    if rows < world as u64 {
        return Err(TooFewRows {
            key: key.to_string(),
            rows,
            after_sql,
            world,
        }
        .into());
    }
    Ok(())
}

/// Every rank's training plan for `epoch`.
pub fn train_epoch(
    groups: &[RowGroup],
    world: usize,
    seed: u64,
    epoch: u64,
    batch_size: usize,
) -> Vec<EpochPlan> {
    let mut order: Vec<&RowGroup> = groups.iter().collect();
    let mut rng = rng::seeded(
        seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        streams::SHUFFLE,
    );
    order.shuffle(&mut rng);
    let total: u64 = groups.iter().map(|g| g.rows).sum();
    let per_rank = total / world as u64;
    let shares = vec![per_rank; world];
    let steps = per_rank.div_ceil(batch_size as u64);
    deal(&order, &shares, epoch, steps)
}

/// Every rank's share of an evaluation split.
pub fn evaluation(groups: &[RowGroup], world: usize) -> Vec<EpochPlan> {
    let order: Vec<&RowGroup> = groups.iter().collect();
    let total: u64 = groups.iter().map(|g| g.rows).sum();
    let (base, extra) = (total / world as u64, total % world as u64);
    let shares: Vec<u64> = (0..world as u64)
        .map(|r| base + u64::from(r < extra))
        .collect();
    deal(&order, &shares, 0, 0)
}

/// Deals `order`'s rows out to ranks as contiguous ranges of `shares[r]` rows.
fn deal(order: &[&RowGroup], shares: &[u64], epoch: u64, steps: u64) -> Vec<EpochPlan> {
    let mut plans: Vec<EpochPlan> = shares
        .iter()
        .map(|_| EpochPlan {
            epoch,
            partitions: Vec::new(),
            rows: 0,
            steps,
            reform: false,
        })
        .collect();
    let mut rank = 0;
    for g in order {
        let mut offset = 0;
        while offset < g.rows && rank < shares.len() {
            let want = shares[rank] - plans[rank].rows;
            if want == 0 {
                rank += 1;
                continue;
            }
            let take = want.min(g.rows - offset);
            plans[rank].partitions.push(Partition {
                path: g.path.clone(),
                row_group: g.index,
                row_offset: offset,
                row_count: take,
                file_row_start: g.file_row_start,
                query_rows: g.after_sql.then_some(g.rows),
            });
            plans[rank].rows += take;
            offset += take;
        }
    }
    plans
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn groups(sizes: &[u64]) -> Vec<RowGroup> {
        let mut start = 0;
        sizes
            .iter()
            .enumerate()
            .map(|(i, &rows)| {
                let g = RowGroup {
                    path: "f.parquet".into(),
                    index: i as u32,
                    rows,
                    file_row_start: start,
                    bytes: 0,
                    after_sql: false,
                };
                start += rows;
                g
            })
            .collect()
    }

    /// How often each (row group, row) is assigned.
    fn coverage(plans: &[EpochPlan]) -> HashMap<(u32, u64), u32> {
        let mut seen = HashMap::new();
        for p in plans {
            for part in &p.partitions {
                for r in part.row_offset..part.row_offset + part.row_count {
                    *seen.entry((part.row_group, r)).or_insert(0) += 1;
                }
            }
        }
        seen
    }

    #[test]
    fn training_gives_equal_shares_and_drops_fewer_than_n_rows() {
        let g = groups(&[10_000, 10_000, 10_000, 10_000, 10_000, 10_003]);
        for world in 1..=7 {
            for epoch in 0..3 {
                let plans = train_epoch(&g, world, 42, epoch, 128);
                assert_eq!(plans.len(), world);
                let per_rank = 60_003 / world as u64;
                for p in &plans {
                    assert_eq!(p.rows, per_rank);
                    assert_eq!(p.steps, per_rank.div_ceil(128));
                    let sum: u64 = p.partitions.iter().map(|x| x.row_count).sum();
                    assert_eq!(sum, per_rank);
                }
                let seen = coverage(&plans);
                assert!(seen.values().all(|&c| c == 1), "a row was assigned twice");
                assert_eq!(seen.len() as u64, 60_003 - 60_003 % world as u64);
            }
        }
    }

    #[test]
    fn the_order_changes_with_the_epoch_and_not_with_anything_else() {
        let g = groups(&[5, 5, 5, 5, 5, 5, 5, 5]);
        let a = train_epoch(&g, 2, 1, 0, 4);
        assert_eq!(a, train_epoch(&g, 2, 1, 0, 4));
        assert_ne!(a, train_epoch(&g, 2, 1, 1, 4));
    }

    #[test]
    fn evaluation_covers_every_row_once() {
        let g = groups(&[7, 3, 11]);
        for world in 1..=5 {
            let plans = evaluation(&g, world);
            let seen = coverage(&plans);
            assert_eq!(seen.len(), 21);
            assert!(seen.values().all(|&c| c == 1));
            let max = plans.iter().map(|p| p.rows).max().unwrap();
            let min = plans.iter().map(|p| p.rows).min().unwrap();
            assert!(max - min <= 1);
        }
    }

    #[test]
    fn too_few_rows_is_an_error() {
        let err = check_enough_rows("data.train", &groups(&[3]), 4, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "data.train holds 3 rows, fewer than the 4 executors that would share them"
        );
        let err = check_enough_rows("data.train", &groups(&[3]), 4, true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "data.train holds 3 rows after data.sql, fewer than the 4 executors that would \
             share them"
        );
    }
}
