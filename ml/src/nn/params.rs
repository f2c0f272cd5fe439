//! Named parameters, non-trainable buffers, and the builder that creates them.

use crate::device::Device;
use crate::error::{MlError, Result};
use crate::rng::Rng;
use crate::tensor::Tensor;

/// One named tensor of a model: a trainable parameter, or a buffer.
#[derive(Clone, Debug)]
pub struct Param {
    /// Dotted path, e.g. `layers.0.weight`.
    pub name: String,
    /// The values: for a parameter a leaf that requires gradients, for a buffer a plain tensor.
    pub tensor: Tensor,
}

/// All parameters of a model, in creation order, and its buffers.
///
/// **Buffers** are a model's non-trainable state, such as a batch norm's running mean and
/// variance (PyTorch's `register_buffer`): they have no gradient, the optimizer never sees them,
/// and gradient all-reduce leaves them out, but checkpoints save and restore them with the
/// parameters and [`ParamStore::checksum`] covers them, so two replicas compare equal only when
/// their buffers are equal too.
#[derive(Clone, Debug, Default)]
pub struct ParamStore {
    params: Vec<Param>,
    buffers: Vec<Param>,
}

impl ParamStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The parameters in creation order.
    pub fn iter(&self) -> impl Iterator<Item = &Param> + Clone {
        self.params.iter()
    }

    /// The parameter tensors in registration order (handles sharing the values).
    pub fn tensors(&self) -> Vec<Tensor> {
        self.params.iter().map(|p| p.tensor.clone()).collect()
    }

    /// The number of parameters (tensors).
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// True if there are no parameters.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// The total number of scalar weights.
    pub fn numel(&self) -> usize {
        self.params.iter().map(|p| p.tensor.numel()).sum()
    }

    /// The parameter called `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.tensor)
    }

    /// The buffers (non-trainable state) in creation order.
    pub fn buffers(&self) -> impl Iterator<Item = &Param> {
        self.buffers.iter()
    }

    /// The buffer called `name`.
    pub fn get_buffer(&self, name: &str) -> Option<&Tensor> {
        self.buffers
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.tensor)
    }

    /// The total number of scalar values in buffers.
    pub fn buffer_numel(&self) -> usize {
        self.buffers.iter().map(|p| p.tensor.numel()).sum()
    }

    /// An error unless `name` is still free (parameters and buffers share one namespace, as
    /// they share a checkpoint file).
    fn check_free(&self, name: &str) -> Result<()> {
        if self.get(name).is_some() || self.get_buffer(name).is_some() {
            return Err(MlError::spec(format!(
                "parameter name {name:?} is used twice"
            )));
        }
        Ok(())
    }

    /// Registers a buffer: a tensor saved with the model but not trained. It is stored
    /// without gradient tracking (a copy of `tensor`'s values if `tensor` requires
    /// gradients); names must be unique among parameters and buffers.
    pub fn insert_buffer(&mut self, name: String, tensor: Tensor) -> Result<Tensor> {
        self.check_free(&name)?;
        let tensor = if tensor.requires_grad() {
            tensor.detach()?
        } else {
            tensor
        };
        self.buffers.push(Param {
            name,
            tensor: tensor.clone(),
        });
        Ok(tensor)
    }

    /// Registers a parameter; names must be unique.
    pub fn insert(&mut self, name: String, tensor: Tensor) -> Result<Tensor> {
        self.check_free(&name)?;
        let tensor = if tensor.requires_grad() && tensor.is_leaf() {
            tensor
        } else {
            tensor.into_parameter()?
        };
        self.params.push(Param {
            name,
            tensor: tensor.clone(),
        });
        Ok(tensor)
    }

    /// All parameter values concatenated in store order.
    pub fn flatten_values(&self) -> Result<Vec<f32>> {
        let mut out = vec![0.0; self.numel()];
        let mut at = 0;
        for p in &self.params {
            let n = p.tensor.numel();
            p.tensor.copy_to_slice(&mut out[at..at + n])?;
            at += n;
        }
        Ok(out)
    }

    /// Overwrites all parameter values from a flat buffer in store order.
    pub fn load_flat_values(&self, flat: &[f32]) -> Result<()> {
        if flat.len() != self.numel() {
            return Err(MlError::invalid(
                "load_flat_values",
                format!("{} values for {} weights", flat.len(), self.numel()),
            ));
        }
        let mut at = 0;
        for p in &self.params {
            let n = p.tensor.numel();
            p.tensor.copy_from_slice(&flat[at..at + n])?;
            at += n;
        }
        Ok(())
    }

    /// All buffer values concatenated in creation order.
    pub fn flatten_buffers(&self) -> Result<Vec<f32>> {
        let mut out = vec![0.0; self.buffer_numel()];
        let mut at = 0;
        for p in &self.buffers {
            let n = p.tensor.numel();
            p.tensor.copy_to_slice(&mut out[at..at + n])?;
            at += n;
        }
        Ok(out)
    }

    /// Overwrites all buffer values from a flat buffer in creation order.
    pub fn load_flat_buffers(&self, flat: &[f32]) -> Result<()> {
        if flat.len() != self.buffer_numel() {
            return Err(MlError::invalid(
                "load_flat_buffers",
                format!(
                    "{} values for {} buffer values",
                    flat.len(),
                    self.buffer_numel()
                ),
            ));
        }
        let mut at = 0;
        for p in &self.buffers {
            let n = p.tensor.numel();
            p.tensor.copy_from_slice(&flat[at..at + n])?;
            at += n;
        }
        Ok(())
    }

    /// A 64-bit FNV-1a checksum of the bits of all parameter values, then all buffer values,
    /// to compare replicas cheaply.
    pub fn checksum(&self) -> Result<u64> {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let values = self.flatten_values()?;
        for v in values.into_iter().chain(self.flatten_buffers()?) {
            for b in v.to_bits().to_le_bytes() {
                hash ^= b as u64;
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        Ok(hash)
    }
}

/// Creates parameters under a dotted name prefix (candle's `VarBuilder` idea).
pub struct ParamBuilder<'a> {
    store: &'a mut ParamStore,
    prefix: String,
    rng: &'a mut Rng,
    device: Device,
}

impl<'a> ParamBuilder<'a> {
    /// A builder at the root of `store`, initializing from `rng` on `device`.
    pub fn new(store: &'a mut ParamStore, rng: &'a mut Rng, device: Device) -> Self {
        ParamBuilder {
            store,
            prefix: String::new(),
            rng,
            device,
        }
    }

    /// A builder whose parameters are named `<prefix>.<name>.…`.
    pub fn sub(&mut self, name: impl AsRef<str>) -> ParamBuilder<'_> {
        ParamBuilder {
            prefix: self.full_name(name.as_ref()),
            store: self.store,
            rng: self.rng,
            device: self.device,
        }
    }

    fn full_name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// The device new parameters are created on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The random source for initial values.
    pub fn rng(&mut self) -> &mut Rng {
        self.rng
    }

    /// Registers `init` as the parameter `<prefix>.<name>` and returns it.
    pub fn param(&mut self, name: &str, init: Tensor) -> Result<Tensor> {
        let full = self.full_name(name);
        self.store.insert(full, init)
    }

    /// A parameter drawn uniformly from `[-bound, bound)`.
    pub fn uniform(&mut self, name: &str, shape: &[usize], bound: f32) -> Result<Tensor> {
        let t = Tensor::uniform(shape, -bound, bound, self.rng, self.device)?;
        self.param(name, t)
    }

    /// A parameter filled with `value`.
    pub fn constant(&mut self, name: &str, shape: &[usize], value: f32) -> Result<Tensor> {
        let t = Tensor::full(shape, value, self.device)?;
        self.param(name, t)
    }

    /// Registers the buffer `<prefix>.<name>` (non-trainable state, see [`ParamStore`]),
    /// filled with `value`, and returns it.
    pub fn buffer(&mut self, name: &str, shape: &[usize], value: f32) -> Result<Tensor> {
        let t = Tensor::full(shape, value, self.device)?;
        let full = self.full_name(name);
        self.store.insert_buffer(full, t)
    }
}
