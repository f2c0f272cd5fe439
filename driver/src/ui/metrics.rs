//! Prometheus text exposition (format 0.0.4) of the driver's state at `/metrics`.
//!
//! Everything is computed from the scheduler at scrape time: job and executor counts, and per
//! job its steps, samples, loss, throughput (and a token-sequence job's tokens/s, padding and
//! entity F1), all-reduce seconds and bytes, and a histogram of step-phase times built from
//! every rank's per-step spans (the same ones `--timeline` draws), or, where a job has none,
//! from its per-epoch phase totals.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Instant;

use ringflow_core::pb;
use ringflow_core::pb::job_event::Event;
use ringflow_core::phases::PhaseTimes;

use super::api::state_name;
use crate::figures;
use crate::scheduler::{Job, JobKind, Scheduler};
use crate::summary::JobSummary;

/// Upper bounds (seconds) of the step-phase histogram's buckets.
const PHASE_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Prometheus label value escaping.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", label(v)))
            .collect();
        let labels = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", labels.join(","))
        };
        let _ = writeln!(self.out, "{name}{labels} {value}");
    }
}

/// Totals of one job, from its events.
#[derive(Default)]
struct JobTotals {
    steps: u64,
    samples: u64,
    loss: Option<f64>,
    samples_per_s: Option<f64>,
    /// The latest evaluation of the test split: accuracy, or a regression's MSE.
    test_accuracy: Option<f64>,
    test_mse: Option<f64>,
    /// An IOB2 tagger's entity-level F1 at the latest evaluation.
    test_entity_f1: Option<f64>,
    /// Token sequences: the latest finished epoch's real tokens per second and padding share.
    tokens_per_s: Option<f64>,
    padding_fraction: Option<f64>,
    allreduce_s: f64,
    /// Per phase: (bucket counts, sum, count) of per-step mean times.
    phases: BTreeMap<&'static str, ([u64; PHASE_BUCKETS.len()], f64, u64)>,
}

fn totals(job: &Job) -> JobTotals {
    let mut t = JobTotals::default();
    let mut finished_steps = 0;
    let mut spans_seen = false;
    let mut epoch_phases = Vec::new();
    let reports = job.reports();
    if let Some(last) = reports.epochs().last() {
        (t.tokens_per_s, t.padding_fraction) = (last.tokens_per_s(), last.padding_fraction());
    }
    for e in job.events() {
        match &e.event {
            Some(Event::Step(s)) => {
                t.steps = finished_steps + s.step;
                t.loss = Some(s.loss);
                t.samples_per_s = Some(s.samples_per_s);
            }
            Some(Event::Epoch(d)) => {
                finished_steps += d.steps;
                t.steps = finished_steps;
                t.samples += d.samples;
                t.loss = Some(d.loss);
                t.samples_per_s = Some(d.samples_per_s);
                if let Some(p) = &d.phases {
                    t.allreduce_s += p.allreduce * job.ranks().len().max(1) as f64;
                    epoch_phases.push((*p, d.steps));
                }
            }
            Some(Event::Test(x)) => {
                (t.test_accuracy, t.test_mse) = (x.accuracy, x.mse);
                t.test_entity_f1 = reports
                    .epoch_tests()
                    .get(&x.epoch)
                    .and_then(figures::entities)
                    .map(|c| c.f1());
            }
            Some(Event::Summary(text)) => {
                if let Ok(summary) = JobSummary::from_payload(text)
                    && summary.test_loss.is_some()
                {
                    (t.test_accuracy, t.test_mse) = (summary.test_accuracy, summary.test_mse);
                    t.test_entity_f1 = summary.test_entity_f1;
                }
            }
            Some(Event::Spans(ranks)) => {
                for s in &ranks.spans {
                    spans_seen = true;
                    let phases = PhaseTimes::from(s).seconds();
                    for (name, seconds) in PhaseTimes::NAMES.into_iter().zip(phases) {
                        observe(&mut t, name, seconds, 1);
                    }
                }
            }
            _ => {}
        }
    }
    if !spans_seen {
        for (p, steps) in &epoch_phases {
            observe_phases(&mut t, p, *steps);
        }
    }
    t
}

/// Adds `count` observations of `seconds` to phase `name`'s histogram.
fn observe(t: &mut JobTotals, name: &'static str, seconds: f64, count: u64) {
    let entry = t
        .phases
        .entry(name)
        .or_insert(([0; PHASE_BUCKETS.len()], 0.0, 0));
    for (i, &bound) in PHASE_BUCKETS.iter().enumerate() {
        if seconds <= bound {
            entry.0[i] += count;
        }
    }
    entry.1 += seconds * count as f64;
    entry.2 += count;
}

/// Adds an epoch's mean per-step phase times as `steps` observations each.
fn observe_phases(t: &mut JobTotals, p: &pb::PhaseTimes, steps: u64) {
    if steps == 0 {
        return;
    }
    for (name, seconds) in PhaseTimes::NAMES
        .into_iter()
        .zip(PhaseTimes::from(*p).seconds())
    {
        observe(t, name, seconds / steps as f64, steps);
    }
}

/// Bytes one rank sends in a ring all-reduce of `floats` values among `world` ranks.
fn ring_bytes(floats: u64, world: u64) -> f64 {
    if world < 2 {
        return 0.0;
    }
    2.0 * (world - 1) as f64 / world as f64 * floats as f64 * 4.0
}

/// The parameter count of a built-in MLP spec (`None` for other model kinds, whose size the
/// driver does not know without building them).
fn mlp_params(model: &ringflow_ml::nn::ModelSpec) -> Option<u64> {
    if model.kind != "mlp" {
        return None;
    }
    let layers: Vec<u64> = model
        .params
        .get("layers")?
        .as_array()?
        .iter()
        .map(|v| v.as_u64())
        .collect::<Option<_>>()?;
    Some(layers.windows(2).map(|w| w[0] * w[1] + w[1]).sum())
}

/// The exposition text.
pub fn render(s: &Scheduler, _now: Instant) -> String {
    let mut out = String::new();
    let mut f = Family { out: &mut out };
    counts(&mut f, s);
    let jobs: Vec<(&Job, JobTotals)> = s
        .jobs()
        .filter(|j| matches!(j.kind, JobKind::Train(_)))
        .map(|j| (j, totals(j)))
        .collect();
    job_figures(&mut f, &jobs);
    phase_histograms(&mut f, &jobs);
    out
}

/// Jobs by state, forgotten jobs, and executors by state.
fn counts(f: &mut Family<'_>, s: &Scheduler) {
    f.header(
        "ringflow_jobs",
        "gauge",
        "Jobs known to the driver, by state.",
    );
    let mut by_state: BTreeMap<&str, u64> = [
        "queued",
        "waiting",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ]
    .into_iter()
    .map(|k| (k, 0))
    .collect();
    for j in s.jobs() {
        *by_state.entry(state_name(j.state)).or_default() += 1;
    }
    for (state, n) in &by_state {
        f.sample("ringflow_jobs", &[("state", state)], *n as f64);
    }
    f.header(
        "ringflow_jobs_forgotten_total",
        "counter",
        "Finished jobs the driver no longer keeps (beyond --retained-jobs).",
    );
    f.sample(
        "ringflow_jobs_forgotten_total",
        &[],
        s.jobs_forgotten() as f64,
    );

    f.header(
        "ringflow_executors",
        "gauge",
        "Registered executors, by state.",
    );
    let busy = s.executors().filter(|e| e.assigned.is_some()).count();
    let total = s.executors().count();
    f.sample("ringflow_executors", &[("state", "busy")], busy as f64);
    f.sample(
        "ringflow_executors",
        &[("state", "idle")],
        (total - busy) as f64,
    );
}

/// One sample per training job of each job-level figure.
fn job_figures(f: &mut Family<'_>, jobs: &[(&Job, JobTotals)]) {
    let per_job = |f: &mut Family<'_>,
                   name: &str,
                   kind: &str,
                   help: &str,
                   value: &dyn Fn(&Job, &JobTotals) -> Option<f64>| {
        f.header(name, kind, help);
        for (j, t) in jobs {
            if let Some(v) = value(j, t) {
                let job_name = j.kind.name();
                f.sample(name, &[("job", &j.id), ("name", &job_name)], v);
            }
        }
    };
    per_job(
        f,
        "ringflow_job_steps_total",
        "counter",
        "Training steps every rank has taken.",
        &|_, t| Some(t.steps as f64),
    );
    per_job(
        f,
        "ringflow_job_samples_total",
        "counter",
        "Rows trained on in finished epochs, all ranks together.",
        &|_, t| Some(t.samples as f64),
    );
    per_job(
        f,
        "ringflow_job_loss",
        "gauge",
        "The latest training loss.",
        &|_, t| t.loss,
    );
    per_job(
        f,
        "ringflow_job_test_accuracy",
        "gauge",
        "The test accuracy at the latest evaluation of the test split (classification).",
        &|_, t| t.test_accuracy,
    );
    per_job(
        f,
        "ringflow_job_test_mse",
        "gauge",
        "The test mean squared error at the latest evaluation of the test split (regression).",
        &|_, t| t.test_mse,
    );
    per_job(
        f,
        "ringflow_job_samples_per_second",
        "gauge",
        "The latest training throughput of the whole job.",
        &|_, t| t.samples_per_s,
    );
    per_job(
        f,
        "ringflow_job_tokens_per_second",
        "gauge",
        "Real tokens trained per second in the latest finished epoch (token sequences).",
        &|_, t| t.tokens_per_s,
    );
    per_job(
        f,
        "ringflow_job_padding_fraction",
        "gauge",
        "The share of padding in the latest finished epoch's batches (token sequences).",
        &|_, t| t.padding_fraction,
    );
    per_job(
        f,
        "ringflow_job_test_entity_f1",
        "gauge",
        "The entity-level F1 at the latest evaluation of the test split (IOB2 taggers).",
        &|_, t| t.test_entity_f1,
    );
    per_job(
        f,
        "ringflow_allreduce_seconds_total",
        "counter",
        "Seconds ranks waited for gradient all-reduces in finished epochs, all ranks together.",
        &|_, t| Some(t.allreduce_s),
    );
    per_job(
        f,
        "ringflow_allreduce_bytes_total",
        "counter",
        "Bytes the ring all-reduce sent for gradients, all ranks together (2(N-1)/N of the \
         model per rank and step).",
        &|j, t| {
            let JobKind::Train(plan) = &j.kind else {
                return None;
            };
            let world = j.ranks().len() as u64;
            let floats = mlp_params(&plan.spec.model)?;
            Some(ring_bytes(floats, world) * world as f64 * t.steps as f64)
        },
    );
}

/// The step-phase histograms of every training job.
fn phase_histograms(f: &mut Family<'_>, jobs: &[(&Job, JobTotals)]) {
    f.header(
        "ringflow_step_phase_seconds",
        "histogram",
        "Time per training step in each phase, every rank's steps (from per-epoch means where a \
         job sent no step spans).",
    );
    for (j, t) in jobs {
        for (phase, (buckets, sum, count)) in &t.phases {
            let labels = [("job", j.id.as_str()), ("phase", *phase)];
            for (bound, n) in PHASE_BUCKETS.iter().zip(buckets) {
                let le = bound.to_string();
                f.sample(
                    "ringflow_step_phase_seconds_bucket",
                    &[labels[0], labels[1], ("le", &le)],
                    *n as f64,
                );
            }
            f.sample(
                "ringflow_step_phase_seconds_bucket",
                &[labels[0], labels[1], ("le", "+Inf")],
                *count as f64,
            );
            f.sample("ringflow_step_phase_seconds_sum", &labels, *sum);
            f.sample("ringflow_step_phase_seconds_count", &labels, *count as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_traffic_is_two_n_minus_one_over_n_of_the_buffer() {
        assert_eq!(ring_bytes(1000, 1), 0.0);
        assert_eq!(ring_bytes(1000, 4), 1.5 * 4000.0);
    }

    #[test]
    fn mlp_sizes_come_from_the_spec() {
        let spec = ringflow_ml::nn::ModelSpec::mlp(&[784, 1024, 10], "relu");
        assert_eq!(mlp_params(&spec), Some(784 * 1024 + 1024 + 1024 * 10 + 10));
    }

    #[test]
    fn a_sequence_jobs_totals_have_its_tokens_padding_and_entity_f1() {
        let t = totals(&crate::ui::api::tests::trained(true));
        assert_eq!(
            (t.tokens_per_s, t.padding_fraction),
            (Some(3000.0), Some(0.25))
        );
        assert!((t.test_entity_f1.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        let t = totals(&crate::ui::api::tests::trained(false));
        assert_eq!((t.tokens_per_s, t.padding_fraction), (None, None));
        assert_eq!(t.test_entity_f1, None);
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn phases_fill_cumulative_buckets() {
        let mut t = JobTotals::default();
        let p = pb::PhaseTimes {
            data: 0.0,
            forward: 0.3,
            backward: 0.0,
            allreduce: 0.0,
            optimizer: 0.0,
        };
        observe_phases(&mut t, &p, 100);
        let (buckets, sum, count) = t.phases["forward"];
        assert_eq!(count, 100);
        assert!((sum - 0.3).abs() < 1e-12);
        // 3 ms per step: above 2.5 ms, within 5 ms.
        assert_eq!(buckets[4], 0);
        assert_eq!(buckets[5], 100);
        assert_eq!(buckets[11], 100);
    }
}
