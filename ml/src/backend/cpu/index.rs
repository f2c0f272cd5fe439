//! Layout kernels: row gathers and their scatter-add, concatenation, slicing, axis permutation.

use ndarray::{Axis, IxDyn};

use super::{CpuArray, from_vec, slice, slice_mut};
use crate::backend::index::IndexOps;
use crate::error::Result;

/// Rows of `table` (`[vocab, dim...]`) picked by `indices` (any shape, integer values carried as
/// f32, range-checked by the caller). The result has shape `indices.shape() ++ table.shape()[1..]`.
pub fn index_select(table: &CpuArray, indices: &CpuArray) -> CpuArray {
    let row: usize = table.shape()[1..].iter().product();
    let ts = slice(table);
    let mut data = Vec::with_capacity(indices.len() * row);
    for &i in slice(indices) {
        let i = i as usize;
        data.extend_from_slice(&ts[i * row..(i + 1) * row]);
    }
    let mut shape = indices.shape().to_vec();
    shape.extend_from_slice(&table.shape()[1..]);
    from_vec(&shape, data)
}

/// `dst[indices[j]] += src[j]` row by row: the backward pass of [`index_select`].
pub fn index_add(dst: &mut CpuArray, indices: &CpuArray, src: &CpuArray) {
    let row: usize = dst.shape()[1..].iter().product();
    let ss = slice(src);
    let ds = slice_mut(dst);
    for (j, &i) in slice(indices).iter().enumerate() {
        let i = i as usize;
        for (d, &s) in ds[i * row..(i + 1) * row]
            .iter_mut()
            .zip(&ss[j * row..(j + 1) * row])
        {
            *d += s;
        }
    }
}

/// Joins arrays along `axis` (shapes checked by the caller): for each index of the axes before
/// `axis`, each part's contiguous run of elements in turn.
pub fn concat(parts: &[&CpuArray], axis: usize) -> CpuArray {
    let Some(first) = parts.first() else {
        return super::zeros(&[0]);
    };
    let mut shape = first.shape().to_vec();
    shape[axis] = parts.iter().map(|p| p.shape()[axis]).sum();
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let runs: Vec<(&[f32], usize)> = parts
        .iter()
        .map(|p| (slice(p), p.shape()[axis] * inner))
        .collect();
    let mut data = Vec::with_capacity(outer * shape[axis] * inner);
    for o in 0..outer {
        for &(xs, run) in &runs {
            data.extend_from_slice(&xs[o * run..(o + 1) * run]);
        }
    }
    from_vec(&shape, data)
}

/// The sub-array `start..start + len` along `axis`.
pub fn narrow(x: &CpuArray, axis: usize, start: usize, len: usize) -> CpuArray {
    x.slice_axis(Axis(axis), ndarray::Slice::from(start..start + len))
        .as_standard_layout()
        .into_owned()
}

/// The array with its axes reordered (`axes[i]` is the input axis that becomes axis `i`).
pub fn permute(x: &CpuArray, axes: &[usize]) -> CpuArray {
    x.view()
        .permuted_axes(IxDyn(axes))
        .as_standard_layout()
        .into_owned()
}

impl IndexOps for CpuArray {
    fn permute(&self, axes: &[usize]) -> Result<Self> {
        Ok(permute(self, axes))
    }

    fn concat(parts: &[&Self], axis: usize) -> Result<Self> {
        Ok(concat(parts, axis))
    }

    fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        Ok(narrow(self, axis, start, len))
    }

    fn index_select(&self, indices: &Self) -> Result<Self> {
        Ok(index_select(self, indices))
    }

    fn index_add(&mut self, indices: &Self, src: &Self) -> Result<()> {
        index_add(self, indices, src);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_then_scatter_add() {
        let table = from_vec(&[3, 2], vec![0., 1., 10., 11., 20., 21.]);
        let idx = from_vec(&[3], vec![2., 0., 2.]);
        let got = index_select(&table, &idx);
        assert_eq!(got.shape(), &[3, 2]);
        assert_eq!(slice(&got), &[20., 21., 0., 1., 20., 21.]);
        let mut dst = super::super::zeros(&[3, 2]);
        index_add(&mut dst, &idx, &from_vec(&[3, 2], vec![1.; 6]));
        assert_eq!(slice(&dst), &[1., 1., 0., 0., 2., 2.]);
    }

    #[test]
    fn concat_narrow_permute() {
        let a = from_vec(&[2, 1], vec![1., 2.]);
        let b = from_vec(&[2, 2], vec![3., 4., 5., 6.]);
        let c = concat(&[&a, &b], 1);
        assert_eq!(slice(&c), &[1., 3., 4., 2., 5., 6.]);
        assert_eq!(slice(&narrow(&c, 1, 1, 2)), &[3., 4., 5., 6.]);
        assert_eq!(slice(&permute(&b, &[1, 0])), &[3., 5., 4., 6.]);
    }
}
