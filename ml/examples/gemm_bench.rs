//! GEMM throughput on the CPU for the products ringflow runs (MLP layers forward and backward,
//! im2col convolutions, LSTM gates, square products): GFLOP/s of the crate's `matmul_into` on
//! all threads of the pool and on the calling thread only, next to the `gemm` crate's on the
//! same shapes.
//!
//! ```text
//! cargo run --release -p ringflow-ml --example gemm_bench -- [--shapes FILE] [--seconds S] \
//!     [--precision f32|bf16] [--cold]
//! cargo run --release -p ringflow-ml --example gemm_bench -- --probe S
//! ```
//!
//! `--cold` flushes both operands and the destination out of every cache before each timed
//! product (outside the timing): the figure of a product whose data a busy host evicted.
//!
//! `--precision bf16` times the crate's products in bfloat16 with f32 sums (the job spec's
//! `train.matmul_precision = "bf16"`); the `gemm` crate's column stays f32.
//! `--shapes` names a file of `name m k n a_transposed b_transposed` lines (`#` starts a
//! comment; `benches/gemm_shapes.txt` is the default). Runs on all cores (set
//! `RAYON_NUM_THREADS` to use fewer). Each figure is the best of the timed repetitions within
//! `S` seconds (default 0.3) after a warm-up; a busy machine lowers them. Prints one line per
//! shape: `name m k n ta tb ours ours_serial gemm_crate` (GFLOP/s), the format
//! `benches/gemm_vs_numpy.sh` reads.
//!
//! A comment line first gives the machine's ceiling: the multiply-adds per second of a loop that
//! does nothing else (independent chains of AVX-512 or AVX2 FMAs held in registers: no memory,
//! no packing), on one thread and on every thread of the pool at once. A product's figure over
//! that ceiling is the share of the machine's peak it reaches.
//!
//! `--probe S` only runs that loop on every thread at once, in slices of a few milliseconds for
//! `S` seconds, and prints the median, least and most GFLOP/s of the slices
//! (`# fma probe: median M least L most H GFLOP/s`). On a host whose other tenants run on the
//! sibling hyperthreads of this machine's cores, the slices fall below the ceiling while those
//! tenants use the FMA units, though the scalar clock stays the same: `benches/mlp_vs_jax.sh`
//! probes before each run this way.

use std::time::{Duration, Instant};

use ringflow_ml::backend::cpu::gemm::{MatRef, matmul_into, matmul_into_serial};

/// Bytes each thread of the pool reads in [`memory_probe`]: far more than any L3 cache.
const PROBE_BYTES: usize = 64 << 20;

/// The median bandwidth (GB/s) of passes over [`PROBE_BYTES`] per thread, every thread of the
/// pool reading its own buffer at once (written first, with values other than zero: pages never
/// written would all map the kernel's one page of zeros, read from cache), for about `budget`:
/// what the host's other tenants leave of the memory bus (less while they stream memory too).
fn memory_probe(budget: Duration) -> f64 {
    let threads = rayon::current_num_threads();
    let buffers: Vec<Vec<f32>> = (0..threads)
        .map(|t| vec![1.0 + t as f32; PROBE_BYTES / 4])
        .collect();
    let start = Instant::now();
    let mut rates = Vec::new();
    while rates.len() < 3 || start.elapsed() < budget {
        let t = Instant::now();
        // One element of each cache line, into four sums so that no add waits on the last.
        let lines = |b: &[f32]| {
            let quads = b.chunks_exact(64).map(|q| [q[0], q[16], q[32], q[48]]);
            quads.fold([0.0f32; 4], |s, q| std::array::from_fn(|i| s[i] + q[i]))
        };
        let sum: f32 = rayon::broadcast(|c| lines(&buffers[c.index()]).iter().sum::<f32>())
            .into_iter()
            .sum();
        std::hint::black_box(sum);
        rates.push((threads * PROBE_BYTES) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// One product to time.
struct Shape {
    name: String,
    m: usize,
    k: usize,
    n: usize,
    a_t: bool,
    b_t: bool,
}

fn parse_shapes(text: &str) -> Result<Vec<Shape>, String> {
    let mut shapes = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = || {
            format!(
                "line {}: expected `name m k n a_t b_t`, got `{line}`",
                i + 1
            )
        };
        if f.len() != 6 {
            return Err(bad());
        }
        let num = |s: &str| s.parse::<usize>().map_err(|_| bad());
        shapes.push(Shape {
            name: f[0].to_string(),
            m: num(f[1])?,
            k: num(f[2])?,
            n: num(f[3])?,
            a_t: num(f[4])? != 0,
            b_t: num(f[5])? != 0,
        });
    }
    Ok(shapes)
}

/// The shortest of the timed repetitions of `f` within about `budget` (at least 3).
fn best_time(budget: Duration, mut f: impl FnMut()) -> f64 {
    best_time_on(budget, &mut [], |_| {}, |_| f())
}

/// [`best_time`] of `f` writing into `dst`, with `before` run ahead of every repetition,
/// outside the timing.
fn best_time_on(
    budget: Duration,
    dst: &mut [f32],
    mut before: impl FnMut(&mut [f32]),
    mut f: impl FnMut(&mut [f32]),
) -> f64 {
    f(dst);
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut runs = 0;
    while runs < 3 || start.elapsed() < budget {
        before(dst);
        let t = Instant::now();
        f(dst);
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    best
}

/// The `gemm` crate on the same operands (threaded on the pool when `threads` > 1).
fn gemm_crate(dst: &mut [f32], a: MatRef<'_>, b: MatRef<'_>) {
    let (m, k) = a.logical_dims();
    let n = b.logical_dims().1;
    let strides = |x: MatRef<'_>| {
        if x.transposed {
            (1, x.cols as isize)
        } else {
            (x.cols as isize, 1)
        }
    };
    let ((a_rs, a_cs), (b_rs, b_cs)) = (strides(a), strides(b));
    assert!(dst.len() == m * n && a.data.len() >= m * k && b.data.len() >= k * n);
    // SAFETY: the operands hold m×k and k×n elements with these strides (asserted above) and
    // `dst` is a unique borrow of m×n elements.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    if let Some(probe) = value("--probe") {
        let budget = Duration::from_secs_f64(probe.parse()?);
        let (median, least, most) =
            fma_peak::probe(budget).ok_or("this CPU has neither AVX-512 nor AVX2 with FMA")?;
        println!("# fma probe: median {median:.1} least {least:.1} most {most:.1} GFLOP/s");
        println!("# memory probe: median {:.1} GB/s", memory_probe(budget));
        return Ok(());
    }
    let seconds: f64 = value("--seconds").map_or(Ok(0.3), |s| s.parse())?;
    let path = value("--shapes").map_or("benches/gemm_shapes.txt", |s| s.as_str());
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
    let shapes = parse_shapes(&text).map_err(|e| format!("{path}: {e}"))?;
    let budget = Duration::from_secs_f64(seconds);
    let cold = args.iter().any(|a| a == "--cold");
    if cold {
        println!("# cold: operands and destination flushed from every cache before each product");
    }
    let precision: ringflow_ml::MatmulPrecision =
        value("--precision").map_or("f32", |s| s).parse()?;
    if precision == ringflow_ml::MatmulPrecision::Bf16 {
        let how = ringflow_ml::cpu_bf16_products();
        println!("# precision: bf16 products ({how:?})");
    }
    println!("# threads: {}", rayon::current_num_threads());
    if let Some((unit, one, all)) = fma_peak::measure(budget) {
        println!("# fma peak ({unit}): {one:.1} GFLOP/s on one thread, {all:.1} on all threads");
    }
    println!("# name m k n ta tb ours_gflops ours_serial_gflops gemm_crate_gflops");
    for s in shapes {
        let fill = |len: usize, seed: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7 + seed) % 13) as f32 / 13.0 - 0.5)
                .collect()
        };
        let (a_data, b_data) = (fill(s.m * s.k, 1), fill(s.k * s.n, 2));
        let a = if s.a_t {
            MatRef::new(&a_data, s.k, s.m).t()
        } else {
            MatRef::new(&a_data, s.m, s.k)
        };
        let b = if s.b_t {
            MatRef::new(&b_data, s.n, s.k).t()
        } else {
            MatRef::new(&b_data, s.k, s.n)
        };
        let mut dst = vec![0.0f32; s.m * s.n];
        let flops = 2.0 * (s.m * s.k * s.n) as f64;
        let flush = |out: &mut [f32]| {
            if cold {
                [a_data.as_slice(), &b_data, out]
                    .iter()
                    .for_each(|x| evict(x));
            }
        };
        let mut time =
            |f: &mut dyn FnMut(&mut [f32])| flops / best_time_on(budget, &mut dst, flush, f) / 1e9;
        let ours = time(&mut |d| matmul_into(d, (a, b), false, precision));
        let serial = time(&mut |d| matmul_into_serial(d, (a, b), false, precision));
        let reference = time(&mut |d| gemm_crate(d, a, b));
        println!(
            "{} {} {} {} {} {} {ours:.1} {serial:.1} {reference:.1}",
            s.name, s.m, s.k, s.n, s.a_t as u8, s.b_t as u8
        );
    }
    Ok(())
}

/// Flushes every cache line of `values` out of the whole cache hierarchy (x86-64), so the next
/// product reads them from memory, as a busy host's neighbour leaves them.
fn evict(values: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in values.chunks(16) {
        // SAFETY: SSE2 is part of x86-64; `line` is a valid reference, and a flush changes
        // no value.
        unsafe { std::arch::x86_64::_mm_clflush(line.as_ptr().cast::<u8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = values;
}

/// The FMA ceiling of this machine: a loop of register-held multiply-adds and nothing else.
mod fma_peak {
    use std::time::Duration;

    /// Loop iterations per timed repetition (each iteration is `CHAINS` FMAs).
    const ITERATIONS: u64 = 2_000_000;

    /// Independent accumulators: enough to cover the FMA latency on two FMA units.
    const CHAINS: usize = 12;

    /// A vector unit with FMA.
    #[derive(Clone, Copy)]
    enum Unit {
        Avx512,
        Avx2,
    }

    impl Unit {
        /// The widest this CPU has.
        fn widest() -> Option<Unit> {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    return Some(Unit::Avx512);
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    return Some(Unit::Avx2);
                }
            }
            None
        }

        fn name(self) -> &'static str {
            match self {
                Unit::Avx512 => "AVX-512",
                Unit::Avx2 => "AVX2",
            }
        }

        /// f32 lanes of one FMA.
        fn lanes(self) -> usize {
            match self {
                Unit::Avx512 => 16,
                Unit::Avx2 => 8,
            }
        }

        /// One timed repetition (`self` came from [`Unit::widest`]).
        fn run(self) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `widest` found this unit on this CPU.
            unsafe {
                match self {
                    Unit::Avx512 => x86::avx512(ITERATIONS),
                    Unit::Avx2 => x86::avx2(ITERATIONS),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = self;
        }
    }

    /// `(vector unit, GFLOP/s on one thread, GFLOP/s on every thread of the pool at once)`,
    /// each the best over about `budget`; `None` on a CPU without AVX2 and FMA.
    pub fn measure(budget: Duration) -> Option<(&'static str, f64, f64)> {
        let unit = Unit::widest()?;
        let flops = (2 * unit.lanes() * CHAINS) as f64 * ITERATIONS as f64;
        let one = flops / super::best_time(budget, || unit.run()) / 1e9;
        let threads = rayon::current_num_threads() as f64;
        let all = threads * flops
            / super::best_time(budget, || {
                rayon::broadcast(|_| unit.run());
            })
            / 1e9;
        Some((unit.name(), one, all))
    }

    /// The loop on every thread of the pool at once, repeated for `budget`: the median, least
    /// and most GFLOP/s of the repetitions (a few milliseconds each); `None` on a CPU without
    /// AVX2 and FMA.
    pub fn probe(budget: Duration) -> Option<(f64, f64, f64)> {
        let unit = Unit::widest()?;
        let flops = (2 * unit.lanes() * CHAINS) as f64 * ITERATIONS as f64;
        let threads = rayon::current_num_threads() as f64;
        let start = std::time::Instant::now();
        let mut rates = Vec::new();
        while rates.len() < 3 || start.elapsed() < budget {
            let t = std::time::Instant::now();
            rayon::broadcast(|_| unit.run());
            rates.push(threads * flops / t.elapsed().as_secs_f64() / 1e9);
        }
        rates.sort_by(f64::total_cmp);
        Some((rates[rates.len() / 2], rates[0], rates[rates.len() - 1]))
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        use super::CHAINS;

        /// `iterations` rounds of `CHAINS` 16-lane FMAs, kept (`black_box`) so none is elided.
        #[target_feature(enable = "avx512f")]
        pub fn avx512(iterations: u64) {
            let (x, y) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            let mut acc = [_mm512_set1_ps(1.0); CHAINS];
            for _ in 0..iterations {
                for a in &mut acc {
                    *a = _mm512_fmadd_ps(*a, x, y);
                }
            }
            std::hint::black_box(acc);
        }

        /// `iterations` rounds of `CHAINS` 8-lane FMAs, kept (`black_box`) so none is elided.
        #[target_feature(enable = "avx2,fma")]
        pub fn avx2(iterations: u64) {
            let (x, y) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            let mut acc = [_mm256_set1_ps(1.0); CHAINS];
            for _ in 0..iterations {
                for a in &mut acc {
                    *a = _mm256_fmadd_ps(*a, x, y);
                }
            }
            std::hint::black_box(acc);
        }
    }
}
