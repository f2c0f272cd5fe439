//! The seconds a training step spends in each of its phases, as one type that the executor
//! measures, the driver averages over ranks and the CLI shows.
//!
//! [`PhaseTimes`] travels as [`pb::PhaseTimes`] (the `From` impls convert both ways) and is
//! written as JSON with the same field names (`data`, `forward`, `backward`, `allreduce`,
//! `optimizer`) in summaries, event logs and `ringflow history --json`. A per-step span on the
//! wire ([`pb::StepSpan`]) carries the same phases as single-precision floats.

use serde::{Deserialize, Serialize};

use crate::pb;

/// Seconds spent in each phase of training steps, in the order the phases run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseTimes {
    /// Waiting for the next batch.
    pub data: f64,
    /// Forward pass and loss.
    pub forward: f64,
    /// Backward pass.
    pub backward: f64,
    /// Waiting for the gradient all-reduce.
    pub allreduce: f64,
    /// Optimizer update (and clipping).
    pub optimizer: f64,
}

impl PhaseTimes {
    /// The phases' names, in the order they run (the field names and [`PhaseTimes::seconds`]'s
    /// order).
    pub const NAMES: [&'static str; 5] = ["data", "forward", "backward", "allreduce", "optimizer"];

    /// The sum of all phases.
    #[inline]
    pub fn total(&self) -> f64 {
        self.data + self.forward + self.backward + self.allreduce + self.optimizer
    }

    /// The phases' seconds in the order they run, as [`PhaseTimes::NAMES`] names them.
    pub fn seconds(&self) -> [f64; 5] {
        [
            self.data,
            self.forward,
            self.backward,
            self.allreduce,
            self.optimizer,
        ]
    }

    /// `f` applied to every phase.
    pub fn map(self, f: impl Fn(f64) -> f64) -> PhaseTimes {
        PhaseTimes {
            data: f(self.data),
            forward: f(self.forward),
            backward: f(self.backward),
            allreduce: f(self.allreduce),
            optimizer: f(self.optimizer),
        }
    }

    /// Each phase as a fraction of their [`total`](PhaseTimes::total) (the fractions sum to 1);
    /// `None` when no time was spent.
    pub fn shares(&self) -> Option<PhaseTimes> {
        let total = self.total();
        (total > 0.0).then(|| self.map(|x| x / total))
    }

    /// Each phase as a percentage of their [`total`](PhaseTimes::total); all zero when no time
    /// was spent.
    pub fn percent(&self) -> PhaseTimes {
        let total = self.total();
        if total <= 0.0 {
            return PhaseTimes::default();
        }
        self.map(|x| 100.0 * x / total)
    }
}

impl std::ops::AddAssign for PhaseTimes {
    #[inline]
    fn add_assign(&mut self, o: PhaseTimes) {
        self.data += o.data;
        self.forward += o.forward;
        self.backward += o.backward;
        self.allreduce += o.allreduce;
        self.optimizer += o.optimizer;
    }
}

impl From<PhaseTimes> for pb::PhaseTimes {
    fn from(p: PhaseTimes) -> Self {
        pb::PhaseTimes {
            data: p.data,
            forward: p.forward,
            backward: p.backward,
            allreduce: p.allreduce,
            optimizer: p.optimizer,
        }
    }
}

impl From<&PhaseTimes> for pb::PhaseTimes {
    fn from(p: &PhaseTimes) -> Self {
        pb::PhaseTimes::from(*p)
    }
}

impl From<pb::PhaseTimes> for PhaseTimes {
    fn from(p: pb::PhaseTimes) -> Self {
        PhaseTimes {
            data: p.data,
            forward: p.forward,
            backward: p.backward,
            allreduce: p.allreduce,
            optimizer: p.optimizer,
        }
    }
}

impl From<&pb::StepSpan> for PhaseTimes {
    /// The phases of one step as the wire carries them (single precision).
    fn from(s: &pb::StepSpan) -> Self {
        PhaseTimes {
            data: f64::from(s.data),
            forward: f64::from(s.forward),
            backward: f64::from(s.backward),
            allreduce: f64::from(s.allreduce),
            optimizer: f64::from(s.optimizer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PhaseTimes {
        PhaseTimes {
            data: 0.5,
            forward: 1.0,
            backward: 1.5,
            allreduce: 0.75,
            optimizer: 0.25,
        }
    }

    #[test]
    fn the_wire_form_keeps_every_phase_in_place() {
        let p = sample();
        let wire = pb::PhaseTimes::from(p);
        assert_eq!(
            [
                wire.data,
                wire.forward,
                wire.backward,
                wire.allreduce,
                wire.optimizer
            ],
            p.seconds()
        );
        assert_eq!(PhaseTimes::from(wire), p);
        let span = pb::StepSpan {
            data: 0.5,
            forward: 1.0,
            backward: 1.5,
            allreduce: 0.75,
            optimizer: 0.25,
            ..Default::default()
        };
        assert_eq!(PhaseTimes::from(&span), p);
    }

    #[test]
    fn json_uses_the_phase_names() {
        assert_eq!(
            serde_json::to_string(&sample()).unwrap(),
            r#"{"data":0.5,"forward":1.0,"backward":1.5,"allreduce":0.75,"optimizer":0.25}"#
        );
    }

    #[test]
    fn percentages_share_the_total() {
        let p = sample().percent();
        assert_eq!(p.seconds(), [12.5, 25.0, 37.5, 18.75, 6.25]);
        assert_eq!(PhaseTimes::default().percent(), PhaseTimes::default());
        let shares = sample().shares().unwrap();
        assert_eq!(shares.seconds(), [0.125, 0.25, 0.375, 0.1875, 0.0625]);
        assert_eq!(PhaseTimes::default().shares(), None);
        let mut sum = sample();
        sum += sample();
        assert_eq!(sum, sample().map(|x| 2.0 * x));
        assert_eq!(sum.total(), 8.0);
    }
}
