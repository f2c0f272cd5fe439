//! What an encoded image may be before it is decoded: the decoder's limits, the pixels and
//! bytes `data.image` allows, and what a JPEG's frame header says about the memory its
//! decoding takes.

use image::Limits;
use image::error::LimitErrorKind;
use ringflow_core::spec::{MAX_IMAGE_METADATA_BYTES, MAX_IMAGE_SIDE};

use super::error::DecodeError;

/// The most one image may be (`data.image.max_pixels`, [`ImageSpec::max_decoded_bytes`](ringflow_core::spec::ImageSpec::max_decoded_bytes)).
#[derive(Clone, Copy, Debug)]
pub(super) struct Bounds {
    /// Pixels (height × width).
    pub(super) pixels: u64,
    /// Bytes its decoding may take for the whole image: its pixels as decoded, and a
    /// progressive JPEG's coefficients.
    pub(super) bytes: u64,
}

/// What the PNG decoder may reserve for itself (its ancillary chunks, compressed and
/// decompressed, and its row buffers): half of [`MAX_IMAGE_METADATA_BYTES`], as decompressing
/// a chunk allocates somewhat past the bound it is given, and the other half is that margin.
const PNG_RESERVE_BYTES: u64 = MAX_IMAGE_METADATA_BYTES / 2;

/// The crate's limits for one image: at most [`MAX_IMAGE_SIDE`] pixels on a side, and
/// [`PNG_RESERVE_BYTES`] of the decoder's own allocations (which, for a PNG, are its
/// ancillary chunks and row buffers: the pixels go into a buffer of ours, checked first), so
/// that it allocates at most [`MAX_IMAGE_METADATA_BYTES`].
pub(super) fn limits() -> Limits {
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_SIDE as u32);
    limits.max_image_height = Some(MAX_IMAGE_SIDE as u32);
    limits.max_alloc = Some(PNG_RESERVE_BYTES);
    limits
}

/// The decoder's refusal of an image beyond [`limits`], as the end of a sentence.
pub(super) fn limit_error(e: &image::ImageError) -> DecodeError {
    match e {
        image::ImageError::Limits(l) if matches!(l.kind(), LimitErrorKind::DimensionError) => {
            DecodeError::SideBeyondLimit
        }
        _ => DecodeError::MetadataBeyondLimit {
            mib: PNG_RESERVE_BYTES >> 20,
        },
    }
}

/// The bytes of the coefficients a JPEG decoder keeps for the whole of a progressive JPEG
/// (2 bytes for each of 64 per 8 × 8 block of each component, sides padded to the largest
/// block a component can span, 32 pixels); 0 for any other image (a baseline JPEG is decoded a
/// row of blocks at a time).
pub(super) fn jpeg_coefficient_bytes(bytes: &[u8]) -> u64 {
    match jpeg_frame(bytes) {
        Some(f) if f.progressive => {
            let pad = |side: u16| (side as u64).div_ceil(32) * 32;
            2 * f.components as u64 * pad(f.width) * pad(f.height)
        }
        _ => 0,
    }
}

/// What a JPEG's frame header (SOF) says.
struct JpegFrame {
    progressive: bool,
    components: u8,
    width: u16,
    height: u16,
}

/// The frame header of a JPEG, read by walking its segments from the start; `None` when
/// `bytes` are not a JPEG or end (or reach the scan) before a frame header.
fn jpeg_frame(bytes: &[u8]) -> Option<JpegFrame> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut at = 2;
    loop {
        while bytes.get(at) == Some(&0xFF) {
            at += 1;
        }
        let marker = *bytes.get(at)?;
        at += 1;
        if matches!(marker, 0x01 | 0xD0..=0xD7) {
            continue;
        }
        let len = u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]) as usize;
        match marker {
            0xDA => return None,
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                let sof = bytes.get(at + 2..at + 8)?;
                return Some(JpegFrame {
                    progressive: matches!(marker, 0xC2 | 0xC6 | 0xCA | 0xCE),
                    height: u16::from_be_bytes([sof[1], sof[2]]),
                    width: u16::from_be_bytes([sof[3], sof[4]]),
                    components: sof[5],
                });
            }
            _ => at += len,
        }
    }
}

/// Narrows native-endian 16-bit samples to 8 bits in place (rounding as the `image` crate
/// does, `round(v × 255 / 65535)`), leaving them in the first half of `pixels`, which is
/// truncated to it.
pub(super) fn narrow_in_place(pixels: &mut Vec<u8>) {
    let n = pixels.len() / 2;
    for i in 0..n {
        let v = u16::from_ne_bytes([pixels[2 * i], pixels[2 * i + 1]]);
        pixels[i] = ((v as u32 + 128) / 257) as u8;
    }
    pixels.truncate(n);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The headers of a grey JPEG of `side × side` (SOF `marker`: 0xC0 baseline, 0xC2
    /// progressive) with an application segment before its frame, and no scan data.
    fn jpeg_headers(marker: u8, side: u16) -> Vec<u8> {
        let [h0, h1] = side.to_be_bytes();
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0, 0, 4, b'J', b'F'];
        jpeg.extend([0xFF, marker, 0, 11, 8, h0, h1, h0, h1, 1, 1, 0x11, 0]);
        jpeg.extend([0xFF, 0xDA, 0, 8, 1, 1, 0, 0, 63, 0]);
        jpeg
    }

    #[test]
    fn a_progressive_jpeg_counts_its_coefficients() {
        // 2 bytes per coefficient, one component, sides padded to 32.
        assert_eq!(
            jpeg_coefficient_bytes(&jpeg_headers(0xC2, 16384)),
            2 * 16384 * 16384
        );
        assert_eq!(jpeg_coefficient_bytes(&jpeg_headers(0xC2, 33)), 2 * 64 * 64);
        assert_eq!(jpeg_coefficient_bytes(&jpeg_headers(0xC0, 16384)), 0);
        // Cut short, or the scan before any frame: nothing known, nothing counted.
        let cut = jpeg_headers(0xC2, 100);
        assert_eq!(jpeg_coefficient_bytes(&cut[..12]), 0);
        assert_eq!(jpeg_coefficient_bytes(b"\x89PNG"), 0);
    }

    #[test]
    fn narrowing_rounds_like_the_image_crate() {
        let wide: Vec<u8> = [0u16, 128, 129, 32896, 65535]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let mut pixels = wide;
        narrow_in_place(&mut pixels);
        assert_eq!(pixels, [0, 0, 1, 128, 255]);
    }
}
