//! A job's preparation before training: the ranks' partial data sources and statistics,
//! merged into one preprocessing that every rank then uses.

use super::*;

impl Job {
    /// A rank's partial for a preparation phase (once), and the merged result when every rank
    /// has sent its own.
    pub fn prepare(
        &mut self,
        rank: usize,
        phase: pb::PreparePhase,
        partial: Option<&str>,
        now: Instant,
    ) -> std::result::Result<Option<String>, String> {
        if rank >= self.ranks.len() {
            return Err(format!("job {} has no rank {rank}", self.id));
        }
        let who = self.describe_rank(rank);
        match phase {
            pb::PreparePhase::Source => {
                if let Some(p) = partial {
                    self.prepare.source[rank] = Some(p.to_string());
                }
                if self.prepare.source_merged.is_none()
                    && self.prepare.source.iter().all(Option::is_some)
                {
                    let unreadable: Vec<String> = self
                        .prepare
                        .source
                        .iter()
                        .enumerate()
                        .filter_map(|(r, p)| {
                            p.as_ref()
                                .filter(|p| !p.is_empty())
                                .map(|p| format!("{}: {p}", self.describe_rank(r)))
                        })
                        .collect();
                    let merged = if unreadable.is_empty() {
                        self.message(
                            "every executor can read the data: reading it directly".into(),
                        );
                        "direct"
                    } else {
                        self.message(format!(
                            "serving the data from the driver over Arrow Flight, because {}",
                            unreadable.join("; ")
                        ));
                        "driver"
                    };
                    self.prepare.source_merged = Some(merged.into());
                }
                Ok(self.prepare.source_merged.clone())
            }
            pb::PreparePhase::Stats => {
                if let Some(p) = partial {
                    let stats: DataStats = serde_json::from_str(p)
                        .map_err(|e| format!("{who} sent unreadable statistics: {e}"))?;
                    self.prepare.stats[rank] = Some(stats);
                }
                if self.prepare.stats_merged.is_none()
                    && self.prepare.stats.iter().all(Option::is_some)
                {
                    let mut merged = DataStats::default();
                    for s in self.prepare.stats.iter_mut() {
                        merged.merge(s.take().unwrap_or_default());
                    }
                    match self.merge_stats(&merged) {
                        Ok(p) => self.prepare.stats_merged = Some(p.to_json()),
                        Err(e) => {
                            self.fail(e.clone(), now);
                            return Err(e);
                        }
                    }
                }
                Ok(self.prepare.stats_merged.clone())
            }
        }
    }

    pub(super) fn merge_stats(
        &mut self,
        merged: &DataStats,
    ) -> std::result::Result<Preprocessing, String> {
        let Some(plan) = self.plan() else {
            return Err("only training jobs collect statistics".into());
        };
        let data = &plan.spec.data;
        let p = Preprocessing::from_stats(merged, data.label_classes.as_deref());
        let mut lines = Vec::new();
        if let Some(classes) = &p.classes {
            if classes.len() > MAX_CLASSES {
                return Err(format!(
                    "data.label: column `{}` has more than {MAX_CLASSES} distinct values; is it \
                     really a class?",
                    data.label
                ));
            }
            if classes.len() != plan.model.outputs {
                return Err(format!(
                    "data.label: column `{}` has {} distinct classes in data.train, but the model \
                     has {} outputs",
                    data.label,
                    classes.len(),
                    plan.model.outputs
                ));
            }
            lines.push(format!("{} label classes", classes.len()));
        }
        if let Some(m) = &merged.moments {
            lines.push(format!(
                "feature mean and standard deviation over {} rows",
                m.count
            ));
        }
        if !lines.is_empty() {
            self.message(format!("statistics of data.train: {}", lines.join(", ")));
        }
        Ok(p)
    }
}
