//! Fusion autotune (`cluster.fusion = "auto"`, Horovod's autotune): the first steps try a few
//! bucket sizes and keep the fastest.
//!
//! Each candidate size ([`AUTO_CANDIDATES_MIB`]) that gives this model a bucket plan of its own
//! (a small model packs into one bucket whatever the size) runs [`WARMUP_STEPS`] steps that are
//! not timed (the new buffers are touched for the first time) and then [`TIMED_STEPS`] timed
//! ones: the time from the start of backward to the end of the gradient exchange, the part of a
//! step the bucket size changes. The median of a candidate's steps is its time. After the last
//! candidate every rank all-reduces its times (their mean over the ranks) and takes the fastest,
//! so that every rank chooses the same size: the ring needs the same buckets on every rank.

use std::time::Instant;

use ringflow_core::spec::{AUTO_CANDIDATES_MIB, BucketSizes, Fusion};
use ringflow_ml::GradStore;
use ringflow_ml::nn::ParamStore;

use crate::collective::{Collective, ReduceOp};
use crate::error::Result;
use crate::train::fusion::GradientBuckets;

/// Steps run with a new candidate before its steps are timed.
pub const WARMUP_STEPS: usize = 2;
/// Steps timed per candidate.
pub const TIMED_STEPS: usize = 5;

/// One candidate's measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Trial {
    /// The sizes tried.
    pub sizes: BucketSizes,
    /// The median time of its timed steps (backward and exchange), in seconds; after the
    /// choice, the mean of the ranks' medians.
    pub step_seconds: f64,
}

/// Where a job's bucket sizes stand.
#[derive(Clone, Debug, PartialEq)]
pub struct FusionState {
    /// The sizes in use.
    pub sizes: BucketSizes,
    /// False while `"auto"` is still trying sizes.
    pub tuned: bool,
    /// The sizes `"auto"` tried, with their times (empty for fixed sizes).
    pub trials: Vec<Trial>,
}

/// The autotune of one ring's gradient buckets.
#[derive(Debug)]
pub struct FusionTuner {
    /// The candidates left to try, the current one first.
    pending: Vec<BucketSizes>,
    /// Steps of the current candidate so far.
    steps: usize,
    /// The current candidate's timed steps.
    timed: Vec<f64>,
    /// Finished candidates.
    trials: Vec<Trial>,
}

/// A ring's gradient buckets, with their autotune under `cluster.fusion = "auto"`.
pub struct TunedBuckets {
    buckets: GradientBuckets,
    tuner: Option<FusionTuner>,
    /// The measurements the choice was made on (`"auto"`, once chosen).
    trials: Vec<Trial>,
    /// When the current step's backward began.
    backward_start: Option<Instant>,
}

impl TunedBuckets {
    /// The buckets of `params` as `fusion` asks.
    pub fn new(params: &ParamStore, fusion: Fusion) -> TunedBuckets {
        let (tuner, sizes) = match fusion {
            Fusion::Auto => FusionTuner::new(params),
            fixed => (None, fixed.initial()),
        };
        TunedBuckets {
            buckets: GradientBuckets::new(params, sizes),
            tuner,
            trials: Vec::new(),
            backward_start: None,
        }
    }

    /// The buckets, for the backward pass's hook.
    pub fn buckets(&mut self) -> &mut GradientBuckets {
        &mut self.buckets
    }

    /// Resets the buckets before a backward pass and starts the step's clock.
    pub fn begin(&mut self) {
        self.buckets.begin();
        self.backward_start = Some(Instant::now());
    }

    /// Waits for the step's reductions and writes the averaged gradients back into `grads`;
    /// while tuning, times the step and moves on to the next candidate when the current one is
    /// measured.
    pub fn finish(
        &mut self,
        params: &ParamStore,
        grads: &mut GradStore,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        self.buckets.finish(grads, comm)?;
        let (Some(tuner), Some(start)) = (self.tuner.as_mut(), self.backward_start.take()) else {
            return Ok(());
        };
        let (next, chosen) = tuner.observe(start.elapsed().as_secs_f64(), comm)?;
        if let Next::Switch(sizes) = next {
            self.buckets = GradientBuckets::new(params, sizes);
        }
        if let Some(trials) = chosen {
            log_choice(comm.rank(), &trials, self.buckets.limits());
            self.trials = trials;
            self.tuner = None;
        }
        Ok(())
    }

    /// The sizes in use and, under `"auto"`, what was tried.
    pub fn state(&self) -> FusionState {
        match &self.tuner {
            Some(tuner) => FusionState {
                sizes: self.buckets.limits(),
                tuned: false,
                trials: tuner.trials().to_vec(),
            },
            None => FusionState {
                sizes: self.buckets.limits(),
                tuned: true,
                trials: self.trials.clone(),
            },
        }
    }
}

fn log_choice(rank: usize, trials: &[Trial], chosen: BucketSizes) {
    let tried: Vec<String> = trials
        .iter()
        .map(|t| {
            format!(
                "{} MiB {:.1} ms",
                t.sizes.rest >> 20,
                1000.0 * t.step_seconds
            )
        })
        .collect();
    tracing::info!(
        "rank {rank}: fusion autotune keeps {} MiB gradient buckets (backward and exchange per \
         step, mean over the ranks: {})",
        chosen.rest >> 20,
        tried.join(", ")
    );
}

/// What the trainer does after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Keep the buckets as they are.
    Keep,
    /// Rebuild the buckets with these sizes.
    Switch(BucketSizes),
}

impl FusionTuner {
    /// A tuner for `params`, or `None` when every candidate gives the same plan (nothing to
    /// choose). Also returns the sizes to start with.
    pub fn new(params: &ParamStore) -> (Option<FusionTuner>, BucketSizes) {
        let mut plans: Vec<Vec<usize>> = Vec::new();
        let mut pending = Vec::new();
        for &mib in &AUTO_CANDIDATES_MIB {
            let sizes = BucketSizes::of_mib(mib);
            let plan = GradientBuckets::plan(params, sizes);
            if !plans.contains(&plan) {
                plans.push(plan);
                pending.push(sizes);
            }
        }
        let first = pending[0];
        if pending.len() == 1 {
            return (None, first);
        }
        let tuner = FusionTuner {
            pending,
            steps: 0,
            timed: Vec::with_capacity(TIMED_STEPS),
            trials: Vec::new(),
        };
        (Some(tuner), first)
    }

    /// The sizes being tried.
    pub fn current(&self) -> BucketSizes {
        self.pending[0]
    }

    /// The candidates tried so far.
    pub fn trials(&self) -> &[Trial] {
        &self.trials
    }

    /// Records a step's backward-and-exchange time; after the last candidate's last step,
    /// agrees with the other ranks on the fastest (a collective call every rank makes at the
    /// same step). Returns what to do next and, once chosen, the measurements.
    pub fn observe(
        &mut self,
        seconds: f64,
        comm: &mut dyn Collective,
    ) -> Result<(Next, Option<Vec<Trial>>)> {
        self.steps += 1;
        if self.steps <= WARMUP_STEPS {
            return Ok((Next::Keep, None));
        }
        self.timed.push(seconds);
        if self.timed.len() < TIMED_STEPS {
            return Ok((Next::Keep, None));
        }
        let sizes = self.pending.remove(0);
        self.trials.push(Trial {
            sizes,
            step_seconds: median(&mut self.timed),
        });
        self.timed.clear();
        self.steps = 0;
        if let Some(&next) = self.pending.first() {
            return Ok((Next::Switch(next), None));
        }
        let trials = self.agree(comm)?;
        let best = fastest(&trials);
        Ok((Next::Switch(best), Some(trials)))
    }

    /// Every rank's times averaged over the ranks.
    fn agree(&self, comm: &mut dyn Collective) -> Result<Vec<Trial>> {
        let mut times: Vec<f32> = self.trials.iter().map(|t| t.step_seconds as f32).collect();
        comm.all_reduce(&mut times, ReduceOp::Average)?;
        Ok(self
            .trials
            .iter()
            .zip(times)
            .map(|(t, s)| Trial {
                sizes: t.sizes,
                step_seconds: f64::from(s),
            })
            .collect())
    }
}

/// The fastest trial's sizes (the smaller size on a tie: it starts reducing earlier).
pub fn fastest(trials: &[Trial]) -> BucketSizes {
    let mut best = trials[0];
    for t in &trials[1..] {
        if t.step_seconds < best.step_seconds {
            best = *t;
        }
    }
    best.sizes
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[cfg(test)]
mod tests {
    use ringflow_ml::nn::{Model, ModelRegistry, ModelSpec};
    use ringflow_ml::{Device, Tensor};

    use super::*;
    use crate::collective::Solo;

    fn params(widths: &[usize]) -> Model {
        let spec = ModelSpec::mlp(widths, "relu");
        Model::build(&spec, &ModelRegistry::default(), 1, Device::Cpu).unwrap()
    }

    #[test]
    fn a_model_with_one_possible_plan_is_not_tuned() {
        let m = params(&[784, 100, 10]);
        let (tuner, sizes) = FusionTuner::new(m.params());
        assert!(tuner.is_none());
        assert_eq!(sizes, BucketSizes::of_mib(1.0));
    }

    #[test]
    fn each_distinct_plan_is_timed_and_the_fastest_kept() {
        // 784-1024-1024-10: 7.4 MiB of gradients, so 1, 4 and 16 MiB give different plans and
        // 64 MiB the same as 16 (one bucket after the first).
        let m = params(&[784, 1024, 1024, 10]);
        let (tuner, start) = FusionTuner::new(m.params());
        let mut tuner = tuner.expect("several plans");
        assert_eq!(start, BucketSizes::of_mib(1.0));
        assert_eq!(tuner.pending.len(), 3);
        // Step times by candidate: 4 MiB is the fastest.
        let time_of = |s: BucketSizes| match s.rest >> 20 {
            1 => 0.030,
            4 => 0.010,
            _ => 0.020,
        };
        let mut switches = Vec::new();
        let mut chosen = None;
        let mut comm = Solo;
        for _ in 0..3 * (WARMUP_STEPS + TIMED_STEPS) {
            let (next, done) = tuner.observe(time_of(tuner.current()), &mut comm).unwrap();
            if let Next::Switch(s) = next {
                switches.push(s.rest >> 20);
            }
            if done.is_some() {
                chosen = done;
                break;
            }
        }
        assert_eq!(switches, vec![4, 16, 4], "tries 4 and 16, then keeps 4");
        let trials = chosen.expect("chosen after the last candidate");
        let times: Vec<f64> = trials.iter().map(|t| t.step_seconds).collect();
        assert_eq!(
            times,
            vec![0.030f32 as f64, 0.010f32 as f64, 0.020f32 as f64]
        );
    }

    #[test]
    fn warmup_steps_are_not_timed_and_the_median_resists_outliers() {
        let m = params(&[784, 1024, 1024, 10]);
        let mut tuner = FusionTuner::new(m.params()).0.unwrap();
        let mut comm = Solo;
        let steps = [9.0, 9.0, 0.02, 0.01, 5.0, 0.03, 0.02];
        for s in steps {
            tuner.observe(s, &mut comm).unwrap();
        }
        assert_eq!(tuner.trials()[0].step_seconds, 0.02);
    }

    #[test]
    fn the_buckets_follow_the_candidates_and_end_with_the_choice() {
        let m = params(&[784, 1024, 1024, 10]);
        let x = Tensor::from_vec(vec![0.5; 2 * 784], &[2, 784], Device::Cpu).unwrap();
        let y = Tensor::from_vec(vec![0.0, 1.0], &[2], Device::Cpu).unwrap();
        let mut rng = ringflow_ml::rng::seeded(1, 1);
        let out = m.forward(&x, true, &mut rng).unwrap();
        let mut grads = ringflow_ml::loss::cross_entropy(&out, &y)
            .unwrap()
            .backward()
            .unwrap();
        let mut tuned = TunedBuckets::new(m.params(), Fusion::Auto);
        let mut comm = Solo;
        let mut plans = vec![tuned.buckets().len()];
        for _ in 0..3 * (WARMUP_STEPS + TIMED_STEPS) {
            assert!(!tuned.state().tuned);
            tuned.begin();
            for p in m.params().iter() {
                tuned.buckets().ready(&p.tensor, &grads, &mut comm).unwrap();
            }
            tuned.finish(m.params(), &mut grads, &mut comm).unwrap();
            if plans.last() != Some(&tuned.buckets().len()) {
                plans.push(tuned.buckets().len());
            }
        }
        let state = tuned.state();
        assert!(state.tuned);
        assert_eq!(state.trials.len(), 3);
        assert_eq!(
            &plans[..3],
            &[4, 3, 2],
            "1, 4 and 16 MiB plans, in that order"
        );
        assert_eq!(tuned.buckets().limits(), fastest(&state.trials));
        let fixed = TunedBuckets::new(m.params(), Fusion::Fixed(25.0)).state();
        assert!(fixed.tuned && fixed.trials.is_empty());
        assert_eq!(fixed.sizes, BucketSizes::of_mib(25.0));
    }

    #[test]
    fn ties_keep_the_smaller_size() {
        let t = |mib: f64, s: f64| Trial {
            sizes: BucketSizes::of_mib(mib),
            step_seconds: s,
        };
        assert_eq!(
            fastest(&[t(1.0, 0.5), t(4.0, 0.5), t(16.0, 0.6)]),
            BucketSizes::of_mib(1.0)
        );
    }
}
