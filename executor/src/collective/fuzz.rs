//! Fuzz targets of everything a peer sends on a ring connection: the handshake (both sides),
//! the collectives' headers and payloads, and the backup workers' gradient frames. Any bytes
//! give an error sentence (naming the peer where the reader knows it), never a panic, and no
//! buffer is sized by a number the peer sent: the largest allocation stays within what the
//! reader itself needs or what really arrived.

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use super::ReduceOp;
use super::algorithms::{self, CHUNK, Link, LinkEnds};
use super::backup::{Inbound, read_gradients, read_results};
use super::handshake::{self, JobSecret, Lane};
use super::wire::configure;
use crate::error::Peer;
use crate::fuzz::{config, largest_allocation};

const JOB: &str = "fuzz-20250101T000000-a1b2-0001";
/// The most a handshake reader may allocate: a job id of at most 1 KiB and fixed fields.
const HANDSHAKE_LIMIT: usize = 4 << 10;

/// Connected loopback sockets: `(peer, ours)`, with the peer's `bytes` already sent and its
/// side closed for writing, so that every read ends.
struct Pairs(TcpListener);

impl Pairs {
    fn new() -> Pairs {
        Pairs(TcpListener::bind("127.0.0.1:0").unwrap())
    }

    fn fed(&self, bytes: &[u8]) -> (TcpStream, TcpStream) {
        let mut peer = TcpStream::connect(self.0.local_addr().unwrap()).unwrap();
        let (ours, _) = self.0.accept().unwrap();
        configure(&ours, Duration::from_secs(5)).unwrap();
        peer.write_all(bytes).unwrap();
        peer.shutdown(Shutdown::Write).unwrap();
        (peer, ours)
    }
}

fn run<S: Strategy>(cases: u32, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    TestRunner::new(config(cases)).run(&strategy, test).unwrap();
}

/// `base` with up to three bytes changed, truncated, or extended with random bytes.
fn damaged(base: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = base.len();
    (
        prop::collection::vec((0..len.max(1), any::<u8>()), 0..3),
        prop_oneof![Just(None), (0..=len).prop_map(Some)],
        prop::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(move |(edits, cut, tail)| {
            let mut b = base.clone();
            for (at, v) in edits {
                if at < b.len() {
                    b[at] = v;
                }
            }
            match cut {
                Some(n) => b.truncate(n),
                None => b.extend(tail),
            }
            b
        })
}

/// What a connector says first, with any lane, job id length and rank (see `handshake`).
fn hello() -> impl Strategy<Value = Vec<u8>> {
    let len = prop_oneof![Just(JOB.len() as u16), 0u16..2048, any::<u16>()];
    (0u8..3, len, prop_oneof![0u32..4, any::<u32>()]).prop_flat_map(|(lane, len, rank)| {
        let mut b = b"RFLW\x02".to_vec();
        b.push(lane);
        b.extend_from_slice(&len.to_le_bytes());
        b.extend(JOB.bytes().take(len as usize));
        b.extend_from_slice(&rank.to_le_bytes());
        b.extend_from_slice(&[9; 16]);
        b.extend_from_slice(&[1; 32]);
        damaged(b)
    })
}

/// The acceptor's side of the handshake as the ring listener runs it (reading the hello, then
/// proving the secret and checking the peer's proof), for rank `rank`; any peer place accepted.
fn accept(
    stream: &mut std::net::TcpStream,
    rank: u32,
    secret: &JobSecret,
) -> Result<(), handshake::Failure> {
    let hello = handshake::read_hello(stream)?;
    handshake::answer(stream, &hello, rank, secret)
}

fn any_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..256)
}

/// The acceptor's side, given any bytes: refused with a one-line reason, allocating little.
#[test]
fn fuzz_ring_handshake_acceptor() {
    let pairs = Pairs::new();
    let secret = JobSecret([3; 32]);
    run(512, prop_oneof![any_bytes(), hello()], |bytes| {
        let (_peer, mut ours) = pairs.fed(&bytes);
        let (result, largest) = largest_allocation(|| accept(&mut ours, 1, &secret));
        let Err(e) = result else {
            return Err(TestCaseError::fail("random bytes passed the handshake"));
        };
        let e = e.to_string();
        prop_assert!(!e.is_empty() && !e.contains('\n'), "{e}");
        prop_assert!(largest <= HANDSHAKE_LIMIT, "allocated {largest} bytes");
        Ok(())
    });
}

/// The connector's side, given any reply: refused with a one-line reason, allocating little.
#[test]
fn fuzz_ring_handshake_connector() {
    let pairs = Pairs::new();
    let secret = JobSecret([3; 32]);
    // The acceptor's nonce and MAC, then its verdict: accepted (1), so that only the MAC
    // stands between a damaged reply and a connection.
    let mut reply = vec![5; 48];
    reply.push(1);
    let reply = damaged(reply);
    run(512, prop_oneof![any_bytes(), reply], |bytes| {
        let (_peer, mut ours) = pairs.fed(&bytes);
        let (result, largest) =
            largest_allocation(|| handshake::connect(&mut ours, Lane::Ring, JOB, 0, 1, &secret));
        let Err(e) = result else {
            return Err(TestCaseError::fail("a random reply passed the handshake"));
        };
        let e = e.to_string();
        prop_assert!(!e.is_empty() && !e.contains('\n'), "{e}");
        prop_assert!(largest <= HANDSHAKE_LIMIT, "allocated {largest} bytes");
        Ok(())
    });
}

/// One collective as a rank runs it, with what its left neighbour sends.
#[derive(Clone, Debug)]
struct Op {
    kind: u64,
    rank: usize,
    world: usize,
    len: usize,
    root: usize,
}

impl Op {
    /// The header the left neighbour must send first: `[kind | root << 8, 1, len]` (the root
    /// is a broadcast's; the other collectives send 0).
    fn header(&self) -> [u64; 3] {
        let root = if self.kind == 2 { self.root as u64 } else { 0 };
        [self.kind | (root << 8), 1, self.len as u64]
    }

    /// Floats this rank receives after the header: the ring algorithms' definition (an
    /// all-reduce receives every segment but its own in the reduce-scatter and every one but
    /// its right neighbour's in the all-gather; segments are an even split of the buffer).
    fn floats_in(&self) -> usize {
        let (n, len) = (self.world, self.len);
        let seg = |i: usize| (i + 1) * len / n - i * len / n;
        match self.kind {
            1 => 2 * len - seg(self.rank) - seg((self.rank + 1) % n),
            2 if self.rank == self.root => 0,
            2 => len,
            _ => (n - 1) * len,
        }
    }

    fn run(&self, link: &mut Link) -> Result<(), crate::error::CommError> {
        let mut buf = vec![1.5f32; self.len];
        match self.kind {
            1 => algorithms::all_reduce(link, &mut buf, ReduceOp::Average),
            2 => algorithms::broadcast(link, &mut buf, self.root),
            _ => algorithms::all_gather(link, &buf).map(|_| ()),
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    (1u64..4, 2usize..6, 0usize..3000).prop_flat_map(|(kind, world, len)| {
        (0..world, 0..world).prop_map(move |(rank, root)| Op {
            kind,
            rank,
            world,
            len,
            root,
        })
    })
}

/// What the left neighbour sends: the right header and payload (perhaps short, perhaps
/// damaged), or anything.
fn stream_for(op: &Op) -> impl Strategy<Value = Vec<u8>> + use<> {
    let mut good: Vec<u8> = bytemuck::cast_slice(&op.header()).to_vec();
    let floats: Vec<f32> = (0..op.floats_in()).map(|i| i as f32).collect();
    good.extend_from_slice(bytemuck::cast_slice(&floats));
    prop_oneof![Just(good.clone()), damaged(good), any_bytes()]
}

/// A rank's collective, given any bytes from its left neighbour: done when the header and the
/// whole payload arrived, otherwise an error naming the neighbour; never a panic, and no
/// buffer beyond the rank's own data and one chunk per step in flight.
#[test]
fn fuzz_ring_collective_frames() {
    let pairs = Pairs::new();
    let strategy = op().prop_flat_map(|op| (Just(op.clone()), stream_for(&op)));
    run(512, strategy, |(op, bytes)| {
        let (_peer, left) = pairs.fed(&bytes);
        let (out_tx, _out_rx) = channel();
        let (_pool_tx, pool_rx) = channel();
        let (_pool16_tx, pool16_rx) = channel();
        let left_rank = (op.rank + op.world - 1) % op.world;
        let left_name = format!("rank {left_rank} (127.0.0.1:1)");
        let ends = LinkEnds {
            rank: op.rank,
            world: op.world,
            left,
            left_peer: Peer::rank_at(left_rank, "127.0.0.1:1"),
            right_peer: Peer::rank((op.rank + 1) % op.world),
            outgoing: out_tx,
            writer_error: Arc::new(Mutex::new(None)),
            pool: pool_rx,
            pool16: pool16_rx,
        };
        let mut link = Link::new(ends, Duration::from_secs(5));
        let (result, largest) = largest_allocation(|| op.run(&mut link));
        let header = op.header();
        let header: &[u8] = bytemuck::cast_slice(&header);
        let complete =
            bytes.len() >= header.len() + 4 * op.floats_in() && bytes.starts_with(header);
        match result {
            Ok(()) => prop_assert!(complete, "finished without the whole stream"),
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!complete, "failed on a whole stream: {msg}");
                prop_assert!(msg.contains(&left_name) && !msg.contains('\n'), "{msg}");
            }
        }
        let limit = 4 * (op.world * op.len + 2 * CHUNK) + (64 << 10);
        prop_assert!(
            largest <= limit,
            "allocated {largest} bytes (limit {limit})"
        );
        Ok(())
    });
}

/// A gradient frame `[step, floats]` and its floats, as a rank sends it to rank 0.
fn gradient_frames() -> impl Strategy<Value = Vec<u8>> {
    let frame = (prop_oneof![0u64..3, any::<u64>()], 0u64..100).prop_map(|(step, n)| {
        let mut b: Vec<u8> = bytemuck::cast_slice(&[step, n]).to_vec();
        b.extend((0..n * 4).map(|i| i as u8));
        b
    });
    let frames = prop::collection::vec(frame, 0..4).prop_map(|f| f.concat());
    let huge = (
        any::<u64>(),
        prop_oneof![Just(1u64 << 32), Just(u64::MAX), any::<u64>()],
    )
        .prop_map(|(step, n)| bytemuck::cast_slice(&[step, n]).to_vec());
    prop_oneof![frames.prop_flat_map(damaged), huge, any_bytes()]
}

/// Rank 0's reader of a rank's gradients, given any bytes: gradients, then the connection's
/// end with a reason naming the rank; memory grows only with what arrived.
#[test]
fn fuzz_backup_gradient_frames() {
    let pairs = Pairs::new();
    run(512, gradient_frames(), |bytes| {
        let (_peer, ours) = pairs.fed(&bytes);
        let (inbox, received) = channel();
        let ((), largest) = largest_allocation(|| read_gradients(2, ours, &inbox));
        let last = received.try_iter().last();
        let Some(Inbound::Closed { rank: 2, why }) = last else {
            return Err(TestCaseError::fail("the reader did not report its end"));
        };
        if let Some(why) = why {
            prop_assert!(why.contains("rank 2") && !why.contains('\n'), "{why}");
        }
        let limit = 2 * bytes.len() + 8 * CHUNK + (64 << 10);
        prop_assert!(
            largest <= limit,
            "allocated {largest} bytes for {}",
            bytes.len()
        );
        Ok(())
    });
}

/// A result frame `[step, contributors, included, floats]` (or an error frame with text).
fn result_frames() -> impl Strategy<Value = Vec<u8>> {
    let frame = (
        prop_oneof![0u64..3, Just(u64::MAX), any::<u64>()],
        any::<u64>(),
        0u64..100,
    )
        .prop_map(|(step, contributors, n)| {
            let mut b: Vec<u8> = bytemuck::cast_slice(&[step, contributors, 1, n]).to_vec();
            b.extend((0..n * 4).map(|i| i as u8));
            b
        });
    let frames = prop::collection::vec(frame, 0..4).prop_map(|f| f.concat());
    let huge = (
        any::<u64>(),
        prop_oneof![Just(1u64 << 32), Just(u64::MAX), any::<u64>()],
    )
        .prop_map(|(step, n)| bytemuck::cast_slice(&[step, 0, 0, n]).to_vec());
    prop_oneof![frames.prop_flat_map(damaged), huge, any_bytes()]
}

/// A rank's reader of rank 0's common gradients, given any bytes: results, then an error;
/// memory grows only with what arrived.
#[test]
fn fuzz_backup_result_frames() {
    let pairs = Pairs::new();
    run(512, result_frames(), |bytes| {
        let (_peer, ours) = pairs.fed(&bytes);
        let (results, received) = channel();
        let ((), largest) = largest_allocation(|| read_results(ours, &results));
        let last = received.try_iter().last();
        // The last word is an error: the aggregator's own (an error frame's text) or one
        // naming it.
        prop_assert!(
            matches!(last, Some(Err(_))),
            "the reader did not report its end"
        );
        let limit = 2 * bytes.len() + 8 * CHUNK + (64 << 10);
        prop_assert!(
            largest <= limit,
            "allocated {largest} bytes for {}",
            bytes.len()
        );
        Ok(())
    });
}

/// Regression (fuzz_backup_gradient_frames and fuzz_backup_result_frames, shrunk to a frame
/// announcing 2^32 floats followed by 8 bytes): the readers allocated the announced 16 GiB
/// before reading (a failed allocation aborts the executor; where the system hands memory
/// out lazily, it still counts against every limit); they now grow with what arrives.
#[test]
fn a_frame_announcing_more_than_it_sends_costs_what_it_sent() {
    let pairs = Pairs::new();
    let mut gradient: Vec<u8> = bytemuck::cast_slice(&[0u64, 1 << 32]).to_vec();
    gradient.extend([0; 8]);
    let (_peer, ours) = pairs.fed(&gradient);
    let (inbox, received) = channel();
    let ((), largest) = largest_allocation(|| read_gradients(2, ours, &inbox));
    assert!(largest <= 4 * CHUNK, "allocated {largest} bytes");
    let Some(Inbound::Closed { why: Some(why), .. }) = received.try_iter().last() else {
        panic!("no end reported");
    };
    assert!(why.contains("rank 2 closed the ring connection"), "{why}");

    let mut result: Vec<u8> = bytemuck::cast_slice(&[0u64, 1, 1, 1 << 32]).to_vec();
    result.extend([0; 8]);
    let (_peer, ours) = pairs.fed(&result);
    let (results, received) = channel();
    let ((), largest) = largest_allocation(|| read_results(ours, &results));
    assert!(largest <= 4 * CHUNK, "allocated {largest} bytes");
    let Some(Err(e)) = received.try_iter().last() else {
        panic!("no end reported");
    };
    assert!(
        e.to_string().contains("gradient aggregator on rank 0"),
        "{e}"
    );
}

/// Regression (found while writing fuzz_backup_gradient_frames): a gradient for step 2^64 − 1
/// (the error frame's marker) reached the aggregator, whose next step then overflowed; the
/// reader refuses it, naming the rank.
#[test]
fn a_gradient_for_the_last_step_is_refused() {
    let pairs = Pairs::new();
    let mut frame: Vec<u8> = bytemuck::cast_slice(&[u64::MAX, 1]).to_vec();
    frame.extend([0; 4]);
    let (_peer, ours) = pairs.fed(&frame);
    let (inbox, received) = channel();
    read_gradients(2, ours, &inbox);
    let messages: Vec<Inbound> = received.try_iter().collect();
    assert_eq!(messages.len(), 1, "a gradient was delivered");
    let Inbound::Closed { why: Some(why), .. } = &messages[0] else {
        panic!("no refusal");
    };
    assert!(
        why.contains("rank 2 sent a gradient for step 18446744073709551615"),
        "{why}"
    );
}
