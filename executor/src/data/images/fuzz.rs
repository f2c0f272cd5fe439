//! Fuzz target of the image decode path (`data.image`): any bytes, and real PNG and JPEG
//! images (grey, RGB, RGBA, 16-bit, interlaced, progressive, headers declaring any size) with
//! bytes changed, cut or added, decoded into a column's slot: the slot's pixels or one
//! sentence, never a panic, and no allocation beyond what a decoding thread may hold
//! ([`ImageSpec::decoding_bytes`]).

use std::io::Cursor;

use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::{CompressionType, FilterType, PngEncoder};
use image::{ExtendedColorType, GrayImage, ImageEncoder, ImageFormat, RgbImage, RgbaImage};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use ringflow_core::spec::ImageSpec;

use super::ImageColumn;
use super::tests::{encode, png_header, progressive_jpeg};
use crate::fuzz::{config, largest_allocation};

/// The pixels the fuzzed column may decode: small, so that the bound is tight.
const MAX_PIXELS: u64 = 64 * 64;

/// Small real images of every kind the decoders meet.
fn seeds() -> Vec<Vec<u8>> {
    let rgb = RgbImage::from_fn(9, 7, |x, y| image::Rgb([x as u8 * 20, y as u8 * 30, 99]));
    let grey = GrayImage::from_fn(5, 6, |x, y| image::Luma([(x * y) as u8]));
    let rgba = RgbaImage::from_fn(4, 4, |x, y| image::Rgba([x as u8, y as u8, 7, 200]));
    let mut wide = Vec::new();
    let samples: Vec<u8> = (0..3 * 3 * 2 * 2).map(|i| i as u8 * 7).collect();
    PngEncoder::new_with_quality(&mut wide, CompressionType::Fast, FilterType::Paeth)
        .write_image(&samples, 3, 2, ExtendedColorType::Rgb16)
        .unwrap();
    let mut quality = Vec::new();
    JpegEncoder::new_with_quality(&mut Cursor::new(&mut quality), 30)
        .encode_image(&rgb)
        .unwrap();
    vec![
        encode(rgb.clone(), ImageFormat::Png),
        encode(grey.clone(), ImageFormat::Png),
        encode(rgba, ImageFormat::Png),
        wide,
        encode(rgb, ImageFormat::Jpeg),
        encode(grey, ImageFormat::Jpeg),
        quality,
        progressive_jpeg(24),
    ]
}

/// `base` with up to four bytes changed, maybe cut, maybe extended with random bytes.
fn damaged(base: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = base.len();
    (
        prop::collection::vec((0..len.max(1), any::<u8>()), 0..4),
        prop_oneof![3 => Just(None), 1 => (0..=len).prop_map(Some)],
        prop::collection::vec(any::<u8>(), 0..32),
    )
        .prop_map(move |(changes, cut, tail)| {
            let mut bytes = base.clone();
            for (at, b) in changes {
                if let Some(x) = bytes.get_mut(at) {
                    *x = b;
                }
            }
            if let Some(cut) = cut {
                bytes.truncate(cut);
            }
            bytes.extend(tail);
            bytes
        })
}

/// A JPEG whose frame header declares `width × height` (its data then no longer fits).
fn resized_jpeg(width: u16, height: u16) -> Vec<u8> {
    let mut jpeg = encode(RgbImage::new(8, 8), ImageFormat::Jpeg);
    let sof = (2..jpeg.len() - 1)
        .find(|&i| jpeg[i] == 0xFF && matches!(jpeg[i + 1], 0xC0 | 0xC2))
        .expect("a frame header");
    jpeg[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    jpeg[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    jpeg
}

fn inputs() -> impl Strategy<Value = (Vec<u8>, usize)> {
    let seeds = seeds();
    let damaged_seed = (0..seeds.len()).prop_flat_map(move |i| damaged(seeds[i].clone()));
    let headers = (
        any::<u32>(),
        any::<u32>(),
        prop::sample::select(vec![0u8, 2, 4, 6]),
    )
        .prop_map(|(w, h, c)| png_header(w % 70_000, h % 70_000, c));
    let jpegs = (any::<u16>(), any::<u16>()).prop_map(|(w, h)| resized_jpeg(w, h));
    let bytes = prop_oneof![
        2 => prop::collection::vec(any::<u8>(), 0..256),
        6 => damaged_seed,
        1 => headers,
        1 => jpegs,
    ];
    (bytes, prop::sample::select(vec![1usize, 3, 4]))
}

/// Any bytes into an image column: its slot's pixels, or one sentence without debug forms;
/// never a panic, and no allocation beyond what a decoding thread may hold.
#[test]
fn fuzz_image_decoder() {
    let run = TestRunner::new(config(512)).run(&inputs(), |(bytes, channels)| {
        let spec = ImageSpec {
            column: "img".into(),
            size: [6, 5],
            channels,
            max_pixels: Some(MAX_PIXELS),
        };
        let column = ImageColumn::new(&spec, 1);
        let mut out = vec![0u8; column.values_per_image()];
        let (result, largest) = largest_allocation(|| column.decode_into(&bytes, &mut out));
        if let Err(e) = result {
            let e = e.to_string();
            prop_assert!(!e.is_empty() && !e.contains('\n'), "{e:?}");
            prop_assert!(!e.contains("ChunkType {"), "{e}");
        }
        let bound = spec.decoding_bytes();
        prop_assert!(
            largest as u64 <= bound,
            "allocated {largest} bytes, over {bound}"
        );
        Ok(())
    });
    run.unwrap();
}
