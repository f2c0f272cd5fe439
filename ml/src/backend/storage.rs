//! [`Storage`]: a tensor's elements on whichever device holds them, and the one dispatch from it
//! to that device's backend.
//!
//! Each op of [`Storage`] is declared next to its backend trait (`elementwise.rs` holds
//! [`ElementwiseOps`](super::elementwise::ElementwiseOps) and `Storage::unary`, ...) and is one
//! call of [`dispatch!`]: it unwraps every operand to the same backend, runs the backend's method
//! and wraps the result back, and it is the only place that finds operands on different
//! backends.

use super::cpu::CpuArray;
use super::cuda::CudaStorage;

/// A tensor's elements on one device, always dense and row-major.
#[derive(Debug)]
pub enum Storage {
    /// Host memory.
    Cpu(CpuArray),
    /// GPU memory (uninhabited unless built with the `cuda` feature).
    Cuda(CudaStorage),
}

impl Storage {
    /// Borrows the host array of a CPU storage.
    pub fn as_cpu(&self) -> Option<&CpuArray> {
        match self {
            Storage::Cpu(a) => Some(a),
            Storage::Cuda(_) => None,
        }
    }
}

/// Turns what a backend's method returns into what the matching [`Storage`] method returns: a
/// backend's storage becomes a [`Storage`], values that hold no storage stay as they are.
pub(crate) trait Lift {
    /// The [`Storage`]-side type.
    type Lifted;

    /// Wraps `self`.
    fn lift(self) -> Self::Lifted;
}

impl Lift for CpuArray {
    type Lifted = Storage;

    fn lift(self) -> Storage {
        Storage::Cpu(self)
    }
}

impl Lift for CudaStorage {
    type Lifted = Storage;

    fn lift(self) -> Storage {
        Storage::Cuda(self)
    }
}

impl Lift for () {
    type Lifted = ();

    fn lift(self) {}
}

impl Lift for f64 {
    type Lifted = f64;

    fn lift(self) -> f64 {
        self
    }
}

impl<A: Lift, B: Lift> Lift for (A, B) {
    type Lifted = (A::Lifted, B::Lifted);

    fn lift(self) -> Self::Lifted {
        (self.0.lift(), self.1.lift())
    }
}

impl<A: Lift, B: Lift, C: Lift> Lift for (A, B, C) {
    type Lifted = (A::Lifted, B::Lifted, C::Lifted);

    fn lift(self) -> Self::Lifted {
        (self.0.lift(), self.1.lift(), self.2.lift())
    }
}

/// `dispatch!("op", (a = expr, b = expr, ...) => body)` matches every operand (a `&Storage` or
/// `&mut Storage`) against one backend's variant, binds its backend storage to the given name,
/// evaluates `body` (a call of a backend trait's method, written once for every backend) and
/// lifts its `Result` back to [`Storage`] terms. Operands on different backends fail with the
/// error of [`crate::device::mixed_devices`] naming `op`; operands on two GPUs are the CUDA
/// backend's to refuse. With one operand the op's name is left out: nothing can be mixed.
macro_rules! dispatch {
    (($name:ident = $value:expr) => $body:expr) => {
        match $value {
            $crate::backend::storage::Storage::Cpu($name) => {
                ($body).map($crate::backend::storage::Lift::lift)
            }
            $crate::backend::storage::Storage::Cuda($name) => {
                ($body).map($crate::backend::storage::Lift::lift)
            }
        }
    };
    ($op:expr, ($($name:ident = $value:expr),+) => $body:expr) => {
        match ($($value,)+) {
            ($($crate::backend::storage::Storage::Cpu($name),)+) => {
                ($body).map($crate::backend::storage::Lift::lift)
            }
            ($($crate::backend::storage::Storage::Cuda($name),)+) => {
                ($body).map($crate::backend::storage::Lift::lift)
            }
            ($($name,)+) => Err($crate::device::mixed_devices($op, &[$($name.device()),+])),
        }
    };
}
pub(crate) use dispatch;
