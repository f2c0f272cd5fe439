//! The explicit, serializable random source used for initialization, dropout and shuffling.
//!
//! ringflow never draws from a global or thread-local generator: every random decision comes
//! from a [`Rng`] seeded from the job's `train.seed`, and its full state is saved in checkpoints,
//! so a resumed run draws exactly the numbers an uninterrupted one would have.

use rand::SeedableRng;

/// ChaCha with 8 rounds: fast, portable across platforms, and serializable with serde.
pub type Rng = rand_chacha::ChaCha8Rng;

/// A generator for `seed` on an independent `stream` (e.g. one per purpose or per rank), so
/// that draws for one purpose never shift the numbers another purpose sees.
pub fn seeded(seed: u64, stream: u64) -> Rng {
    let mut rng = Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// Well-known streams, so that every part of the system derives its numbers the same way.
pub mod streams {
    /// Parameter initialization.
    pub const INIT: u64 = 1;
    /// Dropout masks.
    pub const DROPOUT: u64 = 2;
    /// Partition order and the shuffle buffer.
    pub const SHUFFLE: u64 = 3;
    /// Random crops and flips of training images (`data.augment`).
    pub const AUGMENT: u64 = 4;
}
