//! Dropout with an explicit, seeded random source.

use rand::RngExt;

use crate::backend::Storage;
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
        // One draw from `rng` seeds a counter-based stream: the mask is generated where the
        // tensor lives (no upload) and is the same on every device for the same `rng`.
        let seed: u64 = rng.random();
        let mask = Storage::dropout_mask(self.shape(), p, seed, self.device())?;
        self.mul(&Tensor::from_storage(mask))
    }
}
