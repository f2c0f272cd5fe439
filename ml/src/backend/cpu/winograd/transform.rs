//! The transforms of Winograd's minimal filtering F(2, r) (Lavin and Gray, 2016), for r = 3
//! and r = 5, on [`Lanes`]: eight channels of one tile at a time, so that every transform is a
//! few vector additions and multiplications by small constants.
//!
//! In one dimension, two outputs of an r-tap correlation `y = Aᵀ[(G g) ⊙ (Bᵀ d)]` come from
//! `α = r + 1` inputs `d`, the filter `g` and α products instead of 2r; in two dimensions a
//! 2 × 2 output tile costs α² products instead of 4r² (36 instead of 100 for 5 × 5, 16 instead
//! of 36 for 3 × 3). The matrices come from the interpolation points 0, ±1 (and ±2 for r = 5)
//! and infinity; `Bᵀ` has small integers, so an input's transform is exact up to one rounding
//! per addition, and the fractions are in `G`, applied once per call to the weights.
//!
//! Each [`Minimal`] gives the four one-dimensional maps (Bᵀ, its transpose B, Aᵀ and A, the
//! transposes being the backward passes' maps) and `G`; `both!` applies a map along both
//! axes of a tile.

/// Channels handled together by one vector of a transform.
pub const LANES: usize = 8;

/// One value per channel of a group of [`LANES`] channels.
pub type Lanes = [f32; LANES];

/// A group of channels that are all zero.
pub const ZERO: Lanes = [0.0; LANES];

/// `[f(0), …, f(N - 1)]`, written in place. The passes build their columns and lane groups
/// with this rather than `std::array::from_fn`, which returns its array through a copy (a
/// `memmove` call for a column of [`Lanes`]) wherever the compiler declines to inline it, which
/// an unrelated change elsewhere in the crate can make it do.
#[inline(always)]
pub fn build<T: Copy, const N: usize>(zero: T, mut f: impl FnMut(usize) -> T) -> [T; N] {
    let mut out = [zero; N];
    for (i, value) in out.iter_mut().enumerate() {
        *value = f(i);
    }
    out
}

/// `Σ cᵢ · xᵢ`, lane by lane.
#[inline(always)]
fn combine<const N: usize>(terms: [(f32, &Lanes); N]) -> Lanes {
    let mut sum = ZERO;
    for (c, x) in terms {
        for (s, v) in sum.iter_mut().zip(x) {
            *s += c * v;
        }
    }
    sum
}

/// Winograd's F(2, r) with `A = r + 1` points: the one-dimensional maps and `G`.
pub trait Minimal<const A: usize, const R: usize> {
    /// The filter transform `G` (`A × R`).
    const G: [[f32; R]; A];

    /// `Bᵀ d`: an input run of `A` values to the `A` interpolation points.
    fn input(d: &[Lanes; A]) -> [Lanes; A];

    /// `B v`: the transpose of [`Minimal::input`], taking a gradient back to the inputs.
    fn input_t(v: &[Lanes; A]) -> [Lanes; A];

    /// `Aᵀ m`: the `A` products back to the two outputs.
    fn output(m: &[Lanes; A]) -> [Lanes; 2];

    /// `A y`: the transpose of [`Minimal::output`], taking the outputs' gradient to the
    /// products.
    fn output_t(y: &[Lanes; 2]) -> [Lanes; A];
}

/// F(2, 3): points 0, 1, −1 and infinity.
pub struct F2x3;

impl Minimal<4, 3> for F2x3 {
    const G: [[f32; 3]; 4] = [
        [1.0, 0.0, 0.0],
        [0.5, 0.5, 0.5],
        [0.5, -0.5, 0.5],
        [0.0, 0.0, 1.0],
    ];

    #[inline(always)]
    fn input([d0, d1, d2, d3]: &[Lanes; 4]) -> [Lanes; 4] {
        [
            combine([(1.0, d0), (-1.0, d2)]),
            combine([(1.0, d1), (1.0, d2)]),
            combine([(-1.0, d1), (1.0, d2)]),
            combine([(-1.0, d1), (1.0, d3)]),
        ]
    }

    #[inline(always)]
    fn input_t([v0, v1, v2, v3]: &[Lanes; 4]) -> [Lanes; 4] {
        [
            *v0,
            combine([(1.0, v1), (-1.0, v2), (-1.0, v3)]),
            combine([(-1.0, v0), (1.0, v1), (1.0, v2)]),
            *v3,
        ]
    }

    #[inline(always)]
    fn output([m0, m1, m2, m3]: &[Lanes; 4]) -> [Lanes; 2] {
        [
            combine([(1.0, m0), (1.0, m1), (1.0, m2)]),
            combine([(1.0, m1), (-1.0, m2), (1.0, m3)]),
        ]
    }

    #[inline(always)]
    fn output_t([y0, y1]: &[Lanes; 2]) -> [Lanes; 4] {
        [
            *y0,
            combine([(1.0, y0), (1.0, y1)]),
            combine([(1.0, y0), (-1.0, y1)]),
            *y1,
        ]
    }
}

/// F(2, 5): points 0, 1, −1, 2, −2 and infinity.
pub struct F2x5;

impl Minimal<6, 5> for F2x5 {
    const G: [[f32; 5]; 6] = {
        let (s, t, f) = (1.0 / 6.0, 1.0 / 12.0, 1.0 / 24.0);
        [
            [0.25, 0.0, 0.0, 0.0, 0.0],
            [-s, -s, -s, -s, -s],
            [-s, s, -s, s, -s],
            [f, t, s, 2.0 * s, 4.0 * s],
            [f, -t, s, -2.0 * s, 4.0 * s],
            [0.0, 0.0, 0.0, 0.0, 1.0],
        ]
    };

    #[inline(always)]
    fn input([d0, d1, d2, d3, d4, d5]: &[Lanes; 6]) -> [Lanes; 6] {
        [
            combine([(4.0, d0), (-5.0, d2), (1.0, d4)]),
            combine([(-4.0, d1), (-4.0, d2), (1.0, d3), (1.0, d4)]),
            combine([(4.0, d1), (-4.0, d2), (-1.0, d3), (1.0, d4)]),
            combine([(-2.0, d1), (-1.0, d2), (2.0, d3), (1.0, d4)]),
            combine([(2.0, d1), (-1.0, d2), (-2.0, d3), (1.0, d4)]),
            combine([(4.0, d1), (-5.0, d3), (1.0, d5)]),
        ]
    }

    #[inline(always)]
    fn input_t([v0, v1, v2, v3, v4, v5]: &[Lanes; 6]) -> [Lanes; 6] {
        [
            combine([(4.0, v0)]),
            combine([(-4.0, v1), (4.0, v2), (-2.0, v3), (2.0, v4), (4.0, v5)]),
            combine([(-5.0, v0), (-4.0, v1), (-4.0, v2), (-1.0, v3), (-1.0, v4)]),
            combine([(1.0, v1), (-1.0, v2), (2.0, v3), (-2.0, v4), (-5.0, v5)]),
            combine([(1.0, v0), (1.0, v1), (1.0, v2), (1.0, v3), (1.0, v4)]),
            *v5,
        ]
    }

    #[inline(always)]
    fn output([m0, m1, m2, m3, m4, m5]: &[Lanes; 6]) -> [Lanes; 2] {
        [
            combine([(1.0, m0), (1.0, m1), (1.0, m2), (1.0, m3), (1.0, m4)]),
            combine([(1.0, m1), (-1.0, m2), (2.0, m3), (-2.0, m4), (1.0, m5)]),
        ]
    }

    #[inline(always)]
    fn output_t([y0, y1]: &[Lanes; 2]) -> [Lanes; 6] {
        [
            *y0,
            combine([(1.0, y0), (1.0, y1)]),
            combine([(1.0, y0), (-1.0, y1)]),
            combine([(1.0, y0), (2.0, y1)]),
            combine([(1.0, y0), (-2.0, y1)]),
            *y1,
        ]
    }
}

/// `$map` (a function of `[Lanes; $n]` to `[Lanes; $m]`) along both axes of a square tile,
/// from `$read(i, j)` to `$write(i, j, value)`: on every column, then on every row of the
/// result (for `$map(v) = M v`, the tile `x` becomes `M x Mᵀ`). The tile is read and written
/// in place, never moved whole (a 6 × 6 tile of [`Lanes`] is over a kilobyte, which the
/// compiler would copy with `memcpy`), and `$map` is called by name, so that it is inlined
/// into a caller compiled for AVX2.
macro_rules! both {
    ($n:expr => $m:expr, $read:expr, $map:path, $write:expr) => {{
        let (read, mut write) = ($read, $write);
        let mut columns = [[$crate::backend::cpu::winograd::transform::ZERO; $n]; $m];
        for j in 0..$n {
            let column: [Lanes; $n] = $crate::backend::cpu::winograd::transform::build(
                $crate::backend::cpu::winograd::transform::ZERO,
                |i| read(i, j),
            );
            for (row, value) in columns.iter_mut().zip($map(&column)) {
                row[j] = value;
            }
        }
        for (i, row) in columns.iter().enumerate() {
            let values = $map(row);
            for (j, value) in values.iter().enumerate() {
                write(i, j, value);
            }
        }
    }};
}

/// `M x` for a matrix of constants `M` (`ROWS × N`), lane by lane.
#[inline(always)]
fn apply<const N: usize, const ROWS: usize>(m: &[[f32; N]; ROWS], x: &[Lanes; N]) -> [Lanes; ROWS] {
    let mut out = [ZERO; ROWS];
    for (row, o) in m.iter().zip(out.iter_mut()) {
        for (c, v) in row.iter().zip(x) {
            for (s, x) in o.iter_mut().zip(v) {
                *s += c * x;
            }
        }
    }
    out
}

/// `G g Gᵀ` for eight `R × R` filters at once (one per lane), from `read(k, l)` (tap `(k,
/// l)`) to `write(i, j, value)` (point `(i, j)`).
#[inline(always)]
pub fn filter<const A: usize, const R: usize, F: Minimal<A, R>>(
    read: impl Fn(usize, usize) -> Lanes,
    write: impl FnMut(usize, usize, &Lanes),
) {
    let g = |column: &[Lanes; R]| apply(&F::G, column);
    both!(R => A, read, g, write);
}

/// `Gᵀ u G`: the transpose of [`filter`], taking eight transformed filters' gradients at the
/// points (`read(i, j)`) back to the filters' taps (`write(k, l, value)`).
#[inline(always)]
pub fn filter_t<const A: usize, const R: usize, F: Minimal<A, R>>(
    read: impl Fn(usize, usize) -> Lanes,
    write: impl FnMut(usize, usize, &Lanes),
) {
    let gt: [[f32; A]; R] = std::array::from_fn(|k| std::array::from_fn(|i| F::G[i][k]));
    let g_t = |column: &[Lanes; A]| apply(&gt, column);
    both!(A => R, read, g_t, write);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lanes holding `v` in lane 0 and `v + lane` elsewhere (distinct per lane).
    fn lanes(v: f32) -> Lanes {
        std::array::from_fn(|l| v + l as f32)
    }

    /// `Aᵀ[(G g) ⊙ (Bᵀ d)]` equals the two outputs of the direct correlation `Σₖ g[k] d[i + k]`,
    /// in every lane, and each map's transpose is its adjoint: `⟨M x, y⟩ = ⟨x, Mᵀ y⟩`.
    fn check<const A: usize, const R: usize, F: Minimal<A, R>>() {
        let d: [Lanes; A] = std::array::from_fn(|i| lanes(0.5 + i as f32 * 1.25));
        let g: [f64; R] = std::array::from_fn(|k| 0.75 - k as f64 * 0.5);
        let v = F::input(&d);
        let m: [Lanes; A] = std::array::from_fn(|i| {
            let gi: f64 = (0..R).map(|k| F::G[i][k] as f64 * g[k]).sum();
            std::array::from_fn(|l| gi as f32 * v[i][l])
        });
        let y = F::output(&m);
        for (i, out) in y.iter().enumerate() {
            for (l, got) in out.iter().enumerate() {
                let want: f64 = (0..R).map(|k| g[k] * d[i + k][l] as f64).sum();
                assert!((*got as f64 - want).abs() < 1e-4, "output {i} lane {l}");
            }
        }
        let dot = |a: &[Lanes], b: &[Lanes]| -> f32 {
            a.iter()
                .zip(b)
                .map(|(x, y)| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>())
                .sum()
        };
        let w: [Lanes; A] = std::array::from_fn(|i| lanes(1.0 - i as f32 * 0.375));
        assert!((dot(&F::input(&d), &w) - dot(&d, &F::input_t(&w))).abs() < 1e-2);
        let y2 = [lanes(0.25), lanes(-1.5)];
        assert!((dot(&F::output(&w), &y2) - dot(&w, &F::output_t(&y2))).abs() < 1e-3);
    }

    #[test]
    fn minimal_filtering_computes_the_correlation_and_transposes_are_adjoints() {
        check::<4, 3, F2x3>();
        check::<6, 5, F2x5>();
    }

    /// `⟨G g Gᵀ, u⟩ = ⟨g, Gᵀ u G⟩` for the filter maps, in every lane.
    #[test]
    fn the_filter_maps_are_adjoint() {
        let g: [[Lanes; 5]; 5] =
            std::array::from_fn(|k| std::array::from_fn(|l| lanes((k * 5 + l) as f32 * 0.1 - 1.0)));
        let u: [[Lanes; 6]; 6] =
            std::array::from_fn(|i| std::array::from_fn(|j| lanes((i + 2 * j) as f32 * 0.2 - 0.7)));
        let (mut gu, mut ug) = ([[ZERO; 6]; 6], [[ZERO; 5]; 5]);
        filter::<6, 5, F2x5>(|k, l| g[k][l], |i, j, v| gu[i][j] = *v);
        filter_t::<6, 5, F2x5>(|i, j| u[i][j], |k, l, v| ug[k][l] = *v);
        for l in 0..LANES {
            let dot = |a: &[Lanes], b: &[Lanes]| -> f64 {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| x[l] as f64 * y[l] as f64)
                    .sum()
            };
            let left = dot(gu.as_flattened(), u.as_flattened());
            let right = dot(g.as_flattened(), ug.as_flattened());
            assert!(
                (left - right).abs() < 1e-4 * left.abs().max(1.0),
                "{left} against {right}"
            );
        }
    }
}
