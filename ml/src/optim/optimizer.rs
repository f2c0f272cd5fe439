//! The optimizer spec and its in-place update loop.

use serde::{Deserialize, Serialize};

use crate::autodiff::GradStore;
use crate::backend::cpu;
use crate::backend::{AdagradStep, AdamStep, SgdStep, Storage};
use crate::error::{MlError, Result};
use crate::nn::ParamStore;
use crate::optim::groups::{self, ParamGroup, ParamHyper};
use crate::tensor::Tensor;

/// `train.optimizer` in the job spec, e.g. `{ kind = "adagrad", lr = 0.05 }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimizerSpec {
    /// Stochastic gradient descent with optional (Nesterov) momentum.
    Sgd {
        /// Learning rate (default 0.01).
        #[serde(default = "defaults::sgd_lr")]
        lr: f32,
        /// Momentum factor (default 0: plain SGD).
        #[serde(default)]
        momentum: f32,
        /// Dampening for momentum (default 0).
        #[serde(default)]
        dampening: f32,
        /// Nesterov momentum (default false; needs momentum > 0 and dampening 0).
        #[serde(default)]
        nesterov: bool,
        /// L2 penalty (default 0).
        #[serde(default)]
        weight_decay: f32,
        /// Parameter groups with their own learning rate and weight decay (default none).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        groups: Vec<ParamGroup>,
    },
    /// Adagrad.
    Adagrad {
        /// Learning rate (default 0.01).
        #[serde(default = "defaults::sgd_lr")]
        lr: f32,
        /// Starting value of the squared-gradient accumulator (default 0.1, TensorFlow's).
        #[serde(default = "defaults::initial_accumulator")]
        initial_accumulator: f32,
        /// Added to the denominator (default 1e-10).
        #[serde(default = "defaults::adagrad_eps")]
        eps: f32,
        /// L2 penalty (default 0).
        #[serde(default)]
        weight_decay: f32,
        /// Parameter groups with their own learning rate and weight decay (default none).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        groups: Vec<ParamGroup>,
    },
    /// Adam with bias correction; `weight_decay` is an L2 term in the gradient.
    Adam {
        /// Learning rate (default 0.001).
        #[serde(default = "defaults::adam_lr")]
        lr: f32,
        /// First-moment decay (default 0.9).
        #[serde(default = "defaults::beta1")]
        beta1: f32,
        /// Second-moment decay (default 0.999).
        #[serde(default = "defaults::beta2")]
        beta2: f32,
        /// Added to the denominator (default 1e-8).
        #[serde(default = "defaults::adam_eps")]
        eps: f32,
        /// L2 penalty (default 0).
        #[serde(default)]
        weight_decay: f32,
        /// Parameter groups with their own learning rate and weight decay (default none).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        groups: Vec<ParamGroup>,
    },
    /// AdamW: Adam with decoupled weight decay.
    Adamw {
        /// Learning rate (default 0.001).
        #[serde(default = "defaults::adam_lr")]
        lr: f32,
        /// First-moment decay (default 0.9).
        #[serde(default = "defaults::beta1")]
        beta1: f32,
        /// Second-moment decay (default 0.999).
        #[serde(default = "defaults::beta2")]
        beta2: f32,
        /// Added to the denominator (default 1e-8).
        #[serde(default = "defaults::adam_eps")]
        eps: f32,
        /// Decoupled weight decay (default 0.01).
        #[serde(default = "defaults::adamw_decay")]
        weight_decay: f32,
        /// Parameter groups with their own learning rate and weight decay (default none).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        groups: Vec<ParamGroup>,
    },
}

mod defaults {
    pub fn sgd_lr() -> f32 {
        0.01
    }
    pub fn adam_lr() -> f32 {
        0.001
    }
    pub fn initial_accumulator() -> f32 {
        0.1
    }
    pub fn adagrad_eps() -> f32 {
        1e-10
    }
    pub fn beta1() -> f32 {
        0.9
    }
    pub fn beta2() -> f32 {
        0.999
    }
    pub fn adam_eps() -> f32 {
        1e-8
    }
    pub fn adamw_decay() -> f32 {
        0.01
    }
}

impl Default for OptimizerSpec {
    fn default() -> Self {
        OptimizerSpec::Sgd {
            lr: defaults::sgd_lr(),
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            groups: Vec::new(),
        }
    }
}

impl OptimizerSpec {
    /// The base learning rate.
    pub fn lr(&self) -> f32 {
        match *self {
            OptimizerSpec::Sgd { lr, .. }
            | OptimizerSpec::Adagrad { lr, .. }
            | OptimizerSpec::Adam { lr, .. }
            | OptimizerSpec::Adamw { lr, .. } => lr,
        }
    }

    /// The weight decay of parameters in no group.
    pub fn weight_decay(&self) -> f32 {
        match *self {
            OptimizerSpec::Sgd { weight_decay, .. }
            | OptimizerSpec::Adagrad { weight_decay, .. }
            | OptimizerSpec::Adam { weight_decay, .. }
            | OptimizerSpec::Adamw { weight_decay, .. } => weight_decay,
        }
    }

    /// The parameter groups (`train.optimizer.groups`).
    pub fn groups(&self) -> &[ParamGroup] {
        match self {
            OptimizerSpec::Sgd { groups, .. }
            | OptimizerSpec::Adagrad { groups, .. }
            | OptimizerSpec::Adam { groups, .. }
            | OptimizerSpec::Adamw { groups, .. } => groups,
        }
    }

    /// The kind's name as written in a job spec.
    pub fn kind(&self) -> &'static str {
        match self {
            OptimizerSpec::Sgd { .. } => "sgd",
            OptimizerSpec::Adagrad { .. } => "adagrad",
            OptimizerSpec::Adam { .. } => "adam",
            OptimizerSpec::Adamw { .. } => "adamw",
        }
    }

    /// Checks the hyper-parameters; errors name the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, why: &str| {
            Err(MlError::spec(format!(
                "train.optimizer.{field} {why} (optimizer {})",
                self.kind()
            )))
        };
        let lr = self.lr();
        if !(lr.is_finite() && lr > 0.0) {
            return bad("lr", &format!("must be a positive number, not {lr}"));
        }
        for (i, group) in self.groups().iter().enumerate() {
            group.validate(i)?;
        }
        match *self {
            OptimizerSpec::Sgd {
                momentum,
                dampening,
                nesterov,
                ..
            } => {
                if !(0.0..1.0).contains(&momentum) {
                    return bad("momentum", "must be in [0, 1)");
                }
                if nesterov && (momentum == 0.0 || dampening != 0.0) {
                    return bad("nesterov", "needs momentum > 0 and dampening = 0");
                }
            }
            OptimizerSpec::Adagrad {
                initial_accumulator,
                ..
            } => {
                if initial_accumulator < 0.0 {
                    return bad("initial_accumulator", "must not be negative");
                }
            }
            OptimizerSpec::Adam { beta1, beta2, .. }
            | OptimizerSpec::Adamw { beta1, beta2, .. } => {
                if !(0.0..1.0).contains(&beta1) {
                    return bad("beta1", "must be in [0, 1)");
                }
                if !(0.0..1.0).contains(&beta2) {
                    return bad("beta2", "must be in [0, 1)");
                }
            }
        }
        Ok(())
    }

    /// How many buffers of the parameters' size this optimizer keeps as state (0 for plain
    /// SGD, 1 for SGD with momentum and Adagrad, 2 for Adam and AdamW).
    pub fn state_buffers(&self) -> usize {
        self.slot_names().len()
    }

    /// The names of the per-parameter state buffers this optimizer keeps.
    fn slot_names(&self) -> &'static [&'static str] {
        match self {
            OptimizerSpec::Sgd { momentum, .. } if *momentum > 0.0 => &["momentum"],
            OptimizerSpec::Sgd { .. } => &[],
            OptimizerSpec::Adagrad { .. } => &["sum"],
            OptimizerSpec::Adam { .. } | OptimizerSpec::Adamw { .. } => &["exp_avg", "exp_avg_sq"],
        }
    }
}

/// A named tensor's shape and values on the host, as checkpoints store them.
pub type NamedValues = (String, Vec<usize>, Vec<f32>);

fn missing_slot(name: &str) -> MlError {
    MlError::spec(format!("optimizer state {name:?} was not allocated"))
}

/// An optimizer bound to a model's parameters.
pub struct Optimizer {
    spec: OptimizerSpec,
    params: Vec<(String, Tensor)>,
    /// `slots[i][j]`: state buffer `j` of parameter `i`.
    slots: Vec<Vec<Storage>>,
    /// Parameter `i`'s learning-rate factor and weight decay (`train.optimizer.groups`).
    hyper: Vec<ParamHyper>,
    steps: u64,
}

impl Optimizer {
    /// Creates the optimizer and its state buffers for every trainable parameter in `params`
    /// (frozen ones get none); errors name a parameter group that does not fit the model.
    pub fn new(spec: OptimizerSpec, params: &ParamStore) -> Result<Optimizer> {
        spec.validate()?;
        let hyper = groups::resolve(spec.groups(), spec.lr(), spec.weight_decay(), params)?;
        let mut slots = Vec::with_capacity(params.len());
        for p in params.iter() {
            let mut bufs = Vec::new();
            for _ in spec.slot_names() {
                let mut s = Storage::zeros(p.tensor.shape(), p.tensor.device())?;
                if let OptimizerSpec::Adagrad {
                    initial_accumulator,
                    ..
                } = spec
                {
                    s.fill(initial_accumulator)?;
                }
                bufs.push(s);
            }
            slots.push(bufs);
        }
        Ok(Optimizer {
            spec,
            params: params
                .iter()
                .map(|p| (p.name.clone(), p.tensor.clone()))
                .collect(),
            slots,
            hyper,
            steps: 0,
        })
    }

    /// The spec this optimizer was made from.
    pub fn spec(&self) -> &OptimizerSpec {
        &self.spec
    }

    /// How many steps have been taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Whether [`Optimizer::backward`] updates weights inside the backward pass: plain SGD, no
    /// momentum and no weight decay (the step then needs nothing but the gradient).
    pub fn updates_in_backward(&self) -> bool {
        self.spec.groups().is_empty()
            && matches!(self.spec, OptimizerSpec::Sgd { momentum, weight_decay, .. }
            if momentum == 0.0 && weight_decay == 0.0)
    }

    /// The backward pass of `loss` into `grads` for a step at learning rate `lr`, which
    /// [`Optimizer::step`] at the same `lr` and with the same store then completes.
    ///
    /// Where [`Optimizer::updates_in_backward`], the pass carries the store's SGD step
    /// ([`GradStore::set_sgd_in_backward`]): a weight of this optimizer's used once whose
    /// gradient is a matrix product (a dense layer's `xᵀ · dy`) is updated inside that product,
    /// `w -= lr · xᵀ · dy` written onto the weight from the GEMM's registers on the CPU: its
    /// gradient is never stored (it reads as zeros until the next pass), and the update's
    /// separate pass over the weight and its gradient is saved. The step then updates the other
    /// parameters. The weights end bit for bit as after [`Tensor::backward_into`] and the step,
    /// on every CPU kernel and blocking (see `matmul_scaled_onto` in the CPU backend).
    /// Parameters whose gradient already holds values (a pass without [`GradStore::zero`]
    /// before) are left to the step. Otherwise this is the plain backward pass.
    ///
    /// Gradients that must be read or combined before the update (clipped, all-reduced) rule
    /// this out: run [`Tensor::backward_into`] then.
    pub fn backward(&self, loss: &Tensor, lr: f32, grads: &mut GradStore) -> Result<()> {
        if !self.updates_in_backward() {
            return loss.backward_into(grads);
        }
        let params: Vec<Tensor> = self.params.iter().map(|(_, p)| p.clone()).collect();
        grads.set_sgd_in_backward(Some((lr, &params)));
        let pass = loss.backward_into(grads);
        grads.set_sgd_in_backward(None);
        pass
    }

    /// Updates every parameter from its gradient in `grads` with learning rate `lr` (from a
    /// [`super::Schedule`]); gradients are left as they are. Parameters that
    /// [`Optimizer::backward`] already updated are skipped.
    pub fn step(&mut self, lr: f32, grads: &mut GradStore) -> Result<()> {
        self.steps += 1;
        let first = self.steps == 1;
        let step_no = self.steps;
        let spec = self.spec.clone();
        let each = self.params.iter().zip(self.slots.iter_mut());
        for (((_, param), slots), hyper) in each.zip(&self.hyper) {
            if grads.applied(param) {
                continue;
            }
            let lr = lr * hyper.lr_factor;
            let weight_decay = hyper.weight_decay;
            grads.with_buffer(param, |grad| {
                let value = &mut *param.write();
                let mut bufs = slots.iter_mut();
                match spec {
                    OptimizerSpec::Sgd {
                        momentum,
                        dampening,
                        nesterov,
                        ..
                    } => Storage::sgd_update(
                        value,
                        grad,
                        bufs.next(),
                        SgdStep {
                            lr,
                            momentum,
                            dampening,
                            weight_decay,
                            nesterov,
                            first,
                        },
                    ),
                    OptimizerSpec::Adagrad { eps, .. } => {
                        let acc = bufs.next().ok_or_else(|| missing_slot("sum"))?;
                        Storage::adagrad_update(
                            value,
                            grad,
                            acc,
                            AdagradStep {
                                lr,
                                eps,
                                weight_decay,
                            },
                        )
                    }
                    OptimizerSpec::Adam {
                        beta1, beta2, eps, ..
                    }
                    | OptimizerSpec::Adamw {
                        beta1, beta2, eps, ..
                    } => {
                        let m = bufs.next().ok_or_else(|| missing_slot("exp_avg"))?;
                        let v = bufs.next().ok_or_else(|| missing_slot("exp_avg_sq"))?;
                        Storage::adam_update(
                            value,
                            grad,
                            m,
                            v,
                            AdamStep {
                                lr,
                                beta1,
                                beta2,
                                eps,
                                weight_decay,
                                decoupled: matches!(spec, OptimizerSpec::Adamw { .. }),
                                step: step_no,
                            },
                        )
                    }
                }
            })?;
        }
        Ok(())
    }

    /// The state buffers as `(name, shape, values)` with names `<param>.<slot>`, for checkpoints.
    pub fn state_tensors(&self) -> Result<Vec<NamedValues>> {
        let names = self.spec.slot_names();
        let mut out = Vec::new();
        for ((pname, _), slots) in self.params.iter().zip(&self.slots) {
            for (slot, s) in names.iter().zip(slots) {
                let host = s.to_host()?;
                out.push((
                    format!("{pname}.{slot}"),
                    host.shape().to_vec(),
                    cpu::slice(&host).to_vec(),
                ));
            }
        }
        Ok(out)
    }

    /// Restores the state saved by [`Optimizer::state_tensors`] and the step count. Every
    /// buffer is checked before any is replaced, so a refusal leaves the optimizer as it was.
    pub fn load_state(
        &mut self,
        steps: u64,
        mut lookup: impl FnMut(&str) -> Option<(Vec<usize>, Vec<f32>)>,
    ) -> Result<()> {
        let names = self.spec.slot_names();
        let mut found = Vec::new();
        for ((pname, _), slots) in self.params.iter().zip(&self.slots) {
            for (slot, s) in names.iter().zip(slots) {
                let key = format!("{pname}.{slot}");
                let (shape, values) = lookup(&key)
                    .ok_or_else(|| MlError::spec(format!("optimizer state {key:?} is missing")))?;
                if shape != s.shape() {
                    return Err(MlError::spec(format!(
                        "optimizer state {key:?} has shape {shape:?}, the parameter {:?}",
                        s.shape()
                    )));
                }
                found.push((shape, values));
            }
        }
        let mut found = found.into_iter();
        for (_, slots) in self.params.iter().zip(self.slots.iter_mut()) {
            for (_, s) in names.iter().zip(slots.iter_mut()) {
                let (shape, values) = found.next().expect("one per slot, checked above");
                *s = Storage::from_host(cpu::from_vec(&shape, values), s.device())?;
            }
        }
        self.steps = steps;
        Ok(())
    }
}
