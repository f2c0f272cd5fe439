//! A straggling rank, injected by the backup-worker tests.

use std::time::Duration;

use crate::error::{ExecutorError, Result, Unrunnable};

/// The environment variable of the test-only straggler ([`Straggler`]): `RANK:MS[:FRACTION]`
/// makes that rank (`*`: every rank) sleep `MS` milliseconds after its backward pass, in every
/// step or in the given fraction of them, like a slow or busy machine.
pub const STRAGGLER_ENV: &str = "RINGFLOW_TEST_STRAGGLER";

/// A test-only injected straggler, from [`STRAGGLER_ENV`]: `RANK:MS[:FRACTION]` delays rank
/// `RANK` (or every rank for `*`) by `MS` milliseconds in `FRACTION` of its steps (default all),
/// chosen by a hash of the rank and the global step, so runs are repeatable.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Straggler {
    delay: Duration,
    fraction: f64,
}

impl Straggler {
    /// The straggler the environment asks `rank` to be, if any.
    #[cfg(feature = "test-hooks")]
    pub fn from_env(rank: usize) -> Result<Option<Straggler>> {
        match std::env::var(STRAGGLER_ENV) {
            Ok(v) if !v.trim().is_empty() => Straggler::parse(&v, rank),
            _ => Ok(None),
        }
    }

    fn parse(value: &str, rank: usize) -> Result<Option<Straggler>> {
        let bad = || {
            ExecutorError::from(Unrunnable::Straggler {
                var: STRAGGLER_ENV,
                value: value.to_string(),
            })
        };
        let mut parts = value.split(':').map(str::trim);
        let who = parts.next().ok_or_else(bad)?;
        let ms: u64 = parts.next().and_then(|m| m.parse().ok()).ok_or_else(bad)?;
        let fraction = match parts.next() {
            Some(f) => f
                .parse::<f64>()
                .ok()
                .filter(|f| (0.0..=1.0).contains(f))
                .ok_or_else(bad)?,
            None => 1.0,
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        let mine = who == "*" || who.parse::<usize>().map_err(|_| bad())? == rank;
        Ok(mine.then(|| Straggler {
            delay: Duration::from_millis(ms),
            fraction,
        }))
    }

    /// The delay of `rank` at global step `step`.
    pub fn delay_at(&self, rank: usize, step: u64) -> Option<Duration> {
        // SplitMix64 of (rank, step): uniform enough to pick a fraction of the steps.
        let mut z = step ^ ((rank as u64) << 48) ^ 0x9E37_79B9_7F4A_7C15;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let draw = (z >> 11) as f64 / (1u64 << 53) as f64;
        (draw < self.fraction).then_some(self.delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn straggler_settings_parse_and_pick_their_fraction_of_steps() {
        assert_eq!(Straggler::parse("1:30", 0).unwrap(), None);
        let s = Straggler::parse("1:30", 1).unwrap().unwrap();
        assert!((0..100).all(|t| s.delay_at(1, t) == Some(Duration::from_millis(30))));
        let every = Straggler::parse("*:10:0.25", 3).unwrap().unwrap();
        let hit = (0..10_000)
            .filter(|&t| every.delay_at(3, t).is_some())
            .count();
        assert!((2_200..2_800).contains(&hit), "{hit} of 10000 steps");
        for bad in ["1", "x:10", "1:ten", "1:10:2", "1:10:0.5:9"] {
            let e = Straggler::parse(bad, 1).unwrap_err().to_string();
            assert!(e.contains(STRAGGLER_ENV), "{bad}: {e}");
        }
    }
}
