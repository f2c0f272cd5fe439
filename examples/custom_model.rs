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
    Activation, ActivationKind, Init, LayerNorm, Linear, ModelBuilder, ModelRegistry, ModelShape,
    ModelSpec, Module, ParamBuilder, Residual, Sequential,
};
use ringflow::ml::{MlError, Result};
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

struct ResidualMlpBuilder;

impl ModelBuilder for ResidualMlpBuilder {
    fn shape(&self, spec: &ModelSpec) -> Result<ModelShape> {
        let s = ResidualMlpSpec::from(spec)?;
        Ok(ModelShape::flat(s.inputs, s.outputs))
    }

    /// `h = relu(x·W_in)`, then `blocks` times `h = h + relu(norm(h·W_i))`, then `h·W_out`,
    /// from the stock layers (`Linear`, `LayerNorm`, `Activation`, `Residual`, `Sequential`);
    /// a `Module` of your own works the same way.
    fn build(&self, spec: &ModelSpec, params: &mut ParamBuilder<'_>) -> Result<Box<dyn Module>> {
        let s = ResidualMlpSpec::from(spec)?;
        let relu = ActivationKind::Relu;
        let mut net = Sequential::new();
        let mut input = params.sub("input");
        net.push(Linear::new(
            &mut input,
            s.inputs,
            s.hidden,
            Init::He,
            Some(relu),
        )?);
        net.push(Activation(relu));
        for i in 0..s.blocks {
            let mut scope = params.sub(format!("blocks.{i}"));
            let mut body = Sequential::new();
            let hidden = s.hidden;
            body.push(Linear::new(
                &mut scope.sub("linear"),
                hidden,
                hidden,
                Init::He,
                Some(relu),
            )?);
            body.push(LayerNorm::new(&mut scope.sub("norm"), hidden, 1e-5)?);
            body.push(Activation(relu));
            // Adds the block's input to its body's output.
            net.push(Residual {
                body: Box::new(body),
                shortcut: None,
            });
        }
        let mut output = params.sub("output");
        net.push(Linear::new(
            &mut output,
            s.hidden,
            s.outputs,
            Init::Glorot,
            None,
        )?);
        Ok(Box::new(net))
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
