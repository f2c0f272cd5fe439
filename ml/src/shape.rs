//! Shapes and NumPy-style broadcasting.
//!
//! Two shapes broadcast when, aligned at their last dimension, every pair of dimensions is equal
//! or one of them is 1; a missing leading dimension counts as 1. This is the rule of NumPy,
//! PyTorch and ndarray.

use crate::error::{MlError, Result};

/// The number of elements of a tensor with this shape (1 for a scalar).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The shape that `lhs` and `rhs` broadcast to, or an error naming both shapes.
pub fn broadcast_shape(op: &'static str, lhs: &[usize], rhs: &[usize]) -> Result<Vec<usize>> {
    let rank = lhs.len().max(rhs.len());
    let mut out = vec![0; rank];
    for (i, dim) in out.iter_mut().enumerate() {
        let l = dim_from_end(lhs, rank - 1 - i);
        let r = dim_from_end(rhs, rank - 1 - i);
        *dim = match (l, r) {
            (a, b) if a == b => a,
            (1, b) => b,
            (a, 1) => a,
            _ => {
                return Err(MlError::ShapeMismatch {
                    op,
                    lhs: lhs.to_vec(),
                    rhs: rhs.to_vec(),
                    reason: "cannot be broadcast together",
                });
            }
        };
    }
    Ok(out)
}

/// Dimension `from_end` positions before the last one, or 1 past the leading edge.
fn dim_from_end(shape: &[usize], from_end: usize) -> usize {
    if from_end < shape.len() {
        shape[shape.len() - 1 - from_end]
    } else {
        1
    }
}

/// Resolves a possibly negative axis (`-1` is the last) against a rank. A 0-dimensional tensor
/// has no axis at all.
pub fn resolve_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let resolved = if axis < 0 { rank as isize + axis } else { axis };
    if resolved < 0 || resolved as usize >= rank {
        return Err(MlError::invalid(
            op,
            format!("axis {axis} is out of range for a tensor of rank {rank}"),
        ));
    }
    Ok(resolved as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shape("t", &[4, 3], &[3]).unwrap(), vec![4, 3]);
        assert_eq!(broadcast_shape("t", &[4, 1], &[1, 5]).unwrap(), vec![4, 5]);
        assert_eq!(broadcast_shape("t", &[], &[2, 2]).unwrap(), vec![2, 2]);
        assert!(broadcast_shape("t", &[4, 3], &[4]).is_err());
    }

    #[test]
    fn negative_axes_count_from_the_end() {
        assert_eq!(resolve_axis("t", -1, 3).unwrap(), 2);
        assert_eq!(resolve_axis("t", 0, 3).unwrap(), 0);
        assert!(resolve_axis("t", 3, 3).is_err());
        assert!(resolve_axis("t", -4, 3).is_err());
        assert!(resolve_axis("t", 0, 0).is_err());
        assert!(resolve_axis("t", -1, 0).is_err());
    }
}
