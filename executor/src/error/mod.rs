//! The executor's error types: [`ExecutorError`] for everything that can stop a task, and
//! [`CommError`] (with its [`Peer`] and [`CommOp`]) for failures to talk to the driver or to
//! the other executors.

mod comm;
mod spec;

pub use comm::{CommError, CommOp, Peer};
pub use spec::Unrunnable;

use ringflow_ml::MlError;

use crate::data::error::{QueryError, ServeError};
use crate::data::images::error::ImageColumnError;
use ringflow_core::data::DataError;
use ringflow_core::spec::Compression;

/// Everything that can stop an executor's task.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutorError {
    /// Bad or unreadable data; the message names the file, column and row.
    #[error("{file}: {message}")]
    Data {
        /// The file (or URL) at fault.
        file: String,
        /// What is wrong, naming the column and row where one applies.
        message: String,
    },
    /// A batch's image column (`data.image`) cannot be decoded.
    #[error("{file}: column `{column}` (data.image) {source}")]
    Image {
        /// The file of the batch.
        file: String,
        /// `data.image.column`.
        column: String,
        /// Why (boxed: every result of a task carries this type).
        source: Box<ImageColumnError>,
    },
    /// `data.sql` over a partition failed, ran too long, or yielded other rows than the driver
    /// counted (`site` names the file, row group and step).
    #[error("{site}: {source}")]
    Query {
        /// `<file> (row group N, after data.sql)`.
        site: String,
        /// Why.
        source: QueryError,
    },
    /// Loading `data.tables` or planning `data.sql` ran past `data.sql_timeout_s`.
    #[error(transparent)]
    Sql(#[from] QueryError),
    /// The driver could not serve a partition (`path`) that this executor cannot read itself.
    #[error("{path}: cannot be served by the driver at {url}: {source}")]
    Served {
        /// The partition's file.
        path: String,
        /// The driver's URL.
        url: String,
        /// Why.
        source: ServeError,
    },
    /// A tensor-engine failure (shapes, devices, checkpoints).
    #[error(transparent)]
    Ml(#[from] MlError),
    /// The job spec (or a command's settings) cannot be run as given on this executor.
    #[error(transparent)]
    Unrunnable(#[from] Unrunnable),
    /// A document the driver sent (the job spec, the preprocessing, a merged partial) cannot
    /// be read; the message names the message field.
    #[error("the driver sent what this executor cannot read: {0}")]
    Payload(#[from] ringflow_core::wire::payload::PayloadError),
    /// The job's device is not usable on this executor.
    #[error("executor {executor} cannot use the job's cluster.device = \"{device}\": {source}")]
    DeviceUnusable {
        /// The executor's id.
        executor: String,
        /// `cluster.device`, as the spec writes it.
        device: String,
        /// Why, as the tensor engine says (boxed: every result of a task carries this type).
        source: Box<MlError>,
    },
    /// The driver sent something this executor cannot use; the text says what.
    #[error("the driver sent {0}")]
    Protocol(String),
    /// The driver planned another number of steps for an epoch than the task was given.
    #[error("the driver planned {planned} steps for epoch {epoch}, the task {expected}")]
    StepPlan {
        /// The epoch.
        epoch: u64,
        /// The steps the driver planned for it.
        planned: u64,
        /// The steps per epoch of the task.
        expected: u64,
    },
    /// A rank's partitions held fewer rows than the driver planned steps for.
    #[error(
        "rank {rank} ran out of rows at step {step} of {steps} in epoch {epoch}: the \
         partitions hold fewer rows than planned"
    )]
    OutOfRows {
        /// The rank.
        rank: usize,
        /// The step that found no rows.
        step: u64,
        /// The steps planned for the epoch.
        steps: u64,
        /// The epoch.
        epoch: u64,
    },
    /// Training diverged: the loss of a step is NaN or infinite.
    #[error(
        "the training loss became {loss} at epoch {epoch} step {step}; lower \
         train.optimizer.lr or set train.clip_grad_norm"
    )]
    NonFiniteLoss {
        /// The loss.
        loss: f64,
        /// The epoch.
        epoch: u64,
        /// The step within the epoch.
        step: u64,
    },
    /// A gradient all-reduce sent as 16-bit floats (`cluster.compression`) gave a value that is
    /// not finite: with fp16, a gradient beyond its range (±65504); with bf16 (f32's range),
    /// gradients that diverged.
    #[error("{}", compressed_gradient(*.codec, *.value))]
    CompressedGradient {
        /// The compression in use.
        codec: Compression,
        /// The first value that is not finite (infinite or NaN).
        value: f32,
    },
    /// A checkpoint, model or output location cannot be used, read or written; the message
    /// names the location.
    #[error(transparent)]
    Storage(DataError),
    /// A file this task writes on its way to storage (a staging file, the predictions) cannot
    /// be made: "cannot {action}: {cause}".
    #[error("cannot {action}: {cause}")]
    Output {
        /// What was being done ("create a staging file").
        action: String,
        /// Why it failed.
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The final evaluation of the test split failed after training; rank 0 had saved the
    /// model before any rank evaluated.
    #[error(
        "the final evaluation of the test split failed: {source}; the trained model is saved \
         in {model_dir} (`ringflow eval --model {model_dir} --data …` evaluates it once the data \
         is fixed)"
    )]
    FinalEvaluation {
        /// Where the model is saved.
        model_dir: String,
        /// Why the evaluation failed.
        source: Box<ExecutorError>,
    },
    /// The driver asked the task to stop.
    #[error("the job was cancelled")]
    Cancelled,
    /// Talking to the driver or to other executors failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A saved model whose `checkpoint.json` disagrees with itself or its tensors; the
    /// message names the file and the field.
    #[error(transparent)]
    SavedModel(#[from] ringflow_core::saved::SavedModelError),
}

impl ExecutorError {
    /// Shorthand for an [`ExecutorError::Data`].
    pub fn data(file: impl Into<String>, message: impl Into<String>) -> Self {
        ExecutorError::Data {
            file: file.into(),
            message: message.into(),
        }
    }

    /// Shorthand for an [`ExecutorError::Output`]: `action` failed with `cause`.
    pub fn output(
        action: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ExecutorError::Output {
            action: action.into(),
            cause: Box::new(cause),
        }
    }
}

/// The sentence of [`ExecutorError::CompressedGradient`].
fn compressed_gradient(codec: Compression, value: f32) -> String {
    let cause = match codec {
        Compression::Fp16 => {
            "fp16 holds magnitudes up to 65504 and a larger gradient overflows; set \
             cluster.compression = \"bf16\" (f32's range) or \"none\", or lower \
             train.optimizer.lr"
        }
        _ => "the gradients diverged; lower train.optimizer.lr",
    };
    format!("a gradient all-reduce sent as {codec} (cluster.compression) gave {value}: {cause}")
}

/// The executor's result type.
pub type Result<T> = std::result::Result<T, ExecutorError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The run-time failures read as the sentences users (and the driver's logs) have always
    /// seen.
    #[test]
    fn run_time_failures_read_as_sentences() {
        let loss = ExecutorError::NonFiniteLoss {
            loss: f64::NAN,
            epoch: 2,
            step: 7,
        };
        assert_eq!(
            loss.to_string(),
            "the training loss became NaN at epoch 2 step 7; lower train.optimizer.lr or set \
             train.clip_grad_norm"
        );
        let rows = ExecutorError::OutOfRows {
            rank: 1,
            step: 3,
            steps: 10,
            epoch: 0,
        };
        assert_eq!(
            rows.to_string(),
            "rank 1 ran out of rows at step 3 of 10 in epoch 0: the partitions hold fewer rows \
             than planned"
        );
        let plan = ExecutorError::StepPlan {
            epoch: 4,
            planned: 12,
            expected: 11,
        };
        assert_eq!(
            plan.to_string(),
            "the driver planned 12 steps for epoch 4, the task 11"
        );
        let sent = ExecutorError::Protocol("unreadable preprocessing: EOF".into());
        assert_eq!(
            sent.to_string(),
            "the driver sent unreadable preprocessing: EOF"
        );
        let io = std::io::Error::other("disk full");
        let output = ExecutorError::output("create a staging file", io);
        assert_eq!(
            output.to_string(),
            "cannot create a staging file: disk full"
        );
    }
}
