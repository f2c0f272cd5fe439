//! Reductions: sums over all elements or along one axis.

use ndarray::Axis;

use super::{CpuArray, from_vec, slice, standard};

/// The sum of all elements as a 0-dimensional array (accumulated in f64).
pub fn sum_all(x: &CpuArray) -> CpuArray {
    let s: f64 = slice(x).iter().map(|&v| v as f64).sum();
    from_vec(&[], vec![s as f32])
}

/// The sum along `axis`, keeping it as a dimension of size 1 when `keepdim`.
pub fn sum_axis(x: &CpuArray, axis: usize, keepdim: bool) -> CpuArray {
    let shape = x.shape();
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = vec![0.0f32; outer * inner];
    let xs = slice(x);
    for o in 0..outer {
        let dst = &mut out[o * inner..(o + 1) * inner];
        for l in 0..len {
            let src = &xs[(o * len + l) * inner..(o * len + l + 1) * inner];
            for (d, &s) in dst.iter_mut().zip(src) {
                *d += s;
            }
        }
    }
    let mut out_shape: Vec<usize> = shape.to_vec();
    if keepdim {
        out_shape[axis] = 1;
    } else {
        out_shape.remove(axis);
    }
    from_vec(&out_shape, out)
}

/// Repeats a reduced array back along `axis` to length `len` (the backward of [`sum_axis`]).
pub fn expand_axis(g: &CpuArray, axis: usize, len: usize, keepdim: bool) -> CpuArray {
    let g = if keepdim {
        g.clone()
    } else {
        g.clone().insert_axis(Axis(axis))
    };
    let mut shape = g.shape().to_vec();
    shape[axis] = len;
    standard(
        g.broadcast(ndarray::IxDyn(&shape))
            .expect("size-1 axis broadcasts")
            .to_owned(),
    )
}

/// The sum of squares of all elements, in f64 (for gradient norms).
pub fn sum_squares(x: &CpuArray) -> f64 {
    slice(x).iter().map(|&v| (v as f64) * (v as f64)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_along_each_axis() {
        let x = from_vec(&[2, 3], vec![1., 2., 3., 4., 5., 6.]);
        assert_eq!(slice(&sum_axis(&x, 0, false)), &[5., 7., 9.]);
        assert_eq!(slice(&sum_axis(&x, 1, false)), &[6., 15.]);
        assert_eq!(sum_axis(&x, 1, true).shape(), &[2, 1]);
        assert_eq!(slice(&sum_all(&x)), &[21.]);
        let e = expand_axis(&sum_axis(&x, 1, false), 1, 3, false);
        assert_eq!(slice(&e), &[6., 6., 6., 15., 15., 15.]);
    }
}
