//! The ring collectives over real TCP sockets on loopback, one thread per rank.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ringflow_executor::collective::{
    Collective, Compression, JobSecret, ReduceOp, RingCollective, RingConfig, RingListener,
    StepResult,
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
        compression: Compression::None,
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
    with_configured_ring(n, timeout, move |cfg| cfg.backup_workers = backups, f)
}

/// [`with_ring`] where `configure` adjusts each rank's configuration first.
fn with_configured_ring<T: Send + 'static>(
    n: usize,
    timeout: Duration,
    configure: impl Fn(&mut RingConfig),
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
            configure(&mut cfg);
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
    use ringflow_core::listener::{ListenerLimits, RefusalReason};
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

/// Gradient-like values with fractions that 16-bit floats cannot hold, of both signs.
fn fractions(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((rank * 7919 + i * 31) % 1001) as f32 - 500.0) / 77.7)
        .collect()
}

/// Whether `v` is a value of `codec`'s 16-bit format (decoding its encoding gives it back).
fn representable(codec: Compression, v: f32) -> bool {
    match codec {
        Compression::Fp16 => half::f16::from_f32(v).to_f32() == v,
        Compression::Bf16 => half::bf16::from_f32(v).to_f32() == v,
        Compression::None => true,
    }
}

/// With fp16 or bf16, gradients come back within the codec's rounding of the f32 sum, as the
/// codec's values, bit-identical on every rank (the owner of each segment included), for odd
/// lengths and segments of several chunks; other all-reduces on the same ring stay exact f32.
#[test]
fn compressed_gradients_are_rounded_sums_identical_on_every_rank() {
    for (codec, eps) in [
        (Compression::Fp16, 2f32.powi(-11)),
        (Compression::Bf16, 2f32.powi(-8)),
    ] {
        for n in [2usize, 3, 4] {
            let lengths = [1, n + 1, 997, 200_003];
            let results = with_configured_ring(
                n,
                Duration::from_secs(20),
                move |cfg| cfg.compression = codec,
                move |rank, mut ring| {
                    let mut out = Vec::new();
                    for len in lengths {
                        for op in [ReduceOp::Sum, ReduceOp::Average] {
                            let sent = ring.start_gradient_reduce(fractions(rank, len), op);
                            out.push(sent.unwrap().wait().unwrap());
                        }
                    }
                    // Not a 16-bit value, and its sums over up to 4 ranks are exact in f32.
                    let mut exact = vec![1.0 + 2f32.powi(-20); 5];
                    ring.all_reduce(&mut exact, ReduceOp::Sum).unwrap();
                    (out, exact)
                },
            );
            for (li, &len) in lengths.iter().enumerate() {
                for (oi, scale) in [1.0, 1.0 / n as f32].into_iter().enumerate() {
                    let first = &results[0].0[2 * li + oi];
                    assert_eq!(first.len(), len);
                    for (rank, r) in results.iter().enumerate() {
                        let got = &r.0[2 * li + oi];
                        let same = got
                            .iter()
                            .zip(first)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{codec} N={n} len={len} rank {rank} differs from rank 0"
                        );
                    }
                    let inputs: Vec<Vec<f32>> = (0..n).map(|k| fractions(k, len)).collect();
                    for (i, &g) in first.iter().enumerate() {
                        let parts: Vec<f32> = inputs.iter().map(|v| v[i]).collect();
                        let want = parts.iter().sum::<f32>() * scale;
                        let bound = parts.iter().map(|p| p.abs()).sum::<f32>() * scale;
                        let at = format!("{codec} N={n} len={len} op {oi} i={i}: {g} vs {want}");
                        assert!((g - want).abs() <= n as f32 * eps * bound + 1e-6, "{at}");
                        assert!(representable(codec, g), "{at} is not a {codec} value");
                    }
                }
            }
            for (_, exact) in &results {
                assert_eq!(exact, &vec![(1.0 + 2f32.powi(-20)) * n as f32; 5]);
            }
        }
    }
}

/// An average of gradients each within fp16's range stays finite (values are scaled before
/// they travel); one beyond it fails the step on every rank with a typed error, and the ring
/// goes on; bf16 has f32's range.
#[test]
fn gradients_beyond_fp16s_range_fail_the_step_on_every_rank() {
    for codec in [Compression::Fp16, Compression::Bf16] {
        let results = with_configured_ring(
            4,
            Duration::from_secs(10),
            move |cfg| cfg.compression = codec,
            |_, mut ring| {
                let mut reduce = |v: f32| {
                    let sent = ring.start_gradient_reduce(vec![v; 9], ReduceOp::Average);
                    sent.unwrap().wait()
                };
                let near_max = reduce(60_000.0).map(|r| r[0]);
                let over = reduce(80_000.0).map(|r| r[0]);
                let after = reduce(3.0).map(|r| r[0]);
                (near_max, over, after)
            },
        );
        let near = |got: f32, want: f32| (got - want).abs() <= 4.0 * 2f32.powi(-8) * want;
        for (near_max, over, after) in results {
            let near_max = near_max.unwrap();
            assert!(near(near_max, 60_000.0), "{codec}: {near_max}");
            match (codec, over) {
                (Compression::Fp16, Err(ExecutorError::CompressedGradient { codec: c, value })) => {
                    assert_eq!((c, value), (Compression::Fp16, f32::INFINITY));
                }
                (Compression::Bf16, Ok(r)) => assert!(near(r, 80_000.0), "bf16: {r}"),
                (_, other) => panic!("{codec}: {other:?}"),
            }
            assert_eq!(after.unwrap(), 3.0, "{codec}: the ring goes on");
        }
    }
}

#[test]
fn ranks_that_disagree_on_compression_fail_with_a_sentence() {
    let results = with_configured_ring(
        2,
        Duration::from_secs(5),
        |cfg| {
            if cfg.rank == 1 {
                cfg.compression = Compression::Fp16;
            }
        },
        |_, mut ring| {
            let sent = ring.start_gradient_reduce(vec![1.0; 10], ReduceOp::Average);
            sent.unwrap().wait().unwrap_err().to_string()
        },
    );
    assert!(
        results
            .iter()
            .any(|m| m.contains("sends gradients as fp16, rank 0 as f32")
                && m.contains("cluster.compression")),
        "{results:?}"
    );
}
