//! [`Tensor`]: an n-dimensional array of f32 on a device, with an optional gradient.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ndarray::ArrayD;
use rand::RngExt;

use crate::autodiff::{self, Backward, Derivative, MultiBackward, Node};
use crate::backend::{Storage, cpu};
use crate::device::Device;
use crate::error::{MlError, Result};
use crate::shape::numel;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Identifies a tensor and its clones, e.g. to map parameters to gradient buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorKey(u64);

/// An n-dimensional array of `f32` on a [`Device`].
///
/// Cloning a tensor is cheap and shares its data (like `torch.Tensor` references). A tensor is
/// either a *leaf* (created from data; it needs gradients if it was made a parameter with
/// [`Tensor::into_parameter`]) or the result of an op on other tensors, in which case it remembers
/// how it was computed whenever one of its inputs needs gradients, so that
/// [`Tensor::backward`] can run.
///
/// Class labels and row indices (for [`crate::loss::cross_entropy`] and
/// [`Tensor::index_select`]) are carried as integer-valued f32 tensors, exact below 2²⁴.
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

struct Inner {
    id: u64,
    shape: Vec<usize>,
    device: Device,
    data: RwLock<Storage>,
    requires_grad: bool,
    node: Option<Node>,
    grad: Mutex<GradBuffer>,
    /// Set by [`Tensor::from_indices`]: every element is an integer below this, checked on the
    /// host, so ops taking indices need not download them again.
    index_limit: Option<usize>,
}

/// A parameter's gradient. `zero_grad` only marks it stale ("logically zero"): the next
/// backward pass overwrites it instead of adding to it, so a training step neither clears nor
/// re-reads a parameter-sized buffer.
#[derive(Default)]
struct GradBuffer {
    storage: Option<Storage>,
    stale: bool,
    /// The pass's gradient was applied to the value inside the backward pass
    /// ([`Tensor::update_in_backward`]) instead of being stored: the buffer holds nothing of it,
    /// and the optimizer's step skips the parameter.
    applied: bool,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Tensor {
    // ----- construction -------------------------------------------------------------------

    fn new(storage: Storage, requires_grad: bool, node: Option<Node>) -> Tensor {
        Tensor(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shape: storage.shape().to_vec(),
            device: storage.device(),
            data: RwLock::new(storage),
            requires_grad,
            node,
            grad: Mutex::new(GradBuffer::default()),
            index_limit: None,
        }))
    }

    pub(crate) fn from_storage(storage: Storage) -> Tensor {
        Tensor::new(storage, false, None)
    }

    /// The result of an op: records `backward` when grad mode is on and an input needs
    /// gradients, otherwise a plain tensor.
    pub(crate) fn from_op(
        storage: Storage,
        inputs: &[&Tensor],
        backward: impl Backward + 'static,
    ) -> Tensor {
        let needs_grad = autodiff::is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
        if !needs_grad {
            return Tensor::from_storage(storage);
        }
        let node = Node {
            inputs: inputs.iter().map(|t| (*t).clone()).collect(),
            backward: Derivative::Single(Box::new(backward)),
        };
        Tensor::new(storage, true, Some(node))
    }

    /// The results of an op with several outputs: records `backward` once for all of them when
    /// grad mode is on and an input needs gradients (through a hidden, empty joint tensor that
    /// every output depends on), otherwise plain tensors.
    pub(crate) fn from_multi_op(
        outputs: Vec<Storage>,
        inputs: &[&Tensor],
        backward: impl MultiBackward + 'static,
    ) -> Result<Vec<Tensor>> {
        let needs_grad = autodiff::is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
        let Some(first) = outputs.first().filter(|_| needs_grad) else {
            return Ok(outputs.into_iter().map(Tensor::from_storage).collect());
        };
        let joint_node = Node {
            inputs: inputs.iter().map(|t| (*t).clone()).collect(),
            backward: Derivative::Joint(Box::new(backward)),
        };
        let empty = Storage::zeros(&[0], first.device())?;
        let joint = Tensor::new(empty, true, Some(joint_node));
        let of = outputs.len();
        Ok(outputs
            .into_iter()
            .enumerate()
            .map(|(index, storage)| {
                let node = Node {
                    inputs: vec![joint.clone()],
                    backward: Derivative::Part { index, of },
                };
                Tensor::new(storage, true, Some(node))
            })
            .collect())
    }

    /// A tensor of `shape` holding `data` in row-major order.
    pub fn from_vec(data: Vec<f32>, shape: &[usize], device: Device) -> Result<Tensor> {
        if data.len() != numel(shape) {
            return Err(MlError::invalid(
                "from_vec",
                format!(
                    "{} values cannot fill a tensor of shape {shape:?} ({} elements)",
                    data.len(),
                    numel(shape)
                ),
            ));
        }
        Self::from_array(cpu::from_vec(shape, data), device)
    }

    /// A tensor of class labels or row indices: every value must be an integer in `0..limit`
    /// (an error names the first that is not). The check happens here, on the host, so that
    /// [`crate::loss::cross_entropy`] and [`Tensor::index_select`] need not read a GPU tensor
    /// back to check it in every step.
    pub fn from_indices(
        data: Vec<f32>,
        shape: &[usize],
        limit: usize,
        device: Device,
    ) -> Result<Tensor> {
        if let Some((i, v)) = data
            .iter()
            .enumerate()
            .find(|(_, v)| !(**v >= 0.0 && v.fract() == 0.0 && (**v as usize) < limit))
        {
            return Err(MlError::invalid(
                "from_indices",
                format!("value {v} at position {i} is not an integer in 0..{limit}"),
            ));
        }
        let mut t = Self::from_vec(data, shape, device)?;
        if let Some(inner) = Arc::get_mut(&mut t.0) {
            inner.index_limit = Some(limit);
        }
        Ok(t)
    }

    /// The bound [`Tensor::from_indices`] checked, if this tensor was made by it.
    pub(crate) fn index_limit(&self) -> Option<usize> {
        self.0.index_limit
    }

    /// A tensor holding an ndarray's elements.
    pub fn from_array(array: ArrayD<f32>, device: Device) -> Result<Tensor> {
        Ok(Self::from_storage(Storage::from_host(array, device)?))
    }

    /// A 0-dimensional tensor.
    pub fn scalar(value: f32, device: Device) -> Result<Tensor> {
        Self::from_vec(vec![value], &[], device)
    }

    /// Zeros.
    pub fn zeros(shape: &[usize], device: Device) -> Result<Tensor> {
        Ok(Self::from_storage(Storage::zeros(shape, device)?))
    }

    /// Every element `value`.
    pub fn full(shape: &[usize], value: f32, device: Device) -> Result<Tensor> {
        let mut s = Storage::zeros(shape, device)?;
        s.fill(value)?;
        Ok(Self::from_storage(s))
    }

    /// Ones.
    pub fn ones(shape: &[usize], device: Device) -> Result<Tensor> {
        Self::full(shape, 1.0, device)
    }

    /// Uniform samples from `[low, high)` drawn from `rng`.
    pub fn uniform(
        shape: &[usize],
        low: f32,
        high: f32,
        rng: &mut impl rand::Rng,
        device: Device,
    ) -> Result<Tensor> {
        let data = (0..numel(shape))
            .map(|_| low + (high - low) * rng.random::<f32>())
            .collect();
        Self::from_vec(data, shape, device)
    }

    /// Normal samples with mean 0 and standard deviation `std` (Box–Muller) drawn from `rng`.
    pub fn randn(
        shape: &[usize],
        std: f32,
        rng: &mut impl rand::Rng,
        device: Device,
    ) -> Result<Tensor> {
        let n = numel(shape);
        let mut data = Vec::with_capacity(n + 1);
        while data.len() < n {
            let u1: f32 = rng.random::<f32>().max(f32::MIN_POSITIVE);
            let u2: f32 = rng.random::<f32>();
            let r = (-2.0 * u1.ln()).sqrt() * std;
            let theta = 2.0 * std::f32::consts::PI * u2;
            data.push(r * theta.cos());
            data.push(r * theta.sin());
        }
        data.truncate(n);
        Self::from_vec(data, shape, device)
    }

    /// The same values as a new leaf that needs gradients: a trainable parameter. The values
    /// are moved when this is the last handle to a leaf, copied otherwise.
    pub fn into_parameter(self) -> Result<Tensor> {
        let storage = match Arc::try_unwrap(self.0) {
            Ok(inner) if inner.node.is_none() => {
                inner.data.into_inner().unwrap_or_else(|p| p.into_inner())
            }
            Ok(inner) => Tensor(Arc::new(inner)).read().duplicate()?,
            Err(shared) => Tensor(shared).read().duplicate()?,
        };
        Ok(Tensor::new(storage, true, None))
    }

    /// A copy of the values that is cut off from the graph (a leaf without gradients).
    pub fn detach(&self) -> Result<Tensor> {
        Ok(Self::from_storage(self.read().duplicate()?))
    }

    // ----- inspection ---------------------------------------------------------------------

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.shape.len()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.0.shape)
    }

    /// The device holding the data.
    pub fn device(&self) -> Device {
        self.0.device
    }

    /// True if gradients flow to or through this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad
    }

    /// True if the tensor was not computed by a recorded op.
    pub fn is_leaf(&self) -> bool {
        self.0.node.is_none()
    }

    pub(crate) fn id(&self) -> u64 {
        self.0.id
    }

    /// An identity for this tensor (shared by its clones), stable for its lifetime.
    pub fn key(&self) -> TensorKey {
        TensorKey(self.0.id)
    }

    pub(crate) fn node(&self) -> Option<&Node> {
        self.0.node.as_ref()
    }

    /// Consumes the last handle to a recorded tensor and returns how it was computed (`None`
    /// if other handles remain or it is a leaf), so that graphs can be freed without recursion.
    pub(crate) fn into_unique_node(self) -> Option<Node> {
        Arc::try_unwrap(self.0)
            .ok()
            .and_then(|mut inner| inner.node.take())
    }

    /// The elements in row-major order, downloaded from the device if needed.
    ///
    /// # Panics
    ///
    /// If a GPU fails to copy the data (a device fault or a lost device). Code that must not
    /// panic, like the executors', uses [`Tensor::try_to_vec`].
    pub fn to_vec(&self) -> Vec<f32> {
        self.try_to_vec()
            .unwrap_or_else(|e| panic!("cannot read a tensor from {}: {e}", self.device()))
    }

    /// The elements in row-major order, downloaded from the device if needed.
    pub fn try_to_vec(&self) -> Result<Vec<f32>> {
        let mut out = vec![0.0; self.numel()];
        self.read().copy_to_slice(&mut out)?;
        Ok(out)
    }

    /// The elements as an ndarray (downloaded from the device if needed).
    pub fn to_array(&self) -> Result<ArrayD<f32>> {
        self.read().to_host()
    }

    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(MlError::invalid(
                "item",
                format!(
                    "needs a tensor with one element, not shape {:?}",
                    self.shape()
                ),
            ));
        }
        Ok(self.try_to_vec()?[0])
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Storage> {
        self.0.data.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Storage> {
        self.0.data.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Copies the values into `dst` (row-major; `dst.len()` must equal [`Tensor::numel`]).
    pub fn copy_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        self.check_len("copy_to_slice", dst.len())?;
        self.read().copy_to_slice(dst)
    }

    /// Overwrites the values in place from `src` (row-major). Used to load checkpoints and
    /// broadcast weights; it does not touch the graph.
    pub fn copy_from_slice(&self, src: &[f32]) -> Result<()> {
        self.check_len("copy_from_slice", src.len())?;
        self.write().copy_from_slice(src)
    }

    fn check_len(&self, op: &'static str, len: usize) -> Result<()> {
        if len != self.numel() {
            return Err(MlError::invalid(
                op,
                format!(
                    "{len} values do not match a tensor of shape {:?}",
                    self.shape()
                ),
            ));
        }
        Ok(())
    }

    // ----- gradients ----------------------------------------------------------------------

    /// Computes the gradient of this one-element tensor with respect to every parameter it
    /// depends on, adding it to their [`Tensor::grad`].
    pub fn backward(&self) -> Result<()> {
        autodiff::run_backward(self, &mut |_| Ok(()), None)
    }

    /// [`Tensor::backward`] applying a plain SGD step at `lr` inside the pass to every one of
    /// `params` used once whose gradient is a matrix product (see
    /// [`crate::optim::Optimizer::backward`]).
    pub(crate) fn backward_with_sgd(&self, lr: f32, params: &[Tensor]) -> Result<()> {
        autodiff::run_backward(self, &mut |_| Ok(()), Some((lr, params)))
    }

    /// Like [`Tensor::backward`], calling `on_ready(param)` for each parameter as soon as its
    /// gradient is complete (the last op using it has run its backward), while the rest of the
    /// pass continues: the hook through which gradient all-reduce overlaps with backward.
    pub fn backward_with(&self, mut on_ready: impl FnMut(&Tensor) -> Result<()>) -> Result<()> {
        autodiff::run_backward(self, &mut on_ready, None)
    }

    /// The accumulated gradient of a parameter (`None` before the first backward pass).
    pub fn grad(&self) -> Option<Tensor> {
        let g = lock(&self.0.grad);
        let storage = g.storage.as_ref()?;
        let copy = if g.stale {
            Storage::zeros(self.shape(), self.device()).ok()?
        } else {
            storage.duplicate().ok()?
        };
        Some(Tensor::from_storage(copy))
    }

    /// Sets the accumulated gradient to zero. The buffer is kept and only marked stale: the
    /// next backward pass overwrites it, so this costs nothing per step.
    pub fn zero_grad(&self) {
        let mut g = lock(&self.0.grad);
        g.stale = true;
        g.applied = false;
    }

    /// Lets `write` store this parameter's gradient: it may add to the buffer, must overwrite
    /// it when stale, or returns a new one when there is none. A returned storage replaces the
    /// buffer.
    pub(crate) fn write_grad(
        &self,
        write: impl FnOnce(GradWrite<'_>) -> Result<Option<Storage>>,
    ) -> Result<()> {
        let mut g = lock(&self.0.grad);
        let GradBuffer {
            storage,
            stale,
            applied,
        } = &mut *g;
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

    /// Calls `f` with the gradient buffer of a parameter, materializing zeros first if it is
    /// missing or stale.
    pub(crate) fn with_grad_buffer<R>(
        &self,
        f: impl FnOnce(&mut Storage) -> Result<R>,
    ) -> Result<R> {
        let mut g = lock(&self.0.grad);
        let GradBuffer { storage, stale, .. } = &mut *g;
        match storage.as_mut() {
            None => *storage = Some(Storage::zeros(self.shape(), self.device())?),
            Some(buf) if *stale => buf.fill(0.0)?,
            Some(_) => {}
        }
        *stale = false;
        f(storage.as_mut().expect("just ensured"))
    }

    /// Copies the accumulated gradient into `dst` (zeros if there is none yet).
    pub fn copy_grad_to_slice(&self, dst: &mut [f32]) -> Result<()> {
        self.check_len("copy_grad_to_slice", dst.len())?;
        let g = lock(&self.0.grad);
        match (&g.storage, g.stale) {
            (Some(s), false) => s.copy_to_slice(dst),
            _ => {
                dst.fill(0.0);
                Ok(())
            }
        }
    }

    /// Copies the gradients of `params` back to back into `dst` (zeros where there is none),
    /// queuing every GPU copy and waiting once: with `dst` page-locked
    /// ([`Device::pin_host`]) the copies run by DMA. `dst.len()` must equal the parameters'
    /// total size.
    pub fn gather_grads(params: &[Tensor], dst: &mut [f32]) -> Result<()> {
        Self::each_grad_range("gather_grads", params, dst.len(), |p, range| {
            let out = &mut dst[range];
            let g = lock(&p.0.grad);
            match (&g.storage, g.stale) {
                (Some(s), false) => s.queue_copy_to_slice(out),
                _ => {
                    out.fill(0.0);
                    Ok(())
                }
            }
        })
    }

    /// Overwrites the gradients of `params` from `src` (back to back, as [`Tensor::gather_grads`]
    /// wrote them), waiting once for all the copies.
    pub fn scatter_grads(params: &[Tensor], src: &[f32]) -> Result<()> {
        Self::each_grad_range("scatter_grads", params, src.len(), |p, range| {
            p.copy_grad_from_slice(&src[range])
        })
    }

    /// Calls `f` with each parameter and its range in a flat buffer of `len` values (which must
    /// be their total size), then waits once for every device involved.
    fn each_grad_range(
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

    /// For each parameter on a GPU, the device address and length of its gradient (zeros are
    /// materialized where the backward pass did not reach it, so every rank reduces the same
    /// buffers), for collectives that work in device memory (NCCL). The buffers stay in place
    /// until the next backward pass; ask again after each one.
    #[cfg(feature = "cuda")]
    pub fn cuda_grad_buffers(params: &[Tensor]) -> Result<Vec<(u64, usize)>> {
        params
            .iter()
            .map(|p| {
                p.with_grad_buffer(|s| match s {
                    Storage::Cuda(c) => Ok((c.device_address(), c.len())),
                    Storage::Cpu(_) => Err(MlError::Device(
                        "a device-memory collective needs gradients on a GPU, not the CPU".into(),
                    )),
                })
            })
            .collect()
    }

    /// Overwrites the accumulated gradient from `src` (after an all-reduce, for instance).
    pub fn copy_grad_from_slice(&self, src: &[f32]) -> Result<()> {
        self.check_len("copy_grad_from_slice", src.len())?;
        self.write_grad(|slot| match slot {
            GradWrite::Add(buf) | GradWrite::Overwrite(buf) => {
                buf.copy_from_slice(src)?;
                Ok(None)
            }
            GradWrite::New => {
                Storage::from_host(cpu::from_vec(self.shape(), src.to_vec()), self.device())
                    .map(Some)
            }
        })
    }

    /// Multiplies the accumulated gradient by `factor` in place.
    pub fn scale_grad(&self, factor: f32) -> Result<()> {
        let mut g = lock(&self.0.grad);
        if !g.stale
            && let Some(s) = g.storage.as_mut()
        {
            s.scale(factor)?;
        }
        Ok(())
    }

    /// The squared L2 norm of the accumulated gradient (0 if there is none).
    pub fn grad_sum_squares(&self) -> Result<f64> {
        let g = lock(&self.0.grad);
        match (&g.storage, g.stale) {
            (Some(s), false) => s.sum_squares(),
            _ => Ok(0.0),
        }
    }

    /// Calls `f` with the value and the gradient of a parameter, for in-place updates by
    /// optimizers. The gradient is zeros if no backward pass has reached the parameter.
    pub(crate) fn update_with<R>(
        &self,
        f: impl FnOnce(&mut Storage, &Storage) -> Result<R>,
    ) -> Result<R> {
        let mut value = self.write();
        self.with_grad_buffer(|g| f(&mut value, g))
    }

    /// Applies this pass's gradient of a parameter to its value inside the backward pass, when
    /// the gradient buffer holds nothing of the pass yet: `update` changes the value (computing
    /// the gradient on the way), and the parameter is marked applied, so that the optimizer's
    /// step skips it and its gradient reads as zeros (or none). `false`, and nothing called,
    /// when the buffer already holds gradient values, which the update would leave out.
    pub(crate) fn update_in_backward(
        &self,
        update: impl FnOnce(&mut Storage) -> Result<()>,
    ) -> Result<bool> {
        let mut value = self.write();
        let mut g = lock(&self.0.grad);
        if g.storage.is_some() && !g.stale {
            return Ok(false);
        }
        update(&mut value)?;
        g.applied = true;
        Ok(true)
    }

    /// Whether this parameter's gradient was applied to its value in the backward pass
    /// ([`Tensor::update_in_backward`]) since the last [`Tensor::zero_grad`].
    pub(crate) fn gradient_applied(&self) -> bool {
        lock(&self.0.grad).applied
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Tensor");
        d.field("shape", &self.shape())
            .field("device", &self.device())
            .field("requires_grad", &self.requires_grad());
        if self.numel() <= 16 {
            d.field("values", &self.to_vec());
        }
        d.finish()
    }
}
