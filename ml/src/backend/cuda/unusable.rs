//! [`Unusable`]: why a GPU cannot be used, the clause that follows "device cuda:N cannot be
//! used:" in the backend's error. A leaf: the device and the kernels' compiler both name their
//! failures with it.

/// Why a GPU cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// A CUDA library cannot be loaded.
    #[error("{library} was not found")]
    MissingLibrary {
        /// The library, as its users know it (`libcuda`, cuBLAS, NVRTC).
        library: &'static str,
    },
    /// The driver did not start.
    #[error("the CUDA driver failed to start ({reason})")]
    DriverFailed {
        /// The driver's error.
        reason: String,
    },
    /// The ordinal names no device of this machine.
    #[error("{}", no_such_device(*.count, .visible.as_deref()))]
    NoSuchDevice {
        /// The devices this process sees.
        count: usize,
        /// `CUDA_VISIBLE_DEVICES`, when set.
        visible: Option<String>,
    },
    /// A step of opening the device failed.
    #[error("cannot {step}: {reason}")]
    Step {
        /// What was being done ("create a context", "start cuBLAS", ...).
        step: &'static str,
        /// The CUDA library's error.
        reason: String,
    },
    /// A compiled kernel is not in the loaded module.
    #[error("cannot load kernel {name}: {reason}")]
    Kernel {
        /// The kernel's name.
        name: &'static str,
        /// The driver's error.
        reason: String,
    },
    /// NVRTC refused the kernels' source.
    #[error("NVRTC could not compile the kernels for {arch}: {log}")]
    Compile {
        /// The virtual architecture compiled for (`compute_90`).
        arch: String,
        /// NVRTC's log or error.
        log: String,
    },
}

/// The error for a failed `step` of opening a device, from the library's error.
pub fn step<E: std::fmt::Display>(step: &'static str) -> impl Fn(E) -> Unusable {
    move |e| Unusable::Step {
        step,
        reason: e.to_string(),
    }
}

/// The sentence for a device ordinal past the `count` devices this process sees.
fn no_such_device(count: usize, visible: Option<&str>) -> String {
    let visible = visible
        .map(|v| format!(" with CUDA_VISIBLE_DEVICES={v:?}"))
        .unwrap_or_default();
    match count {
        0 => format!("this machine has no CUDA device{visible}"),
        n => format!("this machine has {n} CUDA device(s){visible}, numbered from 0"),
    }
}
