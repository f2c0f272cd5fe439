//! Views the blocked product works through: an operand read with strides (so transposed
//! operands need no copy) and rectangles of the destination that threads write in parallel.

use std::marker::PhantomData;
use std::mem::MaybeUninit;

use super::MatRef;

/// A logical `rows × cols` operand: element `(i, j)` is `data[i * row_stride + j * col_stride]`.
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    /// The stored elements.
    pub data: &'a [f32],
    /// Logical rows.
    pub rows: usize,
    /// Logical columns.
    pub cols: usize,
    /// Distance between logical rows.
    pub row_stride: usize,
    /// Distance between logical columns.
    pub col_stride: usize,
}

impl<'a> Operand<'a> {
    /// The operand a [`MatRef`] describes, with its storage checked to cover every element.
    pub fn of(m: MatRef<'a>) -> Self {
        let (rows, cols) = m.logical_dims();
        let (row_stride, col_stride) = if m.transposed {
            (1, m.cols)
        } else {
            (m.cols, 1)
        };
        assert!(
            m.data.len() >= m.rows * m.cols,
            "a {}×{} operand holds only {} elements",
            m.rows,
            m.cols,
            m.data.len()
        );
        Operand {
            data: m.data,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    /// The same operand read transposed.
    pub fn t(self) -> Self {
        Operand {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }
}

/// A rectangle of the row-major destination, `rows × cols` with row stride `ld`, exclusively
/// owned by whoever holds it: rectangles are only made by splitting a unique borrow into
/// disjoint parts.
pub struct DstTile<'a> {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    ld: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: a tile is the only handle on its elements (see `split_rows`/`split_cols`), like a
// `&mut [f32]`, which is `Send`.
unsafe impl Send for DstTile<'_> {}

impl<'a> DstTile<'a> {
    /// The whole of `dst`, a contiguous row-major `rows × cols` matrix.
    pub fn new(dst: &'a mut [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(
            dst.len(),
            rows * cols,
            "the destination holds rows × cols elements"
        );
        DstTile {
            ptr: dst.as_mut_ptr(),
            rows,
            cols,
            ld: cols,
            _borrow: PhantomData,
        }
    }

    /// The whole of `dst`, a contiguous row-major `rows × cols` matrix not yet written: whoever
    /// holds the tile must write every element before anything reads one (see
    /// [`Start::Row`]).
    pub fn uninit(dst: &'a mut [MaybeUninit<f32>], rows: usize, cols: usize) -> Self {
        assert_eq!(
            dst.len(),
            rows * cols,
            "the destination holds rows × cols elements"
        );
        DstTile {
            ptr: dst.as_mut_ptr().cast(),
            rows,
            cols,
            ld: cols,
            _borrow: PhantomData,
        }
    }

    /// Writes `row` into every row of the rectangle.
    pub fn fill_rows(&mut self, row: &[f32]) {
        assert_eq!(row.len(), self.cols, "the row spans the rectangle");
        for i in 0..self.rows {
            // SAFETY: row `i` of the rectangle holds `cols` elements from `ptr + i * ld`, all
            // inside its allocation and borrowed by this tile alone; `row` is a shared slice,
            // so the two cannot overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(row.as_ptr(), self.ptr.add(i * self.ld), self.cols)
            };
        }
    }

    /// Rows of the rectangle.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of the rectangle.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Distance between rows in memory.
    pub fn ld(&self) -> usize {
        self.ld
    }

    /// The first element (for the microkernel, which writes rows × cols from it).
    pub fn ptr(&self) -> *mut f32 {
        self.ptr
    }

    /// The sub-rectangle at `(row, col)` of `rows × cols`, borrowed from this one.
    pub fn sub(&mut self, row: usize, col: usize, rows: usize, cols: usize) -> DstTile<'_> {
        assert!(
            row + rows <= self.rows && col + cols <= self.cols,
            "a sub-rectangle lies inside its rectangle"
        );
        DstTile {
            // SAFETY: (row, col) is inside the rectangle (asserted), so the offset stays in the
            // allocation the rectangle covers.
            ptr: unsafe { self.ptr.add(row * self.ld + col) },
            rows,
            cols,
            ld: self.ld,
            _borrow: PhantomData,
        }
    }

    /// Splits into the rows before `at` and those from `at` on.
    pub fn split_rows(self, at: usize) -> (Self, Self) {
        assert!(at <= self.rows, "a split point lies inside the rectangle");
        let bottom = DstTile {
            // SAFETY: row `at` is at most one past the last row: the offset stays within (or
            // one past) the rectangle's allocation.
            ptr: unsafe { self.ptr.add(at * self.ld) },
            rows: self.rows - at,
            ..self
        };
        (DstTile { rows: at, ..self }, bottom)
    }

    /// Splits into the columns before `at` and those from `at` on.
    pub fn split_cols(self, at: usize) -> (Self, Self) {
        assert!(at <= self.cols, "a split point lies inside the rectangle");
        let right = DstTile {
            // SAFETY: column `at` is at most one past the last column of the first row.
            ptr: unsafe { self.ptr.add(at) },
            cols: self.cols - at,
            ..self
        };
        (DstTile { cols: at, ..self }, right)
    }
}

/// What a product's sums are added to in its destination.
#[derive(Clone, Copy, Debug)]
pub enum Start<'a> {
    /// Nothing: the destination is overwritten.
    Zero,
    /// The destination's current values (`+=`).
    Current,
    /// The destination's current values, to which the product times the factor is added
    /// (`+= factor · a · b`; see [`Onto::AddScaled`]).
    Scaled(f32),
    /// The same row in every row of the destination (a dense layer's bias): element `(i, j)`
    /// starts as `row[j]`. The destination's previous contents are never read: each thread
    /// writes the row into its rectangle just before multiplying into it.
    Row(&'a [f32]),
}

impl<'a> Start<'a> {
    /// [`Start::Current`] when `accumulate`, else [`Start::Zero`].
    pub fn accumulating(accumulate: bool) -> Self {
        if accumulate {
            Start::Current
        } else {
            Start::Zero
        }
    }

    /// This start for the columns `col..col + cols` of the destination.
    pub fn columns(self, col: usize, cols: usize) -> Self {
        match self {
            Start::Row(row) => Start::Row(&row[col..col + cols]),
            other => other,
        }
    }

    /// Writes the start into `dst` where the product will read it; how the product's sums
    /// then meet `dst`.
    pub fn prepare(self, dst: &mut DstTile<'_>) -> Onto {
        match self {
            Start::Zero => Onto::Overwrite,
            Start::Current => Onto::Add,
            Start::Scaled(factor) => Onto::AddScaled(factor),
            Start::Row(row) => {
                dst.fill_rows(row);
                Onto::Add
            }
        }
    }
}

/// How a microkernel's sums meet the destination tile they are written to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Onto {
    /// The sums replace the tile.
    Overwrite,
    /// The sums are added to the tile.
    Add,
    /// The sums times the factor are added to the tile, `tile + factor · sums`, rounded after
    /// the multiplication and after the addition (no fused multiply-add), as a separate pass
    /// `p -= lr · g` over a stored product `g` would round them.
    AddScaled(f32),
}

impl Onto {
    /// [`Onto::Add`] when `accumulate`, else [`Onto::Overwrite`].
    pub fn accumulating(accumulate: bool) -> Self {
        if accumulate {
            Onto::Add
        } else {
            Onto::Overwrite
        }
    }

    /// How the sums of a later depth block meet a tile that holds the earlier blocks' sums:
    /// added (scaled as the first were).
    pub fn after_first_block(self) -> Self {
        match self {
            Onto::Overwrite => Onto::Add,
            other => other,
        }
    }
}
