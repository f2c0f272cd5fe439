//! [`each_group`]: one function over every row group of a split, on every core of the driver,
//! as the planner's passes over the data run (the rows `data.sql` yields, the labels).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::split::RowGroup;

/// `f` of every group of `groups`, in order, from as many threads as the driver has cores;
/// the first failure stops the rest and comes back with its group.
pub fn each_group<T: Send, E: Send>(
    groups: &[RowGroup],
    f: impl Fn(&RowGroup) -> Result<T, E> + Sync,
) -> Result<Vec<T>, (E, &RowGroup)> {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results: Vec<Mutex<Option<T>>> = groups.iter().map(|_| Mutex::new(None)).collect();
    let failure: Mutex<Option<(E, &RowGroup)>> = Mutex::new(None);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(groups.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(group) = groups.get(i) else {
                        break;
                    };
                    match f(group) {
                        Ok(value) => *lock(&results[i]) = Some(value),
                        Err(e) => {
                            stop.store(true, Ordering::Relaxed);
                            lock(&failure).get_or_insert((e, group));
                        }
                    }
                }
            });
        }
    });
    if let Some(failed) = lock(&failure).take() {
        return Err(failed);
    }
    Ok(results
        .into_iter()
        .filter_map(|r| r.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect())
}

/// `m` locked, poisoned or not (a panicking thread leaves nothing half-written here).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
