//! Failures to talk to the driver or to the other executors of a job.
//!
//! A [`CommError`] says who the failure concerns ([`Peer`]: a rank of the ring, the driver, or
//! nothing remote), what was being done ([`CommOp`]), and the sentence a user reads, which
//! names both where it helps. Every one of them counts as a communication failure: the trainer
//! of an elastic job recovers from it, and the driver waits briefly for the root cause before
//! failing a job with it.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// Whom a communication failure concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Peer {
    /// One rank of the job's ring, with its ring address (`host:port`) where it is known.
    Rank {
        /// The rank.
        rank: usize,
        /// Its ring address.
        address: Option<String>,
    },
    /// The ring as a whole: no single rank is known to be at fault (an operation that did not
    /// finish in time, results that disagree).
    Ring,
    /// The driver, at this URL.
    Driver(String),
    /// Nothing remote: this executor's own threads, sockets, runtime or devices.
    Local,
}

impl Peer {
    /// Rank `rank` at ring address `address`.
    pub fn rank_at(rank: usize, address: impl Into<String>) -> Peer {
        Peer::Rank {
            rank,
            address: Some(address.into()),
        }
    }

    /// Rank `rank`, address unknown.
    pub fn rank(rank: usize) -> Peer {
        Peer::Rank {
            rank,
            address: None,
        }
    }

    /// The driver at `url`.
    pub fn driver(url: impl Into<String>) -> Peer {
        Peer::Driver(url.into())
    }
}

/// Names the peer as messages do: `rank 2 (10.0.0.3:7100)`, `the driver at http://…`.
impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Rank {
                rank,
                address: Some(a),
            } => write!(f, "rank {rank} ({a})"),
            Peer::Rank {
                rank,
                address: None,
            } => write!(f, "rank {rank}"),
            Peer::Ring => f.write_str("the ring"),
            Peer::Driver(url) => write!(f, "the driver at {url}"),
            Peer::Local => f.write_str("this executor"),
        }
    }
}

/// What was being done when communication failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommOp {
    /// Starting this executor: its RPC runtime, its ring and health listeners, its route to
    /// the driver.
    Start,
    /// A call to the driver: registering, heartbeats, task reports, partitions served by it.
    DriverCall,
    /// Forming a ring: connecting to the neighbours, accepting them, authenticating.
    FormRing,
    /// Re-forming the ring of an elastic job after a failure.
    Reform,
    /// A ring all-reduce.
    AllReduce,
    /// A ring broadcast.
    Broadcast,
    /// A ring all-gather.
    AllGather,
    /// A barrier.
    Barrier,
    /// Exchanging a step's gradient with the aggregator of backup workers.
    BackupGradient,
    /// Setting NCCL up among the GPUs of one host.
    NcclSetup,
    /// An NCCL all-reduce of the gradients.
    NcclAllReduce,
    /// Reading this executor's partitions of the data.
    ReadData,
}

/// The operation's name, as messages write it (`all-reduce`, `NCCL setup`).
impl fmt::Display for CommOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CommOp::Start => "starting the executor",
            CommOp::DriverCall => "a call to the driver",
            CommOp::FormRing => "forming the ring",
            CommOp::Reform => "re-forming the ring",
            CommOp::AllReduce => "all-reduce",
            CommOp::Broadcast => "broadcast",
            CommOp::AllGather => "all-gather",
            CommOp::Barrier => "barrier",
            CommOp::BackupGradient => "a backup-worker gradient exchange",
            CommOp::NcclSetup => "NCCL setup",
            CommOp::NcclAllReduce => "NCCL all-reduce",
            CommOp::ReadData => "reading partitions",
        })
    }
}

/// A failure to talk to the driver or to other executors.
///
/// Its text is [`CommError::message`], a whole sentence. Where the failure has an underlying
/// error (a socket's, a thread's, CUDA's), the sentence already tells it and
/// [`CommError::cause`] holds it for code that inspects it; it is not also reported as
/// [`Error::source`], which would print it twice in a chain of causes.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct CommError {
    peer: Peer,
    op: CommOp,
    message: String,
    cause: Option<Arc<dyn Error + Send + Sync>>,
}

impl CommError {
    /// A failure of `op` concerning `peer`, told by `message`.
    pub fn new(peer: Peer, op: CommOp, message: impl Into<String>) -> CommError {
        CommError {
            peer,
            op,
            message: message.into(),
            cause: None,
        }
    }

    /// A failure of `op` concerning `peer` that `cause` explains: the message is
    /// `"{context}: {cause}"`.
    pub fn because(
        peer: Peer,
        op: CommOp,
        context: impl fmt::Display,
        cause: impl Error + Send + Sync + 'static,
    ) -> CommError {
        CommError::new(peer, op, format!("{context}: {cause}")).with_cause(cause)
    }

    /// This executor could not start a thread it needs for `op`.
    pub fn thread(op: CommOp, cause: std::io::Error) -> CommError {
        CommError::because(Peer::Local, op, "cannot start a thread", cause)
    }

    /// The same failure, keeping `cause` as the underlying error (the message is unchanged).
    pub fn with_cause(mut self, cause: impl Error + Send + Sync + 'static) -> CommError {
        self.cause = Some(Arc::new(cause));
        self
    }

    /// The same failure told by another sentence, made from the current one.
    pub fn reworded(mut self, reword: impl FnOnce(&str) -> String) -> CommError {
        self.message = reword(&self.message);
        self
    }

    /// Whom the failure concerns.
    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    /// What was being done.
    pub fn op(&self) -> CommOp {
        self.op
    }

    /// The sentence that tells the failure (also the error's text).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The underlying error, where there is one.
    pub fn cause(&self) -> Option<&(dyn Error + Send + Sync + 'static)> {
        self.cause.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_named_as_messages_name_them() {
        assert_eq!(
            Peer::rank_at(2, "10.0.0.3:7100").to_string(),
            "rank 2 (10.0.0.3:7100)"
        );
        assert_eq!(Peer::rank(0).to_string(), "rank 0");
        assert_eq!(
            Peer::driver("http://d:7077").to_string(),
            "the driver at http://d:7077"
        );
    }

    #[test]
    fn a_cause_is_told_once_and_kept() {
        let io = std::io::Error::new(std::io::ErrorKind::AddrInUse, "address in use");
        let e = CommError::because(Peer::Local, CommOp::Start, "cannot listen on :7100", io);
        assert_eq!(e.to_string(), "cannot listen on :7100: address in use");
        assert_eq!((e.peer(), e.op()), (&Peer::Local, CommOp::Start));
        let cause = e.cause().and_then(|c| c.downcast_ref::<std::io::Error>());
        assert_eq!(cause.map(|c| c.kind()), Some(std::io::ErrorKind::AddrInUse));
        assert!(e.source().is_none(), "the cause is in the text already");
        let e = e.reworded(|m| format!("the ring is broken: {m}"));
        assert_eq!(
            e.to_string(),
            "the ring is broken: cannot listen on :7100: address in use"
        );
        assert!(e.cause().is_some());
    }
}
