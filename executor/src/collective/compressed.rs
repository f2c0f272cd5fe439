//! Gradient compression on the ring (`cluster.compression`, Horovod's `Compression.fp16`).
//!
//! The ring all-reduce of [`super::algorithms`], with 16-bit floats on the wire and sums kept
//! in f32. In the reduce-scatter each rank decodes the partial sum it receives, adds its own
//! f32 values and encodes the new partial sum for the next hop; the final sum of a segment is
//! encoded once, and in the all-gather every rank, the segment's owner included, decodes that
//! same encoding, so the replicas stay bit-identical. Encoding rounds to the nearest
//! representable value, ties to even (what `half` does; F16C instructions where the CPU has
//! them, detected at run time).
//!
//! An average is taken by scaling each rank's values by 1/N before they travel, so no partial
//! sum is larger than the largest value a rank contributes: fp16's range (±65504) is exceeded
//! only where a rank's own gradient exceeds it. Values beyond it become infinite on every
//! rank alike; [`check_finite`] turns that into the step's error.

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use ringflow_core::spec::Compression;

use crate::collective::ReduceOp;
use crate::collective::algorithms::{Link, OpCode, Outgoing, segment};
use crate::error::{CommError, ExecutorError};

type Result<T> = std::result::Result<T, CommError>;

/// Encodes `src` into the 16-bit format of `codec` (rounding to nearest, ties to even), into
/// `dst` of the same length. `codec` is never [`Compression::None`] here.
pub fn encode(codec: Compression, src: &[f32], dst: &mut [u16]) {
    match codec {
        Compression::Bf16 => dst
            .reinterpret_cast_mut::<bf16>()
            .convert_from_f32_slice(src),
        _ => dst
            .reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(src),
    }
}

/// Decodes `src`, 16-bit floats of `codec`, into `dst` of the same length (exactly).
pub fn decode(codec: Compression, src: &[u16], dst: &mut [f32]) {
    match codec {
        Compression::Bf16 => src.reinterpret_cast::<bf16>().convert_to_f32_slice(dst),
        _ => src.reinterpret_cast::<f16>().convert_to_f32_slice(dst),
    }
}

/// Ring all-reduce of `buf` in place, sent as 16-bit floats of `codec` and summed in f32; every
/// rank ends with the same decoded values.
pub fn all_reduce(
    link: &mut Link,
    buf: &mut [f32],
    op: ReduceOp,
    codec: Compression,
) -> Result<()> {
    let (r, n, len) = (link.rank, link.world, buf.len());
    if n == 1 {
        return Ok(());
    }
    link.agree(OpCode::AllReduce, codec, len, 0)?;
    if op == ReduceOp::Average {
        let scale = 1.0 / n as f32;
        buf.iter_mut().for_each(|v| *v *= scale);
    }
    let mut sums = Vec::new();
    // Reduce-scatter: step s sends segment r−s and receives segment r−s−1, decodes the partial
    // sum, adds this rank's values and forwards it encoded; the last step's sums are final.
    send_encoded(link, codec, &buf[segment(r, n, len)])?;
    for s in 0..n - 1 {
        let seg = segment((r + 2 * n - s - 1) % n, n, len);
        let last = s == n - 2;
        let base = seg.start;
        link.receive::<u16>(seg.len(), "reducing gradients", |range, mut wire, link| {
            let mine = &mut buf[base + range.start..base + range.end];
            sums.resize(wire.len(), 0.0);
            decode(codec, &wire, &mut sums);
            for (p, &m) in sums.iter_mut().zip(mine.iter()) {
                *p += m;
            }
            encode(codec, &sums, &mut wire);
            if last {
                // The owner keeps what the others will decode, not its f32 sum.
                decode(codec, &wire, mine);
            }
            link.send(Outgoing::Halves(wire))
        })?;
    }
    // All-gather: step s receives the final segment r−s and forwards it as it came, except in
    // the last step.
    for s in 0..n - 1 {
        let seg = segment((r + n - s) % n, n, len);
        let forward = s < n - 2;
        let base = seg.start;
        link.receive::<u16>(
            seg.len(),
            "gathering reduced gradients",
            |range, wire, link| {
                decode(codec, &wire, &mut buf[base + range.start..base + range.end]);
                if forward {
                    link.send(Outgoing::Halves(wire))?;
                }
                Ok(())
            },
        )?;
    }
    Ok(())
}

/// Sends `values` right, encoded, a chunk at a time.
fn send_encoded(link: &Link, codec: Compression, values: &[f32]) -> Result<()> {
    for chunk in values.chunks(super::wire::CHUNK) {
        let mut out = link.buffer::<u16>(chunk.len());
        encode(codec, chunk, &mut out);
        link.send(Outgoing::Halves(out))?;
    }
    Ok(())
}

/// The step's error when gradients reduced as `codec` are not all finite: with fp16, values
/// beyond its range (the usual cause); with bf16, whose range is f32's, gradients that were
/// not finite already. Every rank holds the same values, so every rank fails the same step.
pub fn check_finite(codec: Compression, reduced: &[f32]) -> std::result::Result<(), ExecutorError> {
    match reduced.iter().find(|v| !v.is_finite()) {
        None => Ok(()),
        Some(&value) => Err(ExecutorError::CompressedGradient { codec, value }),
    }
}
