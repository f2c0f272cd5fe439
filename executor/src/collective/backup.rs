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

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::collective::wire::{describe, read_f32_vec, write_f32s};
use crate::error::{ExecutorError, Result};

/// The `step` of a frame that carries an error message instead of a gradient.
const ERROR_FRAME: u64 = u64::MAX;
/// The `step` of a rank's last frame when it finished training (any other end is a failure).
const GOODBYE_FRAME: u64 = u64::MAX - 1;
/// Bytes of results the aggregator queues for one rank before it counts the rank as hung.
const QUEUE_BYTES: usize = 256 << 20;
/// Largest gradient a frame may announce (floats); anything larger is garbage.
const MAX_FLOATS: u64 = 1 << 32;

/// One step's common gradient.
#[derive(Clone, Debug)]
pub struct StepResult {
    /// The global step.
    pub step: u64,
    /// The average of the contributing ranks' gradients.
    pub gradient: Arc<[f32]>,
    /// How many ranks contributed (the quorum).
    pub contributors: usize,
    /// Whether this rank's gradient is among them (false: it arrived late and was dropped).
    pub included: bool,
}

pub(super) enum Inbound {
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
    results: Receiver<Result<StepResult>>,
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
        let mut outlets = vec![Outlet::Local(local_tx)];
        let mut readers = Vec::new();
        for (i, stream) in streams.into_iter().enumerate() {
            let rank = i + 1;
            let reader = stream.try_clone().map_err(socket_error)?;
            let inbox = inbox_tx.clone();
            spawn("ringflow-backup-read", move || {
                read_gradients(rank, reader, &inbox)
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
        spawn("ringflow-backup-aggregate", move || aggregator.run())?;
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
                    .map_err(|e| {
                        describe(
                            &e,
                            "the gradient aggregator on rank 0",
                            "sending a gradient",
                            self.timeout,
                        )
                    })
            }
        };
        self.send_failed = sent.err();
    }

    /// Waits for the common gradient of `step` (the next one due), within the deadline.
    pub fn result(&mut self, step: u64) -> Result<StepResult> {
        let limit = self.timeout * 2;
        match self.results.recv_timeout(limit) {
            Ok(Err(ExecutorError::Comm(e))) => Err(ExecutorError::Comm(match &self.send_failed {
                Some(sending) => format!("{sending}; then {e}"),
                None => e,
            })),
            Ok(r) => check_step(r?, step),
            Err(RecvTimeoutError::Timeout) => Err(ExecutorError::Comm(format!(
                "rank {} got no common gradient for step {step} within {:.0} s: fewer than {} of \
                 {} ranks sent theirs",
                self.rank,
                limit.as_secs_f64(),
                self.quorum,
                self.world
            ))),
            Err(RecvTimeoutError::Disconnected) => Err(ExecutorError::Comm(
                "the gradient connection to rank 0 is closed".into(),
            )),
        }
    }

    /// The common gradient of `step` if it is already here: the other ranks finished that step
    /// without this one.
    pub fn try_result(&mut self, step: u64) -> Result<Option<StepResult>> {
        match self.results.try_recv() {
            Ok(r) => check_step(r?, step).map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(ExecutorError::Comm(
                "the gradient connection to rank 0 is closed".into(),
            )),
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
        return Err(ExecutorError::Comm(format!(
            "the aggregator sent the gradient of step {} where this rank expected step {step}",
            r.step
        )));
    }
    Ok(r)
}

fn socket_error(e: std::io::Error) -> ExecutorError {
    ExecutorError::Comm(format!("cannot use a gradient connection: {e}"))
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(|_| ())
        .map_err(|e| ExecutorError::Comm(format!("cannot start a thread: {e}")))
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
    Local(Sender<Result<StepResult>>),
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
            let msg = match &gathering {
                Some(g) => {
                    let left = (g.since + self.timeout).saturating_duration_since(Instant::now());
                    match self.inbox.recv_timeout(left) {
                        Ok(m) => m,
                        Err(RecvTimeoutError::Timeout) => {
                            let missing: Vec<String> = (0..self.world)
                                .filter(|&r| !g.included[r])
                                .map(|r| r.to_string())
                                .collect();
                            break Err(format!(
                                "step {}: {} of the {} ranks needed sent gradients within {:.0} s \
                                 (none from rank {})",
                                g.step,
                                g.count,
                                self.quorum,
                                self.timeout.as_secs_f64(),
                                missing.join(", ")
                            ));
                        }
                        Err(RecvTimeoutError::Disconnected) => break Ok(()),
                    }
                }
                None => match self.inbox.recv() {
                    Ok(m) => m,
                    Err(_) => break Ok(()),
                },
            };
            match msg {
                Inbound::Finish => break Ok(()),
                Inbound::Abort => break Err("rank 0 stopped training".into()),
                Inbound::Closed { rank, why } => {
                    if !open[rank] {
                        continue;
                    }
                    if let Some(why) = why {
                        // A lost rank is for elastic recovery to handle, not for the backups.
                        break Err(why);
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
                        break Err(format!(
                            "rank {rank} sent a gradient for step {step} while step {due} is open"
                        ));
                    }
                    let g = gathering.get_or_insert_with(|| Gathering {
                        step,
                        sum: vec![0.0; data.len()],
                        included: vec![false; self.world],
                        count: 0,
                        since: Instant::now(),
                    });
                    if data.len() != g.sum.len() || g.included[rank] {
                        break Err(format!(
                            "rank {rank} sent a gradient of {} floats for step {step} (expected \
                             one of {})",
                            data.len(),
                            g.sum.len()
                        ));
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
            if let Some(g) = &gathering {
                let can_still = (0..self.world)
                    .filter(|&r| open[r] && !g.included[r])
                    .count();
                if g.count + can_still < self.quorum {
                    let closed: Vec<String> = (0..self.world)
                        .filter(|&r| !open[r])
                        .map(|r| r.to_string())
                        .collect();
                    break Err(format!(
                        "step {}: rank {} finished or stopped reading, and the {} ranks left \
                         cannot make the quorum of {}",
                        g.step,
                        closed.join(", "),
                        open.iter().filter(|&&o| o).count(),
                        self.quorum
                    ));
                }
            }
        };
        if let Err(why) = &outcome {
            warn!("backup workers: {why}");
        }
        self.close(outcome.err());
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
                    Frame::Error(e) => Err(ExecutorError::Comm(e)),
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
    fn close(mut self, error: Option<String>) {
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

/// Reads frames until `want` is filled; `Ok(false)` on a clean end of stream before any byte.
/// Waiting between frames has no deadline (a rank may evaluate or checkpoint between steps);
/// a frame that stops halfway is an error.
fn read_frame_head(stream: &mut TcpStream, want: &mut [u8]) -> std::io::Result<bool> {
    let mut filled = 0;
    while filled < want.len() {
        match stream.read(&mut want[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e)
                if filled == 0
                    && matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

pub(super) fn read_gradients(rank: usize, mut stream: TcpStream, inbox: &Sender<Inbound>) {
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

pub(super) fn read_results(mut stream: TcpStream, results: &Sender<Result<StepResult>>) {
    let timeout = stream.read_timeout().ok().flatten().unwrap_or_default();
    let peer = "the gradient aggregator on rank 0";
    loop {
        let mut head = [0u64; 4];
        let failure = match read_frame_head(&mut stream, bytemuck::cast_slice_mut(&mut head)) {
            Ok(true) if head[0] == ERROR_FRAME => {
                let mut text = vec![0u8; head[3].min(1 << 16) as usize];
                match stream.read_exact(&mut text) {
                    Ok(()) => String::from_utf8_lossy(&text).into_owned(),
                    Err(e) => describe(&e, peer, "receiving an error", timeout),
                }
            }
            Ok(true) if head[3] > MAX_FLOATS => format!("{peer} sent a garbled frame"),
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
                Err(e) => describe(&e, peer, "receiving a common gradient", timeout),
            },
            Ok(false) => format!("{peer} closed the gradient connection (did it exit?)"),
            Err(e) => describe(&e, peer, "receiving a common gradient", timeout),
        };
        let _ = results.send(Err(ExecutorError::Comm(failure)));
        return;
    }
}
