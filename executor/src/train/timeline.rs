//! Per-step phase spans for `--timeline`: when each step started on this executor's wall clock,
//! and how long its data wait, forward, backward, all-reduce and optimizer phases took.
//!
//! The train loop records every step into a [`StepSpans`] buffer, and each report to the driver
//! (about once a second, and at every epoch's end) takes what it holds, so the buffer stays
//! small. Start times are wall-clock (Unix) seconds: ranks on one host line up exactly, ranks on
//! different hosts only as well as their clocks agree (NTP keeps them within milliseconds).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Seconds spent in each phase of training steps: the one type that the driver and the CLI
/// share, with its wire form.
pub use ringflow_core::phases::PhaseTimes;

/// Spans a buffer holds between two reports; later steps are counted but not kept. At about
/// 45 bytes each, a report stays well below gRPC's 4 MiB message limit.
pub const MAX_PENDING_SPANS: usize = 50_000;

/// One timed training step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepSpan {
    /// 0-based epoch.
    pub epoch: u64,
    /// 0-based step within the epoch.
    pub step: u64,
    /// When the step started (its wait for data), in seconds since the Unix epoch.
    pub start_unix_s: f64,
    /// Seconds in each phase.
    pub phases: PhaseTimes,
}

/// The spans recorded since the last report.
#[derive(Debug)]
pub struct StepSpans {
    /// The wall clock at `anchor_instant`, in Unix seconds: instants become wall-clock times
    /// through it, so spans stay monotone even if the wall clock is adjusted meanwhile.
    anchor_unix_s: f64,
    anchor_instant: Instant,
    pending: Vec<StepSpan>,
    /// Steps not kept because the buffer was full.
    pub dropped: u64,
}

impl Default for StepSpans {
    fn default() -> Self {
        StepSpans::new()
    }
}

impl StepSpans {
    /// An empty buffer anchored at the current time.
    pub fn new() -> StepSpans {
        let anchor_instant = Instant::now();
        let anchor_unix_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        StepSpans {
            anchor_unix_s,
            anchor_instant,
            pending: Vec::new(),
            dropped: 0,
        }
    }

    /// Records step `step` of `epoch`, which started at `start` and spent `phases`.
    pub fn record(&mut self, epoch: u64, step: u64, start: Instant, phases: PhaseTimes) {
        if self.pending.len() >= MAX_PENDING_SPANS {
            self.dropped += 1;
            return;
        }
        let offset = if start >= self.anchor_instant {
            (start - self.anchor_instant).as_secs_f64()
        } else {
            -(self.anchor_instant - start).as_secs_f64()
        };
        self.pending.push(StepSpan {
            epoch,
            step,
            start_unix_s: self.anchor_unix_s + offset,
            phases,
        });
    }

    /// The spans recorded since the last call.
    pub fn take(&mut self) -> Vec<StepSpan> {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn spans_follow_the_monotonic_clock_from_a_wall_clock_anchor() {
        let mut spans = StepSpans::new();
        let t0 = Instant::now();
        let phases = PhaseTimes {
            data: 0.001,
            forward: 0.002,
            backward: 0.003,
            allreduce: 0.004,
            optimizer: 0.005,
        };
        spans.record(0, 0, t0, phases);
        spans.record(0, 1, t0 + Duration::from_millis(15), phases);
        let got = spans.take();
        assert_eq!(got.len(), 2);
        assert_eq!((got[1].epoch, got[1].step), (0, 1));
        let gap = got[1].start_unix_s - got[0].start_unix_s;
        assert!((gap - 0.015).abs() < 1e-6, "{gap}");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((got[0].start_unix_s - now).abs() < 5.0);
        assert!(spans.take().is_empty());
    }

    #[test]
    fn a_full_buffer_counts_what_it_drops() {
        let mut spans = StepSpans::new();
        let t = Instant::now();
        for s in 0..(MAX_PENDING_SPANS as u64 + 3) {
            spans.record(0, s, t, PhaseTimes::default());
        }
        assert_eq!(spans.dropped, 3);
        assert_eq!(spans.take().len(), MAX_PENDING_SPANS);
    }
}
