//! Where a convolution's kernel taps read, worked out once per call: [`TapSpans`] holds, for
//! each tap `(i, j)` of the kernel, the output rows and columns whose input cell lies inside the
//! image (the others read padding), so that unrolling an image into the `[taps, oh · ow]`
//! matrix of im2col ([`im2col`]), folding that matrix back ([`col2im`]) and the depthwise
//! kernels do no division per tap or per channel: only copies and additions of runs.

use std::ops::Range;

use crate::backend::conv::Conv2dGeometry;
use crate::backend::cpu::isa::{self, MaxCpuIsa};

/// Where one kernel tap reads, the same for every channel and image.
#[derive(Clone, Debug)]
struct TapSpan {
    /// The output rows whose input row exists.
    rows: Range<usize>,
    /// The output columns whose input column exists.
    cols: Range<usize>,
    /// The input row of output row 0, plus the padding: `i · dilation` (output row `r` reads
    /// input row `r · stride + row_offset − padding`).
    row_offset: usize,
    /// The input column of the first valid output column.
    first: usize,
}

/// The spans of every kernel tap of one geometry, in the order `i · kw + j`.
#[derive(Clone, Debug)]
pub struct TapSpans {
    spans: Vec<TapSpan>,
    /// Input [height, width].
    in_size: [usize; 2],
    /// Output [height, width].
    out_size: [usize; 2],
    /// Vertical stride and padding.
    row_step: (usize, usize),
    /// Horizontal stride.
    col_stride: usize,
}

/// The outputs `o` in `0..out` whose input index `o · stride + offset − pad` lies in `0..len`.
fn valid_outputs(out: usize, len: usize, stride: usize, offset: usize, pad: usize) -> Range<usize> {
    let lo = pad.saturating_sub(offset).div_ceil(stride);
    let hi = (len + pad).saturating_sub(offset).div_ceil(stride).min(out);
    lo.min(hi)..hi
}

impl TapSpans {
    /// The spans of `g`'s kernel taps (`g` passed its `check`).
    pub fn of(g: &Conv2dGeometry) -> TapSpans {
        let [oh, ow] = g.out_size();
        let [kh, kw] = g.kernel;
        let mut spans = Vec::with_capacity(kh * kw);
        for i in 0..kh {
            for j in 0..kw {
                let (row_offset, col_offset) = (i * g.dilation[0], j * g.dilation[1]);
                let rows = valid_outputs(oh, g.in_size[0], g.stride[0], row_offset, g.padding[0]);
                let cols = valid_outputs(ow, g.in_size[1], g.stride[1], col_offset, g.padding[1]);
                let first = (cols.start * g.stride[1] + col_offset).saturating_sub(g.padding[1]);
                spans.push(TapSpan {
                    rows,
                    cols,
                    row_offset,
                    first,
                });
            }
        }
        TapSpans {
            spans,
            in_size: g.in_size,
            out_size: [oh, ow],
            row_step: (g.stride[0], g.padding[0]),
            col_stride: g.stride[1],
        }
    }

    /// Taps per channel (`kh · kw`).
    pub fn taps(&self) -> usize {
        self.spans.len()
    }

    /// Calls `f(out_row, in_row, cols, first)` for each output row of tap `tap` whose input
    /// row `in_row` exists, with the valid output columns `cols` and the input column `first`
    /// of the first of them (the others follow at the stride). Output rows not listed read
    /// only padding.
    #[inline]
    pub fn for_each_row(&self, tap: usize, mut f: impl FnMut(usize, usize, Range<usize>, usize)) {
        let span = &self.spans[tap];
        if span.cols.is_empty() {
            return;
        }
        for r in span.rows.clone() {
            f(r, self.input_row(span, r), span.cols.clone(), span.first);
        }
    }

    /// The input row that output row `r` of `span` reads (`r` one of its valid rows).
    fn input_row(&self, span: &TapSpan, r: usize) -> usize {
        let (stride, pad) = self.row_step;
        r * stride + span.row_offset - pad
    }

    /// Whether some output cell of `span` reads padding (so its row of the unrolled matrix
    /// must be zeroed first).
    fn reads_padding(&self, span: &TapSpan) -> bool {
        let [oh, ow] = self.out_size;
        span.rows != (0..oh) || span.cols != (0..ow)
    }

    /// Where the input row read by `span`'s first valid output row starts in a plane, and the
    /// step to the next one (`stride` rows); `None` when the tap reads no row.
    fn row_walk(&self, span: &TapSpan) -> Option<(usize, usize)> {
        if span.rows.is_empty() || span.cols.is_empty() {
            return None;
        }
        let w = self.in_size[1];
        Some((
            self.input_row(span, span.rows.start) * w,
            self.row_step.0 * w,
        ))
    }

    /// The input rows `span` reads from `plane`, one per valid output row in order, each from
    /// its first cell (and at least a row long).
    fn input_rows<'a>(&self, span: &TapSpan, plane: &'a [f32]) -> impl Iterator<Item = &'a [f32]> {
        let (start, step) = self.row_walk(span).unwrap_or((plane.len(), 1));
        plane[start..].chunks(step).take(span.rows.len())
    }

    /// [`TapSpans::input_rows`], to add to.
    fn input_rows_mut<'a>(
        &self,
        span: &TapSpan,
        plane: &'a mut [f32],
    ) -> impl Iterator<Item = &'a mut [f32]> {
        let (start, step) = self.row_walk(span).unwrap_or((plane.len(), 1));
        plane[start..].chunks_mut(step).take(span.rows.len())
    }
}

/// `dst[at..at + N] = src[at..at + N]`, as one fixed-size move.
#[inline(always)]
fn copy_block<const N: usize>(dst: &mut [f32], src: &[f32], at: usize) {
    let d: &mut [f32; N] = (&mut dst[at..at + N]).try_into().expect("N values");
    *d = src[at..at + N].try_into().expect("N values");
}

/// `dst.copy_from_slice(src)` for the short runs of im2col (a row of a small output plane, often
/// 8 or 24 values): up to 32 values are moved by a fixed sequence of block moves, with no loop
/// the compiler would turn back into a call to `memcpy`, whose overhead would exceed the copy.
#[inline(always)]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    let n = dst.len();
    if n > 32 {
        dst.copy_from_slice(&src[..n]);
        return;
    }
    let mut at = 0;
    for _ in 0..4 {
        if n - at >= 8 {
            copy_block::<8>(dst, src, at);
            at += 8;
        }
    }
    if n - at >= 4 {
        copy_block::<4>(dst, src, at);
        at += 4;
    }
    if n - at >= 2 {
        copy_block::<2>(dst, src, at);
        at += 2;
    }
    if n > at {
        dst[at] = src[at];
    }
}

/// Unrolls one group of one image (`[in_group, h, w]`, `x`) into `cols` (`[in_group · taps,
/// oh · ow]`), writing every element (zeros where a tap reads padding); compiled for AVX2 where
/// the CPU has it and `RINGFLOW_MAX_CPU_ISA` allows it.
pub fn im2col(x: &[f32], spans: &TapSpans, cols: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && isa::allows(MaxCpuIsa::Avx2) {
        // SAFETY: this CPU supports AVX2 (checked just above).
        unsafe { x86::im2col(x, spans, cols) };
        return;
    }
    im2col_inline(x, spans, cols);
}

/// Folds `cols` (`[in_group · taps, oh · ow]`) back onto one group of one image (`[in_group, h,
/// w]`, `x`), adding each tap's values where it read.
pub fn col2im(cols: &[f32], spans: &TapSpans, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && isa::allows(MaxCpuIsa::Avx2) {
        // SAFETY: this CPU supports AVX2 (checked just above).
        unsafe { x86::col2im(cols, spans, x) };
        return;
    }
    col2im_inline(cols, spans, x);
}

/// [`im2col`] and [`col2im`] compiled for AVX2: their short runs move and add 8 values at a time
/// (the portable build's baseline, SSE2, moves 4).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{TapSpans, col2im_inline, im2col_inline};

    /// [`super::im2col`] with AVX2 (the caller checked the CPU has it).
    #[target_feature(enable = "avx2")]
    pub(super) fn im2col(x: &[f32], spans: &TapSpans, cols: &mut [f32]) {
        im2col_inline(x, spans, cols);
    }

    /// [`super::col2im`] with AVX2 (the caller checked the CPU has it).
    #[target_feature(enable = "avx2")]
    pub(super) fn col2im(cols: &[f32], spans: &TapSpans, x: &mut [f32]) {
        col2im_inline(cols, spans, x);
    }
}

/// The body of [`im2col`], inlined into each build of it.
#[inline(always)]
fn im2col_inline(x: &[f32], spans: &TapSpans, cols: &mut [f32]) {
    let ([h, w], [oh, ow]) = (spans.in_size, spans.out_size);
    let channels = x.chunks_exact(h * w);
    for (plane, rows) in channels.zip(cols.chunks_exact_mut(spans.taps() * oh * ow)) {
        for (span, row) in spans.spans.iter().zip(rows.chunks_exact_mut(oh * ow)) {
            if spans.reads_padding(span) {
                row.fill(0.0);
            }
            let (first, valid) = (span.first, span.cols.clone());
            let out = row[span.rows.start * ow..span.rows.end * ow].chunks_exact_mut(ow);
            let pairs = out.zip(spans.input_rows(span, plane));
            if spans.col_stride == 1 {
                for (dst, src) in pairs {
                    copy_short(&mut dst[valid.clone()], &src[first..first + valid.len()]);
                }
            } else {
                for (dst, src) in pairs {
                    let src = src[first..].iter().step_by(spans.col_stride);
                    for (d, s) in dst[valid.clone()].iter_mut().zip(src) {
                        *d = *s;
                    }
                }
            }
        }
    }
}

/// The body of [`col2im`], inlined into each build of it.
#[inline(always)]
fn col2im_inline(cols: &[f32], spans: &TapSpans, x: &mut [f32]) {
    let ([h, w], [oh, ow]) = (spans.in_size, spans.out_size);
    let channels = x.chunks_exact_mut(h * w);
    for (plane, rows) in channels.zip(cols.chunks_exact(spans.taps() * oh * ow)) {
        for (span, row) in spans.spans.iter().zip(rows.chunks_exact(oh * ow)) {
            let (first, valid) = (span.first, span.cols.clone());
            let from = row[span.rows.start * ow..span.rows.end * ow].chunks_exact(ow);
            let pairs = from.zip(spans.input_rows_mut(span, plane));
            if spans.col_stride == 1 {
                for (src, dst) in pairs {
                    let dst = &mut dst[first..first + valid.len()];
                    for (d, s) in dst.iter_mut().zip(&src[valid.clone()]) {
                        *d += s;
                    }
                }
            } else {
                for (src, dst) in pairs {
                    let dst = dst[first..].iter_mut().step_by(spans.col_stride);
                    for (d, s) in dst.zip(&src[valid.clone()]) {
                        *d += s;
                    }
                }
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_outputs_are_those_that_read_inside_the_input() {
        for (out, len, stride, offset, pad) in [
            (5, 5, 1, 0, 1),
            (5, 5, 1, 2, 1),
            (3, 7, 2, 0, 0),
            (4, 7, 2, 1, 1),
            (2, 3, 3, 0, 2),
            (1, 1, 1, 2, 1),
        ] {
            let want: Vec<usize> = (0..out)
                .filter(|&o| {
                    let i = (o * stride + offset) as isize - pad as isize;
                    (0..len as isize).contains(&i)
                })
                .collect();
            let got: Vec<usize> = valid_outputs(out, len, stride, offset, pad).collect();
            assert_eq!(
                got, want,
                "out {out} len {len} stride {stride} offset {offset}"
            );
        }
    }
}
