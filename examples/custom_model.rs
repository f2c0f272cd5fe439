//! A model of your own, trained by ringflow: a residual MLP registered as `kind = "residual_mlp"`.
//!
//! The program is the `ringflow` command line plus one model kind, so it works as driver,
//! executor and `local` exactly like the stock binary (its executors are this same program, so
//! they know the kind too):
//!
//! ```sh
//! cargo run --release --example custom_model -- local examples/custom_model.toml
//! ```

use std::process::ExitCode;

use ringflow::ml::nn::{
    Forward, Init, LayerNorm, Linear, ModelBuilder, ModelRegistry, ModelShape, ModelSpec, Module,
    ParamBuilder,
};
use ringflow::ml::{MlError, Result, Tensor};
use serde::Deserialize;

/// The fields of `[model]` for this kind; unknown keys are refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResidualMlpSpec {
    inputs: usize,
    hidden: usize,
    blocks: usize,
    outputs: usize,
}

impl ResidualMlpSpec {
    fn from(spec: &ModelSpec) -> Result<Self> {
        let s: ResidualMlpSpec =
            serde_json::from_value(serde_json::Value::Object(spec.params.clone()))
                .map_err(|e| MlError::spec(format!("model: {e}")))?;
        if s.inputs == 0 || s.hidden == 0 || s.outputs == 0 {
            return Err(MlError::spec(
                "model: inputs, hidden and outputs must be at least 1",
            ));
        }
        Ok(s)
    }
}

/// `h = relu(x·W_in)`, then `blocks` times `h = h + relu(norm(h·W_i))`, then `h·W_out`.
struct ResidualMlp {
    input: Linear,
    blocks: Vec<(Linear, LayerNorm)>,
    output: Linear,
}

impl Module for ResidualMlp {
    fn forward(&self, x: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        let mut h = self.input.forward(x, ctx)?.relu()?;
        for (linear, norm) in &self.blocks {
            let branch = norm.forward(&linear.forward(&h, ctx)?, ctx)?.relu()?;
            h = h.add(&branch)?;
        }
        self.output.forward(&h, ctx)
    }
}

struct ResidualMlpBuilder;

impl ModelBuilder for ResidualMlpBuilder {
    fn shape(&self, spec: &ModelSpec) -> Result<ModelShape> {
        let s = ResidualMlpSpec::from(spec)?;
        Ok(ModelShape::flat(s.inputs, s.outputs))
    }

    fn build(&self, spec: &ModelSpec, params: &mut ParamBuilder<'_>) -> Result<Box<dyn Module>> {
        let s = ResidualMlpSpec::from(spec)?;
        let relu = Some(ringflow::ml::nn::ActivationKind::Relu);
        let input = Linear::new(&mut params.sub("input"), s.inputs, s.hidden, Init::He, relu)?;
        let mut blocks = Vec::with_capacity(s.blocks);
        for i in 0..s.blocks {
            let mut scope = params.sub(format!("blocks.{i}"));
            let linear = Linear::new(&mut scope.sub("linear"), s.hidden, s.hidden, Init::He, relu)?;
            let norm = LayerNorm::new(&mut scope.sub("norm"), s.hidden, 1e-5)?;
            blocks.push((linear, norm));
        }
        let output = Linear::new(
            &mut params.sub("output"),
            s.hidden,
            s.outputs,
            Init::Glorot,
            None,
        )?;
        Ok(Box::new(ResidualMlp {
            input,
            blocks,
            output,
        }))
    }
}

/// As in the stock binary: an executor that runs out of memory says so to the driver.
#[global_allocator]
static ALLOCATOR: ringflow::executor::last_words::ReportingAllocator =
    ringflow::executor::last_words::ReportingAllocator;

fn main() -> ExitCode {
    let mut models = ModelRegistry::default();
    models.register("residual_mlp", ResidualMlpBuilder);
    ringflow::cli::main(models)
}
