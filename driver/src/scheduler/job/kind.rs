//! What a job does ([`JobKind`]): train a planned model, evaluate or predict with a saved one,
//! or time ring all-reduces. This file owns what follows from the kind alone, before any
//! executor is chosen:
//!
//! - the job's name, the line that introduces it in its messages, and its model's summary;
//! - how many executors it needs, on which device, and what one of them needs in memory;
//! - how long it waits for them and how long its ring waits for a rank;
//! - the directory it writes into (and locks while it runs).

use std::time::Duration;

use ringflow_core::pb;
use ringflow_ml::Device;

use crate::planner::JobPlan;
use crate::planner::memory::MemoryEstimate;

/// How long a benchmark waits for its executors, and its ring for a rank.
const BENCH_TIMEOUT: Duration = Duration::from_secs(60);

/// What a job does.
#[derive(Debug)]
pub enum JobKind {
    /// Train the planned job.
    Train(Box<JobPlan>),
    /// Evaluate a saved model (`predict: None`) or write its predictions.
    Infer {
        /// The saved model's spec, with the data set as the test split.
        plan: Box<JobPlan>,
        /// Executors to spread the data over.
        executors: usize,
        /// The saved model's directory.
        model_dir: String,
        /// For prediction: the output directory and the id column (may be empty).
        predict: Option<(String, String)>,
        /// For prediction (`--overwrite`): replace whatever the output holds, whole
        /// ([`crate::outputs::prediction`]).
        overwrite: bool,
        /// The saved model's preprocessing, as a payload (empty: none).
        preprocessing: String,
    },
    /// Time ring all-reduces on `executors` executors.
    Bench {
        /// Ranks in the ring.
        executors: usize,
        /// Sizes and counts.
        spec: pb::BenchSpec,
    },
}

impl JobKind {
    /// The job's name.
    pub fn name(&self) -> String {
        match self {
            JobKind::Train(plan) => plan.spec.name.clone(),
            JobKind::Infer { plan, predict, .. } => match predict {
                Some(_) => format!("predict-{}", plan.spec.name),
                None => format!("eval-{}", plan.spec.name),
            },
            JobKind::Bench { .. } => "bench-allreduce".into(),
        }
    }

    /// The directory the job writes into and locks while it runs, with the key or flag that
    /// named it: a training job's checkpoint directory, a prediction's output. Evaluations
    /// and benchmarks write none (an evaluation only appends to its model's event log).
    pub fn output_dir(&self) -> Option<(&'static str, String)> {
        match self {
            JobKind::Train(plan) => Some(("cluster.checkpoint_dir", plan.spec.checkpoint_dir())),
            JobKind::Infer {
                predict: Some((output, _)),
                ..
            } => Some(("--output", output.clone())),
            JobKind::Infer { .. } | JobKind::Bench { .. } => None,
        }
    }

    /// What one executor needs for the job ([`MemoryEstimate`]).
    pub fn memory_estimate(&self) -> MemoryEstimate {
        match self {
            JobKind::Train(plan) => MemoryEstimate::training(plan, plan.spec.cluster.executors),
            JobKind::Infer {
                plan,
                executors,
                predict,
                ..
            } => MemoryEstimate::inference(plan, *executors, predict.is_some()),
            JobKind::Bench { spec, .. } => MemoryEstimate::bench(spec.floats, spec.check),
        }
    }

    /// The plan of a training or inference job.
    pub fn plan(&self) -> Option<&JobPlan> {
        match self {
            JobKind::Train(plan) | JobKind::Infer { plan, .. } => Some(plan),
            JobKind::Bench { .. } => None,
        }
    }

    /// Executors the job starts on.
    pub fn executors_needed(&self) -> usize {
        match self {
            JobKind::Train(plan) => plan.spec.cluster.executors,
            JobKind::Infer { executors, .. } | JobKind::Bench { executors, .. } => *executors,
        }
    }

    /// The most executors the job's ring may grow to: `cluster.max_executors` (by default
    /// `cluster.executors`) for training, the executors it starts on for the others.
    pub fn max_executors(&self) -> usize {
        match self {
            JobKind::Train(plan) => plan
                .spec
                .cluster
                .max_executors
                .unwrap_or(plan.spec.cluster.executors),
            JobKind::Infer { .. } | JobKind::Bench { .. } => self.executors_needed(),
        }
    }

    /// `cluster.min_executors` of an elastic training job.
    pub fn min_executors(&self) -> Option<usize> {
        match self {
            JobKind::Train(plan) => plan.spec.cluster.min_executors,
            JobKind::Infer { .. } | JobKind::Bench { .. } => None,
        }
    }

    /// True when the job survives lost executors.
    pub fn is_elastic(&self) -> bool {
        self.min_executors().is_some()
    }

    /// The device the job's executors must have: `cluster.device` for training and inference,
    /// the CPU for benchmarks.
    pub fn device(&self) -> Device {
        match self.plan() {
            Some(plan) => plan.spec.cluster.device,
            None => Device::Cpu,
        }
    }

    /// How long the job may wait for its executors.
    pub fn rendezvous_timeout(&self) -> Duration {
        match self.plan() {
            Some(plan) => Duration::from_secs(plan.spec.cluster.rendezvous_timeout_s),
            None => BENCH_TIMEOUT,
        }
    }

    /// How long a rank waits for its ring neighbours before its ring counts as broken.
    pub fn comm_timeout(&self) -> Duration {
        match self.plan() {
            Some(plan) => Duration::from_secs(plan.spec.cluster.comm_timeout_s),
            None => BENCH_TIMEOUT,
        }
    }

    /// The line that introduces job `id` in its messages: its rows and steps, or its
    /// all-reduces, and its executors.
    pub fn introduction(&self, id: &str) -> String {
        match self {
            JobKind::Train(plan) => format!(
                "job {id}: {} training rows in {} row groups, {} steps per epoch on each of {} \
                 executors",
                plan.train_rows(),
                plan.train.len(),
                plan.steps_per_epoch(plan.spec.cluster.executors),
                plan.spec.cluster.executors
            ),
            JobKind::Infer {
                plan,
                executors,
                predict,
                ..
            } => format!(
                "job {id}: {} {} rows in {} row groups on {executors} executors",
                if predict.is_some() {
                    "predicting"
                } else {
                    "evaluating"
                },
                plan.test_rows(),
                plan.test.len(),
            ),
            JobKind::Bench { executors, spec } => format!(
                "job {id}: {} timed all-reduces of {} floats on {executors} executors",
                spec.iters, spec.floats
            ),
        }
    }

    /// The lines that show a training job's model when it starts: its kind, then the
    /// Keras-style table of its layers, output shapes and parameters (empty for other jobs and
    /// for a custom kind that gives no summary).
    pub fn model_summary(&self) -> Vec<String> {
        let JobKind::Train(plan) = self else {
            return Vec::new();
        };
        let Some(summary) = &plan.summary else {
            return Vec::new();
        };
        std::iter::once(format!("model ({}):", plan.spec.model.kind))
            .chain(summary.lines().into_iter().map(|l| format!("  {l}")))
            .collect()
    }
}
