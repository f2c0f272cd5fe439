//! Gathering rows by index (embeddings) and its scatter-add gradient.

use crate::autodiff::{Backward, GradSink, GradWrite};
use crate::backend::Storage;
use crate::error::{MlError, Result};
use crate::ops::{check_indices, same_device};
use crate::tensor::Tensor;

struct IndexSelectBackward;

impl Backward for IndexSelectBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let (table, indices) = (&inputs[0], &inputs[1]);
        let idx = indices.read();
        sink.accumulate_with(table, |slot| match slot {
            GradWrite::Add(d) => d.index_add(&idx, g).map(|_| None),
            GradWrite::Overwrite(d) => {
                d.fill(0.0)?;
                d.index_add(&idx, g).map(|_| None)
            }
            GradWrite::New => {
                let mut d = Storage::zeros(table.shape(), table.device())?;
                d.index_add(&idx, g)?;
                Ok(Some(d))
            }
        })
    }
}

impl Tensor {
    /// Rows of `self` (`[rows, ...]`) picked by `indices` (integer-valued, any shape): the result
    /// has shape `indices.shape() ++ self.shape()[1..]`. The gradient scatters back into the
    /// picked rows, adding where an index repeats.
    pub fn index_select(&self, indices: &Tensor) -> Result<Tensor> {
        same_device("index_select", &[self, indices])?;
        if self.rank() == 0 {
            return Err(MlError::invalid(
                "index_select",
                "cannot pick rows of a scalar",
            ));
        }
        check_indices("index_select", "index", indices, self.shape()[0])?;
        let out = self.read().index_select(&indices.read())?;
        Ok(Tensor::from_op(out, &[self, indices], IndexSelectBackward))
    }
}
