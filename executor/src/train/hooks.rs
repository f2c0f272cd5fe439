//! Test hooks: behaviour that the integration tests inject into a training run, such as a
//! straggling rank for the backup-worker tests.
//!
//! They exist only with the `test-hooks` feature, which `cargo test` turns on for the CLI's
//! tests (the root package's dev-dependency on this crate) and which a release build never has:
//! without it [`TestHooks`] is empty and its methods do nothing, so no environment variable can
//! slow a production run.

use crate::error::Result;

#[cfg(any(test, feature = "test-hooks"))]
mod straggler;
#[cfg(any(test, feature = "test-hooks"))]
pub use straggler::{STRAGGLER_ENV, Straggler};

/// The hooks in force for one rank (none without the `test-hooks` feature).
#[derive(Clone, Debug, Default)]
pub struct TestHooks {
    #[cfg(feature = "test-hooks")]
    straggler: Option<Straggler>,
}

impl TestHooks {
    /// The hooks the environment asks `rank` to run (read once per ring, not per step); an
    /// error names the variable that is malformed.
    pub fn for_rank(rank: usize) -> Result<TestHooks> {
        #[cfg(feature = "test-hooks")]
        return Ok(TestHooks {
            straggler: Straggler::from_env(rank)?,
        });
        #[cfg(not(feature = "test-hooks"))]
        {
            let _ = rank;
            Ok(TestHooks::default())
        }
    }

    /// Runs after a step's backward pass: a straggler sleeps here, like a slow machine.
    pub fn after_backward(&self, rank: usize, step: u64) {
        #[cfg(feature = "test-hooks")]
        if let Some(delay) = self.straggler.and_then(|s| s.delay_at(rank, step)) {
            std::thread::sleep(delay);
        }
        #[cfg(not(feature = "test-hooks"))]
        let _ = (rank, step);
    }
}
