//! The numerics of a task's model: every task (training, evaluation, prediction) runs its
//! model's ops with the matrix-product precision (`train.matmul_precision`) and the Winograd
//! switch (`train.winograd`) of its own spec, entered on the task's thread, so that neither two
//! tasks of one executor nor a job and the next change each other's numerics; and says how
//! this executor computes them.

use ringflow_core::spec::TrainSpec;
use ringflow_ml::{Bf16Products, Device, MatmulPrecision, Numerics};

/// The numerics a task of spec `train` runs its model with, having logged how this executor,
/// on `device`, computes bf16 products, and when convolutions keep off Winograd.
pub fn task_numerics(train: &TrainSpec, device: Device) -> Numerics {
    if !train.winograd && device.is_cpu() {
        tracing::info!("convolutions without Winograd's algorithm (train.winograd = false)");
    }
    say_matmul_precision(train.matmul_precision, device);
    Numerics {
        matmul_precision: train.matmul_precision,
        winograd: train.winograd,
    }
}

/// Logs how this executor, on `device`, computes products at `precision`.
fn say_matmul_precision(precision: MatmulPrecision, device: Device) {
    if precision == MatmulPrecision::F32 {
        return;
    }
    match (device, ringflow_ml::cpu_bf16_products()) {
        (Device::Cuda(_), _) => tracing::warn!(
            "train.matmul_precision = \"bf16\" applies to CPU executors: this one runs on {device} \
             and keeps f32 products"
        ),
        (_, Bf16Products::Native) => {
            tracing::info!("matrix products in bf16 with f32 sums (AVX512_BF16)")
        }
        (_, Bf16Products::Emulated) => tracing::info!(
            "matrix products in bf16 with f32 sums, emulated: this CPU lacks AVX512_BF16, so they \
             run at the f32 rate"
        ),
    }
}
