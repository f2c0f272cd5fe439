//! What each rank of a job is told to do. This file owns:
//!
//! - a rank's task ([`Job::task_for`]): the ring, its generation and secret, what to run
//!   (train, evaluate, predict, benchmark) and how to read the data, with what the preparation
//!   decided already for a rank that joins later;
//! - the job's preprocessing ([`Job::preprocessing`]): inside the task up to
//!   [`ringflow_core::wire::INLINE_PREPROCESSING_BYTES`], else only its length, for the
//!   executor to fetch in chunks;
//! - a rank's partitions of each split for each epoch ([`Job::epoch_plan`]), the training
//!   split's planned once per epoch for the whole ring, and whether the ring re-forms before
//!   the epoch.

use std::sync::Arc;

use ringflow_core::data::Preprocessing;
use ringflow_core::data::prepare::PartitionSource;
use ringflow_core::pb;
use ringflow_core::spec::DataSource;
use ringflow_core::wire::payload;
use ringflow_core::wire::travels_inline;

use super::{Job, JobKind};
use crate::outputs::prediction::write_dir;
use crate::planner::JobPlan;

impl Job {
    /// The task of `rank`.
    pub fn task_for(&self, rank: u32) -> pb::Task {
        let ranks = self.members.ranks();
        let ring = ranks.iter().map(|e| e.ring_address.clone()).collect();
        let hosts = ranks.iter().map(|e| e.host_identity.clone()).collect();
        let mut header = pb::TaskHeader {
            job_id: self.id.clone(),
            rank,
            ring,
            hosts,
            generation: self.members.generation(),
            secret: self.members.secret().to_vec(),
            ring_timeout_ms: self.kind.comm_timeout().as_millis() as u64,
            ..Default::default()
        };
        let work = match &self.kind {
            JobKind::Train(plan) => {
                header.job = payload::encode(&plan.spec);
                header.backup_workers = plan.spec.cluster.backup_workers as u32;
                header.compression = plan.spec.cluster.compression.as_str().into();
                header.shared_memory = plan.spec.cluster.shared_memory;
                pb::task::Work::Train(self.training_work(plan, rank))
            }
            JobKind::Infer {
                plan,
                model_dir,
                predict,
                overwrite,
                ..
            } => {
                header.job = payload::encode(&plan.spec);
                header.shared_memory = plan.spec.cluster.shared_memory;
                let (preprocessing, preprocessing_bytes) = self.task_preprocessing();
                pb::task::Work::Infer(pb::InferWork {
                    data: Some(pb::DataAccess {
                        input_columns: plan.input_columns.clone(),
                        preprocessing,
                        preprocessing_bytes,
                        ..self.data_source(plan)
                    }),
                    model_dir: model_dir.clone(),
                    predict: predict
                        .as_ref()
                        .map(|(output, id_column)| pb::PredictOutput {
                            output: write_dir(output, *overwrite, &self.id),
                            id_column: id_column.clone(),
                        }),
                })
            }
            JobKind::Bench { spec, .. } => {
                header.shared_memory = spec.shared_memory;
                pb::task::Work::Bench(*spec)
            }
        };
        pb::Task {
            header: Some(header),
            work: Some(work),
        }
    }

    /// The preprocessing every rank applies, as a payload (empty: none): the merged statistics
    /// once the first ring computed them (a joiner gets those), else what was known before any
    /// data was read ([`planned_preprocessing`]). Executors fetch it when it is too large to
    /// travel inside their task.
    pub fn preprocessing(&self) -> Arc<str> {
        match self.prepare.statistics() {
            Some(merged) => merged.clone(),
            None => self.planned_preprocessing.clone(),
        }
    }

    /// The preprocessing as a task carries it: the payload when it travels inside the task,
    /// else nothing and its length (`DataAccess.preprocessing_bytes`).
    fn task_preprocessing(&self) -> (String, u64) {
        let doc = self.preprocessing();
        if travels_inline(doc.len()) {
            (doc.to_string(), 0)
        } else {
            (String::new(), doc.len() as u64)
        }
    }

    /// The training work of `rank`: statistics are collected by the first ring only; a joiner
    /// gets those the others computed.
    fn training_work(&self, plan: &JobPlan, rank: u32) -> pb::TrainWork {
        let (moments, labels) = plan.needs_stats();
        let first_ring = self.members.generation() == 0;
        let (preprocessing, preprocessing_bytes) = self.task_preprocessing();
        let data = pb::DataAccess {
            input_columns: plan.input_columns.clone(),
            preprocessing,
            preprocessing_bytes,
            collect_moments: moments && first_ring,
            collect_labels: labels && first_ring,
            ..self.data_source(plan)
        };
        pb::TrainWork {
            data: Some(data),
            steps_per_epoch: plan.steps_per_epoch(self.members.ranks().len()),
            model_dir: plan.spec.model_dir(),
            resume: plan.resume.is_some(),
            elastic: plan.spec.cluster.min_executors.is_some(),
            join: self.members.is_joiner(rank as usize),
            written: plan.written.as_ref().map(Into::into),
        }
    }

    /// Where a task reads its data from.
    fn data_source(&self, plan: &JobPlan) -> pb::DataAccess {
        let source = match self.prepare.source() {
            // Decided already (a re-formed ring): joiners read the same way.
            Some(PartitionSource::Driver) => DataSource::Driver,
            Some(PartitionSource::Direct) => DataSource::Direct,
            None => plan.spec.data.source,
        };
        pb::DataAccess {
            probe_source: source == DataSource::Auto,
            source_driver: source == DataSource::Driver,
            files: if source == DataSource::Auto {
                plan.files.clone()
            } else {
                Vec::new()
            },
            ..Default::default()
        }
    }

    /// `rank`'s partitions of `split` for `epoch`.
    pub fn epoch_plan(&self, rank: usize, split: pb::Split, epoch: u64) -> Option<pb::EpochPlan> {
        let plan = self.plan()?;
        let world = self.members.ranks().len();
        if rank >= world {
            return None;
        }
        match split {
            pb::Split::Test => return plan.test_split(world).into_iter().nth(rank),
            pb::Split::Stats => return plan.stats_split(world).into_iter().nth(rank),
            pb::Split::Train => {}
        }
        let mut cache = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        let first_plan = cache.as_ref().is_none_or(|(e, _)| *e != epoch);
        if first_plan {
            *cache = Some((epoch, plan.train_epoch(epoch, world)));
        }
        // At an epoch boundary (never the first epoch of this ring's plan), idle executors
        // join: every rank is told to re-form before training this epoch.
        let reform = self.members.reform_before(
            epoch,
            first_plan,
            self.is_elastic(),
            self.kind.max_executors(),
        );
        let mut out = cache
            .as_ref()
            .and_then(|(_, plans)| plans.get(rank).cloned())?;
        out.reform = reform;
        Some(out)
    }

    /// Whether idle executors are waiting that this job could take (elastic jobs add them at
    /// the next epoch boundary).
    pub fn set_joinable(&mut self, joinable: bool) {
        self.members.set_joinable(joinable);
    }
}

/// The preprocessing of `kind`'s tasks known before any data is read, as a payload (empty:
/// none): for training, [`training_preprocessing`]; for evaluation and prediction, the saved
/// model's.
pub(super) fn planned_preprocessing(kind: &JobKind) -> Arc<str> {
    match kind {
        JobKind::Train(plan) => training_preprocessing(plan).into(),
        JobKind::Infer { preprocessing, .. } => preprocessing.as_str().into(),
        JobKind::Bench { .. } => "".into(),
    }
}

/// The preprocessing a training job knows before any data is read, as a payload (empty: none): the
/// vocabulary and tags the planner's pass over a sequence job decided, or the given
/// `data.label_classes`.
pub(crate) fn training_preprocessing(plan: &JobPlan) -> String {
    match (&plan.sequence, &plan.spec.data.label_classes) {
        (Some(s), _) => payload::encode(&s.preprocessing),
        (None, Some(classes)) => payload::encode(&Preprocessing {
            classes: Some(classes.clone()),
            ..Preprocessing::default()
        }),
        (None, None) => String::new(),
    }
}
