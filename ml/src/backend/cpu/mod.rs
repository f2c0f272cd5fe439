//! CPU kernels over contiguous ndarray storage.
//!
//! Every function here takes and returns arrays in standard (row-major, contiguous) layout, so the
//! hot loops run over plain slices that the compiler vectorizes. Matrix products go through
//! [`gemm`]: a packed AVX2 + FMA GEMM chosen at run time (the `gemm` crate on other CPUs);
//! everything else is a single pass over memory. [`isa`] reads the settings that cap what the
//! run-time choices may use (`RINGFLOW_MAX_CPU_ISA`, `RINGFLOW_L1D_KIB`).
//!
//! Convolutions unroll their windows for the GEMM (`conv.rs`, `unroll.rs`), except depthwise
//! ones (`depthwise.rs`, direct) and stride-1 3×3 and 5×5 ones with enough channels
//! (`winograd/`, Winograd's minimal filtering). Outputs that a kernel writes whole are made by
//! [`filled`], which zeroes each piece just before the kernel writes it.
//!
//! The CPU backend's storage is [`CpuArray`] itself: each file holds one kind of kernel and the
//! implementation of that kind's backend trait (`elementwise.rs` implements
//! [`ElementwiseOps`](crate::backend::ElementwiseOps), ...), overriding the default methods with
//! fused kernels where it has them.

pub mod conv;
mod depthwise;
pub mod elementwise;
pub mod gemm;
pub mod index;
pub mod isa;
pub mod loss;
mod memory;
pub mod norm;
pub mod optim;
pub mod pool;
pub mod random;
pub mod recurrent;
pub mod reduce;
mod scratch;
pub mod softmax;
mod unroll;
mod winograd;

use std::mem::MaybeUninit;
use std::ops::Range;

use ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;

/// Elements below which a kernel stays on one thread (rayon's overhead would dominate).
pub const PAR_MIN: usize = 1 << 15;
/// Elements per parallel chunk.
pub const PAR_CHUNK: usize = 1 << 13;

/// Floats in a 64-byte cache line.
const LINE_FLOATS: usize = 16;

/// Asks the cache hierarchy for every cache line of `values` (one prefetch per line, the last
/// element's included), ahead of reading them: a packed block's rows, a shuffled row of a
/// batch. A hint only: nothing is read, and a prefetch never faults.
#[inline(always)]
pub fn prefetch_lines(values: &[f32]) {
    let Some(last) = values.last() else {
        return;
    };
    for at in (0..values.len()).step_by(LINE_FLOATS) {
        prefetch(&values[at]);
    }
    prefetch(last);
}

/// A prefetch of the cache line holding `x` into every level.
#[inline(always)]
fn prefetch(x: &f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64; a prefetch reads nothing and `x` is a valid reference.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(x).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// Runs `f(chunk, range)` over `out` in chunks, on all threads of the current pool when `out` is
/// large. `range` locates the chunk in `out`, to index the inputs. Each element is written by
/// exactly one call, so results do not depend on the number of threads.
pub fn par_for(out: &mut [f32], f: impl Fn(&mut [f32], Range<usize>) + Sync + Send) {
    if out.len() < PAR_MIN {
        let n = out.len();
        f(out, 0..n);
        return;
    }
    out.par_chunks_mut(PAR_CHUNK)
        .enumerate()
        .for_each(|(i, chunk)| {
            let start = i * PAR_CHUNK;
            let end = start + chunk.len();
            f(chunk, start..end)
        });
}

/// A new array of `shape` made by `f(index, piece)` for each `chunk`-long piece of its elements
/// in order (the last may be shorter), on all threads of the current pool when the array is
/// large. Each piece is zeroed just before `f` gets it, while it is in the cache, instead of the
/// whole array first: an output that `f` overwrites costs one pass over memory, not two.
pub fn filled(
    shape: &[usize],
    chunk: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) -> CpuArray {
    let len: usize = shape.iter().product();
    let mut data: Vec<f32> = Vec::with_capacity(len);
    let spare = &mut data.spare_capacity_mut()[..len];
    let work = |(i, piece): (usize, &mut [MaybeUninit<f32>])| f(i, zeroed(piece));
    if len < PAR_MIN {
        spare.chunks_mut(chunk.max(1)).enumerate().for_each(work);
    } else {
        spare
            .par_chunks_mut(chunk.max(1))
            .enumerate()
            .for_each(work);
    }
    // SAFETY: `zeroed` initialized every element of `spare`, the first `len` of the capacity.
    unsafe { data.set_len(len) };
    from_vec(shape, data)
}

/// [`filled`] in [`PAR_CHUNK`] pieces, `f` also given each piece's range in the array (to index
/// the inputs): [`zeros`] and [`par_for`] in one pass.
pub fn par_filled(shape: &[usize], f: impl Fn(&mut [f32], Range<usize>) + Sync + Send) -> CpuArray {
    filled(shape, PAR_CHUNK, |i, piece| {
        let start = i * PAR_CHUNK;
        f(piece, start..start + piece.len())
    })
}

/// `piece` with every element set to zero, as initialized values.
fn zeroed(piece: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    piece.fill(MaybeUninit::new(0.0));
    // SAFETY: every element was initialized just above, and `MaybeUninit<f32>` has the size,
    // alignment and (once initialized) the values of `f32`.
    unsafe { &mut *(piece as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// A contiguous f32 array on the host.
pub type CpuArray = ArrayD<f32>;

/// A zero-filled array of this shape. Large arrays are filled on all threads of the current
/// pool (written in place: rayon extends a vector of known length without a copy), since a
/// reused heap block is not zero and one core's memset would take its whole length.
pub fn zeros(shape: &[usize]) -> CpuArray {
    let len: usize = shape.iter().product();
    if len < PAR_ZERO_MIN {
        return ArrayD::zeros(IxDyn(shape));
    }
    let mut data = Vec::with_capacity(len);
    data.par_extend(rayon::iter::repeat_n(0.0f32, len).with_min_len(PAR_CHUNK));
    from_vec(shape, data)
}

/// Elements from which [`zeros`] fills on all threads: a few hundred KiB, tens of microseconds
/// on one core.
const PAR_ZERO_MIN: usize = 1 << 16;

/// The array's elements as a slice (it must be in standard layout, which every kernel keeps).
pub fn slice(a: &CpuArray) -> &[f32] {
    a.as_slice()
        .expect("ringflow CPU arrays are always kept in standard layout")
}

/// The array's elements as a mutable slice (standard layout, see [`slice()`]).
pub fn slice_mut(a: &mut CpuArray) -> &mut [f32] {
    a.as_slice_mut()
        .expect("ringflow CPU arrays are always kept in standard layout")
}

/// Makes an array standard-layout, copying only if it is not already.
pub fn standard(a: CpuArray) -> CpuArray {
    if a.is_standard_layout() {
        a
    } else {
        a.as_standard_layout().into_owned()
    }
}

/// An array of this shape from a vector of its elements in row-major order.
pub fn from_vec(shape: &[usize], data: Vec<f32>) -> CpuArray {
    ArrayD::from_shape_vec(IxDyn(shape), data).expect("caller checked the element count")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Large arrays, filled on the pool's threads, are zero in every element, also where the
    /// heap block they reuse held other values.
    #[test]
    fn zeros_are_zero_above_and_below_the_parallel_size() {
        for len in [PAR_ZERO_MIN - 1, PAR_ZERO_MIN, 3 * PAR_ZERO_MIN + 17] {
            drop(vec![1.5f32; len]);
            let z = zeros(&[len / 3, 3]);
            assert_eq!(z.shape(), [len / 3, 3]);
            assert!(slice(&z).iter().all(|&x| x == 0.0), "{len} elements");
        }
    }

    /// Every element of a filled array is the one its piece's call wrote, small or large, with
    /// a last piece shorter than the others, also where the heap block held other values.
    #[test]
    fn filled_arrays_hold_what_each_piece_wrote() {
        for len in [0, 5, PAR_MIN - 1, 3 * PAR_MIN + 17] {
            drop(vec![1.5f32; len]);
            let a = par_filled(&[len], |piece, range| {
                for (v, i) in piece.iter_mut().zip(range) {
                    *v += i as f32;
                }
            });
            let want: Vec<f32> = (0..len).map(|i| i as f32).collect();
            assert_eq!(slice(&a), want, "{len} elements");
            let b = filled(&[len], 7, |i, piece| piece[0] = i as f32);
            let want = (0..len).map(|j| if j % 7 == 0 { (j / 7) as f32 } else { 0.0 });
            assert!(slice(&b).iter().copied().eq(want), "{len} elements in 7s");
        }
    }
}
