//! The in-memory commit of elastic training (Horovod Elastic's commit/restore): the state at
//! the start of the current epoch, to go back to when the ring breaks, and the broadcast that
//! makes every rank of a re-formed ring adopt the same state.

use ringflow_ml::nn::Model;
use ringflow_ml::optim::Optimizer;

use crate::collective::Collective;
use crate::error::{CommError, CommOp, ExecutorError, Peer, Result};
use crate::train::context::{Recovered, TaskContext};

/// Re-formings tried in a row by one recovery: a re-formed ring breaks before it is in sync only
/// when another executor is lost meanwhile, and each such loss leaves one fewer.
const MAX_REFORMS: usize = 8;

/// What elastic training commits at an epoch's start and goes back to when the ring breaks:
/// parameters, buffers (e.g. batch norm's running statistics), optimizer state, epoch and step.
#[derive(Clone)]
pub struct CommittedState {
    params: Vec<f32>,
    buffers: Vec<f32>,
    optimizer: Vec<(String, Vec<usize>, Vec<f32>)>,
    optimizer_steps: u64,
    epoch: u64,
    step: u64,
    /// A joiner's placeholder before it received the job's state: not a state to go on from.
    awaiting: bool,
}

impl CommittedState {
    /// The current state.
    pub fn take(
        model: &Model,
        optimizer: &Optimizer,
        epoch: u64,
        step: u64,
    ) -> Result<CommittedState> {
        Ok(CommittedState {
            params: model.params().flatten_values()?,
            buffers: model.params().flatten_buffers()?,
            optimizer: optimizer.state_tensors()?,
            optimizer_steps: optimizer.steps(),
            epoch,
            step,
            awaiting: false,
        })
    }

    /// A joiner's first sync on the ring it was added to: adopts rank 0's state (rank 0 always
    /// holds it). When that ring breaks first (another member lost while it connects or
    /// broadcasts), the joiner recovers like a survivor, telling the driver that it holds no
    /// state yet; returns the re-formed ring if there was one, and the epoch and step to go on
    /// from.
    pub fn join(
        ctx: &mut dyn TaskContext,
        model: &Model,
        optimizer: &mut Optimizer,
        comm: &mut dyn Collective,
    ) -> Result<(Option<Recovered>, u64, u64)> {
        let placeholder = CommittedState {
            awaiting: true,
            ..CommittedState::take(model, optimizer, 0, 0)?
        };
        match CommittedState::sync(model, optimizer, comm, placeholder.clone()) {
            Ok((epoch, step)) => Ok((None, epoch, step)),
            Err(ExecutorError::Comm(why)) => {
                comm.close();
                let why = why.to_string();
                let (recovered, epoch, step) = placeholder.rejoin(ctx, &why, model, optimizer)?;
                Ok((Some(recovered), epoch, step))
            }
            Err(e) => Err(e),
        }
    }

    /// Elastic recovery after the ring broke (`why`): waits for the driver to re-form the
    /// ring, goes back to this commit and adopts the new rank 0's; returns the new ring and
    /// the epoch and step to go on from. A re-formed ring that breaks before every rank is in
    /// sync (an executor lost while it connects or broadcasts) is re-formed again, like the
    /// first break, up to [`MAX_REFORMS`] times.
    pub fn rejoin(
        &self,
        ctx: &mut dyn TaskContext,
        why: &str,
        model: &Model,
        optimizer: &mut Optimizer,
    ) -> Result<(Recovered, u64, u64)> {
        let mut attempt = 1;
        loop {
            // Each attempt reports the first break: the driver keeps one cause per rank, and a
            // reply that the ring was re-formed without this executor names that cause.
            let mut tried = || -> Result<(Recovered, u64, u64)> {
                let mut recovered = ctx.recover(why, self.awaiting)?;
                self.restore(model, optimizer)?;
                let (epoch, step) =
                    CommittedState::sync(model, optimizer, recovered.comm.as_mut(), self.clone())?;
                Ok((recovered, epoch, step))
            };
            match tried() {
                Err(ExecutorError::Comm(_)) if attempt < MAX_REFORMS => attempt += 1,
                other => return other,
            }
        }
    }

    /// Puts the committed state back.
    pub fn restore(&self, model: &Model, optimizer: &mut Optimizer) -> Result<()> {
        model.params().load_flat_values(&self.params)?;
        model.params().load_flat_buffers(&self.buffers)?;
        let state = &self.optimizer;
        optimizer.load_state(self.optimizer_steps, |key| {
            state
                .iter()
                .find(|(n, _, _)| n == key)
                .map(|(_, shape, values)| (shape.clone(), values.clone()))
        })?;
        Ok(())
    }

    /// Makes every rank of `comm` adopt rank 0's commit (`mine` is this rank's, already
    /// restored); returns the epoch and step to continue from.
    pub fn sync(
        model: &Model,
        optimizer: &mut Optimizer,
        comm: &mut dyn Collective,
        mine: CommittedState,
    ) -> Result<(u64, u64)> {
        // Integers travel bit for bit as the f32 with the same bits.
        let words = |v: u64| [f32::from_bits(v as u32), f32::from_bits((v >> 32) as u32)];
        let int = |w: &[f32]| w[0].to_bits() as u64 | ((w[1].to_bits() as u64) << 32);
        let mut header: Vec<f32> = [mine.epoch, mine.step, mine.optimizer_steps]
            .into_iter()
            .flat_map(words)
            .collect();
        comm.broadcast(&mut header, 0)?;
        let (epoch, step, optimizer_steps) =
            (int(&header[0..2]), int(&header[2..4]), int(&header[4..6]));
        let mut params = mine.params;
        comm.broadcast(&mut params, 0)?;
        let mut buffers = mine.buffers;
        if !buffers.is_empty() {
            comm.broadcast(&mut buffers, 0)?;
        }
        let mut state: Vec<f32> = mine
            .optimizer
            .iter()
            .flat_map(|(_, _, v)| v.iter().copied())
            .collect();
        comm.broadcast(&mut state, 0)?;
        let mut tensors = mine.optimizer;
        let mut at = 0;
        for (_, _, values) in tensors.iter_mut() {
            let n = values.len();
            let part = state.get(at..at + n).ok_or_else(|| {
                let why = "rank 0 sent a shorter optimizer state";
                CommError::new(Peer::rank(0), CommOp::Broadcast, why)
            })?;
            values.copy_from_slice(part);
            at += n;
        }
        CommittedState {
            params,
            buffers,
            optimizer: tensors,
            optimizer_steps,
            epoch,
            step,
            awaiting: false,
        }
        .restore(model, optimizer)?;
        Ok((epoch, step))
    }
}
