use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::collective::ReduceOp;
use crate::error::CommError;

const LONG: Duration = Duration::from_secs(60);

/// The segment spec of local index `me` of `ranks`, for a job named by `tag`.
fn spec(secret: &JobSecret, tag: &str, ranks: usize, me: usize) -> SegmentSpec {
    segment_spec(secret, tag, 0, "host-a", ranks, me, Peer::rank_at(0, "h:1"))
}

fn peers(n: usize) -> Vec<Peer> {
    (0..n).map(|r| Peer::rank_at(r, format!("h:{r}"))).collect()
}

/// `n` ranks of one host, each with its segment (rank 0 created it and waited for the rest).
fn host(tag: &str, n: usize, timeout: Duration) -> Vec<ShmGroup> {
    let secret = JobSecret::random();
    let deadline = Instant::now() + LONG;
    let s0 = spec(&secret, tag, n, 0);
    let attachers: Vec<_> = (1..n)
        .map(|me| {
            let s = spec(&secret, tag, n, me);
            std::thread::spawn(move || Segment::attach(&s, deadline).map(Arc::new))
        })
        .collect();
    let mut first = Segment::create(&s0).expect("created");
    first
        .unlink_when_attached(deadline, |j| peers(n)[j].clone())
        .expect("all attached");
    let mut segs = vec![Arc::new(first)];
    segs.extend(
        attachers
            .into_iter()
            .map(|h| h.join().unwrap().expect("attached")),
    );
    let path = format!("/dev/shm{}", s0.name);
    assert!(!std::path::Path::new(&path).exists(), "{path} is unlinked");
    segs.into_iter()
        .enumerate()
        .map(|(me, seg)| ShmGroup::new(seg, me, peers(n), timeout))
        .collect()
}

/// Runs `f` on every rank's group in a thread of its own; returns their results in rank order.
fn on_each<T: Send + 'static>(
    groups: Vec<ShmGroup>,
    f: impl Fn(usize, &mut ShmGroup) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let handles: Vec<_> = groups
        .into_iter()
        .enumerate()
        .map(|(r, mut g)| {
            let f = f.clone();
            std::thread::spawn(move || f(r, &mut g))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn data(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((rank * 7919 + i * 31) % 1001) as f32 - 500.0)
        .collect()
}

#[test]
fn all_reduce_sums_exactly_for_odd_lengths_and_many_pieces() {
    for n in [2, 3, 4] {
        let lens = [0, 1, 5, SLOT_FLOATS - 1, 5 * SLOT_FLOATS + 13];
        let out = on_each(host(&format!("sum{n}"), n, LONG), move |r, g| {
            let mut results = Vec::new();
            for len in lens {
                let mut buf = data(r, len);
                g.all_reduce(&mut buf, ReduceOp::Sum, n)?;
                results.push(buf);
                let mut avg = data(r, len);
                g.all_reduce(&mut avg, ReduceOp::Average, n)?;
                results.push(avg);
            }
            Ok::<_, CommError>(results)
        });
        for (r, got) in out.into_iter().enumerate() {
            let got = got.expect("all-reduce succeeds");
            for (k, len) in lens.iter().enumerate() {
                let mut want = vec![0.0f32; *len];
                for q in 0..n {
                    want.iter_mut()
                        .zip(data(q, *len))
                        .for_each(|(w, v)| *w += v);
                }
                assert_eq!(got[2 * k], want, "sum of {len} on rank {r} of {n}");
                for (a, w) in got[2 * k + 1].iter().zip(&want) {
                    assert!(
                        (a - w / n as f32).abs() <= 1e-4,
                        "average of {len}: {a} vs {w}"
                    );
                }
            }
        }
    }
}

/// Broadcasts of several slot sets' worth, between reductions to the first rank, as the
/// hierarchical all-reduce runs them: every piece goes through another set than the one before.
#[test]
fn broadcast_and_reduce_to_first_interleave_across_slot_sets() {
    let n = 3;
    let lens = [7 * SLOT_FLOATS + 3, 1, SLOT_FLOATS + 1, 0, 2 * SLOT_FLOATS];
    let out = on_each(host("bcast", n, LONG), move |r, g| {
        let mut results = Vec::new();
        for len in lens {
            let mut buf = data(r, len);
            g.reduce_to_first(&mut buf)?;
            results.push(buf);
            let mut buf = if r == 0 { data(9, len) } else { vec![0.0; len] };
            g.broadcast_from_first(&mut buf, LONG)?;
            results.push(buf);
        }
        Ok::<_, CommError>(results)
    });
    for (r, got) in out.into_iter().enumerate() {
        let got = got.expect("reductions and broadcasts succeed");
        for (k, len) in lens.iter().enumerate() {
            let mut sum = vec![0.0f32; *len];
            for q in 0..n {
                sum.iter_mut().zip(data(q, *len)).for_each(|(w, v)| *w += v);
            }
            let reduced = if r == 0 { sum } else { data(r, *len) };
            assert_eq!(got[2 * k], reduced, "reduction of {len} on rank {r}");
            assert_eq!(
                got[2 * k + 1],
                data(9, *len),
                "broadcast of {len} on rank {r}"
            );
        }
    }
}

/// What each of four ranks on two simulated hosts ("a", "b", "a", "b"), joined as
/// `host::connect` joins them, gets from a sum and an average of `values(rank, len)` for each
/// of `lens`: as gradients (`start_gradient_reduce`) under `compression`.
fn hierarchical(
    compression: crate::collective::Compression,
    lens: &[usize],
    values: fn(usize, usize) -> Vec<f32>,
) -> Vec<Vec<Vec<f32>>> {
    use crate::collective::host::{HostConfig, connect};
    use crate::collective::{RingConfig, RingListener};
    let (n, secret) = (4, JobSecret::random());
    let hosts: Vec<String> = ["a", "b", "a", "b"].iter().map(|h| h.to_string()).collect();
    let listeners: Vec<RingListener> = (0..n)
        .map(|_| RingListener::bind(([127, 0, 0, 1], 0).into()).expect("bound"))
        .collect();
    let addrs: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().to_string())
        .collect();
    let ranks: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let cfg = RingConfig {
                job_id: format!("hier-{}-{compression:?}", std::process::id()),
                rank,
                peers: addrs.clone(),
                secret: secret.clone(),
                timeout: LONG,
                backup_workers: 0,
                compression,
            };
            let host = HostConfig {
                hosts: hosts.clone(),
                generation: 0,
                shared_memory: true,
            };
            let lens = lens.to_vec();
            std::thread::spawn(move || {
                let mut comm = connect(&listener, cfg, host).expect("joined");
                let mut out = Vec::new();
                for len in lens {
                    for op in [ReduceOp::Sum, ReduceOp::Average] {
                        let buf = comm.start_gradient_reduce(values(rank, len), op).unwrap();
                        out.push(buf.wait().expect("all-reduce succeeds"));
                    }
                }
                out
            })
        })
        .collect();
    ranks.into_iter().map(|h| h.join().unwrap()).collect()
}

/// The sum over the four ranks of `values(rank, len)`.
fn sum_of(values: fn(usize, usize) -> Vec<f32>, len: usize) -> Vec<f32> {
    let mut sum = vec![0.0f32; len];
    for q in 0..4 {
        sum.iter_mut()
            .zip(values(q, len))
            .for_each(|(w, v)| *w += v);
    }
    sum
}

/// A hierarchical all-reduce sums every rank's values on every rank (neither the leaders'
/// ring nor the broadcast within a host may be skipped), for buffers of one chunk and of
/// several, pipelined ones.
#[test]
fn a_hierarchical_all_reduce_sums_every_host_on_every_rank() {
    let lens = [5, 2 * (2 << 20) + 3];
    let got = hierarchical(crate::collective::Compression::None, &lens, data);
    for (r, got) in got.iter().enumerate() {
        for (k, &len) in lens.iter().enumerate() {
            let sum = sum_of(data, len);
            let bad = (0..len).find(|&i| got[2 * k][i] != sum[i]);
            assert_eq!(bad, None, "sum of {len} on rank {r}");
            let bad = (0..len).find(|&i| (got[2 * k + 1][i] - sum[i] / 4.0).abs() > 1e-4);
            assert_eq!(bad, None, "average of {len} on rank {r}");
        }
    }
}

/// With fp16 compression, gradients cross between hosts as 16-bit floats (the leaders'
/// ring): every rank gets the same values, within fp16's rounding of the exact sums, and not
/// the exact f32 sums (so the host sums really travelled compressed).
#[test]
fn compressed_gradients_cross_hosts_as_fp16_and_agree_on_every_rank() {
    fn thirds(rank: usize, len: usize) -> Vec<f32> {
        data(rank, len).iter().map(|v| v / 3.0).collect()
    }
    let lens = [5, 2 * (2 << 20) + 3];
    let got = hierarchical(crate::collective::Compression::Fp16, &lens, thirds);
    fn magnitudes(rank: usize, len: usize) -> Vec<f32> {
        thirds(rank, len).iter().map(|v| v.abs()).collect()
    }
    for (k, &len) in lens.iter().enumerate() {
        let (sum, size) = (sum_of(thirds, len), sum_of(magnitudes, len));
        for op in 0..2 {
            let scale = if op == 0 { 1.0 } else { 0.25 };
            let want = |i: usize| sum[i] * scale;
            let first = &got[0][2 * k + op];
            // fp16 keeps 11 significant bits: each host sum and each partial sum of the ring
            // is rounded to within 2⁻¹¹ of its size, which the sum of magnitudes bounds.
            let far = (0..len)
                .find(|&i| (first[i] - want(i)).abs() > 2.0 * 2f32.powi(-11) * size[i] * scale);
            assert_eq!(far, None, "op {op} of {len}: beyond fp16's rounding");
            // f32 sums in another order differ by about 2⁻²³ of the size, fp16's by 2⁻¹².
            let rounded =
                (0..len).any(|i| (first[i] - want(i)).abs() > 2f32.powi(-16) * size[i] * scale);
            assert!(rounded, "op {op} of {len}: f32 sums, not fp16's");
            for (r, other) in got.iter().enumerate().skip(1) {
                assert!(other[2 * k + op] == *first, "rank {r} differs from rank 0");
            }
        }
    }
}

#[test]
fn a_segment_without_the_job_key_is_refused() {
    let (ours, theirs) = (JobSecret::random(), JobSecret::random());
    let mut foreign = spec(&theirs, "job", 2, 0);
    // The same name, another key: a foreign creator that guessed or took the name.
    foreign.name = spec(&ours, "job", 2, 0).name;
    let _seg = Segment::create(&foreign).expect("created");
    let err = Segment::attach(&spec(&ours, "job", 2, 1), Instant::now() + LONG)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("does not carry this job's key"), "{err}");
}

/// The creator makes the object before it sizes it: a rank that opens it in between waits
/// for the sized, ready segment instead of refusing an empty one.
#[test]
fn a_rank_that_opens_the_segment_before_it_is_sized_waits_for_it() {
    let secret = JobSecret::random();
    let (creator, joiner) = (spec(&secret, "early", 2, 0), spec(&secret, "early", 2, 1));
    let name = std::ffi::CString::new(creator.name.clone()).unwrap();
    // SAFETY: a valid C string; the empty object stands for one its creator has not sized yet.
    let fd = unsafe {
        libc::shm_open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )
    };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    let attaching = std::thread::spawn(move || Segment::attach(&joiner, Instant::now() + LONG));
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: `fd` is ours; `create` replaces the empty object it finds.
    unsafe { libc::close(fd) };
    let _seg = Segment::create(&creator).expect("created");
    let attached = attaching.join().unwrap();
    assert!(attached.is_ok(), "{}", attached.err().unwrap());
}

#[test]
fn segments_of_other_jobs_and_generations_have_other_names_and_keys() {
    let secret = JobSecret::random();
    let a = spec(&secret, "job-a", 2, 0);
    let b = spec(&secret, "job-b", 2, 0);
    let c = segment_spec(&secret, "job-a", 1, "host-a", 2, 0, Peer::rank(0));
    let d = spec(&JobSecret::random(), "job-a", 2, 0);
    for other in [&b, &c, &d] {
        assert_ne!(a.name, other.name);
        assert_ne!(a.key, other.key);
    }
}

#[test]
fn a_rank_that_never_arrives_fails_the_wait_at_the_deadline_naming_it() {
    let mut groups = host("late", 2, Duration::from_millis(300));
    let _silent = groups.pop();
    let mut g = groups.pop().unwrap();
    let err = g
        .all_reduce(&mut [1.0; 10], ReduceOp::Sum, 2)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rank 1 (h:1)") && err.contains("did nothing for"),
        "{err}"
    );
}

#[test]
fn a_dead_rank_is_detected_and_named_before_the_deadline() {
    for reap in [true, false] {
        let mut groups = host(&format!("dead{reap}"), 3, LONG);
        let silent = groups.pop().unwrap();
        // Rank 2's process: a child that dies (reaped or left a zombie) while the others wait.
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let h = silent.segment().header();
        h.pids[2].store(child.id(), std::sync::atomic::Ordering::SeqCst);
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            child.kill().unwrap();
            if reap {
                child.wait().unwrap();
            }
            child
        });
        let out = on_each(groups, |_, g| {
            g.all_reduce(&mut [1.0; 10], ReduceOp::Sum, 3)
                .unwrap_err()
                .to_string()
        });
        let mut child = killer.join().unwrap();
        let _ = child.wait();
        for err in out {
            assert!(
                err.contains("rank 2 (h:2)") && err.contains("exited"),
                "{err}"
            );
        }
    }
}

#[test]
fn a_rank_that_gives_up_wakes_the_others_at_once_naming_it() {
    let mut groups = host("abort", 2, LONG);
    let quitter = groups.pop().unwrap();
    let mut g = groups.pop().unwrap();
    let seg = quitter.segment().clone();
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        ShmGroup::abort(&seg, 1);
    });
    let err = g
        .all_reduce(&mut [1.0; 10], ReduceOp::Sum, 2)
        .unwrap_err()
        .to_string();
    aborter.join().unwrap();
    assert!(err.contains("rank 1 (h:1) gave up"), "{err}");
}

#[test]
fn ranks_disagreeing_on_the_length_fail_loudly() {
    let out = on_each(host("mismatch", 2, LONG), |r, g| {
        g.all_reduce(&mut vec![1.0; 10 + r], ReduceOp::Sum, 2)
            .unwrap_err()
            .to_string()
    });
    for err in out {
        assert!(err.contains("collective mismatch"), "{err}");
    }
}

#[test]
fn hosts_are_grouped_by_identity_and_led_by_their_lowest_rank() {
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let l = HostLayout::of(&ids(&["a", "b", "a", "b"]), 2, 4);
    assert_eq!(l.local, vec![0, 2]);
    assert_eq!(l.leaders, vec![0, 1]);
    assert_eq!((l.most_local, l.local_index(2), l.is_flat()), (2, 1, false));
    let flat = HostLayout::of(&ids(&["a", "b", "c"]), 1, 3);
    assert!(flat.is_flat());
    // Unknown identities (an older driver, or one that could not be read) share nothing.
    assert!(HostLayout::of(&[], 0, 3).is_flat());
    assert!(HostLayout::of(&ids(&["", ""]), 0, 2).is_flat());
    let one = HostLayout::of(&ids(&["a", "a", "a"]), 0, 3);
    assert_eq!((one.local.len(), one.leaders.len()), (3, 1));
}

#[test]
fn this_host_has_an_identity() {
    let id = host_identity();
    assert!(id.contains("net:[") && id.contains("uid:"), "{id}");
    assert_eq!(id, host_identity(), "stable");
}
