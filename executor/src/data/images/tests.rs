//! The decoder's tests: every kind of PNG and JPEG, resizing, the limits and the errors.

use datafusion::arrow::array::{BinaryArray, Int32Array};
use image::{DynamicImage, GrayImage, ImageFormat, RgbImage, RgbaImage};

use super::*;

/// `image` encoded as `format` (PNG or JPEG) bytes.
pub(crate) fn encode(image: impl Into<DynamicImage>, format: ImageFormat) -> Vec<u8> {
    let mut out = Vec::new();
    image
        .into()
        .write_to(&mut Cursor::new(&mut out), format)
        .expect("encodes");
    out
}

fn column(channels: usize, size: [usize; 2]) -> ImageColumn {
    let spec = ImageSpec {
        column: "img".into(),
        size,
        channels,
        max_pixels: None,
    };
    ImageColumn::new(&spec, 2)
}

#[cfg(target_os = "linux")]
#[test]
fn decoding_threads_are_batch_work() {
    let pool = column(3, [2, 2]).pool.expect("a pool of decoding threads");
    // SAFETY: sched_getscheduler of the calling thread (pid 0) only reads.
    let policies = pool.broadcast(|_| unsafe { libc::sched_getscheduler(0) });
    assert_eq!(policies, vec![libc::SCHED_BATCH; 2]);
}

fn decode(bytes: &[u8], channels: usize, size: [usize; 2]) -> std::result::Result<Vec<u8>, String> {
    let c = column(channels, size);
    let mut out = vec![0u8; c.values_per_image()];
    c.decode_into(bytes, &mut out)
        .map(|()| out)
        .map_err(|e| e.to_string())
}

/// A 2 × 2 RGB image and its planes.
fn rgb() -> RgbImage {
    let px = [[10, 20, 30], [40, 50, 60], [70, 80, 90], [100, 110, 120]];
    RgbImage::from_fn(2, 2, |x, y| Rgb(px[(y * 2 + x) as usize]))
}
const RED: [u8; 4] = [10, 40, 70, 100];
const GREEN: [u8; 4] = [20, 50, 80, 110];
const BLUE: [u8; 4] = [30, 60, 90, 120];
/// ITU-R 601 grey of the RGB image: round(0.299 R + 0.587 G + 0.114 B).
const GREY: [u8; 4] = [18, 48, 78, 108];

fn planes(parts: &[[u8; 4]]) -> Vec<u8> {
    parts.iter().flatten().copied().collect()
}

#[test]
fn png_of_every_kind_becomes_every_channel_count_as_planes() {
    let grey = GrayImage::from_raw(2, 2, vec![5, 6, 7, 8]).unwrap();
    let g = [5, 6, 7, 8];
    let png = encode(grey, ImageFormat::Png);
    assert_eq!(decode(&png, 1, [2, 2]).unwrap(), g);
    assert_eq!(decode(&png, 3, [2, 2]).unwrap(), planes(&[g, g, g]));
    assert_eq!(
        decode(&png, 4, [2, 2]).unwrap(),
        planes(&[g, g, g, [255; 4]])
    );

    let png = encode(rgb(), ImageFormat::Png);
    assert_eq!(decode(&png, 1, [2, 2]).unwrap(), GREY);
    assert_eq!(
        decode(&png, 3, [2, 2]).unwrap(),
        planes(&[RED, GREEN, BLUE])
    );
    let opaque = planes(&[RED, GREEN, BLUE, [255; 4]]);
    assert_eq!(decode(&png, 4, [2, 2]).unwrap(), opaque);

    let rgba = RgbaImage::from_fn(2, 2, |x, y| {
        let Rgb([r, g, b]) = *rgb().get_pixel(x, y);
        Rgba([r, g, b, 200 + (y * 2 + x) as u8])
    });
    let png = encode(rgba, ImageFormat::Png);
    assert_eq!(decode(&png, 1, [2, 2]).unwrap(), GREY);
    assert_eq!(
        decode(&png, 3, [2, 2]).unwrap(),
        planes(&[RED, GREEN, BLUE])
    );
    let alpha = [200, 201, 202, 203];
    assert_eq!(
        decode(&png, 4, [2, 2]).unwrap(),
        planes(&[RED, GREEN, BLUE, alpha])
    );

    // 16 bits per channel are narrowed to 8.
    let wide = ImageBuffer::<Luma<u16>, Vec<u16>>::from_raw(2, 1, vec![0, 65535]).unwrap();
    let png = encode(DynamicImage::ImageLuma16(wide), ImageFormat::Png);
    assert_eq!(decode(&png, 1, [1, 2]).unwrap(), [0, 255]);
}

#[test]
fn jpeg_decodes_close_to_its_colours() {
    let flat = RgbImage::from_pixel(16, 16, Rgb([100, 150, 200]));
    let jpeg = encode(flat, ImageFormat::Jpeg);
    let out = decode(&jpeg, 3, [16, 16]).unwrap();
    for (plane, want) in out.chunks_exact(256).zip([100u8, 150, 200]) {
        for &v in plane {
            assert!(v.abs_diff(want) <= 3, "{v} for {want}");
        }
    }
}

#[test]
fn images_of_another_size_are_resized() {
    // A constant image stays constant at any size.
    let flat = RgbImage::from_pixel(7, 5, Rgb([10, 20, 30]));
    let out = decode(&encode(flat, ImageFormat::Png), 3, [3, 4]).unwrap();
    let want: Vec<u8> = [10u8, 20, 30]
        .iter()
        .flat_map(|&v| std::iter::repeat_n(v, 12))
        .collect();
    assert_eq!(out, want);
    // Dark left half, bright right half: halving keeps the sides apart, symmetrically.
    let halves = GrayImage::from_fn(8, 8, |x, _| Luma([if x < 4 { 0 } else { 200 }]));
    let out = decode(&encode(halves, ImageFormat::Png), 1, [4, 4]).unwrap();
    for row in out.chunks_exact(4) {
        assert_eq!(row[0], 0, "{out:?}");
        assert_eq!(row[3], 200, "{out:?}");
        assert!(row[1] <= row[2], "{out:?}");
        assert_eq!(row[1] as u32 + row[2] as u32, 200, "{out:?}");
    }
}

/// A PNG signature, an IHDR chunk declaring a `width × height` 8-bit image of PNG colour
/// type `color` (0 grey, 6 RGBA), and an empty IDAT chunk: a header without pixels.
pub(crate) fn png_header(width: u32, height: u32, color: u8) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
            }
        }
        !crc
    }
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8], data: &[u8]| {
        let body = [kind, data].concat();
        png.extend((data.len() as u32).to_be_bytes());
        png.extend(&body);
        png.extend(crc32(&body).to_be_bytes());
    };
    let ihdr = [
        &width.to_be_bytes()[..],
        &height.to_be_bytes(),
        &[8, color, 0, 0, 0],
    ];
    chunk(b"IHDR", &ihdr.concat());
    chunk(b"IDAT", &[]);
    png
}

#[test]
fn a_huge_header_is_refused_before_decoding() {
    let msg = decode(&png_header(20_000, 20_000, 0), 1, [2, 2]).unwrap_err();
    assert!(
        msg.contains("its header declares an image beyond the limit of 16384 pixels"),
        "{msg}"
    );
    // Within the sides, beyond the bytes: 16000 × 16000 RGBA is 977 MiB.
    let msg = decode(&png_header(16_000, 16_000, 6), 1, [2, 2]).unwrap_err();
    assert!(msg.contains("beyond the limit"), "{msg}");
    // A header that fits but has no pixels is corrupt, not too large.
    let msg = decode(&png_header(4, 4, 0), 1, [2, 2]).unwrap_err();
    assert!(msg.starts_with("is cut short"), "{msg}");
}

/// Issue 39: an 8 × 8 PNG whose ICC profile decompresses to 64 MiB (1 GiB in the issue)
/// made the decoder allocate hundreds of MiB; its metadata is now bounded to 4 MiB (the
/// profile, which the executors do not use, is dropped) and the image decodes.
#[test]
fn a_huge_icc_profile_is_not_allocated() {
    use image::codecs::png::PngEncoder;
    use image::{ExtendedColorType, ImageEncoder};
    let mut png = Vec::new();
    let mut encoder = PngEncoder::new(&mut png);
    encoder.set_icc_profile(vec![0; 64 << 20]).unwrap();
    encoder
        .write_image(&[7; 64], 8, 8, ExtendedColorType::L8)
        .unwrap();
    assert!(png.len() < 1 << 20, "{} bytes", png.len());
    let (out, largest) = crate::fuzz::largest_allocation(|| decode(&png, 1, [8, 8]));
    assert_eq!(out.unwrap(), vec![7; 64]);
    assert!(largest <= 4 << 20, "allocated {largest} bytes");
}

/// A grey progressive JPEG of `side × side` (a multiple of 8) flat pixels: a frame header
/// (SOF2), one Huffman table whose only code (`0`, one bit) is a DC difference of 0, and one
/// DC scan of a bit per block.
pub(crate) fn progressive_jpeg(side: u16) -> Vec<u8> {
    let [h0, h1] = side.to_be_bytes();
    let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xDB, 0, 67, 0];
    jpeg.extend([1; 64]);
    jpeg.extend([0xFF, 0xC2, 0, 11, 8, h0, h1, h0, h1, 1, 1, 0x11, 0]);
    jpeg.extend([0xFF, 0xC4, 0, 20, 0, 1]);
    jpeg.extend([0; 16]);
    jpeg.extend([0xFF, 0xDA, 0, 8, 1, 1, 0, 0, 0, 0]);
    let blocks = (side as usize / 8).pow(2);
    jpeg.extend(vec![0u8; blocks / 8]);
    if !blocks.is_multiple_of(8) {
        jpeg.push(0xFF >> (blocks % 8));
    }
    jpeg.extend([0xFF, 0xD9]);
    jpeg
}

#[test]
fn a_progressive_jpeg_decodes() {
    assert_eq!(
        decode(&progressive_jpeg(16), 1, [16, 16]).unwrap(),
        vec![128; 256]
    );
}

/// Issue 39: a 16384 × 16384 progressive JPEG was allowed and its decoder kept 512 MiB of
/// coefficients besides its 256 MiB of pixels; it is refused from its headers.
#[test]
fn a_progressive_jpeg_beyond_the_limit_is_refused() {
    let jpeg = progressive_jpeg(16384);
    let (msg, largest) = crate::fuzz::largest_allocation(|| decode(&jpeg, 1, [2, 2]));
    assert_eq!(
        msg.unwrap_err(),
        "is 16384 × 16384 pixels, 256 MiB decoded and 512 MiB of coefficients a progressive \
         JPEG keeps, beyond the limit of 256 MiB an image may take (data.image.max_pixels, \
         at most 256 MiB); replace the image by a smaller one, or leave its row out of the \
         data"
    );
    assert!(largest < 1 << 20, "allocated {largest} bytes");
}

/// A header declaring more pixels than `data.image.max_pixels` is refused naming the key.
#[test]
fn images_beyond_max_pixels_are_refused() {
    let spec = ImageSpec {
        column: "img".into(),
        size: [2, 2],
        channels: 1,
        max_pixels: Some(100),
    };
    let c = ImageColumn::new(&spec, 1);
    let mut out = vec![0u8; 4];
    let msg = c
        .decode_into(&png_header(11, 10, 0), &mut out)
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        "is 11 × 10 pixels, more than data.image.max_pixels (100); raise it, or leave the \
         image's row out of the data"
    );
    let msg = c
        .decode_into(&png_header(10, 10, 0), &mut out)
        .unwrap_err()
        .to_string();
    assert!(msg.starts_with("is cut short"), "{msg}");
}

/// Regression (issue 39): a corrupt PNG printed the decoder's `ChunkType { type: IDAT,
/// critical: true, … }` in debug form; the sentence names the file, the row, what is
/// wrong (the chunk by its name) and what to do.
#[test]
fn a_corrupt_png_is_one_sentence_without_debug_forms() {
    // The signature, then the IHDR chunk (length, type, 13 bytes, CRC) twice.
    let mut png = encode(rgb(), ImageFormat::Png);
    let ihdr = png[8..33].to_vec();
    assert_eq!(&ihdr[4..8], b"IHDR");
    png.splice(33..33, ihdr);
    let msg = decode(&png, 3, [2, 2]).unwrap_err();
    assert_eq!(
        msg,
        "is a corrupt PNG image (Chunk IHDR must appear at most once); replace the image, or \
         leave its row out of the data"
    );
    assert_eq!(
        error::readable("Chunk ChunkType { type: PLTE, critical: true } must appear at most once."),
        "Chunk PLTE must appear at most once"
    );
}

#[test]
fn corrupt_images_name_the_file_and_row() {
    let good = encode(rgb(), ImageFormat::Png);
    let mut truncated = good.clone();
    truncated.truncate(good.len() / 2);
    let values: Vec<Option<&[u8]>> = vec![
        Some(&good),
        Some(&good),
        Some(&truncated),
        Some(b"not an image"),
        None,
    ];
    let batch = |values: Vec<Option<&[u8]>>| {
        let n = values.len() as i32;
        RecordBatch::try_from_iter([
            (
                "y",
                Arc::new(Int32Array::from_iter_values(0..n)) as ArrayRef,
            ),
            ("img", Arc::new(BinaryArray::from(values)) as ArrayRef),
        ])
        .unwrap()
    };
    let c = column(3, [2, 2]);
    let fail = |values: Vec<Option<&[u8]>>| {
        c.decode_batch(&batch(values), "data/x.parquet", 100)
            .unwrap_err()
            .to_string()
    };
    let msg = fail(values.clone());
    assert_eq!(
        msg,
        "data/x.parquet: column `img` (data.image) row 102 (0-based): is cut short (the \
         image's data ends before the image does); replace the image, or leave its row out \
         of the data"
    );
    let msg = fail(values[3..].to_vec());
    assert!(
        msg.contains("row 100 (0-based): is neither a PNG nor a JPEG image"),
        "{msg}"
    );
    let msg = fail(values[4..].to_vec());
    assert!(
        msg.contains("row 100 (0-based): the image is null"),
        "{msg}"
    );

    // Good rows become a list of their planes; the other columns stay.
    let decoded = c
        .decode_batch(&batch(values[..2].to_vec()), "f", 0)
        .unwrap();
    assert_eq!(decoded.column(0).len(), 2);
    let list = decoded.column(1).as_fixed_size_list();
    assert_eq!(list.value_length(), 12);
    let pixels = list
        .values()
        .as_primitive::<datafusion::arrow::datatypes::UInt8Type>();
    assert_eq!(pixels.values()[12..], planes(&[RED, GREEN, BLUE]));
}
