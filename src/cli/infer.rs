//! `ringflow eval` and `ringflow predict`: a saved model applied to a data set by executors in
//! parallel, on a local cluster or a running driver's executors.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use ringflow_core::pb;
use ringflow_driver::observe::console;
use ringflow_ml::nn::ModelRegistry;

use super::submit::absolute_if_here;
use super::{local, submit};
use crate::local::LocalConfig;

/// Where an evaluation or prediction runs.
#[derive(Args)]
pub struct ClusterArgs {
    /// The saved model's directory (`<checkpoint_dir>/model` of a training job; path or URL).
    #[arg(long, value_name = "DIR")]
    model: String,

    /// The data: a Parquet file, directory, glob or URL, with the columns the model was trained
    /// on (raw columns when the model has a `data.sql`, which is applied again).
    #[arg(long, value_name = "PATH")]
    data: String,

    /// Executors to spread the data over on a local cluster (default 1).
    #[arg(long, default_value_t = 1)]
    executors: usize,

    /// Run on this driver's executors instead of a local cluster.
    #[arg(long, env = "RINGFLOW_DRIVER")]
    driver: Option<String>,

    #[command(flatten)]
    security: super::security::SecurityArgs,

    /// Write the summary as JSON to this file.
    #[arg(long, value_name = "PATH")]
    summary_json: Option<PathBuf>,
}

#[derive(Args)]
pub struct EvalArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
}

#[derive(Args)]
pub struct PredictArgs {
    #[command(flatten)]
    cluster: ClusterArgs,

    /// The output directory (path or URL), new or empty unless --overwrite, and neither
    /// inside nor around --data or --model: each executor writes `part-NNNNN.parquet`.
    #[arg(long, value_name = "PATH")]
    output: String,

    /// A column to keep next to each prediction (e.g. a row id).
    #[arg(long = "id", value_name = "COLUMN")]
    id_column: Option<String>,

    /// Replace an output that already holds anything (an earlier run's parts, other files)
    /// whole with this run's predictions. Without it such an output is refused.
    #[arg(long)]
    overwrite: bool,
}

/// Runs `request` (its kind and, for prediction, its output settings filled in) with the
/// model, data and executors of `cluster`.
fn run(
    cluster: ClusterArgs,
    request: pb::SubmitRequest,
    registry: ModelRegistry,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(cluster.executors >= 1, "--executors must be at least 1");
    let executors = u32::try_from(cluster.executors)
        .map_err(|_| anyhow::anyhow!("--executors {} is too large", cluster.executors))?;
    if cluster.driver.is_none() {
        crate::local::check_executors(cluster.executors, "--executors")?;
    }
    super::check_summary_json(cluster.summary_json.as_deref())?;
    let output = request.output;
    let request = pb::SubmitRequest {
        protocol_version: ringflow_core::PROTOCOL_VERSION,
        model_dir: absolute_if_here(&cluster.model),
        data: absolute_if_here(&cluster.data),
        executors,
        output: if cluster.driver.is_some() && !output.contains("://") && !output.starts_with('/') {
            std::env::current_dir()?.join(&output).display().to_string()
        } else {
            output
        },
        ..request
    };
    match &cluster.driver {
        Some(url) => submit::follow(
            url,
            &cluster.security.client()?,
            request,
            cluster.summary_json.as_ref(),
            console::for_stderr(),
        ),
        None => local::run_local(
            LocalConfig::from(&cluster),
            registry,
            request,
            cluster.summary_json.as_ref(),
            console::for_stderr(),
        ),
    }
}

pub fn eval(args: EvalArgs, registry: ModelRegistry) -> anyhow::Result<ExitCode> {
    let request = pb::SubmitRequest {
        kind: pb::TaskKind::Eval as i32,
        ..Default::default()
    };
    run(args.cluster, request, registry)
}

pub fn predict(args: PredictArgs, registry: ModelRegistry) -> anyhow::Result<ExitCode> {
    let request = pb::SubmitRequest {
        kind: pb::TaskKind::Predict as i32,
        output: args.output,
        id_column: args.id_column.unwrap_or_default(),
        overwrite: args.overwrite,
        ..Default::default()
    };
    run(args.cluster, request, registry)
}

impl From<&ClusterArgs> for LocalConfig {
    /// The local cluster `eval` and `predict` start without `--driver`: `--executors`
    /// processes sharing this machine's cores, no web UI.
    fn from(args: &ClusterArgs) -> LocalConfig {
        LocalConfig {
            log_filter: super::log_filter().to_string(),
            ..LocalConfig::new(args.executors)
        }
    }
}
