//! Recurrent throughput: a bidirectional LSTM (and GRU) layer's forward + backward pass on a
//! sequence-tagging batch (batch 32, 30 steps, embedding 64, hidden 128: the BiLSTM tagger of
//! `benches/ner_vs_keras.sh`), with every sequence full and with lengths spread over 10..=30
//! as in a padded batch of sentences; the milliseconds of the best repetition and the real
//! tokens per second.
//!
//! ```text
//! cargo run --release -p ringflow-ml --example recurrent_bench [-- --seconds S] [--device D]
//! ```
//!
//! Runs on all cores of the machine (set `RAYON_NUM_THREADS` to use fewer). Each figure is the
//! best of several timed repetitions after a warm-up; a busy machine lowers them. `--device
//! cuda` (a build with `--features cuda`) times the same layers on a GPU, waiting for the device
//! at the end of every timed call.

use std::time::{Duration, Instant};

use ringflow_ml::nn::{BiGru, BiLstm, Gru, Lstm, ParamBuilder, ParamStore};
use ringflow_ml::{Device, GradStore, Tensor, rng};

const BATCH: usize = 32;
const STEPS: usize = 30;
const INPUTS: usize = 64;
const HIDDEN: usize = 128;

/// The shortest of the timed repetitions of `f` within about `budget` (at least 3), after one
/// warm-up call, in seconds.
fn best_time(
    budget: Duration,
    device: Device,
    mut f: impl FnMut() -> ringflow_ml::Result<()>,
) -> ringflow_ml::Result<f64> {
    let mut f = || f().and_then(|()| device.synchronize());
    f()?;
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut runs = 0;
    while runs < 3 || start.elapsed() < budget {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    Ok(best)
}

/// The two lengths settings: every sequence full, and lengths spread over 10..=30.
fn length_settings() -> [(&'static str, Vec<usize>); 2] {
    let spread = (0..BATCH).map(|i| 10 + (i * 13) % (STEPS - 9)).collect();
    [("full", vec![STEPS; BATCH]), ("10..=30", spread)]
}

/// Prints the forward and forward + backward times of `run` for both length settings.
fn report(
    name: &str,
    budget: Duration,
    device: Device,
    run: &dyn Fn(&Tensor, &[usize]) -> ringflow_ml::Result<Tensor>,
) -> ringflow_ml::Result<()> {
    let mut r = rng::seeded(2, 0);
    let x = Tensor::uniform(&[BATCH, STEPS, INPUTS], -1.0, 1.0, &mut r, device)?;
    let mut grads = GradStore::new();
    for (label, lengths) in length_settings() {
        let tokens: usize = lengths.iter().sum();
        let forward = best_time(budget, device, || {
            ringflow_ml::no_grad(|| run(&x, &lengths)).map(drop)
        })?;
        let both = best_time(budget, device, || {
            grads.zero();
            run(&x, &lengths)?.sum_all()?.backward_into(&mut grads)
        })?;
        println!(
            "{name:<6} {label:<8} forward {:>7.2} ms   forward+backward {:>7.2} ms   \
             {:>9.0} tokens/s",
            forward * 1e3,
            both * 1e3,
            tokens as f64 / both
        );
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let seconds = match args.iter().position(|a| a == "--seconds") {
        Some(i) => args
            .get(i + 1)
            .ok_or("--seconds needs a value")?
            .parse::<f64>()?,
        None => 2.0,
    };
    let device: Device = match args.iter().position(|a| a == "--device") {
        Some(i) => args.get(i + 1).ok_or("--device needs a value")?.parse()?,
        None => Device::Cpu,
    };
    device.check_available()?;
    let budget = Duration::from_secs_f64(seconds);
    println!(
        "device: {device}, threads: {}; batch {BATCH}, {STEPS} steps, in {INPUTS}, hidden {HIDDEN}",
        rayon::current_num_threads()
    );
    let mut store = ParamStore::new();
    let mut init = rng::seeded(7, rng::streams::INIT);
    let mut b = ParamBuilder::new(&mut store, &mut init, device);
    let lstm = BiLstm {
        forward: Lstm::new(&mut b.sub("lstm_fw"), INPUTS, HIDDEN)?,
        backward: Lstm::new(&mut b.sub("lstm_bw"), INPUTS, HIDDEN)?,
    };
    let gru = BiGru {
        forward: Gru::new(&mut b.sub("gru_fw"), INPUTS, HIDDEN)?,
        backward: Gru::new(&mut b.sub("gru_bw"), INPUTS, HIDDEN)?,
    };
    report("BiLSTM", budget, device, &|x, l| lstm.run(x, Some(l)))?;
    report("BiGRU", budget, device, &|x, l| gru.run(x, Some(l)))?;
    Ok(())
}
