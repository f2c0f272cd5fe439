//! [`Tensor`]: an n-dimensional array of f32 on a device, and the graph that computed it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ndarray::ArrayD;
use rand::RngExt;

use crate::autodiff::{self, Backward, Derivative, GradStore, MultiBackward, Node};
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
    /// Set by [`Tensor::from_indices`]: every element is an integer below this, checked on the
    /// host, so ops taking indices need not download them again.
    index_limit: Option<usize>,
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

    /// An error unless `len` is this tensor's number of elements.
    pub(crate) fn check_len(&self, op: &'static str, len: usize) -> Result<()> {
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
    /// depends on, in a new [`GradStore`].
    pub fn backward(&self) -> Result<GradStore> {
        let mut grads = GradStore::new();
        self.backward_into(&mut grads)?;
        Ok(grads)
    }

    /// Computes the gradient of this one-element tensor with respect to every parameter it
    /// depends on, adding it to what `grads` holds (overwriting what [`GradStore::zero`]
    /// marked stale). With [`GradStore::set_sgd_in_backward`], the store's SGD step is applied
    /// inside the pass.
    pub fn backward_into(&self, grads: &mut GradStore) -> Result<()> {
        autodiff::run_backward(self, grads, &mut |_, _| Ok(()))
    }

    /// Like [`Tensor::backward_into`], calling `on_ready(param, grads)` for each parameter as
    /// soon as its gradient is complete (the last op using it has run its backward), while the
    /// rest of the pass continues: the hook through which gradient all-reduce overlaps with
    /// backward.
    pub fn backward_with(
        &self,
        grads: &mut GradStore,
        mut on_ready: impl FnMut(&Tensor, &GradStore) -> Result<()>,
    ) -> Result<()> {
        autodiff::run_backward(self, grads, &mut on_ready)
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
