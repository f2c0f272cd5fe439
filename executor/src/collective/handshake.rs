//! Authenticating ring connections.
//!
//! The driver gives every job a random 32-byte secret. When rank `a` connects to rank `b` (its
//! right neighbour on the ring [`Lane`], or rank 0 on the gradient lane of backup workers),
//! both prove that they hold it without sending it, and `b` checks that the connection belongs
//! to the job it is in and comes from a rank it expects on that lane:
//!
//! ```text
//! a → b   "RFLW" version, lane, job id, rank a, nonce_a
//! b → a   nonce_b, HMAC(secret, "acceptor" | lane | job | b | nonce_a)
//! a → b   HMAC(secret, "connector" | lane | job | a | nonce_b)
//! b → a   1 (accepted)
//! ```
//!
//! Anything else — another job, a wrong rank or lane, a bad MAC, garbage, silence — is dropped
//! and counted by the acceptor (see `collective::listener`). Every read has a deadline.

use std::io::{Read, Write};
use std::net::TcpStream;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

const MAGIC: &[u8; 4] = b"RFLW";
const VERSION: u8 = 2;
const MAX_JOB_ID: usize = 1024;

/// Which of a job's connections a handshake opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// A ring connection, from a rank to its right neighbour.
    Ring = 0,
    /// A backup-workers connection, from a rank to the aggregator on rank 0.
    Gradients = 1,
}

impl Lane {
    fn from_byte(b: u8) -> Option<Lane> {
        match b {
            0 => Some(Lane::Ring),
            1 => Some(Lane::Gradients),
            _ => None,
        }
    }

    /// The lane's name in messages.
    pub fn describe(self) -> &'static str {
        match self {
            Lane::Ring => "ring",
            Lane::Gradients => "gradient",
        }
    }
}

/// A job's ring secret (compared in constant time).
#[derive(Clone)]
pub struct JobSecret(pub [u8; 32]);

impl PartialEq for JobSecret {
    fn eq(&self, other: &JobSecret) -> bool {
        ringflow_core::security::constant_time_eq(&self.0, &other.0)
    }
}

impl Eq for JobSecret {}

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobSecret(…)")
    }
}

impl JobSecret {
    /// A fresh random secret.
    pub fn random() -> JobSecret {
        let mut s = [0u8; 32];
        rand::fill(&mut s);
        JobSecret(s)
    }

    /// The secret from bytes sent by the driver.
    pub fn from_bytes(bytes: &[u8]) -> Option<JobSecret> {
        bytes.try_into().ok().map(JobSecret)
    }

    fn keyed(
        &self,
        role: &str,
        lane: Lane,
        job: &str,
        rank: u32,
        nonce: &[u8; 16],
    ) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("any key length");
        for part in [
            b"ringflow-ring-v2|".as_slice(),
            role.as_bytes(),
            b"|",
            &[lane as u8],
            b"|",
            job.as_bytes(),
        ] {
            m.update(part);
        }
        m.update(&rank.to_le_bytes());
        m.update(nonce);
        m
    }

    fn mac(&self, role: &str, lane: Lane, job: &str, rank: u32, nonce: &[u8; 16]) -> Vec<u8> {
        self.keyed(role, lane, job, rank, nonce)
            .finalize()
            .into_bytes()
            .to_vec()
    }

    fn verify(
        &self,
        role: &str,
        lane: Lane,
        job: &str,
        rank: u32,
        nonce: &[u8; 16],
        tag: &[u8],
    ) -> bool {
        self.keyed(role, lane, job, rank, nonce)
            .verify_slice(tag)
            .is_ok()
    }
}

fn nonce() -> [u8; 16] {
    let mut n = [0u8; 16];
    rand::fill(&mut n);
    n
}

/// Runs the connector's side (rank `rank` connecting to rank `peer_rank` on `lane`).
pub fn connect(
    stream: &mut TcpStream,
    lane: Lane,
    job: &str,
    rank: u32,
    peer_rank: u32,
    secret: &JobSecret,
) -> Result<(), ConnectError> {
    let my_nonce = nonce();
    let mut hello = Vec::with_capacity(32 + job.len());
    hello.extend_from_slice(MAGIC);
    hello.push(VERSION);
    hello.push(lane as u8);
    hello.extend_from_slice(&(job.len() as u16).to_le_bytes());
    hello.extend_from_slice(job.as_bytes());
    hello.extend_from_slice(&rank.to_le_bytes());
    hello.extend_from_slice(&my_nonce);
    stream.write_all(&hello)?;
    let mut reply = [0u8; 48];
    stream.read_exact(&mut reply)?;
    let peer_nonce: [u8; 16] = reply[..16].try_into().expect("16 bytes");
    if !secret.verify("acceptor", lane, job, peer_rank, &my_nonce, &reply[16..]) {
        return Err(ConnectError::Unproven);
    }
    let proof = secret.mac("connector", lane, job, rank, &peer_nonce);
    stream.write_all(&proof)?;
    let mut ok = [0u8; 1];
    stream.read_exact(&mut ok)?;
    if ok[0] != 1 {
        return Err(ConnectError::Refused);
    }
    Ok(())
}

/// Why the connector's side of a handshake failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// Reading or writing failed (a deadline, a closed connection).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The peer's MAC is not that of this job's secret.
    #[error("the peer could not prove it holds this job's secret")]
    Unproven,
    /// The peer answered the proof with a refusal.
    #[error("the peer refused the connection")]
    Refused,
}

/// Why the acceptor's side of a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// Reading or writing failed (a deadline, a closed connection).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The peer is not one this executor accepts, or could not prove the job's secret.
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// Why the acceptor refuses a connecting peer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The first bytes are not a ringflow hello.
    #[error("not a ringflow ring connection")]
    NotRing,
    /// The hello speaks another version of the protocol.
    #[error("ring protocol version {0} (this executor speaks {VERSION})")]
    Version(u8),
    /// The hello names no lane this executor knows.
    #[error("unknown lane {0}")]
    UnknownLane(u8),
    /// The hello's job id is longer than any job id.
    #[error("job id too long")]
    JobIdTooLong,
    /// The peer's proof is not that of this job's secret.
    #[error("bad MAC: the peer does not hold this job's secret")]
    BadMac,
    /// No ring formed on this executor within the handshake deadline.
    #[error(
        "rank {rank} of job {job:?} connected, but no ring formed here within the handshake \
         deadline"
    )]
    NoRing {
        /// The rank the peer claims.
        rank: u32,
        /// The job it claims.
        job: String,
    },
    /// The peer is for another job than the ring being formed.
    #[error("it is for job {job:?}, this executor runs {ours:?}")]
    OtherJob {
        /// The job the peer claims.
        job: String,
        /// The job of the ring being formed.
        ours: String,
    },
    /// The ring being formed expects no such rank on that lane.
    #[error("rank {rank} may not connect on the {} lane of rank {ours}", .lane.describe())]
    NotExpected {
        /// The rank the peer claims.
        rank: u32,
        /// The lane it opens.
        lane: Lane,
        /// This executor's rank.
        ours: u32,
    },
    /// That rank is connected on that lane already.
    #[error("rank {rank} is already connected on the {} lane", .lane.describe())]
    AlreadyConnected {
        /// The rank the peer claims.
        rank: u32,
        /// The lane it opens.
        lane: Lane,
    },
}

/// What a connecting rank says first: the lane, job and rank it claims, and its nonce.
#[derive(Debug)]
pub struct Hello {
    /// The lane it opens.
    pub lane: Lane,
    /// The job it claims to belong to.
    pub job: String,
    /// The rank it claims to be.
    pub rank: u32,
    nonce: [u8; 16],
}

/// Reads a connecting rank's [`Hello`] (the acceptor's first step).
pub fn read_hello(stream: &mut impl Read) -> Result<Hello, Failure> {
    let mut head = [0u8; 8];
    stream.read_exact(&mut head)?;
    if &head[..4] != MAGIC {
        return Err(Refusal::NotRing.into());
    }
    if head[4] != VERSION {
        return Err(Refusal::Version(head[4]).into());
    }
    let lane = Lane::from_byte(head[5]).ok_or(Refusal::UnknownLane(head[5]))?;
    let len = u16::from_le_bytes([head[6], head[7]]) as usize;
    if len > MAX_JOB_ID {
        return Err(Refusal::JobIdTooLong.into());
    }
    let mut rest = vec![0u8; len + 4 + 16];
    stream.read_exact(&mut rest)?;
    Ok(Hello {
        lane,
        job: String::from_utf8_lossy(&rest[..len]).into_owned(),
        rank: u32::from_le_bytes(rest[len..len + 4].try_into().expect("4 bytes")),
        nonce: rest[len + 4..].try_into().expect("16 bytes"),
    })
}

/// Completes the acceptor's side after [`read_hello`], as rank `rank` of the hello's job with
/// `secret`: proves the secret and checks the peer's proof.
pub fn answer(
    stream: &mut (impl Read + Write),
    hello: &Hello,
    rank: u32,
    secret: &JobSecret,
) -> Result<(), Failure> {
    let my_nonce = nonce();
    let mut reply = Vec::with_capacity(48);
    reply.extend_from_slice(&my_nonce);
    reply.extend_from_slice(&secret.mac("acceptor", hello.lane, &hello.job, rank, &hello.nonce));
    stream.write_all(&reply)?;
    let mut proof = [0u8; 32];
    stream.read_exact(&mut proof)?;
    if !secret.verify(
        "connector",
        hello.lane,
        &hello.job,
        hello.rank,
        &my_nonce,
        &proof,
    ) {
        let _ = stream.write_all(&[0]);
        return Err(Refusal::BadMac.into());
    }
    stream.write_all(&[1])?;
    Ok(())
}
