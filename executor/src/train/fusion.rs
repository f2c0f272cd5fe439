//! Tensor fusion: gradients packed into buckets and all-reduced while backward still runs.
//!
//! Parameters are grouped, in the order their gradients become ready (the reverse of creation
//! order: the last layer's first), into a small first bucket (at most 1 MiB) and then buckets
//! of about `cluster.fusion` MiB (25 by default, PyTorch DDP's size; `"auto"` chooses it in the
//! first steps, [`crate::train::autotune`]). During the backward pass the autodiff hook
//! reports each finished parameter; when a bucket's last gradient arrives it is copied into the
//! bucket's buffer and handed to the communication thread, which reduces it while the training
//! thread continues backward. The loop waits only before the optimizer step, then copies the
//! averaged gradients back. Bucket buffers are allocated once and reused every step.
//!
//! On a GPU the buffers are page-locked ([`Device::pin_host`]), so a bucket's gradients are
//! downloaded by DMA in one batch of queued copies and one wait, and uploaded the same way: the
//! ring itself runs on the host, over TCP, exactly as for CPU training. The time spent in these
//! copies is kept ([`GradientBuckets::take_staging`]) for the executor's debug log.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ringflow_core::spec::BucketSizes;
use ringflow_ml::nn::ParamStore;
use ringflow_ml::{Device, GradStore, PinnedHost, Tensor, TensorKey};

use crate::collective::{Collective, PendingReduce, ReduceOp};
use crate::error::Result;

struct Bucket {
    params: Vec<Tensor>,
    numel: usize,
    waiting_for: usize,
    buffer: Option<Vec<f32>>,
    pending: Option<PendingReduce>,
    /// The page-locking of `buffer` (GPU training), and the address it locked.
    pinned: Option<(PinnedHost, usize)>,
}

impl Bucket {
    /// Page-locks the buffer for `device`'s copies; without it (a CPU, or locking refused) the
    /// copies are merely slower.
    fn pin(&mut self, device: Device) {
        let Some(buf) = self.buffer.as_mut() else {
            return;
        };
        match device.pin_host(buf) {
            Ok(Some(pin)) => self.pinned = Some((pin, buf.as_ptr() as usize)),
            Ok(None) => {}
            Err(e) => tracing::warn!("gradient staging stays pageable: {e}"),
        }
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        if let Some((pin, address)) = self.pinned.take() {
            // A buffer lost in a failed reduce was freed while locked: leave it locked rather
            // than unlock an address that may belong to new memory.
            let alive = self
                .buffer
                .as_ref()
                .is_some_and(|b| b.as_ptr() as usize == address);
            if alive {
                drop(pin);
            } else {
                pin.forget();
            }
        }
    }
}

/// The buckets of one model's gradients.
pub struct GradientBuckets {
    buckets: Vec<Bucket>,
    bucket_of: HashMap<TensorKey, usize>,
    /// The size limits of the plan.
    sizes: BucketSizes,
    /// Time in the copies between the gradients and the buckets since the last
    /// [`GradientBuckets::take_staging`].
    staging: Duration,
}

impl GradientBuckets {
    /// The buckets for `params` with the given size limits.
    pub fn new(params: &ParamStore, sizes: BucketSizes) -> GradientBuckets {
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut bucket_of = HashMap::new();
        for (t, new_bucket) in Self::assign(params, sizes) {
            if new_bucket {
                buckets.push(Bucket {
                    params: Vec::new(),
                    numel: 0,
                    waiting_for: 0,
                    buffer: None,
                    pending: None,
                    pinned: None,
                });
            }
            let b = buckets
                .last_mut()
                .expect("the first parameter starts a bucket");
            b.params.push(t.clone());
            b.numel += t.numel();
            bucket_of.insert(t.key(), buckets.len() - 1);
        }
        let device = params
            .iter()
            .next()
            .map_or(Device::Cpu, |p| p.tensor.device());
        for b in &mut buckets {
            b.buffer = Some(vec![0.0; b.numel]);
            b.pin(device);
        }
        GradientBuckets {
            buckets,
            bucket_of,
            sizes,
            staging: Duration::ZERO,
        }
    }

    /// The bucket sizes (in floats, in reduction order) that `sizes` gives `params`, without
    /// allocating the buffers.
    pub fn plan(params: &ParamStore, sizes: BucketSizes) -> Vec<usize> {
        let mut plan: Vec<usize> = Vec::new();
        for (t, new_bucket) in Self::assign(params, sizes) {
            if new_bucket {
                plan.push(0);
            }
            *plan
                .last_mut()
                .expect("the first parameter starts a bucket") += t.numel();
        }
        plan
    }

    /// The parameters in the order their gradients become ready (the reverse of creation),
    /// each with whether it starts a new bucket.
    fn assign(params: &ParamStore, sizes: BucketSizes) -> Vec<(&Tensor, bool)> {
        let mut out = Vec::new();
        let (mut buckets, mut filled) = (0usize, 0usize);
        let ordered: Vec<&Tensor> = params.iter().map(|p| &p.tensor).collect();
        for t in ordered.into_iter().rev() {
            // While the first bucket is being filled its smaller limit applies.
            let limit = if buckets <= 1 {
                sizes.first
            } else {
                sizes.rest
            };
            let new_bucket = buckets == 0 || ((filled + t.numel()) * 4 > limit && filled > 0);
            if new_bucket {
                buckets += 1;
                filled = 0;
            }
            filled += t.numel();
            out.push((t, new_bucket));
        }
        out
    }

    /// The size limits the buckets were planned with.
    pub fn limits(&self) -> BucketSizes {
        self.sizes
    }

    /// The number of buckets.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// True if there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Sizes of the buckets in floats, in reduction order.
    pub fn sizes(&self) -> Vec<usize> {
        self.buckets.iter().map(|b| b.numel).collect()
    }

    /// Resets the readiness counters before a backward pass.
    pub fn begin(&mut self) {
        for b in &mut self.buckets {
            b.waiting_for = b.params.len();
        }
    }

    /// Called by the backward hook when `param`'s gradient (in `grads`) is complete.
    pub fn ready(
        &mut self,
        param: &Tensor,
        grads: &GradStore,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        let Some(&i) = self.bucket_of.get(&param.key()) else {
            return Ok(());
        };
        let b = &mut self.buckets[i];
        b.waiting_for = b.waiting_for.saturating_sub(1);
        if b.waiting_for == 0 && b.pending.is_none() {
            self.staging += start(b, grads, comm)?;
        }
        Ok(())
    }

    /// Starts any bucket whose parameters the backward pass did not reach, waits for all, and
    /// writes the averaged gradients back into `grads`.
    pub fn finish(&mut self, grads: &mut GradStore, comm: &mut dyn Collective) -> Result<()> {
        for b in &mut self.buckets {
            if b.pending.is_none() {
                self.staging += start(b, grads, comm)?;
            }
        }
        for b in &mut self.buckets {
            let reduced = b.pending.take().expect("started above").wait()?;
            settle(b)?;
            let copy = Instant::now();
            grads.scatter(&b.params, &reduced)?;
            self.staging += copy.elapsed();
            b.buffer = Some(reduced);
        }
        Ok(())
    }

    /// The time spent copying gradients into the buckets and the averages back since the last
    /// call. On a GPU these are the device-to-host and host-to-device copies of the staging
    /// alone: the device finishes the kernels queued before each copy first, and that wait is
    /// not counted.
    pub fn take_staging(&mut self) -> Duration {
        std::mem::take(&mut self.staging)
    }
}

/// Copies the bucket's gradients (from `grads`) into its buffer and starts reducing it; returns
/// the copy's time.
fn start(b: &mut Bucket, grads: &GradStore, comm: &mut dyn Collective) -> Result<Duration> {
    let mut buf = b.buffer.take().unwrap_or_else(|| vec![0.0; b.numel]);
    settle(b)?;
    let copy = Instant::now();
    grads.gather(&b.params, &mut buf)?;
    let took = copy.elapsed();
    b.pending = Some(comm.start_gradient_reduce(buf, ReduceOp::Average)?);
    Ok(took)
}

/// Waits for the kernels queued on the bucket's device (none on a CPU), so that the copy timed
/// next is measured alone rather than with the backward pass's kernels it would wait for. The
/// copy waits for them anyway, so this costs no time of its own.
fn settle(b: &Bucket) -> Result<()> {
    match b.params.first() {
        Some(p) => Ok(p.device().synchronize()?),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use ringflow_ml::Device;
    use ringflow_ml::nn::{Model, ModelRegistry, ModelSpec};

    use super::*;
    use crate::collective::Solo;

    #[test]
    fn a_small_first_bucket_then_large_ones_in_readiness_order() {
        let spec = ModelSpec::mlp(&[784, 1024, 1024, 10], "relu");
        let model = Model::build(&spec, &ModelRegistry::default(), 1, Device::Cpu).unwrap();
        let limits = BucketSizes {
            first: 64 << 10,
            rest: 4 << 20,
        };
        let b = GradientBuckets::new(model.params(), limits);
        let sizes = b.sizes();
        assert_eq!(GradientBuckets::plan(model.params(), limits), sizes);
        assert_eq!(sizes.iter().sum::<usize>(), model.params().numel());
        // The last layer (10250 floats) and the next bias fit the 64 KiB first bucket...
        assert_eq!(sizes[0], 10 + 10_240 + 1024);
        // ...then buckets stay near the limit (a parameter larger than it gets its own).
        assert!(
            sizes[1..]
                .iter()
                .all(|&n| n * 4 <= 4 << 20 || n == 1024 * 1024 || n == 784 * 1024)
        );
    }

    #[test]
    fn buckets_round_trip_through_a_world_of_one() {
        let spec = ModelSpec::mlp(&[3, 4, 2], "relu");
        let model = Model::build(&spec, &ModelRegistry::default(), 1, Device::Cpu).unwrap();
        let x = Tensor::from_vec(vec![0.5; 6], &[2, 3], Device::Cpu).unwrap();
        let y = Tensor::from_vec(vec![0.0, 1.0], &[2], Device::Cpu).unwrap();
        let mut rng = ringflow_ml::rng::seeded(1, 1);
        let loss =
            ringflow_ml::loss::cross_entropy(&model.forward(&x, true, &mut rng).unwrap(), &y)
                .unwrap();
        let mut buckets = GradientBuckets::new(model.params(), BucketSizes::of_mib(25.0));
        let mut comm = Solo;
        buckets.begin();
        let mut ready = 0;
        let mut grads = GradStore::new();
        loss.backward_with(&mut grads, |p, grads| {
            ready += 1;
            buckets
                .ready(p, grads, &mut comm)
                .map_err(|e| ringflow_ml::MlError::Backward(e.to_string()))
        })
        .unwrap();
        assert_eq!(
            ready,
            model.params().len(),
            "every parameter was reported ready once"
        );
        let before: Vec<Vec<f32>> = model
            .params()
            .iter()
            .map(|p| grads.get(&p.tensor).unwrap().to_vec())
            .collect();
        buckets.finish(&mut grads, &mut comm).unwrap();
        let after: Vec<Vec<f32>> = model
            .params()
            .iter()
            .map(|p| grads.get(&p.tensor).unwrap().to_vec())
            .collect();
        assert_eq!(before, after);
    }
}
