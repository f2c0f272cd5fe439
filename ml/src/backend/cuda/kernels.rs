//! The kernels of `kernels.cu`, `image_kernels.cu` and `recurrent_kernels.cu`, compiled at run
//! time with NVRTC for the device's architecture and loaded once per device: no CUDA compiler is
//! needed to build ringflow.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, DeviceRepr};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx, compile_ptx_with_opts};

use super::unusable::{Unusable, step};

/// The CUDA C source: the general kernels, then the image and recurrent kernels that use their
/// helpers.
const SOURCE: &str = concat!(
    include_str!("kernels.cu"),
    "\n",
    include_str!("image_kernels.cu"),
    "\n",
    include_str!("recurrent_kernels.cu")
);

/// Every `extern "C"` kernel in [`SOURCE`].
const NAMES: &[&str] = &[
    "unary_fwd",
    "unary_bwd",
    "binary_same",
    "binary_row",
    "binary_bcast",
    "strided_copy",
    "affine",
    "add_assign",
    "fill",
    "scale",
    "sum_rows",
    "sum_to_shape",
    "sum_axis",
    "sum_lanes",
    "sum_squares",
    "softmax_fwd",
    "softmax_bwd",
    "cross_entropy_fwd",
    "cross_entropy_bwd",
    "bce_terms",
    "bce_bwd",
    "index_select",
    "index_add",
    "dropout_mask",
    "sgd_plain",
    "sgd_momentum",
    "adagrad",
    "adam",
    "im2col",
    "col2im",
    "conv_direct_fwd",
    "conv_direct_bwd_input",
    "conv_direct_bwd_weight",
    "max_pool_fwd",
    "max_pool_bwd",
    "avg_pool_fwd",
    "avg_pool_bwd",
    "channel_sum",
    "channel_bias_add",
    "bn_stats",
    "bn_forward",
    "bn_backward_sums",
    "bn_backward_dx",
    "lstm_cell_fwd",
    "lstm_cell_bwd",
    "gru_cell_fwd",
    "gru_cell_bwd",
];

/// The most dimensions a kernel's index arithmetic handles.
pub const MAX_DIMS: usize = 8;

/// `struct Strided` of `kernels.cu`: a shape and two sets of strides.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Strided {
    /// Dimensions in use.
    pub ndim: i32,
    /// The shape iterated over.
    pub dims: [i32; MAX_DIMS],
    /// Strides of the first operand.
    pub sa: [i64; MAX_DIMS],
    /// Strides of the second operand (or the output).
    pub sb: [i64; MAX_DIMS],
}

// SAFETY: `Strided` is `repr(C)`, plain old data, and laid out as the CUDA struct (an int, eight
// ints, then two arrays of eight 8-byte-aligned long longs).
unsafe impl DeviceRepr for Strided {}

/// `struct SlidingWindow` of `image_kernels.cu`: a convolution's or a pooling's sliding window
/// over planes of `in_h × in_w` (see `conv.rs` and `pool.rs`, which fill it from the backend's
/// geometries).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Input channels (a convolution's column matrix has `channels · kernel_h · kernel_w` rows).
    pub channels: i32,
    /// Input plane height.
    pub in_h: i32,
    /// Input plane width.
    pub in_w: i32,
    /// Output plane height.
    pub out_h: i32,
    /// Output plane width.
    pub out_w: i32,
    /// Window height.
    pub kernel_h: i32,
    /// Window width.
    pub kernel_w: i32,
    /// Vertical step between windows.
    pub stride_h: i32,
    /// Horizontal step between windows.
    pub stride_w: i32,
    /// Rows of padding above and below.
    pub pad_h: i32,
    /// Columns of padding left and right.
    pub pad_w: i32,
    /// Vertical spacing of the window's taps (1 for pooling).
    pub dil_h: i32,
    /// Horizontal spacing of the window's taps (1 for pooling).
    pub dil_w: i32,
}

// SAFETY: `SlidingWindow` is `repr(C)`, plain old data, and laid out as the CUDA struct
// (thirteen ints).
unsafe impl DeviceRepr for SlidingWindow {}

/// The kernels compiled to PTX for a virtual architecture such as `compute_90` (NVRTC only: no
/// GPU is involved).
fn ptx_for(arch: &str) -> Result<Ptx, Unusable> {
    compile_ptx_with_opts(
        SOURCE,
        CompileOptions {
            options: vec![format!("--gpu-architecture={arch}")],
            name: Some("ringflow_kernels.cu".into()),
            ..Default::default()
        },
    )
    .map_err(|e| Unusable::Compile {
        arch: arch.into(),
        log: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => other.to_string(),
        },
    })
}

/// The loaded kernels of one device.
pub struct Kernels {
    functions: HashMap<&'static str, CudaFunction>,
}

impl Kernels {
    /// Compiles the module for `ctx`'s device and loads every kernel.
    pub fn compile(ctx: &Arc<CudaContext>) -> Result<Kernels, Unusable> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(step("read the compute capability"))?;
        let arch = format!("compute_{major}{minor}");
        let started = std::time::Instant::now();
        let ptx = ptx_for(&arch)?;
        let module = ctx
            .load_module(ptx)
            .map_err(step("load the compiled kernels"))?;
        let mut functions = HashMap::new();
        for &name in NAMES {
            let f = module.load_function(name).map_err(|e| Unusable::Kernel {
                name,
                reason: e.to_string(),
            })?;
            functions.insert(name, f);
        }
        tracing::debug!(
            "compiled {} kernels for {arch} in {:.2} s",
            NAMES.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(Kernels { functions })
    }

    /// A kernel by name.
    pub fn get(&self, name: &str) -> Option<&CudaFunction> {
        self.functions.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_kernel_is_defined_in_the_source() {
        for name in NAMES {
            assert!(
                SOURCE.contains(&format!("__global__ void {name}(")),
                "{name} is not in the kernel sources"
            );
        }
        let defined = SOURCE.matches("__global__ void ").count();
        assert_eq!(
            defined,
            NAMES.len(),
            "a kernel in the kernel sources is not listed"
        );
        assert_eq!(
            std::mem::size_of::<Strided>(),
            4 + 4 * MAX_DIMS + 4 + 16 * MAX_DIMS
        );
        assert_eq!(std::mem::size_of::<SlidingWindow>(), 13 * 4);
    }

    /// NVRTC needs no GPU, so wherever `libnvrtc` can be loaded the CUDA C is compiled for the
    /// architectures ringflow targets (Ampere, Hopper) and every kernel must be in the PTX.
    #[test]
    fn kernels_compile_wherever_nvrtc_is_installed() {
        // SAFETY: only tries to load the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("skipping: NVRTC (libnvrtc.so) is not installed");
            return;
        }
        for arch in ["compute_80", "compute_90"] {
            let ptx = ptx_for(arch).unwrap_or_else(|e| panic!("{e}"));
            let text = ptx.to_src();
            for name in NAMES {
                assert!(
                    text.contains(&format!(".entry {name}(")),
                    "{name} is missing from the PTX for {arch}"
                );
            }
        }
    }
}
