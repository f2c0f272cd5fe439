//! Elastic recovery of one job: the ring re-formed without a lost executor (or with idle ones
//! that join at an epoch boundary), and a rank's communication error held while its root cause
//! may still come.

use super::*;

impl Job {
    /// How many times the ring was re-formed.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// True when the job survives lost executors.
    pub fn is_elastic(&self) -> bool {
        matches!(&self.kind, JobKind::Train(plan) if plan.spec.cluster.min_executors.is_some())
    }

    /// True while an elastic job re-forms its ring (an executor was lost or a rank asked).
    pub fn is_recovering(&self) -> bool {
        self.recovery.is_some()
    }

    /// Counts recoveries and lost executors into a summary.
    pub fn recoveries(&self) -> (u32, usize) {
        (self.recoveries, self.executors_lost.len())
    }

    /// The executor of `rank` stopped heartbeating: an elastic job re-forms its ring without it,
    /// any other job fails.
    pub fn rank_lost(&mut self, rank: usize, why: String, now: Instant) {
        if let Some(e) = self.ranks.get(rank).cloned()
            && !self.is_finished()
        {
            self.log(Event::ExecutorLost {
                rank,
                executor_id: e.executor_id,
                host: e.host,
                reason: why.clone(),
            });
        }
        // A rank already failed over its connections (held, waiting for this root cause): the
        // job cannot be recovered without it.
        if self.held_error.is_some()
            || !self.is_elastic()
            || self.state != JobState::Running
            || rank >= self.ranks.len()
        {
            self.fail(why, now);
            return;
        }
        if self.finished.iter().any(|&f| f) {
            // Training is over on some rank: there is no epoch left to re-form the ring for.
            self.fail(
                format!("{why}, after other ranks had finished the job; it cannot be recovered"),
                now,
            );
            return;
        }
        self.message(format!("{why}; re-forming the ring without it"));
        let r = self.recovery.get_or_insert_with(Recovery::default);
        r.started.get_or_insert(now);
        r.lost.insert(rank, why);
        self.executors_lost
            .push(self.ranks[rank].executor_id.clone());
    }

    /// A rank of generation `generation` lost its ring (`error`). Returns its new task once the
    /// ring is re-formed, `Ok(None)` while it is not yet, and `Err` when it must stop.
    pub fn recover(
        &mut self,
        req: &pb::RecoverRequest,
        min_executors: usize,
        idle: Vec<pb::ExecutorInfo>,
        now: Instant,
    ) -> std::result::Result<Option<pb::Task>, String> {
        if self.is_finished() {
            return Err(format!("job {} has ended", self.id));
        }
        if req.generation < self.generation {
            // The ring was re-formed already: is this executor in it?
            return match self
                .ranks
                .iter()
                .position(|e| e.executor_id == req.executor_id)
            {
                Some(rank) if self.recovery.is_none() => Ok(Some(self.task_for(rank as u32))),
                Some(_) => Ok(None),
                None => Err("the ring was re-formed without this executor".into()),
            };
        }
        let rank = req.rank as usize;
        if !self.is_elastic() || rank >= self.ranks.len() {
            return Err(format!("job {} is not elastic", self.id));
        }
        if self.ranks[rank].executor_id != req.executor_id {
            return Err("the ring was re-formed without this executor".into());
        }
        let r = self.recovery.get_or_insert_with(Recovery::default);
        r.started.get_or_insert(now);
        r.asked.entry(rank).or_insert_with(|| req.error.clone());
        if req.awaiting_state {
            r.awaiting.insert(rank);
        }
        let settled =
            (0..self.ranks.len()).all(|i| r.asked.contains_key(&i) || r.lost.contains_key(&i));
        if !settled {
            return Ok(None);
        }
        let recovery = self.recovery.take().expect("present");
        // Survivors that hold the job's state, and joiners that had not received it yet.
        let (survivors, awaiting): (Vec<usize>, Vec<usize>) = recovery
            .asked
            .keys()
            .filter(|i| !recovery.lost.contains_key(i))
            .partition(|i| !recovery.awaiting.contains(i));
        let remain = survivors.len() + awaiting.len();
        let refusal = if remain < min_executors || remain == 0 {
            Some(format!(
                "only {remain} executors remain after losing {}, fewer than \
                 cluster.min_executors = {min_executors}",
                recovery.lost.len()
            ))
        } else if survivors.is_empty() {
            Some(format!(
                "every executor that held the job's state was lost; the {remain} that remain \
                 had joined and not received it yet"
            ))
        } else {
            None
        };
        if let Some(e) = refusal {
            self.fail(e.clone(), now);
            return Err(e);
        }
        let info = |ranks: Vec<usize>| ranks.into_iter().map(|i| self.ranks[i].clone()).collect();
        let (survivors, awaiting) = (info(survivors), info(awaiting));
        let waited = recovery
            .started
            .map_or(0.0, |s| now.duration_since(s).as_secs_f64());
        // The root cause: how a lost executor was lost, before the survivors' broken rings.
        let cause = recovery
            .lost
            .values()
            .chain(recovery.asked.values())
            .next()
            .cloned()
            .unwrap_or_default();
        self.generation += 1;
        let lost_any = !recovery.lost.is_empty();
        if lost_any {
            self.recoveries += 1;
        }
        // Re-formed because idle executors join at an epoch boundary, not because it broke.
        let at_boundary = self
            .reform_before
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .is_some();
        let broke = lost_any || !at_boundary;
        let ranks = self.reformed_ranks(survivors, awaiting, idle);
        self.log_reforming(&recovery, ranks.len(), waited, cause, broke);
        rand::fill(&mut self.secret);
        let n = ranks.len();
        self.ranks = ranks;
        self.progress.regroup(n);
        self.finished = vec![false; n];
        self.last_step = vec![None; n];
        *self.plans.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let rank = self
            .ranks
            .iter()
            .position(|e| e.executor_id == req.executor_id)
            .expect("the caller survived");
        Ok(Some(self.task_for(rank as u32)))
    }

    /// The re-formed ring's members: the survivors that hold the job's state in a stable
    /// order, then those still `awaiting` it (joiners whose first ring broke), then as many idle
    /// executors as `cluster.max_executors` leaves room for, each announced as it joins.
    fn reformed_ranks(
        &mut self,
        survivors: Vec<pb::ExecutorInfo>,
        mut awaiting: Vec<pb::ExecutorInfo>,
        idle: Vec<pb::ExecutorInfo>,
    ) -> Vec<pb::ExecutorInfo> {
        let mut ranks = survivors;
        let order = |a: &pb::ExecutorInfo, b: &pb::ExecutorInfo| {
            (&a.host, &a.ring_address, &a.executor_id).cmp(&(
                &b.host,
                &b.ring_address,
                &b.executor_id,
            ))
        };
        ranks.sort_by(order);
        awaiting.sort_by(order);
        ranks.extend(awaiting);
        // Idle executors join after the survivors, so rank 0 (whose state everyone adopts) is
        // always a survivor that holds the job's state.
        let max = match &self.kind {
            JobKind::Train(plan) => plan
                .spec
                .cluster
                .max_executors
                .unwrap_or(plan.spec.cluster.executors),
            _ => ranks.len(),
        };
        let mut joiners = idle;
        joiners.sort_by(order);
        joiners.truncate(max.saturating_sub(ranks.len()));
        self.joiners = joiners.iter().map(|e| e.executor_id.clone()).collect();
        for e in &joiners {
            self.message(format!(
                "executor {} on {} joins the job",
                e.executor_id, e.host
            ));
        }
        ranks.extend(joiners);
        ranks
    }

    /// Says how the ring was re-formed into `world_after` ranks, in a job message and the event
    /// log: after a loss (the root `cause`), after a break with no executor lost, or at an
    /// epoch boundary for joiners.
    fn log_reforming(
        &mut self,
        recovery: &Recovery,
        world_after: usize,
        waited: f64,
        cause: String,
        broke: bool,
    ) {
        if !recovery.lost.is_empty() {
            self.message(format!(
                "recovery {}: the ring is re-formed with {world_after} executors {waited:.1} s \
                 after it broke ({cause}); the epoch in progress restarts from its beginning",
                self.recoveries
            ));
        } else if broke {
            // A rank hung for less than the heartbeat timeout (or the network blipped): every
            // rank asked to recover and none was lost.
            self.message(format!(
                "the ring is re-formed with the same {world_after} executors {waited:.1} s after \
                 it broke ({cause}), with no executor lost; the epoch in progress restarts from \
                 its beginning"
            ));
        } else {
            self.message(format!(
                "the ring is re-formed with {world_after} executors at an epoch boundary"
            ));
        }
        self.log(Event::Recovery {
            generation: self.generation,
            world_before: self.ranks.len(),
            world_after,
            lost: recovery
                .lost
                .keys()
                .filter_map(|&r| self.ranks.get(r).map(|e| e.executor_id.clone()))
                .collect(),
            joined: self.joiners.iter().cloned().collect(),
            waited_s: micros(waited),
            cause: if broke { cause } else { String::new() },
        });
    }

    /// Whether a rank's communication error waits for a root cause.
    pub fn has_held_error(&self) -> bool {
        self.held_error.is_some() && !self.is_finished()
    }

    /// Fails the job with its held communication error once `grace` has passed without a root
    /// cause, or, while a lost connection of one of its executors is `settling`, once that has
    /// had its own grace too (at most four graces in all).
    pub fn settle_held_error(&mut self, now: Instant, grace: Duration, settling: bool) {
        let Some((_, since)) = &self.held_error else {
            return;
        };
        let held = now.saturating_duration_since(*since);
        if (held >= grace && !settling) || held >= grace * 4 {
            let (error, _) = self.held_error.take().expect("checked");
            self.fail(error, now);
        }
    }
}
