//! What `local` and `submit` show on stderr while a job runs.
//!
//! A progress bar when stderr is a terminal ([`Bar`]) and plain lines otherwise ([`Lines`]),
//! so that CI logs stay readable; both print the driver's messages, the test figures after an
//! epoch, and one line per epoch (`epoch 1/5: loss …`). [`for_stderr`] picks one.
//!
//! The events of an epoch and of a test have no fields for a token-sequence job's tokens and a
//! tagger's entity counts: the driver follows those lines with lines of its own (messages),
//! `  14356 tokens, 5127 tokens/s, padding 4.2%` and `  token accuracy 0.9412, entity F1 0.7123
//! (precision 0.70, recall 0.72) (1164 tokens)` ([`crate::figures`]).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ringflow_core::pb;
use ringflow_core::phases::PhaseTimes;

use super::observer::{Observer, Observers};

/// The least time between two plain progress lines within an epoch.
const LINE_INTERVAL: Duration = Duration::from_secs(5);

/// The progress display for this process's stderr, a bar on a terminal and lines otherwise, as
/// the first of a job's observers.
pub fn for_stderr() -> Observers {
    let mut observers = Observers::new();
    if std::io::stderr().is_terminal() {
        observers.push(Bar::default());
    } else {
        observers.push(Lines::default());
    }
    observers
}

/// The time left of a job, from the steps done since the first progress seen.
#[derive(Default)]
struct Eta {
    first: Option<(Instant, u64)>,
}

impl Eta {
    fn update(&mut self, s: &pb::StepProgress) -> Option<Duration> {
        let done = s.epoch * s.steps + s.step;
        let total = s.epochs * s.steps;
        let now = Instant::now();
        let (t0, d0) = *self.first.get_or_insert((now, done));
        let elapsed = now.duration_since(t0).as_secs_f64();
        if done <= d0 || elapsed <= 0.0 || total < done {
            return None;
        }
        let rate = (done - d0) as f64 / elapsed;
        Some(Duration::from_secs_f64((total - done) as f64 / rate))
    }
}

/// `1h02m`, `3m05s`, `12s`.
fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// `loss 0.1234, 5678 samples/s, ETA 1m02s`.
fn figures(s: &pb::StepProgress, eta: Option<Duration>) -> String {
    let eta = eta.map(short_duration).unwrap_or_else(|| "?".into());
    format!(
        "loss {:.4}, {:.0} samples/s, ETA {eta}",
        s.loss, s.samples_per_s
    )
}

/// The line printed when the test split was evaluated after an epoch.
pub fn test_line(t: &pb::EpochTest) -> String {
    let figure = match (t.accuracy, t.mse) {
        (Some(a), _) => format!("accuracy {a:.4}, "),
        (None, Some(m)) => format!("mse {m:.4}, "),
        (None, None) => String::new(),
    };
    format!(
        "test after epoch {}/{}: {figure}loss {:.4} ({} rows)",
        t.epoch + 1,
        t.epochs,
        t.loss,
        t.rows
    )
}

/// The line printed when an epoch ends.
pub fn epoch_line(e: &pb::EpochDone) -> String {
    let [data, forward, backward, allreduce, optimizer] =
        PhaseTimes::from(e.phases.unwrap_or_default())
            .percent()
            .seconds();
    let dropped = if e.dropped_samples > 0 {
        format!(", {} rows dropped by backup workers", e.dropped_samples)
    } else {
        String::new()
    };
    format!(
        "epoch {}/{}: loss {:.4}, {} rows{dropped}, {:.0} samples/s, {:.1} s (data {data:.0}%, \
         forward {forward:.0}%, backward {backward:.0}%, all-reduce {allreduce:.0}%, optimizer \
         {optimizer:.0}%)",
        e.epoch + 1,
        e.epochs,
        e.loss,
        e.samples,
        e.samples_per_s,
        e.seconds,
    )
}

/// A progress bar on stderr for the running epoch; lines print above it.
#[derive(Default)]
pub struct Bar {
    /// The bar and the epoch it shows.
    bar: Option<(ProgressBar, u64)>,
    eta: Eta,
}

impl Bar {
    fn new_bar(s: &pb::StepProgress, eta: Option<Duration>) -> ProgressBar {
        let style = ProgressStyle::with_template(
            "{prefix} [{wide_bar:.cyan/blue}] {pos}/{len} steps, {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> ");
        // Drawn once it shows this step, not empty first.
        let bar = ProgressBar::with_draw_target(Some(s.steps), ProgressDrawTarget::hidden())
            .with_style(style)
            .with_prefix(format!("epoch {}/{}", s.epoch + 1, s.epochs))
            .with_position(s.step)
            .with_message(figures(s, eta));
        bar.set_draw_target(ProgressDrawTarget::stderr());
        bar
    }

    /// Removes the bar, if one shows.
    fn clear(&mut self) {
        if let Some((bar, _)) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Observer for Bar {
    fn message(&mut self, line: &str) {
        match &self.bar {
            Some((bar, _)) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    fn step(&mut self, s: &pb::StepProgress) {
        let eta = self.eta.update(s);
        if self
            .bar
            .as_ref()
            .is_some_and(|(_, epoch)| *epoch != s.epoch)
        {
            self.clear();
        }
        match &self.bar {
            Some((bar, _)) => {
                bar.set_message(figures(s, eta));
                bar.set_length(s.steps);
                bar.set_position(s.step);
            }
            None => self.bar = Some((Bar::new_bar(s, eta), s.epoch)),
        }
    }

    fn epoch(&mut self, e: &pb::EpochDone) {
        self.clear();
        eprintln!("{}", epoch_line(e));
    }

    fn test(&mut self, t: &pb::EpochTest) {
        self.message(&test_line(t));
    }

    fn finish(&mut self) {
        self.clear();
    }
}

/// Plain lines on stderr: messages, a progress line at most every [`LINE_INTERVAL`], and one
/// line per epoch.
pub struct Lines {
    last: Instant,
    eta: Eta,
}

impl Default for Lines {
    fn default() -> Lines {
        Lines {
            last: Instant::now(),
            eta: Eta::default(),
        }
    }
}

impl Observer for Lines {
    fn message(&mut self, line: &str) {
        eprintln!("{line}");
    }

    fn step(&mut self, s: &pb::StepProgress) {
        let eta = self.eta.update(s);
        if self.last.elapsed() < LINE_INTERVAL {
            return;
        }
        self.last = Instant::now();
        // Not "epoch N/M: …", which is the line of an ended epoch.
        eprintln!(
            "step {}/{} of epoch {}/{}: {}",
            s.step,
            s.steps,
            s.epoch + 1,
            s.epochs,
            figures(s, eta)
        );
    }

    fn epoch(&mut self, e: &pb::EpochDone) {
        self.last = Instant::now();
        eprintln!("{}", epoch_line(e));
    }

    fn test(&mut self, t: &pb::EpochTest) {
        self.message(&test_line(t));
    }

    /// Lines leave nothing to remove.
    fn finish(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_short() {
        assert_eq!(short_duration(Duration::from_secs(12)), "12s");
        assert_eq!(short_duration(Duration::from_secs(185)), "3m05s");
        assert_eq!(short_duration(Duration::from_secs(3720)), "1h02m");
    }

    #[test]
    fn eta_counts_the_steps_left_of_every_epoch() {
        let mut eta = Eta::default();
        let step = |epoch, step| pb::StepProgress {
            epoch,
            epochs: 2,
            step,
            steps: 100,
            ..Default::default()
        };
        assert_eq!(eta.update(&step(0, 10)), None, "no rate from one point");
        eta.first = Some((Instant::now() - Duration::from_secs(10), 10));
        // 100 steps in 10 s; 90 steps left.
        let left = eta.update(&step(1, 10)).unwrap().as_secs_f64();
        assert!((8.9..9.2).contains(&left), "{left}");
    }

    #[test]
    fn test_lines_name_the_epoch_and_the_figure() {
        let t = |accuracy, mse| pb::EpochTest {
            epoch: 1,
            epochs: 3,
            rows: 10_000,
            loss: 0.25,
            accuracy,
            mse,
        };
        assert_eq!(
            test_line(&t(Some(0.9512), None)),
            "test after epoch 2/3: accuracy 0.9512, loss 0.2500 (10000 rows)"
        );
        assert_eq!(
            test_line(&t(None, Some(1.5))),
            "test after epoch 2/3: mse 1.5000, loss 0.2500 (10000 rows)"
        );
    }

    #[test]
    fn epoch_lines_keep_their_format() {
        let line = epoch_line(&pb::EpochDone {
            epoch: 0,
            epochs: 2,
            loss: 0.5,
            samples: 1000,
            samples_per_s: 250.0,
            seconds: 4.0,
            ..Default::default()
        });
        assert!(
            line.starts_with("epoch 1/2: loss 0.5000, 1000 rows, 250 samples/s, 4.0 s (data"),
            "{line}"
        );
    }
}
