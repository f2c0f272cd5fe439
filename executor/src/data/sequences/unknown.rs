//! [`SingletonUnk`]: training the unknown token's row. With the default vocabulary every token
//! of the training split has an id, so `<unk>` would never be trained and every test token
//! outside the vocabulary would reach the model as an untrained row. Instead, each token the
//! training split holds only once (the vocabulary's last ids, from
//! `Preprocessing::singletons_from`) reaches the model as `<unk>` with probability
//! `data.vocab.singleton_unk` (0.5 by default), as sequence taggers commonly do.
//!
//! The choice is a hash of (seed, epoch, the row's tokens, the token's place): the same each
//! time an epoch is run, whatever the executors, the order rows are drawn in or a `--resume`,
//! and new each epoch. Evaluation and prediction never replace a token.

use ringflow_core::data::vocab::UNK;

/// Replacing the tokens seen once by `<unk>` during one epoch's training.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SingletonUnk {
    /// The chance of a replacement, as a threshold on a 64-bit hash.
    threshold: u64,
    /// (seed, epoch) mixed.
    key: u64,
}

impl SingletonUnk {
    /// The replacement of epoch `epoch` of a job seeded `seed` at probability `rate`; `None`
    /// when `rate` is 0.
    pub fn for_epoch(rate: f32, seed: u64, epoch: u64) -> Option<SingletonUnk> {
        if rate.is_nan() || rate <= 0.0 {
            return None;
        }
        let threshold = match rate >= 1.0 {
            true => u64::MAX,
            false => (f64::from(rate) * 2f64.powi(64)) as u64,
        };
        let key = mix(seed ^ mix(epoch.wrapping_add(0x6a09_e667_f3bc_c909)));
        Some(SingletonUnk { threshold, key })
    }

    /// Replaces by `<unk>` the chosen tokens of one row whose ids are `from` or more.
    pub fn apply(&self, from: u32, tokens: &mut [f32]) {
        let from = from as f32;
        let mut row = 0xcbf2_9ce4_8422_2325u64;
        for t in tokens.iter() {
            row = (row ^ u64::from(t.to_bits())).wrapping_mul(0x0100_0000_01b3);
        }
        for (i, t) in tokens.iter_mut().enumerate() {
            if *t >= from && mix(self.key ^ row ^ mix(i as u64)) < self.threshold {
                *t = UNK as f32;
            }
        }
    }
}

/// SplitMix64's finalizer: a well-spread 64-bit hash of `x`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Vec<f32> {
        (0..4000).map(|i| (2 + i % 50) as f32).collect()
    }

    #[test]
    fn about_the_rate_of_the_rare_tokens_become_unk_and_no_other() {
        let unk = SingletonUnk::for_epoch(0.5, 42, 0).unwrap();
        let mut tokens = row();
        unk.apply(30, &mut tokens);
        let (rare, common): (Vec<_>, Vec<_>) =
            tokens.iter().zip(row()).partition(|(_, was)| *was >= 30.0);
        assert!(
            common.iter().all(|(now, was)| **now == *was),
            "common tokens stay"
        );
        let replaced = rare.iter().filter(|(now, _)| **now == UNK as f32).count();
        let share = replaced as f64 / rare.len() as f64;
        assert!(
            (0.45..0.55).contains(&share),
            "{share} of the rare tokens became <unk>"
        );
    }

    #[test]
    fn the_choice_repeats_within_an_epoch_and_changes_with_it() {
        let run = |seed, epoch| {
            let mut tokens = row();
            SingletonUnk::for_epoch(0.5, seed, epoch)
                .unwrap()
                .apply(2, &mut tokens);
            tokens
        };
        assert_eq!(run(42, 3), run(42, 3));
        assert_ne!(run(42, 3), run(42, 4));
        assert_ne!(run(42, 3), run(7, 3));
        assert!(SingletonUnk::for_epoch(0.0, 42, 3).is_none());
        let mut all = row();
        SingletonUnk::for_epoch(1.0, 42, 3)
            .unwrap()
            .apply(2, &mut all);
        assert!(all.iter().all(|t| *t == UNK as f32));
    }
}
