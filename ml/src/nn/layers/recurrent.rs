//! Recurrent layers over `[batch, steps, features]` sequences of different lengths: [`Lstm`]
//! and its two-direction form [`BiLstm`].
//!
//! The input's projection for every step of every sequence is one GEMM (`[n·T, in] × [in, 4H]`,
//! with the bias); each step then adds the recurrent product (`[n, H] × [H, 4H]`) and applies the
//! gates (input, forget, cell, output: PyTorch's order and initialization). A step at or past a
//! sequence's length neither changes that sequence's state nor produces output (zeros there),
//! so a padded batch gives each sequence what it would get alone, and padding gets no
//! gradient. The gates are built from the engine's ops, so every device runs them.

use crate::error::{MlError, Result};
use crate::nn::{Forward, Module, ParamBuilder};
use crate::tensor::Tensor;

/// A long short-term memory layer: `[n, T, in]` → `[n, T, hidden]`, the output at every step.
pub struct Lstm {
    /// `[in, 4·hidden]`: the input's weights of the four gates side by side.
    pub w_input: Tensor,
    /// `[hidden, 4·hidden]`: the previous output's weights of the four gates.
    pub w_hidden: Tensor,
    /// `[4·hidden]`.
    pub bias: Tensor,
    hidden: usize,
}

impl Lstm {
    /// A layer with weights drawn from `U(±1/√hidden)` (PyTorch's) and a zero bias.
    pub fn new(b: &mut ParamBuilder<'_>, inputs: usize, hidden: usize) -> Result<Lstm> {
        if inputs == 0 || hidden == 0 {
            return Err(MlError::spec(format!(
                "an lstm layer needs at least one input and one hidden unit, not {inputs} → \
                 {hidden}"
            )));
        }
        let bound = 1.0 / (hidden as f32).sqrt();
        Ok(Lstm {
            w_input: b.uniform("w_input", &[inputs, 4 * hidden], bound)?,
            w_hidden: b.uniform("w_hidden", &[hidden, 4 * hidden], bound)?,
            bias: b.constant("bias", &[4 * hidden], 0.0)?,
            hidden,
        })
    }

    /// A layer from its weights (`[in, 4H]`, `[H, 4H]`, `[4H]`); an error names a shape that
    /// does not fit the others.
    pub fn from_parts(w_input: Tensor, w_hidden: Tensor, bias: Tensor) -> Result<Lstm> {
        let hidden = w_hidden.shape().first().copied().unwrap_or(0);
        let fits = w_input.rank() == 2
            && w_input.shape()[1] == 4 * hidden
            && w_hidden.shape() == [hidden, 4 * hidden]
            && bias.shape() == [4 * hidden];
        if hidden == 0 || !fits {
            return Err(MlError::invalid(
                "lstm",
                format!(
                    "weights {:?}, {:?} and bias {:?} are not [in, 4H], [H, 4H] and [4H]",
                    w_input.shape(),
                    w_hidden.shape(),
                    bias.shape()
                ),
            ));
        }
        Ok(Lstm {
            w_input,
            w_hidden,
            bias,
            hidden,
        })
    }

    /// Hidden units (the output's last axis).
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The outputs `[n, T, hidden]` of `x` (`[n, T, in]`). `lengths` (one per sequence, each at
    /// most `T`) mark the real steps, `None` meaning all; `reverse` runs each sequence from its
    /// last real step to its first.
    pub fn run(&self, x: &Tensor, lengths: Option<&[usize]>, reverse: bool) -> Result<Tensor> {
        let [n, steps, inputs] = sequence_shape(x, lengths)?;
        let hidden = self.hidden;
        let projected = x
            .reshape(&[n * steps, inputs])?
            .linear(&self.w_input, &self.bias)?
            .reshape(&[n, steps, 4 * hidden])?;
        let mut h = Tensor::zeros(&[n, hidden], x.device())?;
        let mut c = h.clone();
        let mut outputs: Vec<Option<Tensor>> = vec![None; steps];
        let order: Vec<usize> = if reverse {
            (0..steps).rev().collect()
        } else {
            (0..steps).collect()
        };
        for step in order {
            let gates = projected
                .narrow(1, step, 1)?
                .reshape(&[n, 4 * hidden])?
                .add(&h.matmul(&self.w_hidden)?)?;
            let gate = |k: usize| gates.narrow(1, k * hidden, hidden);
            let (i, f) = (gate(0)?.sigmoid()?, gate(1)?.sigmoid()?);
            let (g, o) = (gate(2)?.tanh()?, gate(3)?.sigmoid()?);
            let c_new = f.mul(&c)?.add(&i.mul(&g)?)?;
            let h_new = o.mul(&c_new.tanh()?)?;
            let out = match step_mask(lengths, step, x)? {
                None => {
                    (c, h) = (c_new, h_new);
                    h.clone()
                }
                Some(real) => {
                    c = c.add(&c_new.sub(&c)?.mul(&real)?)?;
                    h = h.add(&h_new.sub(&h)?.mul(&real)?)?;
                    h_new.mul(&real)?
                }
            };
            outputs[step] = Some(out.reshape(&[n, 1, hidden])?);
        }
        let outputs: Vec<Tensor> = outputs.into_iter().flatten().collect();
        Tensor::concat(&outputs.iter().collect::<Vec<_>>(), 1)
    }
}

/// `[n, T, features]` of a sequence batch, after checking `lengths` against it.
fn sequence_shape(x: &Tensor, lengths: Option<&[usize]>) -> Result<[usize; 3]> {
    let &[n, steps, features] = x.shape() else {
        return Err(MlError::invalid(
            "lstm",
            format!("the input {:?} is not [batch, steps, features]", x.shape()),
        ));
    };
    if let Some(lengths) = lengths {
        if lengths.len() != n {
            return Err(MlError::invalid(
                "lstm",
                format!("{} lengths for a batch of {n} sequences", lengths.len()),
            ));
        }
        if let Some((row, &len)) = lengths.iter().enumerate().find(|(_, l)| **l > steps) {
            return Err(MlError::invalid(
                "lstm",
                format!("sequence {row} is {len} steps long, but the batch has {steps} steps"),
            ));
        }
    }
    Ok([n, steps, features])
}

/// `[n, 1]`: 1 for the sequences still running at `step`, 0 for those already over; `None`
/// when all are running (nothing to mask).
fn step_mask(lengths: Option<&[usize]>, step: usize, like: &Tensor) -> Result<Option<Tensor>> {
    let Some(lengths) = lengths else {
        return Ok(None);
    };
    if lengths.iter().all(|&l| l > step) {
        return Ok(None);
    }
    let real: Vec<f32> = lengths
        .iter()
        .map(|&l| if l > step { 1.0 } else { 0.0 })
        .collect();
    Tensor::from_vec(real, &[lengths.len(), 1], like.device()).map(Some)
}

impl Module for Lstm {
    /// Every step real, first to last.
    fn forward(&self, input: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        self.run(input, None, false)
    }
}

/// Two [`Lstm`]s, one reading each sequence forwards and one backwards, their outputs side by
/// side: `[n, T, 2·hidden]` (forward units first).
pub struct BiLstm {
    /// The forward direction.
    pub forward: Lstm,
    /// The backward direction.
    pub backward: Lstm,
}

impl BiLstm {
    /// Two directions of `hidden` units each, named `forward` and `backward` under `b`.
    pub fn new(b: &mut ParamBuilder<'_>, inputs: usize, hidden: usize) -> Result<BiLstm> {
        Ok(BiLstm {
            forward: Lstm::new(&mut b.sub("forward"), inputs, hidden)?,
            backward: Lstm::new(&mut b.sub("backward"), inputs, hidden)?,
        })
    }

    /// Both directions' outputs `[n, T, 2·hidden]`; see [`Lstm::run`] for `lengths`.
    pub fn run(&self, x: &Tensor, lengths: Option<&[usize]>) -> Result<Tensor> {
        let ahead = self.forward.run(x, lengths, false)?;
        let behind = self.backward.run(x, lengths, true)?;
        Tensor::concat(&[&ahead, &behind], 2)
    }
}

impl Module for BiLstm {
    /// Every step real.
    fn forward(&self, input: &Tensor, _: &mut Forward<'_>) -> Result<Tensor> {
        self.run(input, None)
    }
}
