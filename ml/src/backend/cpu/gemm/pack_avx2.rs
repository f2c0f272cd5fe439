//! AVX2 packing of the two operand layouts that need a transposition on the way into panels:
//! a row-major `a` (its rows interleaved into panels of up to 8 rows) and a transposed `b` (its
//! stored rows become the columns of panels of a multiple of 8 columns). Both go through 8 × 8
//! register transposes, eight steps of depth at a time; the remaining steps are copied one
//! element at a time.

use super::tokens::Avx2Fma;

impl Avx2Fma {
    /// Packs one whole `a` panel: `MR` rows (at most 8), `depth` columns, row `r` starting at
    /// `src[r * ld]`, into `dst` (`depth` steps of `MR`).
    pub fn pack_a_rows<const MR: usize>(
        self,
        dst: &mut [f32],
        src: &[f32],
        ld: usize,
        depth: usize,
    ) {
        assert!(MR <= 8, "a panel of at most 8 rows");
        assert!(dst.len() >= depth * MR, "the panel holds depth steps");
        assert!(
            depth == 0 || (MR - 1) * ld + depth <= src.len(),
            "the rows lie in the operand"
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the token proves AVX2; `src` holds the MR rows of `depth` elements and `dst`
        // depth steps of MR (asserted above).
        unsafe {
            x86::pack_a_rows::<MR>(dst, src, ld, depth);
        }
    }

    /// Packs one whole `b` panel read transposed: `NR` columns (a multiple of 8), `depth`
    /// rows, column `j` stored contiguously from `src[j * ld]`, into `dst` (`depth` steps of
    /// `NR`).
    pub fn pack_b_columns<const NR: usize>(
        self,
        dst: &mut [f32],
        src: &[f32],
        ld: usize,
        depth: usize,
    ) {
        assert!(NR.is_multiple_of(8), "a panel of whole groups of 8 columns");
        assert!(dst.len() >= depth * NR, "the panel holds depth steps");
        assert!(
            depth == 0 || (NR - 1) * ld + depth <= src.len(),
            "the columns lie in the operand"
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as for `pack_a_rows`, with NR columns of `depth` elements.
        unsafe {
            x86::pack_b_columns::<NR>(dst, src, ld, depth);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Transposes 8 rows of 8 into 8 columns of 8.
    #[target_feature(enable = "avx2")]
    fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }

    /// See [`super::Avx2Fma::pack_a_rows`].
    ///
    /// # Safety
    /// AVX2 is available, `MR <= 8`, `src` holds `(MR - 1) * ld + depth` elements and `dst`
    /// `depth * MR`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn pack_a_rows<const MR: usize>(
        dst: &mut [f32],
        src: &[f32],
        ld: usize,
        depth: usize,
    ) {
        let full = depth / 8 * 8;
        let lanes: [i32; 8] = std::array::from_fn(|i| if i < MR { -1 } else { 0 });
        // SAFETY: `lanes` holds 8 i32.
        let mask = unsafe { _mm256_loadu_si256(lanes.as_ptr().cast()) };
        for p0 in (0..full).step_by(8) {
            let mut rows = [_mm256_setzero_ps(); 8];
            for (r, row) in rows.iter_mut().take(MR).enumerate() {
                debug_assert!(r * ld + p0 + 8 <= src.len());
                // SAFETY: row r's elements p0..p0 + 8 lie in `src` (p0 + 8 <= depth).
                *row = unsafe { _mm256_loadu_ps(src.as_ptr().add(r * ld + p0)) };
            }
            let columns = transpose8(rows);
            for (q, column) in columns.into_iter().enumerate().take(7) {
                debug_assert!((p0 + q) * MR + 8 <= dst.len());
                // SAFETY: step p0 + q + 1 < depth follows in `dst`, so the 8 lanes from step
                // p0 + q's slots end inside it (MR <= 8); its first 8 - MR slots are written
                // again next.
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add((p0 + q) * MR), column) };
            }
            debug_assert!((p0 + 7) * MR + MR <= dst.len());
            // SAFETY: step p0 + 7 < depth has MR slots in `dst`; the mask writes only those
            // (a full store could pass the end of the panel).
            unsafe { _mm256_maskstore_ps(dst.as_mut_ptr().add((p0 + 7) * MR), mask, columns[7]) };
        }
        for p in full..depth {
            for r in 0..MR {
                dst[p * MR + r] = src[r * ld + p];
            }
        }
    }

    /// See [`super::Avx2Fma::pack_b_columns`].
    ///
    /// # Safety
    /// AVX2 is available, `NR` is a multiple of 8, `src` holds `(NR - 1) * ld + depth`
    /// elements and `dst` `depth * NR`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn pack_b_columns<const NR: usize>(
        dst: &mut [f32],
        src: &[f32],
        ld: usize,
        depth: usize,
    ) {
        let full = depth / 8 * 8;
        for p0 in (0..full).step_by(8) {
            for half in 0..NR / 8 {
                let mut columns = [_mm256_setzero_ps(); 8];
                for (i, column) in columns.iter_mut().enumerate() {
                    let start = (half * 8 + i) * ld + p0;
                    debug_assert!(start + 8 <= src.len());
                    // SAFETY: column half * 8 + i < NR holds elements p0..p0 + 8 < depth.
                    *column = unsafe { _mm256_loadu_ps(src.as_ptr().add(start)) };
                }
                for (q, step) in transpose8(columns).into_iter().enumerate() {
                    let at = (p0 + q) * NR + half * 8;
                    debug_assert!(at + 8 <= dst.len());
                    // SAFETY: step p0 + q < depth has NR slots in `dst`, 8 of them from `at`.
                    unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(at), step) };
                }
            }
        }
        for p in full..depth {
            for j in 0..NR {
                dst[p * NR + j] = src[j * ld + p];
            }
        }
    }
}
