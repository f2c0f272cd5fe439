//! Rank 0's aggregator: it sums each step's gradients as the ranks send them and, once the
//! quorum is complete, sends the average to every rank (see [`super`]).

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::connection::{
    Delivery, ERROR_FRAME, GOODBYE_FRAME, MAX_FLOATS, StepResult, failed, read_frame_head,
    socket_error, spawn,
};
use crate::collective::wire::{describe, read_f32_vec, write_f32s};
use crate::error::{Peer, Result};

/// Bytes of results the aggregator queues for one rank before it counts the rank as hung.
const QUEUE_BYTES: usize = 256 << 20;

/// What reaches the aggregator.
pub(in crate::collective) enum Inbound {
    Gradient {
        rank: usize,
        step: u64,
        data: Vec<f32>,
    },
    /// A rank's connection ended: `why` is `None` when it finished training.
    Closed { rank: usize, why: Option<String> },
    /// Rank 0 finished training: send what is queued and close.
    Finish,
    /// Rank 0 stopped without finishing.
    Abort,
}

/// Starts rank 0's aggregator thread over the gradient connections of ranks `1..world` (in
/// rank order), with a reader thread for each that sends to the aggregator's `inbox` (as rank
/// 0's own end does, through `to_inbox`); rank 0's results go to `local`.
pub(super) fn start(
    world: usize,
    quorum: usize,
    timeout: Duration,
    streams: Vec<TcpStream>,
    to_inbox: &Sender<Inbound>,
    inbox: Receiver<Inbound>,
    local: Sender<Delivery>,
) -> Result<()> {
    let mut outlets = vec![Outlet::Local(local)];
    let mut readers = Vec::new();
    for (i, stream) in streams.into_iter().enumerate() {
        let rank = i + 1;
        let reader = stream.try_clone().map_err(socket_error)?;
        let to_inbox = to_inbox.clone();
        spawn("ringflow-backup-read", move || {
            read_gradients(rank, reader, &to_inbox)
        })?;
        readers.push(stream.try_clone().map_err(socket_error)?);
        outlets.push(Outlet::Pending(stream));
    }
    let aggregator = Aggregator {
        world,
        quorum,
        timeout,
        inbox,
        outlets,
        readers,
    };
    spawn("ringflow-backup-aggregate", move || aggregator.run())
}

/// Why the aggregator stopped before rank 0 finished training.
#[derive(Debug, thiserror::Error)]
enum Halt {
    /// Rank 0 stopped without finishing.
    #[error("rank 0 stopped training")]
    RankZeroStopped,
    /// A rank's connection failed (what its reader said).
    #[error("{0}")]
    Lost(String),
    /// A rank sent a gradient for a later step than the one being gathered.
    #[error("rank {rank} sent a gradient for step {step} while step {due} is open")]
    Ahead { rank: usize, step: u64, due: u64 },
    /// A rank sent a gradient of another length, or a second one for the step.
    #[error(
        "rank {rank} sent a gradient of {floats} floats for step {step} (expected one of \
         {expected})"
    )]
    Length {
        rank: usize,
        floats: usize,
        step: u64,
        expected: usize,
    },
    /// Too few ranks sent the step's gradient before the deadline.
    #[error(
        "step {step}: {count} of the {quorum} ranks needed sent gradients within \
         {timeout_s:.0} s (none from rank {missing})"
    )]
    Timeout {
        step: u64,
        count: usize,
        quorum: usize,
        timeout_s: f64,
        /// The ranks it lacks, comma-separated.
        missing: String,
    },
    /// Too few ranks are left to make the step's quorum.
    #[error(
        "step {step}: rank {closed} finished or stopped reading, and the {left} ranks left \
         cannot make the quorum of {quorum}"
    )]
    QuorumLost {
        step: u64,
        /// The ranks gone, comma-separated.
        closed: String,
        left: usize,
        quorum: usize,
    },
}

/// What the aggregator sends to one rank.
enum Frame {
    Result {
        step: u64,
        contributors: usize,
        included: bool,
        gradient: Arc<[f32]>,
    },
    Error(String),
}

enum Outlet {
    Local(Sender<Delivery>),
    /// A remote rank before the first result (the queue is sized by the gradient's length).
    Pending(TcpStream),
    Remote {
        queue: SyncSender<Frame>,
        stream: TcpStream,
    },
    Gone,
}

struct Aggregator {
    world: usize,
    quorum: usize,
    timeout: Duration,
    inbox: Receiver<Inbound>,
    outlets: Vec<Outlet>,
    /// The remote connections, to stop their readers when the aggregator ends.
    readers: Vec<TcpStream>,
}

/// The step being gathered.
struct Gathering {
    step: u64,
    sum: Vec<f32>,
    included: Vec<bool>,
    count: usize,
    since: Instant,
}

impl Aggregator {
    fn run(mut self) {
        let mut open = vec![true; self.world];
        let mut next_step: Option<u64> = None;
        let mut gathering: Option<Gathering> = None;
        let outcome = loop {
            let msg = match self.next_message(gathering.as_ref()) {
                Ok(Some(m)) => m,
                Ok(None) => break Ok(()),
                Err(why) => break Err(why),
            };
            match msg {
                Inbound::Finish => break Ok(()),
                Inbound::Abort => break Err(Halt::RankZeroStopped),
                Inbound::Closed { rank, why } => {
                    if !open[rank] {
                        continue;
                    }
                    if let Some(why) = why {
                        // A lost rank is for elastic recovery to handle, not for the backups.
                        break Err(Halt::Lost(why));
                    }
                    debug!(rank, "rank {rank} finished training");
                    open[rank] = false;
                    self.outlets[rank] = Outlet::Gone;
                }
                Inbound::Gradient { rank, step, data } => {
                    let due = *next_step.get_or_insert(step);
                    if step < due {
                        // Late: that step's common gradient went out without this one.
                        continue;
                    }
                    if step > due {
                        break Err(Halt::Ahead { rank, step, due });
                    }
                    let g = gathering.get_or_insert_with(|| Gathering {
                        step,
                        sum: vec![0.0; data.len()],
                        included: vec![false; self.world],
                        count: 0,
                        since: Instant::now(),
                    });
                    if data.len() != g.sum.len() || g.included[rank] {
                        break Err(Halt::Length {
                            rank,
                            floats: data.len(),
                            step,
                            expected: g.sum.len(),
                        });
                    }
                    for (s, d) in g.sum.iter_mut().zip(&data) {
                        *s += d;
                    }
                    g.included[rank] = true;
                    g.count += 1;
                    if g.count == self.quorum {
                        let g = gathering.take().expect("just filled");
                        self.publish(g, &mut open);
                        next_step = Some(due + 1);
                    }
                }
            }
            if let Some(why) = gathering.as_ref().and_then(|g| self.quorum_lost(g, &open)) {
                break Err(why);
            }
        };
        if let Err(why) = &outcome {
            warn!("backup workers: {why}");
        }
        self.close(outcome.err());
    }

    /// The next message; while a step is gathered, waits no longer than its deadline (an
    /// error then names the ranks it lacks). `None` when every sender is gone.
    fn next_message(
        &self,
        gathering: Option<&Gathering>,
    ) -> std::result::Result<Option<Inbound>, Halt> {
        let Some(g) = gathering else {
            return Ok(self.inbox.recv().ok());
        };
        let left = (g.since + self.timeout).saturating_duration_since(Instant::now());
        match self.inbox.recv_timeout(left) {
            Ok(m) => Ok(Some(m)),
            Err(RecvTimeoutError::Disconnected) => Ok(None),
            Err(RecvTimeoutError::Timeout) => {
                let missing: Vec<String> = (0..self.world)
                    .filter(|&r| !g.included[r])
                    .map(|r| r.to_string())
                    .collect();
                Err(Halt::Timeout {
                    step: g.step,
                    count: g.count,
                    quorum: self.quorum,
                    timeout_s: self.timeout.as_secs_f64(),
                    missing: missing.join(", "),
                })
            }
        }
    }

    /// Why step `g` can no longer reach the quorum with the ranks still `open`, if it cannot.
    fn quorum_lost(&self, g: &Gathering, open: &[bool]) -> Option<Halt> {
        let can_still = (0..self.world)
            .filter(|&r| open[r] && !g.included[r])
            .count();
        if g.count + can_still >= self.quorum {
            return None;
        }
        let closed: Vec<String> = (0..self.world)
            .filter(|&r| !open[r])
            .map(|r| r.to_string())
            .collect();
        Some(Halt::QuorumLost {
            step: g.step,
            closed: closed.join(", "),
            left: open.iter().filter(|&&o| o).count(),
            quorum: self.quorum,
        })
    }

    /// Sends step `g`'s average to every rank.
    fn publish(&mut self, g: Gathering, open: &mut [bool]) {
        let scale = 1.0 / g.count as f32;
        let mut sum = g.sum;
        for s in &mut sum {
            *s *= scale;
        }
        let gradient: Arc<[f32]> = sum.into();
        for (rank, is_open) in open.iter_mut().enumerate() {
            let frame = Frame::Result {
                step: g.step,
                contributors: g.count,
                included: g.included[rank],
                gradient: gradient.clone(),
            };
            if !self.deliver(rank, frame) {
                *is_open = false;
            }
        }
    }

    /// Queues `frame` for `rank`; false when the rank is gone or hung (it is disconnected).
    fn deliver(&mut self, rank: usize, frame: Frame) -> bool {
        if matches!(self.outlets[rank], Outlet::Pending(_)) {
            let Outlet::Pending(stream) = std::mem::replace(&mut self.outlets[rank], Outlet::Gone)
            else {
                return false;
            };
            let floats = match &frame {
                Frame::Result { gradient, .. } => gradient.len().max(1),
                Frame::Error(_) => 1,
            };
            let depth = (QUEUE_BYTES / (floats * 4)).clamp(8, 4096);
            let (queue, items) = mpsc::sync_channel(depth);
            let writer = stream.try_clone();
            let timeout = self.timeout;
            match writer {
                Ok(w) => {
                    let spawned = spawn("ringflow-backup-write", move || {
                        write_results(rank, w, items, timeout)
                    });
                    if spawned.is_err() {
                        return false;
                    }
                    self.outlets[rank] = Outlet::Remote { queue, stream };
                }
                Err(_) => return false,
            }
        }
        match &self.outlets[rank] {
            Outlet::Local(tx) => {
                let r = match frame {
                    Frame::Result {
                        step,
                        contributors,
                        included,
                        gradient,
                    } => Ok(StepResult {
                        step,
                        gradient,
                        contributors,
                        included,
                    }),
                    Frame::Error(e) => Err(failed(Peer::Ring, e)),
                };
                tx.send(r).is_ok()
            }
            Outlet::Remote { queue, stream } => match queue.try_send(frame) {
                Ok(()) => true,
                Err(mpsc::TrySendError::Full(_)) => {
                    warn!(
                        rank,
                        "rank {rank} stopped reading common gradients (is it hung?); \
                         disconnecting it"
                    );
                    let _ = stream.shutdown(Shutdown::Both);
                    self.outlets[rank] = Outlet::Gone;
                    false
                }
                Err(mpsc::TrySendError::Disconnected(_)) => {
                    self.outlets[rank] = Outlet::Gone;
                    false
                }
            },
            Outlet::Pending(_) | Outlet::Gone => false,
        }
    }

    /// Ends aggregation: every rank still connected gets `error` (if any) after what is queued,
    /// and the connections close.
    fn close(mut self, error: Option<Halt>) {
        if let Some(e) = error {
            for rank in 0..self.world {
                self.deliver(rank, Frame::Error(format!("backup workers: {e}")));
            }
        }
        // Dropping the queues lets each writer finish and close its connection; shutting the
        // read side ends the readers.
        self.outlets.clear();
        for s in &self.readers {
            let _ = s.shutdown(Shutdown::Read);
        }
    }
}

pub(in crate::collective) fn read_gradients(
    rank: usize,
    mut stream: TcpStream,
    inbox: &Sender<Inbound>,
) {
    let timeout = stream.read_timeout().ok().flatten().unwrap_or_default();
    let name = format!("rank {rank}");
    loop {
        let mut head = [0u64; 2];
        let why = match read_frame_head(&mut stream, bytemuck::cast_slice_mut(&mut head)) {
            Ok(true) if head[0] == GOODBYE_FRAME => None,
            Ok(true) if head[0] == ERROR_FRAME => {
                Some(format!("{name} sent a gradient for step {}", head[0]))
            }
            Ok(true) if head[1] > MAX_FLOATS => {
                Some(format!("{name} announced a gradient of {} floats", head[1]))
            }
            Ok(true) => match read_f32_vec(&mut stream, head[1] as usize) {
                Ok(data) => {
                    let msg = Inbound::Gradient {
                        rank,
                        step: head[0],
                        data,
                    };
                    if inbox.send(msg).is_err() {
                        return;
                    }
                    continue;
                }
                Err(e) => Some(describe(&e, &name, "receiving a gradient", timeout)),
            },
            Ok(false) => Some(format!(
                "{name} closed its gradient connection before the end of training (did it exit?)"
            )),
            Err(e) => Some(describe(&e, &name, "receiving a gradient", timeout)),
        };
        let _ = inbox.send(Inbound::Closed { rank, why });
        return;
    }
}

fn write_results(rank: usize, mut stream: TcpStream, items: Receiver<Frame>, timeout: Duration) {
    for frame in items {
        let r = match &frame {
            Frame::Result {
                step,
                contributors,
                included,
                gradient,
            } => {
                let head = [
                    *step,
                    *contributors as u64,
                    u64::from(*included),
                    gradient.len() as u64,
                ];
                stream
                    .write_all(bytemuck::cast_slice(&head))
                    .and_then(|_| write_f32s(&mut stream, gradient))
            }
            Frame::Error(e) => {
                let head = [ERROR_FRAME, 0, 0, e.len() as u64];
                stream
                    .write_all(bytemuck::cast_slice(&head))
                    .and_then(|_| stream.write_all(e.as_bytes()))
            }
        };
        if let Err(e) = r {
            debug!(
                rank,
                "{}",
                describe(
                    &e,
                    &format!("rank {rank}"),
                    "sending a common gradient",
                    timeout
                )
            );
            break;
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}
