//! The stock `ringflow` binary: the command line with the built-in model kinds.

fn main() -> std::process::ExitCode {
    ringflow::cli::main(ringflow::ml::nn::ModelRegistry::default())
}
