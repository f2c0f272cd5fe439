//! Backup workers: every step averages the gradients of the first N−b ranks that are ready.
//!
//! This is synchronous training with backup workers from the TensorFlow paper (Chen et al.,
//! "Revisiting Distributed Synchronous SGD", 2016). A ring cannot finish a reduction without
//! every rank, so backup workers use a star instead: each rank sends its step's gradient to an
//! aggregator thread on rank 0 over the job's authenticated [`Lane::Gradients`] connections.
//! The aggregator sums the gradients of step `t` as they arrive; once `quorum = N − b` ranks have
//! sent theirs it sends the average to every rank, tagged with `t`, and opens step `t + 1`.
//! A gradient that arrives for a closed step is dropped.
//!
//! A late rank is not waited for. When it finishes its own step it receives that step's common
//! gradient, which it applies like everyone else; common gradients of later steps that arrived
//! meanwhile it applies at once, drawing (and skipping) those steps' batches, so that it starts
//! computing again on the common state. Every rank applies the same sequence of averages with
//! the same optimizer, so replicas stay bit-identical.
//!
//! The aggregator's deadlines: once a step has its first gradient, the quorum must be complete
//! within the communication deadline, and a rank whose results pile up beyond a bounded queue
//! (it stopped reading: a hung process) is disconnected. A rank that closes its connection no
//! longer counts towards the quorum; when too few remain the step fails on every rank with a
//! message that says why.
//!
//! [`Lane::Gradients`]: crate::collective::handshake::Lane

mod aggregator;
mod connection;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::Duration;

pub(super) use aggregator::Inbound;
#[cfg(test)]
pub(super) use aggregator::read_gradients;
pub use connection::StepResult;
use connection::{Delivery, ERROR_FRAME, GOODBYE_FRAME, MAX_FLOATS, failed, read_frame_head};
use connection::{socket_error, spawn};

use crate::collective::wire::{describe, read_f32_vec, write_f32s};
use crate::error::{CommError, Peer, Result};

/// How messages name rank 0's end of the gradient connections.
const AGGREGATOR: &str = "the gradient aggregator on rank 0";

enum Uplink {
    /// Rank 0 hands its gradients to the aggregator thread in its own process.
    Local(Sender<Inbound>),
    /// Other ranks send them over their gradient connection.
    Remote(TcpStream),
}

/// One rank's end of backup-worker gradient aggregation.
pub struct BackupReduce {
    rank: usize,
    world: usize,
    quorum: usize,
    timeout: Duration,
    uplink: Uplink,
    results: Receiver<Delivery>,
    /// Whether [`Self::finish`] was called.
    finished: bool,
    /// Why the last gradient could not be sent. Not an error by itself: when the other ranks
    /// finished the job without this one, the aggregator has closed, but the common gradient
    /// this rank waits for is already on its way.
    send_failed: Option<String>,
}

impl BackupReduce {
    /// Rank 0's end: starts the aggregator over the gradient connections of ranks `1..world`
    /// (in rank order).
    pub(crate) fn aggregate(
        world: usize,
        quorum: usize,
        streams: Vec<TcpStream>,
        timeout: Duration,
    ) -> Result<BackupReduce> {
        let (inbox_tx, inbox) = mpsc::channel();
        let (local_tx, results) = mpsc::channel();
        aggregator::start(world, quorum, timeout, streams, &inbox_tx, inbox, local_tx)?;
        Ok(BackupReduce {
            rank: 0,
            world,
            quorum,
            timeout,
            uplink: Uplink::Local(inbox_tx),
            results,
            finished: false,
            send_failed: None,
        })
    }

    /// The end of rank `rank` (not 0), over its connection to the aggregator.
    pub(crate) fn connect(
        rank: usize,
        world: usize,
        quorum: usize,
        stream: TcpStream,
        timeout: Duration,
    ) -> Result<BackupReduce> {
        let (tx, results) = mpsc::channel();
        let reader = stream.try_clone().map_err(socket_error)?;
        spawn("ringflow-backup-results", move || read_results(reader, &tx))?;
        Ok(BackupReduce {
            rank,
            world,
            quorum,
            timeout,
            uplink: Uplink::Remote(stream),
            results,
            finished: false,
            send_failed: None,
        })
    }

    /// How many ranks' gradients make a step (N − b).
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Sends this rank's gradient for global step `step`. A failure shows in [`Self::result`].
    pub fn contribute(&mut self, step: u64, gradient: &[f32]) {
        let sent = match &mut self.uplink {
            Uplink::Local(inbox) => inbox
                .send(Inbound::Gradient {
                    rank: 0,
                    step,
                    data: gradient.to_vec(),
                })
                .map_err(|_| "the gradient aggregator stopped".to_string()),
            Uplink::Remote(stream) => {
                let head = [step, gradient.len() as u64];
                stream
                    .write_all(bytemuck::cast_slice(&head))
                    .and_then(|_| write_f32s(stream, gradient))
                    .map_err(|e| describe(&e, AGGREGATOR, "sending a gradient", self.timeout))
            }
        };
        self.send_failed = sent.err();
    }

    /// Waits for the common gradient of `step` (the next one due), within the deadline.
    pub fn result(&mut self, step: u64) -> Result<StepResult> {
        let limit = self.timeout * 2;
        match self.results.recv_timeout(limit) {
            Ok(Err(e)) => Err(match &self.send_failed {
                Some(sending) => e.reworded(|e| format!("{sending}; then {e}")),
                None => e,
            }
            .into()),
            Ok(Ok(r)) => check_step(r, step),
            Err(RecvTimeoutError::Timeout) => Err(failed(
                Peer::Ring,
                format!(
                    "rank {} got no common gradient for step {step} within {:.0} s: fewer than \
                     {} of {} ranks sent theirs",
                    self.rank,
                    limit.as_secs_f64(),
                    self.quorum,
                    self.world
                ),
            )
            .into()),
            Err(RecvTimeoutError::Disconnected) => Err(closed().into()),
        }
    }

    /// The common gradient of `step` if it is already here: the other ranks finished that step
    /// without this one.
    pub fn try_result(&mut self, step: u64) -> Result<Option<StepResult>> {
        match self.results.try_recv() {
            Ok(r) => check_step(r?, step).map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(closed().into()),
        }
    }

    /// Says that this rank trained to the end. Without it, closing the connection (or rank 0
    /// stopping) counts as a lost rank and fails the step on every rank.
    pub fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        match &mut self.uplink {
            // The aggregator sends what it has queued, then closes the connections.
            Uplink::Local(inbox) => {
                let _ = inbox.send(Inbound::Finish);
            }
            Uplink::Remote(stream) => {
                let _ = stream.write_all(bytemuck::cast_slice(&[GOODBYE_FRAME, 0]));
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for BackupReduce {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        match &self.uplink {
            Uplink::Local(inbox) => {
                let _ = inbox.send(Inbound::Abort);
            }
            Uplink::Remote(stream) => {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}
fn check_step(r: StepResult, step: u64) -> Result<StepResult> {
    if r.step != step {
        let why = format!(
            "the aggregator sent the gradient of step {} where this rank expected step {step}",
            r.step
        );
        return Err(failed(Peer::rank(0), why).into());
    }
    Ok(r)
}
fn closed() -> CommError {
    failed(Peer::rank(0), "the gradient connection to rank 0 is closed")
}

/// A failure to receive from the aggregator, while doing `what`.
fn from_aggregator(e: std::io::Error, what: &str, timeout: Duration) -> CommError {
    failed(Peer::rank(0), describe(&e, AGGREGATOR, what, timeout)).with_cause(e)
}

pub(super) fn read_results(mut stream: TcpStream, results: &Sender<Delivery>) {
    let timeout = stream.read_timeout().ok().flatten().unwrap_or_default();
    loop {
        let mut head = [0u64; 4];
        let failure = match read_frame_head(&mut stream, bytemuck::cast_slice_mut(&mut head)) {
            Ok(true) if head[0] == ERROR_FRAME => {
                let mut text = vec![0u8; head[3].min(1 << 16) as usize];
                match stream.read_exact(&mut text) {
                    // The aggregator's own failure: a rank lost, a quorum out of reach.
                    Ok(()) => failed(Peer::Ring, String::from_utf8_lossy(&text)),
                    Err(e) => from_aggregator(e, "receiving an error", timeout),
                }
            }
            Ok(true) if head[3] > MAX_FLOATS => {
                failed(Peer::rank(0), format!("{AGGREGATOR} sent a garbled frame"))
            }
            Ok(true) => match read_f32_vec(&mut stream, head[3] as usize) {
                Ok(data) => {
                    let r = StepResult {
                        step: head[0],
                        gradient: data.into(),
                        contributors: head[1] as usize,
                        included: head[2] != 0,
                    };
                    if results.send(Ok(r)).is_err() {
                        return;
                    }
                    continue;
                }
                Err(e) => from_aggregator(e, "receiving a common gradient", timeout),
            },
            Ok(false) => failed(
                Peer::rank(0),
                format!("{AGGREGATOR} closed the gradient connection (did it exit?)"),
            ),
            Err(e) => from_aggregator(e, "receiving a common gradient", timeout),
        };
        let _ = results.send(Err(failure));
        return;
    }
}
