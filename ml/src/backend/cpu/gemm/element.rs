//! The elements of packed panels ([`PackedElement`]: f32, and pairs of bfloat16 values) with
//! each thread's packing buffers, and [`borrow`], which lends a thread's buffer out for a call.
//! A leaf: the microkernels, the packers and the zero-step lists import it, it imports none
//! of them.

use std::cell::Cell;

/// The element of packed panels, which owns each thread's packing buffers for its type.
pub trait PackedElement: Copy + Default + Send + Sync + 'static {
    /// Runs `f` on this thread's packing buffers for `a` and `b`, kept between products.
    /// They are taken out while in use, so a nested product on the same thread (rayon runs
    /// other jobs while waiting) simply gets fresh ones.
    fn with_buffers<R>(f: impl FnOnce(&mut Vec<Self>, &mut Vec<Self>) -> R) -> R;

    /// The bits of the element's representation that are not a sign: none of them is set
    /// exactly when the element adds nothing to a product (±0, or ±0 in both halves of a
    /// pair).
    const MAGNITUDE: u32;

    /// The element's bits, masked by [`PackedElement::MAGNITUDE`].
    fn magnitude_bits(self) -> u32;
}

/// Runs `f` on what a thread's `cell` holds, taken out for the call (a nested call on the same
/// thread meanwhile gets a fresh default) and put back afterwards: the packing buffers, the
/// step lists of `zero_steps.rs`.
pub fn borrow<T: Default, R>(cell: &Cell<T>, f: impl FnOnce(&mut T) -> R) -> R {
    let mut held = cell.take();
    let result = f(&mut held);
    cell.set(held);
    result
}

thread_local! {
    /// This thread's f32 packing buffers.
    static F32_BUFFERS: Cell<(Vec<f32>, Vec<f32>)> = const { Cell::new((Vec::new(), Vec::new())) };
    /// This thread's packing buffers of bf16 pairs.
    static PAIR_BUFFERS: Cell<(Vec<u32>, Vec<u32>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

impl PackedElement for f32 {
    fn with_buffers<R>(f: impl FnOnce(&mut Vec<Self>, &mut Vec<Self>) -> R) -> R {
        F32_BUFFERS.with(|cell| borrow(cell, |(a, b)| f(a, b)))
    }

    const MAGNITUDE: u32 = 0x7fff_ffff;

    fn magnitude_bits(self) -> u32 {
        self.to_bits() & Self::MAGNITUDE
    }
}

/// Two bfloat16 values, the lower one in the low half: a pair of consecutive steps of depth.
impl PackedElement for u32 {
    fn with_buffers<R>(f: impl FnOnce(&mut Vec<Self>, &mut Vec<Self>) -> R) -> R {
        PAIR_BUFFERS.with(|cell| borrow(cell, |(a, b)| f(a, b)))
    }

    const MAGNITUDE: u32 = 0x7fff_7fff;

    fn magnitude_bits(self) -> u32 {
        self & Self::MAGNITUDE
    }
}
