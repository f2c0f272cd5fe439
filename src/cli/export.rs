//! `ringflow export`: a saved model in another framework's format.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use ringflow_interop::{SavedModelDir, onnx, torch};
use ringflow_ml::nn::ModelRegistry;

#[derive(Args)]
pub struct ExportArgs {
    /// The saved model's directory (`<checkpoint_dir>/model`), on this machine.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,

    /// The format to write.
    #[arg(long, value_enum)]
    format: ExportFormat,

    /// The file to write: `model.onnx` (its metadata also goes beside it as `<PATH>.json`), or
    /// for `torch` the state_dict, `model.safetensors` (its module beside it, `model.py`).
    #[arg(long, value_name = "PATH")]
    output: PathBuf,

    /// Replace an output (and its `.json`) that already exists.
    #[arg(long)]
    overwrite: bool,
}

/// The formats `--format` takes.
#[derive(Clone, Copy, ValueEnum)]
enum ExportFormat {
    /// ONNX (opset 17), for onnxruntime, TensorRT, Triton.
    Onnx,
    /// PyTorch: a state_dict (safetensors) in PyTorch's names and layouts, and `model.py`.
    Torch,
}

pub fn run(args: ExportArgs, registry: ModelRegistry) -> anyhow::Result<ExitCode> {
    let saved = SavedModelDir::open(&args.model, &registry)?;
    let (bytes, beside) = match args.format {
        ExportFormat::Onnx => {
            let exported = onnx::export(&saved)?;
            exported.write(&args.output, args.overwrite)?;
            (
                exported.model.len(),
                onnx::Exported::sidecar_path(&args.output),
            )
        }
        ExportFormat::Torch => {
            let exported = torch::export(&saved)?;
            exported.write(&args.output, args.overwrite)?;
            let module = torch::TorchExport::module_path(&args.output);
            (exported.state_dict.len(), module)
        }
    };
    println!(
        "exported {} to {} ({bytes} bytes; and {})",
        args.model.display(),
        args.output.display(),
        beside.display()
    );
    Ok(ExitCode::SUCCESS)
}
