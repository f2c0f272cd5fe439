//! The precision of a task's matrix products: every task (training, evaluation, prediction)
//! sets the process's setting from its spec's `train.matmul_precision` before it builds its
//! model, so that a long-lived executor never carries one job's setting into the next, and says
//! how this executor computes it.

use ringflow_ml::{Bf16Products, Device, MatmulPrecision};

/// Sets this process's matrix-product precision to `precision` and logs how this executor, on
/// `device`, computes bf16 products.
pub fn use_matmul_precision(precision: MatmulPrecision, device: Device) {
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
