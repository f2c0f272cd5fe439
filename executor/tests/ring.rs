//! The ring collectives over real TCP sockets on loopback, one thread per rank.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ringflow_executor::collective::{
    Collective, JobSecret, ReduceOp, RingCollective, RingConfig, RingListener, StepResult,
};
use ringflow_executor::error::{CommOp, ExecutorError, Peer};

fn listeners(n: usize) -> Vec<RingListener> {
    (0..n)
        .map(|_| RingListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap())
        .collect()
}

fn config(
    job: &str,
    rank: usize,
    peers: &[String],
    secret: &JobSecret,
    timeout: Duration,
) -> RingConfig {
    RingConfig {
        job_id: job.into(),
        rank,
        peers: peers.to_vec(),
        secret: secret.clone(),
        timeout,
        backup_workers: 0,
    }
}

/// Forms a ring of `n` and runs `f(rank, collective)` on one thread per rank.
fn with_ring<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    f: impl Fn(usize, RingCollective) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    with_backup_ring(n, 0, timeout, f)
}

/// [`with_ring`] with `backups` backup workers.
fn with_backup_ring<T: Send + 'static>(
    n: usize,
    backups: usize,
    timeout: Duration,
    f: impl Fn(usize, RingCollective) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let ls = listeners(n);
    let peers: Vec<String> = ls.iter().map(|l| l.local_addr().to_string()).collect();
    let secret = JobSecret::random();
    let handles: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(rank, l)| {
            let mut cfg = config("job-1", rank, &peers, &secret, timeout);
            cfg.backup_workers = backups;
            let f = f.clone();
            std::thread::spawn(move || {
                let ring = RingCollective::connect(&l, cfg).expect("the ring forms");
                f(rank, ring)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

/// Small integers: sums are exact in any order, so results compare bit for bit.
fn data(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((rank * 7919 + i * 31) % 1001) as f32 - 500.0)
        .collect()
}

#[test]
fn all_reduce_equals_the_serial_sum_for_every_size_and_awkward_lengths() {
    for n in 1..=5usize {
        let lengths = [
            0,
            1,
            2,
            n.saturating_sub(1),
            n,
            n + 1,
            997,
            3 * 32 * 1024 + 7,
            200_003,
        ];
        let results = with_ring(n, Duration::from_secs(20), move |rank, mut ring| {
            let mut out = Vec::new();
            for len in lengths {
                let mut sum = data(rank, len);
                ring.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
                let mut avg = data(rank, len);
                ring.all_reduce(&mut avg, ReduceOp::Average).unwrap();
                out.push((sum, avg));
            }
            out
        });
        for (li, &len) in lengths.iter().enumerate() {
            let mut want = vec![0.0f32; len];
            for k in 0..n {
                for (w, v) in want.iter_mut().zip(data(k, len)) {
                    *w += v;
                }
            }
            for (rank, r) in results.iter().enumerate() {
                let (sum, avg) = &r[li];
                assert_eq!(sum.len(), len);
                for i in 0..len {
                    assert_eq!(
                        sum[i].to_bits(),
                        want[i].to_bits(),
                        "N={n} len={len} rank={rank} i={i}"
                    );
                    let a = want[i] / n as f32;
                    assert!(
                        (avg[i] - a).abs() <= 1e-4 * a.abs().max(1.0),
                        "avg N={n} len={len} i={i}"
                    );
                }
            }
        }
    }
}

#[test]
fn broadcast_all_gather_barrier_and_overlapping_reductions() {
    for n in [1usize, 2, 3, 4] {
        let results = with_ring(n, Duration::from_secs(20), move |rank, mut ring| {
            let root = n - 1;
            let mut b = if rank == root {
                data(9, 70_001)
            } else {
                vec![0.0; 70_001]
            };
            ring.broadcast(&mut b, root).unwrap();
            let g = ring.all_gather(&data(rank, 5)).unwrap();
            ring.barrier().unwrap();
            // Several reductions in flight at once complete in order, each correct.
            let pending: Vec<_> = (0..4)
                .map(|j| {
                    ring.start_all_reduce(data(rank + j, 40_000 + j), ReduceOp::Sum)
                        .unwrap()
                })
                .collect();
            let reduced: Vec<Vec<f32>> = pending.into_iter().map(|p| p.wait().unwrap()).collect();
            (b, g, reduced)
        });
        for (b, g, reduced) in &results {
            assert_eq!(b, &data(9, 70_001));
            let want: Vec<f32> = (0..n).flat_map(|k| data(k, 5)).collect();
            assert_eq!(g, &want);
            for (j, r) in reduced.iter().enumerate() {
                let mut w = vec![0.0f32; 40_000 + j];
                for k in 0..n {
                    for (x, v) in w.iter_mut().zip(data(k + j, 40_000 + j)) {
                        *x += v;
                    }
                }
                assert_eq!(r, &w);
            }
        }
    }
}

#[test]
fn connections_without_the_job_secret_are_dropped() {
    let ls = listeners(2);
    let peers: Vec<String> = ls.iter().map(|l| l.local_addr().to_string()).collect();
    let secret = JobSecret::random();
    let mut ls = ls.into_iter();
    let (l0, l1) = (ls.next().unwrap(), ls.next().unwrap());
    // Rank 1 starts waiting for its left neighbour.
    let cfg1 = config("job-1", 1, &peers, &secret, Duration::from_secs(15));
    let rank1 = std::thread::spawn(move || RingCollective::connect(&l1, cfg1).map(|_| ()));
    // Garbage, then a connection with the wrong secret, then one for another job: all refused.
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(&peers[1]).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    }
    let rogue_listener = RingListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
    for (job, s) in [("job-1", JobSecret::random()), ("job-2", secret.clone())] {
        let cfg = config(job, 0, &peers, &s, Duration::from_secs(2));
        let err = RingCollective::connect(&rogue_listener, cfg)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("rank 0"), "{err}");
    }
    // The real rank 0 still gets in.
    let cfg0 = config("job-1", 0, &peers, &secret, Duration::from_secs(15));
    let rank0 = std::thread::spawn(move || RingCollective::connect(&l0, cfg0).map(|_| ()));
    rank0.join().unwrap().expect("rank 0 joins");
    rank1.join().unwrap().expect("rank 1 joins");
}

#[test]
fn a_silent_or_departed_peer_is_an_error_within_the_deadline() {
    let results = with_ring(2, Duration::from_secs(1), |rank, mut ring| {
        if rank == 1 {
            // Stays in the ring but never takes part: rank 0 must give up, not hang.
            std::thread::sleep(Duration::from_millis(2500));
            drop(ring);
            return None;
        }
        let start = Instant::now();
        let mut buf = vec![1.0f32; 1000];
        let err = ring
            .all_reduce(&mut buf, ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        Some((err, start.elapsed()))
    });
    let (err, took) = results[0].clone().unwrap();
    assert!(err.contains("rank 1"), "names the peer: {err}");
    assert!(took < Duration::from_secs(5), "gave up after {took:?}");

    let results = with_ring(3, Duration::from_secs(10), |rank, mut ring| {
        if rank == 2 {
            drop(ring);
            return None;
        }
        let mut buf = vec![1.0f32; 100_000];
        Some(
            ring.all_reduce(&mut buf, ReduceOp::Sum)
                .unwrap_err()
                .to_string(),
        )
    });
    let err = results[0].clone().unwrap();
    assert!(err.contains("rank 2") || err.contains("rank 1"), "{err}");
}

/// A failure says whom it concerns and what was being done; after it the ring is broken, and
/// every later operation fails with the same failure.
#[test]
fn a_failure_names_the_peer_and_the_operation_and_breaks_the_ring() {
    let results = with_ring(2, Duration::from_secs(5), |rank, mut ring| {
        if rank == 1 {
            drop(ring);
            return None;
        }
        let first = ring.broadcast(&mut [0.0; 1000], 1).unwrap_err();
        let later = ring.all_gather(&[1.0]).unwrap_err();
        Some((first, later))
    });
    let Some((ExecutorError::Comm(first), ExecutorError::Comm(later))) =
        results.into_iter().next().flatten()
    else {
        panic!("rank 0's failures are not communication failures");
    };
    let rank1 = matches!(
        first.peer(),
        Peer::Rank {
            rank: 1,
            address: Some(_)
        }
    );
    assert!(rank1, "{first:?}");
    assert_eq!(first.op(), CommOp::Broadcast, "{first:?}");
    assert_eq!(later.to_string(), format!("the ring is broken: {first}"));
    assert_eq!((later.peer(), later.op()), (first.peer(), first.op()));
}

#[test]
fn ranks_that_disagree_on_the_operation_fail_loudly() {
    let results = with_ring(2, Duration::from_secs(5), |rank, mut ring| {
        let mut buf = vec![1.0f32; if rank == 0 { 10 } else { 20 }];
        ring.all_reduce(&mut buf, ReduceOp::Sum)
            .err()
            .map(|e| e.to_string())
    });
    let msgs: Vec<String> = results.into_iter().flatten().collect();
    assert!(
        msgs.iter().any(|m| m.contains("collective mismatch")),
        "{msgs:?}"
    );
}

/// Waits (up to 10 s) until the common gradient of `step` is already there.
fn poll_result(ring: &mut RingCollective, step: u64) -> StepResult {
    let start = Instant::now();
    loop {
        if let Some(r) = ring.backup().unwrap().try_result(step).unwrap() {
            return r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "step {step} never came"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn backup_workers_average_the_first_ranks_and_drop_late_ones() {
    let len = 70_001;
    let results = with_backup_ring(3, 1, Duration::from_secs(10), move |rank, mut ring| {
        let mut seen: Vec<StepResult> = Vec::new();
        let backup = ring.backup().expect("backup connections");
        assert_eq!(backup.quorum(), 2);
        if rank == 2 {
            // Late for step 0; steps 1 finishes without it, so it catches up.
            std::thread::sleep(Duration::from_millis(300));
            backup.contribute(0, &data(rank, len));
            seen.push(backup.result(0).unwrap());
            seen.push(poll_result(&mut ring, 1));
            // First at step 2.
            let backup = ring.backup().unwrap();
            backup.contribute(2, &data(rank, len));
            seen.push(backup.result(2).unwrap());
            backup.finish();
        } else {
            for step in 0..2 {
                backup.contribute(step, &data(rank + step as usize, len));
                seen.push(backup.result(step).unwrap());
            }
            std::thread::sleep(Duration::from_millis(1500));
            let backup = ring.backup().unwrap();
            backup.contribute(2, &data(rank, len));
            seen.push(backup.result(2).unwrap());
            backup.finish();
        }
        seen
    });
    let expected0: Vec<f32> = data(0, len)
        .iter()
        .zip(data(1, len))
        .map(|(a, b)| (a + b) * 0.5)
        .collect();
    for (rank, seen) in results.iter().enumerate() {
        assert_eq!(seen.iter().map(|r| r.step).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(seen.iter().all(|r| r.contributors == 2));
        assert_eq!(&*seen[0].gradient, expected0.as_slice(), "rank {rank}");
        assert_eq!(seen[0].included, rank != 2, "rank {rank} at step 0");
        for step in 1..3 {
            assert_eq!(
                seen[step].gradient, results[0][step].gradient,
                "every rank applies the same gradient at step {step}"
            );
        }
    }
    assert!(results[2][2].included, "the early rank is in step 2");
    let in_step2 = results.iter().filter(|s| s[2].included).count();
    assert_eq!(in_step2, 2, "exactly the quorum is in step 2");
}

#[test]
fn a_rank_that_leaves_fails_the_step_on_every_rank() {
    let results = with_backup_ring(3, 1, Duration::from_secs(10), |rank, mut ring| {
        if rank != 0 {
            drop(ring);
            return None;
        }
        let start = Instant::now();
        let backup = ring.backup().unwrap();
        backup.contribute(0, &[1.0; 10]);
        let err = backup.result(0).unwrap_err().to_string();
        Some((err, start.elapsed()))
    });
    let (err, took) = results[0].clone().unwrap();
    assert!(
        err.contains("closed its gradient connection before the end of training")
            && (err.contains("rank 1") || err.contains("rank 2")),
        "{err}"
    );
    assert!(took < Duration::from_secs(5), "gave up after {took:?}");
}

#[test]
fn a_ring_forms_while_its_ports_are_flooded_with_silent_connections() {
    use ringflow_proto::listener::{ListenerLimits, RefusalReason};
    // Silent connections would hold every place for longer than the ring may take to form.
    let limits = ListenerLimits {
        max_connections: 4,
        first_request: Duration::from_secs(20),
        idle: Duration::MAX,
    };
    let ls: Vec<RingListener> = (0..2)
        .map(|_| {
            RingListener::bind_with(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), limits).unwrap()
        })
        .collect();
    let peers: Vec<String> = ls.iter().map(|l| l.local_addr().to_string()).collect();
    // Many more silent connections than the bound, held open while the ring forms (before,
    // the listener took them one at a time, each for its full handshake deadline).
    let flood: Vec<std::net::TcpStream> = peers
        .iter()
        .flat_map(|p| (0..50).map(move |_| std::net::TcpStream::connect(p).unwrap()))
        .collect();
    let secret = JobSecret::random();
    let gates: Vec<_> = ls.iter().map(|l| l.gate().clone()).collect();
    let handles: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(rank, l)| {
            let cfg = config("job-1", rank, &peers, &secret, Duration::from_secs(8));
            std::thread::spawn(move || {
                let mut ring = RingCollective::connect(&l, cfg)?;
                let mut buf = vec![rank as f32 + 1.0; 4];
                ring.all_reduce(&mut buf, ReduceOp::Sum)?;
                Ok::<_, ringflow_executor::ExecutorError>(buf)
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap().expect("the ring forms"), vec![3.0; 4]);
    }
    for gate in gates {
        let stats = gate.stats();
        let evicted = stats
            .refused
            .iter()
            .find(|(r, _)| *r == RefusalReason::Evicted)
            .unwrap()
            .1;
        assert!(evicted >= 46, "{stats:?}");
    }
    drop(flood);
}
