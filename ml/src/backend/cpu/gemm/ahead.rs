//! Asking the cache hierarchy for operand blocks before they are packed.
//!
//! A product packs a block of each operand, then lets the microkernel work on the packed copies
//! for a long while. When the operands are not in the caches (a busy host's neighbour evicted
//! them from the shared L3, or they were last written long ago), the packing waits on memory at
//! every block, with the microkernel idle, and most of that wait is in packing `b`
//! (`gemm_bench --cold` times products whose operands were flushed from the caches). [`Ahead`]
//! asks for the next block's lines a few at a time, one share before each microkernel tile,
//! while the microkernel works on the current block, so that they are in the caches by the time
//! they are packed. A few at a time, because a burst of prefetches overflows the core's queue of
//! misses and most of it is dropped: lines asked for all at once are read nearly as slowly as
//! uncached ones, while the same lines asked for a few at a time are read as cached ones.
//! [`prefetch_block`] asks for a block at once, just before it is read.

use super::pack::{Block, check_block};
use super::view::Operand;
use crate::backend::cpu::prefetch_lines;

/// The contiguous runs of memory a block of an operand occupies: a row of a row-major operand,
/// a column of a transposed one.
#[derive(Clone, Copy, Default)]
struct Runs {
    /// Index of the first run's first element.
    first: usize,
    /// How many runs.
    count: usize,
    /// Elements in a run.
    len: usize,
    /// Distance between the starts of two runs.
    stride: usize,
}

impl Runs {
    /// The runs of `block` of `op`: none where the block is empty or neither of the operand's
    /// strides is 1 (nothing contiguous to ask for).
    fn of(op: &Operand<'_>, block: Block) -> Runs {
        check_block(op, block);
        let first = block.row * op.row_stride + block.col * op.col_stride;
        let (count, len, stride) = if block.rows == 0 || block.cols == 0 {
            (0, 0, 0)
        } else if op.col_stride == 1 {
            (block.rows, block.cols, op.row_stride)
        } else if op.row_stride == 1 {
            (block.cols, block.rows, op.col_stride)
        } else {
            (0, 0, 0)
        };
        Runs {
            first,
            count,
            len,
            stride,
        }
    }

    /// Run `i`'s elements in `data`.
    fn run<'a>(&self, data: &'a [f32], i: usize) -> &'a [f32] {
        let start = self.first + i * self.stride;
        &data[start..start + self.len]
    }
}

/// Asks for every line of `block` of `op` now, into every cache level: for a block read right
/// after (the first chunk of a short product's `b`). A hint only: nothing is read, and a
/// prefetch never faults.
pub fn prefetch_block(op: &Operand<'_>, block: Block) {
    let runs = Runs::of(op, block);
    for i in 0..runs.count {
        prefetch_lines(runs.run(op.data, i));
    }
}

/// A block of an operand asked for over a number of calls to [`Ahead::step`], an even share of
/// its runs each, while the microkernel works on the block before it. The default asks for
/// nothing.
#[derive(Default)]
pub struct Ahead<'a> {
    /// The operand's elements.
    data: &'a [f32],
    /// The runs left to ask for are `next..end` of these.
    runs: Runs,
    /// The first run not yet asked for.
    next: usize,
    /// One past the last run to ask for.
    end: usize,
    /// Runs asked for by a call to `step`.
    per_step: usize,
}

impl<'a> Ahead<'a> {
    /// Share `part` of `parts` of `block`'s runs (all of them for `(0, 1)`; none without a
    /// block), asked for over `steps` calls to [`Ahead::step`]. The shares of `parts` calls
    /// cover every run once.
    pub fn part(
        op: &Operand<'a>,
        block: Option<Block>,
        (part, parts): (usize, usize),
        steps: usize,
    ) -> Self {
        let Some(block) = block else {
            return Ahead::default();
        };
        let runs = Runs::of(op, block);
        let share = |part: usize| (runs.count * part / parts.max(1)).min(runs.count);
        let (next, end) = (share(part), share(part + 1));
        Ahead {
            data: op.data,
            runs,
            next,
            end,
            per_step: (end - next).div_ceil(steps.max(1)),
        }
    }

    /// The runs not yet asked for, as indices among the block's runs.
    #[cfg(test)]
    fn pending(&self) -> std::ops::Range<usize> {
        self.next..self.end
    }

    /// Asks for the next share of the runs.
    #[inline]
    pub fn step(&mut self) {
        let stop = (self.next + self.per_step).min(self.end);
        for i in self.next..stop {
            prefetch_lines(self.runs.run(self.data, i));
        }
        self.next = stop;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row-major `rows × cols` operand over `data`.
    fn row_major(data: &[f32], rows: usize, cols: usize) -> Operand<'_> {
        Operand {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    #[test]
    fn the_shares_of_a_block_cover_its_runs_once_within_their_steps() {
        let data = vec![0.0; 40 * 30];
        let op = row_major(&data, 40, 30);
        let block = Block {
            row: 3,
            col: 5,
            rows: 37,
            cols: 20,
        };
        for parts in [1, 2, 3, 5, 37, 50] {
            let mut covered = Vec::new();
            for part in 0..parts {
                let steps = 7;
                let mut ahead = Ahead::part(&op, Some(block), (part, parts), steps);
                covered.extend(ahead.pending());
                for _ in 0..steps {
                    ahead.step();
                }
                assert!(
                    ahead.pending().is_empty(),
                    "{parts} parts: part {part} left runs"
                );
            }
            assert_eq!(covered, (0..37).collect::<Vec<_>>(), "{parts} parts");
        }
    }

    #[test]
    fn a_transposed_block_runs_along_its_columns() {
        let data = vec![0.0; 30 * 40];
        let op = row_major(&data, 30, 40).t();
        let block = Block {
            row: 2,
            col: 4,
            rows: 10,
            cols: 6,
        };
        let runs = Runs::of(&op, block);
        assert_eq!((runs.count, runs.len, runs.stride), (6, 10, 40));
        assert_eq!(runs.first, 4 * 40 + 2);
        assert_eq!(runs.run(&data, 5).len(), 10);
    }

    #[test]
    fn nothing_to_ask_for_without_a_block() {
        let data = vec![0.0; 16];
        let mut ahead = Ahead::part(&row_major(&data, 4, 4), None, (0, 1), 3);
        assert!(ahead.pending().is_empty());
        ahead.step();
    }
}
