//! The gates of one recurrent step as single ops ([`Tensor::lstm_cell`], [`Tensor::gru_cell`]):
//! one fused backend pass forward and one backward, in place of a dozen elementwise ops and
//! their graph nodes (see [`RecurrentOps`](crate::backend::RecurrentOps)).

use crate::autodiff::{Backward, GradSink, MultiBackward};
use crate::backend::Storage;
use crate::backend::recurrent::{gru_shapes, lstm_shapes};
use crate::error::{MlError, Result};
use crate::ops::same_device;
use crate::tensor::Tensor;

/// `grad`, or zeros of `like`'s shape when no gradient reached that output (kept in `slot`).
fn or_zeros<'a>(
    grad: Option<&'a Storage>,
    like: &Tensor,
    slot: &'a mut Option<Storage>,
) -> Result<&'a Storage> {
    match grad {
        Some(g) => Ok(g),
        None => Ok(slot.insert(Storage::zeros(like.shape(), like.device())?)),
    }
}

/// The gradients of the gates and the previous cell state from those of `h` and `c`.
struct LstmCellBackward {
    saved: Storage,
}

impl MultiBackward for LstmCellBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        grads: &[Option<Storage>],
        sink: &mut GradSink,
    ) -> Result<()> {
        let (gates, c_prev) = (&inputs[0], &inputs[1]);
        let (mut zero_h, mut zero_c) = (None, None);
        let dh = or_zeros(grads[0].as_ref(), c_prev, &mut zero_h)?;
        let dc = or_zeros(grads[1].as_ref(), c_prev, &mut zero_c)?;
        let (dgates, dc_prev) = Storage::lstm_cell_backward(&self.saved, dh, dc)?;
        sink.add(gates, dgates)?;
        sink.add(c_prev, dc_prev)
    }
}

/// The gradients of both gate inputs and the previous state from that of the new state.
struct GruCellBackward {
    saved: Storage,
}

impl Backward for GruCellBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let (x_gates, h_gates, h_prev) = (&inputs[0], &inputs[1], &inputs[2]);
        let (dx, dh_gates, dh_prev) = Storage::gru_cell_backward(&self.saved, g)?;
        sink.add(x_gates, dx)?;
        sink.add(h_gates, dh_gates)?;
        sink.add(h_prev, dh_prev)
    }
}

impl Tensor {
    /// One LSTM step (PyTorch's gates): from the pre-activation gates `self` (`[n, 4H]`, the
    /// input, forget, cell and output gates side by side: the step's projected input plus
    /// `h_prev·W_h`) and the previous cell state `c_prev` (`[n, H]`), the new output and cell
    /// state `(h, c)`: `c = σ(f)·c_prev + σ(i)·tanh(g)`, `h = σ(o)·tanh(c)`. One fused pass
    /// each way; the backward pass takes the gradients of both outputs at once.
    pub fn lstm_cell(&self, c_prev: &Tensor) -> Result<(Tensor, Tensor)> {
        same_device("lstm_cell", &[self, c_prev])?;
        lstm_shapes(false, self.shape(), &[c_prev.shape()])?;
        let (h, c, saved) = Storage::lstm_cell(&self.read(), &c_prev.read())?;
        let backward = LstmCellBackward { saved };
        let mut outputs = Tensor::from_multi_op(vec![h, c], &[self, c_prev], backward)?.into_iter();
        match (outputs.next(), outputs.next()) {
            (Some(h), Some(c)) => Ok((h, c)),
            _ => Err(MlError::Backward("lstm_cell lost an output".into())),
        }
    }

    /// One GRU step (PyTorch's formulation): from the step's projected input `self`
    /// (`x·W_x + b_x`, `[n, 3H]`: reset, update and candidate side by side), the recurrent
    /// product `h_gates` (`h_prev·W_h + b_h`, same layout) and the previous state `h_prev`
    /// (`[n, H]`), the new state `h = c + z·(h_prev − c)` with `r = σ(x_r + h_r)`,
    /// `z = σ(x_z + h_z)` and `c = tanh(x_c + r·h_c)`. One fused pass each way.
    pub fn gru_cell(&self, h_gates: &Tensor, h_prev: &Tensor) -> Result<Tensor> {
        same_device("gru_cell", &[self, h_gates, h_prev])?;
        gru_shapes(false, &[self.shape(), h_gates.shape()], h_prev.shape())?;
        let (h, saved) = Storage::gru_cell(&self.read(), &h_gates.read(), &h_prev.read())?;
        Ok(Tensor::from_op(
            h,
            &[self, h_gates, h_prev],
            GruCellBackward { saved },
        ))
    }
}
