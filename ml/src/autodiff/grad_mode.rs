//! The thread-local switch that turns graph recording off (evaluation, inference).

use std::cell::Cell;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// True unless the current thread is inside [`no_grad`] or holds a [`NoGradGuard`].
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Runs `f` without recording a graph: ops produce plain tensors, as under `torch.no_grad()`.
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _guard = NoGradGuard::new();
    f()
}

/// Disables graph recording on this thread until dropped (then restores the previous mode).
#[derive(Debug)]
pub struct NoGradGuard {
    previous: bool,
}

impl NoGradGuard {
    /// Turns recording off.
    pub fn new() -> Self {
        let previous = GRAD_ENABLED.with(|g| g.replace(false));
        NoGradGuard { previous }
    }
}

impl Default for NoGradGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.previous));
    }
}
