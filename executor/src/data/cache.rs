//! Decoded row groups kept in memory between epochs (Spark's `cache()`), within a byte budget.
//!
//! Decoding Parquet costs about as much CPU as training a small model on the same rows, so an
//! executor keeps the row groups it has decoded — as Arrow record batches of just the needed
//! columns — for the rest of the task, until `data.cache_mb` is used up. Later epochs slice
//! their partitions out of the cache instead of reading files. Row groups that do not fit are
//! streamed from storage every epoch as usual; memory never exceeds the budget plus the
//! shuffle buffer.
//!
//! Plain numeric row groups of local files bypass the cache: the read-ahead's direct reader
//! decodes their pages every epoch nearly as fast as their cached columns would convert
//! ([`ReadContext::direct_path`](crate::data::partitions::ReadContext::direct_path)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::record_batch::RecordBatch;

/// A row group's decoded batches.
pub type CachedRowGroup = Arc<Vec<RecordBatch>>;

/// The cache of one task.
#[derive(Debug)]
pub struct RowGroupCache {
    budget: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    used: usize,
    full: bool,
    groups: HashMap<(String, u32), CachedRowGroup>,
}

impl RowGroupCache {
    /// A cache of at most `budget` bytes (0 disables it).
    pub fn new(budget: usize) -> Arc<RowGroupCache> {
        Arc::new(RowGroupCache {
            budget,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached batches of a row group.
    pub fn get(&self, path: &str, row_group: u32) -> Option<CachedRowGroup> {
        self.state()
            .groups
            .get(&(path.to_string(), row_group))
            .cloned()
    }

    /// True while new row groups may still fit.
    pub fn accepting(&self) -> bool {
        self.budget > 0 && !self.state().full
    }

    /// Keeps `batches` if they fit in what is left of the budget; once one does not fit, the
    /// cache stops accepting (the rest of the data is streamed).
    pub fn insert(&self, path: &str, row_group: u32, batches: Vec<RecordBatch>) -> CachedRowGroup {
        let bytes: usize = batches.iter().map(RecordBatch::get_array_memory_size).sum();
        let group = Arc::new(batches);
        let mut s = self.state();
        if s.used + bytes <= self.budget {
            s.used += bytes;
            s.groups
                .insert((path.to_string(), row_group), group.clone());
        } else {
            s.full = true;
        }
        group
    }

    /// Bytes held.
    pub fn used(&self) -> usize {
        self.state().used
    }
}

/// The record batches covering rows `offset..offset + count` of a cached row group (slices
/// share the cached memory).
pub fn slice_rows(group: &[RecordBatch], offset: u64, count: u64) -> Vec<(RecordBatch, u64)> {
    let mut out = Vec::new();
    let (mut start, end) = (offset as usize, (offset + count) as usize);
    let mut at = 0usize;
    for b in group {
        let (lo, hi) = (at, at + b.num_rows());
        if hi > start && lo < end {
            let from = start.max(lo);
            let to = end.min(hi);
            out.push((b.slice(from - lo, to - from), from as u64));
            start = to;
        }
        at = hi;
        if at >= end {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Array, Int32Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(values: std::ops::Range<i32>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int32Array::from_iter_values(values))]).unwrap()
    }

    #[test]
    fn slices_span_batches() {
        let group = vec![batch(0..4), batch(4..10), batch(10..12)];
        let parts = slice_rows(&group, 3, 8);
        let values: Vec<i32> = parts
            .iter()
            .flat_map(|(b, _)| {
                let a = b
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .unwrap()
                    .clone();
                a.values().to_vec()
            })
            .collect();
        assert_eq!(values, (3..11).collect::<Vec<_>>());
        assert_eq!(
            parts.iter().map(|(_, first)| *first).collect::<Vec<_>>(),
            [3, 4, 10]
        );
    }

    #[test]
    fn the_budget_is_never_exceeded() {
        let one = batch(0..1000).get_array_memory_size();
        let cache = RowGroupCache::new(one * 2 + one / 2);
        cache.insert("f", 0, vec![batch(0..1000)]);
        cache.insert("f", 1, vec![batch(0..1000)]);
        assert!(cache.accepting());
        cache.insert("f", 2, vec![batch(0..1000)]);
        assert!(!cache.accepting());
        assert!(cache.get("f", 1).is_some() && cache.get("f", 2).is_none());
        assert!(cache.used() <= one * 2 + one / 2);
        assert!(!RowGroupCache::new(0).accepting());
    }
}
