//! `cluster.fusion`: how gradients are packed into buckets for the ring's all-reduce.
//!
//! Gradients are all-reduced in buckets while the backward pass still runs (tensor fusion).
//! Small buckets start reducing early but pay each all-reduce's latency; large ones use the
//! links better but start late. `cluster.fusion` is a bucket size in MiB (the first bucket is at
//! most 1 MiB, so reduction starts as soon as the last layers' gradients are ready), or
//! `"auto"` (Horovod's autotune): the first steps try a few sizes and keep the fastest.
//!
//! ```toml
//! [cluster]
//! fusion = "auto"   # or a size in MiB, e.g. 25 (the default)
//! ```

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The default bucket size, in MiB (PyTorch DDP's `bucket_cap_mb`).
pub const DEFAULT_BUCKET_MIB: f64 = 25.0;
/// The first bucket's largest size, in MiB.
pub const FIRST_BUCKET_MIB: f64 = 1.0;
/// The largest bucket size a spec may ask for, in MiB: a bucket is staged in host memory on
/// every rank, once per bucket.
pub const MAX_BUCKET_MIB: f64 = 1024.0;
/// The bucket sizes `"auto"` tries, in MiB.
pub const AUTO_CANDIDATES_MIB: [f64; 4] = [1.0, 4.0, 16.0, 64.0];

/// `cluster.fusion`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fusion {
    /// Buckets of this many MiB (the first one at most [`FIRST_BUCKET_MIB`]).
    Fixed(f64),
    /// The first steps try [`AUTO_CANDIDATES_MIB`] and keep the fastest.
    Auto,
}

impl Default for Fusion {
    fn default() -> Self {
        Fusion::Fixed(DEFAULT_BUCKET_MIB)
    }
}

/// A bucket plan's two sizes, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketSizes {
    /// The first bucket's limit: the last layers' gradients, reduced while most of backward is
    /// still ahead.
    pub first: usize,
    /// The other buckets' limit.
    pub rest: usize,
}

impl BucketSizes {
    /// Buckets of `mib` MiB, the first one at most [`FIRST_BUCKET_MIB`].
    pub fn of_mib(mib: f64) -> BucketSizes {
        let rest = mib_to_bytes(mib);
        BucketSizes {
            first: rest.min(mib_to_bytes(FIRST_BUCKET_MIB)),
            rest,
        }
    }
}

fn mib_to_bytes(mib: f64) -> usize {
    // Checked at load: finite, positive and at most MAX_BUCKET_MIB.
    (mib.clamp(0.0, MAX_BUCKET_MIB) * (1u64 << 20) as f64)
        .round()
        .max(4.0) as usize
}

/// A `cluster.fusion` that cannot run: a bucket size of at most 0, above
/// [`MAX_BUCKET_MIB`], or not a number.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error(
    "must be \"auto\" or a bucket size in MiB above 0 and at most {max}, not {mib}",
    max = MAX_BUCKET_MIB
)]
pub struct FusionError {
    /// The bucket size asked for, in MiB.
    pub mib: f64,
}

impl Fusion {
    /// Checks that the value can run.
    pub fn check(&self) -> Result<(), FusionError> {
        match *self {
            Fusion::Fixed(mib) if !(mib.is_finite() && mib > 0.0 && mib <= MAX_BUCKET_MIB) => {
                Err(FusionError { mib })
            }
            _ => Ok(()),
        }
    }

    /// The sizes a job starts with: the fixed ones, or for `"auto"` the first candidate's.
    pub fn initial(&self) -> BucketSizes {
        match *self {
            Fusion::Fixed(mib) => BucketSizes::of_mib(mib),
            Fusion::Auto => BucketSizes::of_mib(AUTO_CANDIDATES_MIB[0]),
        }
    }
}

impl fmt::Display for Fusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fusion::Fixed(mib) => write!(f, "{mib} MiB"),
            Fusion::Auto => f.write_str("auto"),
        }
    }
}

impl Serialize for Fusion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Fusion::Fixed(mib) => s.serialize_f64(mib),
            Fusion::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for Fusion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FusionVisitor)
    }
}

struct FusionVisitor;

impl Visitor<'_> for FusionVisitor {
    type Value = Fusion;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"auto\" or a bucket size in MiB")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Fusion, E> {
        match v {
            "auto" => Ok(Fusion::Auto),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Fusion, E> {
        Ok(Fusion::Fixed(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Fusion, E> {
        Ok(Fusion::Fixed(v as f64))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Fusion, E> {
        Ok(Fusion::Fixed(v as f64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{JobSpec, SpecError};

    fn spec(cluster: &str) -> Result<JobSpec, SpecError> {
        let toml = format!(
            "[data]\ntrain = \"t.parquet\"\nfeatures = [\"x\"]\nlabel = \"y\"\n[model]\nkind = \
             \"mlp\"\n[cluster]\n{cluster}"
        );
        JobSpec::parse(&toml, std::path::Path::new("job.toml"), &[])
    }

    #[test]
    fn a_size_in_mib_or_auto_and_25_mib_by_default() {
        assert_eq!(spec("").unwrap().cluster.fusion, Fusion::Fixed(25.0));
        assert_eq!(
            spec("fusion = 4").unwrap().cluster.fusion,
            Fusion::Fixed(4.0)
        );
        assert_eq!(
            spec("fusion = 0.5").unwrap().cluster.fusion,
            Fusion::Fixed(0.5)
        );
        assert_eq!(
            spec("fusion = \"auto\"").unwrap().cluster.fusion,
            Fusion::Auto
        );
        let s = spec("fusion = \"auto\"").unwrap();
        let json = serde_json::to_string(&s).unwrap();
        let back: JobSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back.cluster.fusion, Fusion::Auto);
    }

    #[test]
    fn other_values_are_refused_naming_the_key() {
        for bad in [
            "fusion = \"fast\"",
            "fusion = 0",
            "fusion = -3",
            "fusion = 4096",
        ] {
            let msg = spec(bad).unwrap_err().to_string();
            assert!(msg.contains("cluster.fusion"), "{bad}: {msg}");
        }
        let msg = spec("fusion = \"fast\"").unwrap_err().to_string();
        assert!(msg.contains("\"auto\" or a bucket size in MiB"), "{msg}");
    }

    #[test]
    fn the_first_bucket_is_at_most_one_mib() {
        let s = BucketSizes::of_mib(25.0);
        assert_eq!((s.first, s.rest), (1 << 20, 25 << 20));
        let s = BucketSizes::of_mib(0.25);
        assert_eq!((s.first, s.rest), (1 << 18, 1 << 18));
        assert_eq!(Fusion::Auto.initial(), BucketSizes::of_mib(1.0));
    }
}
