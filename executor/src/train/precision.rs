//! The numerics of a task's model: every task (training, evaluation, prediction) sets the
//! process's matrix-product precision (`train.matmul_precision`) and whether convolutions may
//! run Winograd's algorithm (`train.winograd`) from its spec before it builds its model, so that
//! a long-lived executor never carries one job's settings into the next, and says how this
//! executor computes them.

use ringflow_ml::{Bf16Products, Device, MatmulPrecision};
use ringflow_proto::spec::TrainSpec;

/// Sets this process's numerics from `train` and logs how this executor, on `device`, computes
/// bf16 products, and when convolutions keep off Winograd.
pub fn use_numerics(train: &TrainSpec, device: Device) {
    ringflow_ml::set_winograd(train.winograd);
    if !train.winograd && device.is_cpu() {
        tracing::info!("convolutions without Winograd's algorithm (train.winograd = false)");
    }
    use_matmul_precision(train.matmul_precision, device);
}

/// Sets this process's matrix-product precision to `precision` and logs how this executor, on
/// `device`, computes bf16 products.
fn use_matmul_precision(precision: MatmulPrecision, device: Device) {
    ringflow_ml::set_matmul_precision(precision);
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
