//! A job's history for people: what `ringflow history DIR` prints, one section after another.

use std::fmt::Write as _;

use super::{JobHistory, Plan, Recovery, Test};
use crate::figures::{evaluated, percent};

impl JobHistory {
    /// The job for people, ending with a newline.
    pub fn render(&self) -> String {
        let mut o = String::new();
        self.render_header(&mut o);
        self.render_executors(&mut o);
        if !self.epochs.is_empty() {
            o.push_str(&self.epoch_table());
        }
        if let Some(last) = self.checkpoints.last() {
            let _ = writeln!(
                o,
                "  checkpoints: {}, the last after {} epochs (step {}) in {}",
                self.checkpoints.len(),
                last.epochs_done,
                last.step,
                last.path
            );
        }
        for r in &self.recoveries {
            let _ = writeln!(o, "{}", recovery_line(r));
        }
        if let Some(t) = &self.test {
            let _ = writeln!(o, "  test: {}", test_figures(t));
        }
        if let Some(m) = &self.model_path {
            let _ = writeln!(o, "  model saved to {m}");
        }
        if let Some(e) = &self.error {
            let _ = writeln!(o, "  error: {e}");
        }
        o
    }

    /// The job's id, name and state; when it was submitted and finished; its plan and memory.
    fn render_header(&self, o: &mut String) {
        let name = match (self.name.is_empty(), self.kind) {
            (true, _) => String::new(),
            (false, None) => format!(" ({})", self.name),
            (false, Some(kind)) => format!(" ({}, {kind})", self.name),
        };
        let _ = writeln!(o, "job {}{name}: {}", self.job_id, self.state);
        let mut when = Vec::new();
        if let Some(s) = &self.submitted_at {
            when.push(format!("submitted {s}"));
        }
        match &self.finished_at {
            Some(f) => when.push(format!("finished {f} ({:.1} s)", self.duration_s)),
            None => when.push(format!(
                "last event {:.1} s after submission",
                self.duration_s
            )),
        }
        let _ = writeln!(o, "  {}", when.join(", "));
        let plan = plan_items(&self.plan);
        if !plan.is_empty() {
            let _ = writeln!(o, "  plan: {}", plan.join(", "));
        }
        if let Some(m) = &self.plan.memory {
            let _ = writeln!(o, "  memory: {}", m.summary());
        }
    }

    /// The executors it started on, those that registered while it ran, and those it lost.
    fn render_executors(&self, o: &mut String) {
        if self.executors.is_empty() {
            let _ = writeln!(
                o,
                "  executors: never started ({} needed)",
                self.plan.executors
            );
        } else {
            let ranks: Vec<String> = self
                .executors
                .iter()
                .map(|e| format!("rank {} {} on {}", e.rank, e.executor_id, e.host))
                .collect();
            let _ = writeln!(
                o,
                "  executors ({}): {}",
                self.executors.len(),
                ranks.join(", ")
            );
        }
        let started = self.started_at.as_deref().unwrap_or("~");
        let late: Vec<String> = self
            .registered
            .iter()
            .filter(|r| r.at.as_str() > started)
            .map(|r| format!("{} on {} at {}", r.executor_id, r.host, r.at))
            .collect();
        if !late.is_empty() {
            let _ = writeln!(o, "  registered while running: {}", late.join(", "));
        }
        for l in &self.lost {
            let _ = writeln!(
                o,
                "  lost at {}: rank {} ({} on {}): {}",
                l.at, l.rank, l.executor_id, l.host, l.reason
            );
        }
    }

    /// One row per epoch under a header, columns aligned; a sequence job's have its tokens,
    /// tokens/s and padding, and an IOB2 tagger's its entity F1 after the epochs it was tested.
    fn epoch_table(&self) -> String {
        let total = self
            .plan
            .epochs
            .map(|e| format!("/{e}"))
            .unwrap_or_default();
        let sequences = self.epochs.iter().any(|e| e.tokens.is_some());
        let entities = self
            .epochs
            .iter()
            .any(|e| e.test.as_ref().is_some_and(|t| t.entities.is_some()));
        let mut header = vec!["epoch", "loss", "rows", "samples/s"];
        if sequences {
            header.extend(["tokens", "tokens/s", "padding"]);
        }
        header.extend([
            "seconds",
            "data",
            "forward",
            "backward",
            "allreduce",
            "optimizer",
            "test",
        ]);
        if entities {
            header.push("entity F1");
        }
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
        for e in &self.epochs {
            let mut samples = e.samples.to_string();
            if e.dropped_samples > 0 {
                let _ = write!(samples, " (-{})", e.dropped_samples);
            }
            let mut row = vec![
                format!("{}{total}", e.epoch + 1),
                format!("{:.4}", e.loss),
                samples,
                format!("{:.0}", e.samples_per_s),
            ];
            if sequences {
                row.extend([
                    or_dash(e.tokens.map(|t| t.to_string())),
                    or_dash(e.tokens_per_s.map(|r| format!("{r:.0}"))),
                    or_dash(e.padding_fraction.map(percent)),
                ]);
            }
            row.push(format!("{:.2}", e.seconds));
            row.extend(e.phase_percent.seconds().map(|p| format!("{p:.0}%")));
            row.push(match &e.test {
                Some(Test {
                    accuracy: Some(a), ..
                }) => format!("acc {a:.4}"),
                Some(Test { mse: Some(m), .. }) => format!("mse {m:.4}"),
                Some(t) => format!("loss {:.4}", t.loss),
                None => "-".into(),
            });
            if entities {
                let f1 = e.test.as_ref().and_then(|t| t.entities).map(|c| c.f1);
                row.push(or_dash(f1.map(|f| format!("{f:.4}"))));
            }
            rows.push(row);
        }
        aligned(&rows)
    }
}

/// The cell's text, or `-` where the row has no figure.
fn or_dash(cell: Option<String>) -> String {
    cell.unwrap_or_else(|| "-".into())
}

/// The plan's known items: `2 epochs`, `469 steps per epoch`, `on cpu`, …
fn plan_items(p: &Plan) -> Vec<String> {
    let mut plan = Vec::new();
    if let Some(e) = p.epochs {
        plan.push(format!("{e} epochs"));
    }
    if let Some(s) = p.steps_per_epoch {
        plan.push(format!("{s} steps per epoch"));
    }
    if let Some(r) = p.rows {
        plan.push(format!("{r} rows"));
    }
    if let Some(b) = p.batch_size {
        plan.push(format!("batch size {b}"));
    }
    if let Some(m) = &p.model {
        plan.push(format!("model {m}"));
    }
    if let Some(d) = &p.device {
        plan.push(format!("on {d}"));
    }
    if let Some(r) = p.resumed_from {
        plan.push(format!(
            "resumed after epoch {} (step {})",
            r.epochs_done, r.step
        ));
    }
    plan
}

/// `  recovery at …: ring generation 1, 3 -> 2 executors, without e-2, 1.5 s after …`.
fn recovery_line(r: &Recovery) -> String {
    let mut line = format!(
        "  recovery at {}: ring generation {}, {} -> {} executors",
        r.at, r.generation, r.world_before, r.world_after
    );
    if !r.lost.is_empty() {
        let _ = write!(line, ", without {}", r.lost.join(", "));
    }
    if !r.joined.is_empty() {
        let _ = write!(line, ", joined by {}", r.joined.join(", "));
    }
    if r.cause.is_empty() {
        line.push_str(" at an epoch boundary");
    } else {
        let _ = write!(line, ", {:.1} s after {}", r.waited_s, r.cause);
    }
    line
}

/// `accuracy 0.9000, loss 0.3000 (100 rows)`; a tagger's `token accuracy 0.9412, entity F1
/// 0.7123 (precision 0.70, recall 0.72), loss 0.3000 (1164 tokens)`.
fn test_figures(t: &Test) -> String {
    let mut figures = Vec::new();
    if let Some(a) = t.accuracy {
        let name = if t.per_token {
            "token accuracy"
        } else {
            "accuracy"
        };
        figures.push(format!("{name} {a:.4}"));
    }
    if let Some(m) = t.mse {
        figures.push(format!("mse {m:.4}"));
    }
    if let Some(c) = &t.entities {
        figures.push(c.line());
    }
    figures.push(format!("loss {:.4}", t.loss));
    format!(
        "{} ({})",
        figures.join(", "),
        evaluated(t.rows, t.per_token)
    )
}

/// `rows` as lines indented by two spaces: the first column left-aligned, the others right,
/// each as wide as its widest cell.
fn aligned(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut o = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, v)| {
                if c == 0 {
                    format!("{v:<w$}", w = widths[c])
                } else {
                    format!("{v:>w$}", w = widths[c])
                }
            })
            .collect();
        let _ = writeln!(o, "  {}", cells.join("  ").trim_end());
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recoveries_say_who_left_who_joined_and_why() {
        let r = Recovery {
            generation: 1,
            world_before: 3,
            world_after: 2,
            lost: vec!["e-2".into()],
            joined: vec![],
            waited_s: 1.46,
            cause: "executor e-2 stopped heartbeating".into(),
            at: "T".into(),
        };
        assert_eq!(
            recovery_line(&r),
            "  recovery at T: ring generation 1, 3 -> 2 executors, without e-2, 1.5 s after \
             executor e-2 stopped heartbeating"
        );
        let joined = Recovery {
            joined: vec!["e-4".into()],
            lost: vec![],
            cause: String::new(),
            ..r
        };
        assert!(
            recovery_line(&joined).ends_with(", joined by e-4 at an epoch boundary"),
            "{}",
            recovery_line(&joined)
        );
    }

    #[test]
    fn tables_align_the_first_column_left_and_the_others_right() {
        let rows = vec![
            vec!["epoch".to_string(), "loss".to_string()],
            vec!["1/2".to_string(), "0.5".to_string()],
        ];
        assert_eq!(aligned(&rows), "  epoch  loss\n  1/2     0.5\n");
    }
}
