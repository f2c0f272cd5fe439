//! The stock `ringflow` binary: the command line with the built-in model kinds.

/// Notes the size of an allocation that fails, so that an executor that runs out of memory
/// tells the driver so before it aborts.
#[global_allocator]
static ALLOCATOR: ringflow::executor::last_words::ReportingAllocator =
    ringflow::executor::last_words::ReportingAllocator;

fn main() -> std::process::ExitCode {
    ringflow::cli::main(ringflow::ml::nn::ModelRegistry::default())
}
