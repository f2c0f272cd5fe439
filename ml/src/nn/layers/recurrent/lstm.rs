//! The long short-term memory layer (PyTorch's gates and initialization).

use super::{Recurrent, hidden_of, project_and_scan};
use crate::error::{MlError, Result};
use crate::nn::{Forward, Module, ParamBuilder};
use crate::tensor::Tensor;

/// A long short-term memory layer: `[n, T, in]` → `[n, T, hidden]`, the output at every step.
/// Gates in PyTorch's order: input, forget, cell, output.
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
        let hidden = hidden_of("lstm", 4, (&w_input, &w_hidden), &[&bias])?;
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

    /// One step: states `[h, c]` from the step's projected input `[n, 4H]`: one GEMM adding
    /// `h·W_h` to it, one fused gate op.
    fn cell(&self, input: &Tensor, state: &[Tensor]) -> Result<Vec<Tensor>> {
        let gates = input.addmm(&state[0], &self.w_hidden)?;
        let (h, c) = gates.lstm_cell(&state[1])?;
        Ok(vec![h, c])
    }
}

impl Recurrent for Lstm {
    fn run(&self, x: &Tensor, lengths: Option<&[usize]>, reverse: bool) -> Result<Tensor> {
        let weights = (&self.w_input, &self.bias);
        project_and_scan(
            "lstm",
            (x, lengths, reverse),
            weights,
            (self.hidden, 2),
            |i, s| self.cell(i, s),
        )
    }
}

impl Module for Lstm {
    /// First to last, over the real steps [`Forward::lengths`] gives.
    fn forward(&self, input: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        self.run(input, ctx.lengths, false)
    }
}
