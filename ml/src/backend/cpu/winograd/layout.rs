//! Where the Winograd transforms read and write: channels-last planes of one image
//! (`[rows, cols, lanes]`, a pixel's channels contiguous, so eight channels are one
//! [`Lanes`]) and point-major buffers of a chunk (`[α², tiles, lanes]`, each point a row-major
//! `tiles × lanes` matrix: an operand of that point's product).

use super::transform::{LANES, Lanes, ZERO, build};

/// A channels-last plane: `cols` pixels per row, `lanes` values per pixel.
#[derive(Clone, Copy, Debug)]
pub struct Plane {
    /// Pixels per row.
    pub cols: usize,
    /// Values per pixel (channels rounded up to a multiple of [`LANES`]).
    pub lanes: usize,
}

impl Plane {
    /// Where pixel `(row, col)` starts.
    #[inline(always)]
    pub fn pixel(&self, row: usize, col: usize) -> usize {
        (row * self.cols + col) * self.lanes
    }

    /// Where each pixel of an `N × N` block starts, from where its corner starts: worked out
    /// once per pass, so that the transforms' loops only add.
    #[inline(always)]
    pub fn block<const N: usize>(&self) -> [[usize; N]; N] {
        std::array::from_fn(|i| std::array::from_fn(|j| self.pixel(i, j)))
    }

    /// Writes `image` (`[channels, h, w]`, channels-first) into `plane`, pixel `(y, x)` at
    /// `(y + offset[0], x + offset[1])`, and zeros everywhere else.
    #[inline(always)]
    pub fn fill(&self, plane: &mut [f32], image: &[f32], [h, w]: [usize; 2], offset: [usize; 2]) {
        plane.fill(0.0);
        let area = h * w;
        let channels = image.len() / area.max(1);
        let whole = channels - channels % LANES;
        for y in 0..h {
            let at = |x: usize| self.pixel(y + offset[0], x + offset[1]);
            for c0 in (0..whole).step_by(LANES) {
                // Eight channels by eight pixels at a time, transposed in registers.
                let source = |l: usize, x: usize| (c0 + l) * area + y * w + x;
                let mut x = 0;
                while x + LANES <= w {
                    let block: [Lanes; LANES] = build(ZERO, |l| lanes(image, source(l, x)));
                    let pixels: [Lanes; LANES] = build(ZERO, |k| build(0.0, |l| block[l][k]));
                    for (k, pixel) in pixels.iter().enumerate() {
                        store(plane, at(x + k) + c0, pixel);
                    }
                    x += LANES;
                }
                for x in x..w {
                    let pixel: Lanes = build(0.0, |l| image[source(l, x)]);
                    store(plane, at(x) + c0, &pixel);
                }
            }
            for c in whole..channels {
                for x in 0..w {
                    plane[at(x) + c] = image[c * area + y * w + x];
                }
            }
        }
    }

    /// The inverse of [`Plane::fill`]: `image[c, y, x] = plane[y + offset[0], x + offset[1],
    /// c] + bias[c]`.
    #[inline(always)]
    pub fn extract(
        &self,
        plane: &[f32],
        image: &mut [f32],
        [h, w]: [usize; 2],
        offset: [usize; 2],
        bias: Option<&[f32]>,
    ) {
        for (c, channel) in image.chunks_exact_mut(h * w).enumerate() {
            let b = bias.map_or(0.0, |b| b[c]);
            for (y, row) in channel.chunks_exact_mut(w).enumerate() {
                let start = self.pixel(y + offset[0], offset[1]) + c;
                for (x, value) in row.iter_mut().enumerate() {
                    *value = plane[start + x * self.lanes] + b;
                }
            }
        }
    }
}

/// Elements between two points' matrices in a [`Points`] buffer: one cache line.
const SEPARATION: usize = 16;

/// A point-major buffer of a chunk: `[N², tiles, lanes]`, the points' matrices a little apart.
#[derive(Clone, Copy, Debug)]
pub struct Points {
    /// Tiles in the chunk.
    pub tiles: usize,
    /// Values per tile and point (channels rounded up to a multiple of [`LANES`]).
    pub lanes: usize,
}

impl Points {
    /// Elements of the buffer for `points` points.
    pub fn len(&self, points: usize) -> usize {
        points * self.stride()
    }

    /// Elements from one point's matrix to the next: the matrix and a cache line, so that the
    /// points of a tile, written and read together, do not fall in the same cache set (a
    /// matrix is often a multiple of 4 KiB).
    pub fn stride(&self) -> usize {
        self.tiles * self.lanes + SEPARATION
    }

    /// Where tile `tile`'s values at the first point start.
    #[inline(always)]
    pub fn tile(&self, tile: usize) -> usize {
        tile * self.lanes
    }

    /// Where a tile's values at each of the `N × N` points start, from where they start at the
    /// first: worked out once per pass, so that the transforms' loops only add.
    #[inline(always)]
    pub fn points<const N: usize>(&self) -> [[usize; N]; N] {
        std::array::from_fn(|i| std::array::from_fn(|j| (i * N + j) * self.stride()))
    }
}

/// The [`LANES`] values from `at`.
#[inline(always)]
pub fn lanes(buf: &[f32], at: usize) -> Lanes {
    buf[at..at + LANES].try_into().expect("a group of lanes")
}

/// Writes `value` at `at`.
#[inline(always)]
pub fn store(buf: &mut [f32], at: usize, value: &Lanes) {
    buf[at..at + LANES].copy_from_slice(value);
}

/// Adds `value` at `at`.
#[inline(always)]
pub fn add(buf: &mut [f32], at: usize, value: &Lanes) {
    for (sum, v) in buf[at..at + LANES].iter_mut().zip(value) {
        *sum += v;
    }
}
