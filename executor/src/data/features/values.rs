//! Numbers of any Arrow numeric type written into the `f32` feature matrix: the conversion
//! loops, kept simple enough for the compiler to vectorize, and when their results need no
//! check for NaN or infinity.

use datafusion::arrow::datatypes::DataType;

/// Values of one numeric Arrow type as f32.
pub(super) trait AsF32: Copy {
    /// The value as the nearest f32 (Rust's `as`, as Arrow's cast to f32 does).
    fn as_f32(self) -> f32;
}

macro_rules! as_f32 {
    ($($t:ty),*) => {$(
        impl AsF32 for $t {
            #[inline(always)]
            fn as_f32(self) -> f32 { self as f32 }
        }
    )*};
}
as_f32!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64);

// Arrow's half-precision type (the `half` crate, same version as Arrow's).
impl AsF32 for half::f16 {
    #[inline(always)]
    fn as_f32(self) -> f32 {
        self.to_f32()
    }
}

/// Copies `w` values per row into `out` at `offset` of each `stride`-wide row, times `mul`.
pub(super) fn copy_rows<T: AsF32>(
    values: &[T],
    w: usize,
    out: &mut [f32],
    stride: usize,
    offset: usize,
    mul: f32,
) {
    if w == 0 {
        return;
    }
    if w == stride {
        // One column fills whole rows: a single loop over contiguous values, which the
        // compiler vectorizes (widen, convert, multiply).
        for (d, &s) in out.iter_mut().zip(values) {
            *d = s.as_f32() * mul;
        }
        return;
    }
    for (src, dst) in values.chunks_exact(w).zip(out.chunks_exact_mut(stride)) {
        for (d, &s) in dst[offset..offset + w].iter_mut().zip(src) {
            *d = s.as_f32() * mul;
        }
    }
}

/// Whether values of type `t` times `mul` may be NaN or infinite, so that they must be checked:
/// floats may hold them, and an integer overflows f32 only through a huge multiplier (the
/// product of the type's largest magnitude and `mul` bounds every product, as rounding is
/// monotone).
pub(super) fn may_be_non_finite(t: &DataType, mul: f32) -> bool {
    let largest: f32 = match t {
        DataType::Int8 => 128.0,
        DataType::Int16 => 32_768.0,
        DataType::Int32 => 2f32.powi(31),
        DataType::Int64 => 2f32.powi(63),
        DataType::UInt8 => 255.0,
        DataType::UInt16 => 65_535.0,
        DataType::UInt32 => 2f32.powi(32),
        DataType::UInt64 => 2f32.powi(64),
        _ => return true,
    };
    !(largest * mul.abs()).is_finite()
}
