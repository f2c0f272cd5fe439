//! Loss functions: cross-entropy from logits, mean squared error, binary cross-entropy with logits.
//!
//! Each returns the mean over the batch as a 0-dimensional tensor that [`Tensor::backward`] can
//! start from. The cross-entropies are fused kernels in the numerically stable form, so huge
//! logits give finite losses and gradients.

use serde::{Deserialize, Serialize};

use crate::autodiff::{Backward, GradSink};
use crate::backend::Storage;
use crate::error::{MlError, Result};
use crate::ops::{check_indices, same_device};
use crate::tensor::Tensor;

/// The loss a job trains with (`train.loss` in the job spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    /// Softmax cross-entropy of logits against integer class labels (classification).
    #[default]
    CrossEntropy,
    /// Mean squared error against float targets (regression).
    Mse,
    /// Sigmoid cross-entropy of one logit per row against 0/1 labels (binary classification).
    BinaryCrossEntropy,
}

impl LossKind {
    /// Computes this loss of `output` against `targets`.
    pub fn compute(self, output: &Tensor, targets: &Tensor) -> Result<Tensor> {
        match self {
            LossKind::CrossEntropy => cross_entropy(output, targets),
            LossKind::Mse => mse(output, targets),
            LossKind::BinaryCrossEntropy => {
                let logits = if output.rank() == 2 && output.shape()[1] == 1 {
                    output.reshape(&[output.shape()[0]])?
                } else {
                    output.clone()
                };
                binary_cross_entropy_with_logits(&logits, targets)
            }
        }
    }

    /// True for losses whose labels are class indices.
    pub fn is_classification(self) -> bool {
        matches!(self, LossKind::CrossEntropy | LossKind::BinaryCrossEntropy)
    }
}

struct CrossEntropyBackward {
    probs: Storage,
}

impl Backward for CrossEntropyBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let gx = Storage::cross_entropy_backward(&self.probs, &inputs[1].read(), g)?;
        sink.add(&inputs[0], gx)
    }
}

/// Mean softmax cross-entropy of `logits` (`[n, classes]`) against `targets` (`[n]`, class
/// indices as integer-valued floats). An index outside `0..classes` is an error naming it.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    same_device("cross_entropy", &[logits, targets])?;
    if logits.rank() != 2 || targets.rank() != 1 || targets.shape()[0] != logits.shape()[0] {
        return Err(MlError::ShapeMismatch {
            op: "cross_entropy",
            lhs: logits.shape().to_vec(),
            rhs: targets.shape().to_vec(),
            reason: "must be logits [n, classes] and class indices [n]",
        });
    }
    check_indices("cross_entropy", "label", targets, logits.shape()[1])?;
    let (loss, probs) = Storage::cross_entropy(&logits.read(), &targets.read())?;
    Ok(Tensor::from_op(
        loss,
        &[logits, targets],
        CrossEntropyBackward { probs },
    ))
}

/// Mean of `(output - target)²` over all elements (shapes must broadcast).
pub fn mse(output: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let targets = if output.rank() == 2 && output.shape()[1] == 1 && targets.rank() == 1 {
        targets.reshape(&[targets.shape()[0], 1])?
    } else {
        targets.clone()
    };
    output.sub(&targets)?.square()?.mean_all()
}

struct BceBackward;

impl Backward for BceBackward {
    fn backward(
        &self,
        inputs: &[Tensor],
        _: &Tensor,
        g: &Storage,
        sink: &mut GradSink,
    ) -> Result<()> {
        let gx = Storage::bce_with_logits_backward(&inputs[0].read(), &inputs[1].read(), g)?;
        sink.add(&inputs[0], gx)
    }
}

/// Mean binary cross-entropy of `logits` against `targets` in [0, 1] (same shape), in the
/// stable form `max(x, 0) - x·z + log(1 + e^-|x|)`.
pub fn binary_cross_entropy_with_logits(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    same_device("binary_cross_entropy_with_logits", &[logits, targets])?;
    if logits.shape() != targets.shape() {
        return Err(MlError::ShapeMismatch {
            op: "binary_cross_entropy_with_logits",
            lhs: logits.shape().to_vec(),
            rhs: targets.shape().to_vec(),
            reason: "must be equal",
        });
    }
    let loss = Storage::bce_with_logits(&logits.read(), &targets.read())?;
    Ok(Tensor::from_op(loss, &[logits, targets], BceBackward))
}
