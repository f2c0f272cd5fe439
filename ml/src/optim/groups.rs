//! `train.optimizer.groups`: parameters trained with their own learning rate and weight decay
//! (PyTorch's parameter groups), and the per-parameter settings they resolve to.
//!
//! ```toml
//! [train.optimizer]
//! kind = "adam"
//! lr = 0.001
//! groups = [{ params = "layers.9.*", lr = 0.01, weight_decay = 0.0 }]
//! ```
//!
//! A group's `lr` follows the learning-rate schedule and `train.lr_scaling` as the base `lr`
//! does (the step's rate times `group.lr / lr`); a parameter in no group uses the base values.

use serde::{Deserialize, Serialize};

use crate::error::{MlError, Result};
use crate::nn::{NamePattern, ParamStore};

/// One entry of `train.optimizer.groups`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamGroup {
    /// The name pattern (or list of them) of the group's parameters ([`NamePattern`]).
    pub params: GroupParams,
    /// The group's learning rate (default: the optimizer's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f32>,
    /// The group's weight decay (default: the optimizer's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f32>,
}

/// A group's `params`: one name pattern or a list of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GroupParams {
    /// `params = "layers.9.*"`.
    One(String),
    /// `params = ["layers.8", "layers.9"]`.
    Many(Vec<String>),
}

impl GroupParams {
    fn texts(&self) -> &[String] {
        match self {
            GroupParams::One(text) => std::slice::from_ref(text),
            GroupParams::Many(texts) => texts,
        }
    }
}

impl ParamGroup {
    /// Checks the group's values; `index` is its place in the list, for the error.
    pub fn validate(&self, index: usize) -> Result<()> {
        self.patterns(index)?;
        if self.params.texts().is_empty() {
            return Err(MlError::spec(format!(
                "train.optimizer.groups[{index}].params names no parameter: give a pattern such \
                 as \"layers.9.*\""
            )));
        }
        if let Some(lr) = self.lr
            && !(lr.is_finite() && lr > 0.0)
        {
            return Err(MlError::spec(format!(
                "train.optimizer.groups[{index}].lr must be a positive number, not {lr}"
            )));
        }
        if let Some(wd) = self.weight_decay
            && !(wd.is_finite() && wd >= 0.0)
        {
            return Err(MlError::spec(format!(
                "train.optimizer.groups[{index}].weight_decay must be a number ≥ 0, not {wd}"
            )));
        }
        Ok(())
    }

    fn patterns(&self, index: usize) -> Result<Vec<NamePattern>> {
        let field = format!("train.optimizer.groups[{index}].params");
        NamePattern::parse_all(&field, self.params.texts())
    }

    fn describe(&self, index: usize) -> String {
        format!(
            "train.optimizer.groups[{index}] (params {})",
            self.params.texts().join(", ")
        )
    }
}

/// The learning rate (as a factor of the step's) and weight decay of one parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamHyper {
    /// The step's learning rate is multiplied by this (1 outside groups).
    pub lr_factor: f32,
    /// The parameter's weight decay.
    pub weight_decay: f32,
}

/// The settings of every trainable parameter of `params`, in store order, from `groups` over
/// the base `lr` and `weight_decay`. Errors name a group that names no trainable parameter
/// (saying when the ones it names are frozen) and a parameter two groups name.
pub fn resolve(
    groups: &[ParamGroup],
    lr: f32,
    weight_decay: f32,
    params: &ParamStore,
) -> Result<Vec<ParamHyper>> {
    let patterns = groups
        .iter()
        .enumerate()
        .map(|(i, g)| g.patterns(i))
        .collect::<Result<Vec<_>>>()?;
    let in_group = |i: usize, name: &str| patterns[i].iter().any(|p| p.matches(name));
    for (i, group) in groups.iter().enumerate() {
        if !params.iter().any(|p| in_group(i, &p.name)) {
            let frozen = params.frozen().any(|p| in_group(i, &p.name));
            let why = match frozen {
                true => "; the parameters it names are frozen by model.freeze",
                false => "",
            };
            return Err(MlError::spec(format!(
                "{} names no trainable parameter of the model{why}",
                group.describe(i)
            )));
        }
    }
    let mut out = Vec::with_capacity(params.len());
    for p in params.iter() {
        let mut named = (0..groups.len()).filter(|&i| in_group(i, &p.name));
        let hyper = match (named.next(), named.next()) {
            (Some(a), Some(b)) => {
                return Err(MlError::spec(format!(
                    "parameter {:?} is in two groups, {} and {}: a parameter may be in one",
                    p.name,
                    groups[a].describe(a),
                    groups[b].describe(b)
                )));
            }
            (Some(i), None) => ParamHyper {
                lr_factor: groups[i].lr.map_or(1.0, |g| g / lr),
                weight_decay: groups[i].weight_decay.unwrap_or(weight_decay),
            },
            (None, _) => ParamHyper {
                lr_factor: 1.0,
                weight_decay,
            },
        };
        out.push(hyper);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::nn::{Model, ModelRegistry, ModelSpec};
    use crate::optim::{Optimizer, OptimizerSpec};
    use crate::{Device, GradStore, Tensor, rng};

    fn model(freeze: &[&str]) -> Model {
        let spec = ModelSpec::new(
            "mlp",
            serde_json::json!({ "layers": [3, 4, 2], "activation": "tanh", "freeze": freeze }),
        )
        .unwrap();
        Model::build(&spec, &ModelRegistry::with_builtins(), 3, Device::Cpu).unwrap()
    }

    fn adam(groups: serde_json::Value) -> OptimizerSpec {
        serde_json::from_value(serde_json::json!({ "kind": "adam", "lr": 0.1, "groups": groups }))
            .unwrap()
    }

    /// Three steps of `optimizer` on a fixed batch; the values of every named tensor before and
    /// after.
    fn train(model: &Model, optimizer: &mut Optimizer) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let values = |m: &Model| m.params().named().map(|(_, p)| p.tensor.to_vec()).collect();
        let before = values(model);
        let x = Tensor::from_vec(vec![0.5, -1.0, 2.0, 1.0, 0.0, -0.5], &[2, 3], Device::Cpu);
        let y = Tensor::from_vec(vec![0.0, 1.0], &[2], Device::Cpu).unwrap();
        let mut r = rng::seeded(0, 0);
        let mut grads = GradStore::new();
        for _ in 0..3 {
            grads.zero();
            let out = model.forward(x.as_ref().unwrap(), true, &mut r).unwrap();
            let loss = crate::loss::cross_entropy(&out, &y).unwrap();
            loss.backward_into(&mut grads).unwrap();
            optimizer.step(0.1, &mut grads).unwrap();
        }
        (before, values(model))
    }

    #[test]
    fn frozen_parameters_get_no_gradient_and_no_state_and_keep_their_bits() {
        let m = model(&["layers.0"]);
        assert_eq!(m.params().len(), 2);
        assert!(m.params().frozen().all(|p| !p.tensor.requires_grad()));
        let mut opt = Optimizer::new(adam(serde_json::json!([])), m.params()).unwrap();
        let names: Vec<String> = opt
            .state_tensors()
            .unwrap()
            .into_iter()
            .map(|t| t.0)
            .collect();
        assert!(
            names.iter().all(|n| n.starts_with("layers.1.")),
            "{names:?}"
        );
        let (before, after) = train(&m, &mut opt);
        let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // Named order: trainable layers.1.{weight,bias}, then frozen layers.0.{weight,bias}.
        assert_ne!(before[0], after[0], "the trainable weight moves");
        assert_eq!(
            bits(&before[2]),
            bits(&after[2]),
            "the frozen weight keeps its bits"
        );
        assert_eq!(
            bits(&before[3]),
            bits(&after[3]),
            "the frozen bias keeps its bits"
        );
    }

    #[test]
    fn a_group_trains_at_its_own_rate() {
        let base = model(&[]);
        let mut opt = Optimizer::new(adam(serde_json::json!([])), base.params()).unwrap();
        let (b0, b1) = train(&base, &mut opt);
        let grouped = model(&[]);
        let groups = serde_json::json!([{ "params": "layers.1.*", "lr": 0.01 }]);
        let mut opt = Optimizer::new(adam(groups), grouped.params()).unwrap();
        let (g0, g1) = train(&grouped, &mut opt);
        let moved = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>();
        // Adam's first steps move each weight by about lr: the group's by a tenth as much.
        let ratio = moved(&g0[2], &g1[2]) / moved(&b0[2], &b1[2]);
        assert!(
            (0.05..0.2).contains(&ratio),
            "layers.1.weight moved {ratio} as far"
        );
        assert_eq!(g0[0].len(), b0[0].len());
    }

    #[test]
    fn groups_that_do_not_fit_the_model_are_named() {
        let m = model(&["layers.0"]);
        let cases = [
            (
                serde_json::json!([{ "params": "layers.7" }]),
                "names no trainable parameter",
            ),
            (
                serde_json::json!([{ "params": "layers.0" }]),
                "frozen by model.freeze",
            ),
            (
                serde_json::json!([{ "params": "layers.1" }, { "params": "*" }]),
                "is in two groups",
            ),
            (serde_json::json!([{ "params": [] }]), "names no parameter"),
            (
                serde_json::json!([{ "params": "*", "lr": -1.0 }]),
                "groups[0].lr",
            ),
        ];
        for (groups, want) in cases {
            let e = Optimizer::new(adam(groups.clone()), m.params())
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains(want), "{groups}: {e}");
        }
    }
}
