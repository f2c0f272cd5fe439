//! Dropout with an explicit, seeded random source.

use rand::RngExt;

use crate::error::{MlError, Result};
use crate::tensor::Tensor;

impl Tensor {
    /// Zeroes each element with probability `p` and scales the rest by `1 / (1 - p)` (inverted
    /// dropout, as in PyTorch), drawing the mask from `rng` so that runs are reproducible.
    /// With `p = 0` the tensor is returned as is.
    pub fn dropout(&self, p: f32, rng: &mut impl rand::Rng) -> Result<Tensor> {
        if !(0.0..1.0).contains(&p) {
            return Err(MlError::invalid(
                "dropout",
                format!("probability {p} is outside [0, 1)"),
            ));
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        let keep = 1.0 / (1.0 - p);
        let mask: Vec<f32> = (0..self.numel())
            .map(|_| if rng.random::<f32>() < p { 0.0 } else { keep })
            .collect();
        let mask = Tensor::from_vec(mask, self.shape(), self.device())?;
        self.mul(&mask)
    }
}
