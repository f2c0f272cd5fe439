//! The driver's error types: [`DriverError`] for what refuses a job before it is queued,
//! [`JobError`] for what ends a queued or running job, or refuses a request about one.

use ringflow_core::data::stats::MAX_CLASSES;

/// Everything that can make the driver refuse or fail a job, or fail to start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// The job spec is unusable; the message names the key.
    #[error(transparent)]
    Spec(#[from] ringflow_core::spec::SpecError),
    /// A request's document (the submitted job spec) cannot be read; the message names the
    /// field.
    #[error(transparent)]
    Payload(#[from] ringflow_core::wire::payload::PayloadError),
    /// A listener's connection limits admit no connection; the message names the listener.
    #[error(transparent)]
    Listener(#[from] ringflow_core::listener::LimitsError),
    /// `cluster.checkpoint_dir` cannot be used.
    #[error("cluster.checkpoint_dir: {0}")]
    CheckpointDir(#[source] ringflow_core::data::DataError),
    /// The label is not the same kind of value throughout the data, or `data.label_classes`
    /// does not fit it.
    #[error(transparent)]
    Label(#[from] crate::planner::plan_error::LabelMismatch),
    /// `--resume` cannot continue from the job's last checkpoint.
    #[error("--resume: {0}")]
    Resume(#[from] crate::planner::plan_error::ResumeError),
    /// The model cannot be built from the spec.
    #[error(transparent)]
    Model(#[from] ringflow_ml::MlError),
    /// An output location cannot be used, or another job holds it; the message names the key
    /// and the location.
    #[error(transparent)]
    Output(#[from] crate::outputs::OutputError),
    /// A saved model's `checkpoint.json` whose parts disagree or cannot be read; the message
    /// names the file and the field.
    #[error(transparent)]
    SavedModel(#[from] ringflow_core::saved::SavedModelError),
    /// The label pass refused the data's labels; the message names the column and file.
    #[error(transparent)]
    Labels(#[from] crate::planner::kinds::label_error::LabelError),
    /// A token-sequence job that cannot be planned, or a row of its data that breaks the
    /// rules; the message names the file, row and column.
    #[error(transparent)]
    Sequences(#[from] crate::planner::kinds::sequences::error::SequenceError),
    /// A split holds fewer rows than the executors that would share them.
    #[error(transparent)]
    TooFewRows(#[from] crate::planner::plan_error::TooFewRows),
    /// The `--model` directory of an evaluation or a prediction cannot be used; the message
    /// names it.
    #[error(transparent)]
    ModelDir(#[from] crate::planner::saved_error::ModelDirError),
    /// A planned job's messages would carry a part larger than its bound; the message names
    /// the part and the setting or data that bounds it.
    #[error(transparent)]
    TooLarge(#[from] crate::scheduler::bounds_error::TooLarge),
    /// The driver cannot start serving (its control plane, its TLS, its web UI); the message
    /// names the address.
    #[error(transparent)]
    Start(#[from] crate::service::error::StartError),
    /// A data path lists no usable files (`key` is its spec key).
    #[error("{key}: {source}")]
    Listing {
        /// `data.train`, `data.test`, `--data`.
        key: String,
        /// Why.
        source: crate::planner::schema_error::ListingError,
    },
    /// A data file's Parquet footer could not be read.
    #[error("{key}: {file} {why}")]
    Footer {
        /// The split's spec key (`data.train`, `--data`).
        key: String,
        /// The file.
        file: String,
        /// Why, as the end of a sentence about the file.
        why: crate::planner::schema_error::FooterError,
    },
    /// A file's schema (or the output of `data.sql` over it) does not fit the spec and the
    /// model; `what` names the split and the file.
    #[error("{what}: {source}")]
    Schema {
        /// `data.train: <file>`, or `data.train: <file>: the output of data.sql`.
        what: String,
        /// Why.
        source: crate::planner::schema_error::SchemaError,
    },
    /// `data.sql` could not be planned (`site` names the split and the file).
    #[error("{site}: {source}")]
    SqlPlan {
        /// `data.train: <file>`.
        site: String,
        /// Why.
        source: crate::planner::sql_planner::SqlPlanError,
    },
    /// `data.sql`'s lookup tables could not be read, or planning them ran out of time.
    #[error(transparent)]
    SqlTables(#[from] crate::planner::sql_planner::SqlPlanError),
    /// The rows `data.sql` yields over a row group could not be counted (`site` names the
    /// split, the file and the row group).
    #[error("{site}: {source}")]
    RowCount {
        /// `data.train: <file> (row group N)`.
        site: String,
        /// Why.
        source: crate::planner::count_error::CountError,
    },
}

/// The driver's result type.
pub type Result<T> = std::result::Result<T, DriverError>;

/// Why a job failed, or why the scheduler refused a request about one (a rank's recovery, a
/// partial of its preparation). Each message is the sentence the job's error, its summary and
/// `ringflow submit` show; where a variant carries a `rank`, it is the rank as errors name it
/// ("rank 1 (executor e2 on host-2)").
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// A prediction's parts could not be made its output (`--overwrite`).
    #[error(transparent)]
    Output(#[from] crate::outputs::OutputError),
    /// A request named a job this driver does not know (never submitted, or forgotten).
    #[error("no job {0:?}")]
    NoSuchJob(String),
    /// A request named a rank the job does not have.
    #[error("job {job} has no rank {rank}")]
    NoSuchRank {
        /// The job's id.
        job: String,
        /// The rank asked for.
        rank: usize,
    },
    /// A rank asked to recover after its job ended.
    #[error("job {0} has ended")]
    Ended(String),
    /// A rank asked to recover in a job that does not survive lost executors.
    #[error("job {0} is not elastic")]
    NotElastic(String),
    /// A rank asked to recover, but the ring was re-formed without its executor.
    #[error("the ring was re-formed without this executor")]
    LeftOut,
    /// Too few executors survived to re-form the ring.
    #[error(
        "only {remain} executors remain after losing {lost}, fewer than \
         cluster.min_executors = {min}"
    )]
    TooFewRemain {
        /// Executors left for the new ring.
        remain: usize,
        /// Executors lost.
        lost: usize,
        /// `cluster.min_executors`.
        min: usize,
    },
    /// The only executors left joined the job and never received its state.
    #[error(
        "every executor that held the job's state was lost; the {remain} that remain had \
         joined and not received it yet"
    )]
    StateLost {
        /// Executors left, all of them joiners.
        remain: usize,
    },
    /// A rank sent statistics of the training split that do not parse.
    #[error("{rank} sent unreadable statistics: {reason}")]
    UnreadableStatistics {
        /// The rank, as errors name it.
        rank: String,
        /// What the parser said.
        reason: String,
    },
    /// A rank's partial of a preparation phase cannot be read.
    #[error("{rank} sent a partial that cannot be read: {source}")]
    UnreadablePartial {
        /// The rank, as errors name it.
        rank: String,
        /// Why, naming the message field.
        source: ringflow_core::wire::payload::PayloadError,
    },
    /// Statistics were sent for a job that does not train.
    #[error("only training jobs collect statistics")]
    NotTraining,
    /// The label column has too many distinct values to be a class.
    #[error(
        "data.label: column `{column}` has more than {MAX_CLASSES} distinct values; is it \
         really a class?"
    )]
    TooManyClasses {
        /// `data.label`.
        column: String,
    },
    /// The label column's classes do not match the model's outputs.
    #[error(
        "data.label: column `{column}` has {classes} distinct classes in data.train, but the \
         model has {outputs} outputs"
    )]
    ClassCount {
        /// `data.label`.
        column: String,
        /// Distinct classes found.
        classes: usize,
        /// The model's outputs.
        outputs: usize,
    },
    /// No executors (or too few with the job's device) registered before
    /// `cluster.rendezvous_timeout_s`; the sentence says how many did, and from where.
    #[error("{0}")]
    Rendezvous(String),
    /// What one executor needs for the job exceeds the memory it can have; the sentence gives
    /// the estimate, the limit and the setting to lower.
    #[error("{0}")]
    DoesNotFit(String),
    /// An executor of the job was lost or its process ended; the sentence names it and how.
    #[error("{0}")]
    Executor(String),
    /// An executor was lost after other ranks had finished, so the ring cannot be re-formed.
    #[error("{0}, after other ranks had finished the job; it cannot be recovered")]
    LostAfterFinish(String),
    /// A rank's task failed.
    #[error("{rank} failed: {reason}")]
    RankFailed {
        /// The rank, as errors name it.
        rank: String,
        /// What its executor reported.
        reason: String,
    },
    /// A rank's task ended without saying how.
    #[error("{0} ended without a result")]
    NoResult(String),
    /// A rank finished while the ring was re-formed without lost ranks, whose share no one
    /// can train any more.
    #[error(
        "{rank} finished while the ring was being re-formed without {lost}, which cannot \
         finish its share"
    )]
    FinishedDuringRecovery {
        /// The rank that finished, as errors name it.
        rank: String,
        /// The lost ranks ("rank 1, rank 2").
        lost: String,
    },
    /// Another job took over the lock on the job's output directory; the sentence names it.
    #[error("{0}")]
    LockLost(String),
    /// The driver sent an executor its task, and the executor could not receive or decode it
    /// (it said so, or asked for a task again).
    #[error("{executor} could not receive its task: {cause}")]
    TaskNotReceived {
        /// The executor, as errors name it ("executor ID (rank R) on HOST").
        executor: String,
        /// Why, as the executor (or the driver) saw it.
        cause: String,
    },
    /// A rank's task is larger than a control-plane message may be (planning should have
    /// refused the job); the reason names the task's largest part.
    #[error("{rank} cannot be sent its task: {reason}")]
    TaskTooLarge {
        /// The rank, as errors name it.
        rank: String,
        /// Its size, the bound and its largest part.
        reason: String,
    },
    /// The preprocessing the statistics of the training split decided is larger than a job's
    /// preprocessing may be.
    #[error(
        "the statistics of data.train ({what}) make a preprocessing of {}, more than the {} a \
         job's preprocessing may have",
        ringflow_core::size::format_bytes(*bytes),
        ringflow_core::size::format_bytes(ringflow_core::wire::MAX_PREPROCESSING_BYTES)
    )]
    PreprocessingTooLarge {
        /// What it holds ("100000 label classes, the mean and deviation of 784 features").
        what: String,
        /// Its length as JSON.
        bytes: u64,
    },
}
