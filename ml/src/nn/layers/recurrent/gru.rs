//! The gated recurrent unit (PyTorch's formulation, with the candidate's recurrent bias inside
//! the reset gate's product).

use super::{Recurrent, hidden_of, project_and_scan};
use crate::error::{MlError, Result};
use crate::nn::{Forward, Module, ParamBuilder};
use crate::tensor::Tensor;

/// A gated recurrent unit: `[n, T, in]` → `[n, T, hidden]`. With gates reset `r`, update `z` and
/// candidate `c`: `r = σ(x·Wr + h·Ur + b)`, `z = σ(x·Wz + h·Uz + b)`,
/// `c = tanh(x·Wc + bᵢ + r ⊙ (h·Uc + bₕ))`, `h' = (1 − z) ⊙ c + z ⊙ h`.
pub struct Gru {
    /// `[in, 3·hidden]`: the input's weights of reset, update and candidate.
    pub w_input: Tensor,
    /// `[hidden, 3·hidden]`: the previous output's weights, same order.
    pub w_hidden: Tensor,
    /// `[3·hidden]`: added to the input's projection.
    pub bias_input: Tensor,
    /// `[3·hidden]`: added to the recurrent product (the candidate's part inside the reset).
    pub bias_hidden: Tensor,
    hidden: usize,
}

impl Gru {
    /// A layer with weights drawn from `U(±1/√hidden)` (PyTorch's) and zero biases.
    pub fn new(b: &mut ParamBuilder<'_>, inputs: usize, hidden: usize) -> Result<Gru> {
        if inputs == 0 || hidden == 0 {
            return Err(MlError::spec(format!(
                "a gru layer needs at least one input and one hidden unit, not {inputs} → {hidden}"
            )));
        }
        let bound = 1.0 / (hidden as f32).sqrt();
        Ok(Gru {
            w_input: b.uniform("w_input", &[inputs, 3 * hidden], bound)?,
            w_hidden: b.uniform("w_hidden", &[hidden, 3 * hidden], bound)?,
            bias_input: b.constant("bias_input", &[3 * hidden], 0.0)?,
            bias_hidden: b.constant("bias_hidden", &[3 * hidden], 0.0)?,
            hidden,
        })
    }

    /// A layer from its weights (`[in, 3H]`, `[H, 3H]`) and biases (`[3H]` each); an error
    /// names a shape that does not fit the others.
    pub fn from_parts(
        (w_input, w_hidden): (Tensor, Tensor),
        (bias_input, bias_hidden): (Tensor, Tensor),
    ) -> Result<Gru> {
        let biases = [&bias_input, &bias_hidden];
        let hidden = hidden_of("gru", 3, (&w_input, &w_hidden), &biases)?;
        Ok(Gru {
            w_input,
            w_hidden,
            bias_input,
            bias_hidden,
            hidden,
        })
    }

    /// Hidden units (the output's last axis).
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// One step: the state `[h]` from the step's projected input `[n, 3H]`: one GEMM (the
    /// recurrent product with its bias), one fused gate op.
    fn cell(&self, input: &Tensor, state: &[Tensor]) -> Result<Vec<Tensor>> {
        let recurrent = state[0].linear(&self.w_hidden, &self.bias_hidden)?;
        Ok(vec![input.gru_cell(&recurrent, &state[0])?])
    }
}

impl Recurrent for Gru {
    fn run(&self, x: &Tensor, lengths: Option<&[usize]>, reverse: bool) -> Result<Tensor> {
        let weights = (&self.w_input, &self.bias_input);
        project_and_scan(
            "gru",
            (x, lengths, reverse),
            weights,
            (self.hidden, 1),
            |i, s| self.cell(i, s),
        )
    }
}

impl Module for Gru {
    /// First to last, over the real steps [`Forward::lengths`] gives.
    fn forward(&self, input: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        self.run(input, ctx.lengths, false)
    }
}
