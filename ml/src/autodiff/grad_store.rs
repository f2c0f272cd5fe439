//! [`GradStore`]: the gradients of a model's parameters, kept beside them rather than in them.
//!
//! The store owns one gradient buffer per parameter that a backward pass reached. A pass fills
//! it ([`crate::Tensor::backward_into`]); the gradient sync reads it and writes the common
//! gradient back ([`GradStore::gather`], [`GradStore::scatter`]); the optimizer's step reads it
//! ([`crate::optim::Optimizer::step`]). Gradients add up across passes until
//! [`GradStore::zero`], which only marks the buffers stale ("logically zero"): the next pass
//! overwrites them instead of adding, so a training step neither clears nor re-reads a
//! parameter-sized buffer, and no buffer is allocated after the first step.
//!
//! A store may also carry a plain SGD step to apply inside the pass
//! ([`GradStore::set_sgd_in_backward`]): a parameter used once whose gradient is a matrix
//! product is then updated with the product, its gradient never stored, and the optimizer's
//! step skips it ([`GradStore::applied`]).

use std::collections::{HashMap, HashSet};

use crate::backend::{Storage, cpu};
use crate::device::Device;
use crate::error::{MlError, Result};
use crate::tensor::{Tensor, TensorKey};

/// The gradients of parameters, by parameter, filled by backward passes.
///
/// Cloning a parameter keeps its [`TensorKey`], so a store answers for every handle of it.
#[derive(Default)]
pub struct GradStore {
    grads: HashMap<TensorKey, GradBuffer>,
    sgd: Option<SgdInBackward>,
}

/// One parameter's gradient.
#[derive(Default)]
struct GradBuffer {
    storage: Option<Storage>,
    /// Logically zero: the next write overwrites the buffer.
    stale: bool,
    /// The pass's gradient was applied to the value inside the backward pass instead of being
    /// stored: the buffer holds nothing of it, and the optimizer's step skips the parameter.
    applied: bool,
}

/// A plain SGD step at `lr` applied inside the backward pass to `params` (those used once
/// whose gradient is a matrix product).
struct SgdInBackward {
    lr: f32,
    params: HashSet<TensorKey>,
}

/// How an op may write a gradient it has computed.
pub(crate) enum GradWrite<'a> {
    /// Add into this buffer.
    Add(&'a mut Storage),
    /// Overwrite this buffer entirely (its contents are stale).
    Overwrite(&'a mut Storage),
    /// There is no buffer: return a new one.
    New,
}

impl GradStore {
    /// An empty store.
    pub fn new() -> GradStore {
        GradStore::default()
    }

    /// A copy of the accumulated gradient of `t` (`None` before a pass reached it; zeros after
    /// [`GradStore::zero`] until the next pass).
    pub fn get(&self, t: &Tensor) -> Option<Tensor> {
        let g = self.grads.get(&t.key())?;
        let storage = g.storage.as_ref()?;
        let copy = if g.stale {
            Storage::zeros(t.shape(), t.device()).ok()?
        } else {
            storage.duplicate().ok()?
        };
        Some(Tensor::from_storage(copy))
    }

    /// Sets every gradient to zero. The buffers are kept and only marked stale: the next
    /// backward pass overwrites them, so this costs nothing per step.
    pub fn zero(&mut self) {
        for g in self.grads.values_mut() {
            g.stale = true;
            g.applied = false;
        }
    }

    /// Lets `write` store `t`'s gradient: it may add to the buffer, must overwrite it when
    /// stale, or returns a new one when there is none. A returned storage replaces the buffer.
    pub(crate) fn write(
        &mut self,
        t: &Tensor,
        write: impl FnOnce(GradWrite<'_>) -> Result<Option<Storage>>,
    ) -> Result<()> {
        let GradBuffer {
            storage,
            stale,
            applied,
        } = self.grads.entry(t.key()).or_default();
        *applied = false;
        let replacement = match storage.as_mut() {
            None => write(GradWrite::New)?,
            Some(buf) if *stale => write(GradWrite::Overwrite(buf))?,
            Some(buf) => write(GradWrite::Add(buf))?,
        };
        if let Some(r) = replacement {
            *storage = Some(r);
        }
        if storage.is_none() {
            return Err(MlError::Backward(
                "an op produced no gradient for a new buffer".into(),
            ));
        }
        *stale = false;
        Ok(())
    }

    /// Calls `f` with `t`'s gradient buffer, materializing zeros first if it is missing or
    /// stale.
    pub(crate) fn with_buffer<R>(
        &mut self,
        t: &Tensor,
        f: impl FnOnce(&mut Storage) -> Result<R>,
    ) -> Result<R> {
        let GradBuffer { storage, stale, .. } = self.grads.entry(t.key()).or_default();
        let buf = match storage {
            Some(buf) if *stale => {
                buf.fill(0.0)?;
                buf
            }
            Some(buf) => buf,
            None => storage.insert(Storage::zeros(t.shape(), t.device())?),
        };
        *stale = false;
        f(buf)
    }

    /// `t`'s gradient when it holds values (not missing, not stale).
    fn current(&self, t: &Tensor) -> Option<&Storage> {
        let g = self.grads.get(&t.key())?;
        g.storage.as_ref().filter(|_| !g.stale)
    }

    /// Copies `t`'s accumulated gradient into `dst` (zeros if there is none yet).
    pub fn copy_to_slice(&self, t: &Tensor, dst: &mut [f32]) -> Result<()> {
        t.check_len("GradStore::copy_to_slice", dst.len())?;
        match self.current(t) {
            Some(s) => s.copy_to_slice(dst),
            None => {
                dst.fill(0.0);
                Ok(())
            }
        }
    }

    /// Overwrites `t`'s accumulated gradient from `src` (after an all-reduce, for instance).
    pub fn copy_from_slice(&mut self, t: &Tensor, src: &[f32]) -> Result<()> {
        t.check_len("GradStore::copy_from_slice", src.len())?;
        self.write(t, |slot| match slot {
            GradWrite::Add(buf) | GradWrite::Overwrite(buf) => {
                buf.copy_from_slice(src)?;
                Ok(None)
            }
            GradWrite::New => {
                Storage::from_host(cpu::from_vec(t.shape(), src.to_vec()), t.device()).map(Some)
            }
        })
    }

    /// Copies the gradients of `params` back to back into `dst` (zeros where there is none),
    /// queuing every GPU copy and waiting once: with `dst` page-locked
    /// ([`Device::pin_host`]) the copies run by DMA. `dst.len()` must equal the parameters'
    /// total size.
    pub fn gather(&self, params: &[Tensor], dst: &mut [f32]) -> Result<()> {
        each_range("GradStore::gather", params, dst.len(), |p, range| {
            let out = &mut dst[range];
            match self.current(p) {
                Some(s) => s.queue_copy_to_slice(out),
                None => {
                    out.fill(0.0);
                    Ok(())
                }
            }
        })
    }

    /// Overwrites the gradients of `params` from `src` (back to back, as [`GradStore::gather`]
    /// wrote them), waiting once for all the copies.
    pub fn scatter(&mut self, params: &[Tensor], src: &[f32]) -> Result<()> {
        each_range("GradStore::scatter", params, src.len(), |p, range| {
            self.copy_from_slice(p, &src[range])
        })
    }

    /// For each parameter on a GPU, the device address and length of its gradient (zeros are
    /// materialized where the backward pass did not reach it, so every rank reduces the same
    /// buffers), for collectives that work in device memory (NCCL). The buffers stay in place
    /// until the next backward pass; ask again after each one.
    #[cfg(feature = "cuda")]
    pub fn cuda_buffers(&mut self, params: &[Tensor]) -> Result<Vec<(u64, usize)>> {
        params
            .iter()
            .map(|p| {
                self.with_buffer(p, |s| match s {
                    Storage::Cuda(c) => Ok((c.device_address(), c.len())),
                    Storage::Cpu(_) => Err(MlError::Device(
                        "a device-memory collective needs gradients on a GPU, not the CPU".into(),
                    )),
                })
            })
            .collect()
    }

    /// The L2 norm of the gradients of `params` together (0 for those without one).
    pub fn norm<'a>(&self, params: impl IntoIterator<Item = &'a Tensor>) -> Result<f64> {
        let mut total = 0.0;
        for p in params {
            if let Some(s) = self.current(p) {
                total += s.sum_squares()?;
            }
        }
        Ok(total.sqrt())
    }

    /// Multiplies the gradients of `params` by `factor` in place (those without one stay so).
    pub fn scale<'a>(
        &mut self,
        params: impl IntoIterator<Item = &'a Tensor>,
        factor: f32,
    ) -> Result<()> {
        for p in params {
            if let Some(g) = self.grads.get_mut(&p.key())
                && !g.stale
                && let Some(s) = g.storage.as_mut()
            {
                s.scale(factor)?;
            }
        }
        Ok(())
    }

    /// Scales the gradients of `params` so that their joint L2 norm is at most `max_norm`;
    /// returns the norm before clipping (`torch.nn.utils.clip_grad_norm_`).
    pub fn clip_norm<'a, P>(&mut self, params: P, max_norm: f64) -> Result<f64>
    where
        P: IntoIterator<Item = &'a Tensor> + Clone,
    {
        let norm = self.norm(params.clone())?;
        if norm > max_norm && norm > 0.0 {
            self.scale(params, (max_norm / (norm + 1e-6)) as f32)?;
        }
        Ok(norm)
    }

    /// Makes the next backward passes into this store apply a plain SGD step at `lr` inside the
    /// pass to every one of `params` used once whose gradient is a matrix product (see
    /// [`crate::optim::Optimizer::backward`]); `None` turns that off.
    pub fn set_sgd_in_backward(&mut self, sgd: Option<(f32, &[Tensor])>) {
        self.sgd = sgd.map(|(lr, params)| SgdInBackward {
            lr,
            params: params.iter().map(Tensor::key).collect(),
        });
    }

    /// The learning rate of the SGD step inside the pass and the parameters it may update.
    pub(crate) fn sgd_in_backward(&self) -> Option<(f32, &HashSet<TensorKey>)> {
        self.sgd.as_ref().map(|s| (s.lr, &s.params))
    }

    /// Applies this pass's gradient of `t` to its value inside the backward pass, when `t`'s
    /// buffer holds nothing of the pass yet: `update` changes the value (computing the
    /// gradient on the way), and `t` is marked applied, so that the optimizer's step skips it
    /// and its gradient reads as zeros (or none). `false`, and nothing called, when the buffer
    /// already holds gradient values, which the update would leave out.
    pub(crate) fn update_in_backward(
        &mut self,
        t: &Tensor,
        update: impl FnOnce(&mut Storage) -> Result<()>,
    ) -> Result<bool> {
        if self.current(t).is_some() {
            return Ok(false);
        }
        update(&mut t.write())?;
        self.grads.entry(t.key()).or_default().applied = true;
        Ok(true)
    }

    /// Whether `t`'s gradient was applied to its value in the backward pass
    /// ([`GradStore::set_sgd_in_backward`]) since the last [`GradStore::zero`].
    pub fn applied(&self, t: &Tensor) -> bool {
        self.grads.get(&t.key()).is_some_and(|g| g.applied)
    }
}

/// Calls `f` with each parameter and its range in a flat buffer of `len` values (which must be
/// their total size), then waits once for every device involved.
fn each_range(
    op: &'static str,
    params: &[Tensor],
    len: usize,
    mut f: impl FnMut(&Tensor, std::ops::Range<usize>) -> Result<()>,
) -> Result<()> {
    let total: usize = params.iter().map(Tensor::numel).sum();
    if total != len {
        return Err(MlError::invalid(
            op,
            format!("{len} values do not match {total} gradient elements"),
        ));
    }
    let mut at = 0;
    let mut devices = Vec::new();
    for p in params {
        f(p, at..at + p.numel())?;
        if !devices.contains(&p.device()) {
            devices.push(p.device());
        }
        at += p.numel();
    }
    devices.into_iter().try_for_each(Device::synchronize)
}
