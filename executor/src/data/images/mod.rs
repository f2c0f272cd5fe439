//! Columns of encoded images (`data.image`): PNG or JPEG bytes decoded into pixels.
//!
//! An [`ImageColumn`] replaces the binary column of a record batch by a
//! `fixed_size_list<uint8>` column of `channels × height × width` values per row, laid out
//! `[C, H, W]` (NCHW once batched), which the kind's converter ([`converter`]) then reads as the
//! [`Converter`] reads any list of numbers (so `data.scale` and `data.normalize` apply as to
//! other features). Decoded batches go into
//! the row-group cache, so later epochs do not decode again; pixels take one byte per channel
//! there.
//!
//! Each image is converted to the requested channel count (grey from colour with the ITU-R
//! 601 weights that PIL uses; alpha dropped, or 255 where the image has none) and resized to
//! the requested size with a triangle (bilinear) filter when its own differs. The rows of a
//! batch are decoded in parallel on the task's compute threads, each straight into the row's
//! slot of one buffer for the batch. A header declaring more than [`MAX_IMAGE_SIDE`] pixels on
//! a side, more than `data.image.max_pixels` pixels, or an image whose decoding would take
//! more than [`ImageSpec::max_decoded_bytes`] (its pixels, and a progressive JPEG's
//! coefficients) is refused before any pixel is decoded, and a decoder allocates at most
//! [`MAX_IMAGE_METADATA_BYTES`] beyond that (a PNG's ICC profile and text chunks), so a hostile
//! file cannot make an executor allocate more than [`ImageSpec::decoding_bytes`] per decoding
//! thread, which the driver's memory estimate counts; a corrupt image is an error naming the
//! file, the row and the decoder's reason.
//!
//! [`Converter`]: crate::data::features::Converter
//! [`MAX_IMAGE_SIDE`]: ringflow_core::spec::MAX_IMAGE_SIDE
//! [`MAX_IMAGE_METADATA_BYTES`]: ringflow_core::spec::MAX_IMAGE_METADATA_BYTES

use std::cell::RefCell;
use std::io::Cursor;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, UInt8Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use image::imageops::FilterType;
use image::{ColorType, ImageBuffer, ImageDecoder, ImageReader, Luma, LumaA, Pixel, Rgb, Rgba};
use rayon::prelude::*;
use ringflow_core::spec::ImageSpec;

use self::error::{DecodeError, ImageColumnError};
use self::limits::{Bounds, jpeg_coefficient_bytes, limit_error, limits, narrow_in_place};

use crate::data::background::mark_as_batch_work;
use crate::error::{ExecutorError, Result};

pub mod converter;
pub mod error;
#[cfg(test)]
mod fuzz;
mod limits;

pub use ringflow_core::spec::MAX_DECODED_BYTES;

/// Scratch buffers kept by a decoding thread between images up to this size; a larger one is
/// given back after use.
const KEEP_SCRATCH_BYTES: usize = 16 << 20;

/// Decodes one image column of record batches into pixels.
#[derive(Debug)]
pub struct ImageColumn {
    column: String,
    channels: usize,
    /// `[height, width]` of every decoded image.
    size: [usize; 2],
    /// What one image may be: its pixels and the bytes its decoding may take.
    bounds: Bounds,
    /// The threads that decode (the task's compute threads); `None`: the calling thread.
    pool: Option<Arc<rayon::ThreadPool>>,
}

thread_local! {
    /// The decoder's output, reused from image to image on each decoding thread.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl ImageColumn {
    /// Decodes `spec`'s column on `threads` threads of its own, which run as batch work
    /// ([`background`](crate::data::background)).
    pub fn new(spec: &ImageSpec, threads: usize) -> ImageColumn {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("ringflow-decode-{i}"))
            .start_handler(|_| mark_as_batch_work())
            .build()
            .ok()
            .map(Arc::new);
        ImageColumn {
            column: spec.column.clone(),
            channels: spec.channels,
            size: spec.size,
            bounds: Bounds {
                pixels: spec.max_pixels(),
                bytes: spec.max_decoded_bytes(),
            },
            pool,
        }
    }

    /// Values per decoded image: channels × height × width.
    pub fn values_per_image(&self) -> usize {
        self.channels
            .saturating_mul(self.size[0])
            .saturating_mul(self.size[1])
    }

    /// `batch` with its image column replaced by the decoded pixels; `batch` comes from `file`
    /// and its first row is row `first_row` there (for errors).
    pub fn decode_batch(
        &self,
        batch: &RecordBatch,
        file: &str,
        first_row: u64,
    ) -> Result<RecordBatch> {
        let fail = |source: ImageColumnError| ExecutorError::Image {
            file: file.to_string(),
            column: self.column.clone(),
            source: Box::new(source),
        };
        let Some(index) = batch.schema().index_of(&self.column).ok() else {
            return Err(fail(ImageColumnError::Missing));
        };
        let col = batch.column(index);
        let rows = col.len();
        let pixels = match col.data_type() {
            DataType::Binary => {
                let a = col.as_binary::<i32>();
                self.decode_rows(rows, first_row, |r| a.is_valid(r).then(|| a.value(r)))
            }
            DataType::LargeBinary => {
                let a = col.as_binary::<i64>();
                self.decode_rows(rows, first_row, |r| a.is_valid(r).then(|| a.value(r)))
            }
            DataType::BinaryView => {
                let a = col.as_binary_view();
                self.decode_rows(rows, first_row, |r| a.is_valid(r).then(|| a.value(r)))
            }
            t => return Err(fail(ImageColumnError::NotBinary(t.clone()))),
        }
        .map_err(fail)?;
        let mut fields: Vec<Arc<Field>> = batch.schema().fields().iter().cloned().collect();
        let mut columns = batch.columns().to_vec();
        fields[index] = Arc::new(Field::new(&self.column, pixels.data_type().clone(), false));
        columns[index] = pixels;
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| fail(ImageColumnError::Hold(e)))
    }

    /// Decodes `rows` images (`bytes(row)` gives a row's encoded image, `None` for a null)
    /// into one buffer, in parallel; the error names the first failing row, counted from
    /// `first_row`.
    fn decode_rows<'a>(
        &self,
        rows: usize,
        first_row: u64,
        bytes: impl Fn(usize) -> Option<&'a [u8]> + Sync,
    ) -> std::result::Result<ArrayRef, ImageColumnError> {
        let per_image = self.values_per_image();
        let too_many = || ImageColumnError::NoMemory { rows, per_image };
        let len = rows.checked_mul(per_image).ok_or_else(too_many)?;
        let mut out = Vec::new();
        out.try_reserve_exact(len).map_err(|_| too_many())?;
        out.resize(len, 0u8);
        let decode_all = |out: &mut [u8]| {
            out.par_chunks_mut(per_image.max(1))
                .enumerate()
                .filter_map(|(row, slot)| {
                    let result = match bytes(row) {
                        Some(b) => self.decode_into(b, slot),
                        None => Err(DecodeError::Null),
                    };
                    result.err().map(|why| (row, why))
                })
                .min_by_key(|(row, _)| *row)
        };
        let failed = match &self.pool {
            Some(pool) => pool.install(|| decode_all(&mut out)),
            None => decode_all(&mut out),
        };
        if let Some((row, source)) = failed {
            return Err(ImageColumnError::Row {
                row: first_row + row as u64,
                source,
            });
        }
        let values = Arc::new(UInt8Array::from(out));
        let item = Arc::new(Field::new_list_field(DataType::UInt8, false));
        let list = FixedSizeListArray::try_new(item, per_image as i32, values, None)
            .map_err(ImageColumnError::Hold)?;
        Ok(Arc::new(list))
    }

    /// Decodes one encoded image into `out` (`[C, H, W]`, this column's channels and size).
    pub fn decode_into(
        &self,
        bytes: &[u8],
        out: &mut [u8],
    ) -> std::result::Result<(), DecodeError> {
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let result = self.decode_with(bytes, &mut scratch, out);
            if scratch.capacity() > KEEP_SCRATCH_BYTES {
                *scratch = Vec::new();
            }
            result
        })
    }

    fn decode_with(
        &self,
        bytes: &[u8],
        scratch: &mut Vec<u8>,
        out: &mut [u8],
    ) -> std::result::Result<(), DecodeError> {
        let (width, height, src_channels) = decode_8bit(bytes, scratch, self.bounds)?;
        let [h, w] = self.size;
        if (height, width) == (h, w) {
            write_planes(scratch, src_channels, self.channels, out);
            return Ok(());
        }
        let resized = resize(scratch, [height, width], src_channels, self.size);
        write_planes(&resized, src_channels, self.channels, out);
        Ok(())
    }
}

/// Decodes a PNG or JPEG image into `scratch` as 8-bit interleaved pixels; returns its
/// width, height and channels (1 grey, 2 grey + alpha, 3 RGB, 4 RGBA). An image beyond
/// `bounds` is refused from its header, before its pixels are allocated.
fn decode_8bit(
    bytes: &[u8],
    scratch: &mut Vec<u8>,
    bounds: Bounds,
) -> std::result::Result<(usize, usize, usize), DecodeError> {
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(DecodeError::Unreadable)?;
    if reader.format().is_none() {
        return Err(DecodeError::NotPngOrJpeg);
    }
    reader.limits(limits());
    let decoder = reader.into_decoder().map_err(|e| match e {
        image::ImageError::Limits(_) => limit_error(&e),
        e => DecodeError::Decoder(e),
    })?;
    let (width, height) = decoder.dimensions();
    let (width, height) = (width as usize, height as usize);
    let pixels = width as u64 * height as u64;
    if pixels > bounds.pixels {
        return Err(DecodeError::TooManyPixels {
            width,
            height,
            max: bounds.pixels,
        });
    }
    let total = decoder.total_bytes();
    let coefficients = jpeg_coefficient_bytes(bytes);
    let needed = total.saturating_add(coefficients);
    if needed > bounds.bytes {
        return Err(DecodeError::TooLarge {
            width,
            height,
            decoded: total,
            coefficients,
            limit: bounds.bytes,
        });
    }
    let channels = match decoder.color_type() {
        ColorType::L8 => 1,
        ColorType::La8 => 2,
        ColorType::Rgb8 => 3,
        ColorType::Rgba8 => 4,
        ColorType::L16 => 1,
        ColorType::La16 => 2,
        ColorType::Rgb16 => 3,
        ColorType::Rgba16 => 4,
        c => return Err(DecodeError::PixelKind(c)),
    };
    let wide = decoder.color_type().bytes_per_pixel() as usize > channels;
    scratch.clear();
    scratch.resize(total as usize, 0);
    decoder.read_image(scratch).map_err(DecodeError::Decoder)?;
    if wide {
        narrow_in_place(scratch);
    }
    Ok((width, height, channels))
}

/// `pixels` (`[height, width]`, `channels` interleaved) resized to `size` with a triangle
/// filter.
fn resize(pixels: &[u8], from: [usize; 2], channels: usize, size: [usize; 2]) -> Vec<u8> {
    fn resized<P: Pixel<Subpixel = u8> + 'static>(
        pixels: &[u8],
        from: [usize; 2],
        size: [usize; 2],
    ) -> Vec<u8> {
        let image = ImageBuffer::<P, &[u8]>::from_raw(from[1] as u32, from[0] as u32, pixels)
            .expect("the decoder filled the buffer");
        image::imageops::resize(&image, size[1] as u32, size[0] as u32, FilterType::Triangle)
            .into_raw()
    }
    match channels {
        1 => resized::<Luma<u8>>(pixels, from, size),
        2 => resized::<LumaA<u8>>(pixels, from, size),
        3 => resized::<Rgb<u8>>(pixels, from, size),
        _ => resized::<Rgba<u8>>(pixels, from, size),
    }
}

/// Grey from red, green and blue with the ITU-R 601 weights (PIL's `convert("L")`).
#[inline]
fn grey(r: u8, g: u8, b: u8) -> u8 {
    ((299 * r as u32 + 587 * g as u32 + 114 * b as u32 + 500) / 1000) as u8
}

/// Writes interleaved `pixels` of `from` channels into `out` as `to` planes (`[C, H, W]`):
/// grey is repeated into colour, colour is made grey, alpha is dropped or set opaque.
fn write_planes(pixels: &[u8], from: usize, to: usize, out: &mut [u8]) {
    let area = out.len() / to;
    if from == to && from == 1 {
        out.copy_from_slice(&pixels[..area]);
        return;
    }
    for (i, px) in pixels.chunks_exact(from).take(area).enumerate() {
        let (rgb, alpha) = match from {
            1 => ([px[0]; 3], 255),
            2 => ([px[0]; 3], px[1]),
            3 => ([px[0], px[1], px[2]], 255),
            _ => ([px[0], px[1], px[2]], px[3]),
        };
        match to {
            1 => {
                out[i] = if from <= 2 {
                    px[0]
                } else {
                    grey(rgb[0], rgb[1], rgb[2])
                }
            }
            _ => {
                for (c, v) in rgb.into_iter().enumerate() {
                    out[c * area + i] = v;
                }
                if to == 4 {
                    out[3 * area + i] = alpha;
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
