//! Named parameters, non-trainable buffers, and the builder that creates them.

use crate::device::Device;
use crate::error::{MlError, Result};
use crate::nn::pattern::{NamePattern, any_matches};
use crate::rng::Rng;
use crate::tensor::Tensor;

/// One named tensor of a model: a trainable parameter, a frozen one, or a buffer.
#[derive(Clone, Debug)]
pub struct Param {
    /// Dotted path, e.g. `layers.0.weight`.
    pub name: String,
    /// The values: for a trainable parameter a leaf that requires gradients, for a frozen one
    /// or a buffer a plain tensor.
    pub tensor: Tensor,
    /// True when `model.freeze` names it: it keeps its values while the model trains.
    pub frozen: bool,
    /// How PyTorch's module for the layer stores it, relative to ringflow's layout.
    pub torch: TorchLayout,
}

/// How PyTorch (and an ONNX `Gemm` with `transB = 1`) stores a tensor, relative to ringflow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TorchLayout {
    /// The same shape and order of values.
    #[default]
    Same,
    /// The transpose of ringflow's matrix: `nn.Linear.weight` is `[out, in]` where ringflow
    /// keeps `[in, out]`.
    Transposed,
}

/// All parameters of a model, in creation order, and its buffers.
///
/// **Buffers** are a model's non-trainable state, such as a batch norm's running mean and
/// variance (PyTorch's `register_buffer`): they have no gradient, the optimizer never sees them,
/// and gradient all-reduce leaves them out, but checkpoints save and restore them with the
/// parameters and [`ParamStore::checksum`] covers them, so two replicas compare equal only when
/// their buffers are equal too.
///
/// **Frozen parameters** (`model.freeze`) are kept apart from the trainable ones: they are
/// plain tensors that autodiff never differentiates, so they get no gradient, no optimizer
/// state and no all-reduce, and [`ParamStore::iter`], [`ParamStore::len`] and
/// [`ParamStore::numel`] leave them out; checkpoints save them like the rest
/// ([`ParamStore::named`]). A buffer under a frozen name is frozen too (a frozen batch norm
/// keeps its running statistics).
#[derive(Clone, Debug, Default)]
pub struct ParamStore {
    params: Vec<Param>,
    frozen: Vec<Param>,
    buffers: Vec<Param>,
    freeze: Vec<NamePattern>,
}

impl ParamStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose parameters and buffers named by any of `freeze` are registered
    /// frozen.
    pub fn with_freeze(freeze: Vec<NamePattern>) -> Self {
        ParamStore {
            freeze,
            ..Self::default()
        }
    }

    /// True when a tensor called `name` is (or would be) registered frozen.
    pub fn is_frozen(&self, name: &str) -> bool {
        any_matches(&self.freeze, name)
    }

    /// An error naming the first `model.freeze` pattern that names no tensor of the model (a
    /// misspelt pattern would otherwise freeze nothing and go unnoticed).
    pub fn check_freeze_used(&self) -> Result<()> {
        let unused = self
            .freeze
            .iter()
            .find(|p| !self.named().any(|(_, t)| p.matches(&t.name)));
        match unused {
            Some(p) => Err(MlError::spec(format!(
                "model.freeze entry {:?} names no parameter of the model; its parameters are \
                 {}",
                p.as_str(),
                name_sample(self.named().map(|(_, t)| t.name.as_str()))
            ))),
            None => Ok(()),
        }
    }

    /// The frozen parameters in creation order.
    pub fn frozen(&self) -> impl Iterator<Item = &Param> {
        self.frozen.iter()
    }

    /// Every named tensor a checkpoint holds, with what it is (`"parameter"`, `"frozen
    /// parameter"` or `"buffer"`): the trainable parameters, the frozen ones, then the buffers.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, &Param)> {
        let params = self.params.iter().map(|p| ("parameter", p));
        let frozen = self.frozen.iter().map(|p| ("frozen parameter", p));
        params
            .chain(frozen)
            .chain(self.buffers.iter().map(|p| ("buffer", p)))
    }

    /// The tensor called `name`, whatever it is.
    pub fn get_named(&self, name: &str) -> Option<&Tensor> {
        self.named()
            .find(|(_, p)| p.name == name)
            .map(|(_, p)| &p.tensor)
    }

    /// The trainable parameters in creation order.
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
        if self.get_named(name).is_some() {
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
            frozen: self.is_frozen(&name),
            name,
            tensor: tensor.clone(),
            torch: TorchLayout::Same,
        });
        Ok(tensor)
    }

    /// Registers a parameter; names must be unique. A name `model.freeze` names is registered
    /// frozen: the returned tensor then requires no gradient.
    pub fn insert(&mut self, name: String, tensor: Tensor) -> Result<Tensor> {
        self.insert_as(name, tensor, TorchLayout::Same)
    }

    /// [`ParamStore::insert`], recording how PyTorch lays the tensor out.
    pub fn insert_as(
        &mut self,
        name: String,
        tensor: Tensor,
        torch: TorchLayout,
    ) -> Result<Tensor> {
        self.check_free(&name)?;
        let frozen = self.is_frozen(&name);
        let tensor = match (frozen, tensor.requires_grad()) {
            (true, true) => tensor.detach()?,
            (true, false) => tensor,
            (false, true) if tensor.is_leaf() => tensor,
            (false, _) => tensor.into_parameter()?,
        };
        let param = Param {
            name,
            tensor: tensor.clone(),
            frozen,
            torch,
        };
        match frozen {
            true => self.frozen.push(param),
            false => self.params.push(param),
        }
        Ok(tensor)
    }

    /// All parameter values concatenated in store order.
    pub fn flatten_values(&self) -> Result<Vec<f32>> {
        flatten(self.params.iter())
    }

    /// Overwrites all parameter values from a flat buffer in store order.
    pub fn load_flat_values(&self, flat: &[f32]) -> Result<()> {
        load_flat("load_flat_values", self.params.iter(), flat)
    }

    /// All buffer values concatenated in creation order.
    pub fn flatten_buffers(&self) -> Result<Vec<f32>> {
        flatten(self.buffers.iter())
    }

    /// Overwrites all buffer values from a flat buffer in creation order.
    pub fn load_flat_buffers(&self, flat: &[f32]) -> Result<()> {
        load_flat("load_flat_buffers", self.buffers.iter(), flat)
    }

    /// The values of the buffers that training updates (every buffer but the frozen ones),
    /// concatenated in creation order: what replicas average.
    pub fn flatten_trained_buffers(&self) -> Result<Vec<f32>> {
        flatten(self.buffers.iter().filter(|p| !p.frozen))
    }

    /// Overwrites the values of the buffers that training updates from a flat buffer, the
    /// inverse of [`ParamStore::flatten_trained_buffers`].
    pub fn load_trained_buffers(&self, flat: &[f32]) -> Result<()> {
        let trained = self.buffers.iter().filter(|p| !p.frozen);
        load_flat("load_trained_buffers", trained, flat)
    }

    /// The frozen parameters' values concatenated in creation order.
    pub fn flatten_frozen(&self) -> Result<Vec<f32>> {
        flatten(self.frozen.iter())
    }

    /// A 64-bit FNV-1a checksum of the bits of all parameter values (trainable, then frozen),
    /// then all buffer values, to compare replicas cheaply.
    pub fn checksum(&self) -> Result<u64> {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let values = self.flatten_values()?;
        let frozen = self.flatten_frozen()?;
        for v in values
            .into_iter()
            .chain(frozen)
            .chain(self.flatten_buffers()?)
        {
            for b in v.to_bits().to_le_bytes() {
                hash ^= b as u64;
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        Ok(hash)
    }
}

/// The values of `params` concatenated.
fn flatten<'p>(params: impl Iterator<Item = &'p Param> + Clone) -> Result<Vec<f32>> {
    let mut out = vec![0.0; params.clone().map(|p| p.tensor.numel()).sum()];
    let mut at = 0;
    for p in params {
        let n = p.tensor.numel();
        p.tensor.copy_to_slice(&mut out[at..at + n])?;
        at += n;
    }
    Ok(out)
}

/// Overwrites the values of `params` from `flat`, which must hold exactly as many.
fn load_flat<'p>(
    what: &'static str,
    params: impl Iterator<Item = &'p Param> + Clone,
    flat: &[f32],
) -> Result<()> {
    let wanted: usize = params.clone().map(|p| p.tensor.numel()).sum();
    if flat.len() != wanted {
        return Err(MlError::invalid(
            what,
            format!("{} values for {wanted} values", flat.len()),
        ));
    }
    let mut at = 0;
    for p in params {
        let n = p.tensor.numel();
        p.tensor.copy_from_slice(&flat[at..at + n])?;
        at += n;
    }
    Ok(())
}

/// Up to eight of `names`, quoted, and how many more there are.
fn name_sample<'n>(names: impl Iterator<Item = &'n str>) -> String {
    let names: Vec<&str> = names.collect();
    let shown: Vec<String> = names.iter().take(8).map(|n| format!("{n:?}")).collect();
    match names.len() {
        0 => "none".into(),
        n if n > 8 => format!("{} and {} more", shown.join(", "), n - 8),
        _ => shown.join(", "),
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

    /// Registers `init` as the parameter `<prefix>.<name>` and returns it (frozen, needing no
    /// gradient, when `model.freeze` names it).
    pub fn param(&mut self, name: &str, init: Tensor) -> Result<Tensor> {
        self.param_as(name, init, TorchLayout::Same)
    }

    /// [`ParamBuilder::param`] for a tensor PyTorch lays out as `torch` says (what the
    /// PyTorch export writes and `model.init_from` reads).
    pub fn param_as(&mut self, name: &str, init: Tensor, torch: TorchLayout) -> Result<Tensor> {
        let full = self.full_name(name);
        self.store.insert_as(full, init, torch)
    }

    /// True when `model.freeze` names the tensor `<prefix>.<name>`.
    pub fn is_frozen(&self, name: &str) -> bool {
        self.store.is_frozen(&self.full_name(name))
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
